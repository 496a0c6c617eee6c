// CudaBackend: every op other than attention and GEMM. fp32 storage (backend.h: every float* is
// fp32); reductions over rows are one block per row; fp64 where backend.h promises it (loss sum,
// sum of squares), reduced in a fixed order so results do not depend on scheduling. Exceptions:
// embedding_backward and rmsnorm_backward's dgain add with fp32 atomics (order-dependent
// rounding).
#include <cub/device/device_scan.cuh>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace ring::kernels::cuda {
namespace {

constexpr int kBlock = 256;

unsigned grid_for(int64_t n, int threads = kBlock) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535LL * 16));
}

template <class... P>
bool any_null(int64_t n, P... p) {
  return n > 0 && ((p == nullptr) || ...);
}

#define RING_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- elementwise ------------------------------------------------------------------------------
__global__ void fill_kernel(int64_t n, float v, float* x) {
  RING_GRID_STRIDE(i, n) x[i] = v;
}
__global__ void scale_kernel(int64_t n, float a, float* x) {
  RING_GRID_STRIDE(i, n) x[i] *= a;
}
// __float2bfloat16_rn rounds to nearest even, as common/numeric/bf16.h does.
__global__ void to_bf16_kernel(int64_t n, const float* x, __nv_bfloat16* out) {
  RING_GRID_STRIDE(i, n) out[i] = __float2bfloat16_rn(x[i]);
}
__global__ void from_bf16_kernel(int64_t n, const __nv_bfloat16* x, float* out) {
  RING_GRID_STRIDE(i, n) out[i] = __bfloat162float(x[i]);
}
__global__ void round_bf16_kernel(int64_t n, float* x) {
  RING_GRID_STRIDE(i, n) x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
}
__global__ void axpy_kernel(int64_t n, float a, const float* x, float* y) {
  RING_GRID_STRIDE(i, n) y[i] = fmaf(a, x[i], y[i]);
}
__global__ void add_kernel(int64_t n, const float* a, const float* b, float* out) {
  RING_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void swiglu_fwd_kernel(int64_t n, const float* gate, const float* up, float* out) {
  RING_GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}
__global__ void swiglu_bwd_kernel(int64_t n, const float* gate, const float* up, const float* dout,
                                  float* dgate, float* dup) {
  RING_GRID_STRIDE(i, n) {
    const float g = gate[i], u = up[i], d = dout[i];
    const float sig = 1.f / (1.f + expf(-g));
    const float silu = g * sig;
    dgate[i] = d * u * sig * (1.f + g * (1.f - sig));
    dup[i] = d * silu;
  }
}
__global__ void gelu_fwd_kernel(int64_t n, const float* x, float* out) {
  RING_GRID_STRIDE(i, n) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.f + erff(v * 0.70710678118654752440f));
  }
}
__global__ void gelu_bwd_kernel(int64_t n, const float* x, const float* dout, float* dx) {
  RING_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float cdf = 0.5f * (1.f + erff(v * 0.70710678118654752440f));
    const float pdf = 0.39894228040143267794f * expf(-0.5f * v * v);
    dx[i] = dout[i] * (cdf + v * pdf);
  }
}

struct AdamDev {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inv_sqrt_bc2, decay;
};
__global__ void adamw_kernel(int64_t n, AdamDev c, float* p, const float* g, float* m, float* v) {
  RING_GRID_STRIDE(i, n) {
    const float gi = g[i];
    const float mi = fmaf(c.beta1, m[i], c.one_minus_beta1 * gi);
    const float vi = fmaf(c.beta2, v[i], c.one_minus_beta2 * (gi * gi));
    const float denom = fmaf(sqrtf(vi), c.inv_sqrt_bc2, c.eps);
    p[i] = fmaf(-c.step_size, mi / denom, p[i] * c.decay);
    m[i] = mi;
    v[i] = vi;
  }
}

