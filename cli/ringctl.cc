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

int cmd_validate(const std::vector<std::string>& files, bool quiet) {
  bool color = isatty(STDERR_FILENO) && !getenv("NO_COLOR");
  int bad = 0;
  for (const auto& f : files) {
    auto r = ring::spec::load_spec_file(f);
    print_diagnostics(r, color);
    if (!r.ok()) {
      ++bad;
      std::cerr << f << ": " << r.error_count() << " error(s)\n";
    } else if (!quiet) {
      std::cout << f << ": ok (" << r.spec->job.name << ": " << r.spec->model.layers
                << " layers, d_model " << r.spec->model.d_model << ", seq_len "
                << r.spec->data.seq_len << ", " << r.spec->resolved.total_workers
                << " workers)\n";
    }
  }
  if (files.size() > 1 && !quiet)
    std::cout << files.size() - bad << " valid, " << bad << " invalid\n";
  return bad ? kExitInvalid : kExitOk;
}

int cmd_plan(const std::string& file, bool json, bool check) {
  auto r = ring::spec::load_spec_file(file);
  print_diagnostics(r, isatty(STDERR_FILENO) && !getenv("NO_COLOR"));
  if (!r.ok()) {
    std::cerr << file << ": " << r.error_count() << " error(s); fix them before planning\n";
    return kExitInvalid;
  }
  auto p = ring::plan::make_plan(*r.spec);
  if (json) std::cout << ring::plan::to_json(p, *r.spec).dump(2) << "\n";
  else std::cout << ring::plan::to_text(p, *r.spec);
  return check && !p.fits() ? kExitNoFit : kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringctl: train transformers on million-token contexts (ringmaster)", "ringctl"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ringctl 0.1.0");

  std::vector<std::string> vfiles;
  bool quiet = false;
  auto* validate = app.add_subcommand(
      "validate", "Check job specs: print every error (file:line:col, key, rule); exit 1 if any");
  validate->add_option("files", vfiles, "Spec files (YAML)")->required();
  validate->add_flag("-q,--quiet", quiet, "Print errors only");

  std::string pfile;
  bool json = false, check = false;
  auto* plan = app.add_subcommand(
      "plan", "Memory per worker and node, communication per step, and fit, from the spec");
  plan->add_option("file", pfile, "Spec file (YAML)")->required();
  plan->add_flag("--json", json, "Machine-readable output");
  plan->add_flag("--check", check, "Exit 3 when the job does not fit its resources");

  // Subcommands in their own files (cli/commands.h).
  std::vector<ring::cli::Subcommand> subcommands{
      ring::cli::add_run(app),    ring::cli::add_status(app),  ring::cli::add_events(app),
      ring::cli::add_logs(app),   ring::cli::add_cancel(app),  ring::cli::add_restart(app),
      ring::cli::add_nodes(app),  ring::cli::add_submit(app),  ring::cli::add_slurm_started(app)};

  auto checkpoints = ring::cli::add_checkpoints(app);  // cli/cmd_checkpoints.cc

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  try {
    if (*validate) return cmd_validate(vfiles, quiet);
    if (*plan) return cmd_plan(pfile, json, check);
    if (*checkpoints.app) return checkpoints.run();
    for (const auto& sc : subcommands)
      if (*sc.app) return sc.run();
  } catch (const std::exception& e) {
    std::cerr << "ringctl: internal error: " << e.what() << "\n";
    return kExitInvalid;
  }
  return kExitUsage;
}
