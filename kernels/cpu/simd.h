// The SIMD mapping layer of the CPU backend: one namespace per ISA, each exposing the same small
// set of operations on a float vector `vf` of kWidth lanes. Kernels (kernels/cpu/ops_isa.inc) are
// written once against these names and compiled once per ISA with that ISA's target attribute;
// ops.cc picks one at run time from cpuid (see cpu::active_isa()).
//
// Never compiled with -march=native: every function here carries its own target attribute, so
// this header is safe to include in a translation unit built for baseline x86-64. Code using the
// avx2/avx512 namespaces must itself be inside a function with the same (or a wider) target
// attribute; calling them from baseline code is a compile error (always_inline mismatch).
//
// Masks: a `mask` is whatever the ISA compares into (a full-width vector on AVX2, a k-register
// on AVX-512, a bool for scalar); only select() consumes it.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/numeric/bf16.h"

#define RING_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))
#define RING_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define RING_SIMD_INLINE inline __attribute__((always_inline))

namespace ring::kernels::cpu::simd {

// ---- AVX-512 (avx512f/bw/dq/vl + fma): 16 lanes ------------------------------------------------
namespace avx512 {
#define RING_F RING_SIMD_INLINE RING_TARGET_AVX512
constexpr int kWidth = 16;
using vf = __m512;
using vi = __m512i;
using mask = __mmask16;
// fp64 accumulator for sum_squares: two 8-lane double vectors cover one vf.
struct dacc {
  __m512d lo, hi;
};

RING_F vf loadu(const float* p) {
  return _mm512_loadu_ps(p);
}
RING_F void storeu(float* p, vf v) {
  _mm512_storeu_ps(p, v);
}
// Lanes [count, kWidth) read as 0 and are not written; 0 <= count <= kWidth. No fault past count.
RING_F mask first_lanes(int count) {
  return (__mmask16)((1u << count) - 1u);
}
RING_F vf load_partial(const float* p, int count) {
  return _mm512_maskz_loadu_ps(first_lanes(count), p);
}
RING_F void store_partial(float* p, vf v, int count) {
  _mm512_mask_storeu_ps(p, first_lanes(count), v);
}
RING_F vf set1(float x) {
  return _mm512_set1_ps(x);
}
RING_F vf zero() {
  return _mm512_setzero_ps();
}
RING_F vf add(vf a, vf b) {
  return _mm512_add_ps(a, b);
}
RING_F vf sub(vf a, vf b) {
  return _mm512_sub_ps(a, b);
}
RING_F vf mul(vf a, vf b) {
  return _mm512_mul_ps(a, b);
}
RING_F vf div(vf a, vf b) {
  return _mm512_div_ps(a, b);
}
RING_F vf fmadd(vf a, vf b, vf c) {
  return _mm512_fmadd_ps(a, b, c);
}  // a*b + c
RING_F vf fnmadd(vf a, vf b, vf c) {
  return _mm512_fnmadd_ps(a, b, c);
}  // c - a*b
RING_F vf max(vf a, vf b) {
  return _mm512_max_ps(a, b);
}
RING_F vf min(vf a, vf b) {
  return _mm512_min_ps(a, b);
}
RING_F vf sqrt(vf a) {
  return _mm512_sqrt_ps(a);
}
RING_F vf abs(vf a) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
}
RING_F float reduce_add(vf a) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
// Lane i of the result is reduce_add(a[i]), bit for bit (the same tree: lanes i + i+8, then
// i + i+4, i + i+2, i + i+1), for the kWidth vectors a[0..kWidth) at once: a transpose by
// shuffles that costs about 3 operations per vector instead of reduce_add's 8.
RING_F vf reduce_add_each(const vf* a) {
  // i + i+8: w[p] holds a[2p]'s 8 sums in lanes 0-7 and a[2p+1]'s in lanes 8-15.
  vf w[8];
  for (int p = 0; p < 8; ++p)
    w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
  // i + i+4: x[p]'s 128-bit lanes hold 4 sums of a[4p], a[4p+1], a[4p+2], a[4p+3].
  vf x[4];
  for (int p = 0; p < 4; ++p)
    x[p] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0xDD));
  // i + i+2: y[p]'s 128-bit lane k holds 2 sums of a[4(2p)+k], then 2 of a[4(2p+1)+k].
  vf y[2];
  for (int p = 0; p < 2; ++p)
    y[p] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x[2 * p]),
                                                             _mm512_castps_pd(x[2 * p + 1]))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x[2 * p]),
                                                             _mm512_castps_pd(x[2 * p + 1]))));
  // i + i+1: lane 4k+t holds the sum of a[k + 4t].
  const vf z =
      _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, z);
}
RING_F float reduce_max(vf a) {
  __m256 h = _mm256_max_ps(_mm512_castps512_ps256(a),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
RING_F mask cmp_lt(vf a, vf b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
}
RING_F mask cmp_ge(vf a, vf b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ);
}
RING_F vf select(mask m, vf if_true, vf if_false) {
  return _mm512_mask_blend_ps(m, if_false, if_true);
}
// Round to nearest (current MXCSR mode, nearest-even by default) into int32 lanes.
RING_F vi round_to_int(vf a) {
  return _mm512_cvtps_epi32(a);
}
RING_F vf int_to_float(vi a) {
  return _mm512_cvtepi32_ps(a);
}
// 2^n for int lanes n in [-126, 127].
RING_F vf pow2_int(vi n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
}
// (x[0],x[1],x[2],x[3],...) -> (x[1],x[0],x[3],x[2],...): the RoPE partner of each lane.
RING_F vf swap_pairs(vf a) {
  return _mm512_permute_ps(a, 0xB1);
}
// Bit i set iff (bits(p[i]) & 0x7fffffff) > threshold (as int32): |x| above a threshold
// compared on the IEEE bit pattern (NaN counts as larger than inf).
RING_F uint32_t abs_bits_gt(const float* p, int32_t threshold) {
  vi b = _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmpgt_epi32_mask(b, _mm512_set1_epi32(threshold));
}
RING_F dacc dacc_zero() {
  return {_mm512_setzero_pd(), _mm512_setzero_pd()};
}
RING_F void dacc_add_squares(dacc& acc, vf x) {
  __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  acc.lo = _mm512_fmadd_pd(lo, lo, acc.lo);
  acc.hi = _mm512_fmadd_pd(hi, hi, acc.hi);
}
RING_F double dacc_reduce(const dacc& acc) {
  alignas(64) double t[8];
  _mm512_store_pd(t, _mm512_add_pd(acc.lo, acc.hi));
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
// bf16 (common/numeric/bf16.h's rounding, bit for bit): a full vector to and from 16-bit lanes.
// Integer arithmetic, not AVX512_BF16's vcvtneps2bf16, which flushes subnormals to zero.
RING_F vi bf16_bits(vf x) {  // the bf16 of each lane in its low 16 bits
  const vi u = _mm512_castps_si512(x);
  const vi lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const vi r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const vi q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(nan, r, q);
}
RING_F void store_bf16(uint16_t* p, vf x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(x)));
}
RING_F vf load_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
RING_F vf round_bf16(vf x) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(x), 16)); }
#undef RING_F
}  // namespace avx512