// ---- rmsnorm ----------------------------------------------------------------------------------
__global__ void rmsnorm_fwd_kernel(int64_t d, float eps, const float* x, const float* gain,
                                   float* y, float* rstd) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss = fmaf(xr[j], xr[j], ss);
  ss = block_sum(ss, red);
  const float r = 1.f / sqrtf(ss / static_cast<float>(d) + eps);
  float* yr = y + row * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) yr[j] = xr[j] * r * gain[j];
  if (threadIdx.x == 0) rstd[row] = r;
}

__global__ void rmsnorm_bwd_dx_kernel(int64_t d, const float* x, const float* gain,
                                      const float* rstd, const float* dy, float* dx) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  const float* dyr = dy + row * d;
  float dot = 0.f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dot = fmaf(gain[j] * dyr[j], xr[j], dot);
  dot = block_sum(dot, red);
  const float r = rstd[row];
  const float c = r * r * r * dot / static_cast<float>(d);
  float* dxr = dx + row * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dxr[j] = r * gain[j] * dyr[j] - c * xr[j];
}

// dgain[j] += sum over a chunk of rows of dy * x * rstd; blockIdx.y picks the chunk.
__global__ void rmsnorm_bwd_dgain_kernel(int64_t n, int64_t d, int64_t rows_per_chunk,
                                         const float* x, const float* rstd, const float* dy,
                                         float* dgain) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  const int64_t b = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t e = min(n, b + rows_per_chunk);
  float s = 0.f;
  for (int64_t i = b; i < e; ++i) s = fmaf(dy[i * d + j] * x[i * d + j], rstd[i], s);
  atomicAdd(&dgain[j], s);
}

// ---- rope -------------------------------------------------------------------------------------
__global__ void rope_kernel(int64_t n, int64_t heads, int64_t head_dim, RopeParams rp,
                            const int64_t* pos, double sign, float* x) {
  const double m = rope_attention_factor(rp);
  const int64_t half = head_dim / 2;
  RING_GRID_STRIDE(idx, n * heads * half) {
    const int64_t j = idx % half;
    const int64_t th = idx / half;  // token * heads + head
    const int64_t t = th / heads;
    const double inv = rope_inv_freq(rp, j, head_dim);
    double sn, cs;
    sincos(static_cast<double>(pos[t]) * inv, &sn, &cs);
    const float c = static_cast<float>(m * cs), s = static_cast<float>(sign * m * sn);
    float* p = x + th * head_dim + 2 * j;
    const float x0 = p[0], x1 = p[1];
    p[0] = x0 * c - x1 * s;
    p[1] = x1 * c + x0 * s;
  }
}

// ---- embedding --------------------------------------------------------------------------------
__global__ void ids_check_kernel(int64_t n, int64_t limit, const int32_t* ids, bool allow_minus1,
                                 int* bad) {
  RING_GRID_STRIDE(i, n) {
    const int32_t v = ids[i];
    if ((v < 0 || v >= limit) && !(allow_minus1 && v == -1)) atomicExch(bad, 1);
  }
}
__global__ void embedding_fwd_kernel(int64_t n, int64_t d, const int32_t* ids, const float* table,
                                     float* out) {
  RING_GRID_STRIDE(idx, n * d) {
    const int64_t i = idx / d, j = idx % d;
    out[idx] = table[static_cast<int64_t>(ids[i]) * d + j];
  }
}
__global__ void embedding_bwd_kernel(int64_t n, int64_t d, const int32_t* ids, const float* dout,
                                     float* dtable) {
  RING_GRID_STRIDE(idx, n * d) {
    const int64_t i = idx / d, j = idx % d;
    atomicAdd(&dtable[static_cast<int64_t>(ids[i]) * d + j], dout[idx]);
  }
}

