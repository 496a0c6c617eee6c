// parallel.shard optimizer end to end: two ringd processes x 2 ring-worker ranks (UCX on
// loopback), the same job once with shard none and once with shard optimizer.
//
//   DenseShardMatchesNone: dense AdamW with clipping (two_nodes.yaml): every step's loss and
//     grad_norm in steps.jsonl have the same bits, and every node's --hash-weights line (the
//     FULL weights the workers get) is the same in both runs. With two nodes the owner's reduce
//     (a + b) and the ring all-reduce (b + a) agree bit for bit.
//   DenseWithoutClippingShardMatchesNone: the same with grad_clip 0, where each owner sends a
//     bucket's new weights as soon as it updated it, during the backward.
//   TopkLazyShardMatchesNone: the same with top-k (error feedback) and the lazy update, a dense
//     warm-up step first, grad_clip 0, top-k at the owner (the default: each range's owner
//     selects from the reduced gradient); TopkLazyAtTheSenderShardMatchesNone: the same with
//     optimizer.compress_at sender (each node selects from its own gradient).
//   ResumeMatchesShardNone: top-k lazy, a checkpoint at step 3 of a 3-step run, then --resume
//     to step 6 (each node loads its range's master and moments and its residual, then gathers
//     the full weights): every step and weight hash as with shard none.
//   All: each ringd logs that it holds master and moments of its own range only, and the
//     sharded steps record the bytes of the weight all-gather.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"
#include "tests/ringd/ringd_test_util.h"

namespace {

using json = nlohmann::json;
using namespace ring::test;

const std::string kSpec2x2 = std::string(RING_SOURCE_DIR) + "/tests/ringd/two_nodes.yaml";
const std::string kSpec2x2Ckpt = std::string(RING_SOURCE_DIR) + "/tests/ringd/two_nodes_ckpt.yaml";

struct Proc : ring::test::Proc {
  Proc(std::vector<std::string> args, const std::string& out, const std::string& err)
      : ring::test::Proc(std::move(args), out, err, ring::test::ucx_loopback()) {}
};

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// two_nodes.yaml with parallel.shard `shard` and, with `topk`, top-k lazy compression; `clip`
// false: grad_clip 0; `ckpt`: two_nodes_ckpt.yaml with a checkpoint every 3 steps instead.
std::string write_spec(const std::string& dir, const std::string& shard, bool topk, bool clip,
                       bool ckpt = false, bool sender = false) {
  std::string y = slurp(ckpt ? kSpec2x2Ckpt : kSpec2x2);
  if (ckpt) y = replaced(y, "  every_steps: 100000\n", "  every_steps: 3\n");
  if (!clip) y = replaced(y, "  grad_clip: 1.0\n", "  grad_clip: 0.0\n");
  y = replaced(y, "  ring_order: natural\n", "  ring_order: natural\n  shard: " + shard + "\n");
  if (topk) {
    y = replaced(y, "  offload: cpu\n",
                 "  offload: cpu\n  compression: topk\n  density: 0.05\n  warmup_steps: 1\n"
                 "  error_feedback: true\n  update: lazy\n" +
                     std::string(sender ? "  compress_at: sender\n" : ""));
  }
  const std::string path = dir + "/spec-" + shard + (topk ? "-topk" : "") +
                           (sender ? "-sender" : "") +
                           (clip ? "" : "-noclip") + (ckpt ? "-ckpt" : "") + ".yaml";
  std::ofstream(path) << y;
  return path;
}

struct Result {
  std::vector<json> steps;                       // node 0's steps.jsonl
  std::vector<std::map<int, std::string>> hash;  // per node: step -> weights hash
  std::vector<std::string> logs;
};

// Two ringd processes of job `name` (its job dir root/name) for `steps` steps; `resume`: from
// the job's newest checkpoint. `tag` keeps each run's output files apart.
Result run_two(const std::string& root, const std::string& spec, const std::string& name,
               int steps = 6, bool resume = false, const std::string& tag = "") {
  const std::string job = root + "/" + name;
  std::vector<std::string> common = {
      "--nodes",        "2",       "--rendezvous",       root + "/rdv-" + name + tag,
      "--hash-weights", "--steps", std::to_string(steps)};
  if (resume) common.push_back("--resume");
  auto args = [&](int node) {
    std::vector<std::string> e = common;
    e.push_back("--node-rank");
    e.push_back(std::to_string(node));
    return ringd_args(spec, job, e);
  };
  const std::string out = root + "/" + name + tag;
  Proc d0(args(0), out + "-d0.out", out + "-d0.err");
  Proc d1(args(1), out + "-d1.out", out + "-d1.err");
  Result r;
  EXPECT_EQ(d0.wait(180), 0) << slurp(job + "/logs/ringd-0.log");
  EXPECT_EQ(d1.wait(180), 0) << slurp(job + "/logs/ringd-1.log");
  r.steps = json_lines(job + "/steps.jsonl");
  std::regex re("^step ([0-9]+) weights ([0-9a-f]{16})$");
  for (int node = 0; node < 2; ++node) {
    r.logs.push_back(slurp(job + "/logs/ringd-" + std::to_string(node) + ".log"));
    std::map<int, std::string> h;
    std::stringstream ss(r.logs.back());
    for (std::string l; std::getline(ss, l);) {
      std::smatch m;
      if (std::regex_match(l, m, re)) h[std::stoi(m[1])] = m[2];
    }
    r.hash.push_back(h);
  }
  EXPECT_TRUE(wait_for_no_processes(root, 5));
  return r;
}

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// The "optimizer state: 3 x N floats" count a ringd logged.
long long state_floats(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(R"(optimizer state: 3 x ([0-9]+) floats)"))) return -1;
  return std::stoll(m[1]);
}

