// The decoder-only transformer: forward and backward written out with the kernels::Backend ops
// (no autograd), over THIS rank's tokens. fp32, or with config.dtype bf16 the mixed precision of
// docs/precision.md: every GEMM reads bf16 operands (the working weights and its input rounded
// once, the one rounding) and accumulates in fp32 into an fp32 output; Q, K and V are rounded to
// bf16 after RoPE (what attention and the ring read), the attention output o after attention
// (what the wo GEMM reads and the attention backward's rowsum(dout * o) uses); the residual
// stream, norms, softmax, loss, the MLP's gate/up (GEMM outputs) and gradients stay fp32.
//
//   x0 = embedding[tokens]                                            [T, d]
//   for each block l:
//     h1 = rmsnorm(x, attn_norm.gain)                                 [T, d]
//     q = rope(h1 wq^T), k = rope(h1 wk^T), v = h1 wv^T               [T, H|KH, hd], global pos
//     o = attention(q, k, v; causal at global positions, same doc)    [T, H, hd] (AttentionExecutor)
//     x = x + o wo^T
//     h2 = rmsnorm(x, mlp_norm.gain)
//     swiglu: x = x + (silu(h2 w_gate^T) * (h2 w_up^T)) w_down^T
//     gelu:   x = x + gelu(h2 w_up^T) w_down^T                        (exact erf GELU)
//   logits = rmsnorm(x, final_norm.gain) W^T, W = lm_head.weight or embedding.weight (tied)
//   loss = sum over valid labels of cross-entropy / global_valid      (label -1: ignored)
//
// global_valid is the number of valid labels over the WHOLE sequence (all ranks), so that rank
// losses and gradients simply add up. RoPE rotates pairs (x[2j], x[2j+1]) by pos * theta^(-2j/hd).
//
// Memory: activations are allocated once per token count and reused. Without recompute each block
// keeps h1, q, k, v, o, lse, x_mid, h2, gate/up ([T, hidden] each) for the backward; with
// model.recompute only each block's input x is kept and the block's forward is re-run in the
// backward (identical arithmetic, so identical gradients). Everything is linear in T: attention
// never materialises [T, T]. bf16 without recompute keeps the six values that are bf16 already
// (h1, h2: GEMM inputs; q, k, v, o) as bf16, 2 bytes (the compact layout): a layer's forward
// computes them in one fp32 work set shared by all layers and keeps their bf16 copies; its
// backward feeds the bf16 h1, h2 and o straight to the bf16 GEMMs and widens q, k, v, o into
// the work set for attention (exact both ways, so the same bits as fp32 storage). x, x_mid,
// rstd, lse and gate/up stay fp32. With recompute the one layer's set stays fp32.
//
// Weights: an fp32 model holds them in fp32 (params()). A bf16 model without a block store holds
// them ONLY in bf16 (params_bf16(), 2 bytes a parameter, what ringctl plan counts): set_params
// rounds fp32 straight into them (the one rounding); the GEMMs read them as they are; the fp32
// kernels' small inputs are widened from them (exact): the norm gains into a per-tensor fp32
// copy ([2 layers + 1] x [d]) refreshed by every set_params, the embedding rows gathered as bf16
// into a [T, d] scratch and widened. A bf16 model with a store rounds each acquired block into a
// slot (fp32 and bf16), as before.
//
// model.recompute_policy selective (Megatron's selective recompute): each block keeps its input
// x, q, k, v (after RoPE), o and lse, what the attention backward needs; one set shared by all
// layers holds h1, rstd1, x_mid, h2, rstd2 and gate/up, which the backward re-runs
// (layer_recompute: h1 = rmsnorm(x), x_mid = x + o wo^T, h2 = rmsnorm(x_mid), gate/up) with the
// forward's arithmetic, so the gradients are those of no recompute, bit for bit. The attention
// executor (and its ring hops) runs once per layer, as without recompute. bf16 keeps q, k, v, o
// as bf16 (the compact layout's copies, widened into the work set) and the shared h1, h2 as
// bf16 copies, the GEMM inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/model/buffer.h"
#include "worker/model/config.h"

