// A backend under another name that forwards every op to the cpu backend: the generator's path
// for a backend other than cpu (the device's: the decode step's dense ops on the backend, the
// fast tier in its memory), run without a GPU (fast_tier_test, generate_rank_helper).
#pragma once

#include <memory>
#include <utility>

#include "kernels/backend.h"

namespace ring::gen {

// `paged` false: it lacks paged decode attention.
class Renamed final : public kernels::Backend {
 public:
  Renamed(std::unique_ptr<kernels::Backend> b, bool paged) : b_(std::move(b)), paged_(paged) {}
  const char* name() const override { return "renamed"; }
  bool supports(kernels::Op op, kernels::DType t) const override {
    return (paged_ || op != kernels::Op::kPagedDecode) && b_->supports(op, t);
  }
  using S = kernels::Status;
  using D = kernels::DType;
  S synchronize() override { return b_->synchronize(); }
  S alloc(size_t n, void** o) override { return b_->alloc(n, o); }
  S free(void* p) override { return b_->free(p); }
  S copy_to_device(void* d, const void* s, size_t n) override { return b_->copy_to_device(d, s, n); }
  S copy_to_host(void* d, const void* s, size_t n) override { return b_->copy_to_host(d, s, n); }
  S gemm(D t, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al, const void* a,
         int64_t lda, const void* b, int64_t ldb, float be, void* c, int64_t ldc) override {
    return b_->gemm(t, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
  }
  // bf16 (a bf16 model's decode step on this backend).
  S gemm_mixed(D ab, D cd, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al,
               const void* a, int64_t lda, const void* b, int64_t ldb, float be, void* c,
               int64_t ldc) override {
    return b_->gemm_mixed(ab, cd, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
  }
  S convert(D from, D to, int64_t n, const void* x, void* o) override {
    return b_->convert(from, to, n, x, o);
  }
  S round_to_bf16(int64_t n, float* x) override { return b_->round_to_bf16(n, x); }
  S attention_forward(const kernels::AttentionArgs& a, float* o, float* l,
                      kernels::AttentionStats* st) override {
    return b_->attention_forward(a, o, l, st);
  }
  S attention_merge(int64_t t, int64_t h, int64_t d, float* oa, float* la, const float* ob,
                    const float* lb) override {
    return b_->attention_merge(t, h, d, oa, la, ob, lb);
  }
  S paged_decode_attention(const kernels::PagedDecodeArgs& a, float* o, float* l) override {
    return paged_ ? b_->paged_decode_attention(a, o, l) : S::kUnsupported;
  }
  S attention_backward_prepare(D t, int64_t n, int64_t h, int64_t d, const float* o,
                               const void* g, float* dl) override {
    return b_->attention_backward_prepare(t, n, h, d, o, g, dl);
  }
  S attention_backward(const kernels::AttentionArgs& a, const void* g, const float* l,
                       const float* dl, float* dq, float* dk, float* dv,
                       kernels::AttentionStats* st) override {
    return b_->attention_backward(a, g, l, dl, dq, dk, dv, st);
  }
  S rmsnorm_forward(int64_t n, int64_t d, float e, const float* x, const float* g, float* y,
                    float* r) override {
    return b_->rmsnorm_forward(n, d, e, x, g, y, r);
  }
  S rmsnorm_backward(int64_t n, int64_t d, const float* x, const float* g, const float* r,
                     const float* dy, float* dx, float* dg) override {
    return b_->rmsnorm_backward(n, d, x, g, r, dy, dx, dg);
  }
  using kernels::Backend::rope;
  S rope(int64_t n, int64_t h, int64_t d, const kernels::RopeParams& p, const int64_t* pos,
         bool inv, float* x) override {
    return b_->rope(n, h, d, p, pos, inv, x);
  }
  S swiglu_forward(int64_t n, const float* g, const float* u, float* o) override {
    return b_->swiglu_forward(n, g, u, o);
  }
  S swiglu_backward(int64_t n, const float* g, const float* u, const float* d, float* dg,
                    float* du) override {
    return b_->swiglu_backward(n, g, u, d, dg, du);
  }
  S gelu_forward(int64_t n, const float* x, float* o) override { return b_->gelu_forward(n, x, o); }
  S gelu_backward(int64_t n, const float* x, const float* d, float* dx) override {
    return b_->gelu_backward(n, x, d, dx);
  }
  S embedding_forward(int64_t n, int64_t v, int64_t d, const int32_t* i, const float* t,
                      float* o) override {
    return b_->embedding_forward(n, v, d, i, t, o);
  }
  S embedding_backward(int64_t n, int64_t v, int64_t d, const int32_t* i, const float* g,
                       float* t) override {
    return b_->embedding_backward(n, v, d, i, g, t);
  }
  S cross_entropy(int64_t n, int64_t v, const float* lg, const int32_t* lb, float gs, double* ls,
                  int64_t* vd, float* dl) override {
    return b_->cross_entropy(n, v, lg, lb, gs, ls, vd, dl);
  }
  S adamw_step(int64_t n, const AdamWParams& h, float* p, const float* g, float* m,
               float* v) override {
    return b_->adamw_step(n, h, p, g, m, v);
  }
  S topk_abs(int64_t n, int64_t k, const float* x, uint32_t* i, float* v) override {
    return b_->topk_abs(n, k, x, i, v);
  }
  S fill(int64_t n, float v, float* x) override { return b_->fill(n, v, x); }
  S scale(int64_t n, float a, float* x) override { return b_->scale(n, a, x); }
  S axpy(int64_t n, float a, const float* x, float* y) override { return b_->axpy(n, a, x, y); }
  S add(int64_t n, const float* a, const float* b, float* o) override { return b_->add(n, a, b, o); }
  S sum_squares(int64_t n, const float* x, double* o) override { return b_->sum_squares(n, x, o); }

 private:
  std::unique_ptr<kernels::Backend> b_;
  bool paged_;
};

}  // namespace ring::gen
