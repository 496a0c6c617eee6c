#include "common/spec/keys.h"

#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>

namespace ring::spec {
namespace {

// Names of enum values, in enum declaration order. The key table and to_string() share them.
constexpr std::array kMlpNames{"swiglu", "gelu"};
constexpr std::array kDTypeNames{"fp32", "bf16", "fp16"};
constexpr std::array kSourceNames{"text", "passkey", "tokens", "chat"};
constexpr std::array kRingOrderNames{"topology", "slurm", "natural", "list"};
constexpr std::array kBalanceNames{"zigzag", "contiguous"};
constexpr std::array kShardNames{"none", "optimizer", "full"};
constexpr std::array kOffloadNames{"cpu", "none"};
constexpr std::array kUpdateNames{"dense", "lazy"};
constexpr std::array kCompressionNames{"none", "topk"};
constexpr std::array kCompressAtNames{"owner", "sender"};
constexpr std::array kBackendNames{"cpu", "cuda"};
constexpr std::array kGpuNames{"A100-80G", "H100-80G", "H200-141G"};
constexpr std::array kScheduleNames{"constant", "cosine"};
constexpr std::array kRopeScalingNames{"none", "linear", "llama3", "yarn"};
constexpr std::array kRecomputePolicyNames{"full", "selective"};
constexpr std::array kJobKindNames{"train", "generate"};

template <size_t N>
std::vector<std::string> names(const std::array<const char*, N>& a) {
  return {a.begin(), a.end()};
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// Binds a key to JobSpec::*section .*member. Handles int64/double/bool/string, enums (stored
// as choice index), optionals (unset until the YAML sets them) and vectors.
template <class S, class T>
void bind(KeyDef& k, S JobSpec::*sec, T S::*mem) {
  k.set = [sec, mem](JobSpec& s, const Value& v) {
    T& dst = s.*sec.*mem;
    if constexpr (std::is_enum_v<T>) {
      dst = static_cast<T>(std::get<int64_t>(v));
    } else if constexpr (is_optional<T>::value) {
      dst = std::get<typename T::value_type>(v);
    } else {
      dst = std::get<T>(v);
    }
  };
  k.get = [sec, mem](const JobSpec& s) -> std::optional<Value> {
    const T& src = s.*sec.*mem;
    if constexpr (std::is_enum_v<T>) {
      return Value{static_cast<int64_t>(src)};
    } else if constexpr (is_optional<T>::value) {
      if (!src) return std::nullopt;
      return Value{*src};
    } else {
      return Value{src};
    }
  };
}

constexpr double kIntMax = 9.007199254740992e15;  // 2^53: exact in double, far beyond any real size

struct KeyBuilder {
  std::vector<KeyDef>& out;

  template <class S, class T>
  KeyDef& add(std::string path, KeyType type, S JobSpec::*sec, T S::*mem, std::string desc) {
    KeyDef k;
    k.path = std::move(path);
    k.type = type;
    k.description = std::move(desc);
    bind(k, sec, mem);
    out.push_back(std::move(k));
    return out.back();
  }
};

KeyDef& range(KeyDef& k, std::optional<double> lo, std::optional<double> hi) {
  k.min = lo;
  k.max = hi;
  return k;
}

std::vector<KeyDef> build_table() {
  std::vector<KeyDef> t;
  KeyBuilder b{t};
  using J = JobSpec;
  using KT = KeyType;
  auto req = [](KeyDef& k) -> KeyDef& {
    k.required = true;
    return k;
  };
  // Required of a training job only (job.kind generate ignores it).
  auto train_req = [](KeyDef& k) -> KeyDef& {
    k.required = true;
    k.train_only = true;
    return k;
  };
  auto def = [](KeyDef& k, Value v) -> KeyDef& {
    k.default_value = std::move(v);
    return k;
  };
  auto choices = [](KeyDef& k, std::vector<std::string> c, int64_t dflt) -> KeyDef& {
    k.choices = std::move(c);
    k.default_value = Value{dflt};
    return k;
  };

  // ---- job
  req(b.add("job.name", KT::kString, &J::job, &JobSection::name,
            "Job name: 1-64 characters from [A-Za-z0-9._-], starting with a letter or digit. "
            "Shown by ringctl status and used as the Slurm job name."));
  choices(b.add("job.kind", KT::kEnum, &J::job, &JobSection::kind,
                "What the job does: train (the model, data, train and optimizer sections), or "
                "generate (text from generate.checkpoint's weights for generate.prompts, over "
                "parallel.context_ranks ranks; the training-only keys data.seq_len, train.*, "
                "optimizer.*, checkpoint.* and restart.* are ignored, and data.seq_len and "
                "train.steps are not required; a generate job is never restarted). Both run "
                "through ringd (`ringctl run`, `ringctl submit`)."),
          names(kJobKindNames), 0);

  // ---- model
  range(req(b.add("model.layers", KT::kInt, &J::model, &ModelSection::layers,
                  "Number of transformer blocks.")),
        1, 1024);
  range(req(b.add("model.d_model", KT::kInt, &J::model, &ModelSection::d_model,
                  "Model width (residual stream size).")),
        8, 65536);
  range(req(b.add("model.heads", KT::kInt, &J::model, &ModelSection::heads,
                  "Attention (query) heads.")),
        1, 1024);
  {
    auto& k = range(b.add("model.kv_heads", KT::kInt, &J::model, &ModelSection::kv_heads,
                          "Key/value heads. Fewer than heads gives grouped-query attention "
                          "(GQA); heads must be a multiple of kv_heads."),
                    1, 1024);
    k.derived = "heads (no GQA)";
  }
  {
    auto& k = range(b.add("model.head_dim", KT::kInt, &J::model, &ModelSection::head_dim,
                          "Size of one attention head. Must be even (RoPE rotates pairs). When "
                          "unset, d_model must equal heads x head_dim."),
                    2, 1024);
    k.derived = "d_model / heads";
  }
  choices(b.add("model.mlp", KT::kEnum, &J::model, &ModelSection::mlp,
                "MLP block: swiglu (gate, up, down projections) or gelu (up, down)."),
          names(kMlpNames), 0);
  {
    auto& k = range(b.add("model.mlp_hidden", KT::kInt, &J::model, &ModelSection::mlp_hidden,
                          "MLP hidden size."),
                    1, 1 << 20);
    k.derived = "swiglu: 8/3 x d_model rounded up to a multiple of 64; gelu: 4 x d_model";
  }
  range(def(b.add("model.vocab", KT::kInt, &J::model, &ModelSection::vocab,
                  "Vocabulary size. Byte-level text and passkey need at least 256; with "
                  "data.tokenizer, at least the tokenizer's piece count."),
            Value{int64_t{256}}),
        2, 1 << 22);
  choices(b.add("model.dtype", KT::kEnum, &J::model, &ModelSection::dtype,
                "Compute precision on the workers: fp32, or bf16 (bf16 weights, GEMM and "
                "attention inputs and K/V on the ring; fp32 accumulation, residual stream, norms, "
                "softmax, loss, gradients and master weights: docs/precision.md). fp16 is "
                "refused. Generate jobs compute fp32."),
          names(kDTypeNames), 0);
  def(b.add("model.recompute", KT::kBool, &J::model, &ModelSection::recompute,
            "Recompute each layer's activations in the backward pass instead of keeping them: "
            "keeps only the layer inputs (see ringctl plan). model.recompute_policy says what "
            "is re-run."),
      Value{false});
  choices(b.add("model.recompute_policy", KT::kEnum, &J::model, &ModelSection::recompute_policy,
                "What model.recompute re-runs in the backward: full (the whole block, attention "
                "and its ring K/V hops included; keeps only the layer inputs) or selective (keeps "
                "each layer's input, q, k, v after RoPE, the attention output o and its lse; "
                "re-runs only the norms, the output projection and the MLP's gate/up GEMMs, "
                "never the attention; the same gradients as no recompute)."),
          names(kRecomputePolicyNames), 0);
  def(b.add("model.tie_embeddings", KT::kBool, &J::model, &ModelSection::tie_embeddings,
            "Share the embedding matrix with the LM head."),
      Value{true});
  range(def(b.add("model.rope_theta", KT::kFloat, &J::model, &ModelSection::rope_theta,
                  "RoPE base frequency. Long contexts usually want a larger base (e.g. 1e6+)."),
            Value{10000.0}),
        1.0, 1e12);
  range(def(b.add("model.norm_eps", KT::kFloat, &J::model, &ModelSection::norm_eps,
                  "RMSNorm epsilon."),
            Value{1e-5}),
        0.0, 1.0)
      .min_exclusive = true;
  choices(b.add("model.rope_scaling", KT::kEnum, &J::model, &ModelSection::rope_scaling,
                "RoPE scaling for context extension, as rope_scaling in Hugging Face "
                "transformers: none; linear (positions divided by rope_scaling_factor); llama3 "
                "(wavelengths above rope_original_context / rope_low_freq_factor divided by the "
                "factor, below rope_original_context / rope_high_freq_factor kept, smoothed "
                "between); yarn (interpolation ramped between rope_beta_fast and rope_beta_slow "
                "rotations, cos and sin scaled by 0.1 ln(factor) + 1)."),
          names(kRopeScalingNames), 0);
  range(def(b.add("model.rope_scaling_factor", KT::kFloat, &J::model,
                  &ModelSection::rope_scaling_factor,
                  "Context extension factor of model.rope_scaling (factor in Hugging Face)."),
            Value{1.0}),
        1.0, 1e6);
  range(def(b.add("model.rope_original_context", KT::kInt, &J::model,
                  &ModelSection::rope_original_context,
                  "The context the model was trained with (original_max_position_embeddings): "
                  "required by llama3 and yarn. 0: unset."),
            Value{int64_t{0}}),
        0, int64_t{1} << 40);
  range(def(b.add("model.rope_low_freq_factor", KT::kFloat, &J::model,
                  &ModelSection::rope_low_freq_factor, "llama3 scaling: low_freq_factor."),
            Value{1.0}),
        0.0, 1e6)
      .min_exclusive = true;
  range(def(b.add("model.rope_high_freq_factor", KT::kFloat, &J::model,
                  &ModelSection::rope_high_freq_factor, "llama3 scaling: high_freq_factor."),
            Value{4.0}),
        0.0, 1e6)
      .min_exclusive = true;
  range(def(b.add("model.rope_beta_fast", KT::kFloat, &J::model, &ModelSection::rope_beta_fast,
                  "yarn scaling: beta_fast (rotations where interpolation stops)."),
            Value{32.0}),
        0.0, 1e6)
      .min_exclusive = true;
  range(def(b.add("model.rope_beta_slow", KT::kFloat, &J::model, &ModelSection::rope_beta_slow,
                  "yarn scaling: beta_slow (rotations where interpolation is complete)."),
            Value{1.0}),
        0.0, 1e6)
      .min_exclusive = true;
  def(b.add("model.init_from", KT::kString, &J::model, &ModelSection::init_from,
            "An absolute path to a ringmaster checkpoint (a step directory, or a checkpoint "
            "directory: its newest complete step) whose master/<param> tensors initialise the "
            "weights (fine-tuning, e.g. a model imported with ringctl import). The optimizer "
            "state starts fresh at step 0 and the data from its start. A checkpoint in "
            "checkpoint.dir (a resume) wins over it. \"\": random initialisation."),
      Value{std::string{}});

  // ---- data
  choices(b.add("data.source", KT::kEnum, &J::data, &DataSection::source,
                "text: documents read from data.paths (bytes, or ids of data.tokenizer); "
                "passkey: synthetic long-range retrieval (a key planted far back in filler text, "
                "asked for at the end); tokens: pre-tokenized .bin/.idx files listed in "
                "data.paths (docs/data.md, ringctl tokenize; with a loss mask when written from "
                "chat data); chat: conversations from the JSONL files in data.paths "
                "({\"messages\": [{role, content}...]} or {\"prompt\", \"response\"} per line), "
                "rendered with data.chat_template, trained on the assistant turns only."),
          names(kSourceNames), 0);
  def(b.add("data.paths", KT::kStringList, &J::data, &DataSection::paths,
            "Files or directories (read recursively) for the text source. Each text file "
            "(plain or .gz) is one document; binary files are skipped. Tokens source: token "
            "datasets, each as <name>, <name>.bin or <name>.idx. Chat source: JSONL files, or "
            "directories of *.jsonl files (read recursively, sorted by name)."),
      Value{std::vector<std::string>{}});
  def(b.add("data.tokenizer", KT::kString, &J::data, &DataSection::tokenizer,
            "Tokenizer that encodes the text source: a SentencePiece model (.model) or a Hugging "
            "Face tokenizer.json (byte-level BPE or BPE with byte fallback; told apart by a .json "
            "name or JSON content; BOS/EOS from tokenizer_config.json beside it, docs/data.md). "
            "Documents become its ids, with BOS first and EOS last when the tokenizer defines "
            "them. Empty: byte-level (ids 0..255). model.vocab must be at least the tokenizer's "
            "vocabulary size. The chat source encodes with it too (no BOS/EOS framing there: the "
            "template gives it)."),
      Value{std::string{}});
  def(b.add("data.chat_template", KT::kString, &J::data, &DataSection::chat_template,
            "Chat source (required there): how a conversation becomes text. llama3 (Meta Llama "
            "3 Instruct: <|begin_of_text|>, <|start_header_id|>role<|end_header_id|>, content "
            "trimmed, <|eot_id|>) or chatml (<|im_start|>role, content, <|im_end|>), their "
            "special tokens looked up in data.tokenizer (refused when it lacks one); or the path "
            "of a YAML template file with a prefix, end and separator per role (docs/data.md, "
            "\"Chat data\"). Targets are the assistant turns' content and end-of-turn token."),
      Value{std::string{}});
  range(train_req(b.add("data.seq_len", KT::kInt, &J::data, &DataSection::seq_len,
                        "Tokens per training sequence (the whole context, split over "
                        "parallel.context_ranks).")),
        16, 1 << 30);
  def(b.add("data.pack", KT::kBool, &J::data, &DataSection::pack,
            "Pack several documents into each sequence (with document boundaries: no attention "
            "across documents). When false, each sequence holds one document, padded."),
      Value{true});
  range(def(b.add("data.max_doc_len", KT::kInt, &J::data, &DataSection::max_doc_len,
                  "Longest document in tokens; longer ones are cut into pieces. 0: seq_len."),
            Value{int64_t{0}}),
        0, 1 << 30);
  range(def(b.add("data.min_doc_len", KT::kInt, &J::data, &DataSection::min_doc_len,
                  "Documents shorter than this are dropped."),
            Value{int64_t{16}}),
        1, 1 << 30);
  range(def(b.add("data.seed", KT::kInt, &J::data, &DataSection::seed,
                  "Seed of the document shuffle (and of the passkey generator)."),
            Value{int64_t{0}}),
        0, kIntMax);
  range(def(b.add("data.passkey_digits", KT::kInt, &J::data, &DataSection::passkey_digits,
                  "Digits in the passkey (passkey source)."),
            Value{int64_t{5}}),
        1, 32);

  // ---- parallel
  range(def(b.add("parallel.context_ranks", KT::kInt, &J::parallel,
                  &ParallelSection::context_ranks,
                  "Ranks in one attention ring: the sequence is split over them "
                  "(sequence/context parallelism)."),
            Value{int64_t{1}}),
        1, 65536);
  range(def(b.add("parallel.head_ranks", KT::kInt, &J::parallel, &ParallelSection::head_ranks,
                  "Two-level context parallelism: the context_ranks ranks of a sequence form "
                  "groups of head_ranks ranks inside one node; an all-to-all inside a group "
                  "gives each rank all of the group's tokens for 1/head_ranks of the heads, and "
                  "the ring runs over the context_ranks / head_ranks groups (one hop per group, "
                  "not per rank). Must divide context_ranks, workers_per_node and model.heads, "
                  "and divide model.kv_heads or be a multiple of it (then each K/V head is "
                  "replicated on head_ranks / kv_heads ranks). 1: one ring over every rank."),
            Value{int64_t{1}}),
        1, 65536);
  range(def(b.add("parallel.data_replicas", KT::kInt, &J::parallel,
                  &ParallelSection::data_replicas,
                  "Independent rings training on different sequences (data parallelism). "
                  "context_ranks x data_replicas must equal nodes x workers_per_node."),
            Value{int64_t{1}}),
        1, 65536);
  choices(b.add("parallel.ring_order", KT::kEnum, &J::parallel, &ParallelSection::ring_order,
                "Order of ranks around the ring: topology (from GPU/NUMA and switch topology), "
                "slurm (Slurm's node list order), natural (rank order), list "
                "(parallel.ring_order_list)."),
          names(kRingOrderNames), 0);
  range(def(b.add("parallel.ring_order_list", KT::kIntList, &J::parallel,
                  &ParallelSection::ring_order_list,
                  "Explicit ring: a permutation of 0 .. context_ranks-1 (ring_order: list only)."),
            Value{std::vector<int64_t>{}}),
        0, 65535);
  choices(b.add("parallel.causal_balance", KT::kEnum, &J::parallel,
                &ParallelSection::causal_balance,
                "How the sequence is cut: zigzag (2P chunks, rank i owns chunks i and 2P-1-i, "
                "balancing causal work) or contiguous (rank i owns chunk i)."),
          names(kBalanceNames), 0);
  range(def(b.add("parallel.stagger_us", KT::kInt, &J::parallel, &ParallelSection::stagger_us,
                  "Per-rank delay of ring sends in microseconds (rank r waits r x stagger_us); "
                  "0 disables."),
            Value{int64_t{0}}),
        0, 1000000);

  choices(b.add("parallel.shard", KT::kEnum, &J::parallel, &ParallelSection::shard,
                "What is sharded over the nodes: none (every node's ringd keeps the whole "
                "optimizer state), optimizer (each node's ringd keeps the master weights and AdamW "
                "moments of a contiguous, bucket-aligned 1/nodes of the parameters and updates "
                "only that range; the new weights reach every node; the top-k residual is kept "
                "where optimizer.compress_at says), or "
                "full (additionally each worker keeps only its shard of the working weights and "
                "gradients, its node's range cut evenly among the node's workers; each block - "
                "embedding, layer, head - is all-gathered over all data_replicas x context_ranks "
                "workers just before use, the next one fetched meanwhile, and its gradient "
                "reduce-scattered to the shards, so ringd receives its range's summed gradient and "
                "nodes exchange nothing; top-k then runs at the owner on the summed gradient, "
                "with the residual of its range)."),
          names(kShardNames), 0);

  // ---- optimizer
  range(def(b.add("optimizer.lr", KT::kFloat, &J::optimizer, &OptimizerSection::lr,
                  "Peak learning rate of AdamW."),
            Value{3e-4}),
        0.0, 10.0)
      .min_exclusive = true;
  range(def(b.add("optimizer.min_lr", KT::kFloat, &J::optimizer, &OptimizerSection::min_lr,
                  "Final learning rate of the cosine schedule."),
            Value{0.0}),
        0.0, 10.0);
  choices(b.add("optimizer.schedule", KT::kEnum, &J::optimizer, &OptimizerSection::schedule,
                "Learning-rate schedule after warm-up: constant, or cosine decay to min_lr at "
                "train.steps."),
          names(kScheduleNames), 1);
  range(def(b.add("optimizer.lr_warmup_steps", KT::kInt, &J::optimizer,
                  &OptimizerSection::lr_warmup_steps,
                  "Steps of linear learning-rate warm-up from 0 to lr."),
            Value{int64_t{0}}),
        0, kIntMax);
  range(def(b.add("optimizer.beta1", KT::kFloat, &J::optimizer, &OptimizerSection::beta1,
                  "AdamW first-moment decay, in [0, 1)."),
            Value{0.9}),
        0.0, 0.999999);
  range(def(b.add("optimizer.beta2", KT::kFloat, &J::optimizer, &OptimizerSection::beta2,
                  "AdamW second-moment decay, in [0, 1)."),
            Value{0.95}),
        0.0, 0.999999);
  range(def(b.add("optimizer.eps", KT::kFloat, &J::optimizer, &OptimizerSection::eps,
                  "AdamW epsilon."),
            Value{1e-8}),
        0.0, 1.0)
      .min_exclusive = true;
  range(def(b.add("optimizer.weight_decay", KT::kFloat, &J::optimizer,
                  &OptimizerSection::weight_decay,
                  "Decoupled weight decay (not applied to norm gains)."),
            Value{0.1}),
        0.0, 10.0);
  choices(b.add("optimizer.offload", KT::kEnum, &J::optimizer, &OptimizerSection::offload,
                "Where AdamW runs: cpu (ringd keeps fp32 master weights and moments in host "
                "memory) or none (each worker runs AdamW itself)."),
          names(kOffloadNames), 0);
  choices(b.add("optimizer.update", KT::kEnum, &J::optimizer, &OptimizerSection::update,
                "dense: update every coordinate each step; lazy: update only the coordinates "
                "selected by top-k and send only those back (needs compression: topk)."),
          names(kUpdateNames), 0);
  choices(b.add("optimizer.compression", KT::kEnum, &J::optimizer,
                &OptimizerSection::compression,
                "Gradient compression between nodes: none, or topk (keep the largest-magnitude "
                "fraction `density`; needs offload: cpu)."),
          names(kCompressionNames), 0);
  {
    auto& k = range(def(b.add("optimizer.density", KT::kFloat, &J::optimizer,
                              &OptimizerSection::density,
                              "Fraction of gradient coordinates kept by top-k, in (0, 1]."),
                        Value{0.001}),
                    0.0, 1.0);
    k.min_exclusive = true;
  }
  def(b.add("optimizer.error_feedback", KT::kBool, &J::optimizer,
            &OptimizerSection::error_feedback,
            "Keep what top-k dropped as a residual and add it to the next step's gradient."),
      Value{true});
  range(def(b.add("optimizer.warmup_steps", KT::kInt, &J::optimizer,
                  &OptimizerSection::warmup_steps,
                  "Dense (uncompressed) steps before top-k compression starts."),
            Value{int64_t{0}}),
        0, kIntMax);
  choices(b.add("optimizer.compress_at", KT::kEnum, &J::optimizer, &OptimizerSection::compress_at,
                "Where top-k selects (compression: topk, resources.nodes > 1): owner (the nodes' "
                "gradients of each bucket-aligned range are summed at the node that owns the "
                "range - a reduce-scatter of the dense gradient - which adds its residual, "
                "selects top-k and keeps the rest; the residual is 4 bytes x the range per node, "
                "results do not depend on the node count and checkpoints reshard exactly; "
                "any parallel.shard) or sender (every node selects from its own gradient + a "
                "full-size residual and only the k (index, value) pairs per node cross nodes: "
                "less traffic, but results depend on the node count and a resume on another "
                "node count is approximate; not with parallel.shard full)."),
          names(kCompressAtNames), 0);

  // ---- train
  range(train_req(b.add("train.steps", KT::kInt, &J::train, &TrainSection::steps,
                        "Optimizer steps to run.")),
        1, kIntMax);
  range(def(b.add("train.grad_clip", KT::kFloat, &J::train, &TrainSection::grad_clip,
                  "Clip the global gradient L2 norm to this value; 0 disables."),
            Value{1.0}),
        0.0, 1e6);
  range(def(b.add("train.seed", KT::kInt, &J::train, &TrainSection::seed,
                  "Seed of weight initialisation."),
            Value{int64_t{0}}),
        0, kIntMax);
  range(def(b.add("train.log_every", KT::kInt, &J::train, &TrainSection::log_every,
                  "Report loss and throughput every this many steps."),
            Value{int64_t{1}}),
        1, kIntMax);

  range(def(b.add("train.micro_batches", KT::kInt, &J::train, &TrainSection::micro_batches,
                  "Sequences per data replica per optimizer step (gradient accumulation): the "
                  "step's gradient is the sum over all of them, the loss normalised by their "
                  "valid tokens together, as one larger batch would be."),
            Value{int64_t{1}}),
        1, 65536);

  // ---- checkpoint
  def(b.add("checkpoint.dir", KT::kString, &J::checkpoint, &CheckpointSection::dir,
            "Directory for checkpoints (one sub-directory per step, a `latest` pointer); a "
            "relative path is taken from the job directory. Must be on a file system every node "
            "can reach when nodes > 1. Empty: no checkpoints."),
      Value{std::string{}});
  range(def(b.add("checkpoint.every_steps", KT::kInt, &J::checkpoint,
                  &CheckpointSection::every_steps,
                  "Write a checkpoint every this many steps; 0: only on demand and on "
                  "SIGTERM/preemption (both need checkpoint.dir)."),
            Value{int64_t{0}}),
        0, kIntMax);
  range(def(b.add("checkpoint.keep_last", KT::kInt, &J::checkpoint, &CheckpointSection::keep_last,
                  "Complete checkpoints to keep; older ones are deleted."),
            Value{int64_t{3}}),
        1, 100000);
  def(b.add("checkpoint.async", KT::kBool, &J::checkpoint, &CheckpointSection::async,
            "Write checkpoints in the background while training continues."),
      Value{true});

  // ---- generate
  range(def(b.add("generate.page_tokens", KT::kInt, &J::generate, &GenerateSection::page_tokens,
                  "Tokens per KV-cache page of `ringctl generate` (one page per layer and K/V "
                  "head)."),
            Value{int64_t{1024}}),
        16, 1048576);
  range(def(b.add("generate.fast_gb", KT::kFloat, &J::generate, &GenerateSection::fast_gb,
                  "Fast tier of the KV cache in GB (10^9 bytes): GPU memory in the design, a "
                  "bounded host pool on CPU builds; its resident size never exceeds it. 0: none "
                  "(then generate.window must be 0)."),
            Value{0.25}),
        0.0, 1e6);
  range(def(b.add("generate.host_gb", KT::kFloat, &J::generate, &GenerateSection::host_gb,
                  "Host tier limit of the KV cache in GB; pages beyond it go to "
                  "generate.disk_dir. 0: no limit."),
            Value{0.0}),
        0.0, 1e6);
  def(b.add("generate.disk_dir", KT::kString, &J::generate, &GenerateSection::disk_dir,
            "Directory of the disk tier: an unnamed 0600 file per process, its space reserved "
            "page by page (a full disk is an error naming ENOSPC), nothing left behind however "
            "the process ends. Empty: no disk tier."),
      Value{std::string{}});
  range(def(b.add("generate.window", KT::kInt, &J::generate, &GenerateSection::window,
                  "Most recent tokens of each sequence always kept in the fast tier; -1: one "
                  "page."),
            Value{int64_t{-1}}),
        -1, kIntMax);
  def(b.add("generate.checkpoint", KT::kString, &J::generate, &GenerateSection::checkpoint,
            "job.kind generate: the checkpoint whose weights generate (a checkpoint directory: "
            "its newest complete step, or one step directory); a relative path is taken from "
            "the directory `ringctl run`/`submit` runs in. Its tensors must match the model "
            "section."),
      Value{std::string{}});
  def(b.add("generate.prompts", KT::kStringList, &J::generate, &GenerateSection::prompts,
            "job.kind generate: prompt files, one sequence each (the bytes of a byte model, or "
            "text for data.tokenizer), generated together as one batch; relative paths as for "
            "generate.checkpoint."),
      Value{std::vector<std::string>{}});
  def(b.add("generate.output", KT::kString, &J::generate, &GenerateSection::output,
            "job.kind generate: the output file (0600), written by rank 0: the generated text "
            "of each prompt (a `==> file <==` header per prompt when there are several), or "
            "with generate.json one JSON object. Empty: `generate.out` (or `generate.json`) in "
            "the job directory; a relative path is taken from the job directory."),
      Value{std::string{}});
  def(b.add("generate.json", KT::kBool, &J::generate, &GenerateSection::json,
            "job.kind generate: write the output as JSON (tokens, text, prefill and per-token "
            "decode seconds of each prompt, the cache's statistics summed over the ranks)."),
      Value{false});
  range(
      def(b.add("generate.max_new_tokens", KT::kInt, &J::generate, &GenerateSection::max_new_tokens,
                "job.kind generate: tokens to generate per prompt (fewer when the tokenizer's "
                "end-of-sequence token comes first)."),
          Value{int64_t{64}}),
      1, 1073741824);
  range(def(b.add("generate.temperature", KT::kFloat, &J::generate, &GenerateSection::temperature,
                  "job.kind generate: 0 is greedy (the most likely token); above 0 samples from "
                  "softmax(logits / temperature)."),
            Value{0.0}),
        0.0, 1e6);
  {
    auto& k = range(def(b.add("generate.top_p", KT::kFloat, &J::generate, &GenerateSection::top_p,
                              "job.kind generate: nucleus sampling: sample among the most likely "
                              "tokens whose probabilities sum to top_p (1: all)."),
                        Value{1.0}),
                    0.0, 1.0);
    k.min_exclusive = true;
  }
  range(def(b.add("generate.seed", KT::kInt, &J::generate, &GenerateSection::seed,
                  "job.kind generate: the sampling seed: the same seed, checkpoint and prompts "
                  "give the same tokens, on any number of ranks."),
            Value{int64_t{0}}),
        0, kIntMax);
  range(def(b.add("generate.hang_deadline_s", KT::kFloat, &J::generate,
                  &GenerateSection::hang_deadline_s,
                  "job.kind generate under ringd: the least time a rank may go without progress "
                  "(a prefill layer, a decode step, the end of a wait on its peers) before it is "
                  "hung. The deadline is the larger of this and 10 x the slowest prefill layer or "
                  "decode step seen so far; before the first one ends, the larger of this and "
                  "observability.step_deadline_s. ringd then reports a `hang` event naming the "
                  "rank and where it stopped, stops every rank and fails the job. 0: no check "
                  "(a hung rank's peers fail only on the transport's 600 s timeout)."),
            Value{60.0}),
        0.0, 1e6);

  // ---- resources
  range(def(b.add("resources.nodes", KT::kInt, &J::resources, &ResourcesSection::nodes,
                  "Nodes (one ringd each)."),
            Value{int64_t{1}}),
        1, 65536);
  range(def(b.add("resources.workers_per_node", KT::kInt, &J::resources,
                  &ResourcesSection::workers_per_node,
                  "Worker processes per node (one per GPU with backend cuda)."),
            Value{int64_t{1}}),
        1, 1024);
  choices(b.add("resources.backend", KT::kEnum, &J::resources, &ResourcesSection::backend,
                "Compute backend of the workers: cpu or cuda."),
          names(kBackendNames), 0);
  range(def(b.add("resources.gpus_per_node", KT::kInt, &J::resources,
                  &ResourcesSection::gpus_per_node,
                  "GPUs per node (requested from Slurm as --gpus-per-node)."),
            Value{int64_t{0}}),
        0, 64);
  choices(b.add("resources.gpu_type", KT::kEnum, &J::resources, &ResourcesSection::gpu_type,
                "GPU model, for ringctl plan's memory check (backend cuda)."),
          names(kGpuNames), 1);
  range(def(b.add("resources.cpus_per_worker", KT::kInt, &J::resources,
                  &ResourcesSection::cpus_per_worker,
                  "CPU cores per worker (its BLAS threads with backend cpu)."),
            Value{int64_t{1}}),
        1, 1024);
  {
    auto& k = range(def(b.add("resources.host_memory_gb", KT::kFloat, &J::resources,
                              &ResourcesSection::host_memory_gb,
                              "Host memory per node in GB (10^9 bytes) available to the job: "
                              "ringd's optimizer state and, with backend cpu, the workers."),
                        Value{16.0}),
                    0.0, 1e6);
    k.min_exclusive = true;
  }

  // ---- slurm
  def(b.add("slurm.partition", KT::kString, &J::slurm, &SlurmSection::partition,
            "Partition (sbatch --partition); empty: the cluster default."),
      Value{std::string{}});
  def(b.add("slurm.account", KT::kString, &J::slurm, &SlurmSection::account,
            "Account (sbatch --account); empty: the user's default."),
      Value{std::string{}});
  def(b.add("slurm.time", KT::kString, &J::slurm, &SlurmSection::time,
            "Time limit in a Slurm format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS; "
            "empty: the partition default."),
      Value{std::string{}});
  def(b.add("slurm.qos", KT::kString, &J::slurm, &SlurmSection::qos,
            "Quality of service (sbatch --qos)."),
      Value{std::string{}});
  def(b.add("slurm.constraint", KT::kString, &J::slurm, &SlurmSection::constraint,
            "Node features (sbatch --constraint)."),
      Value{std::string{}});
  def(b.add("slurm.requeue", KT::kBool, &J::slurm, &SlurmSection::requeue,
            "Let Slurm requeue the job after node failure or preemption (sbatch --requeue)."),
      Value{true});
  range(def(b.add("slurm.signal_before_s", KT::kInt, &J::slurm, &SlurmSection::signal_before_s,
                  "Seconds before the time limit at which Slurm sends the warning signal "
                  "(sbatch --signal=B:USR1@N): ringd checkpoints and exits. 0 disables."),
            Value{int64_t{120}}),
        0, 65535);
  def(b.add("slurm.extra_sbatch", KT::kStringList, &J::slurm, &SlurmSection::extra_sbatch,
            "Extra sbatch options, one per item, e.g. \"--exclusive\" or \"--mail-type=END\"."),
      Value{std::vector<std::string>{}});

  // ---- restart
  range(def(b.add("restart.max_restarts", KT::kInt, &J::restart, &RestartSection::max_restarts,
                  "Automatic restarts (rollback to the latest checkpoint) before the job fails."),
            Value{int64_t{3}}),
        0, 1000);
  range(def(b.add("restart.backoff_s", KT::kFloat, &J::restart, &RestartSection::backoff_s,
                  "Delay before the first restart; doubles at each restart."),
            Value{10.0}),
        0.0, 86400.0);
  range(def(b.add("restart.backoff_max_s", KT::kFloat, &J::restart,
                  &RestartSection::backoff_max_s, "Upper bound of the restart delay."),
            Value{300.0}),
        0.0, 86400.0);

  // ---- observability
  range(def(b.add("observability.step_deadline_s", KT::kFloat, &J::observability,
                  &ObservabilitySection::step_deadline_s,
                  "A step still in flight after this many seconds is a hang: ringd reads its "
                  "workers' flight recorders, reports the ranks that never arrived and where the "
                  "others wait (event `hang`), and fails the attempt when a rank of its node is "
                  "stuck (then the restart policy applies). 0: no step deadline (a SIGSTOPped "
                  "worker is still found by its missing heartbeats)."),
            Value{600.0}),
        0.0, 1e6);
  return t;
}

std::string fmt_number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:g}", v);
}

}  // namespace