// ---- cross-entropy ----------------------------------------------------------------------------
// One block per row: row_loss[row] (fp64) and row_valid[row]; dlogits written when given (may
// alias logits: every read of the row happens before the first write).
__global__ void ce_kernel(int64_t vocab, const float* logits, const int32_t* labels,
                          float grad_scale, double* row_loss, int* row_valid, float* dlogits) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const float* lr = logits + row * vocab;
  const int32_t label = labels[row];
  const bool valid = label >= 0;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_max(mx, red);
  float se = 0.f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) se += expf(lr[j] - mx);
  se = block_sum(se, red);  // ends with __syncthreads: every thread has read the row
  const float target = valid ? lr[label] : 0.f;
  __syncthreads();  // the read of lr[label] precedes any write through an aliasing dlogits
  if (threadIdx.x == 0) {
    row_valid[row] = valid ? 1 : 0;
    row_loss[row] = valid ? static_cast<double>(logf(se)) + mx - target : 0.0;
  }
  if (dlogits != nullptr) {
    float* dr = dlogits + row * vocab;
    const float inv = 1.f / se;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = 0.f;
      if (valid) g = grad_scale * (expf(lr[j] - mx) * inv - (j == label ? 1.f : 0.f));
      dr[j] = g;
    }
  }
}

// Single block: out[0] = sum of values (fp64), out_count = sum of counts; fixed order.
template <typename V>
__global__ void reduce_rows_kernel(int64_t n, const V* values, const int* counts, double* out,
                                   long long* out_count) {
  __shared__ double red[32];
  double s = 0.0;
  double c = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    s += static_cast<double>(values[i]);
    if (counts != nullptr) c += counts[i];
  }
  s = block_sum(s, red);
  c = block_sum(c, red);
  if (threadIdx.x == 0) {
    out[0] = s;
    if (out_count != nullptr) *out_count = static_cast<long long>(c);
  }
}

