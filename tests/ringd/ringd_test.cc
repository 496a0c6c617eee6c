// ringd end to end: real ringd processes, real ring-worker ranks, UCX over shared memory.
//
//   DenseMatchesInWorkerOptimizer: 4 workers, offloaded dense AdamW (grad_clip 1) vs
//     ring-worker --launch-local (in-worker AdamW): every step's loss within 1e-5 (relative).
//   KilledWorkerIsReported: kill -9 of a worker is reported (worker_died, signal 9) within 2 s,
//     the other workers are stopped, ringd exits 1 (max_restarts 0), no process is left.
//   KilledRingdLeavesNoOrphans: kill -9 of ringd itself: its workers die (PR_SET_PDEATHSIG).
//   TwoDaemonsKeepIdenticalWeights: two ringd processes (2 nodes x 2 workers) form one job;
//     the hash of every node's master weights is the same after every step.
//   LogFormatJsonWritesJsonLinesOnStderr: --log-format json: stderr is JSON lines, steps too.
//   SigtermStopsResumably: SIGTERM -> exit 75, workers stopped in order, no process left.
//   SigtermToEveryProcessStopsResumably: SIGTERM to ringd and all its workers at once (what
//     Slurm's proctrack does on preemption or scancel): still exit 75, no worker counted as dead.
//   SlurmStyleStopOfTwoNodesCheckpoints: 2 ringd x 2 workers; each ringd gets SIGTERM twice
//     within milliseconds (slurmstepd, then srun passing on its own) and its workers once: both
//     exit 75, and the one checkpoint (taken on the signal) is committed at the stopped step.
//   RingdOneNodeSignalled.*: only node 0 (or node 1) gets SIGTERM: every node stops after the same
//     step (the stop request travels in the step's loss all_gather), both exit 75.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"
#include "tests/ringd/ringd_test_util.h"

namespace {

using json = nlohmann::json;
using namespace ring::test;  // Clock, TempDir, slurp, json_lines, wait_line, /proc scans

const std::string kSpec4 = std::string(RING_SOURCE_DIR) + "/tests/ringd/tiny4.yaml";
const std::string kSpec2x2 = std::string(RING_SOURCE_DIR) + "/tests/ringd/two_nodes.yaml";
const std::string kSpec2x2Ckpt =
    std::string(RING_SOURCE_DIR) + "/tests/ringd/two_nodes_ckpt.yaml";

// ringd and its workers with UCX on loopback; killed on test failure.
struct Proc : ring::test::Proc {
  Proc(std::vector<std::string> args, const std::string& out, const std::string& err)
      : ring::test::Proc(std::move(args), out, err, ring::test::ucx_loopback()) {}
};

TEST(Ringd, DenseMatchesInWorkerOptimizer) {
  TempDir t("ringd-test");
  const int steps = 8;
  // In-worker AdamW: ring-worker --launch-local, rank 0 logs every step as JSON.
  Proc ref({RING_WORKER, "--spec", kSpec4, "--launch-local", "--steps", std::to_string(steps),
            "--threads", "1", "--log-json", t.path + "/ref.jsonl"},
           t.path + "/ref.out", t.path + "/ref.err");
  ASSERT_EQ(ref.wait(120), 0) << slurp(t.path + "/ref.err");
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", std::to_string(steps)}),
         t.path + "/ringd.out", t.path + "/ringd.err");
  ASSERT_EQ(d.wait(120), 0) << slurp(t.path + "/ringd.err")
                            << slurp(t.path + "/job/logs/ringd-0.log");
  std::map<int64_t, double> want, got;
  for (const json& j : json_lines(t.path + "/ref.jsonl")) want[j["step"]] = j["loss"];
  for (const json& j : json_lines(t.path + "/job/steps.jsonl")) got[j["step"]] = j["loss"];
  ASSERT_EQ(want.size(), static_cast<size_t>(steps));
  ASSERT_EQ(got.size(), static_cast<size_t>(steps));
  for (auto& [s, l] : want) {
    EXPECT_LE(std::fabs(got[s] - l) / l, 1e-5) << "step " << s << ": ringd " << got[s]
                                               << ", in-worker " << l;
  }
  // The contract's step fields.
  json last = json_lines(t.path + "/job/steps.jsonl").back();
  for (const char* k : {"attempt", "comm_s", "optimizer_s", "exposed_optimizer_s",
                        "bytes_exchanged", "tokens_per_s", "grad_norm", "lr"})
    EXPECT_TRUE(last.contains(k)) << k;
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

TEST(Ringd, KilledWorkerIsReported) {
  TempDir t("ringd-test");
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", "100000"}), out, t.path + "/ringd.err");
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 2; }, 60).is_null())
      << slurp(t.path + "/ringd.err");
  std::vector<pid_t> pids = worker_pids(out);
  ASSERT_EQ(pids.size(), 4u);
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(pids[2], SIGKILL), 0);
  json died = wait_line(out, [](const json& j) { return j.value("event", "") == "worker_died"; }, 5);
  const double noticed = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(died.is_null()) << slurp(t.path + "/job/logs/ringd-0.log");
  EXPECT_LT(noticed, 2.0);
  EXPECT_EQ(died.value("rank", -1), 2);
  EXPECT_EQ(died.value("signal", 0), SIGKILL);
  const int st = d.wait(30);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 1);  // max_restarts 0: failed
  EXPECT_NE(slurp(t.path + "/job/logs/ringd-0.log").find("killed by signal 9"), std::string::npos);
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
  for (pid_t p : pids) EXPECT_FALSE(alive(p, t.path)) << "worker " << p << " survived";
}