namespace ring::model {

// This rank's tokens. Host pointers; all arrays [tokens].
struct Batch {
  int64_t tokens = 0;
  const int32_t* ids = nullptr;        // token ids in [0, vocab)
  const int32_t* labels = nullptr;     // next-token labels, -1 = ignored
  const int64_t* positions = nullptr;  // global positions (RoPE and the causal mask)
  const int32_t* doc_ids = nullptr;    // document ids (mask); nullptr: one document
};

struct LossResult {
  double loss_sum = 0;   // sum of per-token cross-entropy over this rank's valid labels (nats)
  int64_t valid = 0;     // this rank's valid labels
  // loss_sum / global_valid: this rank's share of the global mean loss.
  double loss = 0;
};

// Called during the backward each time a bucket of the gradient buffer is final (in bucket
// order: head, layers L-1 .. 0, embedding). See layout.h.
using BucketReadyFn = std::function<void(const GradBucket&)>;

// Where a model without flat buffers (parallel.shard full) gets each block's weights and leaves
// each block's gradient. A block is a gradient bucket of the layout (head, one layer, the
// embedding); pointers address the bucket's first float, [bucket floats] each, in backend memory.
// The model calls, per forward_backward: acquire/release around every block's use, in the order
// embedding, layers 0 .. L-1, head (+ embedding when tied), then layers L-1 .. 0 again for the
// backward; grads(b) once per block before its backward writes it (accumulating, +=), and
// grads_done(b) when the block's gradient of this batch is final, in bucket order; end_pass()
// last. Every rank of the store's group makes the same calls in the same order.
class BlockStore {
 public:
  virtual ~BlockStore() = default;
  // The weights of bucket b, valid until release(b). `next` (-1: none) is the bucket the model
  // acquires after this one: the store may start fetching it now.
  virtual const float* acquire(int b, int next) = 0;
  // For a model of dtype bf16, which takes its blocks this way first: bucket b's weights already
  // in bf16 (the values the model would round them to), valid until release(b); or null, with
  // nothing acquired, when the store holds fp32 (then acquire). parallel.shard full's gathers
  // carry bf16 so (worker/ring/full_shard.h).
  virtual const uint16_t* acquire_bf16(int b, int next) { return nullptr; }
  virtual void release(int b) = 0;
  // A zeroed gradient buffer for bucket b, valid until grads_done(b).
  virtual float* grads(int b) = 0;
  virtual void grads_done(int b) = 0;
  virtual void end_pass() = 0;
};

class Model {
 public:
  // backend and attention (and store) must outlive the model. With a store the model allocates
  // no flat weight or gradient buffer (params() and grads() are null; set_params, get_params,
  // get_grads, copy_grads_to_host and init_params throw): every block comes from the store.
  Model(const ModelConfig& config, kernels::Backend* backend, AttentionExecutor* attention,
        BlockStore* store = nullptr);

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  // RoPE as the config gives it (theta and scaling), checked at construction.
  const kernels::RopeParams& rope() const { return rope_; }
  kernels::Backend* backend() const { return backend_; }

  // Flat buffers in backend memory, [layout().total()] each. grads() is fp32 for every dtype.
  // params(): the fp32 weights of an fp32 model; null for a bf16 model, which holds its weights
  // only as bf16 (params_bf16(), null for fp32): the fp32 master lives elsewhere (ringd, or the
  // caller, e.g. train::Trainer) and reaches the model through set_params, which rounds it.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  const uint16_t* params_bf16() const { return params_bf16_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }

  // Deterministic init from a seed (train.seed), = set_params(initial_params(seed)): norm gains 1;
  // embedding, lm_head, wq, wk, wv, w_gate, w_up ~ N(0, 0.02^2); the projections into the residual
  // stream (wo, w_down) ~ N(0, (0.02 / sqrt(2 layers))^2) (GPT-2). Each tensor draws from its own
  // stream (SplitMix64(seed, tensor index) -> mt19937_64 -> Box-Muller), independent of the
  // platform's <random> distributions.
  void init_params(uint64_t seed);
  // The same initial weights as a host vector [layout().total()] (works with a store too).
  std::vector<float> initial_params(uint64_t seed) const;
  // Floats [begin, end) of them into out[0 .. end-begin) (e.g. one node's range, straight into
  // the shared memory), without the whole model in memory: a tensor cut by the range is drawn
  // whole into a scratch vector.
  void initial_params(uint64_t seed, int64_t begin, int64_t end, float* out) const;
  // Host copies of the flat buffers ([layout().total()] floats). set_params copies fp32 weights in:
  // an fp32 model keeps them as they are; a bf16 model keeps them rounded to bf16 (the one
  // rounding, nearest even), so get_params() then returns the rounded values, widened to fp32
  // (exact), not the ones set. Each call replaces all the weights; nothing refers to the source
  // afterwards.
  void set_params(const std::vector<float>& host);
  // The same from n host floats (n == layout().total()), e.g. straight from ringd's shared memory.
  void set_params(const float* host, int64_t n);
  // The same from n floats in backend memory (e.g. a trainer's fp32 master on the device).
  void set_params_from_device(const float* src, int64_t n);
  // grads()[begin, end) into host memory dst[0 .. end-begin) (a device backend: one copy of just
  // that range, e.g. a finished bucket straight into ringd's shared memory).
  void copy_grads_to_host(int64_t begin, int64_t end, float* dst) const;
  // The weights as the model holds them, as fp32 (bf16: the rounded values, widened).
  std::vector<float> get_params() const;
  std::vector<float> get_grads() const;
  void zero_grads();

