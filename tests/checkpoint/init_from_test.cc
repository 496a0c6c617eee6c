// model.init_from end to end with real ringd and ring-worker processes (CPU backend).
//
// The reference: a job started from random weights (rank 0's init with train.seed). The same
// weights, written as a checkpoint of master/<param> tensors by the ckpt library (from
// model::Model::init_params, computed here independently of ringd), must give a job with
// init_from (and another train.seed, so random init would differ) the same step-1 loss (the
// forward of those weights on the first batch) and the same losses and master-weight hashes
// after it (fresh optimizer at step 0, data from the start); training lowers the loss. A
// checkpoint missing a tensor or holding another shape is refused naming the tensor; a
// checkpoint in checkpoint.dir wins over init_from. The same on 2 nodes with shard optimizer
// (each node loads its range), and in ring-worker alone.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/spec/parse.h"
#include "common/checkpoint/checkpoint.h"
#include "kernels/backend.h"
#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"
#include "worker/model/model.h"

namespace {

using json = nlohmann::json;
using ring::test::json_lines;
using ring::test::slurp;
using ring::test::TempDir;

// A 2-layer model on 2 context ranks; {seed}, {init} and {ckpt} are filled per job.
constexpr const char* kSpec = R"(job:
  name: init-from
model:
  layers: 2
  d_model: 64
  heads: 4
  kv_heads: 2
  mlp: swiglu
  vocab: 256
  init_from: "{init}"
data:
  source: text
  paths: [/usr/share/common-licenses]
  seq_len: 512
  seed: 1
parallel:
  context_ranks: 2
  ring_order: natural
  shard: {shard}
optimizer:
  lr: 3.0e-3
  lr_warmup_steps: 0
  offload: cpu
train:
  steps: 6
  seed: {seed}
  log_every: 1
checkpoint:
  every_steps: 0
  dir: "{ckpt}"
resources:
  nodes: {nodes}
  workers_per_node: {wpn}
  backend: cpu
  cpus_per_worker: 1
)";

std::string subst(std::string s, const std::string& key, const std::string& v) {
  for (size_t p; (p = s.find(key)) != std::string::npos;) s.replace(p, key.size(), v);
  return s;
}

// nodes 2: one worker each, parallel.shard optimizer (the master weights split over the nodes).
std::string write_spec(const std::string& dir, int seed, const std::string& init,
                       const std::string& ckpt, int nodes = 1) {
  std::string s =
      subst(subst(subst(kSpec, "{seed}", std::to_string(seed)), "{init}", init), "{ckpt}", ckpt);
  s = subst(subst(subst(s, "{nodes}", std::to_string(nodes)), "{wpn}", nodes == 1 ? "2" : "1"),
            "{shard}", nodes == 1 ? "none" : "optimizer");
  const std::string path = dir + "/spec.yaml";
  std::ofstream(path) << s;
  return path;
}

struct JobRun {
  int status = -1;
  std::map<int64_t, double> loss;
  std::map<int64_t, std::string> hash;
  std::string log, err;
  json initialised;  // the initialised_from event (null: none)
};