// ---- AVX2 + FMA: 8 lanes ------------------------------------------------------------------
namespace avx2 {
#define RING_F RING_SIMD_INLINE RING_TARGET_AVX2
constexpr int kWidth = 8;
using vf = __m256;
using vi = __m256i;
using mask = __m256;
struct dacc {
  __m256d lo, hi;
};

RING_F vf loadu(const float* p) {
  return _mm256_loadu_ps(p);
}
RING_F void storeu(float* p, vf v) {
  _mm256_storeu_ps(p, v);
}
RING_F __m256i first_lanes(int count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// Full vectors take the plain load/store: vmaskmovps is slow on some cores (a masked store is
// microcoded on AMD Zen), and kernels call these for every vector, not just the tail.
RING_F vf load_partial(const float* p, int count) {
  if (count >= kWidth) return _mm256_loadu_ps(p);
  return _mm256_maskload_ps(p, first_lanes(count));
}
RING_F void store_partial(float* p, vf v, int count) {
  if (count >= kWidth) return _mm256_storeu_ps(p, v);
  _mm256_maskstore_ps(p, first_lanes(count), v);
}
RING_F vf set1(float x) {
  return _mm256_set1_ps(x);
}
RING_F vf zero() {
  return _mm256_setzero_ps();
}
RING_F vf add(vf a, vf b) {
  return _mm256_add_ps(a, b);
}
RING_F vf sub(vf a, vf b) {
  return _mm256_sub_ps(a, b);
}
RING_F vf mul(vf a, vf b) {
  return _mm256_mul_ps(a, b);
}
RING_F vf div(vf a, vf b) {
  return _mm256_div_ps(a, b);
}
RING_F vf fmadd(vf a, vf b, vf c) {
  return _mm256_fmadd_ps(a, b, c);
}
RING_F vf fnmadd(vf a, vf b, vf c) {
  return _mm256_fnmadd_ps(a, b, c);
}
RING_F vf max(vf a, vf b) {
  return _mm256_max_ps(a, b);
}
RING_F vf min(vf a, vf b) {
  return _mm256_min_ps(a, b);
}
RING_F vf sqrt(vf a) {
  return _mm256_sqrt_ps(a);
}
RING_F vf abs(vf a) {
  return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}
RING_F float reduce_add(vf a) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
// Lane i of the result is reduce_add(a[i]), bit for bit (the same tree: lanes i + i+4, then
// i + i+2, i + i+1), for the kWidth vectors a[0..kWidth) at once (a transpose by shuffles).
RING_F vf reduce_add_each(const vf* a) {
  // i + i+4: w[p]'s 128-bit lanes hold 4 sums of a[2p], then of a[2p+1].
  vf w[4];
  for (int p = 0; p < 4; ++p)
    w[p] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x20),
                         _mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x31));
  // i + i+2: x[p]'s 128-bit lane k holds 2 sums of a[4p+k], then 2 of a[4p+2+k].
  vf x[2];
  for (int p = 0; p < 2; ++p)
    x[p] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(w[2 * p]),
                                                             _mm256_castps_pd(w[2 * p + 1]))),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(w[2 * p]),
                                                             _mm256_castps_pd(w[2 * p + 1]))));
  // i + i+1: lane 4k+t holds the sum of a[k + 2t].
  const vf z =
      _mm256_add_ps(_mm256_shuffle_ps(x[0], x[1], 0x88), _mm256_shuffle_ps(x[0], x[1], 0xDD));
  return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
