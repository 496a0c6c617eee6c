// The ringctl subcommands that live in their own files (cli/cmd_*.cc). Each registers itself
// on the app with its flags and returns what to run when it was chosen; cli/ringctl.cc
// dispatches.
#pragma once

#include "cli/ctl_common.h"

namespace ring::cli {

// The spec alone, no coordinator (cmd_spec.cc).
Subcommand add_validate(CLI::App& app);
Subcommand add_plan(CLI::App& app);
Subcommand add_init(CLI::App& app);

Subcommand add_status(CLI::App& app);   // cmd_status.cc
Subcommand add_events(CLI::App& app);   // cmd_events.cc
Subcommand add_logs(CLI::App& app);     // cmd_logs.cc
Subcommand add_steps(CLI::App& app);    // cmd_steps.cc
Subcommand add_metrics(CLI::App& app);  // cmd_metrics.cc
Subcommand add_cancel(CLI::App& app);   // cmd_control.cc
Subcommand add_restart(CLI::App& app);  // cmd_control.cc
Subcommand add_checkpoint(CLI::App& app);  // cmd_control.cc
Subcommand add_nodes(CLI::App& app);    // cmd_nodes.cc
Subcommand add_run(CLI::App& app);      // cmd_run.cc
Subcommand add_submit(CLI::App& app);          // cmd_submit.cc
Subcommand add_slurm_started(CLI::App& app);   // cmd_submit.cc
Subcommand add_import(CLI::App& app);   // cmd_import.cc
Subcommand add_export(CLI::App& app);   // cmd_import.cc
Subcommand add_tokenize(CLI::App& app);        // cmd_tokenize.cc
Subcommand add_simulate(CLI::App& app);        // cmd_simulate.cc
Subcommand add_generate(CLI::App& app);        // cmd_generate.cc
Subcommand add_eval(CLI::App& app);            // cmd_eval.cc
Subcommand add_trace(CLI::App& app);    // cmd_trace.cc

}  // namespace ring::cli
