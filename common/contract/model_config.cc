#include "common/contract/model_config.h"

#include <string>

namespace ring::contract {

ModelConfig ModelConfig::from_spec(const spec::JobSpec& spec) {
  const spec::ModelSection& m = spec.model;
  if (m.dtype == spec::DType::kFp16) {
    throw ModelError("model.dtype: fp16 is not supported; use bf16 (mixed precision, "
                     "docs/precision.md) or fp32");
  }
  ModelConfig c;
  c.dtype = m.dtype;
  c.layers = m.layers;
  c.d_model = m.d_model;
  c.heads = m.heads;
  c.kv_heads = spec.resolved.kv_heads;
  c.head_dim = spec.resolved.head_dim;
  c.mlp_hidden = spec.resolved.mlp_hidden;
  c.vocab = m.vocab;
  c.mlp = m.mlp;
  c.tie_embeddings = m.tie_embeddings;
  c.recompute = m.recompute;
  c.rope_theta = static_cast<float>(m.rope_theta);
  c.norm_eps = static_cast<float>(m.norm_eps);
  c.rope_scaling = m.rope_scaling;
  c.rope_scaling_factor = m.rope_scaling_factor;
  c.rope_original_context = static_cast<double>(m.rope_original_context);
  c.rope_low_freq_factor = m.rope_low_freq_factor;
  c.rope_high_freq_factor = m.rope_high_freq_factor;
  c.rope_beta_fast = m.rope_beta_fast;
  c.rope_beta_slow = m.rope_beta_slow;
  c.check();
  return c;
}

void ModelConfig::check() const {
  auto fail = [](const std::string& what) { throw ModelError("model config: " + what); };
  if (layers < 1) fail("layers must be >= 1");
  if (d_model < 1 || heads < 1 || kv_heads < 1 || head_dim < 2 || mlp_hidden < 1 || vocab < 2) {
    fail("d_model, heads, kv_heads, mlp_hidden must be >= 1, head_dim >= 2, vocab >= 2");
  }
  if (heads % kv_heads != 0) fail("heads must be a multiple of kv_heads");
  if (head_dim % 2 != 0) fail("head_dim must be even (RoPE)");
}

nlohmann::json model_record(const ModelConfig& c) {
  return {{"layers", c.layers},           {"d_model", c.d_model},
          {"heads", c.heads},             {"kv_heads", c.kv_heads},
          {"head_dim", c.head_dim},       {"mlp", spec::to_string(c.mlp)},
          {"mlp_hidden", c.mlp_hidden},   {"vocab", c.vocab},
          {"tie_embeddings", c.tie_embeddings}};
}

ModelConfig model_config_from_record(const nlohmann::json& r) {
  if (!r.is_object()) throw ModelError("model record: expected an object, got " + r.dump());
  auto at = [&](const char* key) -> const nlohmann::json& {
    auto it = r.find(key);
    if (it == r.end()) throw ModelError(std::string("model record: key '") + key + "' is missing");
    return *it;
  };
  auto integer = [&](const char* key) {
    const auto& v = at(key);
    if (!v.is_number_integer())
      throw ModelError(std::string("model record: key '") + key + "': expected an integer, got " +
                       v.dump());
    return v.get<int64_t>();
  };
  ModelConfig c;
  c.layers = integer("layers");
  c.d_model = integer("d_model");
  c.heads = integer("heads");
  c.kv_heads = integer("kv_heads");
  c.head_dim = integer("head_dim");
  c.mlp_hidden = integer("mlp_hidden");
  c.vocab = integer("vocab");
  const auto& tie = at("tie_embeddings");
  if (!tie.is_boolean())
    throw ModelError("model record: key 'tie_embeddings': expected true or false, got " +
                     tie.dump());
  c.tie_embeddings = tie.get<bool>();
  const auto& mlp = at("mlp");
  if (mlp == spec::to_string(spec::MlpKind::kSwiGLU)) {
    c.mlp = spec::MlpKind::kSwiGLU;
  } else if (mlp == spec::to_string(spec::MlpKind::kGelu)) {
    c.mlp = spec::MlpKind::kGelu;
  } else {
    throw ModelError("model record: key 'mlp': unknown kind " + mlp.dump());
  }
  c.check();
  return c;
}

}  // namespace ring::contract
