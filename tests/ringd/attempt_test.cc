// ringd's attempt state machine (daemon/ringd/attempt.h) without processes: every transition,
// including the ones that were combinations of flags before (a coordinator stop while a
// checkpoint is requested, a worker failure while finishing, a signal during the restart
// backoff, a roll_back while live), and every event a phase refuses.
#include "daemon/ringd/attempt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace ring::ringd::attempt;

Config alone(int nodes = 1, int64_t max_restarts = 2) {
  Config c;
  c.nodes = nodes;
  c.coordinated = false;
  c.max_restarts = max_restarts;
  c.backoff_s = 1;
  c.backoff_max_s = 3;
  return c;
}

Config coordinated(int nodes = 1) {
  Config c = alone(nodes);
  c.coordinated = true;
  return c;
}

State in(Phase p, int attempt = 1) {
  State s;
  s.phase = p;
  s.attempt = attempt;
  if (p == Phase::kFinishing) s.finishing = true;
  if (p == Phase::kAwaitingCoord) s.await = Await::kAfterFailure;
  return s;
}

Event ev(EventKind k) {
  Event e;
  e.kind = k;
  return e;
}

Event ev(EventKind k, std::string text) {
  Event e = ev(k);
  e.text = std::move(text);
  return e;
}

std::vector<ActionKind> kinds(const Transition& t) {
  std::vector<ActionKind> v;
  for (const Action& a : t.actions) v.push_back(a.kind);
  return v;
}

std::vector<Note> notes(const Transition& t) {
  std::vector<Note> v;
  for (const Action& a : t.actions)
    if (a.kind == ActionKind::kSay) v.push_back(a.note);
  return v;
}

const Action& only(const Transition& t, ActionKind k) {
  for (const Action& a : t.actions)
    if (a.kind == k) return a;
  ADD_FAILURE() << "no action " << to_string(k);
  static const Action none;
  return none;
}

using AK = ActionKind;

const std::vector<Phase> kAllPhases = {Phase::kIdle,       Phase::kStarting,      Phase::kRunning,
                                       Phase::kFinishing,  Phase::kStopping,      Phase::kRestarting,
                                       Phase::kAwaitingCoord, Phase::kExiting};
const std::vector<Phase> kLive = {Phase::kStarting, Phase::kRunning, Phase::kFinishing,
                                  Phase::kStopping};

// ---- starting --------------------------------------------------------------------------------

TEST(Attempt, StartFromIdleTakesTheAssignedAttempt) {
  Event e = ev(EventKind::kStart);
  e.attempt = 4;
  Transition t = next(alone(), State{}, e);
  EXPECT_TRUE(t.accepted);
  EXPECT_EQ(t.state.phase, Phase::kStarting);
  EXPECT_EQ(t.state.attempt, 4);
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kStartAttempt});
}

TEST(Attempt, RestartDueStartsTheNextAttemptWithCleanFlags) {
  State s = in(Phase::kRestarting, 3);
  s.failed = true;
  s.finishing = true;
  s.ckpt_requested = true;  // a checkpoint_now of the failed attempt carries over
  Transition t = next(alone(), s, ev(EventKind::kRestartDue));
  EXPECT_EQ(t.state.phase, Phase::kStarting);
  EXPECT_EQ(t.state.attempt, 3);
  EXPECT_FALSE(t.state.failed);
  EXPECT_FALSE(t.state.finishing);
  EXPECT_TRUE(t.state.ckpt_requested);
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kStartAttempt});
}

TEST(Attempt, StartFailedStopsTheWorkersAsAFailure) {
  Transition t = next(alone(), in(Phase::kStarting), ev(EventKind::kStartFailed, "no worker"));
  EXPECT_EQ(t.state.phase, Phase::kStopping);
  EXPECT_TRUE(t.state.failed);
  ASSERT_EQ(kinds(t), std::vector<AK>{AK::kStopWorkers});
  EXPECT_EQ(t.actions[0].text, "no worker");
}

TEST(Attempt, ReadyBoundaryBeginsTheFirstStep) {
  Event e = ev(EventKind::kBoundary);
  e.ready = true;
  Transition t = next(alone(), in(Phase::kStarting), e);
  EXPECT_EQ(t.state.phase, Phase::kRunning);
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kBeginStep});
}

