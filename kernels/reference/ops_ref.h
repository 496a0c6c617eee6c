// Plain scalar, obviously-correct versions of every non-attention op of kernels/backend.h: the
// oracle the CPU (and later CUDA) kernels are tested against. Same shapes and contracts as the
// Backend methods; no threads, no SIMD, fp64 arithmetic where it makes the answer exact(er).
// Arguments are assumed valid (tests call these only with valid input). Not for production.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace ring::kernels::ref {

// C[m,n] = alpha op(A) op(B) + beta C, row-major, fp64 accumulation (beta = 0 overwrites).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// x, y: [n, d]; gain: [d]; rstd: [n].
void rmsnorm_forward(int64_t n, int64_t d, float eps, const float* x, const float* gain, float* y,
                     float* rstd);
// dx overwritten, dgain accumulated (+=).
void rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* gain, const float* rstd,
                      const float* dy, float* dx, float* dgain);
// x [n, heads, head_dim] in place; pairs (2j, 2j+1) rotated by pos * theta^(-2j/head_dim).
void rope(int64_t n, int64_t heads, int64_t head_dim, float theta, const int64_t* pos, bool inverse,
          float* x);
// With scaling (kernels/rope.h): angle pos * rope_inv_freq(p, j), times rope_attention_factor.
void rope(int64_t n, int64_t heads, int64_t head_dim, const RopeParams& p, const int64_t* pos,
          bool inverse, float* x);
void swiglu_forward(int64_t n, const float* gate, const float* up, float* out);
void swiglu_backward(int64_t n, const float* gate, const float* up, const float* dout, float* dgate,
                     float* dup);
void gelu_forward(int64_t n, const float* x, float* out);
void gelu_backward(int64_t n, const float* x, const float* dout, float* dx);
void embedding_forward(int64_t n, int64_t d, const int32_t* ids, const float* table, float* out);
void embedding_backward(int64_t n, int64_t d, const int32_t* ids, const float* dout, float* dtable);
// Label -1 ignored; dlogits may be null (and may alias logits).
void cross_entropy(int64_t n, int64_t vocab, const float* logits, const int32_t* labels,
                   float grad_scale, double* loss_sum, int64_t* valid, float* dlogits);
void adamw_step(int64_t n, const Backend::AdamWParams& hp, float* param, const float* grad,
                float* m, float* v);
// Full sort by (|x| descending, index ascending); NaN above every number.
void topk_abs(int64_t n, int64_t k, const float* x, uint32_t* indices, float* values);
void fill(int64_t n, float value, float* x);
void scale(int64_t n, float alpha, float* x);
void axpy(int64_t n, float alpha, const float* x, float* y);
void add(int64_t n, const float* a, const float* b, float* out);
double sum_squares(int64_t n, const float* x);

}  // namespace ring::kernels::ref
