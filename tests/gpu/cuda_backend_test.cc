// The CUDA backend (kernels/cuda, loaded through create_backend("cuda")) against the CPU backend
// on the same inputs: every op, attention forward/backward in fp32 and bf16, the whole model's
// loss and gradients, and a short training run. Every test that needs a GPU skips with the
// reason create_backend gave ("no usable CUDA device: ..."); LoadsOrSaysWhy runs everywhere.
//
// Tolerances, per element: |got - want| <= rel * |want| + abs * max|want|
//   fp32 storage:  attention out/lse/dq/dk/dv rel 2e-4, abs 2e-5 (different tiling and
//                  summation order than the CPU; fp32 accumulation on both sides);
//                  elementwise ops, norms, rope, adamw: rel 1e-5, abs 1e-6; GEMM rel 1e-4,
//                  abs 1e-5; cross-entropy loss sum rel 1e-6; model loss rel 1e-5, gradients
//                  rel 1e-3, abs 1e-4 (atomics reorder sums).
//   bf16 storage:  inputs are rounded to bf16 and the CPU computes in fp32 on the rounded values;
//                  the GPU also rounds P and dS to bf16 before the tensor-core products, so
//                  attention out rel 2e-2, abs 1e-2; lse abs 1e-2; dq/dk/dv rel 5e-2, abs 2e-2;
//                  GEMM (bf16 C) rel 1e-2, abs 1e-2.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::kernels {
namespace {

using Vec = std::vector<float>;
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Tol {
  double rel, abs;
};

::testing::AssertionResult all_close(const char* name, const Vec& got, const Vec& want, Tol tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << name << ": size " << got.size() << " vs " << want.size();
  }
  double scale = 0;
  for (float w : want) {
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok = (std::isinf(w) || std::isinf(g))
                  ? g == w
                  : std::fabs(g - w) <= tol.rel * std::fabs(w) + tol.abs * scale;
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << bad << " of " << got.size() << " out of tolerance (rel " << tol.rel
         << ", abs " << tol.abs << " x " << scale << "); first at " << first << ": got "
         << got[first] << ", want " << want[first];
}

// bf16 round-to-nearest-even, as __float2bfloat16_rn.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<uint16_t> bf16_of(const Vec& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = to_bf16(v[i]);
  return o;
}
Vec rounded(const Vec& v) {
  Vec o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = from_bf16(to_bf16(v[i]));
  return o;
}

Vec randn(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, sd);
  Vec v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Backends {
  std::unique_ptr<Backend> gpu, cpu;
  std::string why;
};

Backends& backends() {
  static Backends b = [] {
    Backends r;
    std::string err;
    r.gpu = create_backend("cuda", 0, &err);
    if (!r.gpu) r.why = err;
    r.cpu = create_backend("cpu", 2, &err);
    return r;
  }();
  return b;
}

#define REQUIRE_GPU()                                                           \
  do {                                                                          \
    if (!backends().gpu) GTEST_SKIP() << "no CUDA backend: " << backends().why; \
  } while (0)

// Device memory holding a copy of a host vector; freed on scope exit.
template <typename T>
class Dev {
 public:
  Dev(Backend* b, const std::vector<T>& host) : b_(b), n_(host.size()) {
    EXPECT_EQ(b_->alloc(bytes(), &p_), Status::kOk) << b_->last_error();
    if (n_ > 0) {
      EXPECT_EQ(b_->copy_to_device(p_, host.data(), bytes()), Status::kOk);
    }
  }
  Dev(Backend* b, size_t n, T fill) : Dev(b, std::vector<T>(n, fill)) {}
  ~Dev() { b_->free(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() { return static_cast<T*>(p_); }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (n_ > 0) {
      EXPECT_EQ(b_->copy_to_host(h.data(), p_, bytes()), Status::kOk) << b_->last_error();
    }
    return h;
  }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  Backend* b_;
  size_t n_;
  void* p_ = nullptr;
};

TEST(CudaBackend, LoadsOrSaysWhy) {
  auto names = available_backends();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "cuda");  // built into this binary: first in preference
  Backends& b = backends();
  if (b.gpu) {
    EXPECT_STREQ(b.gpu->name(), "cuda");
    EXPECT_TRUE(b.gpu->supports(Op::kAttentionForward, DType::kBF16));
    EXPECT_TRUE(b.gpu->supports(Op::kGemm, DType::kBF16));
    EXPECT_FALSE(b.gpu->supports(Op::kRmsNorm, DType::kBF16));
    EXPECT_EQ(b.gpu->synchronize(), Status::kOk);
  } else {
    // No GPU (or no driver): a message naming the cause, never a crash.
    EXPECT_FALSE(b.why.empty());
    EXPECT_NE(b.why.find("CUDA"), std::string::npos) << b.why;
  }
}