// Runs the job on `nodes` ringd processes; the status is node 0's, or the first other non-zero.
JobRun run_ringd(const std::string& dir, const std::string& spec,
                 std::vector<std::string> extra = {}, int nodes = 1) {
  ring::test::ProcOptions o = ring::test::ucx_loopback();
  o.kill_on_timeout = true;
  JobRun r;
  {
    std::vector<std::unique_ptr<ring::test::Proc>> procs;
    for (int k = 0; k < nodes; ++k) {
      std::vector<std::string> args = {RINGD_BIN,
                                       "--spec",
                                       spec,
                                       "--job-dir",
                                       dir + "/job",
                                       "--json",
                                       "--hash-weights",
                                       "--worker-threads",
                                       "1",
                                       "--worker-bin",
                                       RING_WORKER,
                                       "--threads",
                                       "1"};
      if (nodes > 1)
        for (std::string s :
             {std::string("--nodes"), std::to_string(nodes), std::string("--node-rank"),
              std::to_string(k), std::string("--rendezvous"), dir + "/rdv"})
          args.push_back(s);
      args.insert(args.end(), extra.begin(), extra.end());
      const std::string out = k == 0 ? dir + "/out" : dir + "/out-" + std::to_string(k);
      procs.push_back(std::make_unique<ring::test::Proc>(args, out, out + ".err", o));
    }
    for (int k = 0; k < nodes; ++k) {
      const int st = procs[k]->wait(180);
      if (k == 0 || (r.status == 0 && st != 0)) r.status = st;
    }
  }
  for (const json& j : json_lines(dir + "/out")) {
    if (j.value("event", "") == "initialised_from") r.initialised = j;
    if (j.contains("event") || !j.contains("step") || !j.contains("loss")) continue;
    r.loss[j["step"]] = j["loss"].get<double>();
    if (j.contains("weights_xxh")) r.hash[j["step"]] = j["weights_xxh"];
  }
  r.log = slurp(dir + "/job/logs/ringd-0.log");
  r.err = slurp(dir + "/out.err");
  return r;
}

// The initial weights of a job with train.seed `seed` (rank 0's init) written as a one-node
// checkpoint of master/<param> tensors, step 0. `skip`: a parameter left out; `reshape`: a
// parameter written with its first dimension doubled.
void write_init_checkpoint(const std::string& spec_path, const std::string& dir,
                           const std::string& skip = "", const std::string& reshape = "") {
  auto loaded = ring::spec::load_spec_file(spec_path, ring::spec::job_spec_options());
  ASSERT_TRUE(loaded.ok());
  std::string err;
  auto be = ring::kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(be) << err;
  ring::model::Model m(ring::model::ModelConfig::from_spec(*loaded.spec), be.get(), nullptr);
  m.init_params(static_cast<uint64_t>(loaded.spec->train.seed));
  static std::vector<std::vector<float>> keep;  // alive until the checkpoint is written
  keep.clear();
  ring::ckpt::Options co;
  co.dir = dir;
  co.fsync = false;
  ring::ckpt::Checkpointer ck(co);
  for (const auto& v : m.layout().views()) {
    if (v.name == skip) continue;
    std::vector<int64_t> shape = v.shape;
    std::vector<float> data(m.params() + v.offset, m.params() + v.offset + v.size);
    if (v.name == reshape) {
      shape[0] *= 2;
      data.resize(static_cast<size_t>(v.size * 2), 0.f);
    }
    keep.push_back(std::move(data));
    ck.add_tensor("master/" + v.name, ring::ckpt::DType::kF32, shape, keep.back().data());
  }
  ck.start(0);
  ring::ckpt::SaveResult r = ck.wait();
  ASSERT_TRUE(r.ok) << r.error;
}

}  // namespace

