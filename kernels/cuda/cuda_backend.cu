// CudaBackend: device setup, memory, copies, GEMM (cuBLAS), the offload streams, error
// reporting, and the C entry points of libring_kernels_cuda.so (plugin_abi.h).
#include "kernels/cuda/cuda_backend.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/cuda/plugin_abi.h"

namespace ring::kernels::cuda {
namespace {

template <typename T>
__global__ void scale_matrix_kernel(int64_t m, int64_t n, int64_t ld, float beta, T* c) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < m * n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / n, j = idx % n;
    T* p = c + i * ld + j;
    if constexpr (std::is_same_v<T, float>) {
      *p = beta == 0.f ? 0.f : *p * beta;
    } else {
      *p = __float2bfloat16_rn(beta == 0.f ? 0.f : __bfloat162float(*p) * beta);
    }
  }
}

const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

}  // namespace

std::unique_ptr<CudaBackend> CudaBackend::create(int device, std::string* error) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    *error = std::string("no usable CUDA device: ") +
             (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0 devices");
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
      *error += " (no NVIDIA GPU, or its driver libcuda.so.1 is missing or older than the CUDA " +
                std::to_string(CUDART_VERSION / 1000) + " runtime)";
    }
    cudaGetLastError();  // clear the (non-sticky) error for later callers
    return nullptr;
  }
  if (device < 0 || device >= count) {
    *error = "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
             " visible)";
    return nullptr;
  }
  cudaDeviceProp prop{};
  if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
    *error = std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e);
    return nullptr;
  }
  if (prop.major < 8) {
    *error = "CUDA device " + std::to_string(device) + " (" + prop.name + ") is sm_" +
             std::to_string(prop.major) + std::to_string(prop.minor) +
             "; the CUDA backend needs sm_80 or newer (bf16 tensor cores)";
    return nullptr;
  }
  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->device_ = device;
  be->sm_count_ = prop.multiProcessorCount;
  int optin = 0;
  auto setup = [&]() -> std::string {
    if ((e = cudaSetDevice(device)) != cudaSuccess) return "cudaSetDevice";
    if ((e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
        cudaSuccess) {
      return "cudaDeviceGetAttribute";
    }
    if ((e = cudaStreamCreateWithFlags(&be->stream_, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&be->d2h_, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&be->h2d_, cudaStreamNonBlocking)) != cudaSuccess) {
      return "cudaStreamCreateWithFlags";
    }
    // Keep freed scratch in the stream-ordered pool instead of returning it at each sync.
    cudaMemPool_t pool = nullptr;
    if ((e = cudaDeviceGetDefaultMemPool(&pool, device)) != cudaSuccess) {
      return "cudaDeviceGetDefaultMemPool";
    }
    uint64_t threshold = UINT64_MAX;
    if ((e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold)) !=
        cudaSuccess) {
      return "cudaMemPoolSetAttribute";
    }
    return {};
  };
  if (std::string what = setup(); !what.empty()) {
    *error = what + ": " + cudaGetErrorString(e);
    return nullptr;
  }
  be->smem_optin_ = static_cast<size_t>(optin);
  cublasStatus_t cs = cublasCreate(&be->cublas_);
  if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasSetStream(be->cublas_, be->stream_);
  // Default math: fp32 GEMMs stay fp32 (no TF32), bf16 GEMMs use tensor cores.
  if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasSetMathMode(be->cublas_, CUBLAS_DEFAULT_MATH);
  if (cs != CUBLAS_STATUS_SUCCESS) {
    *error = std::string("cublasCreate: ") + cublas_name(cs);
    return nullptr;
  }
  return be;
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  if (d2h_) cudaStreamSynchronize(d2h_);
  if (h2d_) cudaStreamSynchronize(h2d_);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
  if (d2h_) cudaStreamDestroy(d2h_);
  if (h2d_) cudaStreamDestroy(h2d_);
}

bool CudaBackend::supports(Op op, DType dtype) const {
  switch (op) {
    case Op::kGemm:
    case Op::kAttentionForward:
    case Op::kAttentionBackward:
    case Op::kPagedDecode:  // a bf16 K/V pool (q, out, lse stay fp32)
      return dtype == DType::kF32 || dtype == DType::kBF16;
    default:
      return dtype == DType::kF32;
  }
}

Status CudaBackend::fail(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::kOk;
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    last_error_ =
        std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  }
  // A non-sticky error (a failed allocation or cudaHostRegister) stays in the runtime's
  // last-error slot until read: clear it, or the next launch's check_launch would report it.
  (void)cudaGetLastError();
  return e == cudaErrorMemoryAllocation ? Status::kOutOfMemory : Status::kDeviceError;
}

Status CudaBackend::fail_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::kOk;
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    last_error_ = std::string(what) + ": " + cublas_name(s);
  }
  return s == CUBLAS_STATUS_ALLOC_FAILED ? Status::kOutOfMemory : Status::kDeviceError;
}

Status CudaBackend::invalid(const std::string& why) {
  std::lock_guard<std::mutex> lock(err_mu_);
  last_error_ = why;
  return Status::kInvalidArgument;
}

