// CPU attention kernels: tiled forward with online softmax, exact (out, lse) merge, and the
// FlashAttention-2 style backward. Internal to the CPU backend (kernels/cpu/cpu_backend.cc
// forwards the Backend methods here); the contract of every function is the one of the
// matching Backend method in kernels/backend.h.
//
// DType::kF32 and kBF16 (q, k, v, dout and the decode pool stored as bf16 bits): bf16 is widened
// to fp32 exactly as tiles are packed (rows as they are read, in the decode kernel) and the fp32
// code runs from there, so a bf16 call gives bit for bit the fp32 call on the widened inputs.
// threads <= 0 uses all OpenMP threads. The ISA (AVX-512, AVX2+FMA, portable scalar) is the one
// the other CPU ops use (cpu::active_isa(), kernels/cpu/ops.h): cpuid, lowered by
// RING_CPU_ISA=scalar|avx2|avx512 at first use or by cpu::set_isa, which the tests use to
// exercise every path.
#pragma once

#include "kernels/backend.h"

namespace ring::kernels::cpu {

// out [q_len, heads, head_dim], lse [q_len, heads]; stats (if given) is accumulated (+=).
Status attention_forward(const AttentionArgs& a, float* out, float* lse, AttentionStats* stats,
                         int threads);

// (out_a, lse_a) <- merge((out_a, lse_a), (out_b, lse_b)); out_* [tokens, heads, head_dim],
// lse_* [tokens, heads].
Status attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a, float* lse_a,
                       const float* out_b, const float* lse_b, int threads);

// Paged decode attention (backend.h PagedDecodeArgs): rows in parallel, two passes per row (max
// score, then exp-weighted sums), fp32, std::exp; an fp32 or bf16 pool. The plain version the
// device kernels are checked against through the same interface.
Status paged_decode_attention(const PagedDecodeArgs& a, float* out, float* lse, int threads);

// delta [tokens, heads] = rowwise dot(dout, out).
Status attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads, int64_t head_dim,
                                  const float* out, const void* dout, float* delta, int threads);

// Accumulates (+=) dq [q_len, heads, head_dim], dk and dv [kv_len, kv_heads, head_dim].
Status attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                          const float* delta, float* dq, float* dk, float* dv,
                          AttentionStats* stats, int threads);

}  // namespace ring::kernels::cpu
