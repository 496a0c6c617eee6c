// Exact resume on the CPU backend, end to end with real ringd and ring-worker processes
// (issue 6): the hash of ringd's master weights (--hash-weights: weights_xxh in every step line)
// after 30 steps straight must equal the hash after
//   - 30 steps with kill -9 of a worker at step 17: ringd stops the node's workers, rolls back to
//     the step-10 checkpoint by itself and trains on to 30;
//   - a SIGTERM stop (checkpoint, exit 75), the newest checkpoint then damaged, and
//     `ringd --resume`: it says it skips the damaged one, falls back to step 10, trains to 30.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const std::string kSpec = std::string(RING_SOURCE_DIR) + "/tests/checkpoint/resume.yaml";

std::string bin(const char* env, const char* dflt) {
  const char* e = std::getenv(env);  // RINGD_BIN / RING_WORKER: try another build's binaries
  return e ? e : dflt;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<json> json_lines(const std::string& p) {
  std::vector<json> out;
  std::stringstream ss(slurp(p));
  for (std::string l; std::getline(ss, l);) {
    json j = json::parse(l, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = fs::temp_directory_path().string() + "/ckpt-resume-XXXXXX";
    path = mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct Proc {
  pid_t pid = -1;
  Proc(const std::vector<std::string>& argv, const std::string& out, const std::string& err) {
    pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      setenv("UCX_TLS", "self,posix", 1);
      setenv("UCX_NET_DEVICES", "lo", 1);
      int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char*> a;
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      execv(a[0], a.data());
      _exit(127);
    }
  }
  // Exit status (waitpid form), or -1 after `seconds` (then killed).
  int wait(double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return st;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
    return -1;
  }
  ~Proc() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
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

template <class Pred>
json wait_line(const std::string& path, Pred pred, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (const json& j : json_lines(path))
      if (pred(j)) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return json();
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
  static TempDir t;
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
  TempDir t;
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
  ASSERT_TRUE(WIFEXITED(st)) << st;
  ASSERT_EQ(WEXITSTATUS(st), 0) << slurp(t.path + "/job/logs/ringd-0.log");
  json resumed = wait_line(out, [](const json& j) { return j.value("event", "") == "resumed"; }, 1);
  ASSERT_FALSE(resumed.is_null()) << slurp(t.path + "/job/logs/ringd-0.log");
  // The kill landed between steps 17 and 19 (150 ms steps): the step-10 checkpoint is the latest.
  EXPECT_EQ(resumed.value("step", -1), 10) << "killed after step " << at17["step"];
  auto got = hashes(out);
  ASSERT_EQ(got.count(30), 1u);
  EXPECT_EQ(got[30], want[30]) << "master weights differ after 30 steps";
  for (int64_t s = 11; s <= 30; ++s) EXPECT_EQ(got[s], want[s]) << "step " << s;
}

TEST(Resume, ResumeFlagFallsBackPastADamagedLatest) {
  auto& want = straight();
  ASSERT_EQ(want.size(), 30u);
  TempDir t;
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
  EXPECT_EQ(resumed.value("step", -1), 10);
  auto got = hashes(t.path + "/out2");
  ASSERT_EQ(got.count(30), 1u);
  EXPECT_EQ(got[30], want[30]) << "master weights differ after 30 steps";
}
