// Slurm's part of ringctl status/cancel/restart for jobs submitted with `ringctl submit` (those
// whose ring-coord record carries a Slurm job id). ring-coord stays the system of record; these
// add what only Slurm knows (pending reason, node list, requeues) and steer the Slurm job.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/protocol/protocol.h"
#include "common/slurm/slurm_cli.h"

namespace ring::cli {

// Slurm's view of every job that has a Slurm id, by that id (one scontrol call, sacct for the
// rest). Never throws: when Slurm cannot be asked, each view has found = false and `reason` says
// why.
std::map<std::string, slurm::JobView> slurm_views(const std::vector<protocol::JobInfo>& jobs);

// `ringctl cancel` of a Slurm job: scancel (Slurm sends SIGTERM, ringd checkpoints and stops,
// SIGKILL after KillWait). Returns what was done ("" when the job has no Slurm id). Throws
// slurm::SlurmError.
std::string slurm_cancel(const protocol::JobInfo& j);

// `ringctl restart` of a Slurm job: scontrol requeue. The running allocation stops the same way
// (ringd checkpoints on SIGTERM), Slurm starts the job again, the batch script records the start
// and ring-coord begins the next attempt; ringd --resume continues from the latest complete
// checkpoint. Throws slurm::SlurmError.
std::string slurm_requeue(const protocol::JobInfo& j);

}  // namespace ring::cli
