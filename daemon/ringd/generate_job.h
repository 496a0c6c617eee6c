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
#include <vector>

#include <nlohmann/json.hpp>

#include "common/protocol/protocol.h"
#include "common/spec/spec.h"
#include "common/contract/timeline.h"
#include "daemon/placement/placement.h"
#include "daemon/ringd/generate_lifecycle.h"
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

class LogTail;

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
  bool ended() const { return state_.phase == genlife::Phase::kEnded; }
  int exit_code() const { return state_.exit_code; }
  // Every way out: the workers killed and reaped, the rendezvous and timelines removed.
  void shut_down();

 private:
  void log(const std::string& l) const { p_.log(l); }
  void event(const std::string& name, nlohmann::json fields) const {
    p_.event(name, std::move(fields));
  }
  // The lifecycle (generate_lifecycle.h): events in, its actions carried out here.
  genlife::Event event_of(genlife::EventKind k) const;
  void dispatch(const genlife::Event& e);
  void execute(const genlife::Action& a);
  void say_died(const Worker& w, int st) const;
  void say_end(const genlife::Action& a) const;
  Worker* worker(int rank);
  bool spawn_all();
  void reap();
  void check_hang();
  void poll_progress(bool log_lines);

  DaemonParts p_;
  genlife::Config config_;
  genlife::State state_;
  std::string rdv_, output_;
  bool own_rdv_ = false;
  int wpn_ = 1, world_ = 1;
  std::unique_ptr<LogTail> progress_;  // rank 0's log on node 0
  // Hang detection: each rank's flight recorder (contract/timeline.h, mapped here), the slowest
  // unit of work seen (a prefill layer or a decode step), and whether a hang was reported.
  std::vector<contract::timeline::Mapping> tl_maps_;
  std::vector<std::string> tl_paths_;
  int64_t spawned_ns_ = 0;
  int64_t seen_end_ns_ = 0;  // records that ended up to here are counted in slowest_s_
  double slowest_s_ = 0;
  Clock::time_point next_hang_check_{};
  bool hang_reported_ = false;
};

}  // namespace ring::ringd