__global__ void sum_squares_partial_kernel(int64_t n, const float* x, double* partial) {
  __shared__ double red[32];
  double s = 0.0;
  RING_GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// ---- top-k by radix select --------------------------------------------------------------------
// Keys are |x| as bits: for non-negative floats the unsigned order is the numeric order, and NaN
// (any payload, sign cleared) sorts above +inf, as the contract wants.
__device__ __forceinline__ uint32_t abs_key(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

struct RadixState {
  uint32_t prefix, mask;
  unsigned long long need;  // how many of the elements matching prefix/mask are still wanted
};

__global__ void radix_hist_kernel(int64_t n, const float* x, const RadixState* st, int shift,
                                  unsigned long long* hist) {
  __shared__ unsigned int local[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint32_t prefix = st->prefix, mask = st->mask;
  RING_GRID_STRIDE(i, n) {
    const uint32_t key = abs_key(x[i]);
    if ((key & mask) == prefix) atomicAdd(&local[(key >> shift) & 0xffu], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
  }
}

__global__ void radix_init_kernel(RadixState* st, unsigned long long k) {
  *st = RadixState{0u, 0u, k};
}

// One thread: picks the digit holding the need-th largest key, from the top bin down.
__global__ void radix_pick_kernel(RadixState* st, int shift, unsigned long long* hist) {
  unsigned long long above = 0;
  for (int b = 255; b >= 0; --b) {
    const unsigned long long c = hist[b];
    if (above + c >= st->need) {
      st->need -= above;
      st->prefix |= static_cast<uint32_t>(b) << shift;
      st->mask |= 0xffu << shift;
      break;
    }
    above += c;
  }
  for (int b = 0; b < 256; ++b) hist[b] = 0;
}

__global__ void topk_eq_kernel(int64_t n, const float* x, const RadixState* st, uint32_t* eq) {
  const uint32_t t = st->prefix;
  RING_GRID_STRIDE(i, n) eq[i] = abs_key(x[i]) == t ? 1u : 0u;
}
// eq_rank[i] (exclusive scan of eq) -> sel[i]: taken when above the threshold key, or equal
// to it and among the first `need` equal ones (lowest indices win ties).
__global__ void topk_sel_kernel(int64_t n, const float* x, const RadixState* st,
                                const uint32_t* eq_rank, uint32_t* sel) {
  const uint32_t t = st->prefix;
  const unsigned long long need = st->need;
  RING_GRID_STRIDE(i, n) {
    const uint32_t key = abs_key(x[i]);
    sel[i] = (key > t || (key == t && eq_rank[i] < need)) ? 1u : 0u;
  }
}
__global__ void topk_scatter_kernel(int64_t n, const float* x, const RadixState* st,
                                    const uint32_t* eq_rank, const uint32_t* pos, uint32_t* indices,
                                    float* values) {
  const uint32_t t = st->prefix;
  const unsigned long long need = st->need;
  RING_GRID_STRIDE(i, n) {
    const uint32_t key = abs_key(x[i]);
    if (key > t || (key == t && eq_rank[i] < need)) {
      indices[pos[i]] = static_cast<uint32_t>(i);
      values[pos[i]] = x[i];
    }
  }
}
__global__ void zero_at_kernel(int64_t k, const uint32_t* indices, float* x) {
  RING_GRID_STRIDE(i, k) x[indices[i]] = 0.f;
}
__global__ void iota_kernel(int64_t n, const float* x, uint32_t* indices, float* values) {
  RING_GRID_STRIDE(i, n) {
    indices[i] = static_cast<uint32_t>(i);
    values[i] = x[i];
  }
}

}  // namespace

// ---- CudaBackend methods ----------------------------------------------------------------------
#define RING_LAUNCH(kernel, grid, block, ...)              \
  do {                                                     \
    kernel<<<(grid), (block), 0, stream()>>>(__VA_ARGS__); \
    return check_launch(#kernel);                          \
  } while (0)

Status CudaBackend::convert(DType from, DType to, int64_t n, const void* x, void* out) {
  if (n < 0 || (n > 0 && (x == nullptr || out == nullptr)))
    return invalid("convert: n >= 0 and x, out non-null required");
  if (n == 0) return Status::kOk;
  if (from == DType::kF32 && to == DType::kBF16) {
    RING_LAUNCH(to_bf16_kernel, grid_for(n), kBlock, n, static_cast<const float*>(x),
                static_cast<__nv_bfloat16*>(out));
  }
  if (from == DType::kBF16 && to == DType::kF32) {
    RING_LAUNCH(from_bf16_kernel, grid_for(n), kBlock, n, static_cast<const __nv_bfloat16*>(x),
                static_cast<float*>(out));
  }
  if (from != to || (from != DType::kF32 && from != DType::kBF16))
    return invalid("convert: f32 <-> bf16, or a copy of one dtype");
  if (x == out) return Status::kOk;
  const size_t elem = from == DType::kF32 ? sizeof(float) : sizeof(__nv_bfloat16);
  return fail(cudaMemcpyAsync(out, x, static_cast<size_t>(n) * elem,
                              cudaMemcpyDeviceToDevice, stream_),
              "convert (copy)");
}

Status CudaBackend::round_to_bf16(int64_t n, float* x) {
  if (n < 0 || any_null(n, x)) return invalid("round_to_bf16: n >= 0 and x non-null required");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(round_bf16_kernel, grid_for(n), kBlock, n, x);
}

Status CudaBackend::fill(int64_t n, float value, float* x) {
  if (n < 0 || any_null(n, x)) return invalid("fill: n >= 0 and x non-null required");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(fill_kernel, grid_for(n), kBlock, n, value, x);
}

Status CudaBackend::scale(int64_t n, float alpha, float* x) {
  if (n < 0 || any_null(n, x)) return invalid("scale: n >= 0 and x non-null required");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(scale_kernel, grid_for(n), kBlock, n, alpha, x);
}

Status CudaBackend::axpy(int64_t n, float alpha, const float* x, float* y) {
  if (n < 0 || any_null(n, x, y)) return invalid("axpy: n >= 0 and x, y non-null required");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(axpy_kernel, grid_for(n), kBlock, n, alpha, x, y);
}

Status CudaBackend::add(int64_t n, const float* a, const float* b, float* out) {
  if (n < 0 || any_null(n, a, b, out))
    return invalid("add: n >= 0 and a, b, out non-null required");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(add_kernel, grid_for(n), kBlock, n, a, b, out);
}

Status CudaBackend::sum_squares(int64_t n, const float* x, double* out) {
  if (n < 0 || any_null(n, x) || out == nullptr) return invalid("sum_squares: bad arguments");
  if (n == 0) {
    *out = 0.0;
    return Status::kOk;
  }
  const unsigned blocks = std::min<unsigned>(grid_for(n), 1024);
  void* p = nullptr;
  if (Status s = scratch(sizeof(double) * (blocks + 1), &p); s != Status::kOk) return s;
  double* partial = static_cast<double*>(p);
  sum_squares_partial_kernel<<<blocks, kBlock, 0, stream()>>>(n, x, partial);
  reduce_rows_kernel<double>
      <<<1, 1024, 0, stream()>>>(blocks, partial, nullptr, partial + blocks, nullptr);
  Status s = check_launch("sum_squares kernels");
  if (s == Status::kOk) {
    s = fail(
        cudaMemcpyAsync(out, partial + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream()),
        "cudaMemcpyAsync(sum_squares)");
  }
  scratch_free(p);
  if (s == Status::kOk) s = fail(cudaStreamSynchronize(stream()), "sum_squares");
  return s;
}

Status CudaBackend::swiglu_forward(int64_t n, const float* gate, const float* up, float* out) {
  if (n < 0 || any_null(n, gate, up, out)) return invalid("swiglu_forward: bad arguments");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(swiglu_fwd_kernel, grid_for(n), kBlock, n, gate, up, out);
}

Status CudaBackend::swiglu_backward(int64_t n, const float* gate, const float* up,
                                    const float* dout, float* dgate, float* dup) {
  if (n < 0 || any_null(n, gate, up, dout, dgate, dup)) {
    return invalid("swiglu_backward: bad arguments");
  }
  if (n == 0) return Status::kOk;
  RING_LAUNCH(swiglu_bwd_kernel, grid_for(n), kBlock, n, gate, up, dout, dgate, dup);
}

Status CudaBackend::gelu_forward(int64_t n, const float* x, float* out) {
  if (n < 0 || any_null(n, x, out)) return invalid("gelu_forward: bad arguments");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(gelu_fwd_kernel, grid_for(n), kBlock, n, x, out);
}

Status CudaBackend::gelu_backward(int64_t n, const float* x, const float* dout, float* dx) {
  if (n < 0 || any_null(n, x, dout, dx)) return invalid("gelu_backward: bad arguments");
  if (n == 0) return Status::kOk;
  RING_LAUNCH(gelu_bwd_kernel, grid_for(n), kBlock, n, x, dout, dx);
}

Status CudaBackend::adamw_step(int64_t n, const AdamWParams& hp, float* param, const float* grad,
                               float* m, float* v) {
  if (n < 0 || any_null(n, param, grad, m, v) || hp.step < 1 || !(hp.beta1 >= 0.f) ||
      !(hp.beta1 < 1.f) || !(hp.beta2 >= 0.f) || !(hp.beta2 < 1.f) || !(hp.eps >= 0.f) ||
      !std::isfinite(hp.lr) || !std::isfinite(hp.eps) || !std::isfinite(hp.weight_decay)) {
    return invalid("adamw_step: step >= 1, betas in [0, 1), eps >= 0, finite lr and decay");
  }
  if (n == 0) return Status::kOk;
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  AdamDev c;
  c.beta1 = hp.beta1;
  c.one_minus_beta1 = 1.f - hp.beta1;
  c.beta2 = hp.beta2;
  c.one_minus_beta2 = 1.f - hp.beta2;
  c.eps = hp.eps;
  c.step_size = static_cast<float>(hp.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  RING_LAUNCH(adamw_kernel, grid_for(n), kBlock, n, c, param, grad, m, v);
}

Status CudaBackend::rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x,
                                    const float* gain, float* y, float* rstd) {
  if (n < 0 || d < 0 || (n > 0 && d == 0) || !(eps >= 0.f) || !std::isfinite(eps) ||
      any_null(n, x, gain, y, rstd)) {
    return invalid("rmsnorm_forward: n >= 0, d > 0, finite eps >= 0, non-null pointers");
  }
  if (n == 0) return Status::kOk;
  if (n > INT32_MAX) return invalid("rmsnorm_forward: n must be < 2^31");
  RING_LAUNCH(rmsnorm_fwd_kernel, static_cast<unsigned>(n), kBlock, d, eps, x, gain, y, rstd);
}

Status CudaBackend::rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain,
                                     const float* rstd, const float* dy, float* dx, float* dgain) {
  if (n < 0 || d < 0 || (n > 0 && d == 0) || any_null(n, x, gain, rstd, dy, dx, dgain)) {
    return invalid("rmsnorm_backward: n >= 0, d > 0, non-null pointers");
  }
  if (n == 0) return Status::kOk;
  if (n > INT32_MAX) return invalid("rmsnorm_backward: n must be < 2^31");
  rmsnorm_bwd_dx_kernel<<<static_cast<unsigned>(n), kBlock, 0, stream()>>>(d, x, gain, rstd, dy,
                                                                           dx);
  if (Status s = check_launch("rmsnorm_bwd_dx_kernel"); s != Status::kOk) return s;
  const int64_t chunk = 256;
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks > 65535) {
    return unsupported("rmsnorm_backward: more than 65535 * 256 rows in one call");
  }
  dim3 grid(static_cast<unsigned>((d + kBlock - 1) / kBlock), static_cast<unsigned>(chunks));
  RING_LAUNCH(rmsnorm_bwd_dgain_kernel, grid, kBlock, n, d, chunk, x, rstd, dy, dgain);
}

Status CudaBackend::rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& rp,
                         const int64_t* pos, bool inverse, float* x) {
  if (n < 0 || heads < 0 || head_dim < 0 || head_dim % 2 != 0 || !rope_params_valid(rp) ||
      any_null(n, pos, x)) {
    return invalid(
        "rope: n, heads >= 0, even head_dim, valid RoPE parameters (finite theta > 0, "
        "scaling as kernels/rope.h), non-null pointers");
  }
  if (n == 0 || heads == 0 || head_dim == 0) return Status::kOk;
  const int64_t total = n * heads * (head_dim / 2);
  RING_LAUNCH(rope_kernel, grid_for(total), kBlock, n, heads, head_dim, rp, pos,
              inverse ? -1.0 : 1.0, x);
}

namespace {
// Checks ids (device memory) against [0, limit) (and -1 when allowed); waits for the answer.
Status check_ids(CudaBackend& be, int64_t n, int64_t limit, const int32_t* ids, bool allow_minus1,
                 const char* what) {
  void* p = nullptr;
  if (Status s = be.scratch(sizeof(int), &p); s != Status::kOk) return s;
  int* flag = static_cast<int*>(p);
  int host = 0;
  Status s = be.fail(cudaMemsetAsync(flag, 0, sizeof(int), be.stream()), "cudaMemsetAsync");
  if (s == Status::kOk) {
    ids_check_kernel<<<grid_for(n), kBlock, 0, be.stream()>>>(n, limit, ids, allow_minus1, flag);
    s = be.check_launch("ids_check_kernel");
  }
  if (s == Status::kOk) {
    s = be.fail(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, be.stream()),
                "cudaMemcpyAsync");
  }
  be.scratch_free(p);
  if (s == Status::kOk) s = be.fail(cudaStreamSynchronize(be.stream()), what);
  if (s == Status::kOk && host != 0) {
    return be.invalid(std::string(what) + ": an id is outside [0, " + std::to_string(limit) + ")" +
                      (allow_minus1 ? " and is not -1" : ""));
  }
  return s;
}
}  // namespace

