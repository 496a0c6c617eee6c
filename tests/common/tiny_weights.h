// Weights for the tests' models (tiny_model.h) and a checkpoint of them: random parameters from
// the model's own initialiser with chosen tensors scaled up, so that attention is far from
// uniform and greedy tokens are decided by clear margins. Library ring_test_weights (links the
// worker's model and the checkpoint library, which ring_test_common does not need).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint/checkpoint.h"
#include "common/contract/model_config.h"
#include "kernels/backend.h"

namespace ring::test {

// The tensors tiny_params scales: every one whose name contains one of `names`
// ("layers.1.attn.wq" contains "attn.wq"), multiplied by `factor`.
struct Sharpen {
  std::vector<std::string> names;
  float factor = 1.f;
};

// wq and wk x 6: the softmax far from uniform (generation's exactness tests).
inline const Sharpen kSharpQK{{"attn.wq", "attn.wk"}, 6.f};
// Every attention projection (wq, wk, wv, wo) and the embedding x 8: greedy tokens decided by
// clear margins (the checkpoint `ringctl generate` decodes in the CLI, job and Slurm tests).
inline const Sharpen kSharpAttentionAndEmbedding{{"attn.w", "embedding.weight"}, 8.f};

// Model::init_params(seed) on `backend` (with LocalAttention), then `sharpen` applied: the flat
// parameters in the model's layout (common/contract/layout.h).
std::vector<float> tiny_params(const contract::ModelConfig& c, kernels::Backend* backend,
                               uint64_t seed, const Sharpen& sharpen);

// Writes `params` of model c as the checkpoint of step 2 under dir (dir/step-00000002): format 2,
// one node (shard none), tensors "master/<name>" in fp32, its layout record naming the model,
// spec hash "test", no fsync. Returns the save's result (ok, error).
ckpt::SaveResult write_checkpoint(const std::string& dir, const contract::ModelConfig& c,
                                  const std::vector<float>& params);

}  // namespace ring::test