  // Forward and backward; gradients are ACCUMULATED (+=) into grads() (call zero_grads() first
  // for a fresh step). global_valid > 0. on_bucket (optional) is called as buckets complete.
  LossResult forward_backward(const Batch& batch, int64_t global_valid,
                              const BucketReadyFn& on_bucket = {});
  // Forward only (evaluation). After it, logits() holds [T, vocab].
  LossResult forward(const Batch& batch, int64_t global_valid);
  const float* logits() const { return logits_.data(); }

  // Bytes of what the model keeps for the backward as of the last pass: the block inputs x
  // ([layers + 1] x [T, d] fp32), every layer's saved set, and the compact layout's fp32 work
  // set; not the backward's scratch, the logits or the weights. docs/planning.md's activation
  // formula counts these.
  int64_t activation_bytes() const;

 private:
  // One layer's saved activations. fp32 (and bf16 with recompute): all in the fp32 arrays. The
  // compact layout (bf16 without recompute): h1, q, k, v, o, h2 in the *_b arrays (bf16 bits),
  // the rest fp32; its work set (work_) holds only the six fp32 arrays.
  struct LayerActs {
    DeviceArray<float> h1, q, k, v, o, lse, x_mid, h2, gate, up, rstd1, rstd2;
    DeviceArray<uint16_t> h1_b, q_b, k_b, v_b, o_b, h2_b;
  };
  // kFp32 / kBf16Saved: a whole layer set (fp32, or the compact one); kWork: the compact work
  // set; kAttnFp32 / kAttnBf16: selective's per-layer q, k, v, o (fp32 or bf16) and lse;
  // kMidFp32 / kMidBf16: selective's shared set, h1 and h2 (fp32 or bf16) and x_mid, gate/up,
  // rstd1, rstd2.
  enum class ActsKind { kFp32, kBf16Saved, kWork, kAttnFp32, kAttnBf16, kMidFp32, kMidBf16 };
  // One block's weights as a pass reads them (a gradient bucket; offsets in off_* are relative
  // to it). fp32: f32. bf16 with a store: the slot's rounded fp32 (f32) and its bits (bf16).
  // bf16 without a store: bf16 only (the flat bf16 buffer; gains and embedding rows widened).
  struct Weights {
    int64_t begin = 0;  // the bucket's first float in the flat layout
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
  };
  void prepare(const Batch& batch);
  // w: the block's weights (its bucket's first float), gr: its gradient; offsets in off_ and
  // off_*_ are relative to the bucket.
  void layer_forward(int l, LayerActs& a, const Weights& w);
  // Parts of layer_forward: h1 = rmsnorm(x); x_mid = x + o wo^T, h2 = rmsnorm(x_mid) and the
  // MLP's gate/up; the MLP's output into x[l + 1].
  void norm1_forward(int l, LayerActs& a, const Weights& w);
  void post_attention_forward(int l, LayerActs& a, const Weights& w, const uint16_t* ob);
  void mlp_out_forward(int l, LayerActs& a, const Weights& w);
  // Selective: what the backward of layer l needs that the layer does not keep (norm1 and
  // post_attention_forward again, from the kept x and o).
  void layer_recompute(int l, LayerActs& a, const Weights& w);
  // The set holding layer a's x_mid, gate/up, rstd and bf16 h1/h2: a itself, or selective's
  // shared set.
  LayerActs& mid(LayerActs& a) { return selective_ ? sel_ : a; }
  // Where h1 and h2 are computed in fp32: the compact work set, or mid(a).
  LayerActs& norms(LayerActs& a) { return compact_ ? work_ : mid(a); }
  void layer_backward(int l, LayerActs& a, const Weights& w, float* gr);
  void embed_forward(const Weights& we);
  // wh: the head bucket; we: the embedding bucket (tied embeddings' LM head, else unused).
  LossResult head_forward(int64_t global_valid, bool with_grad, const Weights& wh,
                          const Weights& we);
  void head_backward(const Weights& wh, const Weights& we, float* gh, float* ge);
  // A bucket's weights and gradient: from the flat buffers or the store.
  Weights acquire(const GradBucket& b, int next);
  void release(const GradBucket& b);
  float* block_grads(const GradBucket& b);
  void grads_done(const GradBucket& b);
  void require_flat(const char* what) const;
  AttentionCall attention_call(int l, LayerActs& a) const;
  void ensure(LayerActs& a, ActsKind kind);
  // The start of forward and forward_backward: arguments checked, the batch's buffers, the
  // weights (prepare_weights).
  void begin_pass(const Batch& batch, int64_t global_valid, const char* what);
  // The fp32 values of the gain at offset off of block w (a norm's [d] gain): w's own fp32, or
  // (bf16 without a store) the widened copy in gains_.
  const float* gain(const Weights& w, int64_t off) const;
  // A GEMM's weight operand at offset off of block w: bf16 bits (bf16) or fp32.
  const void* gemm_weight(const Weights& w, int64_t off) const;
  // bf16 without a store: gains_ refreshed from params_bf16_ (after every set_params).
  void widen_gains();
  // bf16 without a store: n fp32 values from `src` (backend memory when on_device, else host)
  // rounded into params_bf16_, through staging_ when the source is host memory.
  void round_into_params(const float* src, int64_t n, bool on_device);
  // n values of x as bf16 into scratch (the one rounding).
  const uint16_t* to_bf16(const float* x, int64_t n, DeviceArray<uint16_t>& scratch);
  // y[T, out] = x[T, in] w[out, in]^T. bf16: xb (when not null) is x already in bf16 (a kept
  // copy; x may then be null), else x is converted.
  void linear(const float* x, const uint16_t* xb, const Weights& w, int64_t off, int64_t out,
              int64_t in, float* y);
  // dx[T, in] (beta: 0 overwrite, 1 accumulate) += dy[T, out] w[out, in]
  void linear_dx(const float* dy, const Weights& w, int64_t off, int64_t out, int64_t in,
                 float beta, float* dx);
  // dw[out, in] += dy[T, out]^T x[T, in]; xb as for linear.
  void linear_dw(const float* dy, const float* x, const uint16_t* xb, int64_t out, int64_t in,
                 float* dw);