TEST(Attempt, BoundaryWithoutStepsLeftFinishesAtOnce) {
  Event e = ev(EventKind::kBoundary);
  e.ready = true;
  e.more_steps = false;  // a resume from the last step
  Transition t = next(alone(), in(Phase::kStarting), e);
  EXPECT_EQ(t.state.phase, Phase::kFinishing);
  EXPECT_TRUE(t.state.finishing);
  ASSERT_EQ(kinds(t), std::vector<AK>{AK::kStopAtBoundary});
  EXPECT_EQ(t.actions[0].text, "done");
  EXPECT_TRUE(t.actions[0].checkpoint);
}

TEST(Attempt, BoundaryBeforeReadyIsRefused) {
  Transition t = next(alone(), in(Phase::kStarting), ev(EventKind::kBoundary));
  EXPECT_FALSE(t.accepted);
  EXPECT_EQ(t.state.phase, Phase::kStarting);
  EXPECT_TRUE(t.actions.empty());
}

// ---- steps -----------------------------------------------------------------------------------

TEST(Attempt, StepDoneBeginsTheNext) {
  Transition t = next(alone(), in(Phase::kRunning), ev(EventKind::kStepDone));
  EXPECT_EQ(t.state.phase, Phase::kRunning);
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kBeginStep});
}

TEST(Attempt, LastStepDoneFinishes) {
  Event e = ev(EventKind::kStepDone);
  e.more_steps = false;
  Transition t = next(alone(), in(Phase::kRunning), e);
  EXPECT_EQ(t.state.phase, Phase::kFinishing);
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kStopAtBoundary});
  EXPECT_EQ(t.actions[0].text, "done");
}

TEST(Attempt, PeriodicCheckpointAtTheBoundary) {
  Event e = ev(EventKind::kStepDone);
  e.periodic_checkpoint = true;
  e.has_checkpointer = true;
  Transition t = next(alone(), in(Phase::kRunning), e);
  EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kCheckpoint, AK::kBeginStep}));
  EXPECT_FALSE(t.actions[0].by_coord);
  // Without a checkpointer (checkpoint.dir empty) nothing is written.
  e.has_checkpointer = false;
  EXPECT_EQ(kinds(next(alone(), in(Phase::kRunning), e)), std::vector<AK>{AK::kBeginStep});
}

TEST(Attempt, RequestedCheckpointAtTheNextBoundaryOnce) {
  State s = in(Phase::kRunning);
  s.ckpt_requested = true;
  Event e = ev(EventKind::kStepDone);
  e.has_checkpointer = true;
  Transition t = next(alone(), s, e);
  EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kCheckpoint, AK::kBeginStep}));
  EXPECT_EQ(notes(t), std::vector<Note>{Note::kCheckpointAsked});
  EXPECT_TRUE(t.actions[1].by_coord);
  EXPECT_FALSE(t.state.ckpt_requested);
  EXPECT_EQ(kinds(next(alone(), t.state, e)), std::vector<AK>{AK::kBeginStep});
}

TEST(Attempt, StepFailedStopsAsAFailure) {
  Transition t = next(alone(), in(Phase::kRunning), ev(EventKind::kStepFailed, "optimizer"));
  EXPECT_EQ(t.state.phase, Phase::kStopping);
  EXPECT_TRUE(t.state.failed);
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kStopWorkers});
}

TEST(Attempt, StopInStepFromAnotherNodeArmsTheDeadlineOnce) {
  Transition t = next(alone(2), in(Phase::kRunning), ev(EventKind::kStopInStep));
  EXPECT_TRUE(t.state.stop_agreed);
  EXPECT_TRUE(t.state.stop_requested());
  EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kArmStopDeadline}));
  EXPECT_EQ(notes(t), std::vector<Note>{Note::kStopFromOtherNode});
  Transition again = next(alone(2), t.state, ev(EventKind::kStopInStep));
  EXPECT_TRUE(again.accepted);
  EXPECT_TRUE(again.actions.empty());
  // The next boundary finishes: every node stops after the same step.
  Transition b = next(alone(2), t.state, ev(EventKind::kStepDone));
  EXPECT_EQ(b.state.phase, Phase::kFinishing);
  EXPECT_EQ(b.actions[0].text, "stop requested");
}

TEST(Attempt, StopInStepOfOurOwnSignalIsAgreed) {
  State s = in(Phase::kRunning);
  s.stop_signals = 1;
  Transition t = next(alone(2), s, ev(EventKind::kStopInStep));
  EXPECT_EQ(notes(t), std::vector<Note>{Note::kStopAgreed});
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kSay});
}

