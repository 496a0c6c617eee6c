#include "common/hf/hf_llama.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "common/contract/layout.h"
#include "common/contract/shard.h"
#include "common/files/atomic_write.h"
#include "common/files/output_dir.h"
#include "common/files/read_file.h"
#include "common/safetensors/safetensors.h"
#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/model.h"

namespace ring::hf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A small file written for the user: private temporary, fsync, rename (files/atomic_write.h).
void write_user_file(const std::string& path, const std::string& text) {
  try {
    files::write_file_atomic(path, text, 0600);
  } catch (const files::AtomicWriteError& e) {
    throw ConvertError(e.what());
  }
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw ConvertError(file + ": " + what);
}

// A checkpoint library error, with the path in front unless it names it already.
[[noreturn]] void rethrow_naming(const std::string& path, const std::exception& e) {
  const std::string what = e.what();
  if (what.find(path) != std::string::npos) throw ConvertError(what);
  fail(path, what);
}

// config.json, model.yaml, an index: small files of the user's.
std::string read_text(const std::string& path) {
  try {
    return files::read_regular_file(path, size_t{64} << 20);
  } catch (const files::ReadError& e) {
    throw ConvertError(e.what());
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t get_int(const json& j, const char* key, const std::string& file, int64_t lo, int64_t hi) {
  if (!j.contains(key)) fail(file, std::string("'") + key + "' is missing");
  const json& v = j[key];
  if (!v.is_number_integer()) fail(file, std::string("'") + key + "' is not an integer");
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    fail(file, std::string("'") + key + "' = " + std::to_string(x) + " is outside [" +
                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double get_num(const json& j, const char* key, const std::string& file, double def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_number()) fail(file, std::string("'") + key + "' is not a number");
  return j[key].get<double>();
}

bool truthy(const json& j, const char* key) {
  return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

// A number as YAML / JSON text that reads back to the same double.
std::string num(double x) {
  // The shortest %g form that reads back to x (1e-05, not 1.0000000000000001e-05).
  char buf[64];
  if (x == std::floor(x) && std::fabs(x) < 1e15) {  // 500000, not 5e+05
    std::snprintf(buf, sizeof buf, "%.0f", x);
    return buf;
  }
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

std::string ring_param_of(const std::string& hf, int64_t layers, bool* is_q, bool* is_k) {
  *is_q = *is_k = false;
  if (hf == "model.embed_tokens.weight") return "embedding.weight";
  if (hf == "model.norm.weight") return "final_norm.gain";
  if (hf == "lm_head.weight") return "lm_head.weight";
  const std::string pre = "model.layers.";
  if (hf.rfind(pre, 0) != 0) return "";
  size_t dot = hf.find('.', pre.size());
  if (dot == std::string::npos) return "";
  std::string idx = hf.substr(pre.size(), dot - pre.size());
  if (idx.empty() || idx.size() > 6 || !std::all_of(idx.begin(), idx.end(), ::isdigit) ||
      (idx.size() > 1 && idx[0] == '0'))
    return "";
  int64_t i = std::stoll(idx);
  if (i >= layers) return "";
  std::string rest = hf.substr(dot + 1);
  static const std::map<std::string, std::string> kMap{
      {"self_attn.q_proj.weight", "attn.wq"},
      {"self_attn.k_proj.weight", "attn.wk"},
      {"self_attn.v_proj.weight", "attn.wv"},
      {"self_attn.o_proj.weight", "attn.wo"},
      {"mlp.gate_proj.weight", "mlp.w_gate"},
      {"mlp.up_proj.weight", "mlp.w_up"},
      {"mlp.down_proj.weight", "mlp.w_down"},
      {"input_layernorm.weight", "attn_norm.gain"},
      {"post_attention_layernorm.weight", "mlp_norm.gain"}};
  auto it = kMap.find(rest);
  if (it == kMap.end()) return "";
  *is_q = it->second == "attn.wq";
  *is_k = it->second == "attn.wk";
  return "layers." + idx + "." + it->second;
}

// fp32 host memory for every parameter, one anonymous region (an export that cannot read the
// checkpoint in place loads it here). Tensor i starts at float offset(i).
class Staging {
 public:
  explicit Staging(const contract::ParamLayout& pl, const std::string& what) {
    for (const auto& v : pl.views()) {
      offsets_.push_back(floats_);
      floats_ += v.size;
    }
    bytes_ = std::max<uint64_t>(static_cast<uint64_t>(floats_) * 4, 4);
    void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail(what, std::string("cannot map memory: ") + std::strerror(errno));
    // Transparent huge pages where the system gives them on request: first touch of the region
    // then costs one fault per 2 MiB instead of per 4 KiB (advisory; ignored when refused).
    (void)madvise(m, bytes_, MADV_HUGEPAGE);
    base_ = static_cast<float*>(m);
  }
  ~Staging() { munmap(base_, bytes_); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  float* at(size_t i) { return base_ + offsets_[i]; }

 private:
  std::vector<int64_t> offsets_;
  int64_t floats_ = 0;
  uint64_t bytes_ = 0;
  float* base_ = nullptr;
};

ckpt::Layout make_layout(const contract::ModelConfig& mc, const contract::ParamLayout& pl) {
  // As ringd records it (daemon/ringd/checkpoints.cc checkpoint_layout), one node, shard none.
  ckpt::Layout l;
  l.shard = "none";
  l.nodes = 1;
  l.total_floats = pl.total();
  for (const contract::NodeRange& r : contract::shard_ranges(pl, 1))
    l.ranges.push_back({r.node, r.begin, r.end, r.first_bucket, r.end_bucket});
  l.model = contract::model_record(mc);
  return l;
}

// The files of a finished export, staged in `stage`, into `out` (each rename replaces a file of
// that name whole, never through a link); then the previous export's files that are not part of
// this one go: shards of another count, the index of a sharded export when this one is a single
// file, or the single file.
void move_export_into_place(const std::string& stage, const std::string& out,
                            const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (::rename((stage + "/" + n).c_str(), (out + "/" + n).c_str()) != 0)
      fail(out + "/" + n, std::string("cannot move into place: ") + std::strerror(errno));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string f = e.path().filename().string();  // model-00001-of-00002.safetensors
    const bool ours = (f.size() == 32 && f.starts_with("model-") && f.ends_with(".safetensors") &&
                       f.substr(11, 4) == "-of-") ||
                      f == "model.safetensors" || f == "model.safetensors.index.json";
    if (ours && std::find(names.begin(), names.end(), f) == names.end()) fs::remove(e.path(), ec);
  }
}

}  // namespace

// ---- config --------------------------------------------------------------------------------

static HfConfig parse_config_json(const std::string& text, const std::string& file);
// rope_scaling of config.json (null, absent or rope_type "default": none) into c, with the
// semantics and required keys of Hugging Face transformers' rope init functions; every refusal
// names the field (rope_scaling.<key>) and the rule.
static void parse_rope_scaling(const json& j, const std::string& file, HfConfig& c) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return;
  const json& r = j["rope_scaling"];
  if (!r.is_object()) fail(file, "rope_scaling is not an object (or null)");
  auto field = [&](const char* key) { return std::string("rope_scaling.") + key; };
  std::string type;
  for (const char* k : {"rope_type", "type"})
    if (r.contains(k)) {
      if (!r[k].is_string()) fail(file, field(k) + " is not a string");
      if (!type.empty() && r[k].get<std::string>() != type)
        fail(file, "rope_scaling.rope_type and rope_scaling.type disagree");
      type = r[k].get<std::string>();
    }
  if (type.empty()) fail(file, "rope_scaling has no rope_type (or type)");
  if (type == "default") return;
  if (type != "linear" && type != "llama3" && type != "yarn")
    fail(file, "rope_scaling.rope_type '" + type +
                   "' is not supported (default, linear, llama3, yarn)");
  const std::set<std::string> known =
      type == "linear"   ? std::set<std::string>{"rope_type", "type", "factor"}
      : type == "llama3" ? std::set<std::string>{"rope_type", "type", "factor", "low_freq_factor",
                                                 "high_freq_factor",
                                                 "original_max_position_embeddings"}
                         : std::set<std::string>{"rope_type", "type", "factor", "beta_fast",
                                                 "beta_slow", "original_max_position_embeddings",
                                                 "truncate"};
  for (auto it = r.begin(); it != r.end(); ++it)
    if (!known.count(it.key()))
      fail(file, field(it.key().c_str()) + " is not supported with rope_type " + type +
                     " (ringmaster's RoPE has no such setting)");
  auto number = [&](const char* key, std::optional<double> def) {
    if (!r.contains(key) || r[key].is_null()) {
      if (!def) fail(file, field(key) + " is missing (rope_type " + type + " needs it)");
      return *def;
    }
    if (!r[key].is_number()) fail(file, field(key) + " is not a number");
    const double x = r[key].get<double>();
    if (!std::isfinite(x)) fail(file, field(key) + " is not finite");
    return x;
  };
  c.rope_scaling = type;
  c.rope_scaling_factor = number("factor", std::nullopt);
  if (!(c.rope_scaling_factor >= 1)) fail(file, field("factor") + " must be >= 1");
  if (type == "linear") return;
  const char* orig = "original_max_position_embeddings";
  if (r.contains(orig) && !r[orig].is_null()) {
    if (!r[orig].is_number_integer() || r[orig].get<int64_t>() < 1)
      fail(file, field(orig) + " is not an integer >= 1");
    c.rope_original_context = r[orig].get<int64_t>();
  } else if (type == "yarn" && c.max_position_embeddings > 0) {
    c.rope_original_context = c.max_position_embeddings;  // transformers' fallback
  } else {
    fail(file, field(orig) + " is missing (rope_type " + type + " needs it)");
  }
  if (type == "llama3") {
    c.rope_low_freq_factor = number("low_freq_factor", std::nullopt);
    c.rope_high_freq_factor = number("high_freq_factor", std::nullopt);
    if (!(c.rope_low_freq_factor > 0 && c.rope_high_freq_factor > c.rope_low_freq_factor))
      fail(file, "rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    return;
  }
  c.rope_beta_fast = number("beta_fast", 32);
  c.rope_beta_slow = number("beta_slow", 1);
  if (!(c.rope_beta_slow > 0 && c.rope_beta_fast > c.rope_beta_slow))
    fail(file, "rope_scaling needs 0 < beta_slow < beta_fast");
  if (r.contains("truncate") && !(r["truncate"].is_boolean() && r["truncate"].get<bool>()))
    fail(file, field("truncate") + " must be true (ringmaster's yarn floors and ceils the "
                                   "correction range)");
}


HfConfig parse_config(const std::string& text, const std::string& file) {
  try {
    return parse_config_json(text, file);
  } catch (const json::exception& e) {  // a value of the wrong type met by get<>()
    fail(file, std::string("unexpected value: ") + e.what());
  }
}

static HfConfig parse_config_json(const std::string& text, const std::string& file) {
  // Refused before parsing: the parser and the messages that quote a value recurse into it.
  if (text.find('\0') != std::string::npos)
    fail(file, "has a NUL byte (rule: config.json is UTF-8 JSON text)");
  if (st::json_nesting_depth(text) > st::kMaxJsonDepth)
    fail(file, "nests arrays or objects deeper than " + std::to_string(st::kMaxJsonDepth) +
                   " levels (rule: config.json is a flat object of model settings)");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(file, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(file, "not a JSON object");
  HfConfig c;
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].size() != 1 || !j["architectures"][0].is_string())
    fail(file,
         "'architectures' must list one architecture (LlamaForCausalLM or "
         "MistralForCausalLM)");
  c.architecture = j["architectures"][0].get<std::string>();
  if (c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM")
    fail(file, "architecture " + c.architecture +
                   " is not supported (LlamaForCausalLM or MistralForCausalLM)");
  if (truthy(j, "attention_bias"))
    fail(file, "attention_bias is true: ringmaster's attention projections have no bias");
  if (truthy(j, "mlp_bias")) fail(file, "mlp_bias is true: ringmaster's MLP has no bias");
  for (const char* k : {"num_local_experts", "num_experts", "n_routed_experts"})
    if (j.contains(k) && !j[k].is_null() && !(j[k].is_number() && j[k].get<double>() <= 1))
      fail(file, std::string("'") + k + "' present: mixture-of-experts models are not supported");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    fail(file, "hidden_act " + j["hidden_act"].dump(-1, ' ', false, json::error_handler_t::replace) +
                   " is not supported (silu: ringmaster's swiglu MLP)");
  if (j.contains("pretraining_tp") && j["pretraining_tp"].is_number_integer() &&
      j["pretraining_tp"].get<int64_t>() != 1)
    fail(file, "pretraining_tp != 1 is not supported");
  auto& m = c.model;
  m.d_model = get_int(j, "hidden_size", file, 8, 65536);
  m.mlp_hidden = get_int(j, "intermediate_size", file, 1, 1 << 20);
  m.layers = get_int(j, "num_hidden_layers", file, 1, 1024);
  m.heads = get_int(j, "num_attention_heads", file, 1, 1024);
  m.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? get_int(j, "num_key_value_heads", file, 1, 1024)
                   : m.heads;
  if (m.heads % m.kv_heads != 0)
    fail(file, "num_attention_heads " + std::to_string(m.heads) +
                   " is not a multiple of num_key_value_heads " + std::to_string(m.kv_heads));
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    m.head_dim = get_int(j, "head_dim", file, 2, 1024);
  } else {
    if (m.d_model % m.heads != 0)
      fail(file, "hidden_size is not a multiple of num_attention_heads and head_dim is unset");
    m.head_dim = m.d_model / m.heads;
  }
  if (m.head_dim % 2) fail(file, "head_dim " + std::to_string(m.head_dim) + " is odd (RoPE)");
  m.vocab = get_int(j, "vocab_size", file, 2, 1 << 22);
  m.mlp = spec::MlpKind::kSwiGLU;
  m.tie_embeddings = truthy(j, "tie_word_embeddings");
  c.norm_eps = get_num(j, "rms_norm_eps", file, 1e-6);
  if (!(c.norm_eps > 0 && c.norm_eps < 1)) fail(file, "rms_norm_eps must be in (0, 1)");
  c.rope_theta = get_num(j, "rope_theta", file, 10000);
  if (!(c.rope_theta >= 1 && c.rope_theta <= 1e12)) fail(file, "rope_theta must be in [1, 1e12]");
  m.norm_eps = static_cast<float>(c.norm_eps);
  m.rope_theta = static_cast<float>(c.rope_theta);
  if (static_cast<double>(m.rope_theta) != c.rope_theta)
    fail(file, "rope_theta " + num(c.rope_theta) + " is not exact in fp32 (ringmaster keeps fp32)");
  c.max_position_embeddings =
      j.contains("max_position_embeddings") && !j["max_position_embeddings"].is_null()
          ? get_int(j, "max_position_embeddings", file, 1, int64_t{1} << 40)
          : 0;
  if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    if (!j["sliding_window"].is_number_integer()) fail(file, "sliding_window is not an integer");
    int64_t w = j["sliding_window"].get<int64_t>();
    bool used = !j.contains("use_sliding_window") || truthy(j, "use_sliding_window");
    if (used && (c.max_position_embeddings == 0 || w < c.max_position_embeddings))
      fail(file, "sliding_window " + std::to_string(w) + " is shorter than the context (" +
                     std::to_string(c.max_position_embeddings) +
                     "): ringmaster's attention is full causal, not windowed");
  }
  parse_rope_scaling(j, file, c);
  if (j.contains("torch_dtype") && !j["torch_dtype"].is_null()) {
    if (!j["torch_dtype"].is_string()) fail(file, "torch_dtype is not a string");
    c.torch_dtype = j["torch_dtype"].get<std::string>();
  }
  // A bf16 model computes in bf16 (its weights stay bf16 in the checkpoint); anything else in
  // fp32 (fp16 weights widen exactly; the model has no fp16 mode). ImportOptions::dtype overrides.
  m.dtype = c.torch_dtype == "bfloat16" ? spec::DType::kBf16 : spec::DType::kFp32;
  m.max_positions = c.max_position_embeddings;
  m.rope_scaling = c.rope_scaling == "linear"   ? spec::RopeScaling::kLinear
                   : c.rope_scaling == "llama3" ? spec::RopeScaling::kLlama3
                   : c.rope_scaling == "yarn"   ? spec::RopeScaling::kYarn
                                                : spec::RopeScaling::kNone;
  m.rope_scaling_factor = c.rope_scaling_factor;
  m.rope_original_context = static_cast<double>(c.rope_original_context);
  m.rope_low_freq_factor = c.rope_low_freq_factor;
  m.rope_high_freq_factor = c.rope_high_freq_factor;
  m.rope_beta_fast = c.rope_beta_fast;
  m.rope_beta_slow = c.rope_beta_slow;
  try {
    m.check();
  } catch (const std::exception& e) {
    fail(file, e.what());
  }
  return c;
}

std::string config_json(const HfConfig& c) {
  const auto& m = c.model;
  json j = {
      {"architectures", {c.architecture.empty() ? "LlamaForCausalLM" : c.architecture}},
      {"model_type", c.architecture == "MistralForCausalLM" ? "mistral" : "llama"},
      {"hidden_size", m.d_model},
      {"intermediate_size", m.mlp_hidden},
      {"num_hidden_layers", m.layers},
      {"num_attention_heads", m.heads},
      {"num_key_value_heads", m.kv_heads},
      {"head_dim", m.head_dim},
      {"vocab_size", m.vocab},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", m.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"torch_dtype", c.torch_dtype.empty() ? "float32" : c.torch_dtype}};
  // Unknown (a checkpoint that does not record it): left out rather than invented.
  if (c.max_position_embeddings > 0) j["max_position_embeddings"] = c.max_position_embeddings;
  if (c.rope_scaling != "none") {
    json r = {{"rope_type", c.rope_scaling}, {"factor", c.rope_scaling_factor}};
    if (c.rope_original_context > 0)
      r["original_max_position_embeddings"] = c.rope_original_context;
    if (c.rope_scaling == "llama3") {
      r["low_freq_factor"] = c.rope_low_freq_factor;
      r["high_freq_factor"] = c.rope_high_freq_factor;
    }
    if (c.rope_scaling == "yarn") {
      r["beta_fast"] = c.rope_beta_fast;
      r["beta_slow"] = c.rope_beta_slow;
    }
    j["rope_scaling"] = r;
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j.dump(2) + "\n";
}

std::string model_yaml(const HfConfig& c, const std::string& init_from, const std::string& dtype,
                       const std::string& source) {
  const auto& m = c.model;
  std::ostringstream y;
  y << "# The model section of a job spec for the model imported by `ringctl import` from\n"
    << "# " << source << " (" << c.architecture << ").\n"
    << "model:\n"
    << "  layers: " << m.layers << "\n"
    << "  d_model: " << m.d_model << "\n"
    << "  heads: " << m.heads << "\n"
    << "  kv_heads: " << m.kv_heads << "\n"
    << "  head_dim: " << m.head_dim << "\n"
    << "  mlp: swiglu\n"
    << "  mlp_hidden: " << m.mlp_hidden << "\n"
    << "  vocab: " << m.vocab << "\n"
    << "  dtype: " << dtype << "\n"
    << "  tie_embeddings: " << (m.tie_embeddings ? "true" : "false") << "\n"
    << "  rope_theta: " << num(c.rope_theta) << "\n"
    << "  norm_eps: " << num(c.norm_eps) << "\n";
  if (c.rope_scaling != "none") {
    y << "  rope_scaling: " << c.rope_scaling << "\n"
      << "  rope_scaling_factor: " << num(c.rope_scaling_factor) << "\n";
    if (c.rope_original_context > 0)
      y << "  rope_original_context: " << c.rope_original_context << "\n";
    if (c.rope_scaling == "llama3")
      y << "  rope_low_freq_factor: " << num(c.rope_low_freq_factor) << "\n"
        << "  rope_high_freq_factor: " << num(c.rope_high_freq_factor) << "\n";
    if (c.rope_scaling == "yarn")
      y << "  rope_beta_fast: " << num(c.rope_beta_fast) << "\n"
        << "  rope_beta_slow: " << num(c.rope_beta_slow) << "\n";
  }
  y << "  init_from: " << json(init_from).dump() << "\n";
  return y.str();
}

// model.yaml back into an HfConfig (export).
static HfConfig config_from_model_yaml(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    fail(path, std::string("cannot parse: ") + e.what());
  }
  YAML::Node m = root["model"];
  if (!m || !m.IsMap()) fail(path, "no 'model' section");
  HfConfig c;
  c.architecture = "LlamaForCausalLM";
  auto& mc = c.model;
  try {
    auto i = [&](const char* k, int64_t def) { return m[k] ? m[k].as<int64_t>() : def; };
    auto d = [&](const char* k, double def) { return m[k] ? m[k].as<double>() : def; };
    mc.layers = i("layers", 0);
    mc.d_model = i("d_model", 0);
    mc.heads = i("heads", 0);
    mc.kv_heads = i("kv_heads", mc.heads);
    mc.head_dim = i("head_dim", mc.heads ? mc.d_model / mc.heads : 0);
    mc.mlp_hidden = i("mlp_hidden", 0);
    mc.vocab = i("vocab", 256);
    mc.tie_embeddings = m["tie_embeddings"] ? m["tie_embeddings"].as<bool>() : true;
    if (m["mlp"] && m["mlp"].as<std::string>() != "swiglu")
      fail(path, "model.mlp is " + m["mlp"].as<std::string>() +
                     ": only swiglu models have a Llama equivalent");
    c.rope_theta = d("rope_theta", 10000);
    c.norm_eps = d("norm_eps", 1e-5);
    c.rope_scaling = m["rope_scaling"] ? m["rope_scaling"].as<std::string>() : "none";
    c.rope_scaling_factor = d("rope_scaling_factor", 1);
    c.rope_original_context = i("rope_original_context", 0);
    c.rope_low_freq_factor = d("rope_low_freq_factor", 1);
    c.rope_high_freq_factor = d("rope_high_freq_factor", 4);
    c.rope_beta_fast = d("rope_beta_fast", 32);
    c.rope_beta_slow = d("rope_beta_slow", 1);
  } catch (const YAML::Exception& e) {
    fail(path, std::string("bad value: ") + e.what());
  }
  mc.rope_theta = static_cast<float>(c.rope_theta);
  mc.norm_eps = static_cast<float>(c.norm_eps);
  static const std::map<std::string, spec::RopeScaling> kTypes{
      {"none", spec::RopeScaling::kNone},
      {"linear", spec::RopeScaling::kLinear},
      {"llama3", spec::RopeScaling::kLlama3},
      {"yarn", spec::RopeScaling::kYarn}};
  if (!kTypes.count(c.rope_scaling))
    fail(path, "model.rope_scaling '" + c.rope_scaling + "' is not none, linear, llama3 or yarn");
  mc.rope_scaling = kTypes.at(c.rope_scaling);
  mc.rope_scaling_factor = c.rope_scaling_factor;
  mc.rope_original_context = static_cast<double>(c.rope_original_context);
  mc.rope_low_freq_factor = c.rope_low_freq_factor;
  mc.rope_high_freq_factor = c.rope_high_freq_factor;
  mc.rope_beta_fast = c.rope_beta_fast;
  mc.rope_beta_slow = c.rope_beta_slow;
  try {
    mc.check();
  } catch (const std::exception& e) {
    fail(path, e.what());
  }
  return c;
}

// ---- RoPE rows -----------------------------------------------------------------------------

int64_t hf_row_of_ring_row(int64_t row, int64_t hd) {
  const int64_t head = row / hd, i = row % hd;
  return head * hd + (i % 2 == 0 ? i / 2 : i / 2 + hd / 2);
}

void hf_to_ring_rope_rows(float* w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> tmp(static_cast<size_t>(hd * cols));
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* head = w + h * hd * cols;
    for (int64_t j = 0; j < half; ++j) {
      std::memcpy(&tmp[(2 * j) * cols], head + j * cols, cols * sizeof(float));
      std::memcpy(&tmp[(2 * j + 1) * cols], head + (j + half) * cols, cols * sizeof(float));
    }
    std::memcpy(head, tmp.data(), tmp.size() * sizeof(float));
  }
}

void ring_to_hf_rope_rows(float* w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> tmp(static_cast<size_t>(hd * cols));
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* head = w + h * hd * cols;
    for (int64_t j = 0; j < half; ++j) {
      std::memcpy(&tmp[j * cols], head + (2 * j) * cols, cols * sizeof(float));
      std::memcpy(&tmp[(j + half) * cols], head + (2 * j + 1) * cols, cols * sizeof(float));
    }
    std::memcpy(head, tmp.data(), tmp.size() * sizeof(float));
  }
}

std::string hf_name(const std::string& p, bool tied) {
  if (p == "embedding.weight") return "model.embed_tokens.weight";
  if (p == "final_norm.gain") return "model.norm.weight";
  if (p == "lm_head.weight") return tied ? "" : "lm_head.weight";
  const std::string pre = "layers.";
  if (p.rfind(pre, 0) != 0) return "";
  size_t dot = p.find('.', pre.size());
  std::string idx = p.substr(pre.size(), dot - pre.size());
  std::string rest = p.substr(dot + 1);
  static const std::map<std::string, std::string> kMap{
      {"attn.wq", "self_attn.q_proj.weight"},
      {"attn.wk", "self_attn.k_proj.weight"},
      {"attn.wv", "self_attn.v_proj.weight"},
      {"attn.wo", "self_attn.o_proj.weight"},
      {"mlp.w_gate", "mlp.gate_proj.weight"},
      {"mlp.w_up", "mlp.up_proj.weight"},
      {"mlp.w_down", "mlp.down_proj.weight"},
      {"attn_norm.gain", "input_layernorm.weight"},
      {"mlp_norm.gain", "post_attention_layernorm.weight"}};
  auto it = kMap.find(rest);
  return it == kMap.end() ? "" : "model.layers." + idx + "." + it->second;
}

// ---- import --------------------------------------------------------------------------------

ImportResult import_model(const ImportOptions& o, const Progress& progress) {
  auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  std::error_code ec;
  const bool src_dir = fs::is_directory(o.src, ec);
  if (!src_dir && !fs::exists(o.src, ec)) fail(o.src, "does not exist");
  std::string cfg_path = !o.config.empty() ? o.config
                         : src_dir         ? o.src + "/config.json"
                                   : (fs::path(o.src).parent_path() / "config.json").string();
  if (cfg_path.empty() || !fs::exists(cfg_path, ec))
    fail(cfg_path.empty() ? o.src : cfg_path, "config.json not found (--config names it)");
  ImportResult res;
  res.config = parse_config(read_text(cfg_path), cfg_path);
  if (o.dtype == "fp32" || o.dtype == "bf16")
    res.config.model.dtype = o.dtype == "bf16" ? spec::DType::kBf16 : spec::DType::kFp32;
  else if (!o.dtype.empty())
    fail(o.dtype, "--dtype must be fp32 or bf16 (default: bf16 for a bfloat16 model, else fp32)");
  const contract::ModelConfig& mc = res.config.model;

  st::Model src = [&] {
    try {
      return st::Model::open(o.src);
    } catch (const st::SafetensorsError& e) {
      throw ConvertError(e.what());
    }
  }();
  res.source_bytes = src.total_bytes();

  // Every source tensor must map to a parameter of the right shape, and every parameter be
  // present: nothing is dropped or invented silently.
  const contract::ParamLayout pl(mc);
  std::map<std::string, std::string> from;  // ring param -> hf name
  for (const std::string& n : src.names()) {
    bool q, k;
    std::string p = ring_param_of(n, mc.layers, &q, &k);
    if (n.ends_with(".rotary_emb.inv_freq")) continue;  // a buffer, recomputed from rope_theta
    if (p.empty())
      fail(src.find(n)->file->path(),
           "tensor '" + n + "' has no ringmaster counterpart (a bias, an extra layer, ...)");
    if (p == "lm_head.weight" && mc.tie_embeddings) {
      say("note: lm_head.weight ignored (tie_word_embeddings: the embedding is the head)");
      continue;
    }
    const auto& view = pl.view(p);
    const st::TensorInfo& t = *src.find(n)->info;
    if (t.shape != view.shape) {
      auto dims = [](const std::vector<int64_t>& s) { return json(s).dump(); };
      fail(src.find(n)->file->path(), "tensor '" + n + "' has shape " + dims(t.shape) +
                                          " but config.json gives " + p + " the shape " +
                                          dims(view.shape));
    }
    from[p] = n;
  }
  for (const auto& v : pl.views())
    if (!from.count(v.name))
      fail(o.src,
           "tensor '" + hf_name(v.name, mc.tie_embeddings) + "' (" + v.name + ") is missing");

  if (fs::exists(o.out, ec) && !fs::is_empty(o.out, ec))
    fail(o.out, "exists and is not empty (import writes a new checkpoint directory)");
  // Ours and written by us alone: another user's directory (even empty) would let its owner swap
  // in same-shaped weights that `checkpoints --verify` then calls verified.
  try {
    files::prepare_output_dir(o.out, "--out");
  } catch (const files::OutputDirError& e) {
    throw ConvertError(e.what());
  }

  // The checkpoint writer takes each master tensor from the mapped source files chunk by chunk
  // as it writes it (wq/wk rows moved to the interleaved RoPE layout), in the source's own
  // precision: a bf16 or fp16 tensor stays 16-bit in the checkpoint (ringd and every reader
  // widen it to fp32 exactly when they load it), so an import writes the bytes it reads, no
  // more. No copy of the model is ever in memory: a model larger than RAM imports, and nothing
  // pays for first touching a model-sized buffer.
  const int64_t total = pl.num_params();
  uint64_t written_bytes = 0;
  std::atomic<int64_t> converted{0};
  ckpt::Options co;
  co.dir = o.out;
  co.keep_last = 1;
  co.nodes = 1;
  co.node_rank = 0;
  co.tag = "import";
  co.fsync = o.fsync;
  co.spec_hash = "import";
  co.layout = make_layout(mc, pl);
  co.chunk_bytes = o.chunk_bytes;
  try {
    ckpt::Checkpointer ck(co);
    for (const auto& v : pl.views()) {
      const auto* e = src.find(from[v.name]);
      const ckpt::DType dt = e->info->dtype == st::DType::kBF16  ? ckpt::DType::kBF16
                             : e->info->dtype == st::DType::kF16 ? ckpt::DType::kF16
                                                                 : ckpt::DType::kF32;
      int64_t rope_heads = 0;  // wq / wk: rows move to the interleaved RoPE layout
      if (v.name.find("attn.wq") != std::string::npos) rope_heads = mc.heads;
      if (v.name.find("attn.wk") != std::string::npos) rope_heads = mc.kv_heads;
      const int64_t hd = mc.head_dim, cols = mc.d_model;
      const int64_t es = static_cast<int64_t>(ckpt::dtype_size(dt));
      written_bytes += static_cast<uint64_t>(v.size * es);
      ck.add_tensor_source(
          "master/" + v.name, dt, v.shape,
          [e, rope_heads, hd, cols, es, &converted](uint64_t offset, uint64_t bytes, void* out) {
            const int64_t first = static_cast<int64_t>(offset) / es;
            const int64_t count = static_cast<int64_t>(bytes) / es;
            const uint8_t* raw = e->file->raw(*e->info);
            char* dst = static_cast<char*>(out);
            if (rope_heads == 0) {
              std::memcpy(dst, raw + first * es, static_cast<size_t>(count * es));
            } else {
              for (int64_t i = first; i < first + count;) {
                const int64_t row = i / cols, col = i % cols;
                const int64_t run = std::min(cols - col, first + count - i);
                std::memcpy(dst + (i - first) * es,
                            raw + (hf_row_of_ring_row(row, hd) * cols + col) * es,
                            static_cast<size_t>(run * es));
                i += run;
              }
            }
            converted.fetch_add(count, std::memory_order_relaxed);
          });
    }
    say("writing the checkpoint (" + std::to_string(written_bytes >> 20) + " MiB)");
    ck.start(0, {{"imported_from", fs::absolute(o.src).string()},
                 {"architecture", res.config.architecture}});
    std::optional<ckpt::SaveResult> r;
    int last_pct = 0;
    while (!(r = ck.poll())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int pct = static_cast<int>(100 * converted.load() / std::max<int64_t>(total, 1));
      if (total > (64 << 20) && pct / 10 > last_pct / 10 && pct < 100) {
        last_pct = pct;
        say("written " + std::to_string(pct) + "% (" + std::to_string(converted.load()) +
            " of " + std::to_string(total) + " parameters)");
      }
    }
    if (!r->ok) fail(o.out, "writing the checkpoint failed: " + r->error);
    res.step_dir = r->path;
  } catch (const ckpt::CheckpointError& e) {
    fail(o.out, e.what());
  }
  const std::string yaml =
      model_yaml(res.config, fs::absolute(o.out).lexically_normal().string(),
                 spec::to_string(mc.dtype), fs::absolute(o.src).string());
  write_user_file(o.out + "/model.yaml", yaml);
  res.params = total;
  res.seconds = seconds_since(t0);
  return res;
}

// ---- export --------------------------------------------------------------------------------

// The master tensors (fp32, or bf16 as an import of a bf16 model keeps them) of a format-2
// checkpoint step found in its data files and checked against their checksums in place (mapped,
// not copied), for an export that then copies each unchanged tensor file to file when it is in
// the output's dtype, or converts it straight from the mapping. Null when the checkpoint cannot
// be read this way (format 1, a tensor missing, of another shape or dtype, a checksum that
// differs, a file that does not open): the export then loads it the usual way, with
// load_latest's fallbacks and error messages.
class MappedMasters {
 public:
  struct Loc {
    int fd = -1;
    uint64_t offset = 0;
    const uint8_t* data = nullptr;
    ckpt::DType dtype = ckpt::DType::kF32;  // or kBF16 (an import of a bf16 model)
  };
  static std::unique_ptr<MappedMasters> open(const std::string& root, int64_t max_step,
                                             const contract::ParamLayout& pl) {
    std::unique_ptr<MappedMasters> m(new MappedMasters);
    try {
      std::optional<ckpt::CheckpointInfo> pick;
      for (auto& c : ckpt::list_checkpoints(root, false))
        if (c.status == ckpt::Status::kComplete && c.step <= max_step) pick = c;
      if (!pick || pick->format_version < 2 || pick->nodes < 1) return nullptr;
      m->step_ = pick->step;
      m->path_ = pick->path;
      std::map<std::string, std::pair<size_t, ckpt::TensorEntry>> where;
      for (int k = 0; k < pick->nodes; ++k) {
        char name[32];
        std::snprintf(name, sizeof name, "node-%05d.json", k);
        const std::string man = pick->path + "/" + name;
        std::ifstream in(man);
        std::stringstream text;
        text << in.rdbuf();
        if (!in) return nullptr;
        ckpt::ShardManifest sm = ckpt::parse_shard_manifest(text.str(), man);
        const std::string bin = pick->path + "/" + sm.data_file;
        int fd = ::open(bin.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return nullptr;
        m->files_.push_back({fd, nullptr, 0});
        struct stat st {};
        if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < sm.data_bytes)
          return nullptr;
        m->files_.back().bytes = static_cast<size_t>(st.st_size);
        if (st.st_size > 0) {
          void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
          if (p == MAP_FAILED) return nullptr;
          m->files_.back().map = p;
        }
        for (auto& t : sm.tensors)
          if (t.name.starts_with("master/") && !where.count(t.name))
            where.emplace(t.name, std::pair{m->files_.size() - 1, t});
      }
      for (const auto& v : pl.views()) {
        auto it = where.find("master/" + v.name);
        if (it == where.end()) return nullptr;
        const auto& [fi, t] = it->second;
        const File& f = m->files_[fi];
        if ((t.dtype != ckpt::DType::kF32 && t.dtype != ckpt::DType::kBF16) ||
            t.shape != v.shape ||
            t.bytes != static_cast<uint64_t>(v.size) * ckpt::dtype_size(t.dtype) ||
            t.offset + t.bytes > f.bytes)
          return nullptr;
        const uint8_t* data = static_cast<const uint8_t*>(f.map) + t.offset;
        if (ckpt::xxh3_hex(data, t.bytes) != t.xxh3) return nullptr;
        m->locs_.push_back({f.fd, t.offset, data, t.dtype});
      }
    } catch (const std::exception&) {
      return nullptr;
    }
    return m;
  }
  ~MappedMasters() {
    for (auto& f : files_) {
      if (f.map) ::munmap(f.map, f.bytes);
      ::close(f.fd);
    }
  }
  MappedMasters(const MappedMasters&) = delete;
  MappedMasters& operator=(const MappedMasters&) = delete;
  const Loc& at(size_t i) const { return locs_[i]; }  // by the layout's view index
  int64_t step() const { return step_; }
  const std::string& path() const { return path_; }

 private:
  MappedMasters() = default;
  struct File {
    int fd = -1;
    void* map = nullptr;
    size_t bytes = 0;
  };
  std::vector<File> files_;
  std::vector<Loc> locs_;
  int64_t step_ = -1;
  std::string path_;
};

namespace {

// What export reads: a step directory (with checkpoint.json: that step at most) or a checkpoint
// directory (its newest complete step), and the layout record of that checkpoint.
struct ExportSource {
  std::string root;
  int64_t max_step = INT64_MAX;
  std::optional<ckpt::Layout> layout;
};

ExportSource find_export_source(const std::string& ckpt_path) {
  ExportSource src;
  src.root = ckpt_path;
  std::error_code ec;
  try {
    if (fs::exists(ckpt_path + "/checkpoint.json", ec)) {
      ckpt::CheckpointInfo info = ckpt::inspect_checkpoint(ckpt_path, false);
      if (info.status != ckpt::Status::kComplete)
        fail(ckpt_path, "not a complete checkpoint: " +
                            (info.problems.empty() ? std::string("?") : info.problems.front()));
      src.root = fs::path(ckpt_path).lexically_normal().parent_path().string();
      if (src.root.empty()) src.root = ".";
      src.max_step = info.step;
      src.layout = info.layout;
    } else {
      auto list = ckpt::list_checkpoints(ckpt_path, false);
      for (auto it = list.rbegin(); it != list.rend(); ++it)
        if (it->status == ckpt::Status::kComplete) {
          src.layout = it->layout;
          break;
        }
      if (list.empty()) fail(ckpt_path, "holds no checkpoint");
    }
  } catch (const ckpt::CheckpointError& e) {
    rethrow_naming(ckpt_path, e);
  }
  return src;
}

// The shortest decimal that reads back as the same float (1e-06 for the fp32 1e-6).
std::string float_decimal(float x) {
  char buf[64];
  for (int p = 1; p <= 9; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(x));
    if (std::strtof(buf, nullptr) == x) break;
  }
  return buf;
}

// config.json's view of a model config read from a checkpoint's record.
HfConfig hf_config_of(const contract::ModelConfig& m, const std::string& what) {
  if (m.mlp != spec::MlpKind::kSwiGLU) fail(what, "model.mlp is not swiglu: no Llama equivalent");
  HfConfig c;
  c.model = m;
  c.architecture = "LlamaForCausalLM";
  c.rope_theta = static_cast<double>(m.rope_theta);
  c.norm_eps = std::strtod(float_decimal(m.norm_eps).c_str(), nullptr);
  c.rope_scaling = spec::to_string(m.rope_scaling);
  c.rope_scaling_factor = m.rope_scaling_factor;
  c.rope_original_context = static_cast<int64_t>(std::llround(m.rope_original_context));
  c.rope_low_freq_factor = m.rope_low_freq_factor;
  c.rope_high_freq_factor = m.rope_high_freq_factor;
  c.rope_beta_fast = m.rope_beta_fast;
  c.rope_beta_slow = m.rope_beta_slow;
  c.max_position_embeddings = m.max_positions;
  return c;
}

// The model to export: the checkpoint's model record (ckpt::read_checkpoint_model), which since
// record 2 holds the settings too; an explicit --model-yaml must then agree with it. A checkpoint
// that records only the shape (record 1) takes the settings from model.yaml (--model-yaml, else
// beside the checkpoint), else the spec's defaults, with a note.
HfConfig export_config(const ExportOptions& o, const std::string& root,
                       const std::function<void(const std::string&)>& say) {
  std::error_code ec;
  std::string yaml_path = o.model_yaml;
  if (yaml_path.empty()) {
    yaml_path = o.ckpt + "/model.yaml";
    if (!fs::exists(yaml_path, ec)) yaml_path = root + "/model.yaml";
  }
  std::optional<ckpt::CheckpointModel> cm;
  try {
    cm = ckpt::read_checkpoint_model(o.ckpt);
  } catch (const ckpt::CheckpointError& e) {
    if (!fs::exists(yaml_path, ec)) rethrow_naming(o.ckpt, e);
  }
  if (cm && cm->settings) {
    HfConfig c = hf_config_of(cm->config, o.ckpt);
    if (!o.model_yaml.empty()) {
      const HfConfig y = config_from_model_yaml(o.model_yaml);
      const json have = contract::model_record(c.model), want = contract::model_record(y.model);
      for (auto it = want.begin(); it != want.end(); ++it)
        if (it.key() != "max_positions" && it.key() != "dtype" &&
            have.value(it.key(), json()) != *it)
          fail(o.model_yaml, "model." + it.key() + " is " + it->dump() + " but the checkpoint " +
                                 cm->step_dir + " records " + have.value(it.key(), json()).dump() +
                                 " (the checkpoint's record is the model; leave --model-yaml out)");
    }
    return c;
  }
  if (fs::exists(yaml_path, ec)) {
    HfConfig c = config_from_model_yaml(yaml_path);
    if (cm) {
      c.model.dtype = cm->config.dtype;
      c.max_position_embeddings = cm->config.max_positions;
    }
    return c;
  }
  say("note: no model.yaml and the checkpoint records the model's shape only: rope_theta "
      "10000 and norm_eps 1e-5 (the spec defaults) are assumed (--model-yaml names the spec's)");
  return hf_config_of(cm->config, o.ckpt);
}

uint64_t tensor_bytes(const st::WriteTensor& t, st::DType dt) {
  uint64_t b = 1;
  for (int64_t d : t.shape) b *= static_cast<uint64_t>(d);
  return b * st::dtype_size(dt);
}

// Consecutive tensors, up to shard_bytes a shard (a larger tensor alone).
std::vector<std::vector<st::WriteTensor>> split_into_shards(const std::vector<st::WriteTensor>& all,
                                                            st::DType dt, uint64_t shard_bytes) {
  std::vector<std::vector<st::WriteTensor>> shards(1);
  uint64_t cur = 0;
  for (const auto& t : all) {
    const uint64_t b = tensor_bytes(t, dt);
    if (cur > 0 && cur + b > shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += b;
  }
  return shards;
}

// model.safetensors, or model-0000i-of-0000n.safetensors and the index, into `dir`; returns the
// names written.
std::vector<std::string> write_safetensors(const std::string& dir,
                                           const std::vector<std::vector<st::WriteTensor>>& shards,
                                           st::DType dt,
                                           const std::function<void(const std::string&)>& say) {
  std::vector<std::string> names;
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  try {
    if (shards.size() == 1) {
      st::write_file(dir + "/model.safetensors", shards[0], dt, meta);
      names.push_back("model.safetensors");
      return names;
    }
    json wm = json::object();
    uint64_t data_bytes = 0;
    const size_t n = shards.size();
    for (size_t s = 0; s < n; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n);
      say("writing " + std::string(name));
      st::write_file(dir + "/" + name, shards[s], dt, meta);
      names.push_back(name);
      for (const auto& t : shards[s]) {
        wm[t.name] = name;
        data_bytes += tensor_bytes(t, dt);
      }
    }
    json idx = {{"metadata", {{"total_size", data_bytes}}}, {"weight_map", wm}};
    write_user_file(dir + "/model.safetensors.index.json", idx.dump(2) + "\n");
    names.push_back("model.safetensors.index.json");
  } catch (const st::SafetensorsError& e) {
    throw ConvertError(e.what());
  }
  return names;
}

}  // namespace

