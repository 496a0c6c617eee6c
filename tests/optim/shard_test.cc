// parallel.shard optimizer in ring_optim (daemon/optim): N NodeOptimizers in threads over an
// InProcessExchange, each fed its own gradients, once with shard none and once with shard
// optimizer, for N = 1..4 nodes x {dense, top-k + error feedback with the dense update, top-k
// lazy} x grad_clip {0, 1}, 8 steps (top-k: step 1 is a dense warm-up step). After every step the
// full weights each node gathered, grad_norm (bits), clipped and the changed coordinates are the
// same as with shard none: in process every sum is a left fold in node order (reduce_sum to the
// owner and allreduce_sum fold alike; the per-bucket sums of squares have one non-zero term), so
// the bits agree for any N. Each node keeps master and moments of its range only (equal to that
// slice of shard none's), and its checkpoint tensors are that range's plus its residual. With
// more nodes than buckets a node owns nothing and still takes part.
//
// Top-k runs both ways (optimizer.compress_at): sender (each node selects from its own gradient
// + a full-size residual) and owner (each range's owner selects from the nodes' summed gradient
// + its range's residual). At the owner the result does not depend on the node count or the
// shard mode: shard none, optimizer and full on 1-4 nodes give the bits of one node fed the
// gradient summed in node order (TopkAtOwner* below).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/contract/model_config.h"
#include "common/spec/parse.h"
#include "daemon/optim/node_optimizer.h"

