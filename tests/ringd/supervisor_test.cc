// ringd's worker supervision (daemon/ringd/supervisor.h) alone, with shell scripts for workers:
// the log (banner, output, O_NOFOLLOW), the environment, SIGTERM ignored, stop with grace
// (SIGUSR2, then SIGKILL), reaping with the killed one first, the startup and heartbeat
// timeouts, a spawn that fails.
#include "daemon/ringd/supervisor.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/test_proc.h"

namespace {

using ring::ringd::Clock;
using ring::ringd::Supervisor;
using ring::ringd::Worker;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Supervisor::Options fast() {
  Supervisor::Options o;
  o.heartbeat_timeout_s = 0.3;
  o.startup_timeout_s = 1;
  o.stop_grace_s = 0.3;
  return o;
}

Supervisor::Launch sh(const std::string& script) {
  Supervisor::Launch l;
  l.argv = {"/bin/sh", "-c", script};
  l.banner = "=== attempt 1 ===\n";
  return l;
}

// A supervisor with `n` slots whose logs are <dir>/w<rank>.log.
Supervisor with_slots(const ring::test::TempDir& t, int n) {
  Supervisor s(fast());
  s.reset(n, 0, [&](int rank) { return t.path + "/w" + std::to_string(rank) + ".log"; });
  return s;
}

// Reaps until every worker has ended (60 s at most); returns the (rank, status) pairs in order.
std::vector<std::pair<int, int>> reap_all(Supervisor& s, bool expected) {
  std::vector<std::pair<int, int>> out;
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (s.any_running() && Clock::now() < end) {
    for (auto& [w, st] : s.reap(expected)) {
      w->running = false;
      out.emplace_back(w->rank, st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return out;
}

TEST(Supervisor, SpawnWritesTheLogAndTheEnvironment) {
  ring::test::TempDir t("supervisor");
  Supervisor s(fast());
  s.reset(2, 4, [&](int rank) { return t.path + "/worker-" + std::to_string(rank) + ".log"; });
  ASSERT_EQ(s.workers().size(), 2u);
  EXPECT_EQ(s.workers()[1].local, 1);
  EXPECT_EQ(s.workers()[1].rank, 5);
  Supervisor::Launch l = sh("echo gpu=$CUDA_VISIBLE_DEVICES; echo err >&2; read x || echo eof");
  l.cuda_visible_devices = "3";
  for (Worker& w : s.workers()) {
    std::string fatal, failed;
    s.spawn(w, l, &fatal, &failed);
    ASSERT_TRUE(fatal.empty() && failed.empty()) << fatal << failed;
    EXPECT_TRUE(w.running);
    EXPECT_GT(w.pid, 0);
    EXPECT_EQ(getpgid(w.pid), w.pid);  // its own process group
  }
  const auto ended = reap_all(s, true);
  ASSERT_EQ(ended.size(), 2u);
  for (const auto& [rank, st] : ended) {
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << ring::ringd::describe_status(st);
    const std::string log = slurp(t.path + "/worker-" + std::to_string(rank) + ".log");
    EXPECT_EQ(log, "=== attempt 1 ===\ngpu=3\nerr\neof\n");  // stdin is /dev/null
    struct stat st_log;
    ASSERT_EQ(::stat((t.path + "/worker-" + std::to_string(rank) + ".log").c_str(), &st_log), 0);
    EXPECT_EQ(st_log.st_mode & 0777, 0600u);
  }
}

TEST(Supervisor, StopSendsSigusr2ThenSigkillAfterTheGrace) {
  ring::test::TempDir t("supervisor");
  Supervisor s = with_slots(t, 2);
  std::string fatal, failed;
  // Rank 0 dies on SIGUSR2 (the default); rank 1 ignores it and also SIGTERM (ringd's workers
  // start with SIGTERM ignored): only SIGKILL ends it.
  s.spawn(s.workers()[0], sh("echo up; exec sleep 60"), &fatal, &failed);
  s.spawn(s.workers()[1], sh("trap '' USR2; echo up; while :; do sleep 0.05; done"), &fatal,
          &failed);
  ASSERT_TRUE(fatal.empty() && failed.empty());
  // Both wrote "up" (the trap is set): wait for it in the logs.
  const auto up_by = Clock::now() + std::chrono::seconds(30);
  while ((slurp(t.path + "/w0.log").find("up") == std::string::npos ||
          slurp(t.path + "/w1.log").find("up") == std::string::npos) &&
         Clock::now() < up_by)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(s.workers()[1].pid, SIGTERM);  // ignored
  EXPECT_EQ(s.stop(), 2);
  std::vector<std::pair<int, int>> ended;
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (s.any_running() && Clock::now() < end) {
    s.kill_overdue(Clock::now());
    for (auto& [w, st] : s.reap(true)) {
      w->running = false;
      ended.emplace_back(w->rank, st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(ended.size(), 2u);
  std::map<int, int> by_rank(ended.begin(), ended.end());
  EXPECT_TRUE(WIFSIGNALED(by_rank[0]) && WTERMSIG(by_rank[0]) == SIGUSR2);
  EXPECT_TRUE(WIFSIGNALED(by_rank[1]) && WTERMSIG(by_rank[1]) == SIGKILL)
      << ring::ringd::describe_status(by_rank[1]);
}

TEST(Supervisor, ReapReportsTheKilledWorkerFirst) {
  ring::test::TempDir t("supervisor");
  Supervisor s = with_slots(t, 2);
  std::string fatal, failed;
  s.spawn(s.workers()[0], sh("exec sleep 60"), &fatal, &failed);
  s.spawn(s.workers()[1], sh("exit 3"), &fatal, &failed);
  // Rank 1 exits on its own; rank 0 is killed. Once both have ended, the killed one comes first.
  s.kill(s.workers()[0]);
  const auto end = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < end) {
    int zombies = 0;
    for (const Worker& w : s.workers()) {
      siginfo_t info{};
      if (waitid(P_PID, w.pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == w.pid)
        ++zombies;
    }
    if (zombies == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto ended = s.reap(false);
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended[0].first->rank, 0);
  EXPECT_EQ(ring::ringd::describe_status(ended[0].second), "was killed by signal 9 (Killed)");
  EXPECT_EQ(ring::ringd::describe_status(ended[1].second), "exited with status 3");
}

TEST(Supervisor, SilentWorkersAreOverdue) {
  ring::test::TempDir t("supervisor");
  Supervisor s = with_slots(t, 1);
  std::string fatal, failed;
  Worker& w = s.workers()[0];
  s.spawn(w, sh("exec sleep 60"), &fatal, &failed);
  const auto t0 = w.spawned;
  EXPECT_FALSE(s.overdue(t0 + std::chrono::milliseconds(900), t0).has_value());
  auto late = s.overdue(t0 + std::chrono::milliseconds(1100), t0);
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->first, &w);
  EXPECT_EQ(late->second, "did not connect within 1 s");
  // Connected: the heartbeat timeout counts from the last message, or from when the event
  // loop came back from a blocking call.
  w.connected = true;
  w.last_seen = t0;
  EXPECT_FALSE(s.overdue(t0 + std::chrono::milliseconds(200), t0).has_value());
  late = s.overdue(t0 + std::chrono::milliseconds(500), t0);
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->second, "sent no heartbeat for 0.5 s (hung)");
  EXPECT_FALSE(s.overdue(t0 + std::chrono::milliseconds(500), t0 + std::chrono::milliseconds(400))
                   .has_value());
  s.kill_all_and_wait();
  EXPECT_FALSE(s.any_running());
}

TEST(Supervisor, UnusableLogIsFatalAndAMissingProgramFails) {
  ring::test::TempDir t("supervisor");
  Supervisor s = with_slots(t, 2);
  ASSERT_EQ(::symlink("/etc/passwd", (t.path + "/w0.log").c_str()), 0);
  std::string fatal, failed;
  s.spawn(s.workers()[0], sh("true"), &fatal, &failed);
  EXPECT_FALSE(s.workers()[0].running);
  EXPECT_EQ(fatal, "worker rank 0: " + t.path + "/w0.log is a symbolic link; refusing to write through it");
  fatal.clear();
  Supervisor::Launch l;
  l.argv = {t.path + "/no-such-worker"};
  s.spawn(s.workers()[1], l, &fatal, &failed);
  EXPECT_TRUE(fatal.empty());
  EXPECT_FALSE(s.workers()[1].running);
  EXPECT_NE(failed.find("no-such-worker"), std::string::npos) << failed;
  EXPECT_NE(slurp(t.path + "/w1.log").find(failed), std::string::npos);  // the operator's copy
}

}  // namespace

namespace {

// A hello is taken only from the running worker ringd spawned for that local rank.
TEST(Supervisor, HelloIsTakenOnlyFromTheSpawnedWorker) {
  std::vector<Worker> ws(2);
  for (int l = 0; l < 2; ++l) {
    ws[l].local = l;
    ws[l].rank = 4 + l;
    ws[l].pid = 1000 + l;
    ws[l].running = true;
  }
  ring::contract::control::Hello h;
  h.local = 1;
  h.rank = 5;
  h.pid = 1001;
  h.n = 77;
  const uid_t me = 500;
  using ring::ringd::hello_refusal;
  EXPECT_EQ(hello_refusal(h, ws, 77, true, 1001, me, me), "");
  EXPECT_EQ(hello_refusal(h, ws, 77, false, -1, 0, me), "no peer credentials");
  EXPECT_EQ(hello_refusal(h, ws, 77, true, 1001, 501, me), "uid 501 is not ringd's");
  EXPECT_EQ(hello_refusal(h, ws, 78, true, 1001, me, me),
            "model of 77 floats, ringd's has 78 (same spec?)");
  EXPECT_EQ(hello_refusal(h, ws, 77, true, 999, me, me),
            "pid 1001 (connected from pid 999) is not the worker ringd spawned");
  ring::contract::control::Hello wrong_rank = h;
  wrong_rank.rank = 4;
  EXPECT_EQ(hello_refusal(wrong_rank, ws, 77, true, 1001, me, me), "rank 4 should be 5");
  ring::contract::control::Hello far = h;
  far.local = 2;
  EXPECT_EQ(hello_refusal(far, ws, 77, true, 1001, me, me),
            "local rank 2 is not a worker of this attempt");
  // Before any attempt there are no workers at all.
  EXPECT_EQ(hello_refusal(h, {}, 77, true, 1001, me, me),
            "local rank 1 is not a worker of this attempt");
  ws[1].connected = true;
  EXPECT_EQ(hello_refusal(h, ws, 77, true, 1001, me, me), "local rank 1 is connected already");
  ws[1].connected = false;
  ws[1].running = false;
  EXPECT_EQ(hello_refusal(h, ws, 77, true, 1001, me, me),
            "local rank 1 is not a worker of this attempt");
}

}  // namespace

namespace {

TEST(Supervisor, WorkerCommandLineNamesItsRankAndTheAttempt) {
  Worker w;
  w.local = 1;
  w.rank = 5;
  ring::ringd::WorkerCommand c{"/bin/ring-worker", "/jobs/a.yaml", 8, "/rdv/attempt-2/workers",
                               "/run/ctl.sock", "ucx", -1};
  const std::vector<std::string> want = {
      "/bin/ring-worker", "--spec", "/jobs/a.yaml", "--rank", "5", "--world", "8",
      "--rendezvous", "/rdv/attempt-2/workers", "--ringd", "/run/ctl.sock", "--local-rank", "1",
      "--transport", "ucx"};
  EXPECT_EQ(ring::ringd::worker_argv(c, w), want);
  c.threads = 3;
  std::vector<std::string> with_threads = want;
  with_threads.push_back("--threads");
  with_threads.push_back("3");
  EXPECT_EQ(ring::ringd::worker_argv(c, w), with_threads);
}

}  // namespace
