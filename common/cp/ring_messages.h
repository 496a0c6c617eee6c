// Sizes of the messages RingAttention sends (ring_attention.h), for the code that sends them and
// for the step simulator (sim/), which must count the same bytes.
//
// K/V block of T tokens (kvd = kv_heads x head_dim), 64-byte aligned parts:
//   [header 32 B -> 64][positions T x int64][doc ids T x int32][K T x kvd][V T x kvd]
// dK/dV accumulator carrying rows [lo, hi) of a block: a 64-byte header {lo, hi}, then dK and dV
// rows, (hi - lo) x kvd each; 0 bytes while no rank has attended to any row of the block.
// `elem_bytes` is the size of one K/V (or dK/dV) element as it travels: 4 for fp32, 2 for bf16.
// `ringctl plan`, `ringctl simulate` and the ring itself size every hop with these two functions.
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

}  // namespace ring::cp
