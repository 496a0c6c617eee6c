#include "common/cli/cli11_flags.h"

#include <cstdlib>
#include <iostream>

#include "common/cli/edit_distance.h"

namespace ring::flags {

CLI::Option* add_custom(CLI::App& app, const std::string& name,
                        std::function<void(const std::string& flag, const std::string& value)> on,
                        const std::string& help) {
  return app
      .add_option_function<std::string>(
          name,
          [name, on = std::move(on)](const std::string& v) {
            try {
              on(name, v);
            } catch (const FlagError& e) {
              throw CLI::ValidationError(std::string(e.what()));
            }
          },
          help)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

CLI::Option* add_seconds(CLI::App& app, const std::string& name, double* out,
                         const std::string& help) {
  return add_custom(
             app, name,
             [out](const std::string& flag, const std::string& v) {
               *out = parse_seconds(flag, v.c_str());
             },
             help)
      ->type_name("SECONDS");
}

namespace {

// A rule from one of flags.h's parsers: their message without the leading "FLAG: " (CLI11 puts
// the flag's name in front itself).
CLI::Validator rule(std::function<void(const char*)> parse, std::string desc, std::string name) {
  return CLI::Validator(
      [parse = std::move(parse)](std::string& v) -> std::string {
        try {
          parse(v.c_str());
          return "";
        } catch (const FlagError& e) {
          const std::string m = e.what();
          return m.rfind(": ", 0) == 0 ? m.substr(2) : m;
        }
      },
      std::move(desc), std::move(name));
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return rule([lo, hi](const char* v) { parse_int("", v, lo, hi); },
              "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]", "INTEGER");
}

CLI::Validator seconds_in(double lo, double hi) {
  std::string desc;
  try {
    parse_seconds_in("", "x", lo, hi);
  } catch (const FlagError& e) {  // "...: expected seconds in [LO, HI], got 'x'": the bounds
    std::string m = e.what();
    auto a = m.find('['), b = m.find(']');
    desc = m.substr(a, b - a + 1);
  }
  return rule([lo, hi](const char* v) { parse_seconds_in("", v, lo, hi); }, desc, "SECONDS");
}

CLI::Validator endpoint_rule(EndpointUse use) {
  return CLI::Validator([use](std::string& v) { return endpoint_error(v, use); },
                        use == EndpointUse::kBind ? "ipc://PATH | tcp://HOST|*:PORT|0|*"
                                                  : "ipc://PATH | tcp://HOST:PORT",
                        "ENDPOINT");
}

std::string closest_option(const CLI::App& app, const std::string& word) {
  if (word.size() < 3 || word[0] != '-') return "";
  std::string best;
  size_t best_d = 3;  // two edits at most: a typo, not another flag
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) {
      const std::string name = "--" + l;
      if (size_t d = cli::edit_distance(word, name); d < best_d) best_d = d, best = name;
    }
  }
  return best;
}

void usage_error(const CLI::App& app, const std::string& message) {
  const std::string& program = app.get_name();
  std::cerr << program << ": " << message << "\n  `" << program << " --help` lists the flags\n";
  std::exit(2);
}

void parse_or_exit(CLI::App& app, int argc, char** argv) {
  app.allow_extras(true);  // reported below, with a suggestion
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    std::exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    usage_error(app, e.what());
  }
  const std::vector<std::string> extra = app.remaining();
  if (extra.empty()) return;
  const std::string word = extra.front().substr(0, extra.front().find('='));
  const std::string c = closest_option(app, word);
  usage_error(app,
              "unknown argument '" + word + "'" + (c.empty() ? "" : "; did you mean '" + c + "'?"));
}

}  // namespace ring::flags
