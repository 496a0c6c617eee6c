// Generation over the paged KV cache (worker/generate/kv_cache.h).
//
// Prefill runs the training forward (worker/model: Model::forward, no backward) over a prompt
// with an AttentionExecutor that hands each layer's K/V (after RoPE, exactly what attention saw)
// to the cache as pages before computing the attention itself with the wrapped executor
// (LocalAttention here; any executor, RingAttention included, can be wrapped). Full pages already
// in the cache under the same prefix key are shared instead of stored again.
//
// A decode step takes one new token per sequence of a batch and runs the same layers as the
// training forward with the same backend ops on B rows (embedding, rmsnorm, the projections,
// RoPE at the token's position, the MLP, the head), but attention is DecodeAttention over the
// cache (exact: partial (o, lse) per page, merged with the log-sum-exp rule). Before each step
// the cache places pages: each sequence's window pages fast, then pages by attention mass.
//
// Logits of every step equal those of a teacher-forced full forward over the same tokens up to
// fp32 rounding of the different summation orders (tests/generate/).
//
// bf16 (ModelConfig::dtype, docs/precision.md): the prefill is the model's bf16 forward, and the
// decode step makes the same rounding points: the working weights rounded to bf16 once (with a
// bf16 copy for the GEMMs), every GEMM's input rounded and bf16 x bf16 -> fp32, Q and K rounded
// after RoPE and V after its projection; norms, residual, softmax, the (o, lse) partials and
// their merge, and the logits stay fp32. The cache stores bf16 pages (CacheConfig::dtype): the
// K/V values exactly, in half the bytes of fp32 pages.
//
// Sharded (ShardOptions.ranks = P > 1; one Generator per rank of a context-parallel ring, every
// rank calling prefill and step with the same arguments in the same order). Prefill cuts the
// prompt as training does (worker/data/split.h: zigzag or contiguous) and runs the training
// forward on this rank's tokens with the ring's attention executor (RingAttention) wrapped by the
// capture: the K/V of this rank's tokens become this rank's pages (in local token order; decode
// attention needs no positions, only document ids, since every cached token precedes the query).
// The prompt's last-token logits are all_gathered from the rank holding that token. A decode step
// runs the (cheap) dense layers on every rank, replicated; per layer each rank computes the
// partial (o, lse) of the new queries over its own pages, and only those vectors cross the
// transport (one all_gather of [B, heads, head_dim + 2] floats per layer: o, lse and the
// approximate mode's bound); every rank merges the P partials in rank order with the same
// log-sum-exp rule, so every rank holds bit-identical logits. The new token at global position n
// is stored on rank (n / page_tokens) mod P: generated tokens go to the ranks a page at a time,
// round robin, so the cache grows evenly. Pages are content-addressed by the whole prefix up to
// each of their tokens and those tokens' positions, so prompts sharing a prefix and a split
// still share pages.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/spec/spec.h"
#include "kernels/backend.h"
#include "worker/generate/decode_attention.h"
#include "worker/generate/kv_cache.h"
#include "worker/model/attention.h"
#include "worker/model/buffer.h"
#include "worker/model/model.h"

namespace ring::gen {

// Multi-process generation: this process is rank `rank` of `ranks` (see the header comment).
struct ShardOptions {
  int ranks = 1;  // P; 1: the whole cache in this process (the rest is unused)
  int rank = 0;
  spec::CausalBalance balance = spec::CausalBalance::kZigzag;  // how prompts are cut
  // The prefill's attention across the ranks (RingAttention over the same P ranks); required
  // with ranks > 1. Must outlive the generator.
  model::AttentionExecutor* prefill_attention = nullptr;
  // Every rank's `bytes` at send into recv (ranks x bytes, in rank order); a collective that
  // every rank calls in the same order. Required with ranks > 1.
  std::function<void(const void* send, void* recv, size_t bytes)> all_gather;
};

struct GeneratorOptions {
  CacheConfig cache;
  ShardOptions shard;
  int threads = 0;  // decode attention threads (0: all cores)
  int64_t max_promotions_per_step = -1;  // -1: no limit
  // > 0: the APPROXIMATE mode (DecodeAttention::forward's skip_threshold): pages whose bound on
  // softmax share is below it are skipped, and each step reports the bound on what was left out.
  // 0 (default): exact.
  double approximate = 0.0;
  // The fast tier in the backend's memory, its pages' partials by the backend's paged decode
  // kernel (the device fast tier: kv_cache.h, decode_attention.h). Always so on a backend other
  // than cpu; on cpu it is opt-in (the cpu backend's kernel on a host pool: the same code path,
  // for tests and comparisons).
  bool fast_on_backend = false;
  // The backend of the fast tier and of the decode step's dense ops when it is not the one the
  // generator is constructed with (null: that one). A sharded generation on a device passes the
  // cpu backend to the constructor (the prefill's ring attention: the transports move host
  // buffers) and the device here: each rank's fast tier is then in its device memory, its fast
  // pages' partials come from the device's paged decode kernel, and the merged per-rank
  // partials (host vectors) are what crosses the transport. A cpu backend given here holds the
  // fast tier as fast_on_backend does. Must outlive the generator.
  kernels::Backend* device = nullptr;
};

struct StepTiming {
  double seconds = 0;            // the whole step
  double attention_seconds = 0;  // DecodeAttention over all layers (exchange included)
  double exchange_seconds = 0;   // sharded: the all_gathers of the partials and their merge
  // Approximate mode: per sequence of the step, the largest bound over layers and heads on the
  // softmax mass skipped (0 in exact mode).
  std::vector<double> skipped_mass_bound;
};

class Generator {
 public:
  // params: the flat parameter buffer (host, layout().total() floats). backend: where prefill
  // runs (the training forward) and, on a backend other than cpu, where the fast tier lives
  // (device memory; the cuda backend's paged decode kernel computes the fast pages' partials);
  // it must outlive the generator. A backend other than cpu needs paged_decode_attention; the
  // decode step's dense ops (embedding, norms, projections, RoPE, MLP, head on B rows) run on it
  // too, on the model's device weights, and only q, k, v and the attention output cross to the
  // host per layer. Sharded, `backend` is the cpu one (the prefill) and the device, if any, is
  // options.device (the fast tier and the dense step there, on a device copy of the weights).
  // On the cpu backend they run on a one-thread cpu backend of the generator's own: splitting a
  // one-row product over threads costs more in joins than it saves.
  Generator(const model::ModelConfig& config, const float* params, kernels::Backend* backend,
            const GeneratorOptions& options);
  ~Generator();

