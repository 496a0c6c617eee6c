// ringctl: the command line of ringmaster.
//
//   ringctl validate FILE...      check specs; every error with file:line:col, key and rule
//   ringctl plan FILE [--json]    memory, communication and fit, from the spec alone
//   ringctl checkpoints DIR [--verify]   checkpoints and their state (cli/cmd_checkpoints.cc)
//   ringctl run|status|events|logs|cancel|restart|nodes ...   cli/cmd_*.cc (cli/commands.h)
//
// Exit codes (cli/ctl_common.h, docs/operator-guide.md): 0 success, 1 invalid input (a spec with
// errors) or a failed job, 2 usage error, 3 the plan does not fit (plan --check only), 4 no
// coordinator, 5 no such job, 6 another user's job, 7 refused in the job's state, 75 run stopped
// early and resumable.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/cmd_checkpoints.h"
#include "common/plan/plan.h"
#include "common/spec/parse.h"

namespace {

using ring::cli::closest;

constexpr int kExitOk = 0;
constexpr int kExitInvalid = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoFit = 3;

void print_diagnostics(const ring::spec::LoadResult& r, bool color) {
  for (const auto& d : r.diagnostics) {
    std::string s = d.str();
    if (color) {
      const char* c = d.severity == ring::spec::Diagnostic::Severity::kError ? "\033[31m"
                                                                              : "\033[33m";
      auto pos = s.find(d.severity == ring::spec::Diagnostic::Severity::kError ? ": error:"
                                                                                : ": warning:");
      if (pos != std::string::npos) s = s.substr(0, pos + 2) + c + s.substr(pos + 2);
      auto end = s.find(':', pos + 2 + 5);
      if (end != std::string::npos) s.insert(end, "\033[0m");
    }
    std::cerr << s << "\n";
  }
}

// What ringctl checks a spec with: every rule (ringd's included); with --what-if the limits of
// this build are warnings, to size a design it cannot run yet.
ring::spec::LoadOptions load_options(bool what_if) {
  auto o = ring::spec::job_spec_options();
  o.allow_stdin = true;
  o.runtime_limits_are_errors = !what_if;
  return o;
}

int cmd_validate(const std::vector<std::string>& files, bool quiet, bool what_if) {
  bool color = isatty(STDERR_FILENO) && !getenv("NO_COLOR");
  int bad = 0;
  int stdin_uses = 0;
  for (const auto& f : files) stdin_uses += f == "-";
  if (stdin_uses > 1) {
    std::cerr << "ringctl validate: '-' (standard input) may be given once\n";
    return kExitUsage;
  }
  for (const auto& f : files) {
    auto r = ring::spec::load_spec_file(f, load_options(what_if));
    const std::string shown = f == "-" ? "<stdin>" : f;
    print_diagnostics(r, color);
    if (!r.ok()) {
      ++bad;
      std::cerr << shown << ": " << r.error_count() << " error(s)\n";
    } else if (!quiet) {
      std::cout << shown << ": ok (" << r.spec->job.name << ": " << r.spec->model.layers
                << " layers, d_model " << r.spec->model.d_model << ", seq_len "
                << r.spec->data.seq_len << ", " << r.spec->resolved.total_workers << " workers)\n";
    }
  }
  if (files.size() > 1 && !quiet)
    std::cout << files.size() - bad << " valid, " << bad << " invalid\n";
  return bad ? kExitInvalid : kExitOk;
}

int cmd_plan(const std::string& file, bool json, bool check, bool what_if) {
  auto r = ring::spec::load_spec_file(file, load_options(what_if));
  print_diagnostics(r, isatty(STDERR_FILENO) && !getenv("NO_COLOR"));
  if (!r.ok()) {
    std::cerr << file << ": " << r.error_count() << " error(s); fix them before planning"
              << " (`--what-if` plans a design that only breaks this build's limits)\n";
    return kExitInvalid;
  }
  if (what_if && !r.diagnostics.empty())
    std::cerr << file
              << ": planned with --what-if: any 'not supported by this build' above is a "
                 "spec that `ringctl run` and `submit` refuse\n";
  auto p = ring::plan::make_plan(*r.spec);
  if (json) std::cout << ring::plan::to_json(p, *r.spec).dump(2) << "\n";
  else std::cout << ring::plan::to_text(p, *r.spec);
  return check && !p.fits() ? kExitNoFit : kExitOk;
}

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

  std::vector<std::string> vfiles;
  bool quiet = false, what_if = false;
  auto* validate = app.add_subcommand(
      "validate", "Check job specs: print every error (file:line:col, key, rule); exit 1 if any");
  validate->add_option("files", vfiles, "Spec files (YAML, regular files); - reads standard input")
      ->required();
  validate->add_flag("-q,--quiet", quiet, "Print errors only");
  validate->add_flag("--what-if", what_if,
                     "Report what this build cannot run (bf16, data replicas, ...) as warnings");

  std::string pfile;
  bool json = false, check = false;
  auto* plan = app.add_subcommand(
      "plan", "Memory per worker and node, communication per step, and fit, from the spec");
  plan->add_option("file", pfile, "Spec file (YAML, a regular file); - reads standard input")
      ->required();
  plan->add_flag("--json", json, "Machine-readable output");
  plan->add_flag("--check", check, "Exit 3 when the job does not fit its resources");
  plan->add_flag("--what-if", what_if,
                 "Plan a design this build cannot run yet (bf16, data replicas, ...): its limits "
                 "become warnings");

  // Subcommands in their own files (cli/commands.h).
  std::vector<ring::cli::Subcommand> subcommands{
      ring::cli::add_run(app),    ring::cli::add_status(app),  ring::cli::add_events(app),
      ring::cli::add_logs(app),   ring::cli::add_cancel(app),  ring::cli::add_restart(app),
      ring::cli::add_nodes(app),  ring::cli::add_submit(app),  ring::cli::add_slurm_started(app),
      ring::cli::add_steps(app)};

  auto checkpoints = ring::cli::add_checkpoints(app);  // cli/cmd_checkpoints.cc

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
    if (*validate) return cmd_validate(vfiles, quiet, what_if);
    if (*plan) return cmd_plan(pfile, json, check, what_if);
    if (*checkpoints.app) return checkpoints.run();
    for (const auto& sc : subcommands)
      if (*sc.app) return sc.run();
  } catch (const std::exception& e) {
    std::cerr << "ringctl: internal error: " << e.what() << "\n";
    return kExitInvalid;
  }
  return kExitUsage;
}