// ---- attention -------------------------------------------------------------------------------
struct AttnCase {
  const char* name;
  int64_t q_len, kv_len, heads, kv_heads, head_dim;
  bool causal, docs, zigzag;
  int64_t k_offset;  // k positions = q positions - k_offset (a block from an earlier rank)
};

void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << c.name;
}

struct AttnInputs {
  AttentionArgs a;
  Vec q, k, v, dout;
  std::vector<int64_t> qpos, kpos;
  std::vector<int32_t> qdoc, kdoc;
};

AttnInputs make_attn(const AttnCase& c, uint64_t seed) {
  AttnInputs in;
  in.q = randn(c.q_len * c.heads * c.head_dim, seed);
  in.k = randn(c.kv_len * c.kv_heads * c.head_dim, seed + 1);
  in.v = randn(c.kv_len * c.kv_heads * c.head_dim, seed + 2);
  in.dout = randn(c.q_len * c.heads * c.head_dim, seed + 3);
  auto positions = [&](int64_t n, int64_t offset) {
    std::vector<int64_t> p(n);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = (c.zigzag && i >= n / 2 ? i + 3 * n / 2 : i) + 10000 - offset;
    }
    return p;
  };
  in.qpos = positions(c.q_len, 0);
  in.kpos = positions(c.kv_len, c.k_offset);
  auto docs = [&](const std::vector<int64_t>& pos) {
    std::vector<int32_t> d(pos.size());
    for (size_t i = 0; i < pos.size(); ++i) d[i] = static_cast<int32_t>(pos[i] / 97);
    return d;
  };
  in.qdoc = docs(in.qpos);
  in.kdoc = docs(in.kpos);
  AttentionArgs& a = in.a;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  a.causal = c.causal;
  return in;
}

struct AttnResult {
  Vec out, lse, dq, dk, dv;
  AttentionStats fwd, bwd;
};

// Runs forward, delta and backward on `b`; with bf16, q/k/v/dout are stored as bf16.
AttnResult run_attn(Backend* b, const AttnCase& c, const AttnInputs& in, DType dtype) {
  AttnResult r;
  AttentionArgs a = in.a;
  a.dtype = dtype;
  std::vector<uint16_t> qh = bf16_of(in.q), kh = bf16_of(in.k), vh = bf16_of(in.v),
                        dh = bf16_of(in.dout);
  Dev<float> qf(b, in.q), kf(b, in.k), vf(b, in.v), df(b, in.dout);
  Dev<uint16_t> qb(b, qh), kb(b, kh), vb(b, vh), db(b, dh);
  Dev<int64_t> qp(b, in.qpos), kp(b, in.kpos);
  Dev<int32_t> qd(b, in.qdoc), kd(b, in.kdoc);
  const bool bf = dtype == DType::kBF16;
  a.q = bf ? static_cast<const void*>(qb.get()) : qf.get();
  a.k = bf ? static_cast<const void*>(kb.get()) : kf.get();
  a.v = bf ? static_cast<const void*>(vb.get()) : vf.get();
  const void* dout = bf ? static_cast<const void*>(db.get()) : df.get();
  a.q_pos = qp.get();
  a.k_pos = kp.get();
  if (c.docs) {
    a.q_doc = qd.get();
    a.k_doc = kd.get();
  }
  const size_t qn = c.q_len * c.heads * c.head_dim, kn = c.kv_len * c.kv_heads * c.head_dim;
  Dev<float> out(b, qn, 0.f), lse(b, c.q_len * c.heads, 0.f), delta(b, c.q_len * c.heads, 0.f);
  Dev<float> dq(b, qn, 0.f), dk(b, kn, 0.f), dv(b, kn, 0.f);
  EXPECT_EQ(b->attention_forward(a, out.get(), lse.get(), &r.fwd), Status::kOk) << b->last_error();
  EXPECT_EQ(b->attention_backward_prepare(dtype, c.q_len, c.heads, c.head_dim, out.get(), dout,
                                          delta.get()),
            Status::kOk)
      << b->last_error();
  EXPECT_EQ(
      b->attention_backward(a, dout, lse.get(), delta.get(), dq.get(), dk.get(), dv.get(), &r.bwd),
      Status::kOk)
      << b->last_error();
  EXPECT_EQ(b->synchronize(), Status::kOk);
  r.out = out.host();
  r.lse = lse.host();
  r.dq = dq.host();
  r.dk = dk.host();
  r.dv = dv.host();
  return r;
}

