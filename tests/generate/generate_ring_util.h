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

}  // namespace ring::gen::test
