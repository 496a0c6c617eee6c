// reap_ended: the killed member of a failing group is reported first, even when its peers (who
// saw it die) are reapable before it is.
#include <sys/syscall.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "common/proc/reap.h"

namespace ring::proc {
namespace {

using namespace std::chrono_literals;

// A child whose main thread has exited (a zombie) while another thread lives on for `linger`
// and then kills the process: what a SIGKILLed multi-threaded process looks like to its parent
// while its threads are still being torn down.
pid_t lingering_zombie(std::chrono::milliseconds linger) {
  const pid_t p = fork();
  if (p == 0) {
    std::thread([linger] {
      std::this_thread::sleep_for(linger);
      raise(SIGKILL);
    }).detach();
    // The main thread alone ends (exit(2), not exit_group; pthread_exit would unwind through
    // gtest's catch-all).
    syscall(SYS_exit, 0);
  }
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!is_zombie(p) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(1ms);
  return p;
}

// A child that exits with `code`; returns once it has exited (not reaped).
pid_t exited(int code) {
  const pid_t p = fork();
  if (p == 0) _exit(code);
  siginfo_t info{};
  waitid(P_PID, static_cast<id_t>(p), &info, WEXITED | WNOWAIT);
  return p;
}

bool signalled(int st) { return WIFSIGNALED(st); }

TEST(ReapEnded, WaitsForAKilledChildWhoseThreadsAreStillExiting) {
  const pid_t victim = lingering_zombie(300ms);
  ASSERT_TRUE(is_zombie(victim));
  EXPECT_EQ(waitpid(victim, nullptr, WNOHANG), 0) << "a zombie with live threads is not reapable";
  const pid_t peer = exited(1);
  const auto ended = reap_ended({victim, peer}, signalled, 5000ms);
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].first, victim);
  EXPECT_TRUE(WIFSIGNALED(ended[0].second) && WTERMSIG(ended[0].second) == SIGKILL);
  EXPECT_EQ(ended[1].first, peer);
  EXPECT_TRUE(WIFEXITED(ended[1].second) && WEXITSTATUS(ended[1].second) == 1);
}

TEST(ReapEnded, NoGraceOrNoFailureMeansNoWait) {
  const pid_t victim = lingering_zombie(300ms);
  const pid_t peer = exited(1);
  auto ended = reap_ended({victim, peer}, signalled, 0ms);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].first, peer);
  // A clean exit is no failure: nothing to explain, so no wait either.
  const pid_t ok = exited(0);
  ended = reap_ended({victim, ok}, signalled, 5000ms);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].first, ok);
  int st = 0;
  ASSERT_EQ(waitpid(victim, &st, 0), victim);
  EXPECT_TRUE(WIFSIGNALED(st));
}

TEST(ReapEnded, SignalledChildrenComeFirst) {
  const pid_t a = exited(1);
  const pid_t b = fork();
  if (b == 0) {
    raise(SIGKILL);
    _exit(0);
  }
  siginfo_t info{};
  waitid(P_PID, static_cast<id_t>(b), &info, WEXITED | WNOWAIT);
  const auto ended = reap_ended({a, b}, signalled, 0ms);
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].first, b);
  EXPECT_EQ(ended[1].first, a);
  EXPECT_FALSE(is_zombie(a));
  EXPECT_FALSE(is_zombie(getpid()));
}

}  // namespace
}  // namespace ring::proc
