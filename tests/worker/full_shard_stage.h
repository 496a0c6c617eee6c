// One rank's FullShardStore (parallel.shard full) against the model's own flat buffers: the same
// weights and tokens through Model with and without the store, the store's blocks optionally
// staged through a backend's memory (as a device worker stages them). Shared by the CPU test
// (tests/worker/full_shard_stage_test.cc) and the GPU one (tests/gpu/full_shard_gpu_test.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/contract/shard.h"
#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/ring/ring_test_util.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"
#include "worker/ring/full_shard.h"

namespace ring::test {

// The tests' tiny model with 3 layers, an MLP of 96 and a vocabulary of 97.
inline model::ModelConfig stage_model(bool tied, bool recompute, bool bf16 = false) {
  model::ModelConfig m =
      tiny_model_config({.layers = 3, .mlp_hidden = 96, .vocab = 97, .tie_embeddings = tied});
  m.recompute = recompute;
  if (bf16) m.dtype = spec::DType::kBf16;
  return m;
}

// The multi-rank test's spec (full_shard_helper.cc, full_shard_ranks_test.cc): ring_spec's model
// on `world` ranks as nodes of `per_node` workers, model.dtype bf16 or fp32.
inline spec::JobSpec shard_ranks_spec(int world, int per_node, bool bf16) {
  spec::JobSpec s = ring_spec(256, world, "zigzag");
  s.resources.nodes = world / per_node;
  s.resources.workers_per_node = per_node;
  s.parallel.shard = spec::ShardMode::kFull;
  if (bf16) s.model.dtype = spec::DType::kBf16;
  return s;
}

struct StageTokens {
  std::vector<int32_t> ids, labels, docs;
  std::vector<int64_t> pos;
  int64_t valid = 0;
  model::Batch batch() const {
    return {static_cast<int64_t>(ids.size()), ids.data(), labels.data(), pos.data(), docs.data()};
  }
};

// Packed documents of 70 tokens; the last token of each has no label.
inline StageTokens stage_tokens(int64_t t, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  StageTokens b;
  for (int64_t i = 0; i < t; ++i) {
    b.ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    b.docs.push_back(static_cast<int32_t>(i / 70));
    b.pos.push_back(i % 70);
  }
  for (int64_t i = 0; i < t; ++i) {
    const bool last = i + 1 == t || b.docs[i + 1] != b.docs[i];
    b.labels.push_back(last ? -1 : b.ids[i + 1]);
    if (!last) ++b.valid;
  }
  return b;
}

struct StageRun {
  double loss = 0;            // summed over the micro-batches
  std::vector<float> grads;   // [layout total], host
  cp::ShardStats stats;       // run_store: the store's
};

inline int64_t total_valid(const std::vector<StageTokens>& batches) {
  int64_t v = 0;
  for (const auto& b : batches) v += b.valid;
  return v;
}

// The model's flat buffers on `backend`, gradients accumulated over the batches.
inline StageRun run_flat(const model::ModelConfig& cfg, kernels::Backend* backend,
                         const std::vector<float>& params, const std::vector<StageTokens>& batches) {
  model::LocalAttention attention(backend);
  model::Model m(cfg, backend, &attention);
  m.set_params(params);
  m.zero_grads();
  StageRun r;
  for (const auto& b : batches) r.loss += m.forward_backward(b.batch(), total_valid(batches)).loss;
  r.grads = m.get_grads();
  return r;
}

// The same through a one-rank FullShardStore; stage: the backend the blocks are staged through
// (null: host buffers handed to the model as they are, the CPU worker's way); gather: the dtype
// the store's blocks are gathered in (bf16: a bf16 model only).
inline StageRun run_store(const model::ModelConfig& cfg, kernels::Backend* backend,
                          kernels::Backend* stage, const std::vector<float>& params,
                          const std::vector<StageTokens>& batches,
                          kernels::DType gather = kernels::DType::kF32) {
  const contract::ParamLayout layout(cfg);
  cp::FullShardStore store(layout, contract::worker_shards(layout, 1, 1), 0, 1, nullptr, 10000,
                           stage, gather);
  const contract::WorkerShard& sh = store.shard();
  store.set_shard_weights(params.data() + sh.begin);
  model::LocalAttention attention(backend);
  model::Model m(cfg, backend, &attention, &store);
  StageRun r;
  r.grads.assign(static_cast<size_t>(layout.total()), 0.f);
  for (size_t i = 0; i < batches.size(); ++i) {
    store.begin_batch(i == 0, i + 1 == batches.size(),
                      [&](int, int64_t lo, int64_t hi, const float* g) {
                        if (hi > lo)
                          std::memcpy(r.grads.data() + lo, g,
                                      static_cast<size_t>(hi - lo) * sizeof(float));
                      });
    r.loss += m.forward_backward(batches[i].batch(), total_valid(batches)).loss;
  }
  r.stats = store.stats();
  return r;
}

}  // namespace ring::test
