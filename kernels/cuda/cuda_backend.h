// The CUDA backend: every Backend op on device memory, queued on one compute stream.
//
// Internal to libring_kernels_cuda.so (kernels/cuda/plugin_abi.h is its only door): nothing
// outside the library includes this header, so CPU-only binaries never see CUDA types.
//
//   - Calls are asynchronous on the compute stream; synchronize() waits. Calls that return a
//     host value (cross_entropy's loss, sum_squares, attention stats) or validate device data
//     (embedding ids, labels) wait for their own result.
//   - Every launcher returns a Status; a CUDA or cuBLAS failure gives kDeviceError (kOutOfMemory
//     for allocation failures) and last_error() names the call and the library's message.
//   - dtype: attention (forward, backward, prepare) and GEMM take fp32 or bf16 storage, always
//     with fp32 accumulation (gemm_mixed: bf16 A/B with an fp32 C too); every other op is
//     fp32, as backend.h says for float*.
//   - Scratch memory comes from the stream-ordered pool (cudaMallocAsync), so it is reused
//     without a device-wide synchronisation.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

#include "kernels/backend.h"

namespace ring::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  // device >= 0. Returns nullptr and sets *error when there is no such device or setup fails.
  static std::unique_ptr<CudaBackend> create(int device, std::string* error);
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  bool supports(Op op, DType dtype) const override;
  Status synchronize() override;

  Status alloc(size_t bytes, void** out) override;
  Status free(void* p) override;
  Status copy_to_device(void* dst, const void* src, size_t bytes) override;
  Status copy_to_host(void* dst, const void* src, size_t bytes) override;

  Status gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
              int64_t ldc) override;
  // bf16 A/B with an fp32 C through cublasGemmEx (fp32 compute); fp32 A/B with a bf16 C is
  // kUnsupported.
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
  Status topk_feedback(int64_t n, int64_t k, float* residual, const float* grad, uint32_t* indices,
                       float* values) override;

  Status fill(int64_t n, float value, float* x) override;
  Status scale(int64_t n, float alpha, float* x) override;
  Status axpy(int64_t n, float alpha, const float* x, float* y) override;
  Status add(int64_t n, const float* a, const float* b, float* out) override;
  Status sum_squares(int64_t n, const float* x, double* out) override;
  Status convert(DType from, DType to, int64_t n, const void* x, void* out) override;
  Status round_to_bf16(int64_t n, float* x) override;

  Status pin_host(void* host, size_t bytes) override;
  Status unpin_host(void* host) override;
  Status offload_to_host(void* host_dst, const void* src, size_t bytes) override;
  Status offload_to_device(void* dst, const void* host_src, size_t bytes) override;
  Status offload_wait() override;

  std::string last_error() const override;

  // ---- for the kernels in this library ------------------------------------------------------
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  int sm_count() const { return sm_count_; }
  size_t smem_optin() const { return smem_optin_; }
  // Maps a CUDA error to a Status, remembering "what: message" for last_error().
  Status fail(cudaError_t e, const char* what);
  Status fail_cublas(cublasStatus_t s, const char* what);
  // kInvalidArgument with a remembered reason.
  Status invalid(const std::string& why);
  Status unsupported(const std::string& why);
  // cudaGetLastError after a launch.
  Status check_launch(const char* what);
  // Scratch from the stream-ordered pool; release with scratch_free (also stream-ordered).
  Status scratch(size_t bytes, void** out);
  void scratch_free(void* p);

 private:
  CudaBackend() = default;
  // Ensures the calling thread has this backend's device current.
  Status use_device();

  int device_ = 0;
  int sm_count_ = 0;
  size_t smem_optin_ = 0;
  cudaStream_t stream_ = nullptr;  // compute
  cudaStream_t d2h_ = nullptr;     // offload_to_host
  cudaStream_t h2d_ = nullptr;     // offload_to_device
  cublasHandle_t cublas_ = nullptr;
  mutable std::mutex err_mu_;
  std::string last_error_;
};

// Launchers in attention.cu and ops.cu: the Backend contract, arguments already non-null where
// backend.h requires it is checked inside each.
Status attention_forward(CudaBackend& be, const AttentionArgs& a, float* out, float* lse,
                         AttentionStats* stats);
Status attention_merge(CudaBackend& be, int64_t tokens, int64_t heads, int64_t head_dim,
                       float* out_a, float* lse_a, const float* out_b, const float* lse_b);
// paged_decode.cu
Status paged_decode_attention(CudaBackend& be, const PagedDecodeArgs& a, float* out, float* lse);
Status attention_backward_prepare(CudaBackend& be, DType dtype, int64_t tokens, int64_t heads,
                                  int64_t head_dim, const float* out, const void* dout,
                                  float* delta);
Status attention_backward(CudaBackend& be, const AttentionArgs& a, const void* dout,
                          const float* lse, const float* delta, float* dq, float* dk, float* dv,
                          AttentionStats* stats);

}  // namespace ring::kernels::cuda