RING_F float reduce_max(vf a) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
RING_F mask cmp_lt(vf a, vf b) {
  return _mm256_cmp_ps(a, b, _CMP_LT_OQ);
}
RING_F mask cmp_ge(vf a, vf b) {
  return _mm256_cmp_ps(a, b, _CMP_GE_OQ);
}
RING_F vf select(mask m, vf if_true, vf if_false) {
  return _mm256_blendv_ps(if_false, if_true, m);
}
RING_F vi round_to_int(vf a) {
  return _mm256_cvtps_epi32(a);
}
RING_F vf int_to_float(vi a) {
  return _mm256_cvtepi32_ps(a);
}
RING_F vf pow2_int(vi n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}
RING_F vf swap_pairs(vf a) {
  return _mm256_permute_ps(a, 0xB1);
}
RING_F uint32_t abs_bits_gt(const float* p, int32_t threshold) {
  __m256i b = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                               _mm256_set1_epi32(0x7fffffff));
  __m256i gt = _mm256_cmpgt_epi32(b, _mm256_set1_epi32(threshold));
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(gt)));
}
RING_F dacc dacc_zero() {
  return {_mm256_setzero_pd(), _mm256_setzero_pd()};
}
RING_F void dacc_add_squares(dacc& acc, vf x) {
  __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  acc.lo = _mm256_fmadd_pd(lo, lo, acc.lo);
  acc.hi = _mm256_fmadd_pd(hi, hi, acc.hi);
}
RING_F double dacc_reduce(const dacc& acc) {
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(acc.lo, acc.hi));
  return (t[0] + t[1]) + (t[2] + t[3]);
}
// bf16 (common/numeric/bf16.h's rounding, bit for bit), as the AVX-512 ones.
RING_F vi bf16_bits(vf x) {
  const vi u = _mm256_castps_si256(x);
  const vi lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const vi r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  // |u| <= 0x7FFFFFFF is non-negative as a signed lane: the signed compare is the unsigned one.
  const vi nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                    _mm256_set1_epi32(0x7F800000));
  const vi q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, q, nan);
}
RING_F void store_bf16(uint16_t* p, vf x) {
  // packus keeps 16-bit lanes per 128-bit half: [a0-3 a0-3 | a4-7 a4-7]; 0xD8 gathers a0-7.
  const vi b = bf16_bits(x);
  const vi packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
RING_F vf load_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
RING_F vf round_bf16(vf x) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(x), 16)); }
#undef RING_F
}  // namespace avx2