class Attention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Attention, Fp32MatchesCpu) {
  REQUIRE_GPU();
  const AttnCase& c = GetParam();
  AttnInputs in = make_attn(c, 7);
  AttnResult g = run_attn(backends().gpu.get(), c, in, DType::kF32);
  AttnResult w = run_attn(backends().cpu.get(), c, in, DType::kF32);
  const Tol t{2e-4, 2e-5};
  EXPECT_TRUE(all_close("out", g.out, w.out, t));
  EXPECT_TRUE(all_close("lse", g.lse, w.lse, t));
  EXPECT_TRUE(all_close("dq", g.dq, w.dq, t));
  EXPECT_TRUE(all_close("dk", g.dk, w.dk, t));
  EXPECT_TRUE(all_close("dv", g.dv, w.dv, t));
  // Work accounting: the same kind of skipping as the CPU (tile sizes differ).
  EXPECT_GT(g.fwd.tiles_total, 0);
  EXPECT_EQ(g.fwd.tiles_skipped > 0, w.fwd.tiles_skipped > 0) << "skipping differs from the CPU";
  const double dense = 4.0 * c.q_len * c.kv_len * c.heads * c.head_dim;
  EXPECT_LE(g.fwd.flops, dense * 1.0000001);
  if (g.fwd.flops > 0) {
    EXPECT_NEAR(g.bwd.flops / g.fwd.flops, 2.5, 1e-9);  // same tiles
  }
}

TEST_P(Attention, Bf16MatchesCpuOnRoundedInputs) {
  REQUIRE_GPU();
  const AttnCase& c = GetParam();
  AttnInputs in = make_attn(c, 11);
  AttnResult g = run_attn(backends().gpu.get(), c, in, DType::kBF16);
  AttnInputs r = in;
  r.q = rounded(in.q);
  r.k = rounded(in.k);
  r.v = rounded(in.v);
  r.dout = rounded(in.dout);
  AttnResult w = run_attn(backends().cpu.get(), c, r, DType::kF32);
  EXPECT_TRUE(all_close("out", g.out, w.out, {2e-2, 1e-2}));
  EXPECT_TRUE(all_close("lse", g.lse, w.lse, {0, 1e-2}));
  EXPECT_TRUE(all_close("dq", g.dq, w.dq, {5e-2, 2e-2}));
  EXPECT_TRUE(all_close("dk", g.dk, w.dk, {5e-2, 2e-2}));
  EXPECT_TRUE(all_close("dv", g.dv, w.dv, {5e-2, 2e-2}));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Attention,
    ::testing::Values(AttnCase{"causal_diag", 200, 200, 4, 4, 64, true, false, false, 0},
                      AttnCase{"gqa_hd128", 130, 130, 8, 2, 128, true, false, false, 0},
                      AttnCase{"docs_zigzag", 256, 256, 4, 2, 64, true, true, true, 0},
                      AttnCase{"earlier_block", 96, 160, 2, 1, 80, true, true, false, 96},
                      AttnCase{"noncausal_hd12", 70, 45, 3, 3, 12, false, false, false, 0},
                      AttnCase{"future_block_empty", 64, 64, 2, 2, 32, true, false, false, -500}),
    [](const ::testing::TestParamInfo<AttnCase>& i) { return std::string(i.param.name); });

TEST(CudaAttention, MergeMatchesCpu) {
  REQUIRE_GPU();
  const int64_t t = 77, h = 3, d = 40;
  Vec oa = randn(t * h * d, 1), ob = randn(t * h * d, 2), la = randn(t * h, 3),
      lb = randn(t * h, 4);
  la[0] = -kInf;
  lb[1] = -kInf;
  la[2] = lb[2] = -kInf;
  auto run = [&](Backend* b, Vec* out, Vec* lse) {
    Dev<float> a(b, oa), bb(b, ob), l1(b, la), l2(b, lb);
    ASSERT_EQ(b->attention_merge(t, h, d, a.get(), l1.get(), bb.get(), l2.get()), Status::kOk);
    *out = a.host();
    *lse = l1.host();
  };
  Vec go, gl, wo, wl;
  run(backends().gpu.get(), &go, &gl);
  run(backends().cpu.get(), &wo, &wl);
  EXPECT_TRUE(all_close("out", go, wo, {1e-5, 1e-6}));
  EXPECT_TRUE(all_close("lse", gl, wl, {1e-6, 1e-6}));
}

