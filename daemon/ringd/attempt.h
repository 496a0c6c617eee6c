// The lifecycle of ringd's attempts as one state machine: a pure function from (state, event) to
// (state, actions), with no I/O, so that every transition is testable without processes. The
// Daemon (ringd.cc) feeds it what happened (a worker died, a step ended, a signal, a coordinator
// command) with the facts it needs, and carries out the actions it returns in order (stop the
// workers, begin a step, checkpoint, schedule a restart, exit, say what happened).
//
//   Idle --Start--> Starting --Boundary--> Running --StepDone--> Running ... --> Finishing
//   Starting/Running/Finishing --WorkerFailed/StopTimeout/CoordStop/...--> Stopping
//   (any live phase) --AllExited--> Restarting | AwaitingCoord | Exiting
//   Restarting --RestartDue--> Starting;   AwaitingCoord --CoordState/AwaitTimeout--> ...
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ring::ringd::attempt {

enum class Phase {
  kIdle,           // before the first attempt
  kStarting,       // workers spawned; waiting until all mapped the shared memory and weights exist
  kRunning,        // steps in flight
  kFinishing,      // every step done (or a stop agreed): workers told to stop at the boundary
  kStopping,       // workers being stopped (SIGUSR2, then SIGKILL after the grace)
  kRestarting,     // between attempts: the restart backoff runs
  kAwaitingCoord,  // between attempts: waiting for ring-coord (see Await)
  kExiting,        // done: exit with State::exit_code
};

// What ringd waits for from ring-coord in kAwaitingCoord.
enum class Await {
  kNone,
  kAfterFailure,  // its restart decision after a failed attempt (stop, then roll_back)
  kState,         // the job's state after its stop (a `registered` answer)
  kRollBack,      // the roll_back that follows the coordinator's restart backoff
};

// The fixed facts the transitions depend on.
struct Config {
  int nodes = 1;
  bool coordinated = false;  // --coord: restarts are the coordinator's decision
  int64_t max_restarts = 0;
  double backoff_s = 0, backoff_max_s = 0;
};

struct State {
  Phase phase = Phase::kIdle;
  Await await = Await::kNone;
  int attempt = 0;
  int64_t restarts = 0;
  bool failed = false;     // this attempt failed (a worker, the optimizer, a second signal)
  bool finishing = false;  // the workers were told to stop at a step boundary (kept in kStopping)
  int stop_signals = 0;    // distinct stop signals received (repeats within 1 s are one)
  bool stop_agreed = false;  // several nodes: every node learnt of a stop in the same step
  bool coord_stop = false;   // ring-coord said stop: after the workers, ask for the job's state
  std::string coord_stop_reason;
  bool rollback_pending = false;  // ring-coord said roll_back while an attempt was live
  int64_t rollback_attempt = 0, rollback_step = 0;
  bool ckpt_requested = false;  // ring-coord's checkpoint_now: at the next step boundary
  int exit_code = 0;            // with kExiting

  bool live() const {
    return phase == Phase::kStarting || phase == Phase::kRunning || phase == Phase::kFinishing ||
           phase == Phase::kStopping;
  }
  bool stop_requested() const { return stop_signals > 0 || stop_agreed; }
};

enum class EventKind {
  kStart,          // the first attempt starts (Idle)
  kStartFailed,    // the attempt could not start (a worker not spawned, the optimizer): text
  kBoundary,       // a step boundary with nothing in flight: `ready`, `more_steps`
  kStopInStep,     // a step ended and its loss all_gather carried a stop request (any node)
  kStepDone,       // a step ended: `more_steps`, `periodic_checkpoint`, `has_checkpointer`
  kStepFailed,     // the optimizer failed the step: text
  kWorkerFailed,   // a worker died, hung, broke the protocol: text
  kStopSignal,     // SIGTERM/SIGINT/SIGUSR1/SIGHUP (a repeat within 1 s is not sent): `ready`
  kStopTimeout,    // the workers did not stop at the boundary in time (60 s)
  kAllExited,      // every worker of the attempt has been reaped: `final_checkpoint_error`
  kRestartDue,     // the restart backoff is over
  kAwaitTimeout,   // ring-coord did not answer in time
  kCoordStop,      // ring-coord: stop (text: the reason)
  kCoordRollBack,  // ring-coord: roll_back to `attempt` from `step`
  kCoordCheckpointNow,  // ring-coord: checkpoint_now (`has_checkpointer`)
  kCoordState,     // ring-coord's answer with the job's state (text)
  kFatal,          // an error no restart mends: exit 1 at once
};

struct Event {
  EventKind kind = EventKind::kStart;
  std::string text;             // a reason, an error, or the coordinator's job state
  bool ready = false;           // every worker mapped the shared memory and weights exist
  bool more_steps = true;       // the next step is within the run
  bool periodic_checkpoint = false;  // checkpoint.every_steps says the finished step is one
  bool has_checkpointer = false;
  std::string final_checkpoint_error;  // the run's last checkpoint failed (message), or ""
  int64_t attempt = 0, step = 0;       // kCoordRollBack
};

enum class ActionKind {
  kStopWorkers,        // text: why
  kBeginStep,          // send the next step's params
  kStopAtBoundary,     // checkpoint the last step (waiting) when `checkpoint` and due, tell the
                       // workers to stop (text: the reason they are told), arm the stop deadline
  kCheckpoint,         // checkpoint the finished step, not waiting (`by_coord`: asked for)
  kArmStopDeadline,    // the workers have 60 s to reach the step boundary and stop
  kStartAttempt,       // spawn the workers of State::attempt
  kScheduleRestart,    // start State::attempt after `seconds`; with `resume`, from the newest
                       // complete checkpoint at or below `step`
  kAwaitCoord,         // wait `seconds` for ring-coord (State::await); kState also asks for it
  kAck,                // answer ring-coord's command: `ok`, text (refusal reason)
  kExit,               // leave the event loop with `code`
  kSay,                // log and report: `note` (with text, numbers)
};

// What kSay says (the Daemon words it: log lines and events stay as they were).
enum class Note {
  kNone,
  kStopping,            // first stop signal: "finishing the step, checkpoint, then stop"
  kStopNow,             // second stop signal: "stopping the workers now, no checkpoint"
  kStopAgreed,          // a step ended with every node knowing of this node's stop request
  kStopFromOtherNode,   // ... of another node's (this node had no signal): event "stopping"
  kCheckpointAsked,     // "checkpoint at step N (asked by ring-coord)"
  kStoppedByCoord,      // "stopped at step N by ring-coord (reason)" + event stopped
  kStoppedResumable,    // "stopped at step N on request (resumable)" + event stopped
  kStoppedAfterFailure, // event stopped (a failed attempt with a stop request)
  kCompleted,           // "completed N steps" + event completed
  kRestarting,          // "restart R of M in D s" + event restarting
  kRestartsExhausted,   // "failed: restart.max_restarts exhausted" + event failed
  kRollBack,            // "ring-coord: roll back to attempt A from step S"
  kStartFromCoord,      // "ring-coord: starting attempt A from step S"
  kWaitForCoord,        // "attempt failed: waiting for ring-coord's decision"
  kCoordSilent,         // "ring-coord did not answer: applying the spec's restart policy here"
  kCoordNoState,        // "ring-coord did not say how to go on after its stop: exiting"
  kCoordStoppedIdle,    // event stopped (a coordinator stop between attempts)
  kFinalCheckpointFailed,  // the run's last checkpoint failed: fatal (text)
};

struct Action {
  ActionKind kind = ActionKind::kSay;
  std::string text;
  Note note = Note::kNone;
  int code = 0;             // kExit
  double seconds = 0;       // kScheduleRestart, kAwaitCoord
  bool ok = false;          // kAck
  bool checkpoint = false;  // kStopAtBoundary: checkpoint the last step first
  bool by_coord = false;    // kCheckpoint
  bool resume = false;      // kScheduleRestart
  int64_t attempt = 0, step = 0, restart = 0;  // kSay numbers, kScheduleRestart's resume step
};

struct Transition {
  State state;
  std::vector<Action> actions;
  bool accepted = true;  // false: the event means nothing in this phase (no change, no action)
};

// The exit status for a job ring-coord has ended: cancelled/cancelling 3, failed 1,
// completed/completing 0; nothing for a job that goes on (pending, running, restarting, ...).
std::optional<int> exit_for_job_state(std::string_view job_state);

// The transition for `event` in `state`. Pure: the same inputs give the same result.
Transition next(const Config& config, const State& state, const Event& event);

std::string_view to_string(Phase p);
std::string_view to_string(EventKind k);
std::string_view to_string(ActionKind k);

}  // namespace ring::ringd::attempt
