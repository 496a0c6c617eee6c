// The rank group (common/proc/rank_group.h): the launchers' whole run (run_group) and the
// pieces ringd drives itself. Ranks are /bin/sh scripts; every wait is on a condition.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/proc/rank_group.h"
#include "tests/common/test_proc.h"

namespace ring::proc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

SpawnOptions sh(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  return o;
}

// Waits up to 30 s for `path` to exist.
bool wait_file(const std::string& path) {
  const auto end = Clock::now() + 30s;
  while (Clock::now() < end) {
    if (std::ifstream(path)) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST(RunGroup, EveryRankExitingCleanlyIsExitZero) {
  std::vector<pid_t> started;
  GroupRun how;
  how.on_started = [&](const std::vector<pid_t>& p) { started = p; };
  bool failed = false;
  how.on_failure = [&](const RankEnd&, int) { failed = true; };
  const GroupResult r = run_group({sh("exit 0"), sh("exit 0"), sh("exit 0")}, how);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(r.start_error.empty());
  EXPECT_FALSE(r.failure);
  EXPECT_FALSE(failed);
  ASSERT_EQ(started.size(), 3u);
  for (pid_t p : started) EXPECT_GT(p, 0);
}

// The first failure is the cause and its status the result; the others are stopped with
// SIGTERM (a sleeping shell dies of it), not left running.
TEST(RunGroup, FirstFailureStopsTheOthersAndGivesItsStatus) {
  ring::test::TempDir t;
  std::vector<RankEnd> failures;
  int left = -1;
  GroupRun how;
  how.on_failure = [&](const RankEnd& e, int running) {
    failures.push_back(e);
    left = running;
  };
  const std::string go = t.path + "/go";
  // Rank 1 fails once ranks 0 and 2 are surely running (they made their files).
  const GroupResult r = run_group(
      {sh("touch " + t.path + "/r0; exec sleep 600"),
       sh("while [ ! -e " + t.path + "/r0 ] || [ ! -e " + t.path + "/r2 ]; do sleep 0.01; done; "
          "exit 3"),
       sh("touch " + t.path + "/r2; exec sleep 600")},
      how);
  EXPECT_EQ(r.exit_code, 3);
  ASSERT_TRUE(r.failure);
  EXPECT_EQ(r.failure->rank, 1);
  ASSERT_EQ(failures.size(), 1u) << "only the first failure is a cause";
  EXPECT_EQ(left, 2);
  EXPECT_EQ(r.signal, 0);
}

// A rank killed by a signal gives 128 + the signal.
TEST(RunGroup, KilledRankGivesOneHundredTwentyEightPlusTheSignal) {
  const GroupResult r = run_group({sh("kill -9 $$")}, GroupRun{});
  ASSERT_TRUE(r.failure);
  EXPECT_TRUE(WIFSIGNALED(r.failure->status));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
}

// A rank that ignores SIGTERM is SIGKILLed once the grace is over.
TEST(RunGroup, ARankIgnoringTheStopIsKilledAfterTheGrace) {
  ring::test::TempDir t;
  GroupRun how;
  how.failure_grace = 300ms;
  int killed = 0;
  how.on_kill = [&](int running) { killed = running; };
  const auto t0 = Clock::now();
  const GroupResult r = run_group(
      {sh("trap '' TERM; touch " + t.path + "/r0; while :; do sleep 0.05; done"),
       sh("while [ ! -e " + t.path + "/r0 ]; do sleep 0.01; done; exit 5")},
      how);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_EQ(killed, 1);
  EXPECT_GE(Clock::now() - t0, 300ms);
}

// A stop signal to the launcher is passed on (SIGHUP as SIGTERM) and is the result.
TEST(RunGroup, StopSignalIsPassedOnAndIsTheResult) {
  ring::test::TempDir t;
  GroupRun how;
  int seen = 0;
  how.on_signal = [&](int sig, int) { seen = sig; };
  std::thread sender;
  how.on_started = [&](const std::vector<pid_t>&) {
    sender = std::thread([&] {
      if (wait_file(t.path + "/r0") && wait_file(t.path + "/r1")) ::kill(::getpid(), SIGHUP);
    });
  };
  const GroupResult r = run_group({sh("touch " + t.path + "/r0; exec sleep 600"),
                                   sh("touch " + t.path + "/r1; exec sleep 600")},
                                  how);
  sender.join();
  EXPECT_EQ(seen, SIGHUP);
  EXPECT_EQ(r.signal, SIGHUP);
  EXPECT_EQ(r.exit_code, 128 + SIGHUP);
  EXPECT_FALSE(r.failure) << "ranks ended by the stop are not failures";
}

// A rank that cannot be started: none runs on, the error names the rank.
TEST(RunGroup, ARankThatCannotStartStopsTheOthers) {
  ring::test::TempDir t;
  SpawnOptions missing;
  missing.argv = {t.path + "/no-such-program"};
  const GroupResult r = run_group({sh("exec sleep 600"), sh("exec sleep 600"), missing}, GroupRun{});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.start_error.find("rank 2: "), std::string::npos) << r.start_error;
  EXPECT_NE(r.start_error.find("no-such-program"), std::string::npos) << r.start_error;
  // Ranks 0 and 1 were killed and reaped: this process has no child left.
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// ringd's use: process groups, its own stop signal, reap on demand, SIGKILL when overdue, and
// nothing left when the group goes.
TEST(RankGroup, StopsEachProcessGroupWithItsSignalThenKills) {
  ring::test::TempDir t;
  RankGroup g({/*process_groups=*/true, SIGUSR2});
  // Rank 0 dies of SIGUSR2; rank 1's shell ignores it but its child sleeps in the same group.
  ASSERT_TRUE(g.start(0, sh("touch " + t.path + "/r0; exec sleep 600")));
  ASSERT_TRUE(g.start(1, sh("trap '' USR2; touch " + t.path + "/r1; while :; do sleep 0.05; done")));
  EXPECT_FALSE(g.start(1, sh("exit 0"))) << "a running rank is not started twice";
  ASSERT_TRUE(wait_file(t.path + "/r0") && wait_file(t.path + "/r1"));
  EXPECT_EQ(g.running_count(), 2);
  EXPECT_EQ(g.stop(200ms), 2);
  std::vector<RankEnd> ended;
  const auto end = Clock::now() + 30s;
  while (g.running_count() > 0 && Clock::now() < end) {
    g.kill_overdue(Clock::now());
    for (const RankEnd& e : g.reap([](int) { return false; }, 0ms)) ended.push_back(e);
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(ended.size(), 2u);
  for (const RankEnd& e : ended) {
    ASSERT_TRUE(WIFSIGNALED(e.status));
    EXPECT_EQ(WTERMSIG(e.status), e.rank == 0 ? SIGUSR2 : SIGKILL) << "rank " << e.rank;
  }
  // A new run of the same slots.
  g.clear();
  EXPECT_EQ(g.size(), 0);
  ASSERT_TRUE(g.start(0, sh("exec sleep 600")));
  const pid_t p = g.pid(0);
  {
    RankGroup moved = std::move(g);
    EXPECT_EQ(g.running_count(), 0);
    EXPECT_EQ(moved.running_count(), 1);
  }
  // The moved-to group killed and reaped it when it went.
  EXPECT_EQ(::waitpid(p, nullptr, WNOHANG), -1);
}

}  // namespace
}  // namespace ring::proc