TEST(CudaAttention, RejectsBadArguments) {
  REQUIRE_GPU();
  Backend* b = backends().gpu.get();
  AttentionArgs a;
  a.q_len = a.kv_len = 4;
  a.heads = 3;
  a.kv_heads = 2;  // not a divisor
  a.head_dim = 16;
  a.scale = 0.25f;
  Vec out(4 * 3 * 16), lse(12);
  EXPECT_EQ(b->attention_forward(a, out.data(), lse.data(), nullptr), Status::kInvalidArgument);
  EXPECT_NE(b->last_error().find("kv_heads"), std::string::npos) << b->last_error();
  a.kv_heads = 3;
  a.head_dim = 256;
  EXPECT_EQ(b->attention_forward(a, out.data(), lse.data(), nullptr), Status::kUnsupported);
}

// ---- GEMM ------------------------------------------------------------------------------------
TEST(CudaOps, GemmMatchesCpuInEveryLayout) {
  REQUIRE_GPU();
  const int64_t m = 67, n = 45, k = 129;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
      Vec a = randn((ta ? k : m) * lda, 10 + ta), bm = randn((tb ? n : k) * ldb, 20 + tb);
      Vec c0 = randn(m * ldc, 30);
      Vec got, want;
      for (Backend* be : {backends().gpu.get(), backends().cpu.get()}) {
        Dev<float> da(be, a), db(be, bm), dc(be, c0);
        ASSERT_EQ(be->gemm(DType::kF32, ta, tb, m, n, k, 0.7f, da.get(), lda, db.get(), ldb, 0.3f,
                           dc.get(), ldc),
                  Status::kOk)
            << be->last_error();
        (be == backends().cpu.get() ? want : got) = dc.host();
      }
      EXPECT_TRUE(all_close("gemm", got, want, {1e-4, 1e-5})) << "ta " << ta << " tb " << tb;
    }
  }
}

TEST(CudaOps, GemmBf16MatchesCpuOnRoundedInputs) {
  REQUIRE_GPU();
  const int64_t m = 64, n = 96, k = 256;
  Vec a = randn(m * k, 1), bm = randn(k * n, 2);
  Dev<uint16_t> da(backends().gpu.get(), bf16_of(a)), db(backends().gpu.get(), bf16_of(bm));
  Dev<uint16_t> dc(backends().gpu.get(), m * n, 0);
  ASSERT_EQ(backends().gpu->gemm(DType::kBF16, false, false, m, n, k, 1.f, da.get(), k, db.get(), n,
                                 0.f, dc.get(), n),
            Status::kOk)
      << backends().gpu->last_error();
  Vec got;
  for (uint16_t h : dc.host()) got.push_back(from_bf16(h));
  Vec want(m * n);
  Vec ar = rounded(a), br = rounded(bm);
  ASSERT_EQ(backends().cpu->gemm(DType::kF32, false, false, m, n, k, 1.f, ar.data(), k, br.data(),
                                 n, 0.f, want.data(), n),
            Status::kOk);
  EXPECT_TRUE(all_close("gemm bf16", got, want, {1e-2, 1e-2}));
}

// ---- the other ops ---------------------------------------------------------------------------
// Runs f on both backends over device copies of `inputs`; returns each backend's outputs.
template <typename F>
void both(const std::vector<Vec>& inputs, const std::vector<size_t>& out_sizes, F f,
          std::vector<Vec>* got, std::vector<Vec>* want) {
  for (Backend* be : {backends().gpu.get(), backends().cpu.get()}) {
    std::vector<std::unique_ptr<Dev<float>>> in, out;
    std::vector<float*> ip, op;
    for (const Vec& v : inputs) {
      in.push_back(std::make_unique<Dev<float>>(be, v));
      ip.push_back(in.back()->get());
    }
    for (size_t n : out_sizes) {
      out.push_back(std::make_unique<Dev<float>>(be, n, 0.f));
      op.push_back(out.back()->get());
    }
    ASSERT_EQ(f(be, ip, op), Status::kOk) << be->name() << ": " << be->last_error();
    std::vector<Vec>& dst = be == backends().cpu.get() ? *want : *got;
    dst.clear();
    for (auto& o : out) dst.push_back(o->host());
    for (auto& i : in) dst.push_back(i->host());  // in-place ops change inputs
  }
}

constexpr Tol kEw{1e-5, 1e-6};

