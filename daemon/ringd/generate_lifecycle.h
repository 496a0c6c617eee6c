// The lifecycle of a generate job on one node (job.kind generate, generate_job.h) as a pure state
// machine, the sibling of the training attempts' (attempt.h): (state, event) -> (state, actions),
// no I/O, every transition testable without processes. ringd's Daemon feeds it what happened
// (workers started, a worker ended, a stop signal, ring-coord's stop, a hang, the clock) and
// carries out the actions in order (say, stop or kill workers, exit).
//
//   Idle --Started--> Running --(failure | stop signal | coordinator stop)--> Stopping
//   Running/Stopping --(every worker ended, no death held)--> Ended (kExit with the code)
//   Idle --SpawnFailed--> Ended (exit 1)
//
// A generate job runs once: a failure ends it (it is not resumable mid-way; ring-coord fails the
// job and does not restart it). One case is held back: a worker that EXITS with an error while
// no stop was asked for may be a peer of a rank on another node whose ringd heard a stop first
// (Slurm signals the nodes' ringd milliseconds apart); the death is held for `stop_grace_s` and
// becomes the failure only when no stop arrived meanwhile. A death by a signal is never held.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ring::ringd::genlife {

enum class Phase { kIdle, kRunning, kStopping, kEnded };

struct Config {
  int workers = 1;            // this node's workers
  double stop_grace_s = 2.0;  // how long an error exit waits for a stop before it fails the job
};

// A worker's end that is held back (see above).
struct Held {
  int rank = 0;
  int status = 0;     // wait status
  double at_s = 0;    // when it was reaped (Event::now_s)
};

struct State {
  Phase phase = Phase::kIdle;
  int running = 0;             // workers not yet reaped
  int exited_clean = 0;
  std::string failure;         // why the job failed ("" while it has not)
  int stop_signal = 0;         // the first stop signal
  std::optional<std::string> coord_stop;  // ring-coord's stop, its reason
  std::optional<Held> held;
  int exit_code = 0;           // with kEnded
};

enum class EventKind {
  kStarted,      // every worker was spawned
  kSpawnFailed,  // a worker could not be started: text
  kWorkerEnded,  // a worker was reaped: rank, status (in the supervisor's order: causes first)
  kStopSignal,   // SIGTERM/SIGINT/SIGUSR1/SIGHUP: sig
  kCoordStop,    // ring-coord's stop (ringctl cancel, the job failed elsewhere): text
  kHang,         // rank of this node makes no progress: rank, text (the finding)
  kTick,         // the clock (settles a held death)
};

struct Event {
  EventKind kind = EventKind::kTick;
  int rank = -1;
  int status = 0;       // kWorkerEnded: the wait status
  int sig = 0;          // kStopSignal
  std::string text;
  double now_s = 0;     // every event: the time (any monotonic origin)
};

enum class ActionKind {
  kExited,       // rank exited 0: "worker rank R exited" + event worker_exited
  kStopped,      // rank ended during the stop: a log line (its status)
  kHold,         // rank's error exit is held (Held): "fails unless a stop arrives within ..."
  kEndedAlso,    // another error exit while one is held: a log line
  kHeldWasStop,  // the held death came with a stop: "not a failure"
  kDied,         // rank's death is the failure: log with its last lines + event worker_died
  kKill,         // SIGKILL to rank (a hung one; event worker_failed)
  kStopWorkers,  // stop every running worker (text: why); SIGKILL after the grace
  kExit,         // leave the loop with `code`; `outcome` says how the run ended
};

enum class Outcome { kNone, kFailed, kSpawnFailed, kStoppedByCoord, kStoppedBySignal, kCompleted };

struct Action {
  ActionKind kind = ActionKind::kExit;
  int rank = -1;
  int status = 0;
  std::string text;
  int code = 0;
  Outcome outcome = Outcome::kNone;
};

struct Transition {
  State state;
  std::vector<Action> actions;
  bool accepted = true;  // false: the event means nothing in this state (state unchanged)
};

Transition next(const Config& c, const State& s, const Event& e);

// The exit status of an ended run (State::failure, coord_stop, stop_signal): 1 failed, 3
// cancelled by ring-coord (1 when its reason says the job failed), 75 stopped by a signal, 0.
int exit_code_of(const State& s, Outcome* outcome);

}  // namespace ring::ringd::genlife
