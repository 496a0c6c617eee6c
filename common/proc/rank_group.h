// A group of child processes that live and fail together: the ranks of a ring that a local
// launcher starts (`ring-worker --launch-local`, `ringctl generate --ranks P`) and ringd's workers
// (daemon/ringd/supervisor.h). The one place for starting each rank (spawn.h), stopping the group
// (a signal to every rank, SIGKILL to the ones still running after a grace), reaping the ranks
// that ended (the killed one first: reap.h), and, for the launchers, the whole run:
//
//   ring::proc::GroupRun how;
//   how.on_failure = [](const RankEnd& e, int left) { log("rank {} {}", e.rank, ...); };
//   ring::proc::GroupResult r = ring::proc::run_group(spawn_options_per_rank, how);
//   return r.exit_code;   // the first failure's status, or 128 + the stop signal, or 0
//
// run_group passes SIGINT, SIGTERM and SIGHUP (as SIGTERM) on to the ranks and stops the others
// with SIGTERM on the first failure; either way SIGKILL follows the grace. ringd, whose loop is
// Boost.Asio, drives a RankGroup itself: start, stop, reap on SIGCHLD, kill_overdue on its tick.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/proc/spawn.h"

namespace ring::proc {

// A rank that ended: its slot, pid and wait status.
struct RankEnd {
  int rank = -1;
  pid_t pid = -1;
  int status = 0;
};

class RankGroup {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    // Each rank leads a process group of its own and every signal goes to the group (so what a
    // rank started stops with it); otherwise to the rank's pid.
    bool process_groups = false;
    // What stop() sends first.
    int stop_signal = SIGTERM;
  };

  RankGroup() : RankGroup(Options{}) {}
  explicit RankGroup(Options o) : o_(o) {}
  // SIGKILL to every rank still running, then waits for each: no rank outlives the group.
  ~RankGroup() { kill_all_and_wait(); }
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;
  // A moved-from group is empty (it stops nothing).
  RankGroup(RankGroup&& other) noexcept;
  RankGroup& operator=(RankGroup&& other) noexcept;

  // Starts rank `rank` (the slots grow to hold it; a running rank is not started again: error).
  // With process_groups the child leads a new group. A child without a death signal gets
  // SIGKILL: no orphan, even when the parent is SIGKILLed.
  Spawned start(int rank, SpawnOptions so);
  // A new run of the group: every slot empty. The ranks must all have ended (reaped).
  void clear();

  int size() const { return static_cast<int>(pids_.size()); }
  pid_t pid(int rank) const;        // -1: never started
  bool running(int rank) const;     // started and not reaped
  int running_count() const;
  std::vector<pid_t> running_pids() const;

  // `sig` to every running rank (to its group with process_groups); how many were signalled.
  int signal_all(int sig);
  void signal(int rank, int sig);
  // stop_signal to every running rank; SIGKILL to those still running once `grace` has passed
  // (kill_overdue). A later stop keeps an earlier deadline. Returns how many were signalled.
  int stop(std::chrono::milliseconds grace) { return stop(o_.stop_signal, grace); }
  int stop(int sig, std::chrono::milliseconds grace);
  // The SIGKILL of a stop whose grace is over: true when it was sent now.
  bool kill_overdue(Clock::time_point now);
  std::optional<Clock::time_point> kill_deadline() const { return kill_at_; }
  // SIGKILL to every running rank, then waits for each (every way out).
  void kill_all_and_wait();

  // The ranks that have ended, reaped now, those for which is_cause(status) holds first (the
  // rank killed by a signal is the cause, its peers fail on the lost connection within
  // milliseconds and may be reaped first). When only failures that are not causes are in,
  // waits up to `grace` for a rank that is a zombie but not yet reapable (reap.h). Children
  // that are not ranks of this group and were reaped on the way are returned with rank -1.
  std::vector<RankEnd> reap(const std::function<bool(int status)>& is_cause,
                            std::chrono::milliseconds grace);

 private:
  void send(pid_t pid, int sig) const;

  Options o_;
  std::vector<pid_t> pids_;
  std::vector<bool> running_;
  std::optional<Clock::time_point> kill_at_;
};

// How run_group reports and how long it waits.
struct GroupRun {
  // After a stop signal (passed on) and after the first failure (SIGTERM to the rest): how long
  // before SIGKILL.
  std::chrono::milliseconds signal_grace{10000};
  std::chrono::milliseconds failure_grace{5000};
  // Called once the ranks are started (their pids in rank order).
  std::function<void(const std::vector<pid_t>&)> on_started;
  // A stop signal arrived; `running` ranks are being stopped.
  std::function<void(int sig, int running)> on_signal;
  // The first rank that failed; the other `running` ranks are being stopped.
  std::function<void(const RankEnd&, int running)> on_failure;
  // The grace is over: SIGKILL to `running` ranks.
  std::function<void(int running)> on_kill;
};

struct GroupResult {
  std::string start_error;          // a rank could not be started ("rank 2: ..."): none ran on
  std::optional<RankEnd> failure;   // the first rank that failed (the cause)
  int signal = 0;                   // the first stop signal (SIGINT, SIGTERM, SIGHUP), 0: none
  // The first of: the failure's exit status (128 + signal for a rank killed by one), 128 + the
  // stop signal; 0 when every rank exited 0 and no stop came. 1 when start_error is set.
  int exit_code = 0;
};

// Starts one rank per entry of `ranks` (in order, rank r from ranks[r]) and waits until every one
// has ended: stop signals are passed on, the first failure stops the others, SIGKILL follows the
// grace. SIGCHLD, SIGINT, SIGTERM and SIGHUP are blocked meanwhile (the ranks start with an empty
// mask) and restored at the end. A rank that cannot be started: those started are killed and
// reaped, start_error says which and why.
GroupResult run_group(const std::vector<SpawnOptions>& ranks, const GroupRun& how);

}  // namespace ring::proc