TEST(CudaOps, RmsNormForwardBackward) {
  REQUIRE_GPU();
  const int64_t n = 37, d = 300;
  std::vector<Vec> g, w;
  both(
      {randn(n * d, 1), randn(d, 2), randn(n * d, 3), randn(d, 4)}, {n * d, n, n * d},
      [&](Backend* b, auto& in, auto& out) {
        Status s = b->rmsnorm_forward(n, d, 1e-5f, in[0], in[1], out[0], out[1]);
        if (s == Status::kOk) {
          s = b->rmsnorm_backward(n, d, in[0], in[1], out[1], in[2], out[2], in[3]);
        }
        return s;
      },
      &g, &w);
  EXPECT_TRUE(all_close("y", g[0], w[0], kEw));
  EXPECT_TRUE(all_close("rstd", g[1], w[1], kEw));
  EXPECT_TRUE(all_close("dx", g[2], w[2], {1e-4, 1e-5}));
  EXPECT_TRUE(all_close("dgain", g[6], w[6], {1e-4, 1e-5}));
}

TEST(CudaOps, RopeForwardAndInverseAtLargePositions) {
  REQUIRE_GPU();
  const int64_t n = 50, h = 3, hd = 64;
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = 999000 + i * 37;
  for (bool inverse : {false, true}) {
    Vec got, want;
    for (Backend* b : {backends().gpu.get(), backends().cpu.get()}) {
      Dev<float> x(b, randn(n * h * hd, 5));
      Dev<int64_t> p(b, pos);
      ASSERT_EQ(b->rope(n, h, hd, 1e6f, p.get(), inverse, x.get()), Status::kOk);
      (b == backends().cpu.get() ? want : got) = x.host();
    }
    EXPECT_TRUE(all_close("rope", got, want, kEw)) << "inverse " << inverse;
  }
}

TEST(CudaOps, RopeScalingMatchesCpu) {
  REQUIRE_GPU();
  const int64_t n = 40, h = 2, hd = 64;
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = i * 1601;
  RopeParams rp;
  rp.theta = 500000.0;
  rp.factor = 8.0;
  rp.original_context = 8192.0;
  for (RopeScaling s : {RopeScaling::kLinear, RopeScaling::kLlama3, RopeScaling::kYarn}) {
    rp.scaling = s;
    for (bool inverse : {false, true}) {
      Vec got, want;
      for (Backend* b : {backends().gpu.get(), backends().cpu.get()}) {
        Dev<float> x(b, randn(n * h * hd, 6));
        Dev<int64_t> p(b, pos);
        ASSERT_EQ(b->rope(n, h, hd, rp, p.get(), inverse, x.get()), Status::kOk);
        (b == backends().cpu.get() ? want : got) = x.host();
      }
      EXPECT_TRUE(all_close("rope", got, want, kEw))
          << "scaling " << static_cast<int>(s) << " inverse " << inverse;
    }
  }
}

TEST(CudaOps, ActivationsForwardBackward) {
  REQUIRE_GPU();
  const int64_t n = 10001;
  std::vector<Vec> g, w;
  both(
      {randn(n, 1, 3.f), randn(n, 2), randn(n, 3)}, {n, n, n, n, n},
      [&](Backend* b, auto& in, auto& out) {
        Status s = b->swiglu_forward(n, in[0], in[1], out[0]);
        if (s == Status::kOk) s = b->swiglu_backward(n, in[0], in[1], in[2], out[1], out[2]);
        if (s == Status::kOk) s = b->gelu_forward(n, in[0], out[3]);
        if (s == Status::kOk) s = b->gelu_backward(n, in[0], in[2], out[4]);
        return s;
      },
      &g, &w);
  const char* names[] = {"swiglu", "dgate", "dup", "gelu", "dgelu"};
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(all_close(names[i], g[i], w[i], kEw));
}

TEST(CudaOps, AdamWAndElementwise) {
  REQUIRE_GPU();
  const int64_t n = 4099;
  Backend::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  std::vector<Vec> g, w;
  Vec vinit = randn(n, 4);
  for (float& x : vinit) x = x * x;
  both(
      {randn(n, 1), randn(n, 2), randn(n, 3), vinit, randn(n, 5)}, {n},
      [&](Backend* b, auto& in, auto& out) {
        Status s = b->adamw_step(n, hp, in[0], in[1], in[2], in[3]);
        if (s == Status::kOk) s = b->axpy(n, -0.5f, in[1], in[4]);
        if (s == Status::kOk) s = b->scale(n, 1.5f, in[4]);
        if (s == Status::kOk) s = b->add(n, in[4], in[1], out[0]);
        return s;
      },
      &g, &w);
  EXPECT_TRUE(all_close("add", g[0], w[0], kEw));
  EXPECT_TRUE(all_close("param", g[1], w[1], kEw));
  EXPECT_TRUE(all_close("m", g[3], w[3], kEw));
  EXPECT_TRUE(all_close("v", g[4], w[4], kEw));
  Dev<float> x(backends().gpu.get(), randn(n, 9));
  double got = 0, want = 0;
  Vec xh = x.host();
  ASSERT_EQ(backends().gpu->sum_squares(n, x.get(), &got), Status::kOk);
  ASSERT_EQ(backends().cpu->sum_squares(n, xh.data(), &want), Status::kOk);
  EXPECT_NEAR(got, want, 1e-9 * want);
  ASSERT_EQ(backends().gpu->fill(n, 2.5f, x.get()), Status::kOk);
  EXPECT_EQ(x.host(), Vec(n, 2.5f));
}