TEST(Ringd, KilledRingdLeavesNoOrphans) {
  TempDir t("ringd-test");
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", "100000"}), out, t.path + "/ringd.err");
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 2; }, 60).is_null());
  std::vector<pid_t> pids = worker_pids(out);
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_EQ(kill(d.pid, SIGKILL), 0);
  d.wait(10);
  EXPECT_TRUE(wait_for_no_processes(t.path, 5)) << "left: " << processes_mentioning(t.path).size();
  for (pid_t p : pids) EXPECT_FALSE(alive(p, t.path)) << "worker " << p << " survived";
}

TEST(Ringd, RestartResumesFromLatestCheckpoint) {
  TempDir t("ringd-test");
  const std::string out = t.path + "/ringd.out";
  const std::string spec = std::string(RING_SOURCE_DIR) + "/tests/ringd/restart.yaml";
  Proc d(ringd_args(spec, t.path + "/job", {"--steps", "30"}), out, t.path + "/ringd.err");
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 5; }, 60).is_null());
  std::vector<pid_t> pids = worker_pids(out);
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0) << slurp(t.path + "/job/logs/ringd-0.log");
  json resumed = wait_line(out, [](const json& j) { return j.value("event", "") == "resumed"; }, 1);
  ASSERT_FALSE(resumed.is_null()) << slurp(t.path + "/job/logs/ringd-0.log");
  EXPECT_EQ(resumed.value("attempt", -1), 1);
  EXPECT_EQ(resumed.value("step", -1) % 2, 0);
  // Attempt 1 goes on from the checkpoint's step to the end.
  int64_t last = 0;
  for (const json& j : json_lines(t.path + "/job/steps.jsonl"))
    if (j.value("attempt", -1) == 1) last = j["step"];
  EXPECT_EQ(last, 30);
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

