// The CPU backend: every Backend op on host memory. Attention forwards to kernels/cpu/attention.h,
// everything else to kernels/cpu/ops.h; GEMM goes through the provider of kernels/cpu/gemm.h
// (OpenBLAS or oneDNN; bf16 operands through its bf16 path). Calls run synchronously on the
// calling thread plus up to threads() OpenMP (or OpenBLAS) threads.
#pragma once

#include <mutex>
#include <string>

#include "kernels/backend.h"

namespace ring::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  // threads >= 1 (create_backend resolves 0 to all cores).
  explicit CpuBackend(int threads);

  int threads() const { return threads_; }

  const char* name() const override { return "cpu"; }
  bool supports(Op op, DType dtype) const override;
  Status synchronize() override { return Status::kOk; }

  Status alloc(size_t bytes, void** out) override;
  Status free(void* p) override;
  Status copy_to_device(void* dst, const void* src, size_t bytes) override;
  Status copy_to_host(void* dst, const void* src, size_t bytes) override;

  Status gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
              int64_t ldc) override;
  Status gemm_mixed(DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                    float beta, void* c, int64_t ldc) override;

  Status attention_forward(const AttentionArgs& a, float* out, float* lse,
                           AttentionStats* stats) override;
  Status attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a,
                         float* lse_a, const float* out_b, const float* lse_b) override;
  Status paged_decode_attention(const PagedDecodeArgs& a, float* out, float* lse) override;
  Status attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads, int64_t head_dim,
                                    const float* out, const void* dout, float* delta) override;
  Status attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                            const float* delta, float* dq, float* dk, float* dv,
                            AttentionStats* stats) override;

  Status rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x, const float* gain,
                         float* y, float* rstd) override;
  Status rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain,
                          const float* rstd, const float* dy, float* dx, float* dgain) override;
  using Backend::rope;
  Status rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& p, const int64_t* pos,
              bool inverse, float* x) override;
  Status swiglu_forward(int64_t n, const float* gate, const float* up, float* out) override;
  Status swiglu_backward(int64_t n, const float* gate, const float* up, const float* dout,
                         float* dgate, float* dup) override;
  Status gelu_forward(int64_t n, const float* x, float* out) override;
  Status gelu_backward(int64_t n, const float* x, const float* dout, float* dx) override;

  Status embedding_forward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                           const float* table, float* out) override;
  Status embedding_backward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                            const float* dout, float* dtable) override;
  Status cross_entropy(int64_t n, int64_t vocab, const float* logits, const int32_t* labels,
                       float grad_scale, double* loss_sum, int64_t* valid, float* dlogits) override;

  Status adamw_step(int64_t n, const AdamWParams& hp, float* param, const float* grad, float* m,
                    float* v) override;
  Status topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices, float* values) override;

  Status fill(int64_t n, float value, float* x) override;
  Status scale(int64_t n, float alpha, float* x) override;
  Status axpy(int64_t n, float alpha, const float* x, float* y) override;
  Status add(int64_t n, const float* a, const float* b, float* out) override;
  Status sum_squares(int64_t n, const float* x, double* out) override;
  Status convert(DType from, DType to, int64_t n, const void* x, void* out) override;
  Status round_to_bf16(int64_t n, float* x) override;

  // What the last failed GEMM said (the path, the library call, the CPU feature missing).
  std::string last_error() const override;

 private:
  int threads_;
  mutable std::mutex err_mu_;
  std::string last_error_;
};

}  // namespace ring::kernels::cpu
