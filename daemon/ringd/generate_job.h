// ringd's generate mode, for a job.kind generate spec: the node's workers are `ring-worker
// --generate` ranks (the generation of worker/generate/generate_run.h: ring-attention prefill
// over the ranks, the KV cache sharded, rank 0 writes the output) that run once and exit.
//
// It is a mode of ringd's Daemon (ringd.cc): the same start-up (job directory and its lock, the
// worker binary, placement, registration with ring-coord), the same Boost.Asio loop (signals,
// SIGCHLD, the 100 ms tick, the coordinator's messages posted to it) and the same supervisor
// (supervisor.h). What differs is the lifecycle, a pure state machine of its own
// (generate_lifecycle.h), and what there is not: steps, shared memory, optimizer, checkpoints.
// It follows rank 0's progress lines, reports to ring-coord (worker_started, worker_exited,
// worker_died, completed, stopped; ringctl status/events/logs/cancel), and ends:
//   every worker exited 0               -> event completed, exit 0
//   a worker died (exit status, signal) -> the others stopped, event failed, exit 1; ring-coord
//                                          fails the job (a generate job is not restarted: it is
//                                          not resumable mid-way; run it again)
//   a stop signal                       -> the workers stopped, event stopped, exit 75
//   ring-coord's stop (ringctl cancel)  -> the workers stopped, event stopped, exit 3 (1 when
//                                          the coordinator failed the job)
// daemon/INTERFACE.md has the contract.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/protocol/protocol.h"
#include "common/spec/spec.h"
#include "daemon/placement/placement.h"
#include "daemon/ringd/options.h"
#include "daemon/ringd/supervisor.h"

namespace ring::ringd {

class CoordLink;

// What the generate mode uses of the Daemon's parts.
struct DaemonParts {
  const Options& o;
  const spec::JobSpec& spec;
  const std::string& job_dir;
  const std::string& worker_bin;
  const placement::Placement& placement;
  Supervisor& supervisor;
  std::function<void(const std::string&)> log;
  std::function<void(const std::string&)> error;  // Output::error: "ringd: ..." on stderr
  std::function<void(const std::string&, nlohmann::json)> event;
  std::function<CoordLink*()> coord;  // nullptr without --coord
};

class GenerateMode {
 public:
  explicit GenerateMode(DaemonParts parts);
  ~GenerateMode();

  // Before the workers: the output's directory, the ranks' rendezvous. An exit status when
  // ringd must stop now (the reason on stderr).
  std::optional<int> prepare();
  // The job's line in the log.
  void announce() const;
  // Spawns the workers of `attempt` (ring-coord's; 1 without it).
  void start(int attempt);
  // The Daemon's loop: a signal (SIGCHLD reaps), the tick, a coordinator message.
  void on_signal(int sig);
  void on_tick();
  void on_coord(const protocol::Message& m);
  bool ended() const;
  int exit_code() const;
  // Every way out: the workers killed and reaped, the rendezvous and timelines removed.
  void shut_down();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ring::ringd
