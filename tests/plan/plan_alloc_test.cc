// `ringctl plan`'s host memory per node (common/plan) against what the code allocates for the
// same spec: ringd's NodeOptimizer (its state buffers and the heap it takes), StepDriver's node
// gradient and the node's ShmRegion, for shard none, optimizer and full on 1, 2 and 4 nodes; and the
// planner's division of the layout against contract::shard_ranges.
#include <malloc.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "common/contract/model_config.h"
#include "common/contract/shard.h"
#include "common/contract/shm.h"
#include "common/plan/plan.h"
#include "common/spec/parse.h"
#include "daemon/optim/node_optimizer.h"
#include "daemon/ringd/step_driver.h"
#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring {
namespace {

// Bytes the process's heap holds now (every arena, mmap'd chunks included).
double heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd);
}

// Small enough for a unit test, large enough that every state buffer is a separate mapping
// (2 MB): a 2-block model, top-k with error feedback so that every kind of state exists.
std::string spec_text(const std::string& shard, int nodes, int workers, const std::string& comp) {
  return fmt::format(R"(job: {{name: plan-alloc}}
model: {{layers: 2, d_model: 128, heads: 4, mlp: swiglu, vocab: 256, tie_embeddings: false}}
data: {{source: passkey, seq_len: 512}}
parallel: {{context_ranks: {}, shard: {}}}
optimizer: {{offload: cpu, {}}}
train: {{steps: 4}}
resources: {{backend: cpu, nodes: {}, workers_per_node: {}, cpus_per_worker: 1}}
)",
                     nodes * workers, shard, comp, nodes, workers);
}

spec::JobSpec load(const std::string& text) {
  spec::LoadOptions o;
  o.runtime_limits_are_errors = false;
  auto r = spec::load_spec_string(text, "plan-alloc.yaml", o);
  if (!r.ok()) ADD_FAILURE() << (r.diagnostics.empty() ? "" : r.diagnostics[0].str());
  return r.ok() ? *r.spec : spec::JobSpec{};
}

double item(const std::vector<plan::Item>& items, const std::string& prefix) {
  for (const auto& i : items)
    if (i.name.rfind(prefix, 0) == 0) return i.bytes;
  return -1;  // not listed
}

struct Case {
  std::string shard;
  int nodes;
  std::string compression;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "shard " << c.shard << ", " << c.nodes << " node(s), " << c.compression;
}

class PlanAllocation : public ::testing::TestWithParam<Case> {};