TEST(CudaOps, EmbeddingAndCrossEntropy) {
  REQUIRE_GPU();
  const int64_t n = 33, vocab = 1000, d = 24;
  std::vector<int32_t> ids(n), labels(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>((i * 7919) % vocab);
    labels[i] = i % 5 == 0 ? -1 : static_cast<int32_t>((i * 104729) % vocab);
  }
  Vec table = randn(vocab * d, 1), dout = randn(n * d, 2), logits = randn(n * vocab, 3, 4.f);
  struct Out {
    Vec emb, dtable, dlogits;
    double loss = 0;
    int64_t valid = 0;
  } r[2];
  int idx = 0;
  for (Backend* b : {backends().gpu.get(), backends().cpu.get()}) {
    Dev<int32_t> di(b, ids), dl(b, labels);
    Dev<float> dt(b, table), dd(b, dout), out(b, n * d, 0.f), dtab(b, vocab * d, 0.f),
        lg(b, logits);
    ASSERT_EQ(b->embedding_forward(n, vocab, d, di.get(), dt.get(), out.get()), Status::kOk);
    ASSERT_EQ(b->embedding_backward(n, vocab, d, di.get(), dd.get(), dtab.get()), Status::kOk);
    ASSERT_EQ(b->cross_entropy(n, vocab, lg.get(), dl.get(), 0.01f, &r[idx].loss, &r[idx].valid,
                               lg.get()),  // dlogits aliasing logits, as allowed
              Status::kOk);
    r[idx].emb = out.host();
    r[idx].dtable = dtab.host();
    r[idx].dlogits = lg.host();
    ++idx;
  }
  EXPECT_EQ(r[0].emb, r[1].emb);
  EXPECT_TRUE(all_close("dtable", r[0].dtable, r[1].dtable, kEw));
  EXPECT_TRUE(all_close("dlogits", r[0].dlogits, r[1].dlogits, {1e-4, 1e-6}));
  EXPECT_EQ(r[0].valid, r[1].valid);
  EXPECT_NEAR(r[0].loss, r[1].loss, 1e-6 * r[1].loss);
  // Out-of-range ids and labels: kInvalidArgument with a reason, nothing aborts.
  Backend* g = backends().gpu.get();
  std::vector<int32_t> bad = ids;
  bad[5] = static_cast<int32_t>(vocab);
  Dev<int32_t> db(g, bad);
  Dev<float> dt(g, table), out(g, n * d, 0.f), lg(g, logits);
  EXPECT_EQ(g->embedding_forward(n, vocab, d, db.get(), dt.get(), out.get()),
            Status::kInvalidArgument);
  EXPECT_NE(g->last_error().find("embedding_forward"), std::string::npos) << g->last_error();
  double loss = 0;
  int64_t valid = 0;
  EXPECT_EQ(g->cross_entropy(n, vocab, lg.get(), db.get(), 1.f, &loss, &valid, nullptr),
            Status::kInvalidArgument);
  EXPECT_EQ(g->synchronize(), Status::kOk);  // the device is still healthy
}

