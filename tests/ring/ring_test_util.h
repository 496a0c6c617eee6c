// Shared by ring_test.cc (the single-process reference, the launcher) and ring_helper.cc (one
// rank of a ring): the test model's spec and packed sequences with random document lengths.
#pragma once

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>

#include "common/spec/parse.h"
#include "worker/data/sequence.h"

namespace ring::test {

// A small model (2 layers, GQA 4/2 heads of 8, SwiGLU, vocab 256; tokens < 64) on seq_len tokens over
// `ranks` ranks; grad_clip 0 so clipping cannot hide a gradient difference.
// order: "natural" or a list "2,0,3,1" (parallel.ring_order: list).
inline spec::JobSpec ring_spec(int64_t seq_len, int ranks, const std::string& balance,
                               int layers = 2, const std::string& order = "natural") {
  const std::string order_yaml =
      order == "natural" ? "ring_order: natural" : "ring_order: list, ring_order_list: [" + order + "]";
  const std::string yaml =
      "job: {name: ring-test}\n"
      "model: {layers: " + std::to_string(layers) +
      ", d_model: 32, heads: 4, kv_heads: 2, mlp: swiglu, mlp_hidden: 64, vocab: 256}\n"
      "data: {source: passkey, seq_len: " + std::to_string(seq_len) + "}\n"
      "parallel: {context_ranks: " + std::to_string(ranks) +
      ", " + order_yaml + ", causal_balance: " + balance + "}\n"
      "optimizer: {lr: 3.0e-3, lr_warmup_steps: 0, schedule: constant, weight_decay: 0.1, "
      "offload: none}\n"
      "train: {steps: 20, grad_clip: 0, seed: 7, log_every: 1}\n"
      "resources: {nodes: 1, workers_per_node: " + std::to_string(ranks) +
      ", backend: cpu, cpus_per_worker: 1}\n";
  spec::LoadResult r = spec::load_spec_string(yaml, "ring-test.yaml");
  if (!r.ok()) {
    std::string msg;
    for (const auto& d : r.diagnostics) msg += d.str() + "\n";
    throw std::runtime_error("invalid ring test spec:\n" + msg);
  }
  return *r.spec;
}

// seq_len tokens in documents of random lengths in [1, max_doc] (the last one cut to fit), with
// labels shifted inside each document (-1 at its last token) and a few more -1 labels.
inline data::Sequence random_sequence(int64_t seq_len, int64_t max_doc, uint64_t seed,
                                      int32_t vocab = 64) {
  std::mt19937_64 rng(seed);
  data::Sequence s;
  s.tokens.resize(seq_len);
  s.labels.resize(seq_len);
  s.positions.resize(seq_len);
  s.doc_ids.resize(seq_len);
  s.cu_seqlens.push_back(0);
  int32_t doc = 0;
  for (int64_t i = 0; i < seq_len;) {
    int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_doc));
    len = std::min(len, seq_len - i);
    for (int64_t j = 0; j < len; ++j) {
      s.tokens[i + j] = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      s.doc_ids[i + j] = doc;
      s.positions[i + j] = i + j;
    }
    i += len;
    s.cu_seqlens.push_back(static_cast<int32_t>(i));
    s.segments.push_back({doc, 0});
    ++doc;
  }
  for (int64_t i = 0; i < seq_len; ++i) {
    const bool last = i + 1 == seq_len || s.doc_ids[i + 1] != s.doc_ids[i];
    s.labels[i] = last || rng() % 16 == 0 ? data::kIgnoreLabel : s.tokens[i + 1];
  }
  return s;
}

}  // namespace ring::test
