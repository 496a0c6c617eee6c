// parallel.shard full's block store on one rank: with its blocks as host buffers (the CPU
// worker) and staged through a backend's memory (the device worker's path, here through the CPU
// backend, whose copies are exact), the loss and every gradient equal the model's own flat
// buffers bit for bit (two micro-batches: within 1e-6 normwise, see below), with tied and
// untied embeddings and recompute (full and selective: selective is also the bits of no
// recompute, one batch or two).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/worker/full_shard_stage.h"

namespace ring::test {
namespace {

struct Case {
  bool tied, recompute;
  int micro;
  bool selective = false;  // model.recompute_policy selective (with recompute)
};

model::ModelConfig case_model(const Case& c, bool bf16 = false) {
  model::ModelConfig m = stage_model(c.tied, c.recompute, bf16);
  if (c.selective) m.recompute_policy = spec::RecomputePolicy::kSelective;
  return m;
}

// Selective recompute computes what no recompute does: the flat models' gradients agree bit for
// bit, and so do the stores' (`store`: run_store's result for cfg).
void expect_selective_is_no_recompute(const model::ModelConfig& cfg, kernels::Backend* cpu,
                                      const std::vector<float>& params,
                                      const std::vector<StageTokens>& batches,
                                      const StageRun& flat, const StageRun& store) {
  model::ModelConfig none = cfg;
  none.recompute = false;
  const StageRun flat_none = run_flat(none, cpu, params, batches);
  EXPECT_EQ(flat.loss, flat_none.loss);
  EXPECT_EQ(flat.grads, flat_none.grads);
  const StageRun store_none = run_store(none, cpu, nullptr, params, batches);
  EXPECT_EQ(store.loss, store_none.loss);
  EXPECT_EQ(store.grads, store_none.grads);
}

class Stage : public ::testing::TestWithParam<Case> {};

TEST_P(Stage, EqualsTheFlatModelBitForBit) {
  const Case c = GetParam();
  std::string err;
  auto cpu = kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(cpu) << err;
  const model::ModelConfig cfg = case_model(c);
  std::vector<float> params;
  {
    model::LocalAttention attention(cpu.get());
    model::Model m(cfg, cpu.get(), &attention);
    params = m.initial_params(11);
  }
  std::vector<StageTokens> batches;
  for (int i = 0; i < c.micro; ++i) batches.push_back(stage_tokens(200, cfg.vocab, 5 + i));
  const StageRun flat = run_flat(cfg, cpu.get(), params, batches);
  const StageRun host = run_store(cfg, cpu.get(), nullptr, params, batches);
  const StageRun staged = run_store(cfg, cpu.get(), cpu.get(), params, batches);
  ASSERT_EQ(host.grads.size(), flat.grads.size());
  ASSERT_EQ(staged.grads.size(), flat.grads.size());
  // Staging through the backend changes nothing.
  EXPECT_EQ(staged.loss, host.loss);
  EXPECT_EQ(staged.grads, host.grads);
  // One batch: the flat model's bits. Two: the store adds the second batch's block gradient to
  // the first's sum, where the flat model accumulates inside the backward's GEMMs, so the last
  // bits differ: within 1e-6 of the gradient's norm (the ringd tests' micro-batch bound).
  EXPECT_EQ(host.loss, flat.loss);
  size_t differ = 0;
  double diff2 = 0, norm2 = 0;  // normwise: elementwise ratios blow up where a sum cancels
  for (size_t i = 0; i < flat.grads.size(); ++i) {
    const double d = static_cast<double>(host.grads[i]) - flat.grads[i];
    differ += host.grads[i] != flat.grads[i];
    diff2 += d * d;
    norm2 += static_cast<double>(flat.grads[i]) * flat.grads[i];
  }
  if (c.micro == 1) {
    EXPECT_EQ(differ, 0u);
  } else {
    EXPECT_LE(std::sqrt(diff2 / norm2), 1e-6) << differ << " of " << flat.grads.size() << " differ";
  }
  if (c.selective) expect_selective_is_no_recompute(cfg, cpu.get(), params, batches, flat, host);
  // The gradients are not trivially zero.
  double sq = 0;
  for (float g : flat.grads) sq += static_cast<double>(g) * g;
  EXPECT_GT(sq, 1e-8);
}

INSTANTIATE_TEST_SUITE_P(FullShard, Stage,
                         ::testing::Values(Case{false, false, 1}, Case{true, false, 1},
                                           Case{true, true, 1}, Case{false, true, 2},
                                           Case{true, false, 2}, Case{true, true, 1, true},
                                           Case{false, true, 2, true}));

// bf16 (docs/precision.md): the store's gathers carry bf16, which the model widens, or fp32,
// which the model rounds as it acquires a block: the same values, so the loss and every gradient
// equal the flat bf16 model's bits (two micro-batches: the two stores agree bit for bit), host
// and staged. An fp32 model cannot take bf16 blocks: a clear error.
class StageBf16 : public ::testing::TestWithParam<Case> {};

TEST_P(StageBf16, Bf16GathersEqualFp32GathersAndTheFlatModel) {
  const Case c = GetParam();
  std::string err;
  auto cpu = kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(cpu) << err;
  const model::ModelConfig cfg = case_model(c, true);
  std::vector<float> params;
  {
    model::LocalAttention attention(cpu.get());
    model::Model m(cfg, cpu.get(), &attention);
    params = m.initial_params(11);
  }
  std::vector<StageTokens> batches;
  for (int i = 0; i < c.micro; ++i) batches.push_back(stage_tokens(200, cfg.vocab, 5 + i));
  const kernels::DType bf16 = kernels::DType::kBF16;
  const StageRun flat = run_flat(cfg, cpu.get(), params, batches);
  const StageRun f32 = run_store(cfg, cpu.get(), nullptr, params, batches);
  const StageRun host = run_store(cfg, cpu.get(), nullptr, params, batches, bf16);
  const StageRun staged = run_store(cfg, cpu.get(), cpu.get(), params, batches, bf16);
  EXPECT_EQ(host.loss, f32.loss);
  EXPECT_EQ(host.grads, f32.grads);
  EXPECT_EQ(staged.loss, host.loss);
  EXPECT_EQ(staged.grads, host.grads);
  EXPECT_EQ(host.loss, flat.loss);
  if (c.micro == 1) {
    EXPECT_EQ(host.grads, flat.grads);
  }
  if (c.selective) expect_selective_is_no_recompute(cfg, cpu.get(), params, batches, flat, f32);
  // Every block was gathered (one rank: nothing sent).
  EXPECT_EQ(host.stats.gathers, f32.stats.gathers);
  EXPECT_GT(host.stats.gathers, 0);
  EXPECT_EQ(host.stats.bytes_sent, 0);
}

INSTANTIATE_TEST_SUITE_P(FullShard, StageBf16,
                         ::testing::Values(Case{false, false, 1}, Case{true, false, 1},
                                           Case{true, true, 1}, Case{true, false, 2},
                                           Case{true, true, 1, true},
                                           Case{false, true, 2, true}));

TEST(StageBf16Errors, AnFp32ModelCannotTakeBf16Blocks) {
  std::string err;
  auto cpu = kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(cpu) << err;
  const model::ModelConfig cfg = stage_model(true, false);
  std::vector<float> params;
  {
    model::LocalAttention attention(cpu.get());
    model::Model m(cfg, cpu.get(), &attention);
    params = m.initial_params(11);
  }
  const std::vector<StageTokens> batches{stage_tokens(100, cfg.vocab, 5)};
  try {
    run_store(cfg, cpu.get(), nullptr, params, batches, kernels::DType::kBF16);
    FAIL() << "an fp32 model took bf16 blocks";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("carry bf16"), std::string::npos) << e.what();
  }
  const contract::ParamLayout layout(cfg);
  EXPECT_THROW(cp::FullShardStore(layout, contract::worker_shards(layout, 1, 1), 0, 1, nullptr,
                                  1000, nullptr, static_cast<kernels::DType>(7)),
               std::invalid_argument);
}

}  // namespace
}  // namespace ring::test
