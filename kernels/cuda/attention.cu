// CUDA attention over one (query block, key/value block) pair: FlashAttention-2 style forward
// (online softmax, fp32 lse out) and backward (recomputed probabilities), exact merge, and the
// backward's delta = rowsum(dout * out).
//
// Layout of the work
//   - Tiles of BQ query x BK key tokens live in shared memory, head_dim zero-padded to a multiple
//     of 16 (at most 128). Every tile product (S = Q K^T, O += P V, dV += P^T dO, dP = dO V^T,
//     dK += dS^T Q, dQ = dS K) is one block_mm call: tensor cores (WMMA m16n16k16, bf16 in,
//     fp32 accumulate) for bf16 storage, fp32 FMA for fp32 storage. Results land in fp32 shared
//     tiles, so the softmax and mask code is the same for both dtypes.
//   - Masks come from global positions and document ids. A small kernel first reduces every
//     tile's position and document id min/max; each (query tile, key tile) pair is then skipped
//     (no allowed pair possible), full (no mask work beyond the block edges) or partial (per
//     element test). Blocks may be zigzag (non-contiguous), so only min/max are used.
//   - Forward: one CUDA block per (query tile, query head), looping over key tiles. GQA: head h
//     reads kv head h / (heads / kv_heads).
//   - Backward: one CUDA block per (key tile, kv head); it owns dK/dV of its rows (accumulated
//     in shared memory, added to the output once) and loops over the group's query heads and the
//     query tiles; dQ tiles are added to the output with fp32 atomics.
//   - Stats: counted per (query tile, key tile, kv head) on the device; a call given a stats
//     pointer waits for them.
#include <cuda_bf16.h>
#include <mma.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_common.cuh"

namespace ring::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 128;  // 4 warps per block
constexpr int kMaxHd = 128;
constexpr float kLog2e = 1.44269504088896340736f;
constexpr float kLn2 = 0.69314718055994530942f;

template <typename T>
struct Tiles;
template <>
struct Tiles<float> {
  static constexpr int kBq = 32, kBk = 32;    // forward
  static constexpr int kBqB = 32, kBkB = 32;  // backward
  static constexpr int kPad = 4;              // row padding (elements) against bank conflicts
};
template <>
struct Tiles<bf16> {
  static constexpr int kBq = 64, kBk = 64;
  static constexpr int kBqB = 32, kBkB = 64;
  static constexpr int kPad = 8;  // WMMA: ldm a multiple of 8 for 16-bit types
};

struct Bounds {
  long long pos_min, pos_max;
  int doc_min, doc_max;
};

// ---- tile products ---------------------------------------------------------------------------
// C[M,N] (fp32, row-major, ldc) = (acc ? C : 0) + A[M,K] B[K,N]. A(i,k) is A[i*lda+k], or
// A[k*lda+i] with AT; B(k,j) is B[k*ldb+j], or B[j*ldb+k] with BT. M, N, K multiples of 16.
template <bool AT, bool BT>
__device__ void block_mm(int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                         float* C, int ldc, bool acc) {
  // 2x2 outputs per thread step: each A and B value read from shared memory serves two FMAs.
  const int half_n = N / 2, pairs = (M / 2) * half_n;
  for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int i = (idx / half_n) * 2, j = (idx % half_n) * 2;
    float c00 = 0.f, c01 = 0.f, c10 = 0.f, c11 = 0.f;
    if (acc) {
      c00 = C[i * ldc + j];
      c01 = C[i * ldc + j + 1];
      c10 = C[(i + 1) * ldc + j];
      c11 = C[(i + 1) * ldc + j + 1];
    }
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      const float a0 = AT ? A[k * lda + i] : A[i * lda + k];
      const float a1 = AT ? A[k * lda + i + 1] : A[(i + 1) * lda + k];
      const float b0 = BT ? B[j * ldb + k] : B[k * ldb + j];
      const float b1 = BT ? B[(j + 1) * ldb + k] : B[k * ldb + j + 1];
      c00 = fmaf(a0, b0, c00);
      c01 = fmaf(a0, b1, c01);
      c10 = fmaf(a1, b0, c10);
      c11 = fmaf(a1, b1, c11);
    }
    C[i * ldc + j] = c00;
    C[i * ldc + j + 1] = c01;
    C[(i + 1) * ldc + j] = c10;
    C[(i + 1) * ldc + j + 1] = c11;
  }
}