Status CudaBackend::unsupported(const std::string& why) {
  std::lock_guard<std::mutex> lock(err_mu_);
  last_error_ = why;
  return Status::kUnsupported;
}

Status CudaBackend::check_launch(const char* what) {
  return fail(cudaGetLastError(), what);
}

std::string CudaBackend::last_error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return last_error_;
}

Status CudaBackend::use_device() {
  return fail(cudaSetDevice(device_), "cudaSetDevice");
}

Status CudaBackend::scratch(size_t bytes, void** out) {
  *out = nullptr;
  return fail(cudaMallocAsync(out, bytes == 0 ? 1 : bytes, stream_), "cudaMallocAsync(scratch)");
}

void CudaBackend::scratch_free(void* p) {
  if (p != nullptr) cudaFreeAsync(p, stream_);
}

Status CudaBackend::synchronize() {
  if (Status s = use_device(); s != Status::kOk) return s;
  return fail(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

Status CudaBackend::alloc(size_t bytes, void** out) {
  if (out == nullptr) return invalid("alloc: out must not be null");
  *out = nullptr;
  if (bytes == 0) return Status::kOk;
  if (Status s = use_device(); s != Status::kOk) return s;
  return fail(cudaMalloc(out, bytes), "cudaMalloc");
}

Status CudaBackend::free(void* p) {
  if (p == nullptr) return Status::kOk;
  if (Status s = use_device(); s != Status::kOk) return s;
  return fail(cudaFree(p), "cudaFree");
}

Status CudaBackend::copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::kOk;
  if (dst == nullptr || src == nullptr) return invalid("copy_to_device: null pointer");
  if (Status s = use_device(); s != Status::kOk) return s;
  Status s = fail(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                  "cudaMemcpyAsync(host to device)");
  // The caller may reuse src as soon as this returns.
  if (s == Status::kOk) s = fail(cudaStreamSynchronize(stream_), "copy_to_device");
  return s;
}

Status CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::kOk;
  if (dst == nullptr || src == nullptr) return invalid("copy_to_host: null pointer");
  if (Status s = use_device(); s != Status::kOk) return s;
  Status s = fail(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_),
                  "cudaMemcpyAsync(device to host)");
  if (s == Status::kOk) s = fail(cudaStreamSynchronize(stream_), "copy_to_host");
  return s;
}

Status CudaBackend::gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                         float beta, void* c, int64_t ldc) {
  return gemm_mixed(dtype, dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

Status CudaBackend::gemm_mixed(DType ab, DType c_dtype, bool trans_a, bool trans_b, int64_t m,
                               int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                               const void* b, int64_t ldb, float beta, void* c, int64_t ldc) {
  if ((ab != DType::kF32 && ab != DType::kBF16) ||
      (c_dtype != DType::kF32 && c_dtype != DType::kBF16)) {
    return invalid("gemm: dtype must be f32 or bf16");
  }
  // cuBLAS has no fp32 A/B with a bf16 C under CUBLAS_COMPUTE_32F.
  if (ab == DType::kF32 && c_dtype == DType::kBF16) {
    return unsupported("gemm: fp32 A and B with a bf16 C is not implemented");
  }
  if (m < 0 || n < 0 || k < 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX ||
      ldb > INT_MAX || ldc > INT_MAX) {
    return invalid("gemm: m, n, k and leading dimensions must be in [0, 2^31)");
  }
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  if (lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, b_cols) ||
      ldc < std::max<int64_t>(1, n)) {
    return invalid("gemm: leading dimension smaller than the row length (row-major)");
  }
  if (m == 0 || n == 0) return Status::kOk;
  if (c == nullptr || (k > 0 && (a == nullptr || b == nullptr))) {
    return invalid("gemm: null pointer");
  }
  if (k == 0 || alpha == 0.f) {  // C = beta C (beta 0 overwrites, as BLAS does), in C's storage
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((m * n + 255) / 256, 65535));
    if (c_dtype == DType::kF32) {
      scale_matrix_kernel<float>
          <<<grid, 256, 0, stream_>>>(m, n, ldc, beta, static_cast<float*>(c));
    } else {
      scale_matrix_kernel<__nv_bfloat16>
          <<<grid, 256, 0, stream_>>>(m, n, ldc, beta, static_cast<__nv_bfloat16*>(c));
    }
    return check_launch("gemm (beta * C)");
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands. A and B
  // as ab, C as c_dtype (bf16 x bf16 -> fp32 C is a cublasGemmEx combination), fp32 compute.
  const cudaDataType_t tab = ab == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType_t tc = c_dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  return fail_cublas(cublasGemmEx(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                                  static_cast<int>(m), static_cast<int>(k), &alpha, b, tab,
                                  static_cast<int>(ldb), a, tab, static_cast<int>(lda), &beta, c,
                                  tc, static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
}

Status CudaBackend::attention_forward(const AttentionArgs& a, float* out, float* lse,
                                      AttentionStats* stats) {
  return cuda::attention_forward(*this, a, out, lse, stats);
}

Status CudaBackend::attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a,
                                    float* lse_a, const float* out_b, const float* lse_b) {
  return cuda::attention_merge(*this, tokens, heads, head_dim, out_a, lse_a, out_b, lse_b);
}

Status CudaBackend::paged_decode_attention(const PagedDecodeArgs& a, float* out, float* lse) {
  if (Status s = use_device(); s != Status::kOk) return s;
  return cuda::paged_decode_attention(*this, a, out, lse);
}

Status CudaBackend::attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads,
                                               int64_t head_dim, const float* out, const void* dout,
                                               float* delta) {
  return cuda::attention_backward_prepare(*this, dtype, tokens, heads, head_dim, out, dout, delta);
}

Status CudaBackend::attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                                       const float* delta, float* dq, float* dk, float* dv,
                                       AttentionStats* stats) {
  return cuda::attention_backward(*this, a, dout, lse, delta, dq, dk, dv, stats);
}

