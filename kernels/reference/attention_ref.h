// Plain scalar attention: the oracle for the attention kernels of every backend.
//
// Obviously-correct on purpose: scores are materialised one query row at a time, everything is
// accumulated in double, no tiling, no threads. Same semantics as kernels/backend.h (masks from
// global positions and document ids, empty rows -> out 0 and lse -inf, FlashAttention-2
// backward from the final lse). Only DType::kF32 (kBF16 -> kUnsupported).
#pragma once

#include "kernels/backend.h"

namespace ring::kernels::ref {

// Whether query row i may attend key j under a's masks.
bool attention_allowed(const AttentionArgs& a, int64_t i, int64_t j);

// out [q_len, heads, head_dim], lse [q_len, heads] (natural log), overwritten.
Status attention_forward(const AttentionArgs& a, float* out, float* lse);

// (out_a, lse_a) <- exact merge with (out_b, lse_b); out_* [tokens, heads, head_dim].
Status attention_merge(int64_t tokens, int64_t heads, int64_t head_dim, float* out_a, float* lse_a,
                       const float* out_b, const float* lse_b);

// delta [tokens, heads] = sum_d dout * out.
Status attention_backward_prepare(DType dtype, int64_t tokens, int64_t heads, int64_t head_dim,
                                  const float* out, const void* dout, float* delta);

// Accumulates (+=) dq [q_len, heads, head_dim], dk, dv [kv_len, kv_heads, head_dim].
Status attention_backward(const AttentionArgs& a, const void* dout, const float* lse,
                          const float* delta, float* dq, float* dk, float* dv);

}  // namespace ring::kernels::ref