TEST(InitFrom, StartsFromTheCheckpointsWeightsWithAFreshOptimizer) {
  TempDir t("init-from");
  // The reference: random init with seed 7.
  std::filesystem::create_directories(t.path + "/a");
  const JobRun a = run_ringd(t.path + "/a", write_spec(t.path + "/a", 7, "", ""));
  ASSERT_TRUE(WIFEXITED(a.status) && WEXITSTATUS(a.status) == 0) << a.err << a.log;
  ASSERT_EQ(a.loss.size(), 6u) << a.log;
  // Seed 7's initial weights as a checkpoint; the job with init_from has seed 99.
  write_init_checkpoint(t.path + "/a/spec.yaml", t.path + "/init");
  for (const std::string& init : {t.path + "/init", t.path + "/init/step-00000000"}) {
    SCOPED_TRACE(init);
    const std::string d = t.path + "/b" + std::to_string(init.size());
    std::filesystem::create_directories(d);
    const JobRun b = run_ringd(d, write_spec(d, 99, init, ""));
    ASSERT_TRUE(WIFEXITED(b.status) && WEXITSTATUS(b.status) == 0) << b.err << b.log;
    EXPECT_NE(b.log.find("master weights initialised from " + t.path + "/init/step-00000000"),
              std::string::npos)
        << b.log;
    EXPECT_EQ(b.initialised.value("path", ""), t.path + "/init/step-00000000");
    EXPECT_EQ(b.initialised.value("step", -1), 0);
    ASSERT_EQ(b.loss.size(), 6u) << b.log;
    // Step 1's loss is the forward of the checkpoint's weights: the reference's first loss.
    EXPECT_EQ(b.loss.at(1), a.loss.at(1));
    for (int64_t s = 1; s <= 6; ++s) {
      EXPECT_EQ(b.loss.at(s), a.loss.at(s)) << "step " << s;
      EXPECT_EQ(b.hash.at(s), a.hash.at(s)) << "step " << s;
    }
    EXPECT_LT(b.loss.at(6), b.loss.at(1));
    std::printf("init_from %s: loss step 1 %.6f, step 6 %.6f\n", init.c_str(), b.loss.at(1),
                b.loss.at(6));
  }
  // Random init with seed 99 differs: the weights really came from the checkpoint.
  std::filesystem::create_directories(t.path + "/c");
  const JobRun c = run_ringd(t.path + "/c", write_spec(t.path + "/c", 99, "", ""));
  ASSERT_TRUE(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) << c.err << c.log;
  EXPECT_NE(c.loss.at(1), a.loss.at(1));
}

TEST(InitFrom, RefusesAMissingTensorOrAnotherShapeNamingIt) {
  TempDir t("init-from");
  const std::string spec = write_spec(t.path, 7, "", "");
  write_init_checkpoint(spec, t.path + "/missing", "layers.1.mlp.w_down");
  write_init_checkpoint(spec, t.path + "/shape", "", "layers.0.attn.wk");
  struct Case {
    std::string dir, want;
  } cases[] = {
      {t.path + "/missing", "no shard has tensor 'master/layers.1.mlp.w_down'"},
      {t.path + "/shape",
       "tensor 'master/layers.0.attn.wk' is f32 [64, 64], this job expects "
       "f32 [32, 64]"},
      {t.path + "/nothing-here", "is not a directory"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.dir);
    const std::string d = k.dir + "-job";
    std::filesystem::create_directories(d);
    const JobRun r = run_ringd(d, write_spec(d, 7, k.dir, ""));
    ASSERT_TRUE(WIFEXITED(r.status)) << r.status;
    EXPECT_EQ(WEXITSTATUS(r.status), 1) << r.log;
    EXPECT_NE(r.log.find("cannot initialise from model.init_from"), std::string::npos) << r.log;
    EXPECT_NE(r.log.find(k.want), std::string::npos) << r.log;
    EXPECT_TRUE(r.loss.empty());
  }
}

TEST(InitFrom, AResumeFromCheckpointDirWins) {
  TempDir t("init-from");
  std::filesystem::create_directories(t.path + "/a");
  // A run with checkpoints: its final checkpoint is step 6.
  const std::string spec_a = write_spec(t.path + "/a", 7, "", t.path + "/ckpt");
  const JobRun a = run_ringd(t.path + "/a", spec_a);
  ASSERT_TRUE(WIFEXITED(a.status) && WEXITSTATUS(a.status) == 0) << a.err << a.log;
  write_init_checkpoint(spec_a, t.path + "/init");
  // The same job with init_from, resumed: checkpoint.dir's step 6 wins (nothing left to do).
  std::filesystem::create_directories(t.path + "/b");
  const JobRun b =
      run_ringd(t.path + "/b", write_spec(t.path + "/b", 7, t.path + "/init", t.path + "/ckpt"),
                {"--resume"});
  ASSERT_TRUE(WIFEXITED(b.status) && WEXITSTATUS(b.status) == 0) << b.err << b.log;
  EXPECT_NE(b.log.find("not used: resuming from checkpoint.dir"), std::string::npos) << b.log;
  EXPECT_NE(b.log.find("resuming from " + t.path + "/ckpt/step-00000006"), std::string::npos)
      << b.log;
  EXPECT_TRUE(b.initialised.is_null());
}

