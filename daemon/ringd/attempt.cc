#include "daemon/ringd/attempt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "daemon/ringd/options.h"

namespace ring::ringd::attempt {
namespace {

// The seconds the workers have to finish the step and stop, and ring-coord to answer.
constexpr double kStateAnswerS = 10;
constexpr double kRestartDecisionS = 15;
constexpr double kRollBackSlackS = 60;

// An action of kind `k` with the fields `set` gives it.
template <typename Set>
Action make(ActionKind k, Set set) {
  Action a;
  a.kind = k;
  set(a);
  return a;
}

Action act(ActionKind k, std::string text = {}) {
  return make(k, [&](Action& a) { a.text = std::move(text); });
}

Action say(Note n, std::string text = {}) {
  return make(ActionKind::kSay, [&](Action& a) { a.note = n, a.text = std::move(text); });
}

Action ack(bool ok, std::string why = {}) {
  return make(ActionKind::kAck, [&](Action& a) { a.ok = ok, a.text = std::move(why); });
}

Action await_coord(double seconds) {
  return make(ActionKind::kAwaitCoord, [&](Action& a) { a.seconds = seconds; });
}

Action schedule_restart(double seconds, bool resume, int64_t step) {
  return make(ActionKind::kScheduleRestart,
              [&](Action& a) { a.seconds = seconds, a.resume = resume, a.step = step; });
}

void exit_now(Transition& t, int code) {
  t.state.phase = Phase::kExiting;
  t.state.await = Await::kNone;
  t.state.exit_code = code;
  t.actions.push_back(make(ActionKind::kExit, [&](Action& a) { a.code = code; }));
}

void stop_workers(Transition& t, std::string why) {
  t.state.phase = Phase::kStopping;
  t.actions.push_back(act(ActionKind::kStopWorkers, std::move(why)));
}

// A step boundary with nothing in flight: the next step, or the end of the run. One node
// decides alone; several stop after the step in which all of them learnt of the stop.
void boundary(const Config& c, Transition& t, bool more_steps) {
  State& s = t.state;
  const bool stop_now = s.stop_agreed || (s.stop_signals > 0 && c.nodes == 1);
  if (!more_steps || stop_now) {
    s.phase = Phase::kFinishing;
    s.finishing = true;
    Action a = act(ActionKind::kStopAtBoundary, s.stop_requested() ? "stop requested" : "done");
    a.checkpoint = s.stop_signals < 2;
    t.actions.push_back(std::move(a));
    return;
  }
  s.phase = Phase::kRunning;
  t.actions.push_back(act(ActionKind::kBeginStep));
}

// The spec's restart policy: another attempt after an exponential backoff, or exit 1.
void restart_policy(const Config& c, Transition& t) {
  State& s = t.state;
  if (s.restarts < c.max_restarts) {
    const double delay =
        std::min(c.backoff_s * std::pow(2.0, static_cast<double>(s.restarts)), c.backoff_max_s);
    ++s.restarts;
    ++s.attempt;
    s.phase = Phase::kRestarting;
    s.await = Await::kNone;
    Action n = say(Note::kRestarting);
    n.restart = s.restarts;
    n.seconds = delay;
    n.attempt = s.attempt;
    t.actions.push_back(std::move(n));
    // With a coordinator that stayed silent: the newest complete checkpoint.
    t.actions.push_back(
        schedule_restart(delay, c.coordinated, std::numeric_limits<int64_t>::max()));
    return;
  }
  t.actions.push_back(say(Note::kRestartsExhausted));
  exit_now(t, kExitFailed);
}

// Every worker of the attempt is gone: what comes next.
void after_attempt(const Config& c, Transition& t, const Event& e) {
  State& s = t.state;
  if (c.coordinated && s.rollback_pending && !s.stop_requested()) {
    s.rollback_pending = false;
    s.attempt = static_cast<int>(s.rollback_attempt);
    s.phase = Phase::kRestarting;
    Action n = say(Note::kRollBack);
    n.attempt = s.attempt;
    n.step = s.rollback_step;
    t.actions.push_back(std::move(n));
    t.actions.push_back(schedule_restart(0, true, s.rollback_step));
    return;
  }
  if (c.coordinated && s.coord_stop && !s.stop_requested()) {
    s.phase = Phase::kAwaitingCoord;
    s.await = Await::kState;
    t.actions.push_back(say(Note::kStoppedByCoord, s.coord_stop_reason));
    t.actions.push_back(await_coord(kStateAnswerS));
    return;
  }
  if (!s.failed && !e.final_checkpoint_error.empty()) {
    s.failed = true;
    t.actions.push_back(say(Note::kFinalCheckpointFailed, e.final_checkpoint_error));
    exit_now(t, kExitFailed);
    return;
  }
  if (!s.failed) {
    t.actions.push_back(say(s.stop_requested() ? Note::kStoppedResumable : Note::kCompleted));
    exit_now(t, s.stop_requested() ? kExitStopped : kExitOk);
    return;
  }
  if (s.stop_requested()) {
    t.actions.push_back(say(Note::kStoppedAfterFailure));
    exit_now(t, kExitStopped);
    return;
  }
  if (c.coordinated) {
    // ring-coord heard of the death and applies the restart policy: stop, then roll_back (or
    // stop alone when restarts are exhausted). Silent: ringd's own policy.
    s.phase = Phase::kAwaitingCoord;
    s.await = Await::kAfterFailure;
    t.actions.push_back(say(Note::kWaitForCoord));
    t.actions.push_back(await_coord(kRestartDecisionS));
    return;
  }
  restart_policy(c, t);
}

void start(Transition& t) {
  t.state.phase = Phase::kStarting;
  t.state.failed = false;
  t.state.finishing = false;
  t.actions.push_back(act(ActionKind::kStartAttempt));
}

}  // namespace

Transition next(const Config& c, const State& state, const Event& e) {
  Transition t;
  t.state = state;
  State& s = t.state;
  const auto refuse = [&] {
    t.state = state;
    t.actions.clear();
    t.accepted = false;
    return t;
  };
  if (s.phase == Phase::kExiting) return refuse();  // nothing happens after the exit
  const bool live = s.live();
  switch (e.kind) {
    case EventKind::kStart:
      if (s.phase != Phase::kIdle) return refuse();
      s.attempt = static_cast<int>(e.attempt);
      start(t);
      return t;
    case EventKind::kRestartDue:
      if (s.phase != Phase::kRestarting) return refuse();
      start(t);
      return t;
    case EventKind::kStartFailed:
      if (s.phase != Phase::kStarting) return refuse();
      s.failed = true;
      stop_workers(t, e.text);
      return t;
    case EventKind::kBoundary:
      if (s.phase != Phase::kStarting || !e.ready) return refuse();
      boundary(c, t, e.more_steps);
      return t;
    case EventKind::kStopInStep:
      if (s.phase != Phase::kRunning) return refuse();
      if (s.stop_agreed) return t;  // known already: nothing to do
      s.stop_agreed = true;
      if (s.stop_signals > 0) {
        t.actions.push_back(say(Note::kStopAgreed));
      } else {
        t.actions.push_back(say(Note::kStopFromOtherNode));
        t.actions.push_back(act(ActionKind::kArmStopDeadline));
      }
      return t;
    case EventKind::kStepDone:
      if (s.phase != Phase::kRunning) return refuse();
      if (e.has_checkpointer && (e.periodic_checkpoint || s.ckpt_requested)) {
        if (s.ckpt_requested) t.actions.push_back(say(Note::kCheckpointAsked));
        Action a = act(ActionKind::kCheckpoint);
        a.by_coord = s.ckpt_requested;
        t.actions.push_back(std::move(a));
        s.ckpt_requested = false;
      }
      boundary(c, t, e.more_steps);
      return t;
    case EventKind::kStepFailed:
      if (s.phase != Phase::kRunning) return refuse();
      s.failed = true;
      stop_workers(t, e.text);
      return t;
    case EventKind::kWorkerFailed:
      if (!live || s.phase == Phase::kStopping) return refuse();
      s.failed = true;
      stop_workers(t, e.text);
      return t;
    case EventKind::kStopSignal:
      ++s.stop_signals;
      if (s.stop_signals == 1) {
        t.actions.push_back(say(Note::kStopping));
        if (!live) {
          exit_now(t, kExitStopped);
          return t;
        }
        t.actions.push_back(act(ActionKind::kArmStopDeadline));
        if (s.phase == Phase::kStarting) {
          if (e.ready) boundary(c, t, e.more_steps);  // sends stop (after the checkpoint)
          else stop_workers(t, "stop requested before the first step");
        }
        return t;
      }
      t.actions.push_back(say(Note::kStopNow));
      if (!live) {
        exit_now(t, kExitStopped);
        return t;
      }
      s.failed = true;
      stop_workers(t, "second stop signal");
      return t;
    case EventKind::kStopTimeout:
      if (!live || s.phase == Phase::kStopping || !(s.finishing || s.stop_requested()))
        return refuse();
      // Workers that finished every step and then hang on the way out do not fail the run.
      if (!s.finishing) s.failed = true;
      stop_workers(t, "workers did not stop in time");
      return t;
    case EventKind::kAllExited:
      if (!live) return refuse();
      after_attempt(c, t, e);
      return t;
    case EventKind::kAwaitTimeout:
      if (s.phase != Phase::kAwaitingCoord) return refuse();
      if (s.await == Await::kAfterFailure) {
        s.await = Await::kNone;
        t.actions.push_back(say(Note::kCoordSilent));
        restart_policy(c, t);
      } else {
        t.actions.push_back(say(Note::kCoordNoState));
        exit_now(t, kExitStopped);
      }
      return t;
    case EventKind::kCoordStop:
      if (!c.coordinated) return refuse();
      t.actions.push_back(ack(true));
      if (s.coord_stop && s.await != Await::kRollBack) return t;  // already stopping
      s.coord_stop = true;
      s.coord_stop_reason = e.text;
      s.rollback_pending = false;
      if (live) {
        stop_workers(t, "ring-coord: " + e.text);  // kAllExited goes on
      } else {
        s.phase = Phase::kAwaitingCoord;
        s.await = Await::kState;
        t.actions.push_back(say(Note::kCoordStoppedIdle, e.text));
        t.actions.push_back(await_coord(kStateAnswerS));
      }
      return t;
    case EventKind::kCoordRollBack:
      if (!c.coordinated) return refuse();
      t.actions.push_back(ack(true));
      if (live && e.attempt == s.attempt && s.phase != Phase::kStopping) return t;  // on it
      s.coord_stop = false;
      s.await = Await::kNone;
      if (live) {
        s.rollback_pending = true;
        s.rollback_attempt = e.attempt;
        s.rollback_step = e.step;
        stop_workers(t, "ring-coord: roll back to attempt " + std::to_string(e.attempt));
      } else {
        s.attempt = static_cast<int>(e.attempt);
        s.phase = Phase::kRestarting;
        Action n = say(Note::kStartFromCoord);
        n.attempt = s.attempt;
        n.step = e.step;
        t.actions.push_back(std::move(n));
        t.actions.push_back(schedule_restart(0, true, e.step));
      }
      return t;
    case EventKind::kCoordCheckpointNow:
      if (!c.coordinated) return refuse();
      if (!live || s.finishing) {
        t.actions.push_back(ack(false, "no attempt is training on this node now"));
      } else if (!e.has_checkpointer) {
        t.actions.push_back(
            ack(false, "checkpoints are off for this job (checkpoint.dir is empty)"));
      } else {
        s.ckpt_requested = true;  // kStepDone: at the next step boundary
        t.actions.push_back(ack(true));
      }
      return t;
    case EventKind::kCoordState:
      if (s.phase != Phase::kAwaitingCoord || s.await != Await::kState) return refuse();
      if (const std::optional<int> code = exit_for_job_state(e.text)) {
        exit_now(t, *code);
      } else {
        // restarting (or starting/running after a restart request): roll_back comes after the
        // coordinator's backoff.
        s.await = Await::kRollBack;
        t.actions.push_back(await_coord(c.backoff_max_s + kRollBackSlackS));
      }
      return t;
    case EventKind::kFatal:
      s.failed = true;
      exit_now(t, kExitFailed);
      return t;
  }
  return refuse();
}

std::optional<int> exit_for_job_state(std::string_view s) {
  if (s == "cancelled" || s == "cancelling") return kExitCancelled;
  if (s == "failed") return kExitFailed;
  if (s == "completed" || s == "completing") return kExitOk;
  // Stopped on a stop signal, resumable: a new run resumes it (`ringctl run --resume`), not
  // this job's daemon.
  if (s == "stopped") return kExitStopped;
  return std::nullopt;
}

std::string_view to_string(Phase p) {
  switch (p) {
    case Phase::kIdle: return "idle";
    case Phase::kStarting: return "starting";
    case Phase::kRunning: return "running";
    case Phase::kFinishing: return "finishing";
    case Phase::kStopping: return "stopping";
    case Phase::kRestarting: return "restarting";
    case Phase::kAwaitingCoord: return "awaiting-coord";
    case Phase::kExiting: return "exiting";
  }
  return "?";
}

std::string_view to_string(EventKind k) {
  switch (k) {
    case EventKind::kStart: return "start";
    case EventKind::kStartFailed: return "start-failed";
    case EventKind::kBoundary: return "boundary";
    case EventKind::kStopInStep: return "stop-in-step";
    case EventKind::kStepDone: return "step-done";
    case EventKind::kStepFailed: return "step-failed";
    case EventKind::kWorkerFailed: return "worker-failed";
    case EventKind::kStopSignal: return "stop-signal";
    case EventKind::kStopTimeout: return "stop-timeout";
    case EventKind::kAllExited: return "all-exited";
    case EventKind::kRestartDue: return "restart-due";
    case EventKind::kAwaitTimeout: return "await-timeout";
    case EventKind::kCoordStop: return "coord-stop";
    case EventKind::kCoordRollBack: return "coord-roll-back";
    case EventKind::kCoordCheckpointNow: return "coord-checkpoint-now";
    case EventKind::kCoordState: return "coord-state";
    case EventKind::kFatal: return "fatal";
  }
  return "?";
}

std::string_view to_string(ActionKind k) {
  switch (k) {
    case ActionKind::kStopWorkers: return "stop-workers";
    case ActionKind::kBeginStep: return "begin-step";
    case ActionKind::kStopAtBoundary: return "stop-at-boundary";
    case ActionKind::kCheckpoint: return "checkpoint";
    case ActionKind::kArmStopDeadline: return "arm-stop-deadline";
    case ActionKind::kStartAttempt: return "start-attempt";
    case ActionKind::kScheduleRestart: return "schedule-restart";
    case ActionKind::kAwaitCoord: return "await-coord";
    case ActionKind::kAck: return "ack";
    case ActionKind::kExit: return "exit";
    case ActionKind::kSay: return "say";
  }
  return "?";
}

}  // namespace ring::ringd::attempt