template <bool AT, bool BT>
__device__ void block_mm(int M, int N, int K, const bf16* A, int lda, const bf16* B, int ldb,
                         float* C, int ldc, bool acc) {
  using namespace nvcuda;
  using LA = std::conditional_t<AT, wmma::col_major, wmma::row_major>;
  using LB = std::conditional_t<BT, wmma::col_major, wmma::row_major>;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int tn = N / 16, tiles = (M / 16) * tn;
  for (int t = warp; t < tiles; t += warps) {
    const int ti = t / tn, tj = t % tn;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    float* cp = C + ti * 16 * ldc + tj * 16;
    if (acc) {
      wmma::load_matrix_sync(c, cp, ldc, wmma::mem_row_major);
    } else {
      wmma::fill_fragment(c, 0.f);
    }
    for (int k = 0; k < K; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LA> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> b;
      wmma::load_matrix_sync(a, AT ? A + k * lda + ti * 16 : A + ti * 16 * lda + k, lda);
      wmma::load_matrix_sync(b, BT ? B + tj * 16 * ldb + k : B + k * ldb + tj * 16, ldb);
      wmma::mma_sync(c, a, b, c);
    }
    wmma::store_matrix_sync(cp, c, ldc, wmma::mem_row_major);
  }
}

// ---- shared-memory carving -------------------------------------------------------------------
struct SmemCursor {
  char* at;
  template <typename U>
  __device__ U* take(size_t count) {
    U* p = reinterpret_cast<U*>(at);
    at += (count * sizeof(U) + 127) / 128 * 128;  // keep 128-byte alignment (WMMA needs 32)
    return p;
  }
};
constexpr size_t round128(size_t b) {
  return (b + 127) / 128 * 128;
}

// Loads rows [row0, row0 + rows) of a [len, nh, hd] tensor (head h) into dst [rows, ld], zero
// beyond len and beyond hd (so padded lanes contribute nothing).
template <typename T>
__device__ void load_tile(T* dst, int ld, const T* src, int64_t row0, int rows, int64_t len,
                          int64_t nh, int64_t h, int hd, int hdp) {
  for (int idx = threadIdx.x; idx < rows * hdp; idx += blockDim.x) {
    const int r = idx / hdp, c = idx % hdp;
    const int64_t row = row0 + r;
    T v = to_t<T>(0.f);
    if (row < len && c < hd) v = src[(row * nh + h) * hd + c];
    dst[r * ld + c] = v;
  }
}

template <typename T>
__device__ void load_tile_f32(float* dst, int ld, const float* src, int64_t row0, int rows,
                              int64_t len, int64_t nh, int64_t h, int hd, int hdp) {
  for (int idx = threadIdx.x; idx < rows * hdp; idx += blockDim.x) {
    const int r = idx / hdp, c = idx % hdp;
    const int64_t row = row0 + r;
    dst[r * ld + c] = (row < len && c < hd) ? src[(row * nh + h) * hd + c] : 0.f;
  }
}

__device__ void load_meta(long long* pos_s, int* doc_s, const int64_t* pos, const int32_t* doc,
                          int64_t row0, int rows, int64_t len) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t row = row0 + r;
    pos_s[r] = (pos != nullptr && row < len) ? static_cast<long long>(pos[row]) : 0;
    doc_s[r] = (doc != nullptr && row < len) ? doc[row] : 0;
  }
}

// 0: skip, 1: full, 2: partial.
__device__ __forceinline__ int classify(const Bounds& q, const Bounds& k, bool causal, bool docs) {
  bool full = true;
  if (causal) {
    if (k.pos_min > q.pos_max) return 0;
    full = k.pos_max <= q.pos_min;
  }
  if (docs) {
    if (k.doc_max < q.doc_min || k.doc_min > q.doc_max) return 0;
    full = full && q.doc_min == q.doc_max && k.doc_min == k.doc_max && q.doc_min == k.doc_min;
  }
  return full ? 1 : 2;
}

struct StatsDev {
  unsigned long long total, skipped, masked;
  double flops;
};

__device__ void count_tile(StatsDev* st, int kind, double flops) {
  if (st == nullptr || threadIdx.x != 0) return;
  atomicAdd(&st->total, 1ull);
  if (kind == 0) {
    atomicAdd(&st->skipped, 1ull);
  } else {
    if (kind == 2) atomicAdd(&st->masked, 1ull);
    atomicAdd(&st->flops, flops);
  }
}

// One warp per tile: min/max of positions and document ids over tokens [t*tile, ...).
__global__ void tile_bounds_kernel(const int64_t* pos, const int32_t* doc, int64_t len, int tile,
                                   int64_t tiles, Bounds* out) {
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= tiles) return;
  long long pmin = LLONG_MAX, pmax = LLONG_MIN;
  int dmin = INT_MAX, dmax = INT_MIN;
  const int64_t b = t * tile, e = min(len, b + tile);
  for (int64_t i = b + lane; i < e; i += 32) {
    if (pos != nullptr) {
      pmin = min(pmin, static_cast<long long>(pos[i]));
      pmax = max(pmax, static_cast<long long>(pos[i]));
    }
    if (doc != nullptr) {
      dmin = min(dmin, doc[i]);
      dmax = max(dmax, doc[i]);
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    pmin = min(pmin, __shfl_xor_sync(0xffffffffu, pmin, o));
    pmax = max(pmax, __shfl_xor_sync(0xffffffffu, pmax, o));
    dmin = min(dmin, __shfl_xor_sync(0xffffffffu, dmin, o));
    dmax = max(dmax, __shfl_xor_sync(0xffffffffu, dmax, o));
  }
  if (lane == 0) out[t] = Bounds{pmin, pmax, dmin, dmax};
}