// Issue 31.7: a dead worker's last log lines with bytes that are not UTF-8 (a crash dump, a
// binary printed by mistake). ringd used to die of "json type_error.316" building the
// worker_died event and skipped the restart policy; now the bytes become U+FFFD and the restart
// goes on.
TEST(Ringd, NonUtf8WorkerOutputDoesNotStopTheRestart) {
  TempDir t("ringd-test");
  const std::string out = t.path + "/ringd.out";
  const std::string spec = std::string(RING_SOURCE_DIR) + "/tests/ringd/restart.yaml";
  Proc d(ringd_args(spec, t.path + "/job", {"--steps", "12"}), out, t.path + "/ringd.err");
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 3; }, 60).is_null());
  std::vector<pid_t> pids = worker_pids(out);
  ASSERT_EQ(pids.size(), 4u);
  {
    std::FILE* f = std::fopen((t.path + "/job/logs/worker-1.log").c_str(), "ab");
    ASSERT_NE(f, nullptr);
    std::fputs("\nfatal: \xff\xfe\xc3 junk \xed\xa0\x80 end\n", f);
    std::fclose(f);
  }
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st << slurp(t.path + "/ringd.err");
  EXPECT_EQ(WEXITSTATUS(st), 0) << slurp(t.path + "/job/logs/ringd-0.log");
  json died = wait_line(out, [](const json& j) { return j.value("event", "") == "worker_died"; }, 1);
  ASSERT_FALSE(died.is_null()) << slurp(t.path + "/ringd.err");
  bool replaced = false;
  for (const json& l : died.value("last_lines", json::array()))
    if (l.get<std::string>().find("fatal: \xef\xbf\xbd\xef\xbf\xbd") != std::string::npos)
      replaced = true;
  EXPECT_TRUE(replaced) << died.dump();
  EXPECT_FALSE(wait_line(out, [](const json& j) { return j.value("event", "") == "resumed"; }, 1)
                   .is_null());
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

// --log-format json (without --json): every stderr line is a JSON object (common/log), the log
// lines and one per step; the log file and steps.jsonl keep their content.
TEST(Ringd, LogFormatJsonWritesJsonLinesOnStderr) {
  TempDir t("ringd-test");
  Proc d({RINGD_BIN, "--spec", kSpec4, "--job-dir", t.path + "/job", "--steps", "2",
          "--worker-threads", "1", "--worker-bin", RING_WORKER, "--threads", "1", "--log-format",
          "json"},
         t.path + "/ringd.out", t.path + "/ringd.err");
  ASSERT_EQ(d.wait(120), 0) << slurp(t.path + "/ringd.err");
  std::istringstream err(slurp(t.path + "/ringd.err"));
  int lines = 0, steps = 0;
  for (std::string line; std::getline(err, line);) {
    const json j = json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not JSON: " << line;
    EXPECT_EQ(j.value("program", ""), "ringd") << line;
    if (j.value("msg", "") == "step") {
      EXPECT_EQ(j.at("step").get<int64_t>(), ++steps) << line;
      EXPECT_TRUE(j.contains("loss")) << line;
    }
    ++lines;
  }
  EXPECT_EQ(steps, 2);
  EXPECT_GT(lines, steps);
  EXPECT_EQ(json_lines(t.path + "/job/steps.jsonl").size(), 2u);
  // The log file keeps ringd's own lines.
  EXPECT_NE(slurp(t.path + "/job/logs/ringd-0.log").find(" ringd[0] completed 2 steps"),
            std::string::npos);
}

TEST(Ringd, SigtermStopsResumably) {
  TempDir t("ringd-test");
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", "100000"}), out, t.path + "/ringd.err");
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 2; }, 60).is_null());
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  const int st = d.wait(30);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 75);
  EXPECT_FALSE(
      wait_line(out, [](const json& j) { return j.value("event", "") == "stopped"; }, 1).is_null());
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

