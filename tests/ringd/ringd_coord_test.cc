// ringd with a real ring-coord: `ringd --coord EP --job ID` registers, heartbeats,
// reports steps and events, obeys commands. A private ring-coord per test (temp state dir, ipc).
//
//   CompletesWithStepsAndLoss: the job goes pending -> running -> completed; status shows every
//     step and the loss; events hold worker_started, checkpoint_saved, job_completed.
//   CancelStopsRingd: Client::cancel -> ringd stops its workers and exits 3, the job ends
//     cancelled, no process is left.
//   CoordinatorKilledMidRun: kill -9 of ring-coord mid-run (150 steps): ringd keeps training, the link
//     reconnects to the restarted coordinator, the job ends completed with its last step.
//   KilledWorkerRolledBack: kill -9 of a worker: ring-coord applies the restart policy (stop,
//     roll_back to attempt 2 from the latest checkpoint), ringd resumes and the job completes.
//   HungWorkerIsDetected: SIGSTOP of a worker: ringd reports it hung (worker_died, "hung") within
//     its --heartbeat-timeout, with a `hang` event (it missing, the other rank waiting), stops the
//     node, the job fails (max_restarts 0), ringd exits 1.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/client.h"
#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"

namespace {

using json = nlohmann::json;
namespace proto = ring::protocol;
using ring::test::Clock;
using ring::test::json_lines;
using ring::test::processes_mentioning;
using ring::test::slurp;
using ring::test::TempDir;

const std::string kSpec = std::string(RING_SOURCE_DIR) + "/tests/ringd/coord2.yaml";

// UCX on loopback, and never Slurm's node name (a test run inside an allocation).
struct Proc : ring::test::Proc {
  static ring::test::ProcOptions options() {
    ring::test::ProcOptions o = ring::test::ucx_loopback();
    o.unset_env = {"SLURMD_NODENAME"};
    return o;
  }
  Proc(std::vector<std::string> args, const std::string& out, const std::string& err)
      : ring::test::Proc(std::move(args), out, err, options()) {}
};

// A ring-coord and a client on a private ipc endpoint in the test's directory.
struct Coord {
  std::string dir, ep;
  std::unique_ptr<Proc> proc;
  explicit Coord(const std::string& d) : dir(d), ep("ipc://" + d + "/sock/coord.sock") { start(); }
  void start() {
    proc = std::make_unique<Proc>(
        std::vector<std::string>{RING_COORD_BIN, "--state-dir", dir + "/state", "--endpoint", ep,
                                 "--heartbeat-interval", "0.2", "--heartbeat-timeout", "10",
                                 "--sync", "normal"},
        dir + "/coord.out", dir + "/coord.log");
    const auto end = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < end) {
      try {
        client()->status();
        return;
      } catch (const ring::coord::ClientError&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    FAIL() << "ring-coord did not answer: " << slurp(dir + "/coord.log");
  }
  std::unique_ptr<ring::coord::Client> client() {
    ring::coord::ClientOptions o;
    o.endpoint = ep;
    o.timeout = std::chrono::milliseconds(10000);
    return std::make_unique<ring::coord::Client>(o);
  }
  proto::JobInfo status(int64_t job) { return client()->status(job); }
  std::vector<proto::EventRecord> events(int64_t job) { return client()->events(job, 0, 1000); }
};

int64_t submit(Coord& c, const std::string& job_dir, int64_t steps = 0) {
  std::string spec = slurp(kSpec);
  if (steps > 0) {
    const std::string key = "  steps: 12\n";
    spec.replace(spec.find(key), key.size(), "  steps: " + std::to_string(steps) + "\n");
  }
  return c.client()->submit(spec, "", job_dir).job;
}

std::vector<std::string> ringd_args(const Coord& c, int64_t job, const std::string& job_dir,
                                    std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {RINGD_BIN, "--spec", kSpec, "--job-dir", job_dir, "--json",
                                "--worker-threads", "1", "--worker-bin", RING_WORKER,
                                "--threads", "1", "--coord", c.ep, "--job", std::to_string(job),
                                "--stop-grace", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Waits until pred(status) holds; returns the last status seen.
template <class Pred>
proto::JobInfo wait_status(Coord& c, int64_t job, Pred pred, double seconds) {
  proto::JobInfo last;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    try {
      last = c.status(job);
      if (pred(last)) return last;
    } catch (const ring::coord::ClientError&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return last;
}

bool has_event(const std::vector<proto::EventRecord>& ev, const std::string& kind) {
  for (const auto& e : ev)
    if (e.kind == kind) return true;
  return false;
}

std::string diag(const TempDir& t, const std::string& job_dir) {
  return "\n--- ringd.err\n" + slurp(t.path + "/ringd.err") + "\n--- ringd-0.log\n" +
         slurp(job_dir + "/logs/ringd-0.log") + "\n--- coord.log\n" + slurp(t.path + "/coord.log");
}

TEST(RingdCoord, CompletesWithStepsAndLoss) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  const int64_t job = submit(c, jd);
  Proc d(ringd_args(c, job, jd), t.path + "/ringd.out", t.path + "/ringd.err");
  proto::JobInfo run = wait_status(c, job, [](const proto::JobInfo& i) {
    return i.state == "running" || i.state == "completed"; }, 120);
  EXPECT_TRUE(run.state == "running" || run.state == "completed") << run.state << diag(t, jd);
  const int st = d.wait(120);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << diag(t, jd);
  proto::JobInfo i = c.status(job);
  EXPECT_EQ(i.state, "completed") << i.state_reason << diag(t, jd);
  EXPECT_EQ(i.step, 12);
  EXPECT_EQ(i.attempt, 1);
  ASSERT_TRUE(i.loss.has_value());
  EXPECT_GT(*i.loss, 0.5);
  EXPECT_LT(*i.loss, 7.0);
  EXPECT_TRUE(i.tokens_per_s.has_value());
  ASSERT_TRUE(i.last_checkpoint_step.has_value());
  EXPECT_GE(*i.last_checkpoint_step, 8);
  auto ev = c.events(job);
  for (const char* k : {"worker_started", "checkpoint_saved", "job_completed", "worker_exited"})
    EXPECT_TRUE(has_event(ev, k)) << k;
  // Node name: <host>-j<job>-n0.
  ASSERT_FALSE(i.nodes.empty());
  EXPECT_NE(i.nodes[0].find("-j" + std::to_string(job) + "-n0"), std::string::npos) << i.nodes[0];
}

TEST(RingdCoord, CancelStopsRingd) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  const int64_t job = submit(c, jd, 100000);
  Proc d(ringd_args(c, job, jd), t.path + "/ringd.out", t.path + "/ringd.err");
  proto::JobInfo r = wait_status(c, job, [](const proto::JobInfo& i) { return i.step >= 2; }, 120);
  ASSERT_GE(r.step, 2) << r.state << diag(t, jd);
  EXPECT_EQ(r.state, "running");
  c.client()->cancel(job);
  const int st = d.wait(30);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t, jd);
  EXPECT_EQ(WEXITSTATUS(st), 3) << diag(t, jd);
  proto::JobInfo i = wait_status(c, job, [](const proto::JobInfo& x) {
    return x.state == "cancelled"; }, 10);
  EXPECT_EQ(i.state, "cancelled") << i.state_reason << diag(t, jd);
  EXPECT_TRUE(has_event(c.events(job), "job_stopped"));
  EXPECT_TRUE(processes_mentioning(jd).empty());
}

TEST(RingdCoord, CoordinatorKilledMidRun) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  const int64_t steps = 150;
  const int64_t job = submit(c, jd, steps);
  Proc d(ringd_args(c, job, jd, {"--steps", std::to_string(steps)}), t.path + "/ringd.out",
         t.path + "/ringd.err");
  proto::JobInfo r = wait_status(c, job, [](const proto::JobInfo& i) { return i.step >= 3; }, 120);
  ASSERT_GE(r.step, 3) << diag(t, jd);
  c.proc->kill9();
  auto count_steps = [&] {
    std::stringstream ss(slurp(jd + "/steps.jsonl"));
    int n = 0;
    for (std::string l; std::getline(ss, l);) n += !l.empty();
    return n;
  };
  const int before = count_steps();
  // Training goes on without ring-coord: wait (bounded) for a step written while it is down.
  int during = before;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
       during <= before && during < steps && std::chrono::steady_clock::now() < end;
       during = count_steps())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c.start();  // same state dir: the job and the node are still known
  const int st = d.wait(180);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << diag(t, jd);
  ASSERT_LT(before, steps) << "the run ended before ring-coord was killed";
  EXPECT_GT(during, before) << "ringd stopped training without ring-coord";
  proto::JobInfo i = wait_status(c, job, [](const proto::JobInfo& x) {
    return x.state == "completed"; }, 10);
  EXPECT_EQ(i.state, "completed") << i.state_reason << diag(t, jd);
  EXPECT_EQ(i.step, steps);
  EXPECT_EQ(i.attempt, 1);
  EXPECT_TRUE(processes_mentioning(jd).empty());
}

