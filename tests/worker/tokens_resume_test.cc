// Exact resume on a token dataset (data.source: tokens), end to end with real ringd and
// ring-worker processes on the CPU backend: ringctl tokenize writes the license texts as
// .bin/.idx with a SentencePiece model trained here; a straight 20-step run (two context ranks,
// a checkpoint every 5 steps) and a run stopped with SIGTERM after step 7 (checkpoint, exit 75)
// then continued with `ringd --resume` end with the same master-weight hash (--hash-weights)
// at every step after the resume point; the loss falls.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
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

struct Proc : ring::test::Proc {
  static ring::test::ProcOptions options() {
    ring::test::ProcOptions o = ring::test::ucx_loopback();
    o.kill_on_timeout = true;
    return o;
  }
  Proc(std::vector<std::string> args, const std::string& out, const std::string& err)
      : ring::test::Proc(std::move(args), out, err, options()) {}
};

// The dataset and the spec, once for the suite.
const std::string& spec_path() {
  static TempDir t("tokens-resume-data");
  static std::string path = [] {
    std::string inputs;
    for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
      if (e.is_regular_file()) inputs.append(inputs.empty() ? "" : ",").append(e.path().string());
    if (std::system(("spm_train --input=" + inputs + " --model_prefix=" + t.path +
                     "/tok --vocab_size=512 --model_type=unigram --minloglevel=2 >/dev/null 2>&1")
                        .c_str()) != 0)
      return std::string();
    if (std::system((std::string(RINGCTL) + " tokenize -q --tokenizer " + t.path +
                     "/tok.model -o " + t.path + "/lic /usr/share/common-licenses")
                        .c_str()) != 0)
      return std::string();
    std::ofstream(t.path + "/spec.yaml") << R"(job:
  name: tokens-resume
model: {layers: 2, d_model: 64, heads: 4, mlp: swiglu, vocab: 512}
data:
  source: tokens
  paths: [)" + t.path + R"(/lic]
  seq_len: 1024
  seed: 1
parallel: {context_ranks: 2, ring_order: natural}
optimizer: {lr: 3.0e-3, lr_warmup_steps: 2, weight_decay: 0.1, offload: cpu}
train: {steps: 20, grad_clip: 1.0, seed: 1, log_every: 1}
checkpoint: {every_steps: 5, keep_last: 3, dir: checkpoints}
resources: {nodes: 1, workers_per_node: 2, backend: cpu, cpus_per_worker: 1}
restart: {max_restarts: 0}
)";
    return t.path + "/spec.yaml";
  }();
  return path;
}

std::vector<std::string> ringd_args(const std::string& job, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {RINGD_BIN, "--spec",       spec_path(),      "--job-dir",
                                job,       "--json",       "--hash-weights", "--worker-threads",
                                "1",       "--worker-bin", RING_WORKER,      "--threads",
                                "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::map<int64_t, json> steps(const std::string& out) {
  std::map<int64_t, json> h;
  for (const json& j : json_lines(out))
    if (j.contains("weights_xxh") && j.contains("step")) h[j["step"]] = j;
  return h;
}

}  // namespace

TEST(TokensResume, StopAndResumeEndsBitIdenticalAndLossFalls) {
  ASSERT_FALSE(spec_path().empty()) << "spm_train or ringctl tokenize failed";
  TempDir t("tokens-resume");
  std::map<int64_t, json> want;
  {
    Proc d(ringd_args(t.path + "/straight"), t.path + "/out0", t.path + "/err0");
    int st = d.wait(300);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << st << slurp(t.path + "/err0") << slurp(t.path + "/straight/logs/ringd-0.log");
    want = steps(t.path + "/out0");
  }
  ASSERT_EQ(want.size(), 20u);
  double first = want[1].value("loss", 0.0), last = want[20].value("loss", 0.0);
  std::printf("loss: step 1 %.4f, step 20 %.4f\n", first, last);
  EXPECT_LT(last, first - 0.5) << "the loss did not fall";
  const std::string job = t.path + "/job";
  {
    Proc d(ringd_args(job), t.path + "/out1", t.path + "/err1");
    ASSERT_FALSE(ring::test::wait_line(
                     t.path + "/out1",
                     [](const json& j) { return j.value("step", 0) >= 7 && !j.contains("event"); },
                     240)
                     .is_null())
        << slurp(job + "/logs/ringd-0.log");
    ASSERT_EQ(kill(d.pid, SIGTERM), 0);
    int st = d.wait(120);
    ASSERT_TRUE(WIFEXITED(st)) << st;
    ASSERT_EQ(WEXITSTATUS(st), 75) << slurp(job + "/logs/ringd-0.log");
  }
  Proc d(ringd_args(job, {"--resume"}), t.path + "/out2", t.path + "/err2");
  int st = d.wait(300);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  ASSERT_EQ(WEXITSTATUS(st), 0) << slurp(job + "/logs/ringd-0.log");
  json resumed = ring::test::wait_line(
      t.path + "/out2", [](const json& j) { return j.value("event", "") == "resumed"; }, 1);
  ASSERT_FALSE(resumed.is_null()) << slurp(job + "/logs/ringd-0.log");
  const int64_t from = resumed.value("step", -1);
  std::printf("resumed from step %lld\n", static_cast<long long>(from));
  EXPECT_GE(from, 7);
  auto got = steps(t.path + "/out2");
  ASSERT_EQ(got.count(20), 1u);
  for (int64_t s = from + 1; s <= 20; ++s) {
    EXPECT_EQ(got[s]["weights_xxh"], want[s]["weights_xxh"]) << "step " << s;
    EXPECT_EQ(got[s]["loss"], want[s]["loss"]) << "step " << s;
  }
}
