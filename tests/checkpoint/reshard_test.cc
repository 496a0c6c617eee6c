// Resuming on another node count (and under another head layout: ReshardHeadRanks), end to end
// with real ringd and ring-worker processes (CPU backend, one worker per node, UCX on
// loopback), for shard none and shard optimizer, dense
// gradients and top-k with error feedback, at the owner (the default) and at the sender:
//   - 10 steps on 2 nodes (the final checkpoint is step 10's), then `ringd --resume` to step 20
//     on 1 node and on 4 nodes: the per-step loss of steps 11-20 equals, within 1e-6 relative,
//     an uninterrupted 20-step run on that node count (context_ranks follows the worker count;
//     the data stream is the same). Top-k at the owner too: each range's owner selects from
//     the job's summed gradient with its range's residual, saved once like the master, so the
//     state reshards exactly (measured: within 4.3e-9 on 1 and 4 nodes, as dense; the sender's
//     rule is 4.6e-3 off). Top-k at the sender: each node selects from its own gradient, so
//     runs on different node counts part from the first compressed step on, and the 2 nodes'
//     residuals are summed onto node 0 (docs/checkpoints.md): there step 11's loss (computed
//     from the checkpoint's weights alone) must equal the uninterrupted 2-node run's within
//     1e-6, and steps 12-20 stay within 1e-2 of it;
//   - a sender checkpoint resumes at the owner (per-node residuals summed into the owners'
//     ranges) and an owner's at the sender (onto node 0), step 11 within 1e-6;
//   - resumed on the same 2 nodes it is bit-exact: loss bits and master-weight hashes
//     (--hash-weights) of steps 11-20 equal the uninterrupted 2-node run's;
//   - a model with the same shapes but other heads is refused (exit 1, what differs named);
//   - a format 1 checkpoint (flat tensors) of the same state resumes bit-exactly like it.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/contract/layout.h"
#include "common/contract/model_config.h"
#include "common/spec/parse.h"
#include "common/checkpoint/checkpoint.h"
#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"