// ---- scalar fallback: 1 lane, plain C++ ----------------------------------------------------
namespace scalar {
#define RING_F RING_SIMD_INLINE
constexpr int kWidth = 1;
using vf = float;
using vi = int32_t;
using mask = bool;
struct dacc {
  double s;
};

RING_F vf loadu(const float* p) {
  return *p;
}
RING_F void storeu(float* p, vf v) {
  *p = v;
}
RING_F vf load_partial(const float* p, int count) {
  return count > 0 ? *p : 0.f;
}
RING_F void store_partial(float* p, vf v, int count) {
  if (count > 0) *p = v;
}
RING_F vf set1(float x) {
  return x;
}
RING_F vf zero() {
  return 0.f;
}
RING_F vf add(vf a, vf b) {
  return a + b;
}
RING_F vf sub(vf a, vf b) {
  return a - b;
}
RING_F vf mul(vf a, vf b) {
  return a * b;
}
RING_F vf div(vf a, vf b) {
  return a / b;
}
RING_F vf fmadd(vf a, vf b, vf c) {
  return std::fma(a, b, c);
}
RING_F vf fnmadd(vf a, vf b, vf c) {
  return std::fma(-a, b, c);
}
// Same NaN behaviour as maxps/minps: the second operand when either is NaN.
RING_F vf max(vf a, vf b) {
  return a > b ? a : b;
}
RING_F vf min(vf a, vf b) {
  return a < b ? a : b;
}
RING_F vf sqrt(vf a) {
  return std::sqrt(a);
}
RING_F vf abs(vf a) {
  return std::fabs(a);
}
RING_F float reduce_add(vf a) {
  return a;
}
RING_F vf reduce_add_each(const vf* a) {
  return a[0];
}
RING_F float reduce_max(vf a) {
  return a;
}
RING_F mask cmp_lt(vf a, vf b) {
  return a < b;
}
RING_F mask cmp_ge(vf a, vf b) {
  return a >= b;
}
RING_F vf select(mask m, vf if_true, vf if_false) {
  return m ? if_true : if_false;
}
RING_F vi round_to_int(vf a) {
  return static_cast<int32_t>(std::nearbyint(a));
}
RING_F vf int_to_float(vi a) {
  return static_cast<float>(a);
}
RING_F vf pow2_int(vi n) {
  return std::bit_cast<float>(static_cast<uint32_t>(n + 127) << 23);
}
RING_F vf swap_pairs(vf a) {
  return a;
}  // unused: RoPE's scalar path works on pairs directly
RING_F uint32_t abs_bits_gt(const float* p, int32_t threshold) {
  uint32_t b;
  std::memcpy(&b, p, 4);
  return static_cast<int32_t>(b & 0x7fffffffu) > threshold ? 1u : 0u;
}
RING_F dacc dacc_zero() {
  return {0.0};
}
RING_F void dacc_add_squares(dacc& acc, vf x) {
  double d = x;
  acc.s += d * d;
}
RING_F double dacc_reduce(const dacc& acc) {
  return acc.s;
}
// bf16: common/numeric/bf16.h itself.
RING_F void store_bf16(uint16_t* p, vf x) { *p = ::ring::numeric::f32_to_bf16(x); }
RING_F vf load_bf16(const uint16_t* p) { return ::ring::numeric::bf16_to_f32(*p); }
RING_F vf round_bf16(vf x) { return ::ring::numeric::round_bf16(x); }
#undef RING_F
}  // namespace scalar

}  // namespace ring::kernels::cpu::simd