TEST(Ringd, SigtermToEveryProcessStopsResumably) {
  TempDir t("ringd-test");
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", "100000"}), out, t.path + "/ringd.err");
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 2; }, 60).is_null());
  const std::vector<pid_t> pids = worker_pids(out);
  ASSERT_EQ(pids.size(), 4u);
  for (pid_t p : pids) ASSERT_EQ(kill(p, SIGTERM), 0);
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  const int st = d.wait(30);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 75) << slurp(t.path + "/job/logs/ringd-0.log");
  EXPECT_TRUE(
      wait_line(out, [](const json& j) { return j.value("event", "") == "worker_died"; }, 1)
          .is_null())
      << slurp(t.path + "/job/logs/ringd-0.log");
  EXPECT_FALSE(
      wait_line(out, [](const json& j) { return j.value("event", "") == "stopped"; }, 1).is_null());
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

// Node `node` of the 2 x 2 job with checkpoints that the stop tests signal (runs until stopped).
std::vector<std::string> stop_test_node(const TempDir& t, const std::string& job, int node) {
  return ringd_args(kSpec2x2Ckpt, job,
                    {"--nodes", "2", "--node-rank", std::to_string(node), "--rendezvous",
                     t.path + "/rdv", "--steps", "100000"});
}

TEST(Ringd, SlurmStyleStopOfTwoNodesCheckpoints) {
  TempDir t("ringd-test");
  const std::string job = t.path + "/job";
  auto args = [&](int node) { return stop_test_node(t, job, node); };
  const std::string out0 = t.path + "/d0.out", out1 = t.path + "/d1.out";
  Proc d0(args(0), out0, t.path + "/d0.err");
  Proc d1(args(1), out1, t.path + "/d1.err");
  ASSERT_FALSE(wait_line(out0, [](const json& j) { return j.value("step", 0) >= 2; }, 60).is_null())
      << slurp(job + "/logs/ringd-0.log");
  // Two signals sent back to back would merge while pending: leave ringd time to take the first.
  for (Proc* d : {&d0, &d1}) ASSERT_EQ(kill(d->pid, SIGTERM), 0);
  for (const std::string& out : {out0, out1})
    for (pid_t p : worker_pids(out)) kill(p, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (Proc* d : {&d0, &d1}) kill(d->pid, SIGTERM);
  const int st0 = d0.wait(60), st1 = d1.wait(60);
  ASSERT_TRUE(WIFEXITED(st0) && WIFEXITED(st1)) << st0 << " " << st1;
  EXPECT_EQ(WEXITSTATUS(st0), 75) << slurp(job + "/logs/ringd-0.log");
  EXPECT_EQ(WEXITSTATUS(st1), 75) << slurp(job + "/logs/ringd-1.log");
  const json stopped =
      wait_line(out0, [](const json& j) { return j.value("event", "") == "stopped"; }, 1);
  ASSERT_FALSE(stopped.is_null()) << slurp(job + "/logs/ringd-0.log");
  const int64_t step = stopped.value("step", int64_t{-1});
  ASSERT_GT(step, 0);
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  EXPECT_EQ(slurp(job + "/checkpoints/latest"), std::string(name) + "\n")
      << slurp(job + "/logs/ringd-0.log") << slurp(job + "/logs/ringd-1.log");
  EXPECT_NE(slurp(job + "/logs/ringd-1.log").find("committed by node 0"), std::string::npos);
  EXPECT_EQ(slurp(job + "/logs/ringd-0.log").find("stopping the workers now"), std::string::npos);
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

// A stop signal that reaches only one node (or the nodes in different steps): every node stops
// after the same step, node 0 commits that step's checkpoint, and both exit 75. Before the
// agreement the signalled node stopped alone and the other's workers failed in the next step's
// collectives.
class RingdOneNodeSignalled : public ::testing::TestWithParam<int> {};

TEST_P(RingdOneNodeSignalled, EveryNodeStopsAfterTheSameStep) {
  const int signalled = GetParam();
  TempDir t("ringd-test");
  const std::string job = t.path + "/job";
  auto args = [&](int node) { return stop_test_node(t, job, node); };
  const std::string out[2] = {t.path + "/d0.out", t.path + "/d1.out"};
  Proc d0(args(0), out[0], t.path + "/d0.err");
  Proc d1(args(1), out[1], t.path + "/d1.err");
  ASSERT_FALSE(
      wait_line(out[0], [](const json& j) { return j.value("step", 0) >= 3; }, 60).is_null())
      << slurp(job + "/logs/ringd-0.log");
  ASSERT_EQ(kill((signalled == 0 ? d0 : d1).pid, SIGTERM), 0);
  const int st0 = d0.wait(60), st1 = d1.wait(60);
  const std::string log0 = slurp(job + "/logs/ringd-0.log"), log1 = slurp(job + "/logs/ringd-1.log");
  ASSERT_TRUE(WIFEXITED(st0) && WIFEXITED(st1)) << st0 << " " << st1 << log0 << log1;
  EXPECT_EQ(WEXITSTATUS(st0), 75) << log0;
  EXPECT_EQ(WEXITSTATUS(st1), 75) << log1;
  // (only node 0 writes JSON lines to stdout; each node logs its stop)
  int64_t step[2];
  const std::regex stopped_at("stopped at step ([0-9]+) on request");
  for (int n = 0; n < 2; ++n) {
    std::smatch m;
    const std::string& log = n ? log1 : log0;
    ASSERT_TRUE(std::regex_search(log, m, stopped_at)) << log;
    step[n] = std::stoll(m[1].str());
  }
  EXPECT_EQ(step[0], step[1]) << log0 << log1;
  ASSERT_GT(step[0], 0);
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step[0]));
  EXPECT_EQ(slurp(job + "/checkpoints/latest"), std::string(name) + "\n") << log0 << log1;
  EXPECT_NE((signalled == 0 ? log1 : log0).find("another node was asked to stop"),
            std::string::npos)
      << log0 << log1;
  EXPECT_EQ((log0 + log1).find("died"), std::string::npos) << log0 << log1;
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

INSTANTIATE_TEST_SUITE_P(Node, RingdOneNodeSignalled, ::testing::Values(0, 1));

TEST(Ringd, TwoDaemonsKeepIdenticalWeights) {
  TempDir t("ringd-test");
  const std::string job = t.path + "/job";
  const std::vector<std::string> common = {"--nodes", "2", "--rendezvous", t.path + "/rdv",
                                           "--hash-weights", "--steps", "6"};
  auto args = [&](int node) {
    std::vector<std::string> e = common;
    e.push_back("--node-rank");
    e.push_back(std::to_string(node));
    return ringd_args(kSpec2x2, job, e);
  };
  Proc d0(args(0), t.path + "/d0.out", t.path + "/d0.err");
  Proc d1(args(1), t.path + "/d1.out", t.path + "/d1.err");
  EXPECT_EQ(d0.wait(120), 0) << slurp(job + "/logs/ringd-0.log");
  EXPECT_EQ(d1.wait(120), 0) << slurp(job + "/logs/ringd-1.log");
  auto hashes = [&](int node) {
    std::map<int, std::string> h;
    std::regex re("^step ([0-9]+) weights ([0-9a-f]{16})$");
    std::stringstream ss(slurp(job + "/logs/ringd-" + std::to_string(node) + ".log"));
    for (std::string l; std::getline(ss, l);) {
      std::smatch m;
      if (std::regex_match(l, m, re)) h[std::stoi(m[1])] = m[2];
    }
    return h;
  };
  const auto h0 = hashes(0), h1 = hashes(1);
  ASSERT_EQ(h0.size(), 6u);
  EXPECT_EQ(h0, h1);
  // The weights change every step (a sanity check that the hash sees them).
  EXPECT_NE(h0.at(1), h0.at(2));
  // The job trains: node 0's steps.jsonl has every step with a finite loss.
  auto steps = json_lines(job + "/steps.jsonl");
  ASSERT_EQ(steps.size(), 6u);
  for (const json& j : steps) EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
  EXPECT_TRUE(wait_for_no_processes(t.path, 5));
}

}  // namespace