TEST(RingdCoord, KilledWorkerRolledBack) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  std::string spec = slurp(kSpec);
  spec.replace(spec.find("  steps: 12\n"), 12, "  steps: 40\n");
  spec.replace(spec.find("  max_restarts: 0\n"), 18, "  max_restarts: 1\n  backoff_s: 0.2\n");
  const std::string spec_path = t.path + "/spec.yaml";
  std::ofstream(spec_path) << spec;
  const int64_t job = c.client()->submit(spec, "", jd).job;
  std::vector<std::string> args = ringd_args(c, job, jd);
  args[2] = spec_path;
  Proc d(args, t.path + "/ringd.out", t.path + "/ringd.err");
  proto::JobInfo r = wait_status(c, job, [](const proto::JobInfo& i) {
    return i.last_checkpoint_step.value_or(0) >= 4 && i.step >= 6; }, 120);
  ASSERT_GE(r.step, 6) << diag(t, jd);
  pid_t victim = -1;
  for (const json& j : json_lines(t.path + "/ringd.out"))
    if (j.value("event", "") == "worker_started" && j.value("rank", -1) == 0)
      victim = j.at("pid").get<pid_t>();
  ASSERT_GT(victim, 0);
  ::kill(victim, SIGKILL);
  const int st = d.wait(120);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << diag(t, jd);
  proto::JobInfo i = wait_status(c, job, [](const proto::JobInfo& x) {
    return x.state == "completed"; }, 10);
  EXPECT_EQ(i.state, "completed") << i.state_reason << diag(t, jd);
  EXPECT_EQ(i.attempt, 2);
  EXPECT_EQ(i.restarts, 1);
  EXPECT_EQ(i.step, 40);
  auto ev = c.events(job);
  EXPECT_TRUE(has_event(ev, "worker_died"));
  EXPECT_TRUE(has_event(ev, "job_stopped"));
  EXPECT_TRUE(processes_mentioning(jd).empty());
}