// Exact top-k: the same indices and values as the CPU (ties to the lower index, NaN largest).
TEST(CudaOps, TopkMatchesCpuExactly) {
  REQUIRE_GPU();
  struct C {
    int64_t n, k;
    bool ties;
  };
  for (C c : {C{1000, 10, false}, C{1 << 20, 1000, false}, C{5000, 777, true}, C{300, 300, false},
              C{4096, 1, true}}) {
    Vec x = randn(c.n, static_cast<uint64_t>(c.n + c.k));
    if (c.ties) {
      for (int64_t i = 0; i < c.n; ++i) x[i] = static_cast<float>((i * 31) % 17) * (i % 2 ? 1 : -1);
      x[c.n / 2] = std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<uint32_t> gi, wi(c.k);
    Vec gv, wv(c.k);
    {
      Backend* b = backends().gpu.get();
      Dev<float> dx(b, x);
      Dev<uint32_t> di(b, c.k, 0u);
      Dev<float> dv(b, c.k, 0.f);
      ASSERT_EQ(b->topk_abs(c.n, c.k, dx.get(), di.get(), dv.get()), Status::kOk)
          << b->last_error();
      gi = di.host();
      gv = dv.host();
    }
    ASSERT_EQ(backends().cpu->topk_abs(c.n, c.k, x.data(), wi.data(), wv.data()), Status::kOk);
    EXPECT_EQ(gi, wi) << "n " << c.n << " k " << c.k;
    for (int64_t i = 0; i < c.k; ++i) {
      ASSERT_TRUE(gv[i] == wv[i] || (std::isnan(gv[i]) && std::isnan(wv[i]))) << i;
    }
  }
}

// The Backend defaults the CPU backend inherits (no GPU needed).
TEST(BackendDefaults, TopkFeedbackAndOffloadOnHost) {
  Backend* c = backends().cpu.get();
  Vec residual = {0.5f, -3.f, 0.f, 2.f, 1.f}, grad = {0.f, 1.f, 4.f, -0.5f, 0.f};
  std::vector<uint32_t> idx(2);
  Vec val(2);
  ASSERT_EQ(c->topk_feedback(5, 2, residual.data(), grad.data(), idx.data(), val.data()),
            Status::kOk);
  // acc = {0.5, -2, 4, 1.5, 1}: the two largest |acc| are at 1 and 2.
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(val, (Vec{-2.f, 4.f}));
  EXPECT_EQ(residual, (Vec{0.5f, 0.f, 0.f, 1.5f, 1.f}));
  Vec host(5, 0.f);
  EXPECT_EQ(c->pin_host(host.data(), 20), Status::kOk);
  EXPECT_EQ(c->offload_to_host(host.data(), residual.data(), 20), Status::kOk);
  EXPECT_EQ(c->offload_wait(), Status::kOk);
  EXPECT_EQ(host, residual);
  EXPECT_EQ(c->unpin_host(host.data()), Status::kOk);
  EXPECT_EQ(c->last_error(), "");
}

// Error feedback: residual += grad, top-k sent, the rest kept; the same as the host default.
TEST(CudaOps, TopkFeedbackKeepsWhatWasNotSent) {
  REQUIRE_GPU();
  const int64_t n = 100000, k = 300;
  Vec residual = randn(n, 1, 0.1f), grad = randn(n, 2);
  std::vector<uint32_t> wi(k);
  Vec wv(k), wr = residual;
  ASSERT_EQ(backends().cpu->topk_feedback(n, k, wr.data(), grad.data(), wi.data(), wv.data()),
            Status::kOk);
  Backend* b = backends().gpu.get();
  Dev<float> dr(b, residual), dg(b, grad), dv(b, k, 0.f);
  Dev<uint32_t> di(b, k, 0u);
  ASSERT_EQ(b->topk_feedback(n, k, dr.get(), dg.get(), di.get(), dv.get()), Status::kOk)
      << b->last_error();
  EXPECT_EQ(di.host(), wi);
  EXPECT_EQ(dv.host(), wv);
  EXPECT_EQ(dr.host(), wr);  // axpy with alpha 1 is exact-rounded on both sides
  for (int64_t i = 0; i < k; ++i) EXPECT_EQ(wr[wi[i]], 0.f);
}

// ---- offload path ----------------------------------------------------------------------------
TEST(CudaOffload, PinnedShmRoundTripOnOwnStreams) {
  REQUIRE_GPU();
  Backend* b = backends().gpu.get();
  const size_t n = 1 << 20, bytes = n * sizeof(float);
  const std::string name = "/ring-gpu-test-" + std::to_string(getpid());
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  shm_unlink(name.c_str());
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(2 * bytes)), 0);
  void* map = mmap(nullptr, 2 * bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  float* grads_host = static_cast<float*>(map);
  float* params_host = grads_host + n;
  ASSERT_EQ(b->pin_host(map, 2 * bytes), Status::kOk) << b->last_error();
  Vec grads = randn(n, 1), params = randn(n, 2);
  std::copy(params.begin(), params.end(), params_host);
  Dev<float> g(b, grads), p(b, n, 0.f);
  ASSERT_EQ(b->scale(n, 2.f, g.get()), Status::kOk);  // queued compute the D2H must follow
  ASSERT_EQ(b->offload_to_host(grads_host, g.get(), bytes), Status::kOk) << b->last_error();
  ASSERT_EQ(b->offload_to_device(p.get(), params_host, bytes), Status::kOk) << b->last_error();
  ASSERT_EQ(b->scale(n, 3.f, p.get()), Status::kOk);  // must see the copied parameters
  ASSERT_EQ(b->offload_wait(), Status::kOk);
  for (size_t i = 0; i < n; i += 4097) ASSERT_EQ(grads_host[i], 2.f * grads[i]) << i;
  Vec ph = p.host();
  for (size_t i = 0; i < n; i += 4097) ASSERT_EQ(ph[i], 3.f * params[i]) << i;
  EXPECT_EQ(b->unpin_host(map), Status::kOk);
  munmap(map, 2 * bytes);
}

