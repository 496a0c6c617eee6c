// Data replicas and micro-batches end to end: real ringd processes (one per node, as the
// two-node tests of ringd_test.cc run them on one machine) spawning real ring-worker ranks over
// UCX on loopback. A layout (D, C, N) is D data replicas of C ring ranks on N nodes
// (workers_per_node = C x D / N); every run trains a tiny model (2 layers, d_model 64, seq_len
// 256, text from /usr/share/common-licenses, one thread per worker) and ends with a final
// checkpoint, from which the master weights are read back.
//
//   Layouts/ReplicaShardModes.*: per layout and compression (none; topk with density 0.05,
//     error feedback, dense update, at the owner - the default - and at the sender on two
//     nodes), parallel.shard none vs optimizer: every step's loss and grad_norm and the final
//     master weights are bit-identical (N <= 2: the owner sums at most two senders, and
//     a + b = b + a), so also within 1e-6 relative.
//   Layouts/ReplicaFullShard.*: the same layouts and compressions (top-k at the owner), shard
//     full vs none: bit-identical (the workers' reduce-scatter sums in shard none's order, and
//     top-k selects at the owner from the same sum in both modes).
//   TopkAtOwner.SameResultOnOneAndTwoNodes: top-k at the owner, (D, C) on one node vs two nodes
//     (shard none and optimizer): (1, 2) bit-identical (the job's gradient is w0 + w1 either
//     way); (2, 2) within 1e-6 ((w0 + w1) + (w2 + w3) on two nodes, ((w0 + w1) + w2) + w3 on
//     one; measured 4.1e-9 loss, 4.0e-8 weights).
//   ReplicaFullShardOptions.MicroBatchesRecomputeUntiedAndLazy: shard full with 2 micro-batches,
//     recompute and an untied head on (2,2,2) within 1e-6 of shard none (measured 2.6e-9 loss,
//     2.3e-7 weights); top-k lazy on (1,2,1) bit-identical.
//   ReplicaLayouts.SameDataSplitDifferentlyFollowsOneCurve: (2,1,1), (2,2,1), (2,2,2) train on
//     the same two sequences per step, split differently: per-step loss within kLayoutTol (1e-5)
//     relative (measured: 4.5e-9 at most over the 20 steps, final weights 3.3e-7).
//   ReplicaMicroBatches.TwoMicroBatchesEqualTwoReplicas: D=1, M=2 vs D=2, M=1 on one node (the
//     same two sequences per step, accumulated in the worker vs summed over ringd's slots):
//     step-1 loss and grad_norm, every step's loss and the final weights within 1e-6 relative.
//   ReplicaHeadRanks.*: parallel.head_ranks 2 (two-level attention) against the single ring:
//     with shard full, 2 replicas, 2 micro-batches and recompute on 2 nodes; with top-k at the
//     owner on 2 nodes (measured 3.1e-9 loss, 3.2e-8 weights); a killed worker resumes
//     bit-identical.
//
// Tolerances (fp32): layouts differ in how attention is split over the ring (partial softmax
// merges, dK/dV sums) and in the order gradients are summed (worker slots, nodes); micro-batches
// accumulate in the worker what replicas sum in ringd's slots (measured: equal loss and
// grad_norm at step 1, final weights after 5 steps 4.3e-8 apart). The whole file runs in about
// 20 s on 2 cores (each run well under 2 s).
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"
#include "tests/ringd/ringd_test_util.h"

