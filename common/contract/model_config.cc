#include "common/contract/model_config.h"

#include <array>
#include <cmath>
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
  c.recompute_policy = m.recompute_policy;
  c.rope_theta = static_cast<float>(m.rope_theta);
  c.norm_eps = static_cast<float>(m.norm_eps);
  c.rope_scaling = m.rope_scaling;
  c.rope_scaling_factor = m.rope_scaling_factor;
  c.rope_original_context = static_cast<double>(m.rope_original_context);
  c.rope_low_freq_factor = m.rope_low_freq_factor;
  c.rope_high_freq_factor = m.rope_high_freq_factor;
  c.rope_beta_fast = m.rope_beta_fast;
  c.rope_beta_slow = m.rope_beta_slow;
  c.max_positions = spec.data.seq_len;
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
  const auto positive = [](double x) { return x > 0 && std::isfinite(x); };
  if (!positive(rope_theta)) fail("rope_theta must be a finite number > 0");
  if (!positive(norm_eps)) fail("norm_eps must be a finite number > 0");
  if (max_positions < 0) fail("max_positions must be >= 0 (0: not known)");
  using spec::RopeScaling;
  const std::string type = spec::to_string(rope_scaling);
  if (rope_scaling == RopeScaling::kNone) return;
  if (!(rope_scaling_factor >= 1 && std::isfinite(rope_scaling_factor)))
    fail("rope_scaling_factor must be >= 1 for rope_scaling " + type);
  if ((rope_scaling == RopeScaling::kLlama3 || rope_scaling == RopeScaling::kYarn) &&
      !positive(rope_original_context))
    fail("rope_original_context (original_max_position_embeddings) must be > 0 for "
         "rope_scaling " + type);
  if (rope_scaling == RopeScaling::kLlama3 &&
      !(positive(rope_low_freq_factor) && rope_high_freq_factor > rope_low_freq_factor &&
        std::isfinite(rope_high_freq_factor)))
    fail("rope_scaling llama3 needs 0 < rope_low_freq_factor < rope_high_freq_factor");
  if (rope_scaling == RopeScaling::kYarn &&
      !(positive(rope_beta_slow) && rope_beta_fast > rope_beta_slow &&
        std::isfinite(rope_beta_fast)))
    fail("rope_scaling yarn needs 0 < rope_beta_slow < rope_beta_fast");
}

nlohmann::json model_record(const ModelConfig& c) {
  nlohmann::json r = {{"layers", c.layers},
                      {"d_model", c.d_model},
                      {"heads", c.heads},
                      {"kv_heads", c.kv_heads},
                      {"head_dim", c.head_dim},
                      {"mlp", spec::to_string(c.mlp)},
                      {"mlp_hidden", c.mlp_hidden},
                      {"vocab", c.vocab},
                      {"tie_embeddings", c.tie_embeddings},
                      {"record", kModelRecordVersion},
                      {"dtype", spec::to_string(c.dtype)},
                      {"rope_theta", static_cast<double>(c.rope_theta)},
                      {"norm_eps", static_cast<double>(c.norm_eps)},
                      {"rope_scaling", spec::to_string(c.rope_scaling)},
                      {"max_positions", c.max_positions}};
  using spec::RopeScaling;
  const RopeScaling s = c.rope_scaling;
  if (s != RopeScaling::kNone) r["rope_scaling_factor"] = c.rope_scaling_factor;
  if (s == RopeScaling::kLlama3 || s == RopeScaling::kYarn)
    r["rope_original_context"] = static_cast<int64_t>(std::llround(c.rope_original_context));
  if (s == RopeScaling::kLlama3) {
    r["rope_low_freq_factor"] = c.rope_low_freq_factor;
    r["rope_high_freq_factor"] = c.rope_high_freq_factor;
  }
  if (s == RopeScaling::kYarn) {
    r["rope_beta_fast"] = c.rope_beta_fast;
    r["rope_beta_slow"] = c.rope_beta_slow;
  }
  return r;
}

int model_record_version(const nlohmann::json& r) {
  if (!r.is_object()) throw ModelError("model record: expected an object, got " + r.dump());
  auto it = r.find("record");
  if (it == r.end()) return 1;
  if (!it->is_number_integer() || it->get<int64_t>() < 2)
    throw ModelError("model record: key 'record': expected the integer 2, got " + it->dump());
  if (it->get<int64_t>() > kModelRecordVersion)
    throw ModelError("model record: key 'record': version " + it->dump() +
                     " is newer than this ringmaster reads (" +
                     std::to_string(kModelRecordVersion) + ")");
  return static_cast<int>(it->get<int64_t>());
}

namespace {

// The settings of a record 2 (rope, norm, dtype, max_positions) into c; every key's type checked.
void settings_from_record(const nlohmann::json& r, ModelConfig& c) {
  auto bad = [](const std::string& key, const std::string& rule, const nlohmann::json& v) {
    return ModelError("model record: key '" + key + "': " + rule + ", got " + v.dump());
  };
  auto at = [&](const char* key) -> const nlohmann::json& {
    auto it = r.find(key);
    if (it == r.end()) throw ModelError(std::string("model record: key '") + key + "' is missing");
    return *it;
  };
  auto number = [&](const char* key) {
    const auto& v = at(key);
    if (!v.is_number()) throw bad(key, "expected a number", v);
    return v.get<double>();
  };
  auto name = [&](const char* key, auto values, auto& out) {
    const auto& v = at(key);
    if (v.is_string())
      for (auto e : values)
        if (v.get<std::string>() == spec::to_string(e)) {
          out = e;
          return;
        }
    std::string all;
    for (auto e : values) all += (all.empty() ? "" : ", ") + std::string(spec::to_string(e));
    throw bad(key, "expected one of " + all, v);
  };
  using spec::RopeScaling;
  name("dtype", std::array{spec::DType::kFp32, spec::DType::kBf16}, c.dtype);
  c.rope_theta = static_cast<float>(number("rope_theta"));
  c.norm_eps = static_cast<float>(number("norm_eps"));
  name("rope_scaling",
       std::array{RopeScaling::kNone, RopeScaling::kLinear, RopeScaling::kLlama3,
                  RopeScaling::kYarn},
       c.rope_scaling);
  const auto& mp = at("max_positions");
  if (!mp.is_number_integer()) throw bad("max_positions", "expected an integer", mp);
  c.max_positions = mp.get<int64_t>();
  const RopeScaling s = c.rope_scaling;
  if (s != RopeScaling::kNone) c.rope_scaling_factor = number("rope_scaling_factor");
  if (s == RopeScaling::kLlama3 || s == RopeScaling::kYarn) {
    const auto& v = at("rope_original_context");
    if (!v.is_number_integer()) throw bad("rope_original_context", "expected an integer", v);
    c.rope_original_context = static_cast<double>(v.get<int64_t>());
  }
  if (s == RopeScaling::kLlama3) {
    c.rope_low_freq_factor = number("rope_low_freq_factor");
    c.rope_high_freq_factor = number("rope_high_freq_factor");
  }
  if (s == RopeScaling::kYarn) {
    c.rope_beta_fast = number("rope_beta_fast");
    c.rope_beta_slow = number("rope_beta_slow");
  }
}

}  // namespace

ModelConfig model_config_from_record(const nlohmann::json& r) {
  const int version = model_record_version(r);
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
  if (version >= 2) settings_from_record(r, c);
  c.check();
  return c;
}

}  // namespace ring::contract