struct FwdParams {
  const void *q, *k, *v;
  const int64_t *q_pos, *k_pos;
  const int32_t *q_doc, *k_doc;
  float *out, *lse;
  int64_t q_len, kv_len, heads, kv_heads;
  int hd, hdp;
  float scale_log2;
  bool causal, docs;
  const Bounds *qb, *kb;
  int64_t k_tiles;
  StatsDev* stats;
};

template <typename T>
size_t fwd_smem(int hdp) {
  using TL = Tiles<T>;
  const int ldh = hdp + TL::kPad, lds = TL::kBk + 4, ldp = TL::kBk + TL::kPad, ldo = hdp + 4;
  return round128(sizeof(T) * TL::kBq * ldh) + 2 * round128(sizeof(T) * TL::kBk * ldh) +
         round128(sizeof(float) * TL::kBq * lds) + round128(sizeof(T) * TL::kBq * ldp) +
         round128(sizeof(float) * TL::kBq * ldo) + 2 * round128(sizeof(float) * TL::kBq) +
         round128(sizeof(long long) * TL::kBq) + round128(sizeof(long long) * TL::kBk) +
         round128(sizeof(int) * TL::kBq) + round128(sizeof(int) * TL::kBk);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) attention_fwd_kernel(FwdParams p) {
  using TL = Tiles<T>;
  constexpr int BQ = TL::kBq, BK = TL::kBk;
  extern __shared__ __align__(128) char smem_raw[];
  const int hdp = p.hdp, hd = p.hd;
  const int ldh = hdp + TL::kPad, lds = BK + 4, ldp = BK + TL::kPad, ldo = hdp + 4;
  SmemCursor cur{smem_raw};
  T* qs = cur.take<T>(BQ * ldh);
  T* ks = cur.take<T>(BK * ldh);
  T* vs = cur.take<T>(BK * ldh);
  float* s = cur.take<float>(BQ * lds);
  T* ps = cur.take<T>(BQ * ldp);
  float* o = cur.take<float>(BQ * ldo);
  float* m = cur.take<float>(BQ);
  float* l = cur.take<float>(BQ);
  long long* qpos = cur.take<long long>(BQ);
  long long* kpos = cur.take<long long>(BK);
  int* qdoc = cur.take<int>(BQ);
  int* kdoc = cur.take<int>(BK);

  const int64_t qt = blockIdx.x, h = blockIdx.y;
  const int64_t group = p.heads / p.kv_heads, kvh = h / group;
  const int64_t q0 = qt * BQ;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;

  load_tile<T>(qs, ldh, static_cast<const T*>(p.q), q0, BQ, p.q_len, p.heads, h, hd, hdp);
  load_meta(qpos, qdoc, p.q_pos, p.q_doc, q0, BQ, p.q_len);
  for (int i = threadIdx.x; i < BQ * ldo; i += blockDim.x) o[i] = 0.f;
  for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
    m[i] = -INFINITY;
    l[i] = 0.f;
  }
  const Bounds qb = p.qb[qt];
  const int q_rows = static_cast<int>(min(static_cast<int64_t>(BQ), p.q_len - q0));
  const bool counts = (h % group) == 0;
  __syncthreads();  // o, m, l initialised before anyone reads them (even with every tile skipped)

  for (int64_t kt = 0; kt < p.k_tiles; ++kt) {
    const int kind = classify(qb, p.kb[kt], p.causal, p.docs);
    const int64_t k0 = kt * BK;
    const int k_rows = static_cast<int>(min(static_cast<int64_t>(BK), p.kv_len - k0));
    if (counts) {
      count_tile(p.stats, kind, 4.0 * static_cast<double>(group) * q_rows * k_rows * hd);
    }
    if (kind == 0) continue;
    load_tile<T>(ks, ldh, static_cast<const T*>(p.k), k0, BK, p.kv_len, p.kv_heads, kvh, hd, hdp);
    load_tile<T>(vs, ldh, static_cast<const T*>(p.v), k0, BK, p.kv_len, p.kv_heads, kvh, hd, hdp);
    load_meta(kpos, kdoc, p.k_pos, p.k_doc, k0, BK, p.kv_len);
    __syncthreads();
    block_mm<false, true>(BQ, BK, hdp, qs, ldh, ks, ldh, s, lds, false);
    __syncthreads();
    // Online softmax, one warp per row, base 2.
    for (int r = warp; r < BQ; r += warps) {
      float mx = -INFINITY;
      for (int j = lane; j < BK; j += 32) {
        bool ok = r < q_rows && j < k_rows;
        if (ok && kind == 2) {
          if (p.causal && kpos[j] > qpos[r]) ok = false;
          if (p.docs && kdoc[j] != qdoc[r]) ok = false;
        }
        const float v = ok ? s[r * lds + j] * p.scale_log2 : -INFINITY;
        s[r * lds + j] = v;
        mx = fmaxf(mx, v);
      }
      mx = warp_max(mx);
      const float m_old = m[r];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.f, alpha = 1.f;
      if (m_new == -INFINITY) {
        for (int j = lane; j < BK; j += 32) ps[r * ldp + j] = to_t<T>(0.f);
      } else {
        alpha = exp2f(m_old - m_new);
        for (int j = lane; j < BK; j += 32) {
          const float e = exp2f(s[r * lds + j] - m_new);
          sum += e;
          ps[r * ldp + j] = to_t<T>(e);
        }
      }
      sum = warp_sum(sum);
      for (int c = lane; c < hdp; c += 32) o[r * ldo + c] *= alpha;
      if (lane == 0) {
        m[r] = m_new;
        l[r] = l[r] * alpha + sum;
      }
    }
    __syncthreads();
    block_mm<false, false>(BQ, hdp, BK, ps, ldp, vs, ldh, o, ldo, true);
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < q_rows * hd; idx += blockDim.x) {
    const int r = idx / hd, c = idx % hd;
    const float lr = l[r];
    p.out[((q0 + r) * p.heads + h) * hd + c] = lr > 0.f ? o[r * ldo + c] / lr : 0.f;
  }
  for (int r = threadIdx.x; r < q_rows; r += blockDim.x) {
    const float lr = l[r];
    p.lse[(q0 + r) * p.heads + h] = lr > 0.f ? (m[r] + log2f(lr)) * kLn2 : -INFINITY;
  }
}

