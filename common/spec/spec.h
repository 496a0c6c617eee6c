// The job spec: plain structs filled from YAML by the key table in common/spec/keys.cc.
//
// Every field here has exactly one entry in that table (name, type, default, range, description);
// the parser, the validator, `ringctl validate` and docs/spec-reference.md all read the table.
// Defaults live in the table only: use default_spec() for a spec with every default applied.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ring::spec {

enum class MlpKind { kSwiGLU, kGelu };
enum class DType { kFp32, kBf16, kFp16 };
enum class DataSource { kText, kPasskey, kTokens, kChat };
enum class RingOrder { kTopology, kSlurm, kNatural, kList };
enum class CausalBalance { kZigzag, kContiguous };
enum class ShardMode { kNone, kOptimizer, kFull };
enum class Offload { kCpu, kNone };
enum class UpdateMode { kDense, kLazy };
enum class Compression { kNone, kTopk };
enum class CompressAt { kOwner, kSender };
enum class Backend { kCpu, kCuda };
enum class GpuType { kA100_80G, kH100_80G, kH200_141G };
enum class LrSchedule { kConstant, kCosine };
enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };
// What model.recompute re-runs in the backward: the whole block (full), or only its norms,
// output projection and MLP gate/up, keeping q, k, v, o and lse (selective: no attention rerun).
enum class RecomputePolicy { kFull, kSelective };
// What a job does: train a model, or generate text from a checkpoint's weights (the generate
// section names the checkpoint and the prompts; training-only keys are ignored).
enum class JobKind { kTrain, kGenerate };

struct JobSection {
  std::string name;
  JobKind kind{};
};

struct ModelSection {
  int64_t layers{};
  int64_t d_model{};
  int64_t heads{};
  std::optional<int64_t> kv_heads;  // unset: equal to heads (no GQA)
  std::optional<int64_t> head_dim;  // unset: d_model / heads
  MlpKind mlp{};
  std::optional<int64_t> mlp_hidden;  // unset: derived from d_model and mlp (see Resolved)
  int64_t vocab{};
  DType dtype{};
  bool recompute{};
  RecomputePolicy recompute_policy{};  // what recompute re-runs (used when recompute is true)
  bool tie_embeddings{};
  double rope_theta{};
  double norm_eps{};
  // RoPE scaling for context extension, with the Hugging Face transformers semantics of each
  // type (rope_scaling in config.json).
  RopeScaling rope_scaling{};
  double rope_scaling_factor{};
  int64_t rope_original_context{};  // original_max_position_embeddings; 0: unset
  double rope_low_freq_factor{};    // llama3
  double rope_high_freq_factor{};   // llama3
  double rope_beta_fast{};          // yarn
  double rope_beta_slow{};          // yarn
  // A ringmaster checkpoint (a step directory, or a checkpoint directory) whose master/<param>
  // tensors initialise the weights; "" : random init.
  std::string init_from;
};
// model.recompute with policy full: the backward re-runs the whole block, attention included.
inline bool full_recompute(const ModelSection& m) {
  return m.recompute && m.recompute_policy == RecomputePolicy::kFull;
}

struct DataSection {
  DataSource source{};
  std::vector<std::string> paths;
  std::string tokenizer;  // SentencePiece model or tokenizer.json (text, chat); "": byte-level
  std::string chat_template;  // chat source: "llama3", "chatml" or a YAML template file
  int64_t seq_len{};
  bool pack{};
  int64_t max_doc_len{};  // 0: no limit beyond seq_len
  int64_t min_doc_len{};
  int64_t seed{};
  int64_t passkey_digits{};
};

struct ParallelSection {
  int64_t context_ranks{};
  int64_t head_ranks{};  // U: head-parallel group inside a node; the ring has context_ranks / U
  int64_t data_replicas{};
  RingOrder ring_order{};
  std::vector<int64_t> ring_order_list;
  CausalBalance causal_balance{};
  int64_t stagger_us{};
  ShardMode shard{};
};

struct OptimizerSection {
  double lr{};
  double min_lr{};
  LrSchedule schedule{};
  int64_t lr_warmup_steps{};
  double beta1{};
  double beta2{};
  double eps{};
  double weight_decay{};
  Offload offload{};
  UpdateMode update{};
  Compression compression{};
  double density{};
  bool error_feedback{};
  int64_t warmup_steps{};  // dense steps before top-k compression starts
  CompressAt compress_at{};  // where top-k selects: at each range's owner, or at each sender
};

struct TrainSection {
  int64_t steps{};
  double grad_clip{};
  int64_t seed{};
  int64_t log_every{};
  int64_t micro_batches{};  // sequences per data replica per optimizer step
};

struct CheckpointSection {
  std::string dir;
  int64_t every_steps{};
  int64_t keep_last{};
  bool async{};
};

struct ResourcesSection {
  int64_t nodes{};
  int64_t workers_per_node{};
  Backend backend{};
  int64_t gpus_per_node{};
  GpuType gpu_type{};
  int64_t cpus_per_worker{};
  double host_memory_gb{};
};

struct SlurmSection {
  std::string partition;
  std::string account;
  std::string time;
  std::string qos;
  std::string constraint;
  bool requeue{};
  int64_t signal_before_s{};
  std::vector<std::string> extra_sbatch;
};

struct RestartSection {
  int64_t max_restarts{};
  double backoff_s{};
  double backoff_max_s{};
};

// The KV cache of `ringctl generate` (docs/generation.md); flags override each key. With
// job.kind generate also what to generate: the checkpoint, the prompts, the sampling and the
// output (a generation job under ringd, `ringctl run` / `ringctl submit`).
struct GenerateSection {
  int64_t page_tokens{};
  double fast_gb{};
  double host_gb{};
  std::string disk_dir;
  int64_t window{};
  std::string checkpoint;
  std::vector<std::string> prompts;
  std::string output;
  bool json{};
  int64_t max_new_tokens{};
  double temperature{};
  double top_p{};
  int64_t seed{};
  double hang_deadline_s{};
};

struct ObservabilitySection {
  double step_deadline_s{};
};

struct JobSpec {
  JobSection job;
  ModelSection model;
  DataSection data;
  ParallelSection parallel;
  OptimizerSection optimizer;
  TrainSection train;
  CheckpointSection checkpoint;
  ResourcesSection resources;
  SlurmSection slurm;
  RestartSection restart;
  GenerateSection generate;
  ObservabilitySection observability;

  // Values derived from optional fields, filled by resolve() after a successful validation.
  struct Resolved {
    int64_t kv_heads{};
    int64_t head_dim{};
    int64_t mlp_hidden{};
    int64_t total_workers{};
  } resolved;
};

// Names of enum values as they appear in YAML ("swiglu", "zigzag", ...).
const char* to_string(MlpKind v);
const char* to_string(DType v);
const char* to_string(DataSource v);
const char* to_string(RingOrder v);
const char* to_string(CausalBalance v);
const char* to_string(ShardMode v);
const char* to_string(Offload v);
const char* to_string(UpdateMode v);
const char* to_string(Compression v);
const char* to_string(CompressAt v);
const char* to_string(Backend v);
const char* to_string(GpuType v);
const char* to_string(LrSchedule v);
const char* to_string(RopeScaling v);
const char* to_string(RecomputePolicy v);
const char* to_string(JobKind v);

// Bytes per element of a storage dtype.
int dtype_bytes(DType v);

}  // namespace ring::spec
