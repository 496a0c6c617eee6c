// Exact resume on the CPU backend, end to end with real ringd and ring-worker processes
//: the hash of ringd's master weights (--hash-weights: weights_xxh in every step line)
// after 30 steps straight must equal the hash after
//   - 30 steps with kill -9 of a worker at step 17: ringd stops the node's workers, rolls back to
//     the step-10 checkpoint by itself and trains on to 30;
//   - a SIGTERM stop (checkpoint, exit 75), the newest checkpoint then damaged, and
//     `ringd --resume`: it says it skips the damaged one, falls back to step 10, trains to 30.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"

namespace {

using json = nlohmann::json;
using ring::test::json_lines;
using ring::test::slurp;
using ring::test::TempDir;

const std::string kSpec = std::string(RING_SOURCE_DIR) + "/tests/checkpoint/resume.yaml";

std::string bin(const char* env, const char* dflt) {
  const char* e = std::getenv(env);  // RINGD_BIN / RING_WORKER: try another build's binaries
  return e ? e : dflt;
}

// ringd with UCX on loopback; a wait() that runs out of time kills it at once.
struct Proc : ring::test::Proc {
  static ring::test::ProcOptions options() {
    ring::test::ProcOptions o = ring::test::ucx_loopback();
    o.kill_on_timeout = true;
    return o;
  }
  Proc(std::vector<std::string> args, const std::string& out, const std::string& err)
      : ring::test::Proc(std::move(args), out, err, options()) {}
};

std::vector<std::string> ringd_args(const std::string& job, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {bin("RINGD_BIN", RINGD_BIN),
                                "--spec",
                                kSpec,
                                "--job-dir",
                                job,
                                "--json",
                                "--hash-weights",
                                "--worker-threads",
                                "1",
                                "--worker-bin",
                                bin("RING_WORKER", RING_WORKER),
                                "--threads",
                                "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Polls every 2 ms, closer than the default: the kill at step 17 must land before the
// step-20 checkpoint.
template <class Pred>
json wait_line(const std::string& path, Pred pred, double seconds) {
  return ring::test::wait_line(path, pred, seconds, std::chrono::milliseconds(2));
}

// step -> weights hash of the last attempt that reported that step.
std::map<int64_t, std::string> hashes(const std::string& out) {
  std::map<int64_t, std::string> h;
  for (const json& j : json_lines(out))
    if (j.contains("weights_xxh") && j.contains("step")) h[j["step"]] = j["weights_xxh"];
  return h;
}

// The straight run, once for the suite.
std::map<int64_t, std::string>& straight() {
  static std::map<int64_t, std::string> h;
  static TempDir t("ckpt-resume");
  if (h.empty()) {
    Proc d(ringd_args(t.path + "/job"), t.path + "/out", t.path + "/err");
    int st = d.wait(180);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << st << slurp(t.path + "/err") << slurp(t.path + "/job/logs/ringd-0.log");
    h = hashes(t.path + "/out");
  }
  return h;
}

}  // namespace

TEST(Resume, KillAtStep17RollsBackToStep10AndEndsBitIdentical) {
  auto& want = straight();
  ASSERT_EQ(want.size(), 30u);
  TempDir t("ckpt-resume");
  const std::string out = t.path + "/out";
  Proc d(ringd_args(t.path + "/job"), out, t.path + "/err");
  json at17 = wait_line(out, [](const json& j) { return j.value("step", 0) >= 17 && !j.contains("event"); }, 120);
  ASSERT_FALSE(at17.is_null()) << slurp(t.path + "/job/logs/ringd-0.log");
  std::vector<pid_t> workers;
  for (const json& j : json_lines(out))
    if (j.value("event", "") == "worker_started") workers.push_back(j.at("pid").get<pid_t>());
  ASSERT_EQ(workers.size(), 4u);
  ASSERT_EQ(kill(workers[2], SIGKILL), 0);
  int st = d.wait(180);
  // The last step of the first attempt. Read after the run, not at the kill: the victim may
  // already have reported its part of a step that ringd then completes.
  int64_t killed_after = 0;
  for (const json& j : json_lines(out)) {
    if (j.value("event", "") == "resumed") break;
    if (!j.contains("event")) killed_after = std::max(killed_after, j.value("step", int64_t{0}));
  }
  ASSERT_TRUE(WIFEXITED(st)) << st;
  ASSERT_EQ(WEXITSTATUS(st), 0) << slurp(t.path + "/job/logs/ringd-0.log");
  json resumed = wait_line(out, [](const json& j) { return j.value("event", "") == "resumed"; }, 1);
  ASSERT_FALSE(resumed.is_null()) << slurp(t.path + "/job/logs/ringd-0.log");
  // The kill lands between steps 17 and 19 (150 ms steps): the step-10 checkpoint is the latest.
  // A test thread stalled past step 20 (a loaded machine) kills later: then the step-20
  // checkpoint may be complete too.
  if (killed_after < 20)
    EXPECT_EQ(resumed.value("step", -1), 10) << "killed after step " << killed_after;
  else
    EXPECT_TRUE(resumed.value("step", -1) == 10 || resumed.value("step", -1) == 20)
        << "killed after step " << killed_after << ", resumed from " << resumed.dump();
  auto got = hashes(out);
  ASSERT_EQ(got.count(30), 1u);
  EXPECT_EQ(got[30], want[30]) << "master weights differ after 30 steps";
  for (int64_t s = 11; s <= 30; ++s) EXPECT_EQ(got[s], want[s]) << "step " << s;
}

TEST(Resume, ResumeFlagFallsBackPastADamagedLatest) {
  auto& want = straight();
  ASSERT_EQ(want.size(), 30u);
  TempDir t("ckpt-resume");
  const std::string job = t.path + "/job";
  {
    Proc d(ringd_args(job), t.path + "/out1", t.path + "/err1");
    ASSERT_FALSE(wait_line(t.path + "/out1",
                           [](const json& j) { return j.value("step", 0) >= 12 && !j.contains("event"); }, 120)
                     .is_null());
    ASSERT_EQ(kill(d.pid, SIGTERM), 0);
    int st = d.wait(120);
    ASSERT_TRUE(WIFEXITED(st)) << st;
    ASSERT_EQ(WEXITSTATUS(st), 75) << slurp(job + "/logs/ringd-0.log");
  }
  // The stop wrote a checkpoint after step 10's: damage it (one byte of its data).
  std::string latest = slurp(job + "/checkpoints/latest");
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  ASSERT_NE(latest, "step-00000010") << "the stop did not checkpoint";
  ASSERT_GT(latest, "step-00000010");
  // The newest checkpoint before the damaged one (listed now: the resumed run prunes old ones):
  // step 10's, or step 20's when a stalled test thread signalled ringd only after step 20.
  std::string previous;
  for (const auto& e : std::filesystem::directory_iterator(job + "/checkpoints")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name < latest && name > previous) previous = name;
  }
  ASSERT_FALSE(previous.empty()) << "no checkpoint before " << latest;
  {
    std::string p = job + "/checkpoints/" + latest + "/node-00000.bin";
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << p;
    f.seekg(1000);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(1000);
    f.write(&c, 1);
  }
  Proc d(ringd_args(job, {"--resume"}), t.path + "/out2", t.path + "/err2");
  int st = d.wait(180);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  ASSERT_EQ(WEXITSTATUS(st), 0) << slurp(job + "/logs/ringd-0.log");
  const std::string log = slurp(job + "/logs/ringd-0.log");
  EXPECT_NE(log.find("checkpoint skipped: " + latest), std::string::npos) << log;
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  json resumed =
      wait_line(t.path + "/out2", [](const json& j) { return j.value("event", "") == "resumed"; }, 1);
  ASSERT_FALSE(resumed.is_null()) << log;
  EXPECT_EQ(resumed.value("step", -1), std::stoll(previous.substr(5))) << "latest was " << latest;
  EXPECT_TRUE(previous == "step-00000010" || previous == "step-00000020") << previous;
  auto got = hashes(t.path + "/out2");
  ASSERT_EQ(got.count(30), 1u);
  EXPECT_EQ(got[30], want[30]) << "master weights differ after 30 steps";
}