// ---- stop signals ----------------------------------------------------------------------------

TEST(Attempt, FirstSignalWhileRunningAloneFinishesAtTheBoundary) {
  Transition t = next(alone(), in(Phase::kRunning), ev(EventKind::kStopSignal));
  EXPECT_EQ(t.state.phase, Phase::kRunning);
  EXPECT_EQ(t.state.stop_signals, 1);
  EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kArmStopDeadline}));
  Transition b = next(alone(), t.state, ev(EventKind::kStepDone));
  EXPECT_EQ(b.state.phase, Phase::kFinishing);
  ASSERT_EQ(kinds(b), std::vector<AK>{AK::kStopAtBoundary});
  EXPECT_TRUE(b.actions[0].checkpoint);
  EXPECT_EQ(b.actions[0].text, "stop requested");
}

TEST(Attempt, FirstSignalOfOneOfSeveralNodesWaitsForAgreement) {
  Transition t = next(alone(2), in(Phase::kRunning), ev(EventKind::kStopSignal));
  Transition b = next(alone(2), t.state, ev(EventKind::kStepDone));
  EXPECT_EQ(b.state.phase, Phase::kRunning);  // the stop travels in the next step's params
  EXPECT_EQ(kinds(b), std::vector<AK>{AK::kBeginStep});
}

TEST(Attempt, FirstSignalBeforeTheFirstStepStopsTheWorkersResumably) {
  Transition t = next(alone(), in(Phase::kStarting), ev(EventKind::kStopSignal));
  EXPECT_EQ(t.state.phase, Phase::kStopping);
  EXPECT_FALSE(t.state.failed);
  EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kArmStopDeadline, AK::kStopWorkers}));
  Transition end = next(alone(), t.state, ev(EventKind::kAllExited));
  EXPECT_EQ(end.state.phase, Phase::kExiting);
  EXPECT_EQ(end.state.exit_code, 75);
  EXPECT_EQ(notes(end), std::vector<Note>{Note::kStoppedResumable});
}

TEST(Attempt, FirstSignalWhenReadyFinishesAtOnce) {
  Event e = ev(EventKind::kStopSignal);
  e.ready = true;
  Transition t = next(alone(), in(Phase::kStarting), e);
  EXPECT_EQ(t.state.phase, Phase::kFinishing);
  EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kArmStopDeadline, AK::kStopAtBoundary}));
}

TEST(Attempt, FirstSignalWhileFinishingOrStoppingOnlyRearmsTheDeadline) {
  for (Phase p : {Phase::kFinishing, Phase::kStopping}) {
    Transition t = next(alone(), in(p), ev(EventKind::kStopSignal));
    EXPECT_EQ(t.state.phase, p);
    EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kArmStopDeadline})) << to_string(p);
  }
}

TEST(Attempt, SignalBetweenAttemptsExitsResumably) {
  // SIGHUP during the restart backoff, or while waiting for ring-coord.
  for (Phase p : {Phase::kIdle, Phase::kRestarting, Phase::kAwaitingCoord}) {
    Transition t = next(alone(), in(p), ev(EventKind::kStopSignal));
    EXPECT_EQ(t.state.phase, Phase::kExiting) << to_string(p);
    EXPECT_EQ(t.state.exit_code, 75);
    EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kExit}));
    EXPECT_EQ(notes(t), std::vector<Note>{Note::kStopping});
  }
}

TEST(Attempt, SecondSignalStopsAtOnceWithoutCheckpoint) {
  for (Phase p : kLive) {
    State s = in(p);
    s.stop_signals = 1;
    Transition t = next(alone(), s, ev(EventKind::kStopSignal));
    EXPECT_EQ(t.state.phase, Phase::kStopping) << to_string(p);
    EXPECT_TRUE(t.state.failed);
    EXPECT_EQ(t.state.stop_signals, 2);
    EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kSay, AK::kStopWorkers}));
    EXPECT_EQ(t.actions[1].text, "second stop signal");
    // Failed with a stop request: resumable, not restarted.
    Transition end = next(alone(), t.state, ev(EventKind::kAllExited));
    EXPECT_EQ(end.state.exit_code, 75);
    EXPECT_EQ(notes(end), std::vector<Note>{Note::kStoppedAfterFailure});
  }
  State s = in(Phase::kRestarting);
  s.stop_signals = 1;
  Transition t = next(alone(), s, ev(EventKind::kStopSignal));
  EXPECT_EQ(t.state.exit_code, 75);
  EXPECT_EQ(notes(t), std::vector<Note>{Note::kStopNow});
}