const char* to_string(MlpKind v) { return kMlpNames[static_cast<size_t>(v)]; }
const char* to_string(DType v) { return kDTypeNames[static_cast<size_t>(v)]; }
const char* to_string(DataSource v) { return kSourceNames[static_cast<size_t>(v)]; }
const char* to_string(RingOrder v) { return kRingOrderNames[static_cast<size_t>(v)]; }
const char* to_string(CausalBalance v) { return kBalanceNames[static_cast<size_t>(v)]; }
const char* to_string(ShardMode v) { return kShardNames[static_cast<size_t>(v)]; }
const char* to_string(Offload v) { return kOffloadNames[static_cast<size_t>(v)]; }
const char* to_string(UpdateMode v) { return kUpdateNames[static_cast<size_t>(v)]; }
const char* to_string(Compression v) { return kCompressionNames[static_cast<size_t>(v)]; }
const char* to_string(CompressAt v) { return kCompressAtNames[static_cast<size_t>(v)]; }
const char* to_string(Backend v) { return kBackendNames[static_cast<size_t>(v)]; }
const char* to_string(GpuType v) { return kGpuNames[static_cast<size_t>(v)]; }
const char* to_string(LrSchedule v) { return kScheduleNames[static_cast<size_t>(v)]; }
const char* to_string(RopeScaling v) { return kRopeScalingNames[static_cast<size_t>(v)]; }
const char* to_string(JobKind v) { return kJobKindNames[static_cast<size_t>(v)]; }
const char* to_string(RecomputePolicy v) {
  return kRecomputePolicyNames[static_cast<size_t>(v)];
}