  ModelConfig config_;
  ParamLayout layout_;
  kernels::Backend* backend_;
  AttentionExecutor* attention_;
  kernels::RopeParams rope_;  // from config_ (theta and scaling)

  // Per-layer offsets of each named tensor from the layer's bucket, cached: [layers][kind].
  struct LayerOffsets {
    int64_t attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  };
  std::vector<LayerOffsets> off_;
  // final_norm from the head bucket; the LM head from the head bucket (untied) or the embedding
  // bucket (tied); the embedding from the embedding bucket.
  int64_t off_final_norm_ = 0, off_head_ = 0, off_embedding_ = 0;
  BlockStore* store_ = nullptr;

  DeviceArray<float> params_, grads_;
  bool bf16_ = false;                  // config_.dtype == bf16
  DeviceArray<uint16_t> params_bf16_;  // bf16, no store: [layout().total()] the weights
  DeviceArray<float> gains_;           // bf16, no store: [2 layers + 1] x [d] widened gains
  // The gains' flat offsets, in gains_ order: layer l's attn_norm (2l), mlp_norm (2l + 1), the
  // final norm (2 layers).
  std::vector<int64_t> gain_offsets_;
  DeviceArray<float> staging_;          // bf16, no store: set_params' host chunks
  const int32_t* host_ids_ = nullptr;   // the current batch's ids (host), for odd d_model
  // GEMM operands converted to bf16 (a_bf16_ also: bf16 without a store, the embedding rows)
  DeviceArray<uint16_t> a_bf16_, b_bf16_;
  // bf16 with a block store: each acquired block's weights rounded into a slot of this pool with
  // their bf16 copy (the store's own buffer is left as it is); a slot is free again at release.
  struct Bf16Slot {
    int bucket = -1;  // -1: free
    int64_t n = 0;
    DeviceArray<float> rounded;
    DeviceArray<uint16_t> bits;
  };
  std::vector<Bf16Slot> bf16_slots_;

  int64_t t_ = 0;  // tokens of the current batch
  DeviceArray<int32_t> ids_, labels_, docs_;
  DeviceArray<int64_t> pos_;
  bool has_docs_ = false;
  std::vector<DeviceArray<float>> xs_;  // [layers + 1] x [T, d]: block inputs, final output
  std::vector<LayerActs> acts_;         // [layers] or [1] with full recompute
  bool full_recompute_ = false;         // recompute, policy full: the whole block re-run
  bool selective_ = false;              // recompute, policy selective (see top)
  bool compact_ = false;                // bf16 without full recompute: acts_ keep bf16 (see top)
  LayerActs sel_;                       // selective: the one shared non-attention set
  LayerActs work_;                      // compact: one layer's fp32 h1, q, k, v, o, h2
  DeviceArray<float> xf_, rstd_f_, logits_;  // [T, d], [T], [T, vocab]
  // Backward scratch.
  DeviceArray<float> dx_, dtmp_, dh_, dact_, dgate_, dup_, act_, dq_, dk_, dv_, do_;
};

}  // namespace ring::model