TEST(Attempt, StopAtBoundaryAfterASecondSignalSkipsTheCheckpoint) {
  State s = in(Phase::kRunning);
  s.stop_signals = 2;
  Transition t = next(alone(), s, ev(EventKind::kStepDone));
  ASSERT_EQ(kinds(t), std::vector<AK>{AK::kStopAtBoundary});
  EXPECT_FALSE(t.actions[0].checkpoint);
}

TEST(Attempt, StopTimeout) {
  // Finishing: workers that finished every step and hang on the way out do not fail the run.
  Transition f = next(alone(), in(Phase::kFinishing), ev(EventKind::kStopTimeout));
  EXPECT_EQ(f.state.phase, Phase::kStopping);
  EXPECT_FALSE(f.state.failed);
  EXPECT_TRUE(f.state.finishing);
  EXPECT_EQ(kinds(f), std::vector<AK>{AK::kStopWorkers});
  // A stop request that does not reach a boundary in time is a failure (exit 75 still).
  State s = in(Phase::kRunning);
  s.stop_signals = 1;
  Transition r = next(alone(), s, ev(EventKind::kStopTimeout));
  EXPECT_EQ(r.state.phase, Phase::kStopping);
  EXPECT_TRUE(r.state.failed);
  // Without a stop there is no deadline.
  EXPECT_FALSE(next(alone(), in(Phase::kRunning), ev(EventKind::kStopTimeout)).accepted);
  EXPECT_FALSE(next(alone(), in(Phase::kStopping), ev(EventKind::kStopTimeout)).accepted);
}

// ---- worker failures and the restart policy ----------------------------------------------------

TEST(Attempt, WorkerFailureInAnyActivePhaseStopsAsAFailure) {
  for (Phase p : {Phase::kStarting, Phase::kRunning, Phase::kFinishing}) {
    Transition t = next(alone(), in(p), ev(EventKind::kWorkerFailed, "rank 1 died"));
    EXPECT_EQ(t.state.phase, Phase::kStopping) << to_string(p);
    EXPECT_TRUE(t.state.failed);
    EXPECT_EQ(t.state.finishing, p == Phase::kFinishing);
    ASSERT_EQ(kinds(t), std::vector<AK>{AK::kStopWorkers});
    EXPECT_EQ(t.actions[0].text, "rank 1 died");
  }
  // While stopping, deaths are expected: nothing new.
  EXPECT_FALSE(next(alone(), in(Phase::kStopping), ev(EventKind::kWorkerFailed)).accepted);
}

TEST(Attempt, WorkerFailureDuringFinishingRestarts) {
  Transition t = next(alone(), in(Phase::kFinishing, 1), ev(EventKind::kWorkerFailed, "died"));
  Transition end = next(alone(), t.state, ev(EventKind::kAllExited));
  EXPECT_EQ(end.state.phase, Phase::kRestarting);
  EXPECT_EQ(end.state.attempt, 2);
}

TEST(Attempt, RestartPolicyBacksOffExponentiallyThenGivesUp) {
  const Config c = alone(1, 3);
  State s = in(Phase::kStopping, 1);
  s.failed = true;
  std::vector<double> delays;
  for (int i = 0; i < 3; ++i) {
    Transition t = next(c, s, ev(EventKind::kAllExited));
    ASSERT_EQ(t.state.phase, Phase::kRestarting);
    EXPECT_EQ(t.state.restarts, i + 1);
    EXPECT_EQ(t.state.attempt, i + 2);
    EXPECT_EQ(notes(t), std::vector<Note>{Note::kRestarting});
    const Action& r = only(t, AK::kScheduleRestart);
    EXPECT_FALSE(r.resume);  // alone: every restart resumes from the newest checkpoint anyway
    delays.push_back(r.seconds);
    Transition st = next(c, t.state, ev(EventKind::kRestartDue));
    ASSERT_EQ(st.state.phase, Phase::kStarting);
    s = st.state;
    s.phase = Phase::kStopping;
    s.failed = true;
  }
  EXPECT_EQ(delays, (std::vector<double>{1, 2, 3}));  // 1, 2, min(4, backoff_max 3)
  Transition last = next(c, s, ev(EventKind::kAllExited));
  EXPECT_EQ(last.state.phase, Phase::kExiting);
  EXPECT_EQ(last.state.exit_code, 1);
  EXPECT_EQ(notes(last), std::vector<Note>{Note::kRestartsExhausted});
}