int dtype_bytes(DType v) { return v == DType::kFp32 ? 4 : 2; }

const char* to_string(KeyType t) {
  switch (t) {
    case KeyType::kInt: return "integer";
    case KeyType::kFloat: return "number";
    case KeyType::kBool: return "boolean";
    case KeyType::kString: return "string";
    case KeyType::kEnum: return "enum";
    case KeyType::kStringList: return "list of strings";
    case KeyType::kIntList: return "list of integers";
  }
  return "?";
}

const std::vector<KeyDef>& spec_keys() {
  static const std::vector<KeyDef> table = build_table();
  return table;
}

const std::vector<std::pair<std::string, std::string>>& spec_sections() {
  static const std::vector<std::pair<std::string, std::string>> s = {
      {"job", "Identity of the job."},
      {"model", "The decoder-only transformer."},
      {"data", "Training data and sequence packing."},
      {"parallel", "Sequence (ring) and data parallelism."},
      {"optimizer", "AdamW, its CPU offload and gradient compression."},
      {"train", "The training loop."},
      {"checkpoint", "Checkpoints for resume and recovery."},
      {"resources", "What each node provides."},
      {"slurm", "Options of `ringctl submit` (sbatch)."},
      {"restart", "Automatic recovery after failures."},
      {"generate",
       "The KV cache of `ringctl generate` and of generate jobs; with job.kind generate also "
       "what to generate (docs/generation.md)."},
      {"observability", "Timelines, straggler and hang attribution."},
  };
  return s;
}

