// Shared by the generation tests (generate_test.cc, generate_bf16_test.cc, generate_ring_test.cc:
// the teacher-forced reference, the checks) and generate_rank_helper.cc (one rank of a sharded
// generation): the test model, its weights and the prompts, built the same way in every process.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::gen::test {

// The model: the tests' tiny model (2 layers, GQA: 4 query heads over 2 K/V heads of 16, SwiGLU,
// byte vocabulary), tiny_model_config(); its weights random with attention sharpened (wq, wk x 6)
// so the softmax is far from uniform, tiny_params(config, backend, seed, kSharpQK).
using ring::test::kSharpQK;
using ring::test::tiny_model_config;
using ring::test::tiny_params;

inline std::unique_ptr<kernels::Backend> cpu(int threads) {
  std::string err;
  auto b = kernels::create_backend("cpu", threads, &err);
  if (!b) throw std::runtime_error("cpu backend: " + err);
  return b;
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

// One prompt of `tokens` tokens in `docs` packed documents (ring_prompts' first, no prefix).
inline Prompt packed_prompt(int64_t tokens, uint64_t seed, int docs) {
  return ring_prompts(tokens, docs, seed, 1, 0)[0];
}

// Teacher-forced logits of every position, [T, vocab]: the model's forward (in c.dtype, with
// recompute) over ids at positions 0..T-1 in their documents.
inline std::vector<float> teacher_logits(const model::ModelConfig& c, kernels::Backend* be,
                                         const std::vector<float>& params,
                                         const std::vector<int32_t>& ids,
                                         const std::vector<int32_t>& docs) {
  model::LocalAttention att(be);
  model::ModelConfig rc = c;
  rc.recompute = true;
  model::Model m(rc, be, &att);
  m.set_params(params);
  const int64_t t = static_cast<int64_t>(ids.size());
  std::vector<int32_t> labels(ids.size(), -1);
  std::vector<int64_t> pos(ids.size());
  for (int64_t i = 0; i < t; ++i) pos[static_cast<size_t>(i)] = i;
  model::Batch b{t, ids.data(), labels.data(), pos.data(), docs.data()};
  m.forward(b, 1);
  return std::vector<float>(m.logits(), m.logits() + t * c.vocab);
}
inline std::vector<float> teacher(const model::ModelConfig& c, kernels::Backend* be,
                                  const std::vector<float>& params, const Prompt& p) {
  return teacher_logits(c, be, params, p.ids, p.docs);
}

// max_i |got_i - ref_i| / max_i |ref_i|.
inline double rel_err(const float* got, const float* ref, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return diff / scale;
}

inline int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

}  // namespace ring::gen::test