TEST(Attempt, CompletedAndStoppedEnds) {
  Transition done = next(alone(), in(Phase::kFinishing), ev(EventKind::kAllExited));
  EXPECT_EQ(done.state.exit_code, 0);
  EXPECT_EQ(notes(done), std::vector<Note>{Note::kCompleted});
  State s = in(Phase::kFinishing);
  s.stop_signals = 1;
  Transition stopped = next(alone(), s, ev(EventKind::kAllExited));
  EXPECT_EQ(stopped.state.exit_code, 75);
  EXPECT_EQ(notes(stopped), std::vector<Note>{Note::kStoppedResumable});
  // Every later event is refused.
  for (EventKind k : {EventKind::kAllExited, EventKind::kStopSignal, EventKind::kFatal})
    EXPECT_FALSE(next(alone(), stopped.state, ev(k)).accepted);
}

TEST(Attempt, FailedFinalCheckpointFailsTheRun) {
  Event e = ev(EventKind::kAllExited);
  e.final_checkpoint_error = "the final checkpoint (step 3) failed";
  Transition t = next(alone(), in(Phase::kFinishing), e);
  EXPECT_EQ(t.state.exit_code, 1);
  EXPECT_EQ(notes(t), std::vector<Note>{Note::kFinalCheckpointFailed});
  EXPECT_EQ(t.actions[0].text, e.final_checkpoint_error);
  // After a worker failure the attempt restarts instead (that checkpoint is not the last).
  State f = in(Phase::kStopping);
  f.failed = true;
  EXPECT_EQ(next(alone(), f, e).state.phase, Phase::kRestarting);
}

TEST(Attempt, AllExitedIsRefusedBetweenAttempts) {
  for (Phase p : {Phase::kIdle, Phase::kRestarting, Phase::kAwaitingCoord})
    EXPECT_FALSE(next(alone(), in(p), ev(EventKind::kAllExited)).accepted) << to_string(p);
}

TEST(Attempt, FatalExitsFromEveryPhase) {
  for (Phase p : kAllPhases) {
    Transition t = next(coordinated(), in(p), ev(EventKind::kFatal));
    if (p == Phase::kExiting) {
      EXPECT_FALSE(t.accepted);
      continue;
    }
    EXPECT_EQ(t.state.phase, Phase::kExiting) << to_string(p);
    EXPECT_EQ(t.state.exit_code, 1);
    EXPECT_EQ(kinds(t), std::vector<AK>{AK::kExit});
  }
}

// ---- ring-coord --------------------------------------------------------------------------------

TEST(Attempt, FailureWithCoordinatorWaitsForItsDecision) {
  State s = in(Phase::kStopping);
  s.failed = true;
  Transition t = next(coordinated(), s, ev(EventKind::kAllExited));
  EXPECT_EQ(t.state.phase, Phase::kAwaitingCoord);
  EXPECT_EQ(t.state.await, Await::kAfterFailure);
  EXPECT_EQ(only(t, AK::kAwaitCoord).seconds, 15);
  // Silent: ringd's own policy, resuming from the newest complete checkpoint.
  Transition silent = next(coordinated(), t.state, ev(EventKind::kAwaitTimeout));
  EXPECT_EQ(silent.state.phase, Phase::kRestarting);
  EXPECT_EQ(silent.state.await, Await::kNone);
  EXPECT_EQ(notes(silent), (std::vector<Note>{Note::kCoordSilent, Note::kRestarting}));
  const Action& r = only(silent, AK::kScheduleRestart);
  EXPECT_TRUE(r.resume);
  EXPECT_EQ(r.step, std::numeric_limits<int64_t>::max());
}

TEST(Attempt, CoordStopWhileLiveThenStateDecides) {
  for (Phase p : kLive) {
    Transition t = next(coordinated(), in(p), ev(EventKind::kCoordStop, "cancelled by user"));
    EXPECT_EQ(t.state.phase, Phase::kStopping) << to_string(p);
    EXPECT_TRUE(t.state.coord_stop);
    EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kAck, AK::kStopWorkers}));
    EXPECT_TRUE(t.actions[0].ok);
    EXPECT_EQ(t.actions[1].text, "ring-coord: cancelled by user");
    Transition end = next(coordinated(), t.state, ev(EventKind::kAllExited));
    EXPECT_EQ(end.state.phase, Phase::kAwaitingCoord);
    EXPECT_EQ(end.state.await, Await::kState);
    EXPECT_EQ(notes(end), std::vector<Note>{Note::kStoppedByCoord});
    EXPECT_EQ(end.actions[0].text, "cancelled by user");
    EXPECT_EQ(only(end, AK::kAwaitCoord).seconds, 10);
  }
}