struct BwdParams {
  const void *q, *k, *v, *dout;
  const int64_t *q_pos, *k_pos;
  const int32_t *q_doc, *k_doc;
  const float *lse, *delta;
  float *dq, *dk, *dv;
  int64_t q_len, kv_len, heads, kv_heads;
  int hd, hdp;
  float scale, scale_log2;
  bool causal, docs;
  const Bounds *qb, *kb;
  int64_t q_tiles;
  StatsDev* stats;
};

template <typename T>
size_t bwd_smem(int hdp) {
  using TL = Tiles<T>;
  const int ldh = hdp + TL::kPad, lds = TL::kBkB + 4, ldp = TL::kBkB + TL::kPad, ldo = hdp + 4;
  return 2 * round128(sizeof(T) * TL::kBkB * ldh) + 2 * round128(sizeof(T) * TL::kBqB * ldh) +
         2 * round128(sizeof(float) * TL::kBqB * lds) + 2 * round128(sizeof(T) * TL::kBqB * ldp) +
         round128(sizeof(float) * TL::kBqB * ldo) + 2 * round128(sizeof(float) * TL::kBkB * ldo) +
         2 * round128(sizeof(float) * TL::kBqB) + round128(sizeof(long long) * TL::kBqB) +
         round128(sizeof(long long) * TL::kBkB) + round128(sizeof(int) * TL::kBqB) +
         round128(sizeof(int) * TL::kBkB);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) attention_bwd_kernel(BwdParams p) {
  using TL = Tiles<T>;
  constexpr int BQ = TL::kBqB, BK = TL::kBkB;
  extern __shared__ __align__(128) char smem_raw[];
  const int hdp = p.hdp, hd = p.hd;
  const int ldh = hdp + TL::kPad, lds = BK + 4, ldp = BK + TL::kPad, ldo = hdp + 4;
  SmemCursor cur{smem_raw};
  T* ks = cur.take<T>(BK * ldh);
  T* vs = cur.take<T>(BK * ldh);
  T* qs = cur.take<T>(BQ * ldh);
  T* dos = cur.take<T>(BQ * ldh);
  float* pf = cur.take<float>(BQ * lds);   // S, then P (fp32)
  float* dpf = cur.take<float>(BQ * lds);  // dP
  T* pt = cur.take<T>(BQ * ldp);           // P as T
  T* dst = cur.take<T>(BQ * ldp);          // dS (scaled) as T
  float* dqs = cur.take<float>(BQ * ldo);
  float* dks = cur.take<float>(BK * ldo);
  float* dvs = cur.take<float>(BK * ldo);
  float* lse2 = cur.take<float>(BQ);
  float* dlt = cur.take<float>(BQ);
  long long* qpos = cur.take<long long>(BQ);
  long long* kpos = cur.take<long long>(BK);
  int* qdoc = cur.take<int>(BQ);
  int* kdoc = cur.take<int>(BK);

  const int64_t kt = blockIdx.x, kvh = blockIdx.y;
  const int64_t group = p.heads / p.kv_heads;
  const int64_t k0 = kt * BK;
  const int k_rows = static_cast<int>(min(static_cast<int64_t>(BK), p.kv_len - k0));

  load_tile<T>(ks, ldh, static_cast<const T*>(p.k), k0, BK, p.kv_len, p.kv_heads, kvh, hd, hdp);
  load_tile<T>(vs, ldh, static_cast<const T*>(p.v), k0, BK, p.kv_len, p.kv_heads, kvh, hd, hdp);
  load_meta(kpos, kdoc, p.k_pos, p.k_doc, k0, BK, p.kv_len);
  for (int i = threadIdx.x; i < BK * ldo; i += blockDim.x) {
    dks[i] = 0.f;
    dvs[i] = 0.f;
  }
  const Bounds kb = p.kb[kt];

  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    for (int64_t qt = 0; qt < p.q_tiles; ++qt) {
      const int kind = classify(p.qb[qt], kb, p.causal, p.docs);
      const int64_t q0 = qt * BQ;
      const int q_rows = static_cast<int>(min(static_cast<int64_t>(BQ), p.q_len - q0));
      if (g == 0) {
        count_tile(p.stats, kind, 10.0 * static_cast<double>(group) * q_rows * k_rows * hd);
      }
      if (kind == 0) continue;
      load_tile<T>(qs, ldh, static_cast<const T*>(p.q), q0, BQ, p.q_len, p.heads, h, hd, hdp);
      load_tile<T>(dos, ldh, static_cast<const T*>(p.dout), q0, BQ, p.q_len, p.heads, h, hd, hdp);
      load_meta(qpos, qdoc, p.q_pos, p.q_doc, q0, BQ, p.q_len);
      for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
        const bool in = r < q_rows;
        lse2[r] = in ? p.lse[(q0 + r) * p.heads + h] * kLog2e : -INFINITY;
        dlt[r] = in ? p.delta[(q0 + r) * p.heads + h] : 0.f;
      }
      __syncthreads();
      block_mm<false, true>(BQ, BK, hdp, qs, ldh, ks, ldh, pf, lds, false);
      __syncthreads();
      for (int idx = threadIdx.x; idx < BQ * BK; idx += blockDim.x) {
        const int r = idx / BK, j = idx % BK;
        bool ok = r < q_rows && j < k_rows && lse2[r] > -INFINITY;
        if (ok && kind == 2) {
          if (p.causal && kpos[j] > qpos[r]) ok = false;
          if (p.docs && kdoc[j] != qdoc[r]) ok = false;
        }
        const float pr = ok ? exp2f(pf[r * lds + j] * p.scale_log2 - lse2[r]) : 0.f;
        pf[r * lds + j] = pr;
        pt[r * ldp + j] = to_t<T>(pr);
      }
      __syncthreads();
      block_mm<true, false>(BK, hdp, BQ, pt, ldp, dos, ldh, dvs, ldo, true);   // dV += P^T dO
      block_mm<false, true>(BQ, BK, hdp, dos, ldh, vs, ldh, dpf, lds, false);  // dP = dO V^T
      __syncthreads();
      for (int idx = threadIdx.x; idx < BQ * BK; idx += blockDim.x) {
        const int r = idx / BK, j = idx % BK;
        const float pr = pf[r * lds + j];
        dst[r * ldp + j] = to_t<T>(pr == 0.f ? 0.f : pr * (dpf[r * lds + j] - dlt[r]) * p.scale);
      }
      __syncthreads();
      block_mm<true, false>(BK, hdp, BQ, dst, ldp, qs, ldh, dks, ldo, true);    // dK += dS^T Q
      block_mm<false, false>(BQ, hdp, BK, dst, ldp, ks, ldh, dqs, ldo, false);  // dQ = dS K
      __syncthreads();
      for (int idx = threadIdx.x; idx < q_rows * hd; idx += blockDim.x) {
        const int r = idx / hd, c = idx % hd;
        atomicAdd(&p.dq[((q0 + r) * p.heads + h) * hd + c], dqs[r * ldo + c]);
      }
      // The next iteration's first write to dqs follows two __syncthreads.
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < k_rows * hd; idx += blockDim.x) {
    const int r = idx / hd, c = idx % hd;
    const int64_t at = ((k0 + r) * p.kv_heads + kvh) * hd + c;
    p.dk[at] += dks[r * ldo + c];
    p.dv[at] += dvs[r * ldo + c];
  }
}