Status CudaBackend::embedding_forward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                                      const float* table, float* out) {
  if (n < 0 || vocab < 0 || d < 0 || any_null(n, ids, out) ||
      (n > 0 && d > 0 && table == nullptr)) {
    return invalid("embedding_forward: bad sizes or null pointers");
  }
  if (n == 0) return Status::kOk;
  if (Status s = check_ids(*this, n, vocab, ids, false, "embedding_forward"); s != Status::kOk) {
    return s;
  }
  if (d == 0) return Status::kOk;
  RING_LAUNCH(embedding_fwd_kernel, grid_for(n * d), kBlock, n, d, ids, table, out);
}

Status CudaBackend::embedding_backward(int64_t n, int64_t vocab, int64_t d, const int32_t* ids,
                                       const float* dout, float* dtable) {
  if (n < 0 || vocab < 0 || d < 0 || any_null(n, ids) ||
      (n > 0 && d > 0 && (dout == nullptr || dtable == nullptr))) {
    return invalid("embedding_backward: bad sizes or null pointers");
  }
  if (n == 0) return Status::kOk;
  if (Status s = check_ids(*this, n, vocab, ids, false, "embedding_backward"); s != Status::kOk) {
    return s;
  }
  if (d == 0) return Status::kOk;
  RING_LAUNCH(embedding_bwd_kernel, grid_for(n * d), kBlock, n, d, ids, dout, dtable);
}