  const model::ModelConfig& config() const { return config_; }
  KvCache& cache() { return *cache_; }
  // The threads decode attention runs on (options.threads of them, the caller included).
  ThreadPool& pool() { return *pool_; }
  const DecodeStats& decode_stats() const { return dstats_; }

  // Prefills a prompt (ids [T], docs [T] document ids, or empty: one document) and returns the
  // sequence's handle; logits [vocab] of the prompt's last token go to *last_logits (on every
  // rank when sharded; a sharded prompt needs at least 2P tokens for zigzag, P for contiguous).
  int prefill(const std::vector<int32_t>& ids, const std::vector<int32_t>& docs,
              std::vector<float>* last_logits);
  // A sequence whose K/V come from elsewhere (a benchmark's synthetic cache, a saved one):
  // fill(layer, k, v) writes layer's K and V, [T, kv_heads, head_dim] each (K after RoPE).
  // Not sharded (throws GenerateError with ranks > 1).
  int attach(const std::vector<int32_t>& ids, const std::vector<int32_t>& docs,
             const std::function<void(int layer, float* k, float* v)>& fill);
  // One decode step: token tokens[i] is appended to sequence seqs[i] (same document as its last
  // token); logits [B, vocab] are the next-token logits after it.
  StepTiming step(const std::vector<int>& seqs, const std::vector<int32_t>& tokens,
                  std::vector<float>* logits);
  // Frees a sequence's pages (shared pages stay while other sequences hold them).
  void release(int seq);
  int64_t length(int seq) const { return seqs_[static_cast<size_t>(seq)].total; }
  // Tokens of sequence seq whose K/V this rank holds (length() when not sharded).
  int64_t local_length(int seq) const {
    return static_cast<int64_t>(seqs_[static_cast<size_t>(seq)].ids.size());
  }
  bool sharded() const { return options_.shard.ranks > 1; }

 private:
  struct Sequence {
    bool live = false;
    std::vector<int32_t> ids, docs;  // the tokens whose K/V this rank holds, in order
    int64_t total = 0;               // tokens of the sequence (every rank's)
    int32_t last_doc = 0;            // document of the sequence's last token
    // Keys of this rank's pages: over (id, doc) of every token when not sharded; sharded, over
    // (prefix hash, position) of each token this rank holds (`prefix` runs over every token).
    PrefixHash hash;
    PrefixHash prefix;
    std::vector<std::vector<std::vector<PageId>>> pages;  // [layer][kv_head][page]
  };
  class Capture;
  // A new live sequence and the keys of its full pages, [layer][page * kv_heads + head].
  // Sharded: only the tokens at `local` (global indices, ascending) are this rank's.
  int open_sequence(const std::vector<int32_t>& ids, const std::vector<int32_t>& docs,
                    std::vector<std::vector<PageKey>>* keys,
                    const std::vector<int64_t>* local = nullptr);
  void check_shard() const;
  void ingest_layer(Sequence& s, const std::vector<PageKey>& page_keys_of_layer, int layer,
                    const float* k, const float* v);
  std::vector<PageId> window_pages() const;
  // The decode step's weights (on step_).
  const float* w(int64_t offset) const { return step_params_ + offset; }
  void linear(int64_t rows, const float* x, int64_t off_w, int64_t out, int64_t in, float* y);

  model::ModelConfig config_;
  kernels::Backend* backend_;
  std::unique_ptr<kernels::Backend> step_backend_;  // cpu: the decode step's one-thread backend
  kernels::Backend* step_ = nullptr;                // where the decode step's dense ops run
  const float* step_params_ = nullptr;              // their weights: the model's, or dev_params_
  model::DeviceArray<float> dev_params_;            // a separate device's copy of the weights
  bool bf16_ = false;                               // config_.dtype bf16 (docs/precision.md)
  model::DeviceArray<uint16_t> step_bf16_;          // bf16: the step's weights as bf16 (on step_)
  model::DeviceArray<uint16_t> x_bf16_;             // bf16: a GEMM's input rounded (on step_)
  GeneratorOptions options_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<DecodeAttention> attention_;
  std::unique_ptr<model::LocalAttention> local_;
  std::unique_ptr<Capture> capture_;
  std::unique_ptr<model::Model> model_;  // prefill, and the weights of the decode step
  kernels::RopeParams rope_;
  std::vector<Sequence> seqs_;
  DecodeStats dstats_;

  struct Off {
    int64_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  };
  std::vector<Off> off_;
  int64_t off_final_norm_ = 0, off_head_ = 0, off_embedding_ = 0;
  // Decode step scratch (backend memory), [B, ...].
  model::DeviceArray<int32_t> ids_;
  model::DeviceArray<int64_t> pos_;
  model::DeviceArray<float> x_, h_, q_, k_, v_, o_, tmp_, rstd_, gate_, up_, act_, logits_;
};

}  // namespace ring::gen
