// ringd's step driver (daemon/ringd/step_driver.h) alone: a real shared-memory region and
// NodeOptimizer for the tiny4 spec, two fake workers writing gradients into their slots, no
// processes. Weights published at the step start, buckets summed in order once every worker
// delivered them, the step's record, checkpoint results.
#include "daemon/ringd/step_driver.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/spec/parse.h"
#include "tests/common/test_proc.h"
#include "common/contract/model_config.h"

namespace {

using namespace ring;
using ringd::StepDriver;
using ringd::Worker;

struct Rig {
  spec::JobSpec spec;
  std::unique_ptr<contract::ParamLayout> layout;
  contract::ShmRegion shm;
  optim::LocalExchange exchange;
  std::unique_ptr<optim::NodeOptimizer> opt;
  std::vector<Worker> workers = std::vector<Worker>(2);

  Rig() {
    spec::LoadResult r =
        spec::load_spec_file(std::string(RING_SOURCE_DIR) + "/tests/ringd/tiny4.yaml");
    if (!r.ok()) throw std::runtime_error("tiny4.yaml does not load");
    spec = *r.spec;
    layout = std::make_unique<contract::ParamLayout>(contract::ModelConfig::from_spec(spec));
    shm = contract::ShmRegion::create(
        contract::shm_name("step-driver-test", 0, static_cast<int>(getpid()), 1), layout->total(),
        2);
    shm.unlink();  // the mapping stays; nothing is left behind
    opt = std::make_unique<optim::NodeOptimizer>(spec, *layout, 10, 1, &exchange);
    for (int l = 0; l < 2; ++l) workers[l].local = workers[l].rank = l;
  }
  int buckets() const { return static_cast<int>(layout->buckets().size()); }
};

TEST(StepDriver, PublishesWeightsSumsBucketsInOrderAndRecordsTheStep) {
  Rig rig;
  StepDriver d(*rig.layout);
  d.reset();
  EXPECT_FALSE(d.have_master());
  const int64_t n = rig.layout->total();
  for (int64_t i = 0; i < n; ++i) rig.shm.params()[i] = 0.001f * static_cast<float>(i % 97);
  d.init_master(*rig.opt, rig.shm);
  EXPECT_TRUE(d.have_master());
  // Rank 0 initialised the master: the first step publishes all of it.
  std::fill(rig.shm.params(), rig.shm.params() + n, -1.f);
  EXPECT_EQ(d.begin_step(rig.workers, rig.shm, *rig.opt), -1);
  EXPECT_EQ(d.cur_step(), 1);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(rig.shm.params()[i], rig.opt->master()[i]) << i;
  // Gradients: 1 in worker 0's slot, 2 in worker 1's.
  std::fill(rig.shm.grads(0), rig.shm.grads(0) + n, 1.f);
  std::fill(rig.shm.grads(1), rig.shm.grads(1) + n, 2.f);
  int handed = 0;
  const auto count = [&] { ++handed; };
  // Worker 1 first: nothing goes to the optimizer until worker 0 delivered the bucket too.
  ASSERT_EQ(d.on_bucket(rig.workers, rig.workers[1], 0, rig.shm, *rig.opt, count), "");
  EXPECT_EQ(handed, 0);
  // Out of order: named, nothing handed.
  EXPECT_EQ(d.on_bucket(rig.workers, rig.workers[0], 1, rig.shm, *rig.opt, count),
            "sent bucket 1 when 0 was due");
  EXPECT_EQ(handed, 0);
  for (int b = 0; b < rig.buckets(); ++b) {
    ASSERT_EQ(d.on_bucket(rig.workers, rig.workers[0], b, rig.shm, *rig.opt, count), "");
    if (b == 0) {
      EXPECT_EQ(handed, 1);  // worker 1 had sent bucket 0 already
      continue;
    }
    EXPECT_EQ(handed, b);  // bucket b waits for worker 1
    ASSERT_EQ(d.on_bucket(rig.workers, rig.workers[1], b, rig.shm, *rig.opt, count), "");
    EXPECT_EQ(handed, b + 1);
  }
  EXPECT_EQ(handed, rig.buckets());
  EXPECT_FALSE(d.step_complete(rig.workers));  // no worker is done yet
  for (Worker& w : rig.workers) {
    w.done = true;
    w.done_msg.step = 1;
    w.done_msg.loss_sum = 12.0;
    w.done_msg.valid = 4;
    w.done_msg.tokens = 8;
    w.done_msg.cursor = {{"pos", w.local}};
  }
  ASSERT_TRUE(d.step_complete(rig.workers));
  const StepDriver::Finished f = d.finish_step(rig.workers, *rig.opt, 3);
  EXPECT_EQ(d.done_step(), 1);
  EXPECT_EQ(d.cur_step(), 0);
  EXPECT_EQ(d.cursor(), (nlohmann::json{{"pos", 0}}));  // rank 0's cursor
  EXPECT_DOUBLE_EQ(f.stats.loss, 3.0);
  EXPECT_EQ(f.record["step"], 1);
  EXPECT_EQ(f.record["attempt"], 3);
  // The node's gradient is 3 everywhere: its norm is 3 sqrt(n).
  EXPECT_NEAR(f.result.grad_norm, 3.0 * std::sqrt(static_cast<double>(n)),
              1e-3 * 3.0 * std::sqrt(static_cast<double>(n)));
  for (const char* k : {"comm_s", "optimizer_s", "exposed_optimizer_s", "bytes_exchanged"})
    EXPECT_TRUE(f.record.contains(k)) << k;
  // The next step publishes the updated weights.
  d.begin_step(rig.workers, rig.shm, *rig.opt);
  EXPECT_EQ(d.cur_step(), 2);
  EXPECT_FALSE(rig.workers[0].done);
  EXPECT_EQ(rig.workers[0].buckets, 0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(rig.shm.params()[i], rig.opt->master()[i]) << i;
}

TEST(StepDriver, ResumeAndCheckpointResults) {
  Rig rig;
  StepDriver d(*rig.layout);
  d.resumed(5, {{"pos", 9}});
  EXPECT_TRUE(d.have_master());
  EXPECT_EQ(d.done_step(), 5);
  EXPECT_EQ(d.cursor(), (nlohmann::json{{"pos", 9}}));
  EXPECT_EQ(d.failed_at_done_step(), nullptr);
  ckpt::SaveResult bad;
  bad.step = 5;
  bad.ok = false;
  bad.error = "No space left on device";
  d.record(bad);
  ASSERT_NE(d.failed_at_done_step(), nullptr);
  EXPECT_EQ(*d.failed_at_done_step(), "No space left on device");
  ckpt::SaveResult good = bad;
  good.ok = true;
  d.record(good);
  EXPECT_EQ(d.failed_at_done_step(), nullptr);
  d.record(bad);  // a later failure of a step already durable does not count
  EXPECT_EQ(d.failed_at_done_step(), nullptr);
  // Results outlive attempts; the step does not.
  d.reset();
  EXPECT_EQ(d.done_step(), 0);
  EXPECT_FALSE(d.have_master());
}

// Two nodes' checkpoints at steps 2 and 4 in `dir` (tensor "w", 64 floats of value node+step).
void write_two_node_checkpoints(const std::string& dir) {
  std::vector<std::vector<float>> w(2, std::vector<float>(64));
  std::vector<std::unique_ptr<ckpt::Checkpointer>> cs;
  for (int node = 0; node < 2; ++node) {
    ckpt::Options o;
    o.dir = dir;
    o.node_rank = node;
    o.nodes = 2;
    o.keep_last = 5;
    o.fsync = false;
    cs.push_back(std::make_unique<ckpt::Checkpointer>(o));
    cs.back()->add_tensor("w", ckpt::DType::kF32, {64}, w[node].data());
  }
  for (int64_t step : {2, 4}) {
    for (int node = 0; node < 2; ++node) std::fill(w[node].begin(), w[node].end(), node + step);
    for (int node = 1; node >= 0; --node) cs[node]->start(step, {{"node", node}});
    for (int node = 1; node >= 0; --node) ASSERT_TRUE(cs[node]->wait().ok);
  }
}

void damage(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(8);
  f.put('\x7f');
}

// Both nodes load in threads over an in-process exchange; returns their results.
std::vector<ckpt::LoadResult> load_both(const std::string& dir) {
  optim::InProcessExchange ex(2, 30);
  std::vector<std::vector<float>> got(2, std::vector<float>(64, -1.f));
  std::vector<ckpt::LoadResult> r(2);
  std::vector<std::thread> ts;
  for (int node = 0; node < 2; ++node)
    ts.emplace_back([&, node] {
      std::vector<ckpt::LoadTarget> t = {{"w", ckpt::DType::kF32, {64}, got[node].data()}};
      r[node] = ringd::load_agreed_checkpoint(dir, node, 2, t, INT64_MAX, *ex.endpoint(node));
    });
  for (auto& t : ts) t.join();
  for (int node = 0; node < 2; ++node)
    if (r[node].loaded) {
      EXPECT_EQ(got[node][0], static_cast<float>(node + r[node].step));
    }
  return r;
}

TEST(StepDriver, EveryNodeResumesFromTheSameStep) {
  test::TempDir t("step-driver");
  write_two_node_checkpoints(t.path + "/ck");
  std::vector<ckpt::LoadResult> r = load_both(t.path + "/ck");
  ASSERT_TRUE(r[0].loaded && r[1].loaded) << r[0].message << r[1].message;
  EXPECT_EQ(r[0].step, 4);
  EXPECT_EQ(r[1].step, 4);
  // Node 1's shard of step 4 is damaged: node 1 falls back to 2, and node 0 follows it.
  damage(t.path + "/ck/step-00000004/node-00001.bin");
  r = load_both(t.path + "/ck");
  ASSERT_TRUE(r[0].loaded && r[1].loaded) << r[0].message << r[1].message;
  EXPECT_EQ(r[0].step, 2);
  EXPECT_EQ(r[1].step, 2);
  // Node 1 has none left: neither resumes, node 0 says why.
  damage(t.path + "/ck/step-00000002/node-00001.bin");
  r = load_both(t.path + "/ck");
  EXPECT_FALSE(r[0].loaded);
  EXPECT_FALSE(r[1].loaded);
  // Issue 31.2: never some nodes from a checkpoint and the others from fresh weights.
  EXPECT_EQ(r[0].message, "node(s) 1 found no usable checkpoint in " + t.path +
                              "/ck (this node could load step-00000004)");
}

// Two nodes in threads over an in-process exchange, each with its own shared memory, optimizer
// and two fake workers, 3 steps; returns each node's shared-memory weights after every step's
// next begin_step (and after the last finish_step).
std::vector<std::vector<std::vector<float>>> run_two_nodes(spec::ShardMode shard) {
  Rig proto;
  spec::JobSpec spec = proto.spec;
  spec.parallel.shard = shard;
  const contract::ParamLayout& layout = *proto.layout;
  const int64_t n = layout.total();
  optim::InProcessExchange ex(2, 30);
  std::vector<std::vector<std::vector<float>>> seen(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int node = 0; node < 2; ++node)
    ts.emplace_back([&, node] {
      try {
        contract::ShmRegion shm = contract::ShmRegion::create(
            contract::shm_name("step-driver-shard", node, static_cast<int>(getpid()), 1), n, 2);
        shm.unlink();
        optim::NodeOptimizer opt(spec, layout, 10, 1, ex.endpoint(node));
        if (shard == spec::ShardMode::kOptimizer &&
            opt.state_buffer("master").end - opt.state_buffer("master").begin >= n)
          throw std::runtime_error("the sharded master holds the whole model");
        std::vector<Worker> workers(2);
        for (int l = 0; l < 2; ++l) workers[l].local = workers[l].rank = l;
        StepDriver d(layout);
        d.reset();
        for (int64_t i = 0; i < n; ++i) shm.params()[i] = 0.001f * static_cast<float>(i % 97);
        const std::vector<float> init(shm.params(), shm.params() + n);
        d.init_master(opt, shm);
        std::fill(shm.params(), shm.params() + n, -1.f);
        for (int step = 1; step <= 3; ++step) {
          if (d.begin_step(workers, shm, opt) != -1) throw std::runtime_error("not dense");
          seen[node].emplace_back(shm.params(), shm.params() + n);
          if (step == 1 && seen[node].back() != init)
            throw std::runtime_error("the first step did not publish the initial weights");
          for (int l = 0; l < 2; ++l)
            for (int64_t i = 0; i < n; ++i)
              shm.grads(l)[i] = 1e-3f * static_cast<float>((i * (node + 2) + l + step) % 13);
          for (int b = 0; b < static_cast<int>(layout.buckets().size()); ++b)
            for (Worker& w : workers)
              if (!d.on_bucket(workers, w, b, shm, opt, [] {}).empty())
                throw std::runtime_error("bucket refused");
          for (Worker& w : workers) {
            w.done = true;
            w.done_msg.step = step;
            w.done_msg.valid = 1;
          }
          d.finish_step(workers, opt, 1);
        }
        seen[node].emplace_back(shm.params(), shm.params() + n);
      } catch (const std::exception& e) {
        errors[node] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  return seen;
}

TEST(StepDriver, ShardOptimizerGathersTheWeightsIntoSharedMemory) {
  const auto none = run_two_nodes(spec::ShardMode::kNone);
  const auto shard = run_two_nodes(spec::ShardMode::kOptimizer);
  ASSERT_EQ(none[0].size(), 4u);
  ASSERT_EQ(shard[0].size(), 4u);
  ASSERT_EQ(shard[1].size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    EXPECT_TRUE(none[0][s] == shard[0][s]) << "after step " << s;
    EXPECT_TRUE(shard[1][s] == shard[0][s]) << "after step " << s;
  }
  EXPECT_FALSE(shard[0][0] == shard[0][3]);  // the weights did change
}

TEST(StepDriver, WeightHashIsAStableFingerprint) {
  // ringd's variant of FNV-1a 64 (its own offset basis): the values in steps.jsonl of earlier
  // runs stay comparable.
  EXPECT_EQ(ringd::fnv1a("", 0), 1469598103934665603ull);
  EXPECT_EQ(ringd::fnv1a("a", 1), 4953267810257967366ull);
  const float w[3] = {1.f, 2.f, 3.f}, v[3] = {1.f, 2.f, 3.5f};
  EXPECT_EQ(ringd::fnv1a(w, sizeof w), ringd::fnv1a(w, sizeof w));
  EXPECT_NE(ringd::fnv1a(w, sizeof w), ringd::fnv1a(v, sizeof v));
}

}  // namespace