// Issue 31.1 end to end: `restart --from 4` mid-run, then a worker of the new branch killed. The
// next attempt resumes the branch's newest checkpoint, never the abandoned branch's (on the old
// ringd and ring-coord: the highest step on disk and in the database, e.g. 16 of attempt 1).
TEST(RingdCoord, RestartFromThenAFailureStaysOnTheBranch) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  std::string spec = slurp(kSpec);
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"  steps: 12\n", "  steps: 100000\n"},
           {"  max_restarts: 0\n", "  max_restarts: 2\n  backoff_s: 0.2\n"},
           {"  every_steps: 4\n", "  every_steps: 4\n  keep_last: 20\n"}})
    spec.replace(spec.find(from), from.size(), to);
  const std::string spec_path = t.path + "/spec.yaml";
  std::ofstream(spec_path) << spec;
  const int64_t job = c.client()->submit(spec, "", jd).job;
  std::vector<std::string> args = ringd_args(c, job, jd);
  args[2] = spec_path;
  const std::string out = t.path + "/ringd.out";
  Proc d(args, out, t.path + "/ringd.err");
  proto::JobInfo r = wait_status(c, job, [](const proto::JobInfo& i) {
    return i.last_checkpoint_step.value_or(0) >= 12; }, 180);
  ASSERT_GE(r.last_checkpoint_step.value_or(0), 12) << diag(t, jd);
  c.client()->restart(job, 4);
  // The branch saves a checkpoint of its own (attempt 2).
  json saved;
  const auto branch_saved = [&] {
    for (const json& j : json_lines(out))
      if (j.value("event", "") == "checkpoint_saved" && j.value("attempt", -1) == 2) return true;
    return false;
  };
  const auto end = Clock::now() + std::chrono::seconds(180);
  while (!branch_saved() && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(branch_saved()) << diag(t, jd);
  pid_t victim = -1;
  for (const json& j : json_lines(out))
    if (j.value("event", "") == "worker_started" && j.value("attempt", -1) == 2 &&
        j.value("rank", -1) == 1)
      victim = j.at("pid").get<pid_t>();
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  json resumed;
  const auto end3 = Clock::now() + std::chrono::seconds(180);
  while (resumed.is_null() && Clock::now() < end3) {
    for (const json& j : json_lines(out))
      if (j.value("event", "") == "resumed" && j.value("attempt", -1) == 3) resumed = j;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(resumed.is_null()) << diag(t, jd);
  // Every step the branch saved before attempt 3 began, and the step it resumed from.
  std::set<int64_t> branch;
  for (const json& j : json_lines(out))
    if (j.value("event", "") == "checkpoint_saved" && j.value("attempt", -1) == 2)
      branch.insert(j.value("step", -1));
  branch.insert(4);
  EXPECT_TRUE(branch.count(resumed.value("step", -1)))
      << "attempt 3 resumed step " << resumed.value("step", -1) << " of the abandoned branch"
      << diag(t, jd);
  EXPECT_EQ(resumed.value("step", -1), *branch.rbegin()) << diag(t, jd);
  // On disk: the resumed checkpoint descends from step 4 of attempt 1's tag.
  const std::string dir = jd + "/checkpoints/" + resumed.value("path", std::string()).substr(
                                                     resumed.value("path", std::string()).rfind('/') + 1);
  const json top = json::parse(slurp(dir + "/checkpoint.json"));
  EXPECT_TRUE(top["parent"].is_object()) << top.dump();
  c.client()->cancel(job);
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t, jd);
}