Status CudaBackend::cross_entropy(int64_t n, int64_t vocab, const float* logits,
                                  const int32_t* labels, float grad_scale, double* loss_sum,
                                  int64_t* valid, float* dlogits) {
  if (n < 0 || vocab < 0 || (n > 0 && vocab == 0) || any_null(n, logits, labels) ||
      loss_sum == nullptr || valid == nullptr) {
    return invalid("cross_entropy: bad sizes or null pointers");
  }
  if (n == 0) {
    *loss_sum = 0.0;
    *valid = 0;
    return Status::kOk;
  }
  if (n > INT32_MAX) return invalid("cross_entropy: n must be < 2^31");
  if (Status s = check_ids(*this, n, vocab, labels, true, "cross_entropy labels");
      s != Status::kOk) {
    return s;
  }
  void* p = nullptr;
  const size_t bytes = sizeof(double) * (n + 2) + sizeof(int) * n;
  if (Status s = scratch(bytes, &p); s != Status::kOk) return s;
  double* row_loss = static_cast<double*>(p);
  double* total = row_loss + n;
  long long* count = reinterpret_cast<long long*>(row_loss + n + 1);
  int* row_valid = reinterpret_cast<int*>(row_loss + n + 2);
  ce_kernel<<<static_cast<unsigned>(n), kBlock, 0, stream()>>>(vocab, logits, labels, grad_scale,
                                                               row_loss, row_valid, dlogits);
  reduce_rows_kernel<double><<<1, 1024, 0, stream()>>>(n, row_loss, row_valid, total, count);
  Status s = check_launch("cross_entropy kernels");
  double host[2] = {0, 0};
  if (s == Status::kOk) {
    s = fail(cudaMemcpyAsync(host, total, 2 * sizeof(double), cudaMemcpyDeviceToHost, stream()),
             "cudaMemcpyAsync(cross_entropy)");
  }
  scratch_free(p);
  if (s == Status::kOk) s = fail(cudaStreamSynchronize(stream()), "cross_entropy");
  if (s != Status::kOk) return s;
  long long c = 0;
  std::memcpy(&c, &host[1], sizeof(c));
  *loss_sum = host[0];
  *valid = static_cast<int64_t>(c);
  return Status::kOk;
}