// ring-worker alone (single process, AdamW in it): the same checkpoint gives the same losses as
// the random init it holds.
TEST(InitFrom, RingWorkerAloneStartsFromTheCheckpoint) {
  TempDir t("init-from");
  auto losses = [&](const std::string& name, int seed, const std::string& init, bool ok = true) {
    const std::string d = t.path + "/" + name;
    std::filesystem::create_directories(d);
    const std::string spec = write_spec(d, seed, init, "");
    ring::test::Proc p({RING_WORKER, "--spec", spec, "--single-rank", "--steps", "4", "--threads",
                        "1", "--log-json", d + "/steps.jsonl"},
                       d + "/out", d + "/out");
    const int st = p.wait(120);
    EXPECT_TRUE(WIFEXITED(st) && (WEXITSTATUS(st) == 0) == ok) << st << slurp(d + "/out");
    std::vector<double> l;
    for (const json& j : json_lines(d + "/steps.jsonl"))
      if (j.contains("loss") && j.contains("step")) l.push_back(j["loss"].get<double>());
    return std::make_pair(l, slurp(d + "/out"));
  };
  const auto [a, a_out] = losses("a", 7, "");
  ASSERT_EQ(a.size(), 4u) << a_out;
  write_init_checkpoint(t.path + "/a/spec.yaml", t.path + "/init");
  const auto [b, b_out] = losses("b", 99, t.path + "/init");
  EXPECT_EQ(b, a) << b_out;
  const auto [c, c_out] = losses("c", 99, t.path + "/nothing-here", false);
  EXPECT_NE(c_out.find("cannot initialise from model.init_from: " + t.path +
                       "/nothing-here is not a directory"),
            std::string::npos)
      << c_out;
}

// Two nodes with parallel.shard optimizer: each node loads the master tensors of its own range
// from the one-node checkpoint; the run equals the same job from random init.
TEST(InitFrom, TwoNodesWithShardOptimizerStartFromTheCheckpoint) {
  TempDir t("init-from");
  std::filesystem::create_directories(t.path + "/a");
  const JobRun a = run_ringd(t.path + "/a", write_spec(t.path + "/a", 7, "", "", 2), {}, 2);
  ASSERT_TRUE(WIFEXITED(a.status) && WEXITSTATUS(a.status) == 0) << a.err << a.log;
  ASSERT_EQ(a.loss.size(), 6u) << a.log;
  write_init_checkpoint(t.path + "/a/spec.yaml", t.path + "/init");
  std::filesystem::create_directories(t.path + "/b");
  const JobRun b =
      run_ringd(t.path + "/b", write_spec(t.path + "/b", 99, t.path + "/init", "", 2), {}, 2);
  ASSERT_TRUE(WIFEXITED(b.status) && WEXITSTATUS(b.status) == 0) << b.err << b.log;
  EXPECT_NE(b.log.find("master weights initialised from " + t.path + "/init/step-00000000"),
            std::string::npos)
      << b.log;
  ASSERT_EQ(b.loss.size(), 6u) << b.log;
  for (int64_t s = 1; s <= 6; ++s) {
    EXPECT_EQ(b.loss.at(s), a.loss.at(s)) << "step " << s;
    EXPECT_EQ(b.hash.at(s), a.hash.at(s)) << "step " << s;
  }
  std::printf("init_from on 2 nodes, shard optimizer: loss step 1 %.6f, step 6 %.6f\n",
              b.loss.at(1), b.loss.at(6));
}
