// The backend-neutral kernel interface of ringmaster.
//
// Every compute op a worker (or ringd) needs, on raw pointers and sizes, returning a Status.
// kernels/cpu/ implements it for the CPU (and is the reference for tests); kernels/cuda/
// implements it for NVIDIA GPUs. No exceptions cross this interface; a backend says what it
// supports (supports()) instead of silently falling back.
//
// Conventions
//   - Row-major. Shapes are given in comments as [dim0, dim1, ...], innermost last.
//   - Token-major activations: q is [tokens, heads, head_dim], lse is [tokens, heads].
//   - `DType` says how tensors passed as void* are stored; accumulation, log-sum-exp, losses,
//     optimizer state and every float* argument are fp32.
//   - "accumulate" outputs are added to (+=), never overwritten; callers zero them first.
//   - Pointers are device pointers of the backend (host pointers for the CPU backend).
//   - Calls are asynchronous on the backend's stream for CUDA; synchronize() waits. The CPU
//     backend runs synchronously on the calling thread plus its own worker threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/rope.h"

namespace ring::kernels {

enum class Status : int {
  kOk = 0,
  kInvalidArgument = 1,  // a size, pointer or combination the op cannot take
  kUnsupported = 2,      // valid, but not implemented by this backend (dtype, head_dim, ...)
  kOutOfMemory = 3,
  kDeviceError = 4,      // the device or its library failed (CUDA error, cuBLAS status)
  kInternal = 5,
};
const char* status_string(Status s);

enum class DType : int { kF32 = 0, kBF16 = 1 };
size_t dtype_size(DType t);

enum class Op : int {
  kGemm,
  kAttentionForward,
  kAttentionBackward,
  kAttentionMerge,
  kRmsNorm,
  kRope,
  kSwiGLU,
  kGelu,
  kEmbedding,
  kCrossEntropy,
  kAdamW,
  kTopK,
  kElementwise,
  kPagedDecode,
};

// Attention over one (query block, key/value block) pair, as ring attention calls it: the query
// block is this rank's tokens, the K/V block may come from any rank. Masks come from global
// positions and document ids, so the same call serves every block of the ring.
//
// A query token i may attend to key token j iff
//     (!causal || k_pos[j] <= q_pos[i]) && (q_doc == nullptr || q_doc[i] == k_doc[j]).
// Rows with no allowed key get out = 0 and lse = -inf (an empty partial).
struct AttentionArgs {
  int64_t q_len = 0;     // query tokens in this block
  int64_t kv_len = 0;    // key/value tokens in this block
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // key/value heads; heads % kv_heads == 0 (GQA: head h uses h / (heads/kv_heads))
  int64_t head_dim = 0;
  float scale = 0.f;     // softmax scale, usually 1/sqrt(head_dim)
  bool causal = true;
  DType dtype = DType::kF32;      // storage of q, k, v (and dout in the backward): fp32 or bf16
                                  // (uint16_t bits); out, lse, delta, dq, dk, dv stay fp32
  const void* q = nullptr;        // [q_len, heads, head_dim]
  const void* k = nullptr;        // [kv_len, kv_heads, head_dim]
  const void* v = nullptr;        // [kv_len, kv_heads, head_dim]
  const int64_t* q_pos = nullptr; // [q_len] global positions
  const int64_t* k_pos = nullptr; // [kv_len]
  const int32_t* q_doc = nullptr; // [q_len] document ids, or nullptr (no document mask)
  const int32_t* k_doc = nullptr; // [kv_len], nullptr iff q_doc is
};

// Decode attention over a pool of K/V pages (generation's fast tier, worker/generate): the partial
// (out, lse) of each query row over ONE page of the pool. The pool holds `slots` pages of
// `page_tokens` rows each: slot s is K [page_tokens, head_dim] then V [page_tokens, head_dim],
// stored as `dtype` (fp32 or bf16), at element pool + s * 2 * page_tokens * head_dim, and the
// document id of each row at pool_docs + s * page_tokens. Only the pool follows dtype: q, out and
// lse are fp32 whatever it is (q is one row per step, the pool is the cache), and bf16 K/V are
// widened to fp32 exactly as they are read, so a bf16 pool gives the results of an fp32 pool
// holding the same (rounded) values. Row r reads the first tokens[r] rows of page slot[r]; it may
// attend to row j iff pool_docs[slot[r]][j] == q_doc[r] (every cached key precedes the query and
// carries its RoPE already, so there is no causal or position test). Accumulation in fp32;
// out [rows, head_dim] normalised, lse [rows] natural log; a row with no allowed key gets out 0
// and lse -inf (an empty partial, merged as nothing).
struct PagedDecodeArgs {
  int64_t rows = 0;          // query rows (one per (page, sequence, query head) the caller needs)
  int64_t head_dim = 0;
  int64_t page_tokens = 0;   // rows per page slot (the pool's layout)
  float scale = 0.f;         // softmax scale, usually 1/sqrt(head_dim)
  DType dtype = DType::kF32; // storage of the pool (K and V); everything else is as typed below
  const void* pool = nullptr;         // [slots, 2, page_tokens, head_dim] of dtype
  const int32_t* pool_docs = nullptr; // [slots, page_tokens]
  const float* q = nullptr;           // [rows, head_dim]
  const int32_t* q_doc = nullptr;     // [rows]
  const int32_t* slot = nullptr;      // [rows] the pool slot row r reads
  const int32_t* tokens = nullptr;    // [rows] filled rows of that slot, in [0, page_tokens]
};

// Work accounting, accumulated by the attention calls when a pointer is given.
struct AttentionStats {
  int64_t tiles_total = 0;    // (query tile, key tile) pairs considered
  int64_t tiles_skipped = 0;  // pairs with no allowed (query, key) pair: not computed
  int64_t tiles_masked = 0;   // pairs computed with a partial mask
  double flops = 0;           // multiply-adds x 2 actually performed
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Whether op is implemented for dtype. Ops called with an unsupported dtype return
  // kUnsupported.
  virtual bool supports(Op op, DType dtype) const = 0;
  // Waits for all queued work (no-op on the CPU).
  virtual Status synchronize() = 0;

