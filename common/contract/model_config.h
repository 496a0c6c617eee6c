// The model hyper-parameters the workers and ringd share, taken from the job spec's model
// section: they fix the flat parameter layout (layout.h) both sides allocate.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "common/spec/spec.h"

namespace ring::contract {

// Errors of the model and its training loop: a backend op that failed (the message names the op
// and the backend status), or a configuration the model cannot take. Thrown at the module edge.
// The worker's model (worker/model/) throws the same type, so one catch covers both.
class ModelError : public std::runtime_error {
 public:
  explicit ModelError(const std::string& message) : std::runtime_error(message) {}
};

struct ModelConfig {
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // heads % kv_heads == 0 (GQA)
  int64_t head_dim = 0;  // even (RoPE rotates pairs)
  int64_t mlp_hidden = 0;
  int64_t vocab = 0;
  spec::MlpKind mlp = spec::MlpKind::kSwiGLU;
  bool tie_embeddings = true;
  bool recompute = false;
  // What recompute re-runs (worker/model/model.h): the whole block, or selective.
  spec::RecomputePolicy recompute_policy = spec::RecomputePolicy::kFull;
  // Compute precision (docs/precision.md): fp32, or bf16 GEMM and attention inputs with fp32
  // accumulation, residual stream, norms and loss. Not part of the layout (master weights are
  // fp32 either way).
  spec::DType dtype = spec::DType::kFp32;
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;
  // RoPE scaling (spec model.rope_*; kernels/rope.h has the formulas).
  spec::RopeScaling rope_scaling = spec::RopeScaling::kNone;
  double rope_scaling_factor = 1.0;
  double rope_original_context = 0.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  double rope_beta_fast = 32.0;
  double rope_beta_slow = 1.0;
  // The longest context the model is meant for (max_position_embeddings of an import; the
  // data.seq_len of a job trained from a spec). 0: not known. Informative: never compared.
  int64_t max_positions = 0;

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }

  // From a validated spec (spec.resolved filled). Throws ModelError for fp16.
  static ModelConfig from_spec(const spec::JobSpec& spec);
  // Throws ModelError naming the first inconsistent field.
  void check() const;
};

// What fixes the parameters' names, shapes and meaning: the `model` object of a checkpoint's
// layout record. ringd, the standalone trainer and `ringctl import` write it; a resume or
// init_from compares it key by key (common/checkpoint: model_difference), and generate, export
// and init_from read the model from it (ckpt::read_checkpoint_model).
//   record 1 (no "record" key): the shape only: layers, d_model, heads, kv_heads, head_dim, mlp,
//            mlp_hidden, vocab, tie_embeddings.
//   record 2: the shape, "record": 2, and the settings, named as the spec's model.* keys:
//            dtype, rope_theta, norm_eps (the fp32 values the model computes with, as doubles),
//            rope_scaling, and those of rope_scaling_factor, rope_original_context,
//            rope_low_freq_factor, rope_high_freq_factor, rope_beta_fast, rope_beta_slow its
//            type uses; max_positions (0: not known; informative, never compared).
inline constexpr int kModelRecordVersion = 2;
nlohmann::json model_record(const ModelConfig& c);
// The record's version: 1 when it has no "record" key; throws ModelError for another value.
int model_record_version(const nlohmann::json& record);
// Its inverse: the model a record describes (a record 1 leaves the settings at the spec's
// defaults: rope_theta 10000, norm_eps 1e-5, no RoPE scaling, fp32). Throws ModelError naming
// the key and the rule ("key 'heads': expected an integer, got \"8\"", "key 'mlp': unknown kind
// 'relu'", "key 'rope_scaling': unknown type 'dynamic'", a missing key, an inconsistent shape).
ModelConfig model_config_from_record(const nlohmann::json& record);

}  // namespace ring::contract