namespace {

using json = nlohmann::json;
using ring::test::json_lines;
using ring::test::slurp;
using ring::test::TempDir;
namespace fsys = std::filesystem;

std::string bin(const char* env, const char* dflt) {
  const char* e = std::getenv(env);  // RINGD_BIN / RING_WORKER: try another build's binaries
  return e ? e : dflt;
}

// The variant under test: parallel.shard, and top-k compression with error feedback or none.
struct Mode {
  std::string shard;
  bool topk = false;
  bool sender = false;  // optimizer.compress_at: sender (else owner, the default)
  std::string name() const {
    return shard + (topk ? (sender ? "-topk-sender" : "-topk") : "-dense");
  }
};
// gtest names the parameter by this (not by its bytes) in test lists and failures.
void PrintTo(const Mode& m, std::ostream* os) {
  *os << m.name();
}

// The job on `nodes` nodes of one worker each: a tiny model, AdamW offloaded to ringd, a
// constant learning rate after warm-up (so `--steps 10` trains the first 10 of the 20 steps
// exactly), a checkpoint every 10 steps.
std::string write_spec(const std::string& dir, int nodes, const Mode& mode, int heads = 4) {
  const std::string& shard = mode.shard;
  const std::string path = dir + "/spec-" + std::to_string(nodes) + "-" + mode.name() + "-" +
                           std::to_string(heads) + ".yaml";
  std::ofstream f(path);
  f << "job:\n  name: ckpt-reshard\n"
       "model:\n  layers: 2\n  d_model: 64\n  heads: "
    << heads
    << "\n  mlp: swiglu\n  vocab: 256\n"
       "data:\n  source: text\n  paths: [/usr/share/common-licenses]\n  seq_len: 256\n"
       "  seed: 1\n"
       "parallel:\n  context_ranks: "
    << nodes << "\n  ring_order: natural\n  shard: " << shard
    << "\n"
       "optimizer:\n  lr: 1.0e-3\n  lr_warmup_steps: 2\n  schedule: constant\n"
       "  weight_decay: 0.1\n  offload: cpu\n"
    << (mode.topk ? "  compression: topk\n  density: 0.05\n  error_feedback: true\n" : "")
    << (mode.sender ? "  compress_at: sender\n" : "")
    << "train:\n  steps: 20\n  grad_clip: 1.0\n  seed: 1\n  log_every: 1\n"
       "checkpoint:\n  every_steps: 10\n  keep_last: 3\n  dir: checkpoints\n"
       "resources:\n  nodes: "
    << nodes
    << "\n  workers_per_node: 1\n  backend: cpu\n  cpus_per_worker: 1\n"
       "restart:\n  max_restarts: 0\n";
  return path;
}

struct Steps {
  std::map<int64_t, double> loss;       // step -> loss (node 0's steps.jsonl)
  std::map<int64_t, std::string> hash;  // step -> weights_xxh
  std::string log0;                     // node 0's log
};

// Runs the job on `nodes` ringd processes in `job` until they exit; every one must exit 0.
Steps run_job(const std::string& tmp, const std::string& spec, const std::string& job, int nodes,
              const std::vector<std::string>& extra) {
  static int runs = 0;
  const std::string tag = std::to_string(++runs);
  std::vector<std::unique_ptr<ring::test::Proc>> procs;
  for (int k = 0; k < nodes; ++k) {
    std::vector<std::string> a = {bin("RINGD_BIN", RINGD_BIN),
                                  "--spec",
                                  spec,
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
    if (nodes > 1) {
      for (std::string s :
           {std::string("--nodes"), std::to_string(nodes), std::string("--node-rank"),
            std::to_string(k), std::string("--rendezvous"), tmp + "/rdv-" + tag})
        a.push_back(s);
    }
    a.insert(a.end(), extra.begin(), extra.end());
    ring::test::ProcOptions o = ring::test::ucx_loopback();
    o.kill_on_timeout = true;
    const std::string out = tmp + "/out-" + tag + "-" + std::to_string(k);
    procs.push_back(std::make_unique<ring::test::Proc>(a, out, out + ".err", o));
  }
  Steps s;
  for (int k = 0; k < nodes; ++k) {
    const int st = procs[k]->wait(300);
    const std::string log = slurp(job + "/logs/ringd-" + std::to_string(k) + ".log");
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << "node " << k << " of " << nodes << ": status " << st << "\n"
        << slurp(tmp + "/out-" + tag + "-" + std::to_string(k) + ".err") << log;
  }
  for (const json& j : json_lines(job + "/steps.jsonl")) {
    if (!j.contains("step") || !j.contains("loss")) continue;
    s.loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    if (j.contains("weights_xxh")) s.hash[j["step"].get<int64_t>()] = j["weights_xxh"];
  }
  s.log0 = slurp(job + "/logs/ringd-0.log");
  return s;
}

struct Rig {
  TempDir t{"ckpt-reshard"};
  std::map<std::string, Steps> straight;    // "nodes/mode" -> the uninterrupted 20 steps
  std::map<std::string, std::string> ckpt;  // mode -> the 2-node run's checkpoints (step 10)
};
Rig& rig() {
  static Rig r;
  return r;
}

const Steps& straight(int nodes, const Mode& mode) {
  const std::string key = std::to_string(nodes) + "/" + mode.name();
  Rig& r = rig();
  if (!r.straight.count(key)) {
    const std::string job = r.t.path + "/straight-" + std::to_string(nodes) + "-" + mode.name();
    r.straight[key] = run_job(r.t.path, write_spec(r.t.path, nodes, mode), job, nodes, {});
  }
  return r.straight[key];
}

// The checkpoint directory of 10 steps on 2 nodes.
const std::string& two_node_checkpoint(const Mode& mode) {
  Rig& r = rig();
  if (!r.ckpt.count(mode.name())) {
    const std::string job = r.t.path + "/first10-" + mode.name();
    Steps s = run_job(r.t.path, write_spec(r.t.path, 2, mode), job, 2, {"--steps", "10"});
    EXPECT_EQ(s.loss.size(), 10u) << s.log0;
    EXPECT_EQ(slurp(job + "/checkpoints/latest"), "step-00000010\n") << s.log0;
    r.ckpt[mode.name()] = job + "/checkpoints";
  }
  return r.ckpt[mode.name()];
}

// Steps 11-20 resumed on `nodes` nodes from the 2-node checkpoint (a copy: each resume writes
// its own step 20), written with `writer` (default: mode).
Steps resume_on(int nodes, const Mode& mode, const Mode* writer = nullptr) {
  Rig& r = rig();
  const std::string& from = two_node_checkpoint(writer ? *writer : mode);
  const std::string job = r.t.path + "/resume-" + std::to_string(nodes) + "-" + mode.name() +
                          (writer ? "-from-" + writer->name() : "");
  // A fresh copy each time (another test may have resumed the same layout before).
  fsys::remove_all(job);
  fsys::create_directories(job);
  fsys::copy(from, job + "/checkpoints", fsys::copy_options::recursive);
  return run_job(r.t.path, write_spec(r.t.path, nodes, mode), job, nodes, {"--resume"});
}

class Reshard : public ::testing::TestWithParam<Mode> {};

TEST_P(Reshard, TwoNodeCheckpointResumesOnOneAndFourNodes) {
  const Mode mode = GetParam();
  const std::string& shard = mode.shard;
  for (int nodes : {1, 4}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes, " + mode.name());
    // The straight run with shard none (shard optimizer gives the same steps): on the target
    // node count, or with top-k at the sender on the writer's.
    const bool approximate = mode.topk && mode.sender;
    const Steps& want = straight(approximate ? 2 : nodes, Mode{"none", mode.topk, mode.sender});
    ASSERT_EQ(want.loss.size(), 20u) << want.log0;
    Steps got = resume_on(nodes, mode);
    ASSERT_EQ(got.loss.size(), 10u) << got.log0;
    EXPECT_NE(got.log0.find("resuming from "), std::string::npos) << got.log0;
    EXPECT_NE(got.log0.find("was written by 2 nodes, shard " + shard), std::string::npos)
        << got.log0;
    EXPECT_NE(got.log0.find("state resharded"), std::string::npos) << got.log0;
    // Only top-k with error feedback at the sender keeps a per-node residual; at the owner it
    // reshards like the master.
    EXPECT_EQ(got.log0.find("per-node residuals summed onto node 0") != std::string::npos,
              approximate)
        << got.log0;
    if (mode.topk && !mode.sender) {
      EXPECT_EQ(got.log0.find("residuals summed"), std::string::npos) << got.log0;
    }

    double worst = 0, first = 0;
    for (int64_t s = 11; s <= 20; ++s) {
      ASSERT_EQ(got.loss.count(s), 1u) << "step " << s;
      const double a = got.loss[s], b = want.loss.at(s);
      const double rel = std::fabs(a - b) / std::fabs(b);
      worst = std::max(worst, rel);
      if (s == 11) first = rel;
      const double tolerance = approximate && s > 11 ? 1e-2 : 1e-6;
      EXPECT_LE(rel, tolerance) << "step " << s << ": resumed " << a << ", straight " << b;
    }
    std::printf(
        "[ reshard ] 2 -> %d nodes, %s: relative loss difference step 11 %.3g, worst "
        "%.3g\n",
        nodes, mode.name().c_str(), first, worst);
  }
}

void expect_same_two_nodes_bit_exact(const Mode& mode) {
  const Steps& want = straight(2, mode);
  ASSERT_EQ(want.loss.size(), 20u) << want.log0;
  Steps got = resume_on(2, mode);
  ASSERT_EQ(got.loss.size(), 10u) << got.log0;
  EXPECT_EQ(got.log0.find("state resharded"), std::string::npos) << got.log0;
  for (int64_t s = 11; s <= 20; ++s) {
    ASSERT_EQ(got.loss.count(s), 1u) << "step " << s;
    // Loss bits: the JSON carries doubles that round-trip.
    EXPECT_EQ(std::memcmp(&got.loss[s], &want.loss.at(s), sizeof(double)), 0)
        << "step " << s << ": " << got.loss[s] << " vs " << want.loss.at(s);
    EXPECT_EQ(got.hash[s], want.hash.at(s)) << "step " << s;
  }
}

TEST_P(Reshard, SameTwoNodesResumeIsBitExact) { expect_same_two_nodes_bit_exact(GetParam()); }

// Shard full on the same two nodes: bit-exact too (loss bits; the hashes are of each node's
// range of the weights, the part its workers read).
class ReshardFullSame : public ::testing::TestWithParam<Mode> {};
TEST_P(ReshardFullSame, SameTwoNodesResumeIsBitExact) {
  expect_same_two_nodes_bit_exact(GetParam());
}
INSTANTIATE_TEST_SUITE_P(Mode, ReshardFullSame,
                         ::testing::Values(Mode{"full", false}, Mode{"full", true}),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return i.param.shard + (i.param.topk ? "_topk" : "_dense");
                         });

// Another model with the same parameter shapes (8 heads of 8 instead of 4 of 16): the resume is
// refused naming what differs, and ringd exits 1 instead of training from the wrong state.
TEST(ReshardRefusal, AnotherModelWithEqualShapesIsRefused) {
  Rig& r = rig();
  const std::string& from = two_node_checkpoint(Mode{"none", false});
  const std::string job = r.t.path + "/other-model";
  fsys::create_directories(job);
  fsys::copy(from, job + "/checkpoints", fsys::copy_options::recursive);
  const std::string out = r.t.path + "/other-model.out";
  ring::test::ProcOptions o = ring::test::ucx_loopback();
  o.kill_on_timeout = true;
  ring::test::Proc d(
      {bin("RINGD_BIN", RINGD_BIN), "--spec", write_spec(r.t.path, 1, Mode{"none", false}, 8),
       "--job-dir", job, "--worker-threads", "1", "--worker-bin", bin("RING_WORKER", RING_WORKER),
       "--threads", "1", "--resume"},
      out, out, o);
  const int st = d.wait(120);
  const std::string log = slurp(job + "/logs/ringd-0.log") + slurp(out);
  ASSERT_TRUE(WIFEXITED(st)) << st << log;
  EXPECT_EQ(WEXITSTATUS(st), 1) << log;
  EXPECT_NE(log.find("cannot resume: " + job +
                     "/checkpoints/step-00000010/checkpoint.json: written for another model: "
                     "head_dim 16 (this job: 8), heads 4 (this job: 8)"),
            std::string::npos)
      << log;
}

// A format 1 checkpoint (flat tensors "master", "adam_m", "adam_v" of the whole layout, written
// whole by both nodes, no layout record) of the same state as the 2-node run's step 10 resumes
// on 1 node exactly like that checkpoint: the same loss bits and weights for steps 11-20.
TEST(ReshardFormatOne, FlatCheckpointResumesLikeTheNamedOne) {
  Rig& r = rig();
  const Mode dense{"none", false};
  const std::string& from = two_node_checkpoint(dense);
  auto loaded = ring::spec::load_spec_file(write_spec(r.t.path, 1, dense));
  ASSERT_TRUE(loaded.ok());
  const ring::contract::ParamLayout layout(ring::contract::ModelConfig::from_spec(*loaded.spec));
  // The flat state, gathered from the named checkpoint by the library itself.
  const char* kinds[] = {"master", "adam_m", "adam_v"};
  std::map<std::string, std::vector<float>> flat;
  std::vector<ring::ckpt::LoadTarget> targets;
  for (const char* kind : kinds) {
    flat[kind].assign(static_cast<size_t>(layout.total()), 0.f);
    for (const ring::contract::ParamView& pv : layout.views())
      targets.emplace_back(std::string(kind) + "/" + pv.name, ring::ckpt::DType::kF32, pv.shape,
                           flat[kind].data() + pv.offset);
  }
  const ring::ckpt::LoadResult named = ring::ckpt::load_latest(from, 0, 1, targets);
  ASSERT_TRUE(named.loaded) << named.message;
  ASSERT_EQ(named.step, 10);
  // Written as the format 1 writer did.
  const std::string job = r.t.path + "/format1";
  const std::string dir = job + "/checkpoints";
  {
    std::vector<std::unique_ptr<ring::ckpt::Checkpointer>> cs;
    for (int k = 0; k < 2; ++k) {
      ring::ckpt::Options o;
      o.dir = dir;
      o.node_rank = k;
      o.nodes = 2;
      o.fsync = false;
      cs.push_back(std::make_unique<ring::ckpt::Checkpointer>(o));
      for (const char* kind : kinds)
        cs[k]->add_tensor(kind, ring::ckpt::DType::kF32, {layout.total()}, flat[kind].data());
    }
    for (auto& c : cs) c->start(10, named.meta);
    for (auto& c : cs) ASSERT_TRUE(c->wait().ok);
  }
  const std::string sd = dir + "/step-00000010";
  json top = json::parse(slurp(sd + "/checkpoint.json"));
  top["format_version"] = 1;
  for (int k = 0; k < 2; ++k) {
    const std::string p = sd + "/node-0000" + std::to_string(k) + ".json";
    json sm = json::parse(slurp(p));
    sm["format_version"] = 1;
    const std::string text = sm.dump(1) + "\n";
    std::ofstream(p, std::ios::trunc) << text;
    top["shards"][k]["manifest_xxh3"] = ring::ckpt::xxh3_hex(text.data(), text.size());
  }
  std::ofstream(sd + "/checkpoint.json", std::ios::trunc) << top.dump(1) + "\n";
  ASSERT_EQ(ring::ckpt::inspect_checkpoint(sd, true).status, ring::ckpt::Status::kComplete);

  const Steps want = resume_on(1, dense);
  ASSERT_EQ(want.loss.size(), 10u) << want.log0;
  const Steps got = run_job(r.t.path, write_spec(r.t.path, 1, dense), job, 1, {"--resume"});
  ASSERT_EQ(got.loss.size(), 10u) << got.log0;
  EXPECT_NE(got.log0.find("was written by 2 nodes (format 1)"), std::string::npos) << got.log0;
  for (int64_t s = 11; s <= 20; ++s) {
    EXPECT_EQ(std::memcmp(&got.loss.at(s), &want.loss.at(s), sizeof(double)), 0)
        << "step " << s << ": " << got.loss.at(s) << " vs " << want.loss.at(s);
    EXPECT_EQ(got.hash.at(s), want.hash.at(s)) << "step " << s;
  }
}

// Shard full: written by 2 nodes (1 worker each), resumed under other shard modes and node
// counts. Steps 11-20 within 1e-6 of shard none's uninterrupted run on the target node count
// (shard full's steps are shard none's bits), dense and top-k (at the owner in every mode: the
// owner's residual of its range loads like the master). `ringctl checkpoints --verify` shows
// the layout and where the residual lives.
TEST(ReshardFull, TwoNodeFullCheckpointResumesUnderOtherModes) {
  for (bool topk : {false, true}) {
    const Mode writer{"full", topk};
    for (const auto& [nodes, shard] : std::vector<std::pair<int, std::string>>{
             {1, "none"}, {4, "optimizer"}, {1, "full"}, {4, "full"}}) {
      const Mode target{shard, topk};
      SCOPED_TRACE("2 nodes full -> " + std::to_string(nodes) + " nodes " + target.name());
      const Steps& want = straight(nodes, Mode{"none", topk});
      ASSERT_EQ(want.loss.size(), 20u) << want.log0;
      Steps got = resume_on(nodes, target, &writer);
      ASSERT_EQ(got.loss.size(), 10u) << got.log0;
      EXPECT_NE(got.log0.find("was written by 2 nodes, shard full"), std::string::npos)
          << got.log0;
      EXPECT_NE(got.log0.find("state resharded"), std::string::npos) << got.log0;
      EXPECT_EQ(got.log0.find("residuals summed"), std::string::npos) << got.log0;
      double worst = 0;
      for (int64_t s = 11; s <= 20; ++s) {
        ASSERT_EQ(got.loss.count(s), 1u) << "step " << s;
        const double a = got.loss[s], b = want.loss.at(s);
        const double rel = std::fabs(a - b) / std::fabs(b);
        worst = std::max(worst, rel);
        EXPECT_LE(rel, 1e-6) << "step " << s << ": resumed " << a << ", reference " << b;
      }
      std::printf("[ reshard ] 2 nodes full-%s -> %d nodes %s: worst relative loss diff %.3g\n",
                  topk ? "topk" : "dense", nodes, target.name().c_str(), worst);
    }
  }
  // The writer's layout as ringctl reports it: nodes, shard mode, and the top-k residual at
  // the owners (one copy per range).
  const std::string dir = two_node_checkpoint(Mode{"full", true});
  const std::string out = rig().t.path + "/verify.txt";
  const std::string cmd = std::string(RINGCTL_BIN) + " checkpoints " + dir + " --verify > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(out);
  const std::string text = slurp(out);
  EXPECT_NE(text.find("    2 full      owner    current     complete (verified)"), std::string::npos) << text;
  std::printf("%s", text.c_str());
}

// A checkpoint does not depend on the attention layout: 10 steps on one node of 4 workers with
// one ring of 4 (head_ranks 1) resume with head_ranks 2 (2 groups of 2) and 4 (one group, K/V
// heads split 1 each), and a head_ranks 2 checkpoint resumes with one ring: steps 11-20 follow
// the uninterrupted single-ring run within 1e-5 relative (the attention is split differently;
// the weights, optimizer state and data stream are the same).
std::string spec_heads(const std::string& dir, int head_ranks) {
  std::string s = slurp(write_spec(dir, 1, Mode{"none"}));
  auto swap = [&](const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    if (at == std::string::npos) throw std::runtime_error("spec_heads: no '" + from + "'");
    s.replace(at, from.size(), to);
  };
  swap("context_ranks: 1\n", "context_ranks: 4\n  head_ranks: " + std::to_string(head_ranks) + "\n");
  swap("workers_per_node: 1\n", "workers_per_node: 4\n");
  const std::string path = dir + "/spec-heads-" + std::to_string(head_ranks) + ".yaml";
  std::ofstream(path) << s;
  return path;
}

TEST(ReshardHeadRanks, CheckpointsResumeUnderAnotherHeadLayout) {
  Rig& r = rig();
  const std::string want_job = r.t.path + "/heads-straight";
  const Steps want = run_job(r.t.path, spec_heads(r.t.path, 1), want_job, 1, {});
  ASSERT_EQ(want.loss.size(), 20u) << want.log0;
  for (const auto& [writer, reader] : std::vector<std::pair<int, int>>{{1, 2}, {1, 4}, {2, 1}}) {
    SCOPED_TRACE("head_ranks " + std::to_string(writer) + " -> " + std::to_string(reader));
    const std::string first = r.t.path + "/heads-first-" + std::to_string(writer);
    if (!fsys::exists(first + "/checkpoints/latest")) {
      const Steps s =
          run_job(r.t.path, spec_heads(r.t.path, writer), first, 1, {"--steps", "10"});
      ASSERT_EQ(s.loss.size(), 10u) << s.log0;
    }
    const std::string job =
        r.t.path + "/heads-" + std::to_string(writer) + "-" + std::to_string(reader);
    fsys::remove_all(job);
    fsys::create_directories(job);
    fsys::copy(first + "/checkpoints", job + "/checkpoints", fsys::copy_options::recursive);
    Steps got = run_job(r.t.path, spec_heads(r.t.path, reader), job, 1, {"--resume"});
    ASSERT_EQ(got.loss.size(), 10u) << got.log0;
    double worst = 0;
    for (int64_t s = 11; s <= 20; ++s) {
      ASSERT_EQ(got.loss.count(s), 1u) << "step " << s;
      const double rel = std::fabs(got.loss[s] - want.loss.at(s)) / std::fabs(want.loss.at(s));
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-5) << "step " << s;
    }
    std::printf("[ reshard ] head_ranks %d -> %d: worst relative loss diff %.3g\n", writer,
                reader, worst);
  }
}

