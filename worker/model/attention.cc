#include "worker/model/attention.h"

namespace ring::model {

kernels::AttentionArgs local_attention_args(const AttentionCall& c) {
  kernels::AttentionArgs a;
  a.q_len = a.kv_len = c.tokens;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.scale = c.scale;
  a.causal = true;
  a.dtype = kernels::DType::kF32;
  a.q = c.q;
  a.k = c.k;
  a.v = c.v;
  a.q_pos = a.k_pos = c.positions;
  a.q_doc = a.k_doc = c.doc_ids;
  return a;
}

void LocalAttention::forward(const AttentionCall& call, float* out, float* lse) {
  check_status(backend_->attention_forward(local_attention_args(call), out, lse, &stats_),
               "attention_forward");
}

void LocalAttention::backward(const AttentionCall& call, const float* out, const float* lse,
                              const float* dout, float* dq, float* dk, float* dv) {
  const int64_t t = call.tokens;
  delta_.resize(backend_, t * call.heads);
  check_status(backend_->attention_backward_prepare(kernels::DType::kF32, t, call.heads,
                                                    call.head_dim, out, dout, delta_.data()),
               "attention_backward_prepare");
  check_status(backend_->fill(t * call.heads * call.head_dim, 0.f, dq), "fill");
  check_status(backend_->fill(t * call.kv_heads * call.head_dim, 0.f, dk), "fill");
  check_status(backend_->fill(t * call.kv_heads * call.head_dim, 0.f, dv), "fill");
  check_status(backend_->attention_backward(local_attention_args(call), dout, lse, delta_.data(),
                                            dq, dk, dv, &stats_),
               "attention_backward");
}

}  // namespace ring::model