__global__ void merge_kernel(int64_t rows, int64_t hd, float* out_a, float* lse_a,
                             const float* out_b, const float* lse_b) {
  // One warp per (token, head) row.
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float la = lse_a[row], lb = lse_b[row];
  if (lb == -INFINITY) return;  // empty b: a unchanged
  float wa, wb, l;
  if (la == -INFINITY) {
    wa = 0.f;
    wb = 1.f;
    l = lb;
  } else {
    const float mx = fmaxf(la, lb);
    l = mx + logf(expf(la - mx) + expf(lb - mx));
    wa = expf(la - l);
    wb = expf(lb - l);
  }
  float* oa = out_a + row * hd;
  const float* ob = out_b + row * hd;
  for (int64_t c = lane; c < hd; c += 32) oa[c] = wa * oa[c] + wb * ob[c];
  if (lane == 0) lse_a[row] = l;
}

template <typename T>
__global__ void delta_kernel(int64_t rows, int64_t hd, const float* out, const T* dout,
                             float* delta) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float s = 0.f;
  for (int64_t c = lane; c < hd; c += 32) s += to_f32(dout[row * hd + c]) * out[row * hd + c];
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// ---- host side -------------------------------------------------------------------------------
constexpr int64_t kMaxElems = int64_t{1} << 40;

