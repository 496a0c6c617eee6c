// The sbatch script of `ringctl submit`, rendered from a validated job spec.
//
//   ring::slurm::ScriptInputs in{.spec_path = "/shared/jobs/tiny/spec.yaml",
//                                .job_dir = "/shared/jobs/tiny", .ringd = "/opt/ring/bin/ringd",
//                                .coord_endpoint = "ipc:///run/ring/coord.sock", .coord_job = 7};
//   std::string script = ring::slurm::render_sbatch_script(spec, in);   // throws ScriptError
//
// The script asks for resources.nodes nodes with one task each (one ringd per node), the node's
// CPUs for its workers, gpu:N gres when GPUs are requested, and the slurm.* keys (partition,
// account, qos, constraint, time, requeue, --signal=B:USR1@signal_before_s, extra_sbatch). Its
// body starts `srun ringd --spec ... --job-dir ... [--coord EP --job ID] --resume` (always
// --resume: a requeued attempt continues from the latest checkpoint), forwards Slurm's time-limit
// warning (SIGUSR1 to the batch shell) to ringd, and requeues itself when ringd stopped on that
// warning (exit 75) and slurm.requeue is on. Every value that reaches the shell is quoted.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/spec/spec.h"

namespace ring::slurm {

// A value the script cannot carry (a path with a line break, a relative path, ...). The message
// names the input and the rule.
class ScriptError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ScriptInputs {
  std::string spec_path;  // absolute; the spec every ringd reads (on a shared file system)
  std::string job_dir;    // absolute; ringd's --job-dir, also where slurm-<id>.out goes
  std::string ringd;      // absolute path of the ringd binary on the compute nodes
  std::string coord_endpoint;  // ring-coord endpoint; empty: ringd runs without a coordinator
  // ringd gets --coord/--job and reports to ring-coord. false: ringd runs without them (a ringd
  // built without coordinator reporting, or compute nodes that cannot reach the endpoint); the
  // batch script still records each Slurm start with `ringctl slurm-started`.
  bool ringd_reports = true;
  // ring-coord job id; 0 with an endpoint (submit --dry-run): the script takes it from
  // $RING_COORD_JOB when it runs.
  int64_t coord_job = 0;
  // ringctl on the compute nodes: the script reports each Slurm start (first run and every
  // requeue) to ring-coord with `ringctl slurm-started`; empty: not reported.
  std::string ringctl;
  // The SPANK plugin is installed (srun has --ring-job): the srun line gets --ring-job,
  // --ring-coord and --ring-order so each ringd also sees RING_* variables.
  bool spank = false;
};

// Renders the script. Throws ScriptError naming the bad input.
std::string render_sbatch_script(const spec::JobSpec& spec, const ScriptInputs& in);

// POSIX shell single-quoting: abc -> abc, a b -> 'a b', it's -> 'it'\''s'. Words made only of
// [A-Za-z0-9_@%+=:,./-] are left bare.
std::string shell_quote(std::string_view s);

// The value of one `#SBATCH` directive line (sbatch reads these itself, not the shell): returned
// bare when it has no blank, else in double quotes. Throws ScriptError for a line break, a double
// quote or a control character, naming `what`.
std::string directive_value(std::string_view s, std::string_view what);

}  // namespace ring::slurm
