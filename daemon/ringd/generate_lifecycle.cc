#include "daemon/ringd/generate_lifecycle.h"

#include <sys/wait.h>

#include "daemon/ringd/options.h"
#include "daemon/ringd/supervisor.h"

namespace ring::ringd::genlife {
namespace {

bool clean(int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 0; }

Action act(ActionKind k, int rank = -1, int status = 0, std::string text = {}) {
  Action a;
  a.kind = k;
  a.rank = rank;
  a.status = status;
  a.text = std::move(text);
  return a;
}

// The first stop of the run (later ones change nothing: the workers are being stopped).
void stop(Transition& t, const std::string& why) {
  if (t.state.phase == Phase::kStopping) return;
  t.state.phase = Phase::kStopping;
  t.actions.push_back(act(ActionKind::kStopWorkers, -1, 0, why));
}

// The death of rank (wait status st) fails the run; the others are stopped.
void die(Transition& t, int rank, int st) {
  t.actions.push_back(act(ActionKind::kDied, rank, st));
  t.state.failure = "worker rank " + std::to_string(rank) + " " + describe_status(st);
  stop(t, t.state.failure);
}

// A held death: part of a stop that came meanwhile, or after the grace the run's failure.
void settle(const Config& c, Transition& t, double now_s) {
  State& s = t.state;
  if (!s.held) return;
  if (s.phase == Phase::kStopping) {
    t.actions.push_back(act(ActionKind::kHeldWasStop, s.held->rank));
    s.held.reset();
    return;
  }
  if (now_s - s.held->at_s < c.stop_grace_s) return;
  const Held h = *s.held;
  s.held.reset();
  die(t, h.rank, h.status);
}

// Every worker ended and nothing is held: the run is over.
void maybe_end(Transition& t) {
  State& s = t.state;
  if (s.phase == Phase::kIdle || s.phase == Phase::kEnded || s.running > 0 || s.held) return;
  Action a = act(ActionKind::kExit);
  a.code = exit_code_of(s, &a.outcome);
  a.text = s.failure;
  s.exit_code = a.code;
  s.phase = Phase::kEnded;
  t.actions.push_back(a);
}

void worker_ended(const Config& c, Transition& t, const Event& e) {
  State& s = t.state;
  if (s.running > 0) --s.running;
  const int st = e.status;
  if (clean(st)) {
    ++s.exited_clean;
    t.actions.push_back(act(ActionKind::kExited, e.rank, st));
  } else if (s.phase == Phase::kStopping) {
    t.actions.push_back(act(ActionKind::kStopped, e.rank, st));
  } else if (WIFEXITED(st)) {
    if (!s.held) {
      s.held = Held{e.rank, st, e.now_s};
      Action a = act(ActionKind::kHold, e.rank, st);
      t.actions.push_back(a);
    } else {
      t.actions.push_back(act(ActionKind::kEndedAlso, e.rank, st));
    }
  } else {
    // A death by a signal is the cause at once, whatever was held.
    s.held.reset();
    die(t, e.rank, st);
  }
  settle(c, t, e.now_s);
}

}  // namespace

int exit_code_of(const State& s, Outcome* outcome) {
  if (!s.failure.empty()) {
    *outcome = Outcome::kFailed;
    return kExitFailed;
  }
  if (s.coord_stop) {
    *outcome = Outcome::kStoppedByCoord;
    return s.coord_stop->rfind("job failed", 0) == 0 ? kExitFailed : kExitCancelled;
  }
  if (s.stop_signal != 0) {
    *outcome = Outcome::kStoppedBySignal;
    return kExitStopped;
  }
  *outcome = Outcome::kCompleted;
  return kExitOk;
}

Transition next(const Config& c, const State& s, const Event& e) {
  Transition t{s, {}, true};
  State& n = t.state;
  if (s.phase == Phase::kEnded) return {s, {}, false};
  switch (e.kind) {
    case EventKind::kStarted:
      if (s.phase != Phase::kIdle) return {s, {}, false};
      n.phase = Phase::kRunning;
      n.running = c.workers;
      return t;
    case EventKind::kSpawnFailed: {
      if (s.phase != Phase::kIdle) return {s, {}, false};
      n.failure = e.text;
      n.phase = Phase::kEnded;
      n.exit_code = kExitFailed;
      t.actions.push_back(act(ActionKind::kStopWorkers, -1, 0, e.text));
      Action a = act(ActionKind::kExit, -1, 0, e.text);
      a.code = kExitFailed;
      a.outcome = Outcome::kSpawnFailed;
      t.actions.push_back(a);
      return t;
    }
    case EventKind::kWorkerEnded:
      if (s.phase == Phase::kIdle) return {s, {}, false};
      worker_ended(c, t, e);
      break;
    case EventKind::kStopSignal:
      if (n.stop_signal == 0) n.stop_signal = e.sig;
      if (s.phase == Phase::kIdle) {
        // Before the workers start (registration): nothing to stop, the run ends at once.
        n.phase = Phase::kRunning;
        n.running = 0;
      }
      stop(t, e.text);
      settle(c, t, e.now_s);
      break;
    case EventKind::kCoordStop:
      if (!n.coord_stop) n.coord_stop = e.text;
      if (s.phase == Phase::kIdle) {
        n.phase = Phase::kRunning;
        n.running = 0;
      }
      stop(t, "ring-coord: " + e.text);
      settle(c, t, e.now_s);
      break;
    case EventKind::kHang:
      if (s.phase != Phase::kRunning) return {s, {}, false};
      n.failure = "worker rank " + std::to_string(e.rank) + " hung: " + e.text;
      t.actions.push_back(act(ActionKind::kKill, e.rank, 0, e.text));
      stop(t, n.failure);
      break;
    case EventKind::kTick:
      if (s.phase == Phase::kIdle) return {s, {}, false};
      settle(c, t, e.now_s);
      break;
  }
  maybe_end(t);
  return t;
}

}  // namespace ring::ringd::genlife