namespace {

using json = nlohmann::json;
using namespace ring::test;  // Clock, TempDir, slurp, json_lines, Proc, ...

// Per-step loss difference allowed between layouts that split the same data differently
// (measured: at most 4.5e-9 over 20 steps).
constexpr double kLayoutTol = 1e-5;
constexpr int64_t kSeqLen = 256;
// shard none vs optimizer, and micro-batches vs replicas.
constexpr double kSameMathTol = 1e-6;

struct Overrides {
  std::string shard = "none";        // parallel.shard
  std::string compression = "none";  // optimizer.compression (topk: density 0.05, feedback, at
                                     // the owner; topk_sender: the same at the sender)
  int micro_batches = 1;             // train.micro_batches
  bool recompute = false;            // model.recompute
  bool tie = true;                   // model.tie_embeddings
  std::string dtype = "fp32";        // model.dtype (docs/precision.md)
  std::string update = "dense";      // optimizer.update (lazy: with compression topk)
  int steps = 20;
  int every_steps = 0;   // checkpoint.every_steps (the final checkpoint is always written)
  int head_ranks = 1;    // parallel.head_ranks (two-level context parallelism)
  int kill_at_step = 0;  // > 0: kill -9 node 0's first worker once this step is reported
                         // (restart.max_restarts 1: ringd resumes from its checkpoint)
};

struct RunResult {
  bool ok = false;
  std::string error;                                 // the logs, when !ok
  std::vector<double> loss, grad_norm;               // [steps], node 0's steps.jsonl
  std::vector<int64_t> tokens, valid;                // [steps]: the step's tokens and valid labels
  std::map<std::string, std::vector<float>> master;  // param -> final master weights
  double seconds = 0;
  int last_attempt = 0;   // the attempt of the last step record
  int resumed_step = -1;  // the step a restarted attempt resumed from (ringd's resumed event)
};

std::string spec_yaml(int d, int c, int n, const Overrides& o) {
  std::ostringstream y;
  y << "job: {name: replicas-test}\n"
       "model: {layers: 2, d_model: 64, heads: 4, mlp: swiglu, vocab: 256, recompute: "
    << (o.recompute ? "true" : "false") << ", tie_embeddings: " << (o.tie ? "true" : "false")
    << ", dtype: " << o.dtype << "}\n"
       "data: {source: text, paths: [/usr/share/common-licenses], seq_len: "
    << kSeqLen
    << ", seed: 1}\n"
       "parallel: {context_ranks: "
    << c << ", head_ranks: " << o.head_ranks << ", data_replicas: " << d
    << ", ring_order: natural, shard: " << o.shard
    << "}\n"
       "optimizer: {lr: 1.0e-3, lr_warmup_steps: 2, weight_decay: 0.1, offload: cpu, "
       "update: "
    << o.update << ", compression: " << (o.compression == "none" ? "none" : "topk")
    << (o.compression != "none" ? ", density: 0.05, error_feedback: true" : "")
    << (o.compression == "topk_sender" ? ", compress_at: sender" : "")
    << "}\n"
       "train: {steps: "
    << o.steps << ", grad_clip: 1.0, seed: 1, log_every: 1, micro_batches: " << o.micro_batches
    << "}\n"
       "checkpoint: {every_steps: "
    << o.every_steps
    << ", dir: checkpoints}\n"
       "resources: {nodes: "
    << n << ", workers_per_node: " << c * d / n
    << ", backend: cpu, cpus_per_worker: 1}\n"
       "restart: {max_restarts: "
    << (o.kill_at_step > 0 ? 1 : 0) << "}\n";
  return y.str();
}

// The master weights of the newest checkpoint in `dir`: every node's manifest of the step, its
// tensors named master/<param> (a tensor may be in any node's shard: the first found is taken).
bool read_master(const std::string& dir, std::map<std::string, std::vector<float>>* out,
                 std::string* why) {
  std::string latest = slurp(dir + "/latest");
  while (!latest.empty() && latest.back() == '\n') latest.pop_back();
  if (latest.empty()) {
    *why = dir + "/latest: missing";
    return false;
  }
  const std::string step_dir = dir + "/" + latest;
  std::vector<std::string> manifests;
  for (const auto& e : std::filesystem::directory_iterator(step_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node-", 0) == 0 && e.path().extension() == ".json")
      manifests.push_back(e.path().string());
  }
  std::sort(manifests.begin(), manifests.end());
  if (manifests.empty()) {
    *why = step_dir + ": no node manifest";
    return false;
  }
  for (const std::string& m : manifests) {
    const json j = json::parse(slurp(m), nullptr, false);
    if (!j.is_object() || !j.contains("tensors")) {
      *why = m + ": not a manifest";
      return false;
    }
    std::ifstream bin(step_dir + "/" + j.at("data_file").get<std::string>(), std::ios::binary);
    for (const json& t : j.at("tensors")) {
      const std::string name = t.at("name");
      if (name.rfind("master/", 0) != 0 || out->count(name.substr(7))) continue;
      if (t.at("dtype") != "f32") {
        *why = m + ": " + name + " is not f32";
        return false;
      }
      const int64_t bytes = t.at("bytes"), offset = t.at("offset");
      std::vector<float> v(static_cast<size_t>(bytes / 4));
      bin.seekg(offset);
      bin.read(reinterpret_cast<char*>(v.data()), bytes);
      if (!bin) {
        *why = m + ": cannot read " + name;
        return false;
      }
      (*out)[name.substr(7)] = std::move(v);
    }
  }
  if (out->empty()) *why = step_dir + ": no master/ tensor";
  return !out->empty();
}

// D replicas of C ranks on N nodes (N ringd processes), `o.steps` steps with a final checkpoint.
RunResult run_layout(int d, int c, int n, const Overrides& o = {}) {
  RunResult r;
  TempDir t("replicas-test");
  const std::string spec = t.path + "/spec.yaml";
  std::ofstream(spec) << spec_yaml(d, c, n, o);
  const std::string job = t.path + "/job";
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<Proc>> nodes;
  for (int k = 0; k < n; ++k) {
    std::vector<std::string> extra = {"--steps", std::to_string(o.steps)};
    if (n > 1) {
      for (const std::string& a :
           {std::string("--nodes"), std::to_string(n), std::string("--node-rank"),
            std::to_string(k), std::string("--rendezvous"), t.path + "/rdv"})
        extra.push_back(a);
    }
    const std::string base = t.path + "/d" + std::to_string(k);
    nodes.push_back(std::make_unique<Proc>(ringd_args(spec, job, extra), base + ".out",
                                           base + ".err", ucx_loopback()));
  }
  if (o.kill_at_step > 0) {
    const std::string out = t.path + "/d0.out";
    const json at = wait_line(
        out, [&](const json& j) { return j.value("step", 0) >= o.kill_at_step; }, 120);
    const std::vector<pid_t> pids = worker_pids(out);
    if (at.is_null() || pids.empty() || ::kill(pids[0], SIGKILL) != 0) {
      r.error = "no step " + std::to_string(o.kill_at_step) + " or no worker to kill\n" +
                slurp(job + "/logs/ringd-0.log");
      return r;
    }
  }
  auto logs = [&] {
    std::string s;
    for (int k = 0; k < n; ++k)
      s += "--- node " + std::to_string(k) + ":\n" +
           slurp(t.path + "/d" + std::to_string(k) + ".err") +
           slurp(job + "/logs/ringd-" + std::to_string(k) + ".log");
    return s;
  };
  for (auto& p : nodes) {
    const int st = p->wait(600);
    if (st != 0) {
      r.error = "ringd exited with status " + std::to_string(st) + "\n" + logs();
      return r;
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Per step the last record (a resumed attempt repeats the steps after its checkpoint).
  for (const json& j : json_lines(job + "/steps.jsonl")) {
    if (!j.contains("loss")) continue;
    const size_t s = j.value("step", int64_t{0});
    if (s < 1 || s > static_cast<size_t>(o.steps)) continue;
    if (r.loss.size() < s) {
      r.loss.resize(s, NAN);
      r.grad_norm.resize(s, NAN);
      r.tokens.resize(s, -1);
      r.valid.resize(s, -1);
    }
    r.loss[s - 1] = j.at("loss").is_number() ? j.at("loss").get<double>() : NAN;
    r.grad_norm[s - 1] = j.value("grad_norm", NAN);
    r.tokens[s - 1] = j.value("tokens", int64_t{-1});
    r.valid[s - 1] = j.value("valid", int64_t{-1});
    r.last_attempt = j.value("attempt", -1);
  }
  for (const json& j : json_lines(t.path + "/d0.out"))
    if (j.value("event", "") == "resumed") r.resumed_step = j.value("step", -1);
  if (static_cast<int>(r.loss.size()) != o.steps) {
    r.error = "steps.jsonl has " + std::to_string(r.loss.size()) + " steps\n" + logs();
    return r;
  }
  if (!read_master(job + "/checkpoints", &r.master, &r.error)) {
    r.error += "\n" + logs();
    return r;
  }
  // Nothing left behind: no process, no attempt rendezvous (with its replica-<d> and world
  // sub-directories).
  if (!wait_for_no_processes(t.path, 5)) {
    r.error = "processes left behind\n" + logs();
    return r;
  }
  const std::string rdv_root = n > 1 ? t.path + "/rdv" : job + "/rendezvous";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(rdv_root, ec)) {
    r.error = "left in the rendezvous root: " + e.path().string();
    return r;
  }
  r.ok = true;
  return r;
}

double rel(double a, double b) {
  return std::fabs(a - b) / std::max(std::fabs(b), 1e-30);
}

// ||a - b||_2 / ||b||_2 over one tensor.
double rel_norm(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// The largest per-tensor relative difference of two runs' final weights (and that the two hold
// the same tensors); *bitwise says whether every float is identical.
double weights_diff(const RunResult& a, const RunResult& b, bool* bitwise) {
  EXPECT_EQ(a.master.size(), b.master.size());
  double worst = 0;
  *bitwise = a.master.size() == b.master.size();
  for (const auto& [name, w] : b.master) {
    auto it = a.master.find(name);
    if (it == a.master.end() || it->second.size() != w.size()) {
      ADD_FAILURE() << "tensor " << name << " missing or of another size";
      *bitwise = false;
      continue;
    }
    worst = std::max(worst, rel_norm(it->second, w));
    *bitwise = *bitwise && std::memcmp(it->second.data(), w.data(), w.size() * 4) == 0;
  }
  return worst;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, rel(a[i], b[i]));
  return worst;
}

// ---- shard none vs shard optimizer ------------------------------------------------------------

struct Case {
  int d, c, n;
  std::string compression;
};
void PrintTo(const Case& k, std::ostream* os) {
  *os << "D=" << k.d << " C=" << k.c << " N=" << k.n << " " << k.compression;
}

class ReplicaShardModes : public ::testing::TestWithParam<Case> {};

TEST_P(ReplicaShardModes, NoneAndOptimizerAgree) {
  const Case k = GetParam();
  Overrides none, opt;
  none.compression = opt.compression = k.compression;
  opt.shard = "optimizer";
  const RunResult a = run_layout(k.d, k.c, k.n, none);
  ASSERT_TRUE(a.ok) << a.error;
  const RunResult b = run_layout(k.d, k.c, k.n, opt);
  ASSERT_TRUE(b.ok) << b.error;
  for (size_t s = 0; s < a.loss.size(); ++s) {
    EXPECT_TRUE(std::isfinite(a.loss[s])) << "step " << s + 1;
    EXPECT_LE(rel(b.loss[s], a.loss[s]), kSameMathTol) << "step " << s + 1;
  }
  bool bitwise = false;
  const double w = weights_diff(b, a, &bitwise);
  EXPECT_LE(w, kSameMathTol);
  if (k.n <= 2) {
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_TRUE(bitwise);
  }
  // The run trains: the loss falls over the 20 steps; a step's tokens are every replica's.
  EXPECT_LT(a.loss.back(), a.loss.front());
  for (int64_t t : a.tokens) EXPECT_EQ(t, k.d * kSeqLen);
  std::printf(
      "D=%d C=%d N=%d %s: %.1f s + %.1f s; loss %.4f -> %.4f; max loss diff %.3g, "
      "weights diff %.3g%s\n",
      k.d, k.c, k.n, k.compression.c_str(), a.seconds, b.seconds, a.loss.front(), a.loss.back(),
      max_rel(b.loss, a.loss), w, bitwise ? " (bit-identical)" : "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ReplicaShardModes,
                         ::testing::Values(Case{1, 2, 1, "none"}, Case{2, 1, 1, "none"},
                                           Case{2, 2, 1, "none"}, Case{1, 2, 2, "none"},
                                           Case{2, 2, 2, "none"}, Case{1, 2, 1, "topk"},
                                           Case{2, 1, 1, "topk"}, Case{2, 2, 1, "topk"},
                                           Case{1, 2, 2, "topk"}, Case{2, 2, 2, "topk"},
                                           Case{1, 2, 2, "topk_sender"},
                                           Case{2, 2, 2, "topk_sender"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "D" + std::to_string(i.param.d) + "C" +
                                  std::to_string(i.param.c) + "N" + std::to_string(i.param.n) +
                                  "_" + i.param.compression;
                         });

// ---- top-k at the owner: the node count does not change the result -------------------------

// (D, C) on one node and on two, top-k at the owner: the owner selects from the job's summed
// gradient with the residual of its range, whichever node holds it. With two workers the job's
// gradient is w0 + w1 on either layout (bit-identical); with four the nodes group the sum
// differently (within 1e-6). Shard optimizer on two nodes gives shard none's bits.
TEST(TopkAtOwner, SameResultOnOneAndTwoNodes) {
  for (const auto& [d, c] : std::vector<std::pair<int, int>>{{1, 2}, {2, 2}}) {
    Overrides none;
    none.compression = "topk";
    Overrides opt = none;
    opt.shard = "optimizer";
    const RunResult one = run_layout(d, c, 1, none);
    ASSERT_TRUE(one.ok) << one.error;
    for (const Overrides* o : {&none, &opt}) {
      const RunResult two = run_layout(d, c, 2, *o);
      ASSERT_TRUE(two.ok) << two.error;
      bool bitwise = false;
      const double w = weights_diff(two, one, &bitwise);
      EXPECT_LE(max_rel(two.loss, one.loss), kSameMathTol) << "D=" << d << " C=" << c;
      EXPECT_LE(w, kSameMathTol) << "D=" << d << " C=" << c;
      if (d * c == 2) {
        EXPECT_EQ(two.loss, one.loss);
        EXPECT_EQ(two.grad_norm, one.grad_norm);
        EXPECT_TRUE(bitwise);
      }
      std::printf(
          "topk at the owner D=%d C=%d: 2 nodes shard %s vs 1 node: max loss diff %.3g, "
          "weights diff %.3g%s\n",
          d, c, o->shard.c_str(), max_rel(two.loss, one.loss), w,
          bitwise ? " (bit-identical)" : "");
    }
  }
}

// ---- shard full ---------------------------------------------------------------------------------

// shard full vs shard none on the same layout. Dense: the workers' reduce-scatter sums in shard
// none's order (per node, local ranks left to right, then nodes), and ringd's slot sum adds
// only zeros to it, so loss, grad_norm and final weights are bit-identical. Top-k (at the
// owner, the default): shard none reduces each range's gradient to its owner in node order and
// the owner selects from the job's sum with its range's residual, as shard full's owner does:
// bit-identical too.
class ReplicaFullShard : public ::testing::TestWithParam<Case> {};

TEST_P(ReplicaFullShard, FullAgreesWithNone) {
  const Case k = GetParam();
  Overrides none, full;
  none.compression = full.compression = k.compression;
  full.shard = "full";
  const RunResult a = run_layout(k.d, k.c, k.n, none);
  ASSERT_TRUE(a.ok) << a.error;
  const RunResult b = run_layout(k.d, k.c, k.n, full);
  ASSERT_TRUE(b.ok) << b.error;
  for (size_t s = 0; s < a.loss.size(); ++s) {
    EXPECT_TRUE(std::isfinite(b.loss[s])) << "step " << s + 1;
    EXPECT_LE(rel(b.loss[s], a.loss[s]), kSameMathTol) << "step " << s + 1;
  }
  bool bitwise = false;
  const double w = weights_diff(b, a, &bitwise);
  EXPECT_LE(w, kSameMathTol);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  EXPECT_TRUE(bitwise);
  EXPECT_LT(b.loss.back(), b.loss.front());
  for (int64_t t : b.tokens) EXPECT_EQ(t, k.d * kSeqLen);
  std::printf(
      "full D=%d C=%d N=%d %s vs none: %.1f s (none %.1f s); loss %.4f -> %.4f; max loss "
      "diff %.3g, weights diff %.3g%s\n",
      k.d, k.c, k.n, k.compression.c_str(), b.seconds, a.seconds, b.loss.front(), b.loss.back(),
      max_rel(b.loss, a.loss), w, bitwise ? " (bit-identical)" : "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ReplicaFullShard,
                         ::testing::Values(Case{1, 2, 1, "none"}, Case{2, 1, 1, "none"},
                                           Case{2, 2, 1, "none"}, Case{1, 2, 2, "none"},
                                           Case{2, 2, 2, "none"}, Case{1, 2, 1, "topk"},
                                           Case{2, 1, 1, "topk"}, Case{2, 2, 1, "topk"},
                                           Case{1, 2, 2, "topk"}, Case{2, 2, 2, "topk"}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "D" + std::to_string(i.param.d) + "C" +
                                  std::to_string(i.param.c) + "N" + std::to_string(i.param.n) +
                                  "_" + i.param.compression;
                         });

// bf16 (docs/precision.md): shard full rounds each gathered block as the model acquires it, shard
// none the whole working copy; same values, same GEMMs: loss, grad_norm and the final fp32 master
// weights bit-identical, with data replicas and the ring's bf16 wire, dense and top-k.
TEST(ReplicaFullShardBf16, FullAgreesWithNoneBitForBit) {
  for (const std::string compression : {"none", "topk"}) {
    Overrides none, full;
    none.dtype = full.dtype = "bf16";
    none.compression = full.compression = compression;
    none.steps = full.steps = 10;
    full.shard = "full";
    const RunResult a = run_layout(2, 2, 1, none);
    ASSERT_TRUE(a.ok) << a.error;
    const RunResult b = run_layout(2, 2, 1, full);
    ASSERT_TRUE(b.ok) << b.error;
    bool bitwise = false;
    const double w = weights_diff(b, a, &bitwise);
    EXPECT_EQ(a.loss, b.loss) << compression;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << compression;
    EXPECT_TRUE(bitwise) << compression << ": weights diff " << w;
    EXPECT_LT(b.loss.back(), b.loss.front());
    std::printf("bf16 full D=2 C=2 N=1 %s vs none: loss %.4f -> %.4f%s\n", compression.c_str(),
                b.loss.front(), b.loss.back(), bitwise ? " (bit-identical)" : "");
  }
}

// Micro-batches, recompute and an untied LM head under shard full on two nodes: each
// micro-batch's gradient is reduce-scattered and added to the shard's (shard none adds the
// micro-batches in the worker, then sums the workers), so not bit-identical: within 1e-6.
// And the lazy update (top-k) on one node: bit-identical to shard none's.
TEST(ReplicaFullShardOptions, MicroBatchesRecomputeUntiedAndLazy) {
  Overrides none, full;
  none.micro_batches = full.micro_batches = 2;
  none.recompute = full.recompute = true;
  none.tie = full.tie = false;
  full.shard = "full";
  const RunResult a = run_layout(2, 2, 2, none);
  ASSERT_TRUE(a.ok) << a.error;
  const RunResult b = run_layout(2, 2, 2, full);
  ASSERT_TRUE(b.ok) << b.error;
  EXPECT_LE(max_rel(b.loss, a.loss), kSameMathTol);
  bool bitwise = false;
  const double w = weights_diff(b, a, &bitwise);
  EXPECT_LE(w, kSameMathTol);
  EXPECT_LT(b.loss.back(), b.loss.front());
  for (int64_t t : b.tokens) EXPECT_EQ(t, 2 * 2 * kSeqLen);
  std::printf("full D=2 C=2 N=2 M=2 recompute untied: max loss diff %.3g, weights diff %.3g%s\n",
              max_rel(b.loss, a.loss), w, bitwise ? " (bit-identical)" : "");

  Overrides lazy_none, lazy_full;
  lazy_none.compression = lazy_full.compression = "topk";
  lazy_none.update = lazy_full.update = "lazy";
  lazy_full.shard = "full";
  const RunResult c = run_layout(1, 2, 1, lazy_none);
  ASSERT_TRUE(c.ok) << c.error;
  const RunResult d = run_layout(1, 2, 1, lazy_full);
  ASSERT_TRUE(d.ok) << d.error;
  EXPECT_EQ(c.loss, d.loss);
  EXPECT_EQ(c.grad_norm, d.grad_norm);
  weights_diff(d, c, &bitwise);
  EXPECT_TRUE(bitwise);
  std::printf("full D=1 C=2 N=1 topk lazy: max loss diff %.3g%s\n", max_rel(d.loss, c.loss),
              bitwise ? " (bit-identical)" : "");
}

// ---- the same data, split differently ---------------------------------------------------------

TEST(ReplicaLayouts, SameDataSplitDifferentlyFollowsOneCurve) {
  const RunResult ref = run_layout(2, 1, 1);
  ASSERT_TRUE(ref.ok) << ref.error;
  for (const auto& [c, n] : std::vector<std::pair<int, int>>{{2, 1}, {2, 2}}) {
    const RunResult r = run_layout(2, c, n);
    ASSERT_TRUE(r.ok) << r.error;
    for (size_t s = 0; s < ref.loss.size(); ++s)
      EXPECT_LE(rel(r.loss[s], ref.loss[s]), kLayoutTol)
          << "D=2 C=" << c << " N=" << n << " step " << s + 1 << ": " << r.loss[s] << " vs "
          << ref.loss[s];
    bool bitwise = false;
    std::printf(
        "D=2 C=%d N=%d vs D=2 C=1 N=1: max per-step loss diff %.3g, step-1 grad_norm "
        "diff %.3g, final weights diff %.3g (%.1f s)\n",
        c, n, max_rel(r.loss, ref.loss), rel(r.grad_norm[0], ref.grad_norm[0]),
        weights_diff(r, ref, &bitwise), r.seconds);
  }
}

// ---- micro-batches ------------------------------------------------------------------------------

TEST(ReplicaMicroBatches, TwoMicroBatchesEqualTwoReplicas) {
  Overrides m2, d2;
  m2.micro_batches = 2;
  m2.steps = d2.steps = 5;
  const RunResult a = run_layout(1, 1, 1, m2);
  ASSERT_TRUE(a.ok) << a.error;
  const RunResult b = run_layout(2, 1, 1, d2);
  ASSERT_TRUE(b.ok) << b.error;
  EXPECT_LE(rel(a.loss[0], b.loss[0]), kSameMathTol) << a.loss[0] << " vs " << b.loss[0];
  EXPECT_LE(rel(a.grad_norm[0], b.grad_norm[0]), kSameMathTol)
      << a.grad_norm[0] << " vs " << b.grad_norm[0];
  EXPECT_LE(max_rel(a.loss, b.loss), kSameMathTol);
  // The same sequences: the same tokens and valid labels per step.
  EXPECT_EQ(a.valid, b.valid);
  for (int64_t t : a.tokens) EXPECT_EQ(t, 2 * kSeqLen);
  EXPECT_EQ(a.tokens, b.tokens);
  bool bitwise = false;
  const double w = weights_diff(a, b, &bitwise);
  EXPECT_LE(w, kSameMathTol);
  std::printf(
      "M=2 vs D=2: step-1 loss diff %.3g, grad_norm diff %.3g, max loss diff %.3g, "
      "weights after %d steps diff %.3g%s\n",
      rel(a.loss[0], b.loss[0]), rel(a.grad_norm[0], b.grad_norm[0]), max_rel(a.loss, b.loss),
      m2.steps, w, bitwise ? " (bit-identical)" : "");
}

// ---- resume -------------------------------------------------------------------------------------

// `o` on (d, c, n) straight, then with node 0's first worker killed at step 6: the attempt after
// the restart resumes from a checkpoint (o.every_steps apart) and the losses and final weights
// are bit-identical to the straight run's.
void expect_kill_resumes_exactly(int d, int c, int n, Overrides o, const char* what) {
  const RunResult straight = run_layout(d, c, n, o);
  ASSERT_TRUE(straight.ok) << straight.error;
  o.kill_at_step = 6;
  const RunResult resumed = run_layout(d, c, n, o);
  ASSERT_TRUE(resumed.ok) << resumed.error;
  EXPECT_EQ(resumed.last_attempt, 1);
  EXPECT_GE(resumed.resumed_step, o.every_steps);
  EXPECT_LT(resumed.resumed_step, o.steps);
  EXPECT_EQ(resumed.resumed_step % o.every_steps, 0);
  EXPECT_EQ(resumed.loss, straight.loss);
  bool bitwise = false;
  weights_diff(resumed, straight, &bitwise);
  EXPECT_TRUE(bitwise);
  std::printf("%s: resumed from step %d; %d steps %.1f s straight, %.1f s with the restart\n",
              what, resumed.resumed_step, o.steps, straight.seconds, resumed.seconds);
}

// Two replicas with two micro-batches each: a worker killed at step 6 (or a little later) makes
// ringd roll back to the newest checkpoint (every 4 steps) and train on; every rank's loader
// resumes at the checkpoint's cursor (after 4k x D x M sequences), so the steps after it and the
// final weights are bit-identical to a run without the kill.
TEST(ReplicaResume, KilledWorkerResumesExactly) {
  Overrides o;
  o.micro_batches = 2;
  o.steps = 30;
  o.every_steps = 4;
  expect_kill_resumes_exactly(2, 1, 1, o, "D=2 M=2");
}

// ---- two-level context parallelism ---------------------------------------------------------------

// parallel.head_ranks 2 under ringd: 2 data replicas of 4 ranks (2 head groups of 2, the ring over
// the groups) on 2 nodes with shard full, 2 micro-batches and recompute, against the single ring
// of 4 with shard none on the same layout, data, micro-batches and recompute. Attention is split differently (heads inside a group, one ring hop per
// group), so the per-step loss is compared within kLayoutTol and the final weights within 1e-5.
TEST(ReplicaHeadRanks, TwoLevelWithShardFullFollowsTheSingleRing) {
  Overrides ring1, two;
  ring1.steps = two.steps = 10;
  ring1.micro_batches = two.micro_batches = 2;
  ring1.recompute = two.recompute = true;
  two.head_ranks = 2;
  two.shard = "full";
  const RunResult a = run_layout(2, 4, 2, ring1);
  ASSERT_TRUE(a.ok) << a.error;
  const RunResult b = run_layout(2, 4, 2, two);
  ASSERT_TRUE(b.ok) << b.error;
  for (size_t s = 0; s < a.loss.size(); ++s)
    EXPECT_LE(rel(b.loss[s], a.loss[s]), kLayoutTol) << "step " << s + 1;
  bool bitwise = false;
  const double w = weights_diff(b, a, &bitwise);
  EXPECT_LE(w, 1e-5);
  EXPECT_LT(b.loss.back(), b.loss.front());
  for (int64_t t : b.tokens) EXPECT_EQ(t, 2 * 2 * kSeqLen);
  std::printf("head_ranks 2, D=2 C=4 N=2 M=2 recompute, shard full vs one ring, shard none: max "
              "loss diff %.3g, "
              "weights diff %.3g (%.1f s vs %.1f s)\n",
              max_rel(b.loss, a.loss), w, b.seconds, a.seconds);
}

// Top-k at the owner with error feedback under two levels: head_ranks 2 (2 groups of 2) against
// the single ring of 4 on 2 nodes, same data. The gradients differ only by how attention is split
// (measured ~1e-9 relative), and top-k selects at the owner from the job's sum, so the selections
// agree and the curves follow each other within kLayoutTol per step, the weights within 1e-5.
TEST(ReplicaHeadRanks, TopkFollowsTheSingleRing) {
  Overrides ring1, two;
  ring1.steps = two.steps = 10;
  ring1.compression = two.compression = "topk";
  two.head_ranks = 2;
  const RunResult a = run_layout(1, 4, 2, ring1);
  ASSERT_TRUE(a.ok) << a.error;
  const RunResult b = run_layout(1, 4, 2, two);
  ASSERT_TRUE(b.ok) << b.error;
  for (size_t s = 0; s < a.loss.size(); ++s)
    EXPECT_LE(rel(b.loss[s], a.loss[s]), kLayoutTol) << "step " << s + 1;
  bool bitwise = false;
  const double w = weights_diff(b, a, &bitwise);
  EXPECT_LE(w, 1e-5);
  EXPECT_LT(b.loss.back(), b.loss.front());
  std::printf("head_ranks 2 top-k vs one ring top-k, C=4 N=2: max loss diff %.3g, weights diff "
              "%.3g (%.1f s vs %.1f s)\n",
              max_rel(b.loss, a.loss), w, b.seconds, a.seconds);
}

// A worker of a two-level layout (2 groups of 2 on one node) killed mid-run: ringd rolls back to
// the checkpoint and the steps after it and the final weights are bit-identical to a run without
// the kill.
TEST(ReplicaHeadRanks, KilledWorkerResumesExactly) {
  Overrides o;
  o.head_ranks = 2;
  o.steps = 16;
  o.every_steps = 4;
  expect_kill_resumes_exactly(1, 4, 1, o, "head_ranks 2");
}

}  // namespace
