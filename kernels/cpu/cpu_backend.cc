#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"

namespace ring::kernels::cpu {

CpuBackend::CpuBackend(int threads) : threads_(std::max(1, threads)) {}

bool CpuBackend::supports(Op op, DType dtype) const {
  switch (op) {
    case Op::kGemm:  // bf16 A and B through gemm.h's bf16 path (gemm_mixed: fp32 or bf16 C)
    case Op::kAttentionForward:   // bf16 q/k/v (and dout) widened to fp32 at tile packing
    case Op::kAttentionBackward:
    case Op::kPagedDecode:        // a bf16 K/V pool, widened as rows are read
      return dtype == DType::kF32 || dtype == DType::kBF16;
    default:  // every other op is fp32 only
      return dtype == DType::kF32;
  }
}

Status CpuBackend::alloc(size_t bytes, void** out) {
  if (out == nullptr) return Status::kInvalidArgument;
  *out = nullptr;
  if (bytes == 0) return Status::kOk;
  // aligned_alloc needs a multiple of the alignment; 64 bytes = one cache line, one AVX-512
  // vector.
  constexpr size_t kAlign = 64;
  if (bytes > SIZE_MAX - kAlign) return Status::kOutOfMemory;
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) return Status::kOutOfMemory;
  *out = p;
  return Status::kOk;
}

Status CpuBackend::free(void* p) {
  std::free(p);
  return Status::kOk;
}

Status CpuBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::kOk;
  if (dst == nullptr || src == nullptr) return Status::kInvalidArgument;
  std::memmove(dst, src, bytes);
  return Status::kOk;
}

Status CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  return copy_to_device(dst, src, bytes);
}

Status CpuBackend::gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                        float beta, void* c, int64_t ldc) {
  return gemm_mixed(dtype, dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

Status CpuBackend::gemm_mixed(DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m,
                              int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                              const void* b, int64_t ldb, float beta, void* c, int64_t ldc) {
  std::string error;
  Status s = cpu::gemm_mixed(ab, c_dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                             c, ldc, threads_, &error);
  if (s != Status::kOk) {
    std::lock_guard<std::mutex> lock(err_mu_);
    last_error_ = std::move(error);
  }
  return s;
}

std::string CpuBackend::last_error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return last_error_;
}

Status CpuBackend::attention_forward(const AttentionArgs& a, float* out, float* lse,
                                     AttentionStats* stats) {
  return cpu::attention_forward(a, out, lse, stats, threads_);
}

Status CpuBackend::attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a,
                                   float* lse_a, const float* out_b, const float* lse_b) {
  return cpu::attention_merge(tokens, heads, head_dim, out_a, lse_a, out_b, lse_b, threads_);
}

Status CpuBackend::paged_decode_attention(const PagedDecodeArgs& a, float* out, float* lse) {
  return cpu::paged_decode_attention(a, out, lse, threads_);
}

Status CpuBackend::attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads,
                                              int64_t head_dim, const float* out, const void* dout,
                                              float* delta) {
  return cpu::attention_backward_prepare(dtype, tokens, heads, head_dim, out, dout, delta,
                                         threads_);
}

Status CpuBackend::attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                                      const float* delta, float* dq, float* dk, float* dv,
                                      AttentionStats* stats) {
  return cpu::attention_backward(a, dout, lse, delta, dq, dk, dv, stats, threads_);
}

Status CpuBackend::rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x,
                                   const float* gain, float* y, float* rstd) {
  return cpu::rmsnorm_forward(n, d, eps, x, gain, y, rstd, threads_);
}

Status CpuBackend::rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain,
                                    const float* rstd, const float* dy, float* dx, float* dgain) {
  return cpu::rmsnorm_backward(n, d, x, gain, rstd, dy, dx, dgain, threads_);
}

Status CpuBackend::rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& p,
                        const int64_t* pos, bool inverse, float* x) {
  return cpu::rope(n, heads, head_dim, p, pos, inverse, x, threads_);
}

Status CpuBackend::swiglu_forward(int64_t n, const float* gate, const float* up, float* out) {
  return cpu::swiglu_forward(n, gate, up, out, threads_);
}

Status CpuBackend::swiglu_backward(int64_t n, const float* gate, const float* up, const float* dout,
                                   float* dgate, float* dup) {
  return cpu::swiglu_backward(n, gate, up, dout, dgate, dup, threads_);
}

Status CpuBackend::gelu_forward(int64_t n, const float* x, float* out) {
  return cpu::gelu_forward(n, x, out, threads_);
}

Status CpuBackend::gelu_backward(int64_t n, const float* x, const float* dout, float* dx) {
  return cpu::gelu_backward(n, x, dout, dx, threads_);
}

Status CpuBackend::embedding_forward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                                     const float* table, float* out) {
  return cpu::embedding_forward(n, vocab, d, ids, table, out, threads_);
}

Status CpuBackend::embedding_backward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                                      const float* dout, float* dtable) {
  return cpu::embedding_backward(n, vocab, d, ids, dout, dtable, threads_);
}

Status CpuBackend::cross_entropy(int64_t n, int64_t vocab, const float* logits,
                                 const int32_t* labels, float grad_scale, double* loss_sum,
                                 int64_t* valid, float* dlogits) {
  return cpu::cross_entropy(n, vocab, logits, labels, grad_scale, loss_sum, valid, dlogits,
                            threads_);
}

Status CpuBackend::adamw_step(int64_t n, const AdamWParams& hp, float* param, const float* grad,
                              float* m, float* v) {
  return cpu::adamw_step(n, hp, param, grad, m, v, threads_);
}

Status CpuBackend::topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices,
                            float* values) {
  return cpu::topk_abs(n, k, x, indices, values, threads_);
}

Status CpuBackend::fill(int64_t n, float value, float* x) {
  return cpu::fill(n, value, x, threads_);
}

Status CpuBackend::scale(int64_t n, float alpha, float* x) {
  return cpu::scale(n, alpha, x, threads_);
}

Status CpuBackend::axpy(int64_t n, float alpha, const float* x, float* y) {
  return cpu::axpy(n, alpha, x, y, threads_);
}

Status CpuBackend::add(int64_t n, const float* a, const float* b, float* out) {
  return cpu::add(n, a, b, out, threads_);
}

Status CpuBackend::sum_squares(int64_t n, const float* x, double* out) {
  return cpu::sum_squares(n, x, out, threads_);
}

Status CpuBackend::convert(DType from, DType to, int64_t n, const void* x, void* out) {
  if (from == DType::kF32 && to == DType::kBF16)
    return cpu::to_bf16(n, static_cast<const float*>(x), static_cast<uint16_t*>(out), threads_);
  if (from == DType::kBF16 && to == DType::kF32)
    return cpu::from_bf16(n, static_cast<const uint16_t*>(x), static_cast<float*>(out), threads_);
  if (from != to || (from != DType::kF32 && from != DType::kBF16) || n < 0 ||
      (n > 0 && (x == nullptr || out == nullptr)))
    return Status::kInvalidArgument;
  if (n > 0 && x != out) std::memcpy(out, x, static_cast<size_t>(n) * dtype_size(from));
  return Status::kOk;
}

Status CpuBackend::round_to_bf16(int64_t n, float* x) { return cpu::round_bf16(n, x, threads_); }

}  // namespace ring::kernels::cpu