TEST(Attempt, CoordStateAnswers) {
  State s = in(Phase::kAwaitingCoord);
  s.await = Await::kState;
  const std::vector<std::pair<std::string, int>> exits = {
      {"cancelled", 3}, {"cancelling", 3}, {"failed", 1}, {"completed", 0}, {"completing", 0}};
  for (const auto& [state, code] : exits) {
    Transition t = next(coordinated(), s, ev(EventKind::kCoordState, state));
    EXPECT_EQ(t.state.phase, Phase::kExiting) << state;
    EXPECT_EQ(t.state.exit_code, code) << state;
  }
  Transition r = next(coordinated(), s, ev(EventKind::kCoordState, "restarting"));
  EXPECT_EQ(r.state.phase, Phase::kAwaitingCoord);
  EXPECT_EQ(r.state.await, Await::kRollBack);
  EXPECT_EQ(only(r, AK::kAwaitCoord).seconds, 3 + 60);  // backoff_max + 60
  // Silent after its stop: exit resumable.
  for (Await a : {Await::kState, Await::kRollBack}) {
    State w = s;
    w.await = a;
    Transition t = next(coordinated(), w, ev(EventKind::kAwaitTimeout));
    EXPECT_EQ(t.state.exit_code, 75);
    EXPECT_EQ(notes(t), std::vector<Note>{Note::kCoordNoState});
  }
  // An answer nobody waits for is refused.
  State after = in(Phase::kAwaitingCoord);  // await kAfterFailure
  EXPECT_FALSE(next(coordinated(), after, ev(EventKind::kCoordState, "cancelled")).accepted);
  EXPECT_FALSE(next(coordinated(), in(Phase::kRunning), ev(EventKind::kCoordState, "x")).accepted);
}

TEST(Attempt, CoordStopBetweenAttempts) {
  // During the restart backoff, or while waiting for the coordinator's decision.
  for (Phase p : {Phase::kRestarting, Phase::kAwaitingCoord}) {
    Transition t = next(coordinated(), in(p), ev(EventKind::kCoordStop, "out of restarts"));
    EXPECT_EQ(t.state.phase, Phase::kAwaitingCoord) << to_string(p);
    EXPECT_EQ(t.state.await, Await::kState);
    EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kAck, AK::kSay, AK::kAwaitCoord}));
    EXPECT_EQ(notes(t), std::vector<Note>{Note::kCoordStoppedIdle});
  }
}

TEST(Attempt, RepeatedCoordStopIsAcknowledgedOnly) {
  State s = in(Phase::kStopping);
  s.coord_stop = true;
  Transition t = next(coordinated(), s, ev(EventKind::kCoordStop, "again"));
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kAck});
  EXPECT_EQ(t.state.coord_stop_reason, s.coord_stop_reason);
  // ...except while waiting for the roll_back: a stop then is the coordinator's last word.
  State w = in(Phase::kAwaitingCoord);
  w.coord_stop = true;
  w.await = Await::kRollBack;
  Transition r = next(coordinated(), w, ev(EventKind::kCoordStop, "restarts exhausted"));
  EXPECT_EQ(r.state.await, Await::kState);
  EXPECT_EQ(r.state.coord_stop_reason, "restarts exhausted");
}

TEST(Attempt, CoordStopWhileACheckpointIsRequested) {
  State s = in(Phase::kRunning);
  s.ckpt_requested = true;
  Transition t = next(coordinated(), s, ev(EventKind::kCoordStop, "cancel"));
  EXPECT_EQ(t.state.phase, Phase::kStopping);
  // No step boundary comes: the workers are stopped at once, the request is not carried out.
  Event step = ev(EventKind::kStepDone);
  step.has_checkpointer = true;
  EXPECT_FALSE(next(coordinated(), t.state, step).accepted);
  Transition end = next(coordinated(), t.state, ev(EventKind::kAllExited));
  EXPECT_EQ(end.state.await, Await::kState);
  for (const Action& a : end.actions) EXPECT_NE(a.kind, AK::kCheckpoint);
}