  // Device memory (host memory on the CPU backend, 64-byte aligned).
  virtual Status alloc(size_t bytes, void** out) = 0;
  virtual Status free(void* p) = 0;
  // Copies between host and device (or host and host); kinds are implied by the backend.
  virtual Status copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual Status copy_to_host(void* dst, const void* src, size_t bytes) = 0;

  // ---- dense linear algebra -----------------------------------------------------------------
  // C[m,n] = alpha * op(A) op(B) + beta * C, row-major. op(A) is [m,k]: A is [m,k] (lda >= k)
  // or, with trans_a, [k,m] (lda >= m). op(B) is [k,n]: B is [k,n] or, with trans_b, [n,k].
  // A and B are stored as dtype; C is fp32 with DType kF32 and dtype otherwise.
  virtual Status gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                      float beta, void* c, int64_t ldc) = 0;
  // The same GEMM with A and B stored as ab and C as c_dtype: (kBF16, kF32) is what training
  // needs (bf16 operands, fp32 outputs, weight gradients accumulated in fp32 with beta = 1);
  // (d, d) is gemm(d, ...). Accumulation is fp32 whatever the storage; a bf16 C is rounded once
  // (round to nearest even), after alpha and beta are applied. The default runs gemm() when
  // ab == c_dtype and returns kUnsupported otherwise (supports(kGemm, ab) does not cover mixed
  // storage: a backend that implements it overrides this).
  virtual Status gemm_mixed(DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m,
                            int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                            const void* b, int64_t ldb, float beta, void* c, int64_t ldc) {
    if (ab != c_dtype) return Status::kUnsupported;
    return gemm(ab, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  // ---- attention ----------------------------------------------------------------------------
  // Forward over one block pair: out [q_len, heads, head_dim] fp32 and lse [q_len, heads] fp32
  // (natural log) of this block pair alone. Tiled with an online softmax: extra memory is
  // O(tile), never O(q_len x kv_len). Tiles with no allowed pair are skipped.
  virtual Status attention_forward(const AttentionArgs& a, float* out, float* lse,
                                   AttentionStats* stats) = 0;

  // Merges a partial (out_b, lse_b) into (out_a, lse_a), exactly in fp32:
  //   m = max(lse_a, lse_b); lse = m + log(exp(lse_a - m) + exp(lse_b - m))
  //   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b
  // Empty partials (lse = -inf) leave the other side unchanged; two empties stay empty.
  // out_*: [tokens, heads, head_dim]; lse_*: [tokens, heads].
  virtual Status attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a,
                                 float* lse_a, const float* out_b, const float* lse_b) = 0;

  // delta[i, h] = sum_d dout[i, h, d] * out[i, h, d]  (FlashAttention-2's D), fp32.
  // out is the final (merged) output, fp32; dout is stored as dtype.
  virtual Status attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads,
                                            int64_t head_dim, const float* out,
                                            const void* dout, float* delta) = 0;