const KeyDef* find_key(std::string_view path) {
  for (const auto& k : spec_keys())
    if (k.path == path) return &k;
  return nullptr;
}

std::string value_text(const Value& v, const KeyDef& k) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (k.type == KeyType::kEnum && x >= 0 && static_cast<size_t>(x) < k.choices.size())
            return k.choices[x];
          return std::to_string(x);
        } else if constexpr (std::is_same_v<T, double>) {
          return fmt_number(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return x.empty() ? "\"\"" : x;
        } else {
          std::string s = "[";
          for (size_t i = 0; i < x.size(); ++i) {
            if (i) s += ", ";
            if constexpr (std::is_same_v<T, std::vector<int64_t>>) s += std::to_string(x[i]);
            else s += x[i];
          }
          return s + "]";
        }
      },
      v);
}

std::string default_text(const KeyDef& k) {
  if (k.required) return k.train_only ? "required (job.kind train)" : "required";
  if (!k.default_value) return "derived: " + k.derived;
  return value_text(*k.default_value, k);
}

std::string range_text(const KeyDef& k) {
  if (k.type == KeyType::kEnum) {
    std::string s;
    for (size_t i = 0; i < k.choices.size(); ++i) s += (i ? " | " : "") + k.choices[i];
    return s;
  }
  if (!k.min && !k.max) return "";
  std::string lo = k.min ? fmt_number(*k.min) : "";
  std::string hi = k.max ? (*k.max >= kIntMax ? "2^53" : fmt_number(*k.max)) : "";
  if (k.min_exclusive) return fmt::format("({}, {}]", lo, hi);
  return fmt::format("[{}, {}]", lo, hi);
}

JobSpec default_spec() {
  JobSpec s;
  for (const auto& k : spec_keys())
    if (k.default_value) k.set(s, *k.default_value);
  return s;
}

}  // namespace ring::spec