// ---- offload path -----------------------------------------------------------------------------
Status CudaBackend::pin_host(void* host, size_t bytes) {
  if (host == nullptr || bytes == 0) return invalid("pin_host: null pointer or zero bytes");
  if (Status s = use_device(); s != Status::kOk) return s;
  // Portable: pinned for every context; works on POSIX shm (MAP_SHARED) mappings.
  return fail(cudaHostRegister(host, bytes, cudaHostRegisterPortable), "cudaHostRegister");
}

Status CudaBackend::unpin_host(void* host) {
  if (host == nullptr) return invalid("unpin_host: null pointer");
  if (Status s = use_device(); s != Status::kOk) return s;
  return fail(cudaHostUnregister(host), "cudaHostUnregister");
}

namespace {
// `waiter` waits (on the device) for everything queued on `on` so far.
cudaError_t order_after(cudaStream_t waiter, cudaStream_t on) {
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, on);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(waiter, ev, 0);
  if (ev != nullptr) cudaEventDestroy(ev);  // released once it has completed
  return e;
}
}  // namespace

Status CudaBackend::offload_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::kOk;
  if (host_dst == nullptr || src == nullptr) return invalid("offload_to_host: null pointer");
  if (Status s = use_device(); s != Status::kOk) return s;
  if (Status s = fail(order_after(d2h_, stream_), "offload_to_host (event)"); s != Status::kOk) {
    return s;
  }
  return fail(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, d2h_),
              "cudaMemcpyAsync(offload device to host)");
}

Status CudaBackend::offload_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return Status::kOk;
  if (dst == nullptr || host_src == nullptr) return invalid("offload_to_device: null pointer");
  if (Status s = use_device(); s != Status::kOk) return s;
  // Ops queued before this call still read the old contents of dst: copy after them, and make
  // ops queued later wait for the copy.
  Status s = fail(order_after(h2d_, stream_), "offload_to_device (event)");
  if (s == Status::kOk) {
    s = fail(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, h2d_),
             "cudaMemcpyAsync(offload host to device)");
  }
  if (s == Status::kOk) s = fail(order_after(stream_, h2d_), "offload_to_device (event)");
  return s;
}

Status CudaBackend::offload_wait() {
  if (Status s = use_device(); s != Status::kOk) return s;
  Status s = fail(cudaStreamSynchronize(d2h_), "offload_wait (device to host)");
  if (s == Status::kOk) s = fail(cudaStreamSynchronize(h2d_), "offload_wait (host to device)");
  return s;
}

}  // namespace ring::kernels::cuda

// ---- C entry points
// -------------------------------------------------------------------------------
namespace {

ring::kernels::Backend* create_cuda_backend(int device, char* err, size_t err_len) {
  std::string error;
  if (device < 0) {
    device = 0;
    if (const char* env = std::getenv("RING_CUDA_DEVICE"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      long v = std::strtol(env, &end, 10);
      if (*end != '\0' || v < 0 || v > INT_MAX) {
        error = std::string("RING_CUDA_DEVICE='") + env + "' is not a device index (0, 1, ...)";
      } else {
        device = static_cast<int>(v);
      }
    }
  }
  std::unique_ptr<ring::kernels::cuda::CudaBackend> be;
  if (error.empty()) {
    try {
      be = ring::kernels::cuda::CudaBackend::create(device, &error);
    } catch (const std::exception& e) {
      error = std::string("CUDA backend setup: ") + e.what();
    }
  }
  if (!be && err != nullptr && err_len > 0) {
    std::snprintf(err, err_len, "%s", error.c_str());
  }
  return be.release();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const ring_kernels_cuda_entry_t*
ring_kernels_cuda_entry(void) {
  static const ring_kernels_cuda_entry_t entry = {
      sizeof(ring_kernels_cuda_entry_t), ring::kernels::cuda::kRingKernelsCudaAbi,
      ring::kernels::cuda::kBackendInterfaceHash, ring::kernels::cuda::kBuiltWith,
      &create_cuda_backend};
  return &entry;
}