ExportResult export_model(const ExportOptions& o, const Progress& progress) {
  auto t0 = std::chrono::steady_clock::now();
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  const ExportSource src = find_export_source(o.ckpt);
  const std::string& root = src.root;
  const int64_t max_step = src.max_step;
  HfConfig c = export_config(o, root, say);
  // The model's own precision unless --dtype says otherwise.
  const std::string dtype =
      !o.dtype.empty() ? o.dtype : c.model.dtype == spec::DType::kBf16 ? "bf16" : "fp32";
  st::DType dt;
  if (dtype == "bf16")
    dt = st::DType::kBF16;
  else if (dtype == "fp32")
    dt = st::DType::kF32;
  else
    fail(o.dtype, "--dtype must be bf16 or fp32");
  const contract::ModelConfig& mc = c.model;
  const contract::ParamLayout pl(mc);

  ExportResult res;
  // From a format-2 checkpoint the tensors stay in the checkpoint's files (mapped, checksums
  // checked in place): those already in the output's precision are copied file to file, the
  // others converted from the mapping chunk by chunk, and only wq and wk (rows reordered) pass
  // through memory of our own. A model-sized buffer of fresh memory would cost more than the
  // export's I/O (first touch of new pages). Otherwise (format 1, a checksum that differs, ...)
  // the checkpoint is loaded into memory.
  std::unique_ptr<MappedMasters> mapped = MappedMasters::open(root, max_step, pl);
  std::unique_ptr<Staging> host;
  if (mapped) {
    res.step = mapped->step();
    say("read " + mapped->path() + " (checksums verified; tensors in the output's precision "
        "copied file to file, the others converted from the mapped files)");
  } else {
    host = std::make_unique<Staging>(pl, o.ckpt);
    std::vector<ckpt::LoadTarget> targets;
    for (size_t i = 0; i < pl.views().size(); ++i)
      targets.emplace_back("master/" + pl.views()[i].name, ckpt::DType::kF32, pl.views()[i].shape,
                           host->at(i));
    try {
      ckpt::LoadResult lr = ckpt::load_latest(root, 0, 1, targets, max_step);
      if (!lr.loaded) fail(o.ckpt, "no loadable checkpoint: " + lr.message);
      res.step = lr.step;
      say("loaded " + lr.path);
    } catch (const ckpt::CheckpointError& e) {
      rethrow_naming(o.ckpt, e);
    }
  }
  std::vector<std::vector<float>> permuted;  // wq and wk of the mapped path, rows reordered
  permuted.reserve(pl.views().size());

  // Back to the Hugging Face layout, in the usual order (embedding, layers, norm, head).
  std::vector<st::WriteTensor> all;
  std::vector<size_t> order;
  for (size_t i = 0; i < pl.views().size(); ++i) order.push_back(i);
  auto rank = [&](size_t i) {
    const auto& v = pl.views()[i];
    using P = std::pair<int64_t, int64_t>;
    if (v.name == "embedding.weight") return P(-1, 0);
    if (v.layer >= 0) return P(v.layer, v.offset);
    return P(1 << 30, v.name == "lm_head.weight" ? 1 : 0);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rank(a) < rank(b); });
  for (size_t i : order) {
    const auto& v = pl.views()[i];
    std::string n = hf_name(v.name, mc.tie_embeddings);
    if (n.empty()) continue;
    const bool wq = v.name.find("attn.wq") != std::string::npos;
    const bool wk = v.name.find("attn.wk") != std::string::npos;
    float* data = nullptr;
    if (!mapped) {
      data = host->at(i);
    } else if (wq || wk) {
      const MappedMasters::Loc& l = mapped->at(i);
      permuted.emplace_back(static_cast<size_t>(v.size));
      if (l.dtype == ckpt::DType::kF32) {
        std::memcpy(permuted.back().data(), l.data, static_cast<size_t>(v.size) * 4);
      } else {
        for (int64_t k = 0; k < v.size; ++k) {
          uint16_t h;
          std::memcpy(&h, l.data + 2 * k, 2);
          permuted.back()[k] = st::bf16_to_f32(h);
        }
      }
      data = permuted.back().data();
    }
    if (wq) ring_to_hf_rope_rows(data, mc.heads, mc.head_dim, mc.d_model);
    if (wk) ring_to_hf_rope_rows(data, mc.kv_heads, mc.head_dim, mc.d_model);
    st::WriteTensor t{n, v.shape, data};
    if (!data) {  // mapped, 64-byte aligned in the data file
      const MappedMasters::Loc& l = mapped->at(i);
      const bool same = (l.dtype == ckpt::DType::kF32) == (dt == st::DType::kF32);
      if (same) {
        t.src_fd = l.fd;
        t.src_offset = l.offset;
      } else if (l.dtype == ckpt::DType::kF32) {
        t.data = reinterpret_cast<const float*>(l.data);
      } else {
        t.bf16 = reinterpret_cast<const uint16_t*>(l.data);
      }
    }
    all.push_back(std::move(t));
  }

  const auto shards = split_into_shards(all, dt, o.shard_bytes);
  std::string out;
  try {
    out = files::prepare_output_dir(o.out, "--out");
  } catch (const files::OutputDirError& e) {
    throw ConvertError(e.what());
  }
  // Everything is written into a private staging directory first and moved into place only once
  // all of it is written: a failed export leaves the previous one as it was.
  std::string stage = out + "/.ringctl-export-XXXXXX";
  if (::mkdtemp(stage.data()) == nullptr)
    fail(out, std::string("cannot create a staging directory: ") + std::strerror(errno));
  struct RemoveStage {
    std::string dir;
    ~RemoveStage() {
      std::error_code e;
      if (!dir.empty()) fs::remove_all(dir, e);  // ours: made by mkdtemp just above
    }
  } remove_stage{stage};
  std::vector<std::string> names = write_safetensors(stage, shards, dt, say);
  c.torch_dtype = dt == st::DType::kBF16 ? "bfloat16" : "float32";
  write_user_file(stage + "/config.json", config_json(c));
  names.push_back("config.json");
  move_export_into_place(stage, out, names);
  for (const std::string& n : names)
    if (n.ends_with(".safetensors")) {
      res.files.push_back(out + "/" + n);
      res.bytes += fs::file_size(out + "/" + n);
    }
  res.params = pl.num_params();
  res.seconds = seconds_since(t0);
  return res;
}

}  // namespace ring::hf