namespace ring::optim {
namespace {

spec::JobSpec load(const std::string& optimizer, double grad_clip, const char* shard,
                   int layers = 3) {
  const std::string yaml =
      "job: {name: shard-test}\n"
      "model: {layers: " + std::to_string(layers) +
      ", d_model: 64, heads: 4, kv_heads: 2, mlp: swiglu, vocab: 256}\n"
      "data: {source: passkey, seq_len: 128, passkey_digits: 5, seed: 7}\n"
      "parallel: {shard: " + std::string(shard) + ", context_ranks: 2}\n"
      "optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, schedule: cosine, lr_warmup_steps: 2, "
      "weight_decay: 0.1, offload: cpu, " + optimizer + "}\n"
      "train: {steps: 20, grad_clip: " + std::to_string(grad_clip) +
      ", seed: 1, log_every: 10}\n"
      "resources: {nodes: 2, workers_per_node: 1, backend: cpu, host_memory_gb: 4}\n";
  spec::LoadResult r = spec::load_spec_string(yaml, "shard_test.yaml");
  for (const auto& d : r.diagnostics) {
    if (d.str().find("error") != std::string::npos) ADD_FAILURE() << d.str();
  }
  if (!r.ok()) throw std::runtime_error("invalid test spec");
  return *r.spec;
}

const char* kDense = "compression: none";
const char* kTopkDense = "compression: topk, density: 0.02, warmup_steps: 1, error_feedback: true";
const char* kTopkLazy =
    "compression: topk, density: 0.02, warmup_steps: 1, error_feedback: true, update: lazy";
const char* kSenderTopkDense =
    "compression: topk, density: 0.02, warmup_steps: 1, error_feedback: true, "
    "compress_at: sender";
const char* kSenderTopkLazy =
    "compression: topk, density: 0.02, warmup_steps: 1, error_feedback: true, update: lazy, "
    "compress_at: sender";

// Gradient-like values (zero in the alignment gaps), different per seed; large enough that
// grad_clip 1 clips (norm of one node's gradient ~ 3).
std::vector<float> make_grad(const contract::ParamLayout& layout, uint64_t seed) {
  std::vector<float> g(layout.total(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const contract::ParamView& v : layout.views()) {
    const float scale = std::pow(10.f, -static_cast<float>(rng() % 3)) * 0.02f;
    for (int64_t i = 0; i < v.size; ++i) g[v.offset + i] = nd(rng) * scale;
  }
  return g;
}

struct StepView {
  std::vector<float> weights;  // node 0's gathered full weights
  double grad_norm = 0;
  bool clipped = false, all_changed = true;
  int64_t changed_count = 0;
  std::vector<int64_t> changed;
  int64_t bytes_weights = 0;
};

struct Run {
  std::vector<std::vector<StepView>> steps;            // [node][step]
  std::vector<std::vector<std::vector<float>>> state;  // [node][kind]: master, adam_m, adam_v
  std::vector<contract::NodeRange> ranges;
  std::vector<int64_t> master_floats, state_bytes;
  std::vector<size_t> tensors, saved_tensors;
};

// sum_of > 0: every node is fed the sum of the gradients of nodes 0 .. sum_of-1 (a left fold in
// node order), as shard full's workers hand their owner the job's sum (and as one node that
// stands for sum_of nodes would see it). Shard full's nodes get the buckets of their range only.
Run run_nodes(const spec::JobSpec& spec, int nodes, int steps, int sum_of = 0) {
  const bool full = spec.parallel.shard == spec::ShardMode::kFull;
  const contract::ParamLayout layout(contract::ModelConfig::from_spec(spec));
  const int64_t n = layout.total();
  InProcessExchange ex(nodes, 60.0);
  std::vector<std::unique_ptr<NodeOptimizer>> opts;
  std::vector<std::vector<float>> weights(nodes, std::vector<float>(n, -7.f));
  std::vector<float> init = make_grad(layout, 4);
  for (float& x : init) x *= 10.f;
  Run run;
  run.steps.resize(nodes);
  run.state.resize(nodes);
  for (int i = 0; i < nodes; ++i) {
    opts.push_back(std::make_unique<NodeOptimizer>(spec, layout, 20, 1, ex.endpoint(i)));
    opts.back()->set_weights_buffer(weights[i].data());
    opts.back()->init_master(init.data());
    run.ranges.push_back(opts.back()->range());
    const NodeOptimizer::StateBuffer mb = opts.back()->state_buffer("master");
    run.master_floats.push_back(mb.end - mb.begin);
    run.state_bytes.push_back(opts.back()->state_bytes());
    size_t saved = 0;
    const std::vector<StateTensor> ts = opts.back()->state_tensors();
    for (const StateTensor& t : ts) saved += t.saved;
    run.tensors.push_back(ts.size());
    run.saved_tensors.push_back(saved);
  }
  std::vector<std::string> errors(nodes);
  std::vector<std::thread> threads;
  for (int i = 0; i < nodes; ++i) {
    threads.emplace_back([&, i] {
      try {
        NodeOptimizer& opt = *opts[i];
        opt.publish_all();  // collective: every node's weights buffer gets all of them
        // (shard full: only its range)
        const contract::NodeRange& mine = opt.range();
        const int64_t lo = full ? mine.begin : 0, hi = full ? mine.end : n;
        if (std::memcmp(weights[i].data() + lo, init.data() + lo, sizeof(float) * (hi - lo)) != 0) {
          throw std::runtime_error("publish_all did not gather the initial weights");
        }
        for (int s = 1; s <= steps; ++s) {
          std::vector<float> g = make_grad(layout, 1000 * s + (sum_of > 0 ? 0 : i));
          for (int j = 1; j < sum_of; ++j) {
            const std::vector<float> h = make_grad(layout, 1000 * s + j);
            for (int64_t q = 0; q < n; ++q) g[q] += h[q];
          }
          opt.begin_step(s);
          for (const contract::GradBucket& b : layout.buckets()) {
            const bool owned = b.index >= mine.first_bucket && b.index < mine.end_bucket;
            opt.bucket_ready(b.index, full && !owned ? nullptr : g.data() + b.begin);
          }
          const StepResult r = opt.finish_step();
          // Every bucket's exchange between nodes is reported for ringd's timeline.
          if (nodes > 1 && !full && r.exchanges.size() < layout.buckets().size())
            throw std::runtime_error("step " + std::to_string(s) + ": " +
                                     std::to_string(r.exchanges.size()) + " exchange spans for " +
                                     std::to_string(layout.buckets().size()) + " buckets");
          for (const ExchangeSpan& x : r.exchanges)
            if (x.end < x.begin || x.bucket < 0 ||
                x.bucket >= static_cast<int>(layout.buckets().size()))
              throw std::runtime_error("a malformed exchange span");
          StepView v;
          v.weights = weights[i];
          v.grad_norm = r.grad_norm;
          v.clipped = r.clipped;
          v.all_changed = r.all_changed;
          v.changed_count = r.changed_count;
          v.changed = opt.changed();
          v.bytes_weights = r.bytes_weights;
          run.steps[i].push_back(std::move(v));
        }
        for (const char* kind : {"master", "adam_m", "adam_v", "residual"}) {
          const NodeOptimizer::StateBuffer b = opt.state_buffer(kind);
          run.state[i].emplace_back(b.data, b.data + (b.end - b.begin));
        }
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < nodes; ++i) EXPECT_EQ(errors[i], "") << "node " << i;
  return run;
}

bool same_bits(const void* a, const void* b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

struct Case {
  const char* name;
  const char* optimizer;
};

void expect_shard_matches_none(const Case& c, double grad_clip, int layers = 3, int min_nodes = 1) {
  const int steps = 8;
  for (int nodes = min_nodes; nodes <= 4; ++nodes) {
    SCOPED_TRACE(std::string(c.name) + ", grad_clip " + std::to_string(grad_clip) + ", " +
                 std::to_string(nodes) + " node(s), " + std::to_string(layers) + " layer(s)");
    const spec::JobSpec none = load(c.optimizer, grad_clip, "none", layers);
    const spec::JobSpec shard = load(c.optimizer, grad_clip, "optimizer", layers);
    const contract::ParamLayout layout(contract::ModelConfig::from_spec(none));
    const int64_t n = layout.total();
    const Run a = run_nodes(none, nodes, steps);
    const Run b = run_nodes(shard, nodes, steps);
    ASSERT_FALSE(::testing::Test::HasFailure());
    int clipped = 0, lazy = 0, empty = 0;
    for (const contract::NodeRange& r : b.ranges) empty += r.empty();
    if (nodes > static_cast<int>(layout.buckets().size())) {
      EXPECT_GT(empty, 0) << "more nodes than buckets: some node owns nothing";
    }
    for (int i = 0; i < nodes; ++i) {
      ASSERT_EQ(a.steps[i].size(), static_cast<size_t>(steps));
      ASSERT_EQ(b.steps[i].size(), static_cast<size_t>(steps));
      for (int s = 0; s < steps; ++s) {
        const StepView& x = a.steps[i][s];
        const StepView& y = b.steps[i][s];
        ASSERT_TRUE(same_bits(x.weights.data(), y.weights.data(), sizeof(float) * n))
            << "node " << i << ": weights differ after step " << s + 1;
        ASSERT_TRUE(same_bits(&x.grad_norm, &y.grad_norm, sizeof(double)))
            << "node " << i << " step " << s + 1 << ": grad_norm " << x.grad_norm << " vs "
            << y.grad_norm;
        EXPECT_EQ(x.clipped, y.clipped);
        EXPECT_EQ(x.all_changed, y.all_changed);
        EXPECT_EQ(x.changed_count, y.changed_count);
        EXPECT_EQ(x.changed, y.changed) << "node " << i << " step " << s + 1;
        EXPECT_EQ(x.bytes_weights, 0);
        if (nodes > 1 && b.ranges[i].size() > 0 && y.all_changed) {
          EXPECT_EQ(y.bytes_weights, 4 * b.ranges[i].size() * (nodes - 1));
        }
        if (i == 0) {
          clipped += y.clipped;
          lazy += !y.all_changed;
        }
      }
      // Memory: master and moments of the node's range only, equal to that slice of shard none.
      const contract::NodeRange& r = b.ranges[i];
      EXPECT_EQ(b.master_floats[i], r.size()) << "node " << i;
      EXPECT_EQ(a.master_floats[i], n);
      const bool residual = std::string(c.optimizer).find("topk") != std::string::npos;
      // The residual: the sender's, full size; the owner's, its range.
      const bool sender = std::string(c.optimizer).find("sender") != std::string::npos;
      const int64_t res_floats = residual ? (sender ? n : r.size()) : 0;
      EXPECT_EQ(b.state_bytes[i], 4 * (3 * r.size() + res_floats));
      EXPECT_EQ(a.state_bytes[i], 4 * (3 * n + res_floats));
      EXPECT_EQ(static_cast<int64_t>(a.state[i][3].size()), res_floats);
      for (int k = 0; k < 3; ++k) {
        ASSERT_EQ(b.state[i][k].size(), static_cast<size_t>(r.size()));
        EXPECT_TRUE(r.size() == 0 || same_bits(b.state[i][k].data(), a.state[i][k].data() + r.begin,
                                               sizeof(float) * r.size()))
            << "node " << i << " state kind " << k;
      }
      // Checkpoint tensors: the range's master/adam_m/adam_v + every residual tensor (sender)
      // or the range's (owner), all saved.
      size_t in_range = 0;
      for (const contract::ParamView& pv : layout.views()) in_range += r.contains(pv.offset);
      const size_t views = layout.views().size();
      EXPECT_EQ(b.tensors[i], 3 * in_range + (residual ? (sender ? views : in_range) : 0));
      EXPECT_EQ(b.saved_tensors[i], b.tensors[i]);
    }
    if (grad_clip > 0) {
      EXPECT_GT(clipped, 0) << "the test meant to exercise clipping";
    }
    if (std::string(c.optimizer).find("lazy") != std::string::npos) {
      EXPECT_EQ(lazy, steps - 1);  // step 1 is the dense warm-up step
    }
  }
}

const Case kDenseCase{"dense", kDense};
const Case kTopkDenseCase{"top-k at the owner + error feedback, dense update", kTopkDense};
const Case kTopkLazyCase{"top-k at the owner, lazy", kTopkLazy};
const Case kSenderTopkDenseCase{"top-k at the sender + error feedback, dense update",
                                kSenderTopkDense};
const Case kSenderTopkLazyCase{"top-k at the sender, lazy", kSenderTopkLazy};

TEST(ShardOptimizer, DenseMatchesShardNone) {
  expect_shard_matches_none(kDenseCase, 0.0);
}
TEST(ShardOptimizer, DenseClippedMatchesShardNone) {
  expect_shard_matches_none(kDenseCase, 1.0);
}
TEST(ShardOptimizer, TopkDenseUpdateMatchesShardNone) {
  expect_shard_matches_none(kTopkDenseCase, 0.0);
}
TEST(ShardOptimizer, TopkDenseUpdateClippedMatchesShardNone) {
  expect_shard_matches_none(kTopkDenseCase, 1.0);
}
TEST(ShardOptimizer, TopkLazyMatchesShardNone) {
  expect_shard_matches_none(kTopkLazyCase, 0.0);
}
TEST(ShardOptimizer, TopkLazyClippedMatchesShardNone) {
  expect_shard_matches_none(kTopkLazyCase, 1.0);
}
TEST(ShardOptimizer, SenderTopkDenseUpdateMatchesShardNone) {
  expect_shard_matches_none(kSenderTopkDenseCase, 0.0);
  expect_shard_matches_none(kSenderTopkDenseCase, 1.0);
}
TEST(ShardOptimizer, SenderTopkLazyMatchesShardNone) {
  expect_shard_matches_none(kSenderTopkLazyCase, 0.0);
  expect_shard_matches_none(kSenderTopkLazyCase, 1.0);
}

// Top-k at the owner: shard none, optimizer and full on 1-4 nodes against one node fed the
// gradient summed in node order. Every node's weights (shard full: of its range) and the norm
// after every step, master, moments and residual of each range: the same bits.
void expect_owner_independent_of_nodes(const char* optimizer, double grad_clip, int layers = 3) {
  const int steps = 8;
  for (int nodes = 1; nodes <= 4; ++nodes) {
    SCOPED_TRACE(std::string(optimizer) + ", grad_clip " + std::to_string(grad_clip) + ", " +
                 std::to_string(nodes) + " node(s)");
    const spec::JobSpec none = load(optimizer, grad_clip, "none", layers);
    const contract::ParamLayout layout(contract::ModelConfig::from_spec(none));
    const int64_t n = layout.total();
    const Run ref = run_nodes(none, 1, steps, nodes);
    ASSERT_FALSE(::testing::Test::HasFailure());
    for (const char* mode : {"none", "optimizer", "full"}) {
      SCOPED_TRACE(std::string("shard ") + mode);
      const bool full = std::string(mode) == "full";
      const Run run =
          run_nodes(load(optimizer, grad_clip, mode, layers), nodes, steps, full ? nodes : 0);
      ASSERT_FALSE(::testing::Test::HasFailure());
      for (int i = 0; i < nodes; ++i) {
        const contract::NodeRange& r = run.ranges[i];
        const int64_t lo = full ? r.begin : 0, len = full ? r.size() : n;
        for (int s = 0; s < steps; ++s) {
          const StepView& x = ref.steps[0][s];
          const StepView& y = run.steps[i][s];
          ASSERT_TRUE(same_bits(x.weights.data() + lo, y.weights.data() + lo, sizeof(float) * len))
              << "node " << i << ": weights differ after step " << s + 1;
          ASSERT_TRUE(same_bits(&x.grad_norm, &y.grad_norm, sizeof(double)))
              << "node " << i << " step " << s + 1 << ": grad_norm " << x.grad_norm << " vs "
              << y.grad_norm;
          EXPECT_EQ(x.clipped, y.clipped);
          EXPECT_EQ(x.all_changed || full, y.all_changed);
          if (!full) {
            EXPECT_EQ(x.changed, y.changed) << "node " << i << " step " << s + 1;
          }
        }
        // Master, moments (sharded: the range; none: everything) and residual (the range).
        for (int k = 0; k < 4; ++k) {
          const bool ranged = k == 3 || std::string(mode) != "none";
          const std::vector<float>& mine = run.state[i][k];
          ASSERT_EQ(static_cast<int64_t>(mine.size()), ranged ? r.size() : n) << "kind " << k;
          EXPECT_TRUE(mine.empty() ||
                      same_bits(mine.data(), ref.state[0][k].data() + (ranged ? r.begin : 0),
                                sizeof(float) * mine.size()))
              << "node " << i << " state kind " << k;
        }
      }
    }
  }
}

TEST(TopkAtOwner, DenseUpdateIndependentOfNodesAndShardMode) {
  expect_owner_independent_of_nodes(kTopkDense, 0.0);
  expect_owner_independent_of_nodes(kTopkDense, 1.0);
}
TEST(TopkAtOwner, LazyIndependentOfNodesAndShardMode) {
  expect_owner_independent_of_nodes(kTopkLazy, 0.0);
  expect_owner_independent_of_nodes(kTopkLazy, 1.0);
}
// One layer, 3 buckets: on 4 nodes one node owns nothing (and holds no residual).
TEST(TopkAtOwner, ANodeOwningNothingStillMatches) {
  expect_owner_independent_of_nodes(kTopkLazy, 1.0, 1);
}

// A shard none node sends its dense gradient of the ranges it does not own (4 bytes a float)
// and the sparse set of its own range; sender mode sends only sparse sets.
TEST(TopkAtOwner, ShardNoneSendsTheDenseGradientToTheOwners) {
  const spec::JobSpec owner = load(kTopkDense, 0.0, "none");
  const spec::JobSpec sender = load(kSenderTopkDense, 0.0, "none");
  const contract::ParamLayout layout(contract::ModelConfig::from_spec(owner));
  for (const spec::JobSpec* spec : {&owner, &sender}) {
    InProcessExchange ex(2, 60.0);
    std::vector<int64_t> bytes(2), selected(2);
    std::vector<contract::NodeRange> ranges(2);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        NodeOptimizer opt(*spec, layout, 20, 1, ex.endpoint(i));
        std::vector<float> init(layout.total(), 0.5f);
        opt.init_master(init.data());
        ranges[i] = opt.range();
        for (int s = 1; s <= 2; ++s) {  // step 1 is the dense warm-up
          std::vector<float> g = make_grad(layout, 1000 * s + i);
          opt.begin_step(s);
          for (const contract::GradBucket& b : layout.buckets())
            opt.bucket_ready(b.index, g.data() + b.begin);
          const StepResult r = opt.finish_step();
          bytes[i] = r.bytes_sent;
          selected[i] = r.selected;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 2; ++i) {
      if (spec == &owner) {
        // The other node's range densely, a 4-byte count per bucket, 8 bytes per selected pair.
        EXPECT_EQ(bytes[i], 4 * ranges[1 - i].size() +
                                4 * static_cast<int64_t>(layout.buckets().size()) + 8 * selected[i])
            << "node " << i;
        EXPECT_GT(selected[i], 0) << "node " << i;
      } else {
        EXPECT_EQ(bytes[i], 4 * static_cast<int64_t>(layout.buckets().size()) + 8 * selected[i]);
      }
    }
  }
}

// One layer: 3 buckets, so with 4 nodes one node owns nothing (it only sends and receives).
TEST(ShardOptimizer, ANodeOwningNothingStillMatches) {
  expect_shard_matches_none(kDenseCase, 1.0, 1, 4);
  expect_shard_matches_none(kTopkLazyCase, 0.0, 1, 4);
}

TEST(ShardOptimizer, NeedsAWeightsBuffer) {
  const spec::JobSpec spec = load(kDense, 0.0, "optimizer");
  const contract::ParamLayout layout(contract::ModelConfig::from_spec(spec));
  LocalExchange one;
  NodeOptimizer opt(spec, layout, 20, 1, &one);
  EXPECT_TRUE(opt.sharded());
  EXPECT_EQ(opt.weights(), nullptr);
  std::string msg;
  try {
    opt.begin_step(1);
  } catch (const OptimError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("set_weights_buffer"), std::string::npos) << msg;
}

// A failing exchange on a bucket's reduce names the node and the bucket.
class FailingReduce final : public Exchange {
 public:
  int node() const override { return 1; }
  int nodes() const override { return 2; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  std::vector<std::vector<uint8_t>> allgather(const void*, int64_t) override { return {}; }
  void reduce_sum(float*, int64_t, int) override {
    throw std::runtime_error("node 0 did not answer");
  }
};

TEST(ShardOptimizer, ExchangeFailureNamesNodeAndBucket) {
  const spec::JobSpec spec = load(kDense, 0.0, "optimizer");
  const contract::ParamLayout layout(contract::ModelConfig::from_spec(spec));
  FailingReduce ex;
  NodeOptimizer opt(spec, layout, 20, 1, &ex);
  std::vector<float> w(layout.total(), 0.f), g = make_grad(layout, 3);
  opt.set_weights_buffer(w.data());
  opt.init_master(w.data());
  opt.begin_step(1);
  for (const contract::GradBucket& b : layout.buckets())
    opt.bucket_ready(b.index, g.data() + b.begin);
  std::string msg;
  try {
    opt.finish_step();
  } catch (const OptimError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("node 1, step 1, bucket 0: reduce failed: node 0 did not answer"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace ring::optim
