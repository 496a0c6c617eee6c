// What ringd checks and prepares before its first attempt: the spec against the command line,
// the job directory and its files' directory, the rendezvous root, the checkpoint directory.
// Each returns the failure (exit status and message, without the "ringd: " prefix) or nothing.
#pragma once

#include <optional>
#include <string>

#include "common/spec/spec.h"
#include "daemon/ringd/options.h"

namespace ring::ringd {

struct StartupFailure {
  int code = kExitFailed;
  std::string message;
};

// The spec is one ringd can run with these options: context_ranks x data_replicas =
// nodes x workers_per_node, resources.nodes = --nodes, and for training optimizer.offload cpu,
// a lazy update within 32-bit coordinates. Exit 2 naming the spec file and the key.
std::optional<StartupFailure> check_spec(const spec::JobSpec& s, const Options& o);

// Creates the job directory (0700, when missing) and its logs/ (0700); *dir becomes absolute.
std::optional<StartupFailure> prepare_job_dir(std::string* dir);

// The rendezvous root: --rendezvous, else <job-dir>/rendezvous, under Slurm (no --rendezvous)
// with slurm-<job id>.<restart count> below it. `env` reads the environment.
std::string rendezvous_root(const Options& o, const std::string& job_dir,
                            const char* (*env)(const char*) = nullptr);

// checkpoint.dir resolved (a relative one from the job directory; empty: no checkpoints),
// created 0700 when missing, and writable; into *dir.
// The ring-worker to spawn: `given` (--worker-bin), else RING_WORKER_BIN, next to ringd, the
// install bindir, the build tree, PATH; when none is found, every place tried (joined by ", ").
std::string find_worker_bin(const std::string& given);

std::optional<StartupFailure> prepare_checkpoint_dir(const std::string& spec_dir,
                                                     const std::string& job_dir,
                                                     std::string* dir);

}  // namespace ring::ringd
