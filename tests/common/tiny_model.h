// The tests' tiny model: one shape, named once, that a test changes field by field instead of
// writing its own copy. Header-only (needs common/contract's headers, no library): a test builds
// a ModelConfig from it, or writes the same shape as a spec's model section. The weights of it
// (random, sharpened) and a checkpoint of them are in tiny_weights.h.
#pragma once

#include <cstdint>
#include <string>

#include "common/contract/model_config.h"
#include "common/spec/spec.h"

namespace ring::test {

// 2 layers, d_model 64, GQA (4 query heads over 2 K/V heads of 16), SwiGLU of 128, byte
// vocabulary (256), tied embeddings. A test names only what it changes, with designated
// initialisers in this order: tiny_model_config({.layers = 3, .mlp_hidden = 96, .vocab = 97}).
struct TinyModel {
  int64_t layers = 2;
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 16;
  int64_t mlp_hidden = 128;
  int64_t vocab = 256;
  spec::MlpKind mlp = spec::MlpKind::kSwiGLU;
  bool tie_embeddings = true;
};

// The model's configuration; the fields TinyModel does not hold keep ModelConfig's defaults
// (RoPE base 10000, no RoPE scaling, norm eps 1e-5, no recompute), which a test sets on the result.
inline contract::ModelConfig tiny_model_config(const TinyModel& t = {}) {
  contract::ModelConfig c;
  c.layers = t.layers;
  c.d_model = t.d_model;
  c.heads = t.heads;
  c.kv_heads = t.kv_heads;
  c.head_dim = t.head_dim;
  c.mlp_hidden = t.mlp_hidden;
  c.vocab = t.vocab;
  c.mlp = t.mlp;
  c.tie_embeddings = t.tie_embeddings;
  return c;
}

// The same shape as a spec's model section, a YAML flow map:
//   {layers: 2, d_model: 64, heads: 4, kv_heads: 2, head_dim: 16, mlp_hidden: 128, vocab: 256}
// mlp and tie_embeddings are written only where they differ from the spec's defaults (swiglu,
// true), so the spec describes the model tiny_model_config(t) builds.
inline std::string tiny_model_yaml(const TinyModel& t = {}) {
  std::string y =
      "{layers: " + std::to_string(t.layers) + ", d_model: " + std::to_string(t.d_model) +
      ", heads: " + std::to_string(t.heads) + ", kv_heads: " + std::to_string(t.kv_heads) +
      ", head_dim: " + std::to_string(t.head_dim) +
      ", mlp_hidden: " + std::to_string(t.mlp_hidden) + ", vocab: " + std::to_string(t.vocab);
  if (t.mlp != spec::MlpKind::kSwiGLU) y += ", mlp: gelu";
  if (!t.tie_embeddings) y += ", tie_embeddings: false";
  return y + "}";
}

}  // namespace ring::test
