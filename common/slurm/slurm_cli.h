// Slurm's command-line tools as ringctl uses them: sbatch, scontrol, squeue/sacct, scancel.
//
//   std::string id = ring::slurm::sbatch("/shared/jobs/tiny/job.sbatch");    // "1234"
//   auto view = ring::slurm::query_jobs({"1234"});                          // scontrol, then sacct
//   ring::slurm::cancel("1234");      ring::slurm::requeue("1234");
//
// Commands are run without a shell (argv), with a deadline; SLURM_CONF and PATH come from the
// environment. Failures throw SlurmError with the command and what it printed.
#pragma once

#include <cstdint>
#include <map>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/proc/run_command.h"

namespace ring::slurm {

class SlurmError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using CommandResult = proc::CommandResult;

// Runs argv[0] (looked up in PATH) with a deadline (proc::run_command; stdout and stderr kept up to
// 16 MiB each). Throws SlurmError when it cannot be started (e.g. "sbatch: not found in PATH; is
// Slurm's client installed?").
CommandResult run_command(const std::vector<std::string>& argv, int timeout_ms = 30000);

// Slurm's view of one job, merged from `scontrol show job -o` (queued, running and recently
// finished jobs) and `sacct` (older ones, where accounting is on).
struct JobView {
  std::string id;
  bool found = false;      // false: neither scontrol nor sacct knows the id
  std::string source;      // "scontrol" or "sacct"
  std::string state;       // PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, ...
  std::string reason;      // why pending / why it ended; empty for "None"
  std::string nodes;       // allocated node list (hostlist form); empty when none
  int64_t restarts = 0;    // requeues (scontrol's Restarts)
  std::string exit_code;   // "0:0" (exit status:signal)
  std::string partition;
  std::string run_time;    // elapsed, Slurm format
  std::string time_limit;
  std::string submit_time, start_time;
};

// Parses one line of `scontrol show job -o` (space-separated Key=Value pairs). Values with spaces
// (Command=, Comment=) are kept up to the next " Key=" token.
std::map<std::string, std::string> parse_scontrol_record(std::string_view line);
JobView job_view_from_scontrol(const std::map<std::string, std::string>& rec);

// The id in `sbatch --parsable` output ("1234" or "1234;cluster"). Throws SlurmError otherwise.
std::string parse_sbatch_parsable(std::string_view out);

// Submits a script file (sbatch --parsable FILE); returns the job id. extra_args go before FILE.
std::string sbatch(const std::string& script_path, const std::vector<std::string>& extra_args = {});

// Slurm's view of each id (one scontrol call for all, one sacct call for those it lacks).
std::map<std::string, JobView> query_jobs(const std::vector<std::string>& ids);

// scancel ID: Slurm signals the steps (SIGTERM, SIGKILL after KillWait) and ends the job.
void cancel(const std::string& id);
// scontrol requeue ID: the running job is stopped the same way and queued again (Restarts+1).
void requeue(const std::string& id);
// Hosts Slurm reports unfit to run jobs: down, drained or draining, failing, or not responding
// (sinfo -N "%N|%T": "down*", "drained", "allocated*", ...), each once, in sinfo's order.
std::vector<std::string> parse_unhealthy_nodes(std::string_view sinfo_out);
std::vector<std::string> unhealthy_nodes();  // runs sinfo; throws SlurmError

// The same requeue, with nodes added to the job's ExcNodeList so the next allocation holds none
// of them. Slurm changes ExcNodeList only while the job is pending: a running job is requeued
// held (scontrol requeuehold), its ExcNodeList updated once Slurm accepts it (retried until
// timeout_ms), then released - always, so a failed update never leaves the job held. A pending
// job is only updated. Returns the ExcNodeList set (hostnames, comma-separated). Throws
// SlurmError naming the step that failed.
std::string requeue_excluding(const std::string& id, const std::vector<std::string>& nodes,
                              int timeout_ms = 120000);

// Slurm's side of `ringctl status`: "RUNNING on node[1-2], 1 restart", "PENDING (Resources)",
// "COMPLETED (exit 0:0)", "not known to Slurm" - one line; and the same as a JSON object (id,
// state, reason, nodes, restarts, exit_code, partition, run_time, time_limit, source).
std::string summary(const JobView& v);
nlohmann::json to_json(const JobView& v);

// Whether srun knows --ring-job (the SPANK plugin is in plugstack.conf).
bool spank_plugin_active();

// A Slurm job id as ringctl accepts it: digits, optionally "_N" (array task) - nothing a shell or
// scontrol could misread.
bool valid_job_id(std::string_view id);

}  // namespace ring::slurm