  // Backward over one block pair, recomputing probabilities from the final lse of the query
  // rows: P = exp(S - lse). Accumulates (+=) into fp32 dq [q_len, heads, head_dim],
  // dk and dv [kv_len, kv_heads, head_dim]. dout [q_len, heads, head_dim] is stored as a.dtype;
  // lse and delta are [q_len, heads]. Skips the same tiles as the forward.
  virtual Status attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                                    const float* delta, float* dq, float* dk, float* dv,
                                    AttentionStats* stats) = 0;

  // Paged decode attention (PagedDecodeArgs above): out [rows, head_dim], lse [rows], fp32. All
  // pointers are backend memory. Asynchronous on the CUDA stream like every op: the caller
  // may work on the host meanwhile and reads the results after copy_to_host/synchronize().
  // Backends without it return kUnsupported (supports(kPagedDecode, a.dtype) says); a dtype
  // that is neither kF32 nor kBF16 is kInvalidArgument.
  virtual Status paged_decode_attention(const PagedDecodeArgs& a, float* out, float* lse) {
    return Status::kUnsupported;
  }

  // ---- normalisation, position, activations -------------------------------------------------
  // y = x / rms(x) * gain over the last dim; rstd[i] = 1 / sqrt(mean(x_i^2) + eps).
  // x, y: [n, d]; gain: [d]; rstd: [n].
  virtual Status rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x,
                                 const float* gain, float* y, float* rstd) = 0;
  // dx = d/dx (overwritten), dgain += d/dgain.
  virtual Status rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain,
                                  const float* rstd, const float* dy, float* dx,
                                  float* dgain) = 0;

  // Rotary embedding in place on x [n, heads, head_dim], rotating pairs (x[2j], x[2j+1]) by
  // angle pos[i] * rope_inv_freq(p, j, head_dim) and multiplying by rope_attention_factor(p)
  // (kernels/rope.h: theta^(-2j/head_dim) and 1 without scaling). inverse applies the transpose
  // (negative angle, same factor): the backward, and the inverse when the factor is 1.
  // kInvalidArgument unless rope_params_valid(p).
  virtual Status rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& p,
                      const int64_t* pos, bool inverse, float* x) = 0;
  // Without scaling: base frequency theta.
  Status rope(int64_t n, int64_t heads, int64_t head_dim, float theta, const int64_t* pos,
              bool inverse, float* x) {
    RopeParams p;
    p.theta = static_cast<double>(theta);
    return rope(n, heads, head_dim, p, pos, inverse, x);
  }

  // out = silu(gate) * up; all [n].
  virtual Status swiglu_forward(int64_t n, const float* gate, const float* up, float* out) = 0;
  // dgate, dup overwritten.
  virtual Status swiglu_backward(int64_t n, const float* gate, const float* up,
                                 const float* dout, float* dgate, float* dup) = 0;
  // Exact GELU (erf form, as torch.nn.functional.gelu): out = x/2 (1 + erf(x/sqrt 2)); all [n].
  virtual Status gelu_forward(int64_t n, const float* x, float* out) = 0;
  virtual Status gelu_backward(int64_t n, const float* x, const float* dout, float* dx) = 0;

  // ---- embedding and loss -------------------------------------------------------------------
  // out[i, :] = table[ids[i], :]; table [vocab, d]; ids [n] in [0, vocab) (else kInvalidArgument).
  virtual Status embedding_forward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                                   const float* table, float* out) = 0;
  // dtable[ids[i], :] += dout[i, :].
  virtual Status embedding_backward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                                    const float* dout, float* dtable) = 0;

  // Softmax cross-entropy over logits [n, vocab] with labels [n]; label -1 is ignored.
  // *loss_sum = sum over valid rows of -log softmax(logits)[label] (fp64 accumulated);
  // *valid = number of valid rows. When dlogits is not null it receives
  // grad_scale * (softmax - onehot) for valid rows and 0 for ignored rows (the caller passes
  // grad_scale = 1 / global valid count). dlogits may alias logits.
  virtual Status cross_entropy(int64_t n, int64_t vocab, const float* logits,
                               const int32_t* labels, float grad_scale, double* loss_sum,
                               int64_t* valid, float* dlogits) = 0;

  // ---- optimizer and compression ------------------------------------------------------------
  // One AdamW step (decoupled weight decay, bias-corrected), in place on n fp32 values:
  //   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   p -= lr * ( (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps) + wd p )
  // step >= 1.
  struct AdamWParams {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step;
  };
  virtual Status adamw_step(int64_t n, const AdamWParams& hp, float* param, const float* grad,
                            float* m, float* v) = 0;

  // The k entries of x [n] with the largest |x|, exactly (ties broken by lower index):
  // indices (ascending) and their values. k <= n.
  virtual Status topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices,
                          float* values) = 0;
  // Top-k with error feedback: residual += grad; then the top-k of residual as topk_abs gives
  // them (indices ascending, values); then residual[indices] = 0, so residual keeps exactly
  // what was not selected for the next step. grad may be null (residual already accumulated).
  // The default composes axpy and topk_abs and zeroes the selected entries through host
  // pointers (right for host backends); device backends override it.
  virtual Status topk_feedback(int64_t n, int64_t k, float* residual, const float* grad,
                               uint32_t* indices, float* values) {
    if (grad != nullptr) {
      if (Status s = axpy(n, 1.f, grad, residual); s != Status::kOk) return s;
    }
    if (Status s = topk_abs(n, k, residual, indices, values); s != Status::kOk) return s;
    for (int64_t i = 0; i < k; ++i) residual[indices[i]] = 0.f;
    return Status::kOk;
  }

  // ---- elementwise helpers ------------------------------------------------------------------
  virtual Status fill(int64_t n, float value, float* x) = 0;
  virtual Status scale(int64_t n, float alpha, float* x) = 0;          // x *= alpha
  virtual Status axpy(int64_t n, float alpha, const float* x, float* y) = 0;  // y += alpha x
  virtual Status add(int64_t n, const float* a, const float* b, float* out) = 0;  // out = a + b
  virtual Status sum_squares(int64_t n, const float* x, double* out) = 0;  // fp64 accumulated

  // ---- storage conversion (docs/precision.md: the one rounding, common/numeric/bf16.h) --------
  // out[i] = x[i] stored as `to`: fp32 -> bf16 rounds to nearest even (NaN quiet, subnormals
  // kept), bf16 -> fp32 is exact, equal dtypes copy. x and out do not overlap.
  virtual Status convert(DType from, DType to, int64_t n, const void* x, void* out) {
    return Status::kUnsupported;
  }
  // x[i] = float(bf16(x[i])) in place: the value a bf16 store keeps, held in fp32 storage.
  virtual Status round_to_bf16(int64_t n, float* x) { return Status::kUnsupported; }

  // ---- offload path: host memory shared with ringd ------------------------------------------
  // The defaults are synchronous copies (right for host backends). The CUDA backend pins the
  // range (cudaHostRegister, e.g. on a POSIX shm mapping) and copies on two streams of its own,
  // one per direction, so the copies overlap kernels on the compute stream.
  // Pins [host, host + bytes) for fast asynchronous copies; unpin_host(host) undoes it before the
  // memory is unmapped.
  virtual Status pin_host(void* host, size_t bytes) { return Status::kOk; }
  virtual Status unpin_host(void* host) { return Status::kOk; }
  // Device-to-host: starts after every op queued so far on the compute stream (the gradients
  // are final) and does not hold up later ops. offload_wait() before the host reads dst.
  virtual Status offload_to_host(void* host_dst, const void* src, size_t bytes) {
    return copy_to_host(host_dst, src, bytes);
  }
  // Host-to-device: ops queued after this call see the copied data (e.g. parameters from
  // ringd's optimizer); the host must not change src until offload_wait() returns.
  virtual Status offload_to_device(void* dst, const void* host_src, size_t bytes) {
    return copy_to_device(dst, host_src, bytes);
  }
  // Waits until every offload copy issued so far is complete.
  virtual Status offload_wait() { return Status::kOk; }

  // What the last failed call of this backend said (library, call, error text), or empty.
  virtual std::string last_error() const { return {}; }
};

// Backends compiled into this build, in order of preference ("cuda" first when built).
std::vector<std::string> available_backends();

// Creates a backend by name ("cpu", "cuda"). threads: CPU worker threads (0: all cores).
// On failure returns nullptr and sets *error to a message that names what is missing.
std::unique_ptr<Backend> create_backend(const std::string& name, int threads,
                                        std::string* error);

}  // namespace ring::kernels