void expect_shard_matches_none(bool topk, bool clip, bool sender = false) {
  TempDir t("ringd-shard-test");
  const Result none =
      run_two(t.path, write_spec(t.path, "none", topk, clip, false, sender), "none");
  const Result shard =
      run_two(t.path, write_spec(t.path, "optimizer", topk, clip, false, sender), "optimizer");
  ASSERT_EQ(none.steps.size(), 6u);
  ASSERT_EQ(shard.steps.size(), 6u);
  for (size_t s = 0; s < 6; ++s) {
    const json& a = none.steps[s];
    const json& b = shard.steps[s];
    EXPECT_EQ(a["step"], b["step"]);
    EXPECT_TRUE(same_bits(a["loss"].get<double>(), b["loss"].get<double>()))
        << "step " << s + 1 << ": loss " << a["loss"] << " vs " << b["loss"];
    EXPECT_TRUE(same_bits(a["grad_norm"].get<double>(), b["grad_norm"].get<double>()))
        << "step " << s + 1 << ": grad_norm " << a["grad_norm"] << " vs " << b["grad_norm"];
    EXPECT_EQ(a["compressed"], b["compressed"]);
    EXPECT_EQ(a.value("bytes_weights", -1), 0);
    EXPECT_GT(b.value("bytes_weights", 0), 0) << b.dump();
    if (topk) {
      EXPECT_EQ(b["compressed"].get<bool>(), s > 0);
    }
  }
  for (int node = 0; node < 2; ++node) {
    ASSERT_EQ(none.hash[node].size(), 6u) << "node " << node;
    EXPECT_EQ(none.hash[node], shard.hash[node]) << "node " << node;
    EXPECT_EQ(none.hash[node], none.hash[0]);
  }
  EXPECT_NE(shard.hash[0].at(1), shard.hash[0].at(2));  // the weights do change
  // Memory: each sharded node holds a part of what an unsharded one does; together all of it.
  const long long full = state_floats(none.logs[0]);
  const long long s0 = state_floats(shard.logs[0]), s1 = state_floats(shard.logs[1]);
  ASSERT_GT(full, 0) << none.logs[0];
  EXPECT_GT(s0, 0) << shard.logs[0];
  EXPECT_GT(s1, 0) << shard.logs[1];
  EXPECT_LT(s0, full);
  EXPECT_LT(s1, full);
  EXPECT_EQ(s0 + s1, full);  // the ranges cover the layout, no gap, no overlap
}

TEST(RingdShard, DenseShardMatchesNone) {
  expect_shard_matches_none(false, true);
}

TEST(RingdShard, DenseWithoutClippingShardMatchesNone) {
  expect_shard_matches_none(false, false);
}

TEST(RingdShard, TopkLazyShardMatchesNone) {
  expect_shard_matches_none(true, false);
}

TEST(RingdShard, TopkLazyAtTheSenderShardMatchesNone) {
  expect_shard_matches_none(true, false, true);
}

TEST(RingdShard, ResumeMatchesShardNone) {
  TempDir t("ringd-shard-test");
  std::vector<Result> runs;
  for (const char* shard : {"none", "optimizer"}) {
    const std::string spec = write_spec(t.path, shard, true, true, true);
    run_two(t.path, spec, shard, 3, false, "-a");
    runs.push_back(run_two(t.path, spec, shard, 6, true, "-b"));
    ASSERT_NE(runs.back().logs[1].find("resuming from"), std::string::npos) << runs.back().logs[1];
  }
  const Result& none = runs[0];
  const Result& shard = runs[1];
  ASSERT_EQ(none.steps.size(), 6u);  // steps.jsonl holds both runs' steps
  ASSERT_EQ(shard.steps.size(), 6u);
  for (size_t s = 0; s < 6; ++s) {
    EXPECT_TRUE(
        same_bits(none.steps[s]["loss"].get<double>(), shard.steps[s]["loss"].get<double>()))
        << "step " << s + 1;
    EXPECT_TRUE(same_bits(none.steps[s]["grad_norm"].get<double>(),
                          shard.steps[s]["grad_norm"].get<double>()))
        << "step " << s + 1;
  }
  for (int node = 0; node < 2; ++node) {
    ASSERT_EQ(shard.hash[node].size(), 6u) << shard.logs[node];
    EXPECT_EQ(none.hash[node], shard.hash[node]) << "node " << node;
  }
}

}  // namespace
