// Shared by generate_ring_test.cc (the teacher-forced reference, the checks) and
// generate_rank_helper.cc (one rank of a sharded generation): the test model, its weights and the
// prompts, built the same way in every process.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::gen::test {

// 2 layers, GQA (4 query heads over 2 K/V heads of 16), SwiGLU, byte vocabulary.
inline model::ModelConfig ring_config() {
  model::ModelConfig m;
  m.layers = 2;
  m.d_model = 64;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 16;
  m.mlp_hidden = 128;
  m.vocab = 256;
  m.mlp = spec::MlpKind::kSwiGLU;
  m.tie_embeddings = true;
  m.rope_theta = 10000.f;
  return m;
}

inline std::unique_ptr<kernels::Backend> cpu(int threads) {
  std::string err;
  auto b = kernels::create_backend("cpu", threads, &err);
  if (!b) throw std::runtime_error("cpu backend: " + err);
  return b;
}

// Random weights with attention sharpened (wq, wk x 6) so the softmax is far from uniform.
inline std::vector<float> ring_params(const model::ModelConfig& c, kernels::Backend* be,
                                      uint64_t seed) {
  model::LocalAttention att(be);
  model::Model m(c, be, &att);
  m.init_params(seed);
  std::vector<float> p = m.get_params();
  for (const auto& v : m.layout().views())
    if (v.name.find("attn.wq") != std::string::npos || v.name.find("attn.wk") != std::string::npos)
      for (int64_t i = 0; i < v.size; ++i) p[static_cast<size_t>(v.offset + i)] *= 6.f;
  return p;
}

struct Prompt {
  std::vector<int32_t> ids, docs;
};

// `batch` prompts in packed documents (`docs` documents of random lengths over `tokens`); prompt
// b has tokens - b x vary tokens (the documents cut to fit); the first `prefix` tokens are common
// to all of them (then each has its own ids).
inline std::vector<Prompt> ring_prompts(int64_t tokens, int docs, uint64_t seed, int batch,
                                        int64_t prefix, int64_t vary = 0) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> cuts;
  for (int d = 1; d < docs; ++d) cuts.push_back(static_cast<int64_t>(rng() % tokens));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int32_t> doc_of(static_cast<size_t>(tokens));
  int32_t doc = 0;
  size_t c = 0;
  for (int64_t i = 0; i < tokens; ++i) {
    while (c < cuts.size() && cuts[c] <= i) {
      ++doc;
      ++c;
    }
    doc_of[static_cast<size_t>(i)] = doc;
  }
  std::vector<int32_t> common(static_cast<size_t>(prefix));
  for (auto& x : common) x = static_cast<int32_t>(rng() % 256);
  std::vector<Prompt> out(static_cast<size_t>(batch));
  for (size_t b = 0; b < out.size(); ++b) {
    Prompt& p = out[b];
    const int64_t len = tokens - static_cast<int64_t>(b) * vary;
    p.docs.assign(doc_of.begin(), doc_of.begin() + len);
    p.ids.assign(common.begin(), common.begin() + std::min(prefix, len));
    while (static_cast<int64_t>(p.ids.size()) < len)
      p.ids.push_back(static_cast<int32_t>(rng() % 256));
  }
  return out;
}

}  // namespace ring::gen::test
