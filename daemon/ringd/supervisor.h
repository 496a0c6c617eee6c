// Worker supervision: ringd's part that spawns the node's worker processes as one rank group
// (common/proc/rank_group.h: own process group each, death signal, cpuset, environment, stdout
// and stderr appended to the worker's log), stops them (SIGUSR2 to each process group, SIGKILL
// after the grace), reaps them (the killed one first), and finds the silent ones (no hello within the
// startup timeout, no message within the heartbeat timeout). What a death means for the attempt
// is the caller's business (attempt.h).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/proc/rank_group.h"
#include "common/proc/reap.h"
#include "common/contract/control.h"

namespace ring::ringd {

using Clock = std::chrono::steady_clock;

// ringd stops its workers with this signal (workers ignore SIGTERM and SIGINT), then SIGKILL.
inline constexpr int kWorkerStopSignal = SIGUSR2;

// One worker slot of the attempt: its process (the supervisor's) and its progress in the step
// (the step driver's).
struct Worker {
  int local = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::string log;
  Clock::time_point spawned, last_seen;
  bool connected = false, mapped = false;
  int buckets = 0;        // buckets delivered this step
  bool done = false;      // step finished
  contract::control::Done done_msg;
  std::string timeline;   // its timeline file (contract/timeline.h), passed as --timeline
};

// What every worker of an attempt is started with; worker_argv adds the worker's own rank.
struct WorkerCommand {
  std::string bin;          // ring-worker
  std::string spec;         // the spec file (absolute)
  int world = 1;            // ranks in the job
  std::string rendezvous;   // <rdv>/attempt-<A>/workers
  std::string ringd;        // the control socket
  std::string transport;
  int threads = -1;         // --threads (-1: not given: resources.cpus_per_worker)
};
// "<bin> --spec S --rank R --world P --rendezvous D --ringd SOCK --local-rank L --transport T
// [--threads N] [--timeline FILE]".
std::vector<std::string> worker_argv(const WorkerCommand& c, const Worker& w);

// Whether a hello on the control socket comes from a worker this attempt spawned: "" when it is
// local rank h.local's running worker, not connected yet, with the model's size (`model_floats`),
// and the other end (SO_PEERCRED: `have_cred`, `peer_pid`, `peer_uid`) is that worker's pid of
// our `euid`; otherwise why it is refused. Who is really at the other end counts, not what the
// message says.
std::string hello_refusal(const contract::control::Hello& h, const std::vector<Worker>& workers,
                          int64_t model_floats, bool have_cred, pid_t peer_pid, uid_t peer_uid,
                          uid_t euid);

// "exited with status 3", "was killed by signal 9 (Killed)".
using proc::describe_status;

// A worker's death as ringd reports it (training and generate jobs alike): the log line
// "worker rank R (pid P) <status> <during>; last log lines:\n    | ..." and the fields of event
// worker_died (rank, pid, last_lines, signal and signal_name or exit_code).
struct DeathReport {
  std::string line;
  nlohmann::json event;
};
DeathReport death_report(const Worker& w, int status, const std::string& during);

class Supervisor {
 public:
  struct Options {
    double heartbeat_timeout_s = 30;  // silence of a connected worker that counts as a hang
    double startup_timeout_s = 300;   // spawn to hello
    double stop_grace_s = 5;          // SIGUSR2 to SIGKILL
  };
  // How to start one worker.
  struct Launch {
    std::vector<std::string> argv;    // argv[0]: the executable's path
    std::vector<int> cpus;            // its cpuset (empty: ours)
    std::string cuda_visible_devices;  // replaces ours when not empty
    std::string banner;                // appended to the log before the worker's output
  };

  explicit Supervisor(Options o) : o_(o) {}

  std::vector<Worker>& workers() { return workers_; }
  const std::vector<Worker>& workers() const { return workers_; }
  // A new attempt: `count` empty slots, local ranks 0.., global ranks first_rank + local, logs
  // `log_of(rank)`.
  template <typename LogOf>
  void reset(int count, int first_rank, LogOf log_of) {
    group_.clear();
    workers_.assign(static_cast<size_t>(count), Worker{});
    for (int l = 0; l < count; ++l) {
      workers_[l].local = l;
      workers_[l].rank = first_rank + l;
      workers_[l].log = log_of(workers_[l].rank);
    }
  }

  // Starts slot `w`. A log that cannot be opened or written is fatal (no restart mends it): the
  // reason in *fatal, nothing started. A spawn that fails (fork, exec, affinity) leaves
  // w.running false with the reason in *failed (also appended to the worker's log).
  void spawn(Worker& w, const Launch& launch, std::string* fatal, std::string* failed);
  // kWorkerStopSignal to every running worker's process group; SIGKILL follows the grace
  // (kill_overdue). Returns how many were signalled.
  int stop();
  // SIGKILL to the process group of `w` (a failed worker).
  void kill(const Worker& w);
  // After stop(): SIGKILL to the groups of those still running once the grace is over.
  void kill_overdue(Clock::time_point now);
  // Every exit path: SIGKILL to every running worker's group, then wait for each.
  void kill_all_and_wait();
  // The workers that have ended (reaped), with their wait status: those killed by a signal other
  // than ours first. The caller marks each not running as it handles it (in this order: the
  // first failure stops the ones still marked running). When no end is `expected`, waits up to 1 s for a killed
  // worker whose threads are still exiting (its peers' failures may be reapable first).
  std::vector<std::pair<Worker*, int>> reap(bool expected);
  // A running worker silent too long, with the reason ("sent no heartbeat for 31.2 s (hung)",
  // "did not connect within 300 s"); silence counts from `unblocked_at` at the earliest (the
  // event loop did not read while it was blocked).
  std::optional<std::pair<Worker*, std::string>> overdue(Clock::time_point now,
                                                         Clock::time_point unblocked_at);
  bool any_running() const;

 private:
  Options o_;
  std::vector<Worker> workers_;
  proc::RankGroup group_{{/*process_groups=*/true, kWorkerStopSignal}};  // slot: local rank
};

}  // namespace ring::ringd
