// The generate mode's lifecycle (daemon/ringd/generate_lifecycle.h) without processes: every
// way a generate job ends on a node (completed, a death, a held error exit that a stop explains
// or that fails after the grace, a signal, ring-coord's stop, a hang, a worker that could not
// start) and the events a phase refuses.
#include "daemon/ringd/generate_lifecycle.h"

#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using namespace ring::ringd::genlife;

constexpr int kExitOk = 0, kExitFailed = 1, kExitCancelled = 3, kExitStopped = 75;

// Wait statuses as waitpid gives them.
int exited(int code) { return (code & 0xff) << 8; }
int killed(int sig) { return sig & 0x7f; }

Config two() {
  Config c;
  c.workers = 2;
  c.stop_grace_s = 2.0;
  return c;
}

Event ev(EventKind k, double now = 0) {
  Event e;
  e.kind = k;
  e.now_s = now;
  return e;
}
Event ended(int rank, int status, double now = 0) {
  Event e = ev(EventKind::kWorkerEnded, now);
  e.rank = rank;
  e.status = status;
  return e;
}

std::vector<ActionKind> kinds(const Transition& t) {
  std::vector<ActionKind> v;
  for (const Action& a : t.actions) v.push_back(a.kind);
  return v;
}

// Feeds events one after another, keeping every transition's actions.
struct Node {
  Config c = two();
  State s;
  std::vector<Action> all;
  Transition feed(const Event& e) {
    Transition t = next(c, s, e);
    if (t.accepted) s = t.state;
    all.insert(all.end(), t.actions.begin(), t.actions.end());
    return t;
  }
  Node() { feed(ev(EventKind::kStarted)); }
};

TEST(GenerateLifecycle, StatusHelpersMatchWaitpid) {
  EXPECT_TRUE(WIFEXITED(exited(3)));
  EXPECT_EQ(WEXITSTATUS(exited(3)), 3);
  EXPECT_TRUE(WIFSIGNALED(killed(SIGKILL)));
  EXPECT_EQ(WTERMSIG(killed(SIGKILL)), SIGKILL);
}

TEST(GenerateLifecycle, EveryWorkerExitingCleanlyCompletes) {
  Node r;
  EXPECT_EQ(r.s.phase, Phase::kRunning);
  EXPECT_EQ(r.s.running, 2);
  EXPECT_EQ(kinds(r.feed(ended(1, exited(0)))), std::vector{ActionKind::kExited});
  const Transition t = r.feed(ended(0, exited(0)));
  ASSERT_EQ(kinds(t), (std::vector{ActionKind::kExited, ActionKind::kExit}));
  EXPECT_EQ(t.actions.back().code, kExitOk);
  EXPECT_EQ(t.actions.back().outcome, Outcome::kCompleted);
  EXPECT_EQ(r.s.phase, Phase::kEnded);
  EXPECT_EQ(r.s.exited_clean, 2);
  // Nothing moves an ended run.
  EXPECT_FALSE(next(r.c, r.s, ev(EventKind::kTick, 100)).accepted);
}

TEST(GenerateLifecycle, ADeathByASignalFailsAtOnceAndStopsTheOthers) {
  Node r;
  const Transition t = r.feed(ended(1, killed(SIGKILL)));
  ASSERT_EQ(kinds(t), (std::vector{ActionKind::kDied, ActionKind::kStopWorkers}));
  EXPECT_EQ(t.actions[0].rank, 1);
  EXPECT_EQ(r.s.phase, Phase::kStopping);
  EXPECT_NE(r.s.failure.find("worker rank 1 was killed by signal 9"), std::string::npos)
      << r.s.failure;
  // The peer's end is part of the stop.
  const Transition u = r.feed(ended(0, exited(1)));
  ASSERT_EQ(kinds(u), (std::vector{ActionKind::kStopped, ActionKind::kExit}));
  EXPECT_EQ(u.actions.back().code, kExitFailed);
  EXPECT_EQ(u.actions.back().outcome, Outcome::kFailed);
}

// An error exit with no stop yet is held: a stop that comes within the grace explains it.
TEST(GenerateLifecycle, AnErrorExitFollowedByAStopIsPartOfTheStop) {
  Node r;
  EXPECT_EQ(kinds(r.feed(ended(0, exited(1), 10.0))), std::vector{ActionKind::kHold});
  ASSERT_TRUE(r.s.held);
  EXPECT_EQ(kinds(r.feed(ev(EventKind::kTick, 11.0))), std::vector<ActionKind>{});
  Event stop = ev(EventKind::kStopSignal, 11.5);
  stop.sig = SIGTERM;
  stop.text = "Terminated";
  EXPECT_EQ(kinds(r.feed(stop)),
            (std::vector{ActionKind::kStopWorkers, ActionKind::kHeldWasStop}));
  EXPECT_TRUE(r.s.failure.empty());
  const Transition t = r.feed(ended(1, killed(SIGUSR2), 12.0));
  ASSERT_EQ(kinds(t), (std::vector{ActionKind::kStopped, ActionKind::kExit}));
  EXPECT_EQ(t.actions.back().code, kExitStopped);
  EXPECT_EQ(t.actions.back().outcome, Outcome::kStoppedBySignal);
}