// ---- the model ---------------------------------------------------------------------------------
// The tests' tiny model with an MLP of 96, a vocabulary of 97 and an untied LM head.
model::ModelConfig small_model(spec::MlpKind mlp) {
  return test::tiny_model_config(
      {.mlp_hidden = 96, .vocab = 97, .mlp = mlp, .tie_embeddings = false});
}

struct Tokens {
  std::vector<int32_t> ids, labels, docs;
  std::vector<int64_t> pos;
  int64_t valid = 0;
  model::Batch batch() const {
    return model::Batch{static_cast<int64_t>(ids.size()), ids.data(), labels.data(), pos.data(),
                        docs.data()};
  }
};

Tokens make_tokens(int64_t t, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tokens b;
  for (int64_t i = 0; i < t; ++i) {
    b.ids.push_back(static_cast<int32_t>(rng() % vocab));
    b.docs.push_back(static_cast<int32_t>(i / 90));
    b.pos.push_back(i);
  }
  for (int64_t i = 0; i < t; ++i) {
    const bool last = i + 1 == t || b.docs[i + 1] != b.docs[i];
    b.labels.push_back(last ? -1 : b.ids[i + 1]);
    if (!last) ++b.valid;
  }
  return b;
}

TEST(CudaModel, LossAndGradientsMatchCpu) {
  REQUIRE_GPU();
  for (spec::MlpKind mlp : {spec::MlpKind::kSwiGLU, spec::MlpKind::kGelu}) {
    model::ModelConfig cfg = small_model(mlp);
    Tokens tok = make_tokens(300, cfg.vocab, 3);
    double loss[2];
    Vec grads[2];
    int i = 0;
    std::vector<float> params;
    for (Backend* b : {backends().gpu.get(), backends().cpu.get()}) {
      model::LocalAttention attention(b);
      model::Model m(cfg, b, &attention);
      if (params.empty()) {
        params = m.initial_params(42);
      }
      m.set_params(params);
      m.zero_grads();
      loss[i] = m.forward_backward(tok.batch(), tok.valid).loss;
      grads[i] = m.get_grads();
      ++i;
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-5 * loss[1]);
    EXPECT_TRUE(all_close("grads", grads[0], grads[1], {1e-3, 1e-4}));
  }
}

// 30 AdamW steps on the same batches: the GPU loss curve tracks the CPU one.
TEST(CudaModel, TrainingCurveTracksCpu) {
  REQUIRE_GPU();
  model::ModelConfig cfg = small_model(spec::MlpKind::kSwiGLU);
  std::vector<double> curve[2];
  std::vector<float> init;
  int i = 0;
  for (Backend* b : {backends().gpu.get(), backends().cpu.get()}) {
    model::LocalAttention attention(b);
    model::Model m(cfg, b, &attention);
    if (init.empty()) {
      init = m.initial_params(7);
    }
    m.set_params(init);
    const int64_t np = m.layout().total();
    Dev<float> mom(b, np, 0.f), var(b, np, 0.f);
    for (int step = 1; step <= 30; ++step) {
      Tokens tok = make_tokens(256, cfg.vocab, 100 + step % 4);
      m.zero_grads();
      curve[i].push_back(m.forward_backward(tok.batch(), tok.valid).loss);
      Backend::AdamWParams hp{3e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, step};
      ASSERT_EQ(b->adamw_step(np, hp, m.params(), m.grads(), mom.get(), var.get()), Status::kOk);
    }
    ++i;
  }
  for (size_t s = 0; s < curve[0].size(); ++s) {
    EXPECT_NEAR(curve[0][s], curve[1][s], 2e-3 * curve[1][s]) << "step " << s + 1;
  }
  EXPECT_LT(curve[0].back(), curve[0].front() - 0.1);  // it learns
}

}  // namespace
}  // namespace ring::kernels
