// ringd's command line (daemon/INTERFACE.md): the options and their parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ring::ringd {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitStopped = 75;
// ring-coord stopped the job for good (ringctl cancel): not resumable, not a failure.
inline constexpr int kExitCancelled = 3;

struct Options {
  std::string spec;
  std::string job_dir;          // empty: /tmp/ringmaster-<uid>/jobs/<job.name>
  int node_rank = 0;
  int nodes = 1;
  std::string rendezvous;       // empty: <job-dir>/rendezvous
  std::string coord, job;
  std::optional<int64_t> steps;
  bool resume = false;
  bool resume_if_any = false;  // --resume-if-any
  int threads = 0;              // optimizer threads (0: all cores)
  bool json = false;
  std::string log_format = "text";  // stderr's log lines: text (ringd's own lines) or json
  // Beyond the contract (tests, operators):
  std::string worker_bin;       // ring-worker to spawn (default: next to ringd, then PATH)
  std::string transport = "ucx";
  double heartbeat_timeout_s = 30;  // silence on a worker's control socket that counts as a hang
  double startup_timeout_s = 300;   // spawn to hello (corpus loading, bootstrap)
  double stop_grace_s = 5;          // SIGUSR2 to SIGKILL when stopping workers
  bool hash_weights = false;        // add "weights_xxh" (FNV-1a 64 of the master weights) per step
  int worker_threads = -1;          // --threads of each worker (-1: resources.cpus_per_worker)
};

// What parsing argv came to: options to run with, or an exit status (--help and --version: 0
// after printing; a usage error: 2 after naming the flag and the rule on stderr).
struct ParsedOptions {
  Options options;
  std::optional<int> exit_code;
};

// Parses argv with CLI11. `env` reads the environment (SLURM_NODEID, SLURM_NNODES) and is a
// parameter so that tests need not change the process's environment.
ParsedOptions parse_options(int argc, const char* const* argv,
                            const char* (*env)(const char*) = nullptr);

}  // namespace ring::ringd