bool size_ok(int64_t a, int64_t b, int64_t c) {
  return a >= 0 && b >= 0 && c >= 0 &&
         (a == 0 || b == 0 || c == 0 || (a <= kMaxElems / b && a * b <= kMaxElems / c));
}

Status check_args(CudaBackend& be, const AttentionArgs& a) {
  if (a.q_len < 0 || a.kv_len < 0 || a.heads <= 0 || a.kv_heads <= 0 || a.head_dim <= 0) {
    return be.invalid("attention: q_len, kv_len >= 0 and heads, kv_heads, head_dim > 0 required");
  }
  if (a.heads % a.kv_heads != 0) {
    return be.invalid("attention: heads (" + std::to_string(a.heads) +
                      ") must be a multiple of kv_heads (" + std::to_string(a.kv_heads) + ")");
  }
  if (!size_ok(a.q_len, a.heads, a.head_dim) || !size_ok(a.kv_len, a.kv_heads, a.head_dim)) {
    return be.invalid("attention: tensor sizes overflow");
  }
  if (!std::isfinite(a.scale)) return be.invalid("attention: scale must be finite");
  if ((a.q_doc == nullptr) != (a.k_doc == nullptr)) {
    return be.invalid("attention: q_doc and k_doc must both be given or both be null");
  }
  if (a.q_len > 0 && (a.q == nullptr || (a.causal && a.q_pos == nullptr))) {
    return be.invalid("attention: q (and q_pos when causal) must not be null");
  }
  if (a.kv_len > 0 && (a.k == nullptr || a.v == nullptr || (a.causal && a.k_pos == nullptr))) {
    return be.invalid("attention: k, v (and k_pos when causal) must not be null");
  }
  if (a.dtype != DType::kF32 && a.dtype != DType::kBF16) {
    return be.invalid("attention: dtype must be f32 or bf16");
  }
  if (a.head_dim > kMaxHd) {
    return be.unsupported("attention: head_dim " + std::to_string(a.head_dim) +
                          " > 128 is not implemented by the CUDA backend");
  }
  return Status::kOk;
}

// Tile bounds of both blocks in one scratch allocation (released stream-ordered by the caller).
Status make_bounds(CudaBackend& be, const AttentionArgs& a, int bq, int bk, Bounds** qb,
                   Bounds** kb, int64_t* q_tiles, int64_t* k_tiles, void** block) {
  *q_tiles = (a.q_len + bq - 1) / bq;
  *k_tiles = (a.kv_len + bk - 1) / bk;
  void* p = nullptr;
  if (Status s = be.scratch(sizeof(Bounds) * (*q_tiles + *k_tiles), &p); s != Status::kOk) {
    return s;
  }
  *block = p;
  *qb = static_cast<Bounds*>(p);
  *kb = *qb + *q_tiles;
  const int threads = 256;
  if (*q_tiles > 0) {
    tile_bounds_kernel<<<static_cast<unsigned>((*q_tiles * 32 + threads - 1) / threads), threads, 0,
                         be.stream()>>>(a.causal ? a.q_pos : nullptr, a.q_doc, a.q_len, bq,
                                        *q_tiles, *qb);
  }
  if (*k_tiles > 0) {
    tile_bounds_kernel<<<static_cast<unsigned>((*k_tiles * 32 + threads - 1) / threads), threads, 0,
                         be.stream()>>>(a.causal ? a.k_pos : nullptr, a.k_doc, a.kv_len, bk,
                                        *k_tiles, *kb);
  }
  return be.check_launch("attention tile bounds");
}

