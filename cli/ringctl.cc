// ringctl: the command line of ringmaster.
//
//   ringctl validate|plan|init ...            the spec alone (cli/cmd_spec.cc)
//   ringctl checkpoints DIR [--verify]        checkpoints and their state (cli/cmd_checkpoints.cc)
//   ringctl import|export ...                 Hugging Face Llama <-> checkpoints (cli/cmd_import.cc)
//   ringctl run|status|events|logs|cancel|restart|nodes|submit ...   cli/cmd_*.cc (cli/commands.h)
//   ringctl tokenize --tokenizer M -o OUT INPUT...   text -> token dataset (cli/cmd_tokenize.cc)
//   ringctl generate --checkpoint DIR PROMPT...      generation over a tiered KV cache (cli/cmd_generate.cc)
//   ringctl eval --checkpoint DIR --data PATH        loss, perplexity, logits, passkey (cli/cmd_eval.cc)
//
// The options the coordinator commands share (--coord, --timeout, --server-key, --client-key,
// --json) may also come before the command: `ringctl --coord X status` is `ringctl status
// --coord X`. Exit codes: cli/exit_codes.h, printed by `ringctl --help`.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <unistd.h>

#include "cli/cmd_checkpoints.h"
#include "cli/commands.h"
#include "cli/exit_codes.h"

namespace {

using ring::cli::closest;

using ring::cli::kExitFailed;
using ring::cli::kExitUsage;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const auto* sc : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sc->get_name());
  return names;
}

// The flags of a subcommand, long names first ("--json", "-f").
std::vector<std::string> flag_names(CLI::App* sc) {
  std::vector<std::string> names, shorts;
  for (const auto* o : sc->get_options()) {
    if (!o->nonpositional()) continue;
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    for (const auto& n : o->get_snames()) shorts.push_back("-" + n);
  }
  names.insert(names.end(), shorts.begin(), shorts.end());
  return names;
}

// Before CLI11 sees argv: a missing or unknown command gets named, with the closest one and the
// list (CLI11 would say "A subcommand is required" or "The following argument was not
// expected"). Returns an exit code, or -1 to go on.
int check_command(const CLI::App& app, int argc, char** argv) {
  auto names = command_names(app);
  auto usage = [&](const std::string& what) {
    std::cerr << "ringctl: " << what << "\n  commands: " << join(names)
              << "\n  `ringctl --help` describes them; `ringctl COMMAND --help` its flags\n";
    return kExitUsage;
  };
  if (argc < 2) return usage("a command is required");
  std::string first = argv[1];
  if (first == "-h" || first == "--help" || first == "--help-all" || first == "--version")
    return -1;
  if (std::find(names.begin(), names.end(), first) != names.end()) return -1;
  if (!first.empty() && first[0] == '-') {
    auto c = closest(first, {"--help", "--version"});
    return usage("unknown flag '" + first + "'" + (c.empty() ? "" : "; did you mean '" + c + "'?") +
                 " (a command comes first: ringctl COMMAND [FLAGS])");
  }
  auto c = closest(first, names);
  return usage("unknown command '" + first + "'" +
               (c.empty() ? "" : "; did you mean '" + c + "'?"));
}

// The options the coordinator commands share (cli/ctl_common.h CoordFlags, and --json).
struct SharedOption {
  const char* name;
  bool takes_value;
};
constexpr SharedOption kSharedOptions[] = {{"--coord", true},
                                           {"--timeout", true},
                                           {"--server-key", true},
                                           {"--client-key", true},
                                           {"--json", false}};

// Before CLI11 sees argv: shared options written before the command move to just after it,
// where the command's own flags parse and check them (`ringctl --coord X status 7` is `ringctl
// status --coord X 7`). Each subcommand keeps its flags; nothing is parsed twice. Returns an exit
// code, or -1 to go on with `args` rewritten.
int hoist_shared_options(const CLI::App& app, std::vector<std::string>& args) {
  std::vector<std::string> shared;
  size_t i = 1;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    const SharedOption* opt = nullptr;
    for (const auto& o : kSharedOptions)
      if (a == o.name || (o.takes_value && a.rfind(std::string(o.name) + "=", 0) == 0)) opt = &o;
    if (!opt) break;
    shared.push_back(a);
    if (opt->takes_value && a.find('=') == std::string::npos) {
      if (i + 1 == args.size()) {
        std::cerr << "ringctl: " << a << " needs a value (ringctl " << a << " VALUE COMMAND ...)\n";
        return kExitUsage;
      }
      shared.push_back(args[++i]);
    }
  }
  if (shared.empty()) return -1;
  std::vector<std::string> rest(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (!rest.empty() && !rest[0].empty() && rest[0][0] != '-') {
    const CLI::App* sc = nullptr;
    for (const auto* c : app.get_subcommands([](const CLI::App*) { return true; }))
      if (c->get_name() == rest[0]) sc = c;
    for (const auto& a : shared) {
      std::string flag = a.substr(0, a.find('='));
      if (sc && flag.rfind("--", 0) == 0 && !sc->get_option_no_throw(flag)) {
        std::cerr << "ringctl " << rest[0] << ": takes no " << flag
                  << " (an option before the command must be one of the command's; `ringctl "
                  << rest[0] << " --help` lists them)\n";
        return kExitUsage;
      }
    }
  }
  args.resize(1);
  if (rest.empty()) return -1;  // "a command is required" follows
  args.push_back(rest[0]);
  args.insert(args.end(), shared.begin(), shared.end());
  args.insert(args.end(), rest.begin() + 1, rest.end());
  return -1;
}