// Top-k at the sender and at the owner keep the residual differently; a checkpoint of one
// resumes under the other. Sender (2 nodes) -> owner on 1 and 4 nodes: the per-node residuals
// are summed in node order into the owners' ranges. Owner (2 nodes) -> sender on 2 nodes: node
// 0 gets the owners' residuals, node 1 zeros. Step 11's loss (the checkpoint's weights alone)
// equals the writer's uninterrupted run within 1e-6; later steps follow the reader's algorithm
// (within 1e-2). ringctl reports where each writer kept the residual.
TEST(ReshardCompressAt, SenderAndOwnerCheckpointsResumeUnderTheOther) {
  const Mode sender{"none", true, true}, owner{"none", true, false};
  struct Hop {
    const Mode* writer;
    int nodes;
    Mode target;
    const char* clause;
  };
  for (const Hop& h :
       {Hop{&sender, 1, Mode{"optimizer", true}, "summed in node order into the owners' ranges"},
        Hop{&sender, 4, Mode{"none", true}, "summed in node order into the owners' ranges"},
        Hop{&owner, 2, Mode{"optimizer", true, true},
            "the owners' residuals summed onto node 0"}}) {
    SCOPED_TRACE(h.writer->name() + " on 2 nodes -> " + std::to_string(h.nodes) + " nodes " +
                 h.target.name());
    const Steps& want = straight(2, *h.writer);
    ASSERT_EQ(want.loss.size(), 20u) << want.log0;
    Steps got = resume_on(h.nodes, h.target, h.writer);
    ASSERT_EQ(got.loss.size(), 10u) << got.log0;
    EXPECT_NE(got.log0.find(h.clause), std::string::npos) << got.log0;
    double worst = 0;
    for (int64_t s = 11; s <= 20; ++s) {
      ASSERT_EQ(got.loss.count(s), 1u) << "step " << s;
      const double a = got.loss[s], b = want.loss.at(s);
      const double rel = std::fabs(a - b) / std::fabs(b);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, s > 11 ? 1e-2 : 1e-6) << "step " << s << ": resumed " << a << ", writer " << b;
    }
    std::printf("[ reshard ] 2 nodes %s -> %d nodes %s: worst relative loss diff %.3g\n",
                h.writer->name().c_str(), h.nodes, h.target.name().c_str(), worst);
  }
  for (const auto& [mode, column] : std::vector<std::pair<Mode, std::string>>{
           {sender, "none      per-node"}, {owner, "none      owner"}}) {
    const std::string out = rig().t.path + "/verify-" + mode.name() + ".txt";
    const std::string cmd = std::string(RINGCTL_BIN) + " checkpoints " + two_node_checkpoint(mode) +
                            " --verify > " + out;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(out);
    EXPECT_NE(slurp(out).find("    2 " + column), std::string::npos) << slurp(out);
  }
}

INSTANTIATE_TEST_SUITE_P(Mode, Reshard,
                         ::testing::Values(Mode{"none", false}, Mode{"optimizer", false},
                                           Mode{"none", true}, Mode{"optimizer", true},
                                           Mode{"none", true, true}, Mode{"optimizer", true, true}),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return i.param.shard + (i.param.topk
                                                       ? (i.param.sender ? "_topk_sender" : "_topk")
                                                       : "_dense");
                         });

}  // namespace