// Device counters for stats, when asked for.
struct StatsScope {
  CudaBackend& be;
  StatsDev* dev = nullptr;
  Status begin(AttentionStats* stats) {
    if (stats == nullptr) return Status::kOk;
    void* p = nullptr;
    if (Status s = be.scratch(sizeof(StatsDev), &p); s != Status::kOk) return s;
    dev = static_cast<StatsDev*>(p);
    return be.fail(cudaMemsetAsync(dev, 0, sizeof(StatsDev), be.stream()), "cudaMemsetAsync");
  }
  // Waits for the counters and adds them to *stats.
  Status end(AttentionStats* stats) {
    if (dev == nullptr) return Status::kOk;
    StatsDev h{};
    Status s = be.fail(cudaMemcpyAsync(&h, dev, sizeof(h), cudaMemcpyDeviceToHost, be.stream()),
                       "cudaMemcpyAsync(stats)");
    if (s == Status::kOk) s = be.fail(cudaStreamSynchronize(be.stream()), "attention");
    be.scratch_free(dev);
    dev = nullptr;
    if (s != Status::kOk) return s;
    stats->tiles_total += static_cast<int64_t>(h.total);
    stats->tiles_skipped += static_cast<int64_t>(h.skipped);
    stats->tiles_masked += static_cast<int64_t>(h.masked);
    stats->flops += h.flops;
    return Status::kOk;
  }
};