// Issue 31.3: a second job with the same job directory is refused at once, naming the holder;
// the first one's logs and steps are untouched.
TEST(RingdCoord, ASecondJobInTheSameJobDirIsRefused) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  std::string spec = slurp(kSpec);
  spec.replace(spec.find("  steps: 12\n"), 12, "  steps: 100000\n");
  const std::string spec_path = t.path + "/spec.yaml";
  std::ofstream(spec_path) << spec;
  const int64_t job = c.client()->submit(spec, "", jd).job;
  std::vector<std::string> args = ringd_args(c, job, jd);
  args[2] = spec_path;
  Proc d(args, t.path + "/ringd.out", t.path + "/ringd.err");
  ASSERT_GE(wait_status(c, job, [](const proto::JobInfo& i) { return i.step >= 2; }, 120).step, 2)
      << diag(t, jd);
  const int64_t job2 = c.client()->submit(spec, "", jd).job;
  std::vector<std::string> args2 = ringd_args(c, job2, jd);
  args2[2] = spec_path;
  Proc d2(args2, t.path + "/ringd2.out", t.path + "/ringd2.err");
  const int st2 = d2.wait(60);
  ASSERT_TRUE(WIFEXITED(st2)) << st2;
  EXPECT_EQ(WEXITSTATUS(st2), 1);
  const std::string err = slurp(t.path + "/ringd2.err");
  EXPECT_NE(err.find("job directory " + jd + " is in use by job " + std::to_string(job)), std::string::npos)
      << err;
  EXPECT_NE(err.find("ringd pid " + std::to_string(d.pid)), std::string::npos) << err;
  // Nothing of the second job went into the first one's files.
  for (const json& j : json_lines(jd + "/steps.jsonl")) EXPECT_EQ(j.value("attempt", 1), 1);
  EXPECT_EQ(slurp(jd + "/logs/ringd-0.log").find("job " + std::to_string(job2)), std::string::npos);
  c.client()->cancel(job);
  d.wait(60);
}