TEST_P(PlanAllocation, HostLinesAreWhatRingdAllocates) {
  const Case c = GetParam();
  constexpr int kWorkers = 2;
  const spec::JobSpec s = load(spec_text(c.shard, c.nodes, kWorkers, c.compression));
  const plan::Plan p = plan::make_plan(s);
  const contract::ParamLayout layout(contract::ModelConfig::from_spec(s));
  const int64_t n = layout.total();
  ASSERT_EQ(p.flat_floats, n);
  const bool topk = s.optimizer.compression == spec::Compression::kTopk;
  const bool ef = topk && s.optimizer.error_feedback;

  // Every node's optimizer, as each node's ringd builds it; the plan sizes the largest.
  optim::InProcessExchange ex(c.nodes);
  double state_max = 0, heap_max = 0, resid_max = 0;
  bool sharded_build = true;
  for (int k = 0; k < c.nodes; ++k) {
    const double before = heap_bytes();
    auto opt = std::make_unique<optim::NodeOptimizer>(s, layout, 4, 1, ex.endpoint(k));
    const double heap = heap_bytes() - before;
    double state = 0;
    for (const char* kind : {"master", "adam_m", "adam_v"}) {
      const auto b = opt->state_buffer(kind);
      ASSERT_NE(b.data, nullptr) << kind;
      state += 4.0 * static_cast<double>(b.end - b.begin);
    }
    const auto r = opt->state_buffer("residual");
    EXPECT_EQ(r.data != nullptr, ef);
    // The residual: full size at the sender (compress_at sender), or at the owner (the default,
    // and shard full) the node's range (the largest node's is the plan's).
    if (ef) resid_max = std::max(resid_max, 4.0 * static_cast<double>(r.end - r.begin));
    sharded_build &= c.nodes == 1 || state < 12.0 * static_cast<double>(n);
    state_max = std::max(state_max, state);
    heap_max = std::max(heap_max, heap);
  }
  if (ef) {
    EXPECT_EQ(resid_max, item(p.host_ringd, "error-feedback"));
  }
  const double planned_state = item(p.host_ringd, "optimizer master");
  if (s.parallel.shard == spec::ShardMode::kNone || sharded_build) {
    EXPECT_EQ(state_max, planned_state);
  } else {
    // This build's NodeOptimizer keeps the whole state with shard optimizer: the plan's figure
    // is the range the sharded optimizer keeps, which this build does not yet allocate.
    EXPECT_EQ(state_max, 12.0 * static_cast<double>(n));
    EXPECT_EQ(planned_state, 12.0 * static_cast<double>(p.largest_range));
  }
  // The heap the optimizer takes: its state, residual and top-k scratch (each rounded up to
  // 64 bytes by the CPU backend) plus bookkeeping of a few KiB.
  double planned_heap = sharded_build ? planned_state : 12.0 * static_cast<double>(n);
  if (ef) planned_heap += item(p.host_ringd, "error-feedback");
  if (topk) planned_heap += item(p.host_ringd, "top-k scratch");
  EXPECT_GE(heap_max, planned_heap);
  EXPECT_LE(heap_max, planned_heap + 64 * 1024) << "unplanned heap in NodeOptimizer";

  const bool full = s.parallel.shard == spec::ShardMode::kFull;
  int64_t largest = 0;
  for (const auto& r : contract::shard_ranges(layout, c.nodes)) largest = std::max(largest, r.size());
  // The largest node: the one ringd's plan sizes.
  int big = 0;
  const auto ranges = contract::shard_ranges(layout, c.nodes);
  for (int k = 0; k < c.nodes; ++k)
    if (ranges[k].size() == largest) big = k;

  // StepDriver's node gradient (shard full: the range's only).
  {
    const double before = heap_bytes();
    std::unique_ptr<ringd::StepDriver> d;
    if (full) {
      const auto shards = contract::worker_shards(layout, c.nodes, kWorkers);
      d = std::make_unique<ringd::StepDriver>(
          layout, ranges[big],
          std::vector<contract::WorkerShard>(shards.begin() + big * kWorkers,
                                             shards.begin() + (big + 1) * kWorkers));
    } else {
      d = std::make_unique<ringd::StepDriver>(layout);
    }
    EXPECT_NEAR(heap_bytes() - before, item(p.host_ringd, "node gradient"), 4096);
    EXPECT_EQ(item(p.host_ringd, "node gradient"), 4.0 * static_cast<double>(full ? largest : n));
  }

  // The node's shared-memory segment, byte for byte (ringd's AttemptResources::create_shm).
  contract::ShmShape shape = contract::ShmShape::whole(n, kWorkers);
  if (full) {
    shape.params_begin = ranges[big].begin;
    shape.params_n = ranges[big].size();
    shape.index_n = 0;
    shape.slot_n = contract::largest_worker_shard(layout, c.nodes, kWorkers);
    EXPECT_EQ(shape.slot_n, p.worker_shard);
  }
  auto shm = contract::ShmRegion::create(
      contract::shm_name("plan-alloc-test", 0, static_cast<int>(getpid()), c.nodes), shape);
  shm.unlink();
  EXPECT_EQ(static_cast<double>(shm.bytes()), p.host_shm_total);
  if (!full) {
    EXPECT_EQ(p.host_shm_total, plan::shm_bytes(n, kWorkers));
  }

  // The largest node's range is contract::shard_ranges'.
  EXPECT_EQ(p.largest_range, s.parallel.shard == spec::ShardMode::kNone ? n : largest);
  // No checkpoint directory: no checkpoint staging.
  EXPECT_EQ(item(p.host_ringd, "checkpoint staging"), -1);
  // The weights are gathered into the shared segment: ringd has no receive buffer of its own.
  EXPECT_EQ(item(p.host_ringd, "weight all-gather"), -1);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, PlanAllocation,
    ::testing::Values(Case{"none", 1, "compression: none"},
                      Case{"none", 2, "compression: topk, error_feedback: true"},
                      Case{"none", 4, "compression: topk, error_feedback: false"},
                      Case{"none", 4, "compression: topk, error_feedback: true"},
                      Case{"none", 2,
                           "compression: topk, error_feedback: true, compress_at: sender"},
                      Case{"optimizer", 1, "compression: topk, error_feedback: true"},
                      Case{"optimizer", 2, "compression: none"},
                      Case{"optimizer", 2, "compression: topk, error_feedback: true"},
                      Case{"optimizer", 4, "compression: topk, error_feedback: true"},
                      Case{"optimizer", 4,
                           "compression: topk, error_feedback: true, compress_at: sender"},
                      Case{"full", 1, "compression: none"},
                      Case{"full", 2, "compression: topk, error_feedback: true"},
                      Case{"full", 4, "compression: topk, error_feedback: false"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return fmt::format("{}_{}nodes_{}", i.param.shard, i.param.nodes,
                         i.param.compression.find("topk") == std::string::npos ? "dense"
                         : i.param.compression.find("sender") != std::string::npos
                             ? "topk_ef_sender"
                         : i.param.compression.find("true") != std::string::npos ? "topk_ef"
                                                                                  : "topk");
    });

// A worker's weights and gradients (fp32 here) are the Model's two flat buffers of n floats: the
// heap the Model takes at construction (before any activation exists).
TEST(PlanWorker, WeightsAndGradientsAreTheModelsBuffers) {
  const spec::JobSpec s = load(spec_text("none", 1, 1, "compression: none"));
  const plan::Plan p = plan::make_plan(s);
  std::string err;
  auto backend = kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(backend) << err;
  model::LocalAttention attention(backend.get());
  const double before = heap_bytes();
  model::Model m(contract::ModelConfig::from_spec(s), backend.get(), &attention);
  const double heap = heap_bytes() - before;
  const double planned = item(p.worker, "weights") + item(p.worker, "weight gradients");
  EXPECT_EQ(planned, 8.0 * static_cast<double>(m.layout().total()));
  EXPECT_GE(heap, planned);
  EXPECT_LE(heap, planned + 64 * 1024);
  // The offloaded rank keeps no host copy of the weights or the gradient (rank_offloaded.cc).
  EXPECT_TRUE(p.worker_host.empty());
  for (const auto& i : p.worker) EXPECT_EQ(i.name.find("host copy"), std::string::npos) << i.name;
}

// plan::shard_range_sizes divides the layout as contract::shard_ranges does, for models whose
// buckets differ in size and for more nodes than buckets.
TEST(PlanShardRanges, MatchTheContractsDivision) {
  const std::vector<std::string> models = {
      "{layers: 2, d_model: 64, heads: 4}",
      "{layers: 5, d_model: 72, heads: 6, kv_heads: 2, tie_embeddings: false, vocab: 301}",
      "{layers: 1, d_model: 40, heads: 5, head_dim: 6, mlp: gelu, mlp_hidden: 33, vocab: 259}",
      "{layers: 9, d_model: 96, heads: 8, kv_heads: 1, mlp_hidden: 17, tie_embeddings: false}",
  };
  for (const auto& m : models) {
    const spec::JobSpec s = load(fmt::format(R"(job: {{name: r}}
model: {}
data: {{source: passkey, seq_len: 128}}
parallel: {{context_ranks: 1}}
train: {{steps: 1}}
resources: {{backend: cpu, nodes: 1, workers_per_node: 1}}
)",
                                             m));
    const contract::ParamLayout layout(contract::ModelConfig::from_spec(s));
    const auto f = plan::flat_layout(s);
    ASSERT_EQ(f.bucket_sizes.size(), layout.buckets().size()) << m;
    for (size_t b = 0; b < f.bucket_sizes.size(); ++b)
      EXPECT_EQ(f.bucket_sizes[b], layout.buckets()[b].end - layout.buckets()[b].begin) << m;
    for (int nodes = 1; nodes <= 13; ++nodes) {
      const auto want = contract::shard_ranges(layout, nodes);
      const auto got = plan::shard_range_sizes(f.bucket_sizes, nodes);
      ASSERT_EQ(got.size(), want.size());
      for (int k = 0; k < nodes; ++k) EXPECT_EQ(got[k], want[k].size()) << m << " nodes " << nodes;
    }
  }
}

}  // namespace
}  // namespace ring
