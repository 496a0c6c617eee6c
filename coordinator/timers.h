// ring-coord's timers, run by the loop every tick (CoordinatorOptions::tick_s): nodes whose
// heartbeats stopped are lost (their jobs' attempts fail per the restart policy), restarts whose
// backoff elapsed start the next attempt, jobs no daemon serves fail as abandoned, and batched
// step metrics and heartbeat times are written. Each change runs in its own transaction and
// sends its commands after it commits (Engine::flush_outbox).
#pragma once

#include <cstdint>
#include <map>

#include "coordinator/engine.h"
#include "coordinator/observe.h"

namespace ring::coord {

class Timers {
 public:
  explicit Timers(Engine& e) : e_(e) {}

  // Everything that is due.
  void tick();
  // The batched data, now (at shutdown).
  void flush();

  void check_lost_nodes();
  void start_due_restarts();
  void check_abandoned();
  void flush_metrics();
  void flush_heartbeats();
  // Outcomes of SlurmActions (requeues without excluded nodes) as the jobs' events.
  void record_slurm_actions();
  // Retention (CoordinatorOptions::metrics_retention_steps): deletes old step metrics, at most
  // kPruneRows rows a call, once a second (again at once while rows remain).
  void prune_metrics();
  static constexpr int64_t kPruneRows = 500;

 private:
  Engine& e_;
  // Jobs no daemon serves, since when (check_abandoned).
  std::map<int64_t, Clock::time_point> unserved_since_;
  Clock::time_point last_abandon_check_ = Clock::now();
  Clock::time_point last_metrics_flush_ = Clock::now();
  Clock::time_point last_hb_flush_ = Clock::now();
  Clock::time_point last_prune_ = Clock::now();
  bool prune_more_ = false;
  MetricsRetention retention_{e_.opts.metrics_retention_steps};
};

}  // namespace ring::coord
