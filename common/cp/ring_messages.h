// Sizes of the messages RingAttention sends (ring_attention.h), for the code that sends them and
// for the step simulator (sim/), which must count the same bytes.
//
// K/V block of T tokens (kvd = kv_heads x head_dim), 64-byte aligned parts:
//   [header 32 B -> 64][positions T x int64][doc ids T x int32][K T x kvd][V T x kvd]
// dK/dV accumulator carrying rows [lo, hi) of a block: a 64-byte header {lo, hi}, then dK and dV
// rows, (hi - lo) x kvd each; 0 bytes while no rank has attended to any row of the block.
// `elem_bytes` is the size of one K/V (or dK/dV) element as it travels: 4 for fp32, 2 for bf16.
// `ringctl plan`, `ringctl simulate` and the ring itself size every hop with these two functions.
//
// Head-parallel attention (parallel.head_ranks U, worker/ring/head_attention.h) adds two
// all-to-alls per layer inside a group; a member's message for T tokens, 64-byte aligned parts:
//   gather:  [positions T x int64][doc ids T x int32][q T x hq x hd][k, v T x hkv x hd each]
//            (q, k, v at elem_bytes), and in the backward also [o T x hq x hd][lse T x hq]
//            [dout T x hq x hd], fp32;
//   return:  forward [o T x hq x hd][lse T x hq]; backward [dq T x hq x hd][dk, dv T x hkv x hd],
//            fp32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ring::cp {

inline constexpr size_t kRingHeaderBytes = 64;

inline constexpr size_t ring_align64(size_t x) { return (x + 63) & ~size_t{63}; }

inline constexpr size_t packed_block_bytes(int64_t tokens, int64_t kvd,
                                          size_t elem_bytes = sizeof(float)) {
  const size_t t = static_cast<size_t>(tokens);
  return kRingHeaderBytes + ring_align64(t * sizeof(int64_t)) + ring_align64(t * sizeof(int32_t)) +
         2 * ring_align64(t * static_cast<size_t>(kvd) * elem_bytes);
}

inline constexpr size_t dkv_message_bytes(int64_t rows, int64_t kvd,
                                          size_t elem_bytes = sizeof(float)) {
  return rows <= 0 ? 0
                   : kRingHeaderBytes + 2 * static_cast<size_t>(rows) * static_cast<size_t>(kvd) *
                                            elem_bytes;
}

inline constexpr size_t head_gather_bytes(int64_t tokens, int64_t hq, int64_t hkv, int64_t hd,
                                          size_t elem_bytes, bool docs, bool backward) {
  const size_t t = static_cast<size_t>(tokens);
  const size_t q = t * static_cast<size_t>(hq * hd), kv = t * static_cast<size_t>(hkv * hd);
  size_t b = ring_align64(t * sizeof(int64_t)) + ring_align64(docs ? t * sizeof(int32_t) : 0) +
             ring_align64(q * elem_bytes) + 2 * ring_align64(kv * elem_bytes);
  if (backward)
    b += 2 * ring_align64(q * sizeof(float)) +
         ring_align64(t * static_cast<size_t>(hq) * sizeof(float));
  return b;
}

inline constexpr size_t head_return_bytes(int64_t tokens, int64_t hq, int64_t hkv, int64_t hd,
                                          bool backward) {
  const size_t t = static_cast<size_t>(tokens);
  const size_t q = t * static_cast<size_t>(hq * hd), kv = t * static_cast<size_t>(hkv * hd);
  return backward ? ring_align64(q * sizeof(float)) + 2 * ring_align64(kv * sizeof(float))
                  : ring_align64(q * sizeof(float)) +
                        ring_align64(t * static_cast<size_t>(hq) * sizeof(float));
}

// K/V heads per head slot: kv_heads / U when U divides them, else 1 (U a multiple of kv_heads:
// each K/V head replicated on U / kv_heads slots).
inline constexpr int64_t head_slot_kv_heads(int64_t kv_heads, int64_t head_ranks) {
  return kv_heads % head_ranks == 0 ? kv_heads / head_ranks : 1;
}

}  // namespace ring::cp