template <typename T>
Status forward_t(CudaBackend& be, const AttentionArgs& a, float* out, float* lse,
                 AttentionStats* stats) {
  using TL = Tiles<T>;
  const int hdp = static_cast<int>((a.head_dim + 15) / 16 * 16);
  const size_t smem = fwd_smem<T>(hdp);
  if (smem > be.smem_optin()) {
    return be.unsupported("attention forward: needs " + std::to_string(smem) +
                          " bytes of shared memory per block, the device offers " +
                          std::to_string(be.smem_optin()));
  }
  Bounds *qb = nullptr, *kb = nullptr;
  int64_t q_tiles = 0, k_tiles = 0;
  void* block = nullptr;
  if (Status s = make_bounds(be, a, TL::kBq, TL::kBk, &qb, &kb, &q_tiles, &k_tiles, &block);
      s != Status::kOk) {
    return s;
  }
  StatsScope st{be};
  Status s = st.begin(stats);
  if (s == Status::kOk) {
    s = be.fail(
        cudaFuncSetAttribute(attention_fwd_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "cudaFuncSetAttribute(attention forward)");
  }
  if (s == Status::kOk && q_tiles > 65535LL * 65535LL) s = be.invalid("attention: q_len too large");
  if (s == Status::kOk) {
    FwdParams p{a.q,        a.k,
                a.v,        a.q_pos,
                a.k_pos,    a.q_doc,
                a.k_doc,    out,
                lse,        a.q_len,
                a.kv_len,   a.heads,
                a.kv_heads, static_cast<int>(a.head_dim),
                hdp,        a.scale * kLog2e,
                a.causal,   a.q_doc != nullptr,
                qb,         kb,
                k_tiles,    st.dev};
    dim3 grid(static_cast<unsigned>(q_tiles), static_cast<unsigned>(a.heads));
    attention_fwd_kernel<T><<<grid, kThreads, smem, be.stream()>>>(p);
    s = be.check_launch("attention forward kernel");
  }
  be.scratch_free(block);
  if (s == Status::kOk) s = st.end(stats);
  return s;
}

template <typename T>
Status backward_t(CudaBackend& be, const AttentionArgs& a, const void* dout, const float* lse,
                  const float* delta, float* dq, float* dk, float* dv, AttentionStats* stats) {
  using TL = Tiles<T>;
  const int hdp = static_cast<int>((a.head_dim + 15) / 16 * 16);
  const size_t smem = bwd_smem<T>(hdp);
  if (smem > be.smem_optin()) {
    return be.unsupported("attention backward: needs " + std::to_string(smem) +
                          " bytes of shared memory per block, the device offers " +
                          std::to_string(be.smem_optin()));
  }
  Bounds *qb = nullptr, *kb = nullptr;
  int64_t q_tiles = 0, k_tiles = 0;
  void* block = nullptr;
  if (Status s = make_bounds(be, a, TL::kBqB, TL::kBkB, &qb, &kb, &q_tiles, &k_tiles, &block);
      s != Status::kOk) {
    return s;
  }
  StatsScope st{be};
  Status s = st.begin(stats);
  if (s == Status::kOk) {
    s = be.fail(
        cudaFuncSetAttribute(attention_bwd_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "cudaFuncSetAttribute(attention backward)");
  }
  if (s == Status::kOk) {
    BwdParams p{a.q,
                a.k,
                a.v,
                dout,
                a.q_pos,
                a.k_pos,
                a.q_doc,
                a.k_doc,
                lse,
                delta,
                dq,
                dk,
                dv,
                a.q_len,
                a.kv_len,
                a.heads,
                a.kv_heads,
                static_cast<int>(a.head_dim),
                hdp,
                a.scale,
                a.scale * kLog2e,
                a.causal,
                a.q_doc != nullptr,
                qb,
                kb,
                q_tiles,
                st.dev};
    dim3 grid(static_cast<unsigned>(k_tiles), static_cast<unsigned>(a.kv_heads));
    attention_bwd_kernel<T><<<grid, kThreads, smem, be.stream()>>>(p);
    s = be.check_launch("attention backward kernel");
  }
  be.scratch_free(block);
  if (s == Status::kOk) s = st.end(stats);
  return s;
}

unsigned warp_blocks(int64_t rows, int threads) {
  return static_cast<unsigned>((rows * 32 + threads - 1) / threads);
}

}  // namespace

Status attention_forward(CudaBackend& be, const AttentionArgs& a, float* out, float* lse,
                         AttentionStats* stats) {
  if (Status s = check_args(be, a); s != Status::kOk) return s;
  if (a.q_len > 0 && (out == nullptr || lse == nullptr)) {
    return be.invalid("attention forward: out and lse must not be null");
  }
  if (a.q_len == 0) return Status::kOk;
  if (a.kv_len == 0) {  // every row empty: out = 0, lse = -inf
    const int64_t rows = a.q_len * a.heads;
    if (Status s = be.fail(cudaMemsetAsync(out, 0, sizeof(float) * rows * a.head_dim, be.stream()),
                           "cudaMemsetAsync");
        s != Status::kOk) {
      return s;
    }
    return be.fill(rows, -std::numeric_limits<float>::infinity(), lse);
  }
  return a.dtype == DType::kBF16 ? forward_t<bf16>(be, a, out, lse, stats)
                                 : forward_t<float>(be, a, out, lse, stats);
}

Status attention_merge(CudaBackend& be, int64_t tokens, int64_t heads, int64_t head_dim,
                       float* out_a, float* lse_a, const float* out_b, const float* lse_b) {
  if (tokens < 0 || heads < 0 || head_dim < 0 || !size_ok(tokens, heads, head_dim)) {
    return be.invalid("attention merge: tokens, heads, head_dim must be >= 0");
  }
  if (tokens == 0 || heads == 0) return Status::kOk;
  if (out_a == nullptr || lse_a == nullptr || out_b == nullptr || lse_b == nullptr) {
    return be.invalid("attention merge: null pointer");
  }
  const int64_t rows = tokens * heads;
  const int threads = 256;
  merge_kernel<<<warp_blocks(rows, threads), threads, 0, be.stream()>>>(rows, head_dim, out_a,
                                                                        lse_a, out_b, lse_b);
  return be.check_launch("attention merge kernel");
}

Status attention_backward_prepare(CudaBackend& be, DType dtype, int64_t tokens, int64_t heads,
                                  int64_t head_dim, const float* out, const void* dout,
                                  float* delta) {
  if (tokens < 0 || heads < 0 || head_dim < 0 || !size_ok(tokens, heads, head_dim)) {
    return be.invalid("attention backward prepare: tokens, heads, head_dim must be >= 0");
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return be.invalid("attention backward prepare: dtype must be f32 or bf16");
  }
  if (tokens == 0 || heads == 0) return Status::kOk;
  if (out == nullptr || dout == nullptr || delta == nullptr) {
    return be.invalid("attention backward prepare: null pointer");
  }
  const int64_t rows = tokens * heads;
  const int threads = 256;
  if (dtype == DType::kBF16) {
    delta_kernel<bf16><<<warp_blocks(rows, threads), threads, 0, be.stream()>>>(
        rows, head_dim, out, static_cast<const bf16*>(dout), delta);
  } else {
    delta_kernel<float><<<warp_blocks(rows, threads), threads, 0, be.stream()>>>(
        rows, head_dim, out, static_cast<const float*>(dout), delta);
  }
  return be.check_launch("attention delta kernel");
}

Status attention_backward(CudaBackend& be, const AttentionArgs& a, const void* dout,
                          const float* lse, const float* delta, float* dq, float* dk, float* dv,
                          AttentionStats* stats) {
  if (Status s = check_args(be, a); s != Status::kOk) return s;
  if (a.q_len > 0 && (dout == nullptr || lse == nullptr || delta == nullptr || dq == nullptr)) {
    return be.invalid("attention backward: dout, lse, delta and dq must not be null");
  }
  if (a.kv_len > 0 && (dk == nullptr || dv == nullptr)) {
    return be.invalid("attention backward: dk and dv must not be null");
  }
  if (a.q_len == 0 || a.kv_len == 0) return Status::kOk;
  return a.dtype == DType::kBF16 ? backward_t<bf16>(be, a, dout, lse, delta, dq, dk, dv, stats)
                                 : backward_t<float>(be, a, dout, lse, delta, dq, dk, dv, stats);
}

}  // namespace ring::kernels::cuda
