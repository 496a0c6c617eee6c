// Hugging Face Llama / Mistral checkpoints <-> ringmaster checkpoints (`ringctl import`,
// `ringctl export`; the mapping and the RoPE conversion are in docs/models.md).
//
//   import: config.json + *.safetensors (one file, or shards with model.safetensors.index.json)
//           -> OUT/step-00000000/ (format 2, one node, shard none, only master/<param> fp32
//              tensors, the layout record) + OUT/latest + OUT/model.yaml (the spec's model section)
//   export: a ringmaster checkpoint (its master/<param> tensors) -> config.json +
//           model.safetensors (or model-0000i-of-0000n.safetensors + the index above a size)
//
// Names: model.embed_tokens.weight <-> embedding.weight, model.layers.i.self_attn.{q,k,v,o}_proj
// <-> layers.i.attn.{wq,wk,wv,wo}, mlp.{gate,up,down}_proj <-> mlp.{w_gate,w_up,w_down},
// input_layernorm <-> attn_norm.gain, post_attention_layernorm <-> mlp_norm.gain, model.norm
// <-> final_norm.gain, lm_head.weight <-> lm_head.weight (untied only).
// RoPE: Hugging Face rotates halves (x[j], x[j+hd/2]), ringmaster interleaved pairs (x[2j],
// x[2j+1]); import permutes the rows of wq and wk inside each head (new row 2j = old row j, new
// row 2j+1 = old row j+hd/2), export inverts it, so q.k and thus the logits are unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/contract/model_config.h"

namespace ring::hf {

// A config, checkpoint or file that cannot be converted; the message names the file and why.
class ConvertError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What config.json says, beyond the ModelConfig (rope scaling is carried to model.yaml).
struct HfConfig {
  contract::ModelConfig model;
  std::string architecture;   // "LlamaForCausalLM" / "MistralForCausalLM"
  double rope_theta = 10000;  // as written (ModelConfig keeps a float)
  double norm_eps = 1e-5;
  std::string rope_scaling = "none";  // none|linear|llama3|yarn
  double rope_scaling_factor = 1;
  int64_t rope_original_context = 0;
  double rope_low_freq_factor = 1, rope_high_freq_factor = 4;
  double rope_beta_fast = 32, rope_beta_slow = 1;
  int64_t max_position_embeddings = 0;
  std::string torch_dtype;  // informative
};

// Parses and checks config.json text; refuses what ringmaster's model cannot represent
// (attention or MLP bias, MoE, an activation other than silu, a sliding window shorter than
// max_position_embeddings, an unknown rope_scaling type, ...). `file` names it in errors.
HfConfig parse_config(const std::string& text, const std::string& file);
// config.json for a model (export); rope scaling fields from `c`.
std::string config_json(const HfConfig& c);
// The spec's model section as YAML (model.yaml); init_from: the checkpoint directory.
std::string model_yaml(const HfConfig& c, const std::string& init_from, const std::string& dtype,
                       const std::string& source);

// Row permutations of wq / wk ([heads * hd, d] row-major, in place): ring row 2j of a head is
// Hugging Face row j, ring row 2j + 1 is row j + head_dim / 2 (hf_row_of_ring_row).
int64_t hf_row_of_ring_row(int64_t ring_row, int64_t head_dim);
void hf_to_ring_rope_rows(float* w, int64_t heads, int64_t head_dim, int64_t cols);
void ring_to_hf_rope_rows(float* w, int64_t heads, int64_t head_dim, int64_t cols);

// The Hugging Face name of a ringmaster parameter ("" : none, e.g. lm_head when tied).
std::string hf_name(const std::string& ring_param, bool tied);

using Progress = std::function<void(const std::string& line)>;

struct ImportOptions {
  std::string src;             // a directory (config.json + safetensors) or a .safetensors file
  std::string config;          // config.json path; "" = SRC/config.json or next to the file
  std::string out;             // the checkpoint directory to create (must be absent or empty)
  // model.dtype of the imported model (its record and model.yaml): fp32 | bf16; "" = bf16 for a
  // model whose torch_dtype is bfloat16, else fp32. The weights keep the source's precision.
  std::string dtype;
  bool fsync = true;
  // The unit in which the checkpoint writer converts and writes (a multiple of 4; tests use
  // small ones to cross rows and tensors at odd places).
  size_t chunk_bytes = 4 << 20;
};
struct ImportResult {
  HfConfig config;
  std::string step_dir;
  int64_t params = 0;         // floats
  uint64_t source_bytes = 0;  // of the safetensors files
  double seconds = 0;
};
ImportResult import_model(const ImportOptions& o, const Progress& progress = {});

struct ExportOptions {
  std::string ckpt;            // a checkpoint directory (with `latest`) or a step directory
  std::string out;             // the directory to write (created; existing model files replaced)
  std::string dtype;            // bf16 | fp32; "" = the model's (its record's dtype)
  uint64_t shard_bytes = 5ull << 30;  // larger models are split in files of about this size
  // For a checkpoint that records only the model's shape (record 1): the settings' model.yaml;
  // "" = CKPT/model.yaml (or its parent's for a step directory). A checkpoint of record 2 is its
  // own config: a --model-yaml that differs from it is refused.
  std::string model_yaml;
};
struct ExportResult {
  std::vector<std::string> files;
  int64_t params = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  int64_t step = -1;
};
ExportResult export_model(const ExportOptions& o, const Progress& progress = {});

}  // namespace ring::hf