Status CudaBackend::topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices,
                             float* values) {
  if (n < 0 || k < 0 || k > n || n > (int64_t{1} << 32) || any_null(n, x) ||
      (k > 0 && (indices == nullptr || values == nullptr))) {
    return invalid("topk_abs: 0 <= k <= n <= 2^32 and non-null pointers required");
  }
  if (k == 0) return Status::kOk;
  if (k == n) RING_LAUNCH(iota_kernel, grid_for(n), kBlock, n, x, indices, values);

  // Scratch: state, histogram, eq ranks and selection positions ([n] each), CUB temp.
  size_t cub_bytes = 0;
  if (Status s = fail(
          cub::DeviceScan::ExclusiveSum(nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr),
                                        static_cast<uint32_t*>(nullptr), n, stream()),
          "cub::DeviceScan (size)");
      s != Status::kOk) {
    return s;
  }
  const size_t head = 256 * sizeof(unsigned long long) + 64;
  const size_t arr = (sizeof(uint32_t) * n + 255) / 256 * 256;
  void* p = nullptr;
  if (Status s = scratch(head + 3 * arr + cub_bytes, &p); s != Status::kOk) return s;
  char* base = static_cast<char*>(p);
  auto* hist = reinterpret_cast<unsigned long long*>(base);
  auto* st = reinterpret_cast<RadixState*>(base + 256 * sizeof(unsigned long long));
  auto* eq = reinterpret_cast<uint32_t*>(base + head);
  auto* eq_rank = reinterpret_cast<uint32_t*>(base + head + arr);
  auto* pos = reinterpret_cast<uint32_t*>(base + head + 2 * arr);
  void* cub_tmp = base + head + 3 * arr;

  Status s =
      fail(cudaMemsetAsync(hist, 0, 256 * sizeof(unsigned long long), stream()), "cudaMemsetAsync");
  if (s == Status::kOk) {
    radix_init_kernel<<<1, 1, 0, stream()>>>(st, static_cast<unsigned long long>(k));
    s = check_launch("radix_init_kernel");
  }
  const unsigned g = std::min<unsigned>(grid_for(n), 4096);
  for (int shift = 24; s == Status::kOk && shift >= 0; shift -= 8) {
    radix_hist_kernel<<<g, kBlock, 0, stream()>>>(n, x, st, shift, hist);
    radix_pick_kernel<<<1, 1, 0, stream()>>>(st, shift, hist);
    s = check_launch("topk radix select");
  }
  if (s == Status::kOk) {
    topk_eq_kernel<<<grid_for(n), kBlock, 0, stream()>>>(n, x, st, eq);
    s = check_launch("topk_eq_kernel");
  }
  if (s == Status::kOk) {
    s = fail(cub::DeviceScan::ExclusiveSum(cub_tmp, cub_bytes, eq, eq_rank, n, stream()),
             "cub::DeviceScan (ties)");
  }
  if (s == Status::kOk) {
    topk_sel_kernel<<<grid_for(n), kBlock, 0, stream()>>>(n, x, st, eq_rank, eq);
    s = check_launch("topk_sel_kernel");
  }
  if (s == Status::kOk) {
    s = fail(cub::DeviceScan::ExclusiveSum(cub_tmp, cub_bytes, eq, pos, n, stream()),
             "cub::DeviceScan (positions)");
  }
  if (s == Status::kOk) {
    topk_scatter_kernel<<<grid_for(n), kBlock, 0, stream()>>>(n, x, st, eq_rank, pos, indices,
                                                              values);
    s = check_launch("topk_scatter_kernel");
  }
  scratch_free(p);
  return s;
}

Status CudaBackend::topk_feedback(int64_t n, int64_t k, float* residual, const float* grad,
                                  uint32_t* indices, float* values) {
  if (n < 0 || k < 0 || k > n || any_null(n, residual)) {
    return invalid("topk_feedback: 0 <= k <= n and a non-null residual required");
  }
  if (grad != nullptr) {
    if (Status s = axpy(n, 1.f, grad, residual); s != Status::kOk) return s;
  }
  if (Status s = topk_abs(n, k, residual, indices, values); s != Status::kOk) return s;
  if (k == 0) return Status::kOk;
  RING_LAUNCH(zero_at_kernel, grid_for(k), kBlock, k, indices, residual);
}

}  // namespace ring::kernels::cuda