// ... and without a stop it fails the job once the grace is over, even after every worker ended.
TEST(GenerateLifecycle, AHeldErrorExitFailsAfterTheGrace) {
  Node r;
  r.feed(ended(0, exited(4), 10.0));
  // The peer fails on the lost connection: also an error exit, said, not a second hold.
  EXPECT_EQ(kinds(r.feed(ended(1, exited(1), 10.1))), std::vector{ActionKind::kEndedAlso});
  EXPECT_EQ(r.s.running, 0);
  EXPECT_NE(r.s.phase, Phase::kEnded) << "a held death keeps the run open";
  EXPECT_EQ(kinds(r.feed(ev(EventKind::kTick, 11.9))), std::vector<ActionKind>{});
  const Transition t = r.feed(ev(EventKind::kTick, 12.0));
  ASSERT_EQ(kinds(t),
            (std::vector{ActionKind::kDied, ActionKind::kStopWorkers, ActionKind::kExit}));
  EXPECT_EQ(t.actions[0].rank, 0);
  EXPECT_EQ(t.actions[0].status, exited(4));
  EXPECT_EQ(t.actions.back().code, kExitFailed);
}

// A death by a signal after a held error exit is the cause, not the held one.
TEST(GenerateLifecycle, ASignalDeathReplacesAHeldExit) {
  Node r;
  r.feed(ended(0, exited(1), 10.0));
  const Transition t = r.feed(ended(1, killed(SIGSEGV), 10.2));
  ASSERT_EQ(kinds(t), (std::vector{ActionKind::kDied, ActionKind::kStopWorkers,
                                   ActionKind::kExit}));
  EXPECT_EQ(t.actions[0].rank, 1);
  EXPECT_FALSE(r.s.held);
  EXPECT_EQ(r.s.exit_code, kExitFailed);
}

TEST(GenerateLifecycle, RingCoordsStopCancelsOrFails) {
  for (const auto& [reason, code] :
       std::vector<std::pair<std::string, int>>{{"cancelled by alice", kExitCancelled},
                                                {"job failed: node 2 lost", kExitFailed}}) {
    Node r;
    Event stop = ev(EventKind::kCoordStop);
    stop.text = reason;
    const Transition t = r.feed(stop);
    ASSERT_EQ(kinds(t), std::vector{ActionKind::kStopWorkers});
    EXPECT_EQ(t.actions[0].text, "ring-coord: " + reason);
    // A second stop (a signal meanwhile) changes nothing but is remembered.
    Event sig = ev(EventKind::kStopSignal);
    sig.sig = SIGINT;
    EXPECT_EQ(kinds(r.feed(sig)), std::vector<ActionKind>{});
    r.feed(ended(0, killed(SIGUSR2)));
    const Transition u = r.feed(ended(1, killed(SIGKILL)));
    ASSERT_EQ(kinds(u), (std::vector{ActionKind::kStopped, ActionKind::kExit}));
    EXPECT_EQ(u.actions.back().outcome, Outcome::kStoppedByCoord);
    EXPECT_EQ(u.actions.back().code, code) << reason;
  }
}

TEST(GenerateLifecycle, AHangKillsTheRankAndFails) {
  Node r;
  Event h = ev(EventKind::kHang);
  h.rank = 1;
  h.text = "rank 1 is stopped (SIGSTOP)";
  const Transition t = r.feed(h);
  ASSERT_EQ(kinds(t), (std::vector{ActionKind::kKill, ActionKind::kStopWorkers}));
  EXPECT_EQ(t.actions[0].rank, 1);
  EXPECT_EQ(r.s.failure, "worker rank 1 hung: rank 1 is stopped (SIGSTOP)");
  // Once stopping, a hang is no news.
  EXPECT_FALSE(next(r.c, r.s, h).accepted);
  r.feed(ended(1, killed(SIGKILL)));
  EXPECT_EQ(r.feed(ended(0, killed(SIGUSR2))).actions.back().code, kExitFailed);
}

TEST(GenerateLifecycle, AWorkerThatCannotStartEndsTheRun) {
  Config c = two();
  Event e = ev(EventKind::kSpawnFailed);
  e.text = "worker rank 1 could not be started: exec: No such file";
  const Transition t = next(c, State{}, e);
  ASSERT_EQ(kinds(t), (std::vector{ActionKind::kStopWorkers, ActionKind::kExit}));
  EXPECT_EQ(t.actions.back().outcome, Outcome::kSpawnFailed);
  EXPECT_EQ(t.state.exit_code, kExitFailed);
  EXPECT_EQ(t.state.phase, Phase::kEnded);
}

TEST(GenerateLifecycle, IdleRefusesWhatNeedsWorkersAndAStopEndsIt) {
  const Config c = two();
  EXPECT_FALSE(next(c, State{}, ended(0, exited(0))).accepted);
  EXPECT_FALSE(next(c, State{}, ev(EventKind::kTick)).accepted);
  Event h = ev(EventKind::kHang);
  EXPECT_FALSE(next(c, State{}, h).accepted);
  // A stop before the workers started: nothing to stop, the run ends stopped.
  Event sig = ev(EventKind::kStopSignal);
  sig.sig = SIGTERM;
  const Transition t = next(c, State{}, sig);
  EXPECT_EQ(t.state.phase, Phase::kEnded);
  EXPECT_EQ(t.state.exit_code, kExitStopped);
  // Started twice is refused.
  Node r;
  EXPECT_FALSE(next(r.c, r.s, ev(EventKind::kStarted)).accepted);
}

}  // namespace