TEST(RingdCoord, HungWorkerIsDetected) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  const int64_t job = submit(c, jd, 100000);
  // (5 s: short enough for the test, long enough that a loaded machine does not starve a
  // worker's heartbeat thread into a false "hung" before the SIGSTOP)
  Proc d(ringd_args(c, job, jd, {"--heartbeat-timeout", "5"}), t.path + "/ringd.out",
         t.path + "/ringd.err");
  proto::JobInfo r = wait_status(c, job, [](const proto::JobInfo& i) { return i.step >= 2; }, 120);
  ASSERT_GE(r.step, 2) << diag(t, jd);
  pid_t victim = -1;
  for (const json& j : json_lines(t.path + "/ringd.out"))
    if (j.value("event", "") == "worker_started" && j.value("rank", -1) == 1)
      victim = j.at("pid").get<pid_t>();
  ASSERT_GT(victim, 0);
  const auto t0 = Clock::now();
  ::kill(victim, SIGSTOP);
  const int st = d.wait(60);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t, jd);
  EXPECT_EQ(WEXITSTATUS(st), 1) << diag(t, jd);
  EXPECT_LT(took, 40.0);
  proto::JobInfo i = wait_status(c, job, [](const proto::JobInfo& x) {
    return x.state == "failed"; }, 10);
  EXPECT_EQ(i.state, "failed") << i.state_reason;
  bool hung = false;
  for (const auto& e : c.events(job))
    if (e.kind == "worker_died" && e.data.value("message", "").find("hung") != std::string::npos)
      hung = true;
  EXPECT_TRUE(hung) << "no worker_died event saying the worker hung";
  // Before failing it ringd read the flight recorders: a `hang` event names rank 1 missing and
  // rank 0 waiting (the step deadline is far; the heartbeat timeout passed).
  bool hang = false;
  for (const auto& e : c.events(job))
    if (e.kind == "hang") {
      hang = true;
      EXPECT_EQ(e.data.value("missing", json::array()), json::array({1})) << e.data.dump();
      ASSERT_EQ(e.data.value("waiting", json::array()).size(), 1u) << e.data.dump();
      EXPECT_EQ(e.data["waiting"][0].value("rank", -1), 0) << e.data.dump();
      EXPECT_DOUBLE_EQ(e.data.value("deadline_s", 0.0), 5.0) << e.data.dump();
    }
  EXPECT_TRUE(hang) << "no hang event" << diag(t, jd);
  EXPECT_TRUE(processes_mentioning(jd).empty());
}

// checkpoint.every_steps 0 means "on demand and on SIGTERM" (common/spec/keys.cc): ring-coord's
// checkpoint_now is obeyed (a checkpoint at the next step boundary, reported saved), and no
// periodic checkpoint is written before it.
TEST(RingdCoord, CheckpointNowWithEveryStepsZero) {
  TempDir t("ringd-coord");
  Coord c(t.path);
  const std::string jd = t.path + "/job";
  std::string spec = slurp(kSpec);
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"  every_steps: 4\n", "  every_steps: 0\n"}, {"  steps: 12\n", "  steps: 100000\n"}})
    spec.replace(spec.find(from), from.size(), to);
  const std::string spec_path = t.path + "/spec.yaml";
  std::ofstream(spec_path) << spec;
  const int64_t job = c.client()->submit(spec, "", jd).job;
  std::vector<std::string> args = ringd_args(c, job, jd);
  args[2] = spec_path;  // --spec
  Proc d(args, t.path + "/ringd.out", t.path + "/ringd.err");
  proto::JobInfo r = wait_status(c, job, [](const proto::JobInfo& i) { return i.step >= 3; }, 120);
  ASSERT_GE(r.step, 3) << r.state << diag(t, jd);
  EXPECT_FALSE(r.last_checkpoint_step.has_value());
  c.client()->checkpoint(job);
  proto::JobInfo k = wait_status(c, job, [](const proto::JobInfo& i) {
    return i.last_checkpoint_step.has_value(); }, 60);
  ASSERT_TRUE(k.last_checkpoint_step.has_value()) << diag(t, jd);
  EXPECT_GE(*k.last_checkpoint_step, 3);
  bool acked = false;
  for (const auto& e : c.events(job))
    if (e.kind == "command_ack" && e.data.value("command", "") == "checkpoint_now")
      acked = e.data.value("ok", false);
  EXPECT_TRUE(acked) << "checkpoint_now was not acknowledged ok";
  c.client()->cancel(job);
  const int st = d.wait(30);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t, jd);
  EXPECT_EQ(WEXITSTATUS(st), 3) << diag(t, jd);
}

}  // namespace
