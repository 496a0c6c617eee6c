// How the model's attention is computed, behind one small interface: the model hands over this
// rank's q/k/v (after RoPE) with their global positions and document ids and gets the attention
// output back; it never knows whether the keys live on this rank only (LocalAttention) or travel
// around a ring of processes (RingAttention).
//
// A query token i attends to key token j iff pos[j] <= pos[i] and doc[i] == doc[j] (causal mask
// at global positions + packed-document mask), over ALL tokens of the sequence (every rank's).
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "worker/model/buffer.h"

namespace ring::model {

// One layer's attention inputs on this rank. All pointers are backend (device) memory.
struct AttentionCall {
  int layer = 0;             // block index (a ring implementation may keep per-layer state)
  int64_t tokens = 0;        // this rank's tokens T
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.f;         // softmax scale, 1/sqrt(head_dim)
  const int64_t* positions = nullptr;  // [T] global positions
  const int32_t* doc_ids = nullptr;    // [T] document ids (nullptr: causal mask only)
  const float* q = nullptr;  // [T, heads, head_dim], RoPE applied
  const float* k = nullptr;  // [T, kv_heads, head_dim], RoPE applied
  const float* v = nullptr;  // [T, kv_heads, head_dim]
};

class AttentionExecutor {
 public:
  virtual ~AttentionExecutor() = default;
  // out [T, heads, head_dim] and lse [T, heads] (natural log) over every key of the sequence.
  virtual void forward(const AttentionCall& call, float* out, float* lse) = 0;
  // Given the forward's (out, lse) and dout [T, heads, head_dim], writes (overwrites) dq
  // [T, heads, head_dim] and dk, dv [T, kv_heads, head_dim] for THIS rank's q/k/v (a ring
  // implementation sums the contributions of every rank's queries into dk/dv before returning).
  virtual void backward(const AttentionCall& call, const float* out, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv) = 0;
  // Tiles considered / skipped / masked and flops since construction (forward and backward).
  virtual kernels::AttentionStats stats() const = 0;
};

// One rank holds the whole sequence: one attention_forward over the whole block, one
// attention_backward_prepare + attention_backward.
class LocalAttention final : public AttentionExecutor {
 public:
  explicit LocalAttention(kernels::Backend* backend) : backend_(backend) {}
  void forward(const AttentionCall& call, float* out, float* lse) override;
  void backward(const AttentionCall& call, const float* out, const float* lse, const float* dout,
                float* dq, float* dk, float* dv) override;
  kernels::AttentionStats stats() const override { return stats_; }

 private:
  kernels::Backend* backend_;
  DeviceArray<float> delta_;  // [T, heads]
  kernels::AttentionStats stats_;
};

// The kernel arguments of a local (q block == kv block) call.
kernels::AttentionArgs local_attention_args(const AttentionCall& call);

}  // namespace ring::model