// After CLI11 refused arguments of a subcommand: name the first, with the closest flag and the
// flags it has.
int report_extras(CLI::App& app) {
  CLI::App* sc = nullptr;
  for (auto* s : app.get_subcommands()) sc = s;
  std::vector<std::string> extra = sc ? sc->remaining() : app.remaining();
  std::string where = sc ? "ringctl " + sc->get_name() : std::string("ringctl");
  std::string word = extra.empty() ? std::string("?") : extra.front();
  if (!word.empty() && word[0] == '-' && sc) {
    auto names = flag_names(sc);
    std::string flag = word.substr(0, word.find('='));
    auto c = closest(flag, names);
    std::cerr << where << ": unknown flag '" << flag << "'"
              << (c.empty() ? "" : "; did you mean '" + c + "'?") << "\n  flags of "
              << sc->get_name() << ": " << join(names) << "\n";
  } else {
    std::cerr << where << ": unexpected argument '" << word << "'"
              << (sc ? "\n  `" + where + " --help` shows the arguments it takes" : "") << "\n";
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringctl: train transformers on million-token contexts (ringmaster)", "ringctl"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ringctl 0.1.0");

  app.footer(ring::cli::exit_code_help() +
             "\nThe options --coord, --timeout, --server-key, --client-key and --json of the "
             "commands that have them may also come before the command (ringctl --coord "
             "tcp://login1:5555 status).");
  std::vector<ring::cli::Subcommand> spec_commands{
      ring::cli::add_validate(app), ring::cli::add_plan(app), ring::cli::add_init(app)};

  // Subcommands in their own files (cli/commands.h).
  std::vector<ring::cli::Subcommand> subcommands{
      ring::cli::add_run(app),    ring::cli::add_status(app),  ring::cli::add_events(app),
      ring::cli::add_logs(app),   ring::cli::add_cancel(app),  ring::cli::add_restart(app),
      ring::cli::add_checkpoint(app),
      ring::cli::add_nodes(app),  ring::cli::add_submit(app),  ring::cli::add_slurm_started(app),
      ring::cli::add_steps(app),  ring::cli::add_import(app),  ring::cli::add_export(app),
      ring::cli::add_tokenize(app), ring::cli::add_simulate(app), ring::cli::add_metrics(app),
      ring::cli::add_generate(app), ring::cli::add_eval(app),   ring::cli::add_trace(app)};

  auto checkpoints = ring::cli::add_checkpoints(app);  // cli/cmd_checkpoints.cc

  std::vector<std::string> args(argv, argv + argc);
  if (int rc = hoist_shared_options(app, args); rc >= 0) return rc;
  std::vector<char*> arg_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  argc = static_cast<int>(args.size());
  argv = arg_ptrs.data();
  if (int rc = check_command(app, argc, argv); rc >= 0) return rc;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError&) {
    return report_extras(app);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // "ringctl status: --timeout: expected seconds in [0.05, 3600], got 'nan'": which command,
    // which flag, which rule.
    CLI::App* sc = nullptr;
    for (auto* s : app.get_subcommands()) sc = s;
    std::string where = sc ? "ringctl " + sc->get_name() : std::string("ringctl");
    std::cerr << where << ": " << e.what() << "\n  `" << where
              << " --help` shows its arguments and flags\n";
    return kExitUsage;
  }
  try {
    for (const auto& sc : spec_commands)
      if (*sc.app) return sc.run();
    if (*checkpoints.app) return checkpoints.run();
    for (const auto& sc : subcommands)
      if (*sc.app) return sc.run();
  } catch (const std::exception& e) {
    std::cerr << "ringctl: internal error: " << e.what() << "\n";
    return kExitFailed;
  }
  return kExitUsage;
}
