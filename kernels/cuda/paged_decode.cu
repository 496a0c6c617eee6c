// Paged decode attention (kernels/backend.h PagedDecodeArgs): the partial (out, lse) of one query
// row over one page of generation's fast-tier pool, for every row of a call.
//
// One block of 4 warps per query row. q [head_dim] is staged in shared memory. Each warp takes
// chunks of 32 page rows (warp w: chunks w, w + 4, ...): lane t scores row j0 + t against q (its
// own dot product over head_dim, fp32), the warp takes the chunk's maximum, rescales its running
// state (online softmax, natural base: expf, as the CPU side's exp) and adds p_j v_j with lane l
// owning dims l, l + 32, ... (coalesced V reads). The 4 warp states (m, l, acc [head_dim]) are
// merged in shared memory at the end:
//   M = max_w m_w; L = sum_w l_w exp(m_w - M); out = sum_w acc_w exp(m_w - M) / L; lse = M + log L.
// Rows whose keys are all masked (another document, or an empty page) get out 0, lse -inf.
// head_dim up to 256 (8 values per lane); larger: kUnsupported.
// The pool is fp32 or bf16 (PagedDecodeArgs::dtype; the kernel is templated on the element
// type T): bf16 K/V values are widened to fp32 (exact) as they are read, then the same fp32
// arithmetic, so a bf16 pool gives what an fp32 pool of the widened values gives.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace ring::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 32 x 8

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    paged_decode_kernel(int64_t head_dim, int64_t page_tokens, float scale,
                        const T* __restrict__ pool, const int32_t* __restrict__ pool_docs,
                        const float* __restrict__ q, const int32_t* __restrict__ q_doc,
                        const int32_t* __restrict__ slot, const int32_t* __restrict__ tokens,
                        float* __restrict__ out, float* __restrict__ lse) {
  extern __shared__ float smem[];
  float* qs = smem;                               // [head_dim]
  float* acc_s = smem + head_dim;                 // [kWarps, head_dim]
  float* m_s = acc_s + kWarps * head_dim;         // [kWarps]
  float* l_s = m_s + kWarps;                      // [kWarps]
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t hd = head_dim;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[r * hd + d];
  __syncthreads();

  const int32_t s = slot[r];
  int64_t n = tokens[r];
  if (s < 0 || n < 0) n = 0;
  if (n > page_tokens) n = page_tokens;
  const T* k = pool + static_cast<int64_t>(s < 0 ? 0 : s) * 2 * page_tokens * hd;
  const T* v = k + page_tokens * hd;
  const int32_t* docs = pool_docs + static_cast<int64_t>(s < 0 ? 0 : s) * page_tokens;
  const int32_t want = q_doc[r];

  float m = -INFINITY, l = 0.f;
  float acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.f;

  for (int64_t j0 = static_cast<int64_t>(warp) * 32; j0 < n; j0 += kWarps * 32) {
    const int64_t j = j0 + lane;
    float sc = -INFINITY;
    if (j < n && docs[j] == want) {
      const T* kr = k + j * hd;
      float dot = 0.f;
      for (int64_t d = 0; d < hd; ++d) dot = fmaf(qs[d], to_f32(kr[d]), dot);
      sc = dot * scale;
    }
    const float cmax = warp_max(sc);
    if (cmax == -INFINITY) continue;  // the whole chunk is masked (warp-uniform)
    const float m_new = fmaxf(m, cmax);
    const float alpha = expf(m - m_new);  // 0 when m is -inf
    const float p = sc == -INFINITY ? 0.f : expf(sc - m_new);
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] *= alpha;
    const int64_t cnt = n - j0 < 32 ? n - j0 : 32;
    for (int t = 0; t < cnt; ++t) {
      const float pt = __shfl_sync(0xffffffffu, p, t);
      if (pt == 0.f) continue;  // masked row (warp-uniform)
      const T* vr = v + (j0 + t) * hd;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < hd) acc[i] = fmaf(pt, to_f32(vr[d]), acc[i]);
      }
    }
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < hd) acc_s[warp * hd + d] = acc[i];
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
  __syncthreads();
  float big = -INFINITY;
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, m_s[w]);
  if (big == -INFINITY) {
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) out[r * hd + d] = 0.f;
    if (threadIdx.x == 0) lse[r] = -INFINITY;
    return;
  }
  float scale_w[kWarps];
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    scale_w[w] = m_s[w] == -INFINITY ? 0.f : expf(m_s[w] - big);
    total += l_s[w] * scale_w[w];
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += acc_s[w * hd + d] * scale_w[w];
    out[r * hd + d] = o / total;
  }
  if (threadIdx.x == 0) lse[r] = big + logf(total);
}

}  // namespace

Status paged_decode_attention(CudaBackend& be, const PagedDecodeArgs& a, float* out, float* lse) {
  if (a.rows < 0 || a.head_dim <= 0 || a.page_tokens <= 0)
    return be.invalid("paged decode attention: rows >= 0, head_dim > 0, page_tokens > 0");
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16)
    return be.invalid("paged decode attention: the pool's dtype must be f32 or bf16");
  if (a.head_dim > 32 * kMaxPerLane)
    return be.unsupported("paged decode attention: head_dim above 256");
  if (a.rows == 0) return Status::kOk;
  if (a.rows > INT32_MAX) return be.invalid("paged decode attention: rows above 2^31 - 1");
  if (a.pool == nullptr || a.pool_docs == nullptr || a.q == nullptr || a.q_doc == nullptr ||
      a.slot == nullptr || a.tokens == nullptr || out == nullptr || lse == nullptr)
    return be.invalid("paged decode attention: null pointer");
  const size_t smem = static_cast<size_t>((1 + kWarps) * a.head_dim + 2 * kWarps) * sizeof(float);
  const unsigned blocks = static_cast<unsigned>(a.rows);
  if (a.dtype == DType::kBF16) {
    paged_decode_kernel<__nv_bfloat16><<<blocks, kWarps * 32, smem, be.stream()>>>(
        a.head_dim, a.page_tokens, a.scale, static_cast<const __nv_bfloat16*>(a.pool),
        a.pool_docs, a.q, a.q_doc, a.slot, a.tokens, out, lse);
  } else {
    paged_decode_kernel<float><<<blocks, kWarps * 32, smem, be.stream()>>>(
        a.head_dim, a.page_tokens, a.scale, static_cast<const float*>(a.pool), a.pool_docs, a.q,
        a.q_doc, a.slot, a.tokens, out, lse);
  }
  return be.check_launch("paged decode attention kernel");
}

}  // namespace ring::kernels::cuda