TEST(Attempt, CoordStopDuringAStopSignalExitsResumably) {
  State s = in(Phase::kFinishing);
  s.stop_signals = 1;
  Transition t = next(coordinated(), s, ev(EventKind::kCoordStop, "cancel"));
  Transition end = next(coordinated(), t.state, ev(EventKind::kAllExited));
  EXPECT_EQ(end.state.exit_code, 75);  // the signal's stop wins: resumable
}

TEST(Attempt, RollBackWhileLiveStopsThenStartsTheGivenAttempt) {
  for (Phase p : kLive) {
    Event e = ev(EventKind::kCoordRollBack);
    e.attempt = 5;
    e.step = 40;
    State s = in(p, 2);
    s.await = Await::kNone;
    s.coord_stop = true;
    Transition t = next(coordinated(), s, e);
    EXPECT_EQ(t.state.phase, Phase::kStopping) << to_string(p);
    EXPECT_TRUE(t.state.rollback_pending);
    EXPECT_FALSE(t.state.coord_stop);
    EXPECT_EQ(kinds(t), (std::vector<AK>{AK::kAck, AK::kStopWorkers}));
    EXPECT_EQ(t.actions[1].text, "ring-coord: roll back to attempt 5");
    Transition end = next(coordinated(), t.state, ev(EventKind::kAllExited));
    EXPECT_EQ(end.state.phase, Phase::kRestarting);
    EXPECT_EQ(end.state.attempt, 5);
    EXPECT_FALSE(end.state.rollback_pending);
    EXPECT_EQ(notes(end), std::vector<Note>{Note::kRollBack});
    const Action& r = only(end, AK::kScheduleRestart);
    EXPECT_EQ(r.seconds, 0);
    EXPECT_TRUE(r.resume);
    EXPECT_EQ(r.step, 40);
  }
}

TEST(Attempt, RollBackToTheRunningAttemptIsAcknowledgedOnly) {
  Event e = ev(EventKind::kCoordRollBack);
  e.attempt = 2;
  Transition t = next(coordinated(), in(Phase::kRunning, 2), e);
  EXPECT_EQ(t.state.phase, Phase::kRunning);
  EXPECT_EQ(kinds(t), std::vector<AK>{AK::kAck});
}

TEST(Attempt, RollBackBetweenAttemptsStartsAtOnce) {
  for (Phase p : {Phase::kRestarting, Phase::kAwaitingCoord}) {
    Event e = ev(EventKind::kCoordRollBack);
    e.attempt = 3;
    e.step = 20;
    State s = in(p, 2);
    s.await = p == Phase::kAwaitingCoord ? Await::kRollBack : Await::kNone;
    Transition t = next(coordinated(), s, e);
    EXPECT_EQ(t.state.phase, Phase::kRestarting) << to_string(p);
    EXPECT_EQ(t.state.await, Await::kNone);
    EXPECT_EQ(t.state.attempt, 3);
    EXPECT_EQ(notes(t), std::vector<Note>{Note::kStartFromCoord});
    EXPECT_EQ(only(t, AK::kScheduleRestart).step, 20);
  }
}

TEST(Attempt, RollBackWithAStopSignalExitsInstead) {
  State s = in(Phase::kStopping);
  s.rollback_pending = true;
  s.rollback_attempt = 4;
  s.stop_signals = 1;
  Transition end = next(coordinated(), s, ev(EventKind::kAllExited));
  EXPECT_EQ(end.state.exit_code, 75);
}

TEST(Attempt, CheckpointNowIsAcceptedOnlyWhileTraining) {
  Event e = ev(EventKind::kCoordCheckpointNow);
  e.has_checkpointer = true;
  for (Phase p : {Phase::kStarting, Phase::kRunning, Phase::kStopping}) {
    Transition t = next(coordinated(), in(p), e);
    EXPECT_TRUE(t.state.ckpt_requested) << to_string(p);
    ASSERT_EQ(kinds(t), std::vector<AK>{AK::kAck});
    EXPECT_TRUE(t.actions[0].ok);
  }
  for (Phase p : {Phase::kIdle, Phase::kFinishing, Phase::kRestarting, Phase::kAwaitingCoord}) {
    Transition t = next(coordinated(), in(p), e);
    EXPECT_FALSE(t.state.ckpt_requested) << to_string(p);
    ASSERT_EQ(kinds(t), std::vector<AK>{AK::kAck});
    EXPECT_FALSE(t.actions[0].ok);
    EXPECT_EQ(t.actions[0].text, "no attempt is training on this node now");
  }
  e.has_checkpointer = false;
  Transition off = next(coordinated(), in(Phase::kRunning), e);
  EXPECT_FALSE(off.actions[0].ok);
  EXPECT_EQ(off.actions[0].text, "checkpoints are off for this job (checkpoint.dir is empty)");
}

// ---- refused events --------------------------------------------------------------------------

// Each event with the phases that take it; every other phase must refuse it unchanged.
TEST(Attempt, EveryPhaseRefusesWhatDoesNotApply) {
  struct Case {
    EventKind kind;
    std::vector<Phase> takes;
  };
  const std::vector<Phase> between = {Phase::kIdle, Phase::kRestarting, Phase::kAwaitingCoord};
  std::vector<Phase> not_exiting = kAllPhases;
  not_exiting.pop_back();
  const std::vector<Case> cases = {
      {EventKind::kStart, {Phase::kIdle}},
      {EventKind::kRestartDue, {Phase::kRestarting}},
      {EventKind::kStartFailed, {Phase::kStarting}},
      {EventKind::kBoundary, {Phase::kStarting}},
      {EventKind::kStopInStep, {Phase::kRunning}},
      {EventKind::kStepDone, {Phase::kRunning}},
      {EventKind::kStepFailed, {Phase::kRunning}},
      {EventKind::kWorkerFailed, {Phase::kStarting, Phase::kRunning, Phase::kFinishing}},
      {EventKind::kStopSignal, not_exiting},
      {EventKind::kStopTimeout, {Phase::kFinishing}},  // without a stop request
      {EventKind::kAllExited, kLive},
      {EventKind::kAwaitTimeout, {Phase::kAwaitingCoord}},
      {EventKind::kCoordStop, not_exiting},
      {EventKind::kCoordRollBack, not_exiting},
      {EventKind::kCoordCheckpointNow, not_exiting},
      {EventKind::kCoordState, {}},  // needs await kState
      {EventKind::kFatal, not_exiting},
  };
  for (const Case& c : cases) {
    for (Phase p : kAllPhases) {
      State s = in(p, 2);
      Event e = ev(c.kind);
      e.ready = true;
      e.attempt = 7;
      const Transition t = next(coordinated(), s, e);
      const bool takes = std::find(c.takes.begin(), c.takes.end(), p) != c.takes.end();
      EXPECT_EQ(t.accepted, takes) << to_string(c.kind) << " in " << to_string(p);
      if (!t.accepted) {
        EXPECT_TRUE(t.actions.empty()) << to_string(c.kind) << " in " << to_string(p);
        EXPECT_EQ(t.state.phase, p);
        EXPECT_EQ(t.state.attempt, 2);
        EXPECT_EQ(t.state.stop_signals, 0);
      }
    }
  }
  // Coordinator commands without a coordinator are refused everywhere.
  for (EventKind k : {EventKind::kCoordStop, EventKind::kCoordRollBack,
                      EventKind::kCoordCheckpointNow})
    for (Phase p : kAllPhases) EXPECT_FALSE(next(alone(), in(p), ev(k)).accepted);
}

TEST(Attempt, ExitForJobState) {
  EXPECT_EQ(exit_for_job_state("cancelled"), 3);
  EXPECT_EQ(exit_for_job_state("cancelling"), 3);
  EXPECT_EQ(exit_for_job_state("failed"), 1);
  EXPECT_EQ(exit_for_job_state("completed"), 0);
  EXPECT_EQ(exit_for_job_state("completing"), 0);
  EXPECT_EQ(exit_for_job_state("stopped"), 75);  // resumed by a new run, not this daemon
  for (const char* going_on : {"pending", "starting", "running", "restarting", ""})
    EXPECT_FALSE(exit_for_job_state(going_on).has_value()) << going_on;
}

TEST(Attempt, NamesAreDistinct) {
  std::set<std::string_view> seen;
  for (Phase p : kAllPhases) EXPECT_TRUE(seen.insert(to_string(p)).second);
  EXPECT_EQ(to_string(EventKind::kCoordRollBack), "coord-roll-back");
  EXPECT_EQ(to_string(ActionKind::kStopAtBoundary), "stop-at-boundary");
}

}  // namespace
