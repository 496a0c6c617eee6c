// Tests of the CPU backend's non-attention ops (kernels/cpu/ops.*) through the Backend
// interface: every op, forward and backward, on every ISA path this CPU has (scalar, AVX2,
// AVX-512; cpu::set_isa switches the path in-process, and one test checks RING_CPU_ISA in a
// child process), against
//   - the scalar reference (kernels/reference/ops_ref.*), with odd sizes (not multiples of any
//     vector width) and sizes large enough to split across threads;
//   - PyTorch 1.13 (tests/kernels/torch_ops.py through /usr/bin/python3, raw arrays exchanged in
//     a temp dir); a missing torch FAILS these tests, it does not skip them;
//   - finite differences of our own forward (rmsnorm, swiglu, gelu, cross-entropy).
// Inputs are random with fixed seeds; expected values are always computed, never written in.
//
// Tolerances (|got - want| <= atol + rtol |want|, per element), stated per op below: fp32 ops
// against fp64 references get a few ulp of relative error plus an atol for values near 0;
// transcendental ops (exp, erfc polynomials) get 1e-5 relative.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"
#include "kernels/reference/ops_ref.h"

extern "C" int openblas_get_num_threads(void);

namespace ring::kernels {
namespace {

using cpu::Isa;
using Vec = std::vector<float>;

constexpr int kThreads = 2;

Vec randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Vec uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Element-wise |got - want| <= atol + rtol |want|; reports the worst element.
::testing::AssertionResult close(const float* got, const float* want, size_t n, double atol,
                                 double rtol) {
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < n; ++i) {
    double g = got[i], w = want[i];
    double err = std::fabs(g - w), lim = atol + rtol * std::fabs(w);
    bool ok = err <= lim || (std::isnan(g) && std::isnan(w)) || (g == w);
    if (!ok) {
      ++bad;
      if (!(err - lim <= worst_excess)) {
        worst_excess = err - lim;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " elements differ; worst at " << worst << ": got " << got[worst]
         << " want " << want[worst] << " (atol " << atol << ", rtol " << rtol << ")";
}
::testing::AssertionResult close(const Vec& got, const Vec& want, double atol, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  return close(got.data(), want.data(), got.size(), atol, rtol);
}

std::unique_ptr<Backend> make_cpu(int threads = kThreads) {
  std::string err;
  auto b = create_backend("cpu", threads, &err);
  EXPECT_NE(b, nullptr) << err;
  return b;
}

// ---- fixture: one instance per ISA ---------------------------------------------------------
class OpsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(GetParam())
                   << " code (the path is compiled, not run here)";
    }
    ASSERT_EQ(cpu::set_isa(GetParam()), Status::kOk);
    ASSERT_EQ(cpu::active_isa(), GetParam());
    be_ = make_cpu();
    ASSERT_NE(be_, nullptr);
  }
  void TearDown() override {
    cpu::set_isa(cpu::best_isa());
    cpu::set_topk_threshold_for_testing(-1);
  }
  std::unique_ptr<Backend> be_;
};

std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) {
  return cpu::isa_name(info.param);
}

// Sizes: odd (no multiple of 8 or 16), tiny, and large enough for several threads.
const int64_t kSizes[] = {1, 7, 13, 31, 1003, 100003};

TEST_P(OpsTest, GemmAllTransposesMatchReference) {
  // Tolerance: fp32 accumulation over k terms vs fp64: atol 1e-4, rtol 1e-4.
  const int64_t m = 37, n = 29, k = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.f, 0.3f}) {
        int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
        Vec a = randn((ta ? k : m) * lda, 1), b = randn((tb ? n : k) * ldb, 2);
        Vec c = randn(m * ldc, 3), c_ref = c;
        ASSERT_EQ(be_->gemm(DType::kF32, ta, tb, m, n, k, 0.7f, a.data(), lda, b.data(), ldb, beta,
                            c.data(), ldc),
                  Status::kOk);
        ref::gemm(ta, tb, m, n, k, 0.7f, a.data(), lda, b.data(), ldb, beta, c_ref.data(), ldc);
        EXPECT_TRUE(close(c, c_ref, 1e-4, 1e-4)) << "ta=" << ta << " tb=" << tb << " beta=" << beta;
      }
    }
  }
}

TEST_P(OpsTest, RmsNormForwardBackwardMatchReference) {
  // Tolerance: y, rstd, dx rtol 2e-5 (fp32 row sums vs fp64), atol 1e-6; dgain sums over rows.
  for (int64_t d : {1, 7, 67, 1000}) {
    for (int64_t n : {1, 37, 301}) {
      Vec x = randn(n * d, 10 + d, 1.5f), gain = randn(d, 11), dy = randn(n * d, 12);
      Vec y(n * d), rstd(n), y_ref(n * d), rstd_ref(n);
      ASSERT_EQ(be_->rmsnorm_forward(n, d, 1e-5f, x.data(), gain.data(), y.data(), rstd.data()),
                Status::kOk);
      ref::rmsnorm_forward(n, d, 1e-5f, x.data(), gain.data(), y_ref.data(), rstd_ref.data());
      EXPECT_TRUE(close(y, y_ref, 1e-6, 2e-5)) << "n=" << n << " d=" << d;
      EXPECT_TRUE(close(rstd, rstd_ref, 1e-6, 2e-5));
      Vec dx(n * d, 99.f), dgain(d, 0.5f), dx_ref(n * d), dgain_ref(d, 0.5f);
      ASSERT_EQ(be_->rmsnorm_backward(n, d, x.data(), gain.data(), rstd.data(), dy.data(),
                                      dx.data(), dgain.data()),
                Status::kOk);
      ref::rmsnorm_backward(n, d, x.data(), gain.data(), rstd.data(), dy.data(), dx_ref.data(),
                            dgain_ref.data());
      EXPECT_TRUE(close(dx, dx_ref, 1e-5, 2e-5)) << "n=" << n << " d=" << d;
      EXPECT_TRUE(close(dgain, dgain_ref, 1e-4, 1e-4)) << "n=" << n << " d=" << d;
    }
  }
}

TEST_P(OpsTest, RopeMatchesReferenceAndInverts) {
  // Tolerance: atol 2e-6 on values ~1 (fp64 angles in both; fp32 rotation here).
  std::mt19937_64 rng(5);
  for (int64_t hd : {2, 6, 18, 64, 130}) {
    const int64_t n = 33, heads = 3;
    std::vector<int64_t> pos(n);
    for (auto& p : pos) p = static_cast<int64_t>(rng() % 2000000);  // up to 2M tokens
    pos[0] = 0;
    Vec x = randn(n * heads * hd, 20 + hd), x_ref = x, orig = x;
    ASSERT_EQ(be_->rope(n, heads, hd, 10000.f, pos.data(), false, x.data()), Status::kOk);
    ref::rope(n, heads, hd, 10000.f, pos.data(), false, x_ref.data());
    EXPECT_TRUE(close(x, x_ref, 2e-6, 1e-5)) << "hd=" << hd;
    ASSERT_EQ(be_->rope(n, heads, hd, 10000.f, pos.data(), true, x.data()), Status::kOk);
    EXPECT_TRUE(close(x, orig, 5e-6, 1e-5)) << "inverse, hd=" << hd;
  }
}

TEST_P(OpsTest, RopeScalingMatchesReferenceAndDefinitions) {
  // Tolerance: atol 2e-6 on values ~1 (as above).
  const int64_t n = 17, heads = 2, hd = 64;
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = i * 4 * 997;  // multiples of 4
  RopeParams none, p;
  none.theta = p.theta = 500000.0;
  p.factor = 4.0;
  p.original_context = 8192.0;
  for (RopeScaling s : {RopeScaling::kLinear, RopeScaling::kLlama3, RopeScaling::kYarn}) {
    p.scaling = s;
    Vec x = randn(n * heads * hd, 40), x_ref = x, orig = x;
    ASSERT_EQ(be_->rope(n, heads, hd, p, pos.data(), false, x.data()), Status::kOk);
    ref::rope(n, heads, hd, p, pos.data(), false, x_ref.data());
    EXPECT_TRUE(close(x, x_ref, 2e-6, 1e-5)) << static_cast<int>(s);
    // The backward is the transpose: forward then backward scales by the factor squared.
    ASSERT_EQ(be_->rope(n, heads, hd, p, pos.data(), true, x.data()), Status::kOk);
    const double m2 = rope_attention_factor(p) * rope_attention_factor(p);
    Vec scaled = orig;
    for (float& v : scaled) v = static_cast<float>(v * m2);
    EXPECT_TRUE(close(x, scaled, 5e-6, 1e-5)) << static_cast<int>(s);
  }
  // linear: position p with factor 4 is position p / 4 without scaling.
  p.scaling = RopeScaling::kLinear;
  std::vector<int64_t> quarter(n);
  for (int64_t i = 0; i < n; ++i) quarter[i] = pos[i] / 4;
  Vec a = randn(n * heads * hd, 41), b = a;
  ASSERT_EQ(be_->rope(n, heads, hd, p, pos.data(), false, a.data()), Status::kOk);
  ASSERT_EQ(be_->rope(n, heads, hd, none, quarter.data(), false, b.data()), Status::kOk);
  EXPECT_TRUE(close(a, b, 2e-6, 1e-5));
  // llama3 keeps the high frequencies (short wavelengths) and divides the low ones; yarn's
  // attention factor is 0.1 ln(factor) + 1.
  p.scaling = RopeScaling::kLlama3;
  EXPECT_EQ(rope_inv_freq(p, 0, hd), rope_inv_freq(none, 0, hd));
  EXPECT_DOUBLE_EQ(rope_inv_freq(p, hd / 2 - 1, hd), rope_inv_freq(none, hd / 2 - 1, hd) / 4.0);
  p.scaling = RopeScaling::kYarn;
  EXPECT_DOUBLE_EQ(rope_attention_factor(p), 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(rope_inv_freq(p, 0, hd), rope_inv_freq(none, 0, hd));
  EXPECT_DOUBLE_EQ(rope_inv_freq(p, hd / 2 - 1, hd), rope_inv_freq(none, hd / 2 - 1, hd) / 4.0);
  // Invalid parameters are refused.
  p.original_context = 0;
  EXPECT_EQ(be_->rope(n, heads, hd, p, pos.data(), false, a.data()), Status::kInvalidArgument);
}

TEST_P(OpsTest, SwiGluForwardBackwardMatchReference) {
  // Tolerance: atol 1e-6, rtol 1e-5 (vector exp ~2 ulp, one division).
  for (int64_t n : kSizes) {
    Vec g = randn(n, 30, 4.f), u = randn(n, 31), dout = randn(n, 32);
    if (n > 10) g[3] = -95.f, g[4] = 95.f, g[5] = 0.f, g[6] = -20.f;  // saturated ranges
    Vec out(n), out_ref(n), dg(n), du(n), dg_ref(n), du_ref(n);
    ASSERT_EQ(be_->swiglu_forward(n, g.data(), u.data(), out.data()), Status::kOk);
    ref::swiglu_forward(n, g.data(), u.data(), out_ref.data());
    EXPECT_TRUE(close(out, out_ref, 1e-6, 1e-5)) << "n=" << n;
    ASSERT_EQ(be_->swiglu_backward(n, g.data(), u.data(), dout.data(), dg.data(), du.data()),
              Status::kOk);
    ref::swiglu_backward(n, g.data(), u.data(), dout.data(), dg_ref.data(), du_ref.data());
    EXPECT_TRUE(close(dg, dg_ref, 1e-6, 1e-5)) << "n=" << n;
    EXPECT_TRUE(close(du, du_ref, 1e-6, 1e-5)) << "n=" << n;
  }
}

TEST_P(OpsTest, GeluForwardBackwardMatchReference) {
  // Tolerance: atol 1e-6, rtol 1e-5 (erfc fit 1.2e-7 relative, exp ~2 ulp).
  for (int64_t n : kSizes) {
    Vec x = randn(n, 40, 3.f), dout = randn(n, 41);
    if (n > 10) x[2] = -12.f, x[3] = 12.f, x[4] = 0.f, x[5] = -5.5f, x[6] = 1e-8f;
    Vec out(n), out_ref(n), dx(n), dx_ref(n);
    ASSERT_EQ(be_->gelu_forward(n, x.data(), out.data()), Status::kOk);
    ref::gelu_forward(n, x.data(), out_ref.data());
    EXPECT_TRUE(close(out, out_ref, 1e-6, 1e-5)) << "n=" << n;
    ASSERT_EQ(be_->gelu_backward(n, x.data(), dout.data(), dx.data()), Status::kOk);
    ref::gelu_backward(n, x.data(), dout.data(), dx_ref.data());
    EXPECT_TRUE(close(dx, dx_ref, 1e-6, 1e-5)) << "n=" << n;
  }
}

TEST_P(OpsTest, EmbeddingForwardBackwardMatchReferenceExactly) {
  // Exact: copies, and fp32 sums in the same (token) order.
  for (int64_t d : {1, 13, 64}) {
    for (int64_t n : {1, 50, 5003}) {
      const int64_t vocab = 17;
      std::mt19937 rng(50 + n);
      std::vector<int32_t> ids(n);
      for (auto& i : ids) i = static_cast<int32_t>(rng() % vocab);
      Vec table = randn(vocab * d, 51), dout = randn(n * d, 52);
      Vec out(n * d), out_ref(n * d);
      ASSERT_EQ(be_->embedding_forward(n, vocab, d, ids.data(), table.data(), out.data()),
                Status::kOk);
      ref::embedding_forward(n, d, ids.data(), table.data(), out_ref.data());
      EXPECT_EQ(out, out_ref);
      Vec dt = randn(vocab * d, 53), dt_ref = dt;
      ASSERT_EQ(be_->embedding_backward(n, vocab, d, ids.data(), dout.data(), dt.data()),
                Status::kOk);
      ref::embedding_backward(n, d, ids.data(), dout.data(), dt_ref.data());
      EXPECT_EQ(dt, dt_ref) << "n=" << n << " d=" << d;
    }
  }
}

TEST_P(OpsTest, CrossEntropyMatchesReferenceAndMayAlias) {
  // Tolerance: loss rtol 1e-5; dlogits atol 1e-6 * grad_scale-free (values <= 1), rtol 1e-5.
  for (int64_t vocab : {1, 5, 257, 1000}) {
    for (int64_t n : {1, 29, 403}) {
      Vec logits = randn(n * vocab, 60 + vocab, 3.f);
      std::mt19937 rng(61);
      std::vector<int32_t> labels(n);
      for (auto& l : labels) l = rng() % 4 == 0 ? -1 : static_cast<int32_t>(rng() % vocab);
      const float scale = 0.37f;
      double loss = -1, loss_ref = -2;
      int64_t valid = -1, valid_ref = -2;
      Vec dl(n * vocab, 7.f), dl_ref(n * vocab);
      ASSERT_EQ(be_->cross_entropy(n, vocab, logits.data(), labels.data(), scale, &loss, &valid,
                                   dl.data()),
                Status::kOk);
      ref::cross_entropy(n, vocab, logits.data(), labels.data(), scale, &loss_ref, &valid_ref,
                         dl_ref.data());
      EXPECT_EQ(valid, valid_ref);
      EXPECT_NEAR(loss, loss_ref, 1e-5 * std::max(1.0, std::fabs(loss_ref)))
          << "n=" << n << " vocab=" << vocab;
      EXPECT_TRUE(close(dl, dl_ref, 1e-6, 1e-5)) << "n=" << n << " vocab=" << vocab;
      // Without dlogits: same loss.
      double loss2 = -1;
      int64_t valid2 = -1;
      ASSERT_EQ(be_->cross_entropy(n, vocab, logits.data(), labels.data(), scale, &loss2, &valid2,
                                   nullptr),
                Status::kOk);
      EXPECT_EQ(loss2, loss);
      // Aliased: dlogits == logits gives the same gradient.
      Vec alias = logits;
      ASSERT_EQ(be_->cross_entropy(n, vocab, alias.data(), labels.data(), scale, &loss2, &valid2,
                                   alias.data()),
                Status::kOk);
      EXPECT_EQ(loss2, loss);
      EXPECT_EQ(alias, dl);
    }
  }
}

TEST_P(OpsTest, AdamWMatchesReference) {
  // Tolerance: p atol 1e-6 rtol 1e-6; m, v rtol 1e-6 (fp32 vs fp64 of the same formula).
  for (int64_t n : kSizes) {
    for (int64_t step : {1, 2, 1000}) {
      Vec p = randn(n, 70), g = randn(n, 71, 0.1f), m = randn(n, 72, 0.01f);
      Vec v = uniform(n, 73, 0.f, 1e-3f);
      Vec p_ref = p, m_ref = m, v_ref = v;
      Backend::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
      ASSERT_EQ(be_->adamw_step(n, hp, p.data(), g.data(), m.data(), v.data()), Status::kOk);
      ref::adamw_step(n, hp, p_ref.data(), g.data(), m_ref.data(), v_ref.data());
      EXPECT_TRUE(close(p, p_ref, 1e-6, 1e-6)) << "n=" << n << " step=" << step;
      EXPECT_TRUE(close(m, m_ref, 1e-9, 1e-6));
      EXPECT_TRUE(close(v, v_ref, 1e-12, 1e-6));
    }
  }
}

// Checks (indices, values) against the reference exactly.
void expect_topk_exact(Backend& be, const Vec& x, int64_t k, const char* what) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint32_t> idx(k, 0xdeadbeef), idx_ref(k);
  Vec val(k), val_ref(k);
  ASSERT_EQ(be.topk_abs(n, k, x.data(), idx.data(), val.data()), Status::kOk) << what;
  ref::topk_abs(n, k, x.data(), idx_ref.data(), val_ref.data());
  EXPECT_EQ(idx, idx_ref) << what << " n=" << n << " k=" << k;
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_TRUE(val[i] == val_ref[i] || (std::isnan(val[i]) && std::isnan(val_ref[i])))
        << what << " value " << i;
  }
}

TEST_P(OpsTest, TopKExactOnEveryPath) {
  // Exact (indices and values) on the direct, sampled and both fallback paths.
  const int64_t big = (1 << 20) + 7;
  Vec x = randn(big, 80);
  expect_topk_exact(*be_, x, 1000, "sampled");
  EXPECT_EQ(cpu::topk_last_path(), cpu::TopkPath::kSampled);
  expect_topk_exact(*be_, x, 1, "sampled k=1");
  expect_topk_exact(*be_, Vec(x.begin(), x.begin() + 1003), 10, "small n");
  EXPECT_EQ(cpu::topk_last_path(), cpu::TopkPath::kExact);
  expect_topk_exact(*be_, x, big / 3, "large k");
  expect_topk_exact(*be_, Vec(x.begin(), x.begin() + 77), 77, "k=n");
  expect_topk_exact(*be_, Vec(x.begin(), x.begin() + 77), 0, "k=0");

  // Ties: few distinct magnitudes with both signs; ties must go to the lower index.
  Vec t(big);
  std::mt19937 rng(81);
  for (auto& v : t) v = static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f;
  expect_topk_exact(*be_, t, 1000, "ties");
  // All zero: the sample says "everything", the candidate pass overflows, the fallback runs.
  expect_topk_exact(*be_, Vec(big, 0.f), 500, "zeros");
  EXPECT_EQ(cpu::topk_last_path(), cpu::TopkPath::kFallbackTooMany);
  // inf, NaN, -0 and denormals rank by magnitude (NaN above inf).
  Vec s = x;
  s[10] = INFINITY, s[20] = -INFINITY, s[30] = NAN, s[40] = -0.f, s[50] = 1e-40f;
  expect_topk_exact(*be_, s, 1000, "specials");

  // Forced thresholds drive the fallbacks on ordinary data.
  cpu::set_topk_threshold_for_testing(std::bit_cast<int32_t>(100.f));  // |x| > 100: none
  expect_topk_exact(*be_, x, 1000, "forced too few");
  EXPECT_EQ(cpu::topk_last_path(), cpu::TopkPath::kFallbackTooFew);
  cpu::set_topk_threshold_for_testing(std::bit_cast<int32_t>(0.01f));  // nearly all
  expect_topk_exact(*be_, x, 1000, "forced too many");
  EXPECT_EQ(cpu::topk_last_path(), cpu::TopkPath::kFallbackTooMany);
  cpu::set_topk_threshold_for_testing(std::bit_cast<int32_t>(2.5f));  // ~1.2% of N(0,1)
  expect_topk_exact(*be_, x, 1000, "forced good");
  EXPECT_EQ(cpu::topk_last_path(), cpu::TopkPath::kSampled);
  cpu::set_topk_threshold_for_testing(-1);
}

TEST_P(OpsTest, ElementwiseMatchReference) {
  // fill/scale/add exact; axpy rtol 1e-7 (one fma vs fp64); sum_squares rtol 1e-12.
  for (int64_t n : kSizes) {
    Vec a = randn(n, 90), b = randn(n, 91);
    Vec f(n), f_ref(n);
    ASSERT_EQ(be_->fill(n, 2.5f, f.data()), Status::kOk);
    ref::fill(n, 2.5f, f_ref.data());
    EXPECT_EQ(f, f_ref);
    Vec s = a, s_ref = a;
    ASSERT_EQ(be_->scale(n, -0.3f, s.data()), Status::kOk);
    ref::scale(n, -0.3f, s_ref.data());
    EXPECT_EQ(s, s_ref);
    Vec y = b, y_ref = b;
    ASSERT_EQ(be_->axpy(n, 0.7f, a.data(), y.data()), Status::kOk);
    ref::axpy(n, 0.7f, a.data(), y_ref.data());
    EXPECT_TRUE(close(y, y_ref, 1e-7, 1e-7));
    Vec o(n), o_ref(n);
    ASSERT_EQ(be_->add(n, a.data(), b.data(), o.data()), Status::kOk);
    ref::add(n, a.data(), b.data(), o_ref.data());
    EXPECT_EQ(o, o_ref);
    double ss = -1;
    ASSERT_EQ(be_->sum_squares(n, a.data(), &ss), Status::kOk);
    double ss_ref = ref::sum_squares(n, a.data());
    EXPECT_NEAR(ss, ss_ref, 1e-12 * ss_ref) << "n=" << n;
  }
}

// ---- finite differences (our forward vs our backward, fp32, central differences) ------------
// L = sum(w * f(x)) accumulated in fp64; dL/dx_i ~ (L(x + h e_i) - L(x - h e_i)) / 2h.
// Tolerance |fd - analytic| <= 2e-3 + 2e-2 |analytic| (fp32 forward noise / h and h^2 terms).
template <class Forward>
double fd_grad(Vec& x, size_t i, float h, Forward&& loss) {
  float orig = x[i];
  x[i] = orig + h;
  double lp = loss();
  x[i] = orig - h;
  double lm = loss();
  x[i] = orig;
  return (lp - lm) / (2.0 * h);
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

TEST_P(OpsTest, RmsNormFiniteDifferences) {
  const int64_t n = 3, d = 9;
  Vec x = randn(n * d, 100), gain = randn(d, 101), w = randn(n * d, 102);
  auto loss = [&] {
    Vec y(n * d), r(n);
    EXPECT_EQ(be_->rmsnorm_forward(n, d, 1e-5f, x.data(), gain.data(), y.data(), r.data()),
              Status::kOk);
    return dot(w, y);
  };
  Vec y(n * d), r(n), dx(n * d), dgain(d, 0.f);
  ASSERT_EQ(be_->rmsnorm_forward(n, d, 1e-5f, x.data(), gain.data(), y.data(), r.data()),
            Status::kOk);
  ASSERT_EQ(be_->rmsnorm_backward(n, d, x.data(), gain.data(), r.data(), w.data(), dx.data(),
                                  dgain.data()),
            Status::kOk);
  for (size_t i = 0; i < x.size(); ++i) {
    double fd = fd_grad(x, i, 1e-2f, loss);
    EXPECT_NEAR(fd, dx[i], 2e-3 + 2e-2 * std::fabs(dx[i])) << "dx " << i;
  }
  for (size_t j = 0; j < gain.size(); ++j) {
    double fd = fd_grad(gain, j, 1e-2f, loss);
    EXPECT_NEAR(fd, dgain[j], 2e-3 + 2e-2 * std::fabs(dgain[j])) << "dgain " << j;
  }
}

TEST_P(OpsTest, SwiGluAndGeluFiniteDifferences) {
  const int64_t n = 37;
  Vec g = randn(n, 110, 3.f), u = randn(n, 111), w = randn(n, 112);
  auto swiglu_loss = [&] {
    Vec o(n);
    EXPECT_EQ(be_->swiglu_forward(n, g.data(), u.data(), o.data()), Status::kOk);
    return dot(w, o);
  };
  Vec dg(n), du(n);
  ASSERT_EQ(be_->swiglu_backward(n, g.data(), u.data(), w.data(), dg.data(), du.data()),
            Status::kOk);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(fd_grad(g, i, 1e-2f, swiglu_loss), dg[i], 2e-3 + 2e-2 * std::fabs(dg[i]));
    EXPECT_NEAR(fd_grad(u, i, 1e-2f, swiglu_loss), du[i], 2e-3 + 2e-2 * std::fabs(du[i]));
  }
  Vec x = g;
  auto gelu_loss = [&] {
    Vec o(n);
    EXPECT_EQ(be_->gelu_forward(n, x.data(), o.data()), Status::kOk);
    return dot(w, o);
  };
  Vec dx(n);
  ASSERT_EQ(be_->gelu_backward(n, x.data(), w.data(), dx.data()), Status::kOk);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(fd_grad(x, i, 1e-2f, gelu_loss), dx[i], 2e-3 + 2e-2 * std::fabs(dx[i]));
  }
}

TEST_P(OpsTest, CrossEntropyFiniteDifferences) {
  const int64_t n = 4, vocab = 11;
  Vec logits = randn(n * vocab, 120, 2.f);
  std::vector<int32_t> labels = {3, -1, 0, 10};
  const float scale = 0.25f;
  auto loss = [&] {
    double l = 0;
    int64_t valid = 0;
    EXPECT_EQ(
        be_->cross_entropy(n, vocab, logits.data(), labels.data(), scale, &l, &valid, nullptr),
        Status::kOk);
    return l * scale;
  };
  Vec dl(n * vocab);
  double l = 0;
  int64_t valid = 0;
  ASSERT_EQ(
      be_->cross_entropy(n, vocab, logits.data(), labels.data(), scale, &l, &valid, dl.data()),
      Status::kOk);
  EXPECT_EQ(valid, 3);
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(fd_grad(logits, i, 1e-2f, loss), dl[i], 1e-3 + 2e-2 * std::fabs(dl[i])) << i;
  }
}

// ---- PyTorch 1.13 ----------------------------------------------------------------------------
// Inputs are written once; torch_ops.py runs once; each ISA instance compares against it.
struct TorchRun {
  bool ok = false;
  std::string message;
  std::map<std::string, double> params;
  std::map<std::string, Vec> f32;
  std::map<std::string, std::vector<int32_t>> i32;
  std::map<std::string, std::vector<int64_t>> i64;
  std::map<std::string, Vec> out;
  std::map<std::string, std::vector<double>> out64;
};

template <class T>
void write_raw(const std::filesystem::path& p, const std::vector<T>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
}

template <class T>
bool read_raw(const std::filesystem::path& p, std::vector<T>* v) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) return false;
  size_t bytes = static_cast<size_t>(f.tellg());
  v->resize(bytes / sizeof(T));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v->data()), static_cast<std::streamsize>(bytes));
  return static_cast<bool>(f);
}

TorchRun run_torch() {
  TorchRun r;
  auto& P = r.params;
  P = {{"rms_n", 37},     {"rms_d", 67},           {"rms_eps", 1e-5},  {"act_n", 1001},
       {"ce_n", 29},      {"ce_vocab", 257},       {"ce_scale", 0.05}, {"emb_n", 50},
       {"emb_vocab", 17}, {"emb_d", 13},           {"rope_n", 33},     {"rope_heads", 3},
       {"rope_hd", 18},   {"rope_theta", 10000.0}, {"adam_n", 1003},   {"adam_lr", 1e-3},
       {"adam_b1", 0.9},  {"adam_b2", 0.95},       {"adam_eps", 1e-8}, {"adam_wd", 0.1},
       {"adam_step", 3}};
  // RoPE scaling: a Llama-3-like base and original context, positions up to 64k.
  P.insert({{"rs_n", 29},
            {"rs_heads", 2},
            {"rs_hd", 64},
            {"rs_theta", 500000.0},
            {"rs_factor", 8.0},
            {"rs_orig", 8192},
            {"rs_low", 1.0},
            {"rs_high", 4.0},
            {"rs_beta_fast", 32.0},
            {"rs_beta_slow", 1.0}});
  auto I = [&](const char* k) { return static_cast<int64_t>(P[k]); };
  r.f32["rms_x"] = randn(I("rms_n") * I("rms_d"), 200, 2.f);
  r.f32["rms_gain"] = randn(I("rms_d"), 201);
  r.f32["rms_dy"] = randn(I("rms_n") * I("rms_d"), 202);
  r.f32["act_x"] = randn(I("act_n"), 203, 4.f);
  r.f32["act_up"] = randn(I("act_n"), 204);
  r.f32["act_dout"] = randn(I("act_n"), 205);
  r.f32["ce_logits"] = randn(I("ce_n") * I("ce_vocab"), 206, 3.f);
  std::mt19937 rng(207);
  auto& labels = r.i32["ce_labels"];
  for (int64_t i = 0; i < I("ce_n"); ++i) {
    labels.push_back(i % 5 == 2 ? -1 : static_cast<int32_t>(rng() % I("ce_vocab")));
  }
  r.f32["emb_table"] = randn(I("emb_vocab") * I("emb_d"), 208);
  r.f32["emb_dout"] = randn(I("emb_n") * I("emb_d"), 209);
  auto& ids = r.i32["emb_ids"];
  for (int64_t i = 0; i < I("emb_n"); ++i)
    ids.push_back(static_cast<int32_t>(rng() % I("emb_vocab")));
  r.f32["rope_x"] = randn(I("rope_n") * I("rope_heads") * I("rope_hd"), 210);
  auto& pos = r.i64["rope_pos"];
  for (int64_t i = 0; i < I("rope_n"); ++i) pos.push_back(static_cast<int64_t>(rng() % 1000000));
  r.f32["rs_x"] = randn(I("rs_n") * I("rs_heads") * I("rs_hd"), 215);
  r.f32["rs_dout"] = randn(I("rs_n") * I("rs_heads") * I("rs_hd"), 216);
  auto& rs_pos = r.i64["rs_pos"];
  for (int64_t i = 0; i < I("rs_n"); ++i) rs_pos.push_back(static_cast<int64_t>(rng() % 65536));
  r.f32["adam_p"] = randn(I("adam_n"), 211);
  r.f32["adam_g"] = randn(I("adam_n"), 212, 0.1f);
  r.f32["adam_m"] = randn(I("adam_n"), 213, 0.01f);
  r.f32["adam_v"] = uniform(I("adam_n"), 214, 0.f, 1e-3f);

  char tmpl[] = "/tmp/ring_ops_torch_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    r.message = "mkdtemp failed";
    return r;
  }
  std::filesystem::path dir(tmpl);
  {
    std::ofstream pf(dir / "params.txt");
    pf.precision(17);
    for (auto& [k, v] : P) {
      if (v == std::floor(v) && std::fabs(v) < 1e9) {
        pf << k << " " << static_cast<int64_t>(v) << "\n";
      } else {
        pf << k << " " << std::scientific << v << std::defaultfloat << "\n";
      }
    }
  }
  for (auto& [k, v] : r.f32) write_raw(dir / (k + ".f32"), v);
  for (auto& [k, v] : r.i32) write_raw(dir / (k + ".i32"), v);
  for (auto& [k, v] : r.i64) write_raw(dir / (k + ".i64"), v);

  std::string cmd = std::string("/usr/bin/python3 ") + RING_SOURCE_DIR +
                    "/tests/kernels/torch_ops.py " + dir.string() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string output;
  if (pipe) {
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, got);
  }
  int rc = pipe ? pclose(pipe) : -1;
  if (rc != 0) {
    r.message = "torch_ops.py failed (exit " +
                std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : rc) + "): " + output;
  } else {
    for (auto& e : std::filesystem::directory_iterator(dir)) {
      std::string name = e.path().filename().string();
      if (name.rfind("out_", 0) != 0) continue;
      std::string key = e.path().stem().string().substr(4);
      if (e.path().extension() == ".f32") read_raw(e.path(), &r.out[key]);
      if (e.path().extension() == ".f64") read_raw(e.path(), &r.out64[key]);
    }
    r.ok = true;
  }
  std::filesystem::remove_all(dir);
  return r;
}

const TorchRun& torch_run() {
  static const TorchRun r = run_torch();
  return r;
}

class TorchOpsTest : public OpsTest {};

#define REQUIRE_TORCH()                                             \
  const TorchRun& T = torch_run();                                  \
  ASSERT_TRUE(T.ok) << "PyTorch oracle unavailable: " << T.message; \
  auto I = [&](const char* k) { return static_cast<int64_t>(T.params.at(k)); }

// Looks up a torch output, failing the test (not crashing) when it is missing.
#define TORCH_OUT(name)                                                  \
  ([&]() -> const Vec& {                                                 \
    static const Vec empty;                                              \
    auto it = T.out.find(name);                                          \
    EXPECT_NE(it, T.out.end()) << "torch output " << name << " missing"; \
    return it == T.out.end() ? empty : it->second;                       \
  }())

void torch_rmsnorm(Backend* be_) {
  // Tolerance vs torch (fp32 both): y, rstd rtol 1e-5 atol 1e-6; dx, dgain rtol 1e-4 atol 1e-5.
  REQUIRE_TORCH();
  int64_t n = I("rms_n"), d = I("rms_d");
  const Vec &x = T.f32.at("rms_x"), &gain = T.f32.at("rms_gain"), &dy = T.f32.at("rms_dy");
  Vec y(n * d), rstd(n), dx(n * d), dgain(d, 0.f);
  ASSERT_EQ(be_->rmsnorm_forward(n, d, static_cast<float>(T.params.at("rms_eps")), x.data(),
                                 gain.data(), y.data(), rstd.data()),
            Status::kOk);
  ASSERT_EQ(be_->rmsnorm_backward(n, d, x.data(), gain.data(), rstd.data(), dy.data(), dx.data(),
                                  dgain.data()),
            Status::kOk);
  EXPECT_TRUE(close(y, TORCH_OUT("rms_y"), 1e-6, 1e-5));
  EXPECT_TRUE(close(rstd, TORCH_OUT("rms_rstd"), 1e-6, 1e-5));
  EXPECT_TRUE(close(dx, TORCH_OUT("rms_dx"), 1e-5, 1e-4));
  EXPECT_TRUE(close(dgain, TORCH_OUT("rms_dgain"), 1e-5, 1e-4));
}

void torch_gelu_swiglu(Backend* be_) {
  // Tolerance vs torch: rtol 1e-5, atol 1e-6 (torch uses libm erf/exp; we use polynomials).
  REQUIRE_TORCH();
  int64_t n = I("act_n");
  const Vec &x = T.f32.at("act_x"), &up = T.f32.at("act_up"), &dout = T.f32.at("act_dout");
  Vec out(n), dx(n), dup(n);
  ASSERT_EQ(be_->gelu_forward(n, x.data(), out.data()), Status::kOk);
  EXPECT_TRUE(close(out, TORCH_OUT("gelu_out"), 1e-6, 1e-5));
  ASSERT_EQ(be_->gelu_backward(n, x.data(), dout.data(), dx.data()), Status::kOk);
  EXPECT_TRUE(close(dx, TORCH_OUT("gelu_dx"), 1e-6, 1e-5));
  ASSERT_EQ(be_->swiglu_forward(n, x.data(), up.data(), out.data()), Status::kOk);
  EXPECT_TRUE(close(out, TORCH_OUT("swiglu_out"), 1e-6, 1e-5));
  ASSERT_EQ(be_->swiglu_backward(n, x.data(), up.data(), dout.data(), dx.data(), dup.data()),
            Status::kOk);
  EXPECT_TRUE(close(dx, TORCH_OUT("swiglu_dgate"), 1e-6, 1e-5));
  EXPECT_TRUE(close(dup, TORCH_OUT("swiglu_dup"), 1e-6, 1e-5));
}

void torch_cross_entropy(Backend* be_) {
  // Tolerance vs torch: loss rtol 1e-5; dlogits atol 1e-7 (grad_scale 0.05), rtol 1e-4.
  REQUIRE_TORCH();
  int64_t n = I("ce_n"), vocab = I("ce_vocab");
  float scale = static_cast<float>(T.params.at("ce_scale"));
  const Vec& logits = T.f32.at("ce_logits");
  Vec dl(n * vocab);
  double loss = 0;
  int64_t valid = 0;
  ASSERT_EQ(be_->cross_entropy(n, vocab, logits.data(), T.i32.at("ce_labels").data(), scale, &loss,
                               &valid, dl.data()),
            Status::kOk);
  ASSERT_TRUE(T.out64.count("ce_loss"));
  double want = T.out64.at("ce_loss").at(0);
  EXPECT_NEAR(loss, want, 1e-5 * std::fabs(want));
  EXPECT_EQ(valid, n - (n + 2) / 5);  // every 5th row (i % 5 == 2) is ignored
  EXPECT_TRUE(close(dl, TORCH_OUT("ce_dlogits"), 1e-7, 1e-4));
}

void torch_embedding(Backend* be_) {
  // Exact vs torch: copies and fp32 sums (torch's index_add order may differ: rtol 1e-6).
  REQUIRE_TORCH();
  int64_t n = I("emb_n"), vocab = I("emb_vocab"), d = I("emb_d");
  const auto& ids = T.i32.at("emb_ids");
  Vec out(n * d), dt(vocab * d, 0.f);
  ASSERT_EQ(
      be_->embedding_forward(n, vocab, d, ids.data(), T.f32.at("emb_table").data(), out.data()),
      Status::kOk);
  EXPECT_EQ(out, TORCH_OUT("emb_out"));
  ASSERT_EQ(
      be_->embedding_backward(n, vocab, d, ids.data(), T.f32.at("emb_dout").data(), dt.data()),
      Status::kOk);
  EXPECT_TRUE(close(dt, TORCH_OUT("emb_dtable"), 1e-6, 1e-6));
}

void torch_rope(Backend* be_) {
  // Tolerance vs torch (same fp64 angles, fp32 rotation): atol 2e-6, rtol 1e-5.
  REQUIRE_TORCH();
  int64_t n = I("rope_n"), heads = I("rope_heads"), hd = I("rope_hd");
  Vec x = T.f32.at("rope_x");
  ASSERT_EQ(be_->rope(n, heads, hd, static_cast<float>(T.params.at("rope_theta")),
                      T.i64.at("rope_pos").data(), false, x.data()),
            Status::kOk);
  EXPECT_TRUE(close(x, TORCH_OUT("rope_out"), 2e-6, 1e-5));
}

// Largest |got - want| and largest |got - want| / |want| (over |want| > 1e-3), for the log.
std::pair<double, double> worst_error(const Vec& got, const Vec& want) {
  double abs = 0, rel = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    abs = std::max(abs, d);
    if (std::fabs(want[i]) > 1e-3) rel = std::max(rel, d / std::fabs(want[i]));
  }
  return {abs, rel};
}

void torch_rope_scaling(Backend* be_) {
  // Tolerance vs the transformers formulas in fp64 (torch_ops.py): 1e-6 relative (values ~1,
  // atol 1e-6): fp64 frequencies and angles in both, fp32 rotation here. Forward, and the
  // backward (inverse = true: the transpose, times the attention factor) vs autograd.
  REQUIRE_TORCH();
  const int64_t n = I("rs_n"), heads = I("rs_heads"), hd = I("rs_hd");
  RopeParams p;
  p.theta = T.params.at("rs_theta");
  p.factor = T.params.at("rs_factor");
  p.original_context = T.params.at("rs_orig");
  p.low_freq_factor = T.params.at("rs_low");
  p.high_freq_factor = T.params.at("rs_high");
  p.beta_fast = T.params.at("rs_beta_fast");
  p.beta_slow = T.params.at("rs_beta_slow");
  for (auto [type, name] :
       {std::pair{RopeScaling::kLinear, "linear"}, std::pair{RopeScaling::kLlama3, "llama3"},
        std::pair{RopeScaling::kYarn, "yarn"}}) {
    SCOPED_TRACE(name);
    p.scaling = type;
    Vec x = T.f32.at("rs_x"), dx = T.f32.at("rs_dout"), x_ref = x;
    const std::string key = std::string("rs_") + name;
    ASSERT_EQ(be_->rope(n, heads, hd, p, T.i64.at("rs_pos").data(), false, x.data()), Status::kOk);
    EXPECT_TRUE(close(x, TORCH_OUT(key + "_out"), 1e-6, 1e-6));
    ASSERT_EQ(be_->rope(n, heads, hd, p, T.i64.at("rs_pos").data(), true, dx.data()), Status::kOk);
    EXPECT_TRUE(close(dx, TORCH_OUT(key + "_dx"), 1e-6, 1e-6));
    const auto [fa, fr] = worst_error(x, TORCH_OUT(key + "_out"));
    const auto [ba, br] = worst_error(dx, TORCH_OUT(key + "_dx"));
    std::printf(
        "[ rope_scaling ] %s vs torch: forward max abs %.2e rel %.2e; backward max abs "
        "%.2e rel %.2e\n",
        name, fa, fr, ba, br);
    // The reference implementation (the model tests' oracle) agrees too.
    ref::rope(n, heads, hd, p, T.i64.at("rs_pos").data(), false, x_ref.data());
    EXPECT_TRUE(close(x_ref, TORCH_OUT(key + "_out"), 1e-6, 1e-6));
  }
}

void torch_adamw(Backend* be_) {
  // Tolerance vs torch.optim.AdamW (fp32, different operation order): p atol 1e-6 rtol 1e-6;
  // m, v rtol 1e-6 plus an atol of a few ulp of (1 - beta) g: torch updates m with
  // lerp(m, g, 1 - beta1), whose rounding is relative to g, not to m.
  REQUIRE_TORCH();
  int64_t n = I("adam_n");
  Vec p = T.f32.at("adam_p"), m = T.f32.at("adam_m"), v = T.f32.at("adam_v");
  Backend::AdamWParams hp{
      static_cast<float>(T.params.at("adam_lr")), static_cast<float>(T.params.at("adam_b1")),
      static_cast<float>(T.params.at("adam_b2")), static_cast<float>(T.params.at("adam_eps")),
      static_cast<float>(T.params.at("adam_wd")), I("adam_step")};
  ASSERT_EQ(be_->adamw_step(n, hp, p.data(), T.f32.at("adam_g").data(), m.data(), v.data()),
            Status::kOk);
  EXPECT_TRUE(close(p, TORCH_OUT("adam_p"), 1e-6, 1e-6));
  EXPECT_TRUE(close(m, TORCH_OUT("adam_m"), 3e-8, 1e-6));
  EXPECT_TRUE(close(v, TORCH_OUT("adam_v"), 1e-11, 1e-6));
}

// One test per ISA (one python run per test process under ctest), each op traced by name.
TEST_P(TorchOpsTest, AllOpsMatchTorch) {
  {
    SCOPED_TRACE("rmsnorm");
    torch_rmsnorm(be_.get());
  }
  {
    SCOPED_TRACE("gelu_swiglu");
    torch_gelu_swiglu(be_.get());
  }
  {
    SCOPED_TRACE("cross_entropy");
    torch_cross_entropy(be_.get());
  }
  {
    SCOPED_TRACE("embedding");
    torch_embedding(be_.get());
  }
  {
    SCOPED_TRACE("rope");
    torch_rope(be_.get());
  }
  {
    SCOPED_TRACE("rope_scaling");
    torch_rope_scaling(be_.get());
  }
  {
    SCOPED_TRACE("adamw");
    torch_adamw(be_.get());
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, OpsTest, ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         isa_param_name);
INSTANTIATE_TEST_SUITE_P(Isa, TorchOpsTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512), isa_param_name);

// ---- argument validation: kInvalidArgument / kUnsupported, never a crash ---------------------
TEST(OpsValidation, BadArgumentsAreRejected) {
  auto be = make_cpu();
  ASSERT_NE(be, nullptr);
  Vec a(64, 1.f), b(64, 1.f), c(64, 0.f);
  std::vector<int32_t> ids = {0, 1, 5};
  std::vector<uint32_t> idx(64);
  const auto kInv = Status::kInvalidArgument;
  // gemm
  EXPECT_EQ(be->gemm(DType::kF32, false, false, -1, 2, 2, 1.f, a.data(), 2, b.data(), 2, 0.f,
                     c.data(), 2),
            kInv);
  EXPECT_EQ(
      be->gemm(DType::kF32, false, false, 2, 2, 2, 1.f, nullptr, 2, b.data(), 2, 0.f, c.data(), 2),
      kInv);
  EXPECT_EQ(
      be->gemm(DType::kF32, false, false, 2, 4, 3, 1.f, a.data(), 2, b.data(), 4, 0.f, c.data(), 4),
      kInv);  // lda < k
  EXPECT_EQ(be->gemm(static_cast<DType>(7), false, false, 2, 2, 2, 1.f, a.data(), 2, b.data(), 2,
                     0.f, c.data(), 2),
            kInv);  // bf16 runs (tests/kernels/bf16_gemm_test.cc); an unknown dtype does not
  // norms, rope, activations
  EXPECT_EQ(be->rmsnorm_forward(-1, 4, 1e-5f, a.data(), b.data(), c.data(), c.data()), kInv);
  EXPECT_EQ(be->rmsnorm_forward(2, 0, 1e-5f, a.data(), b.data(), c.data(), c.data()), kInv);
  EXPECT_EQ(be->rmsnorm_forward(2, 4, 1e-5f, a.data(), nullptr, c.data(), c.data()), kInv);
  EXPECT_EQ(be->rmsnorm_backward(2, 4, a.data(), b.data(), a.data(), a.data(), nullptr, c.data()),
            kInv);
  std::vector<int64_t> pos = {0, 1};
  EXPECT_EQ(be->rope(2, 1, 5, 1e4f, pos.data(), false, a.data()), kInv);  // odd head_dim
  EXPECT_EQ(be->rope(2, 1, 4, 1e4f, nullptr, false, a.data()), kInv);
  EXPECT_EQ(be->rope(2, 1, 4, -1.f, pos.data(), false, a.data()), kInv);
  EXPECT_EQ(be->swiglu_forward(-3, a.data(), b.data(), c.data()), kInv);
  EXPECT_EQ(be->swiglu_backward(4, a.data(), b.data(), nullptr, c.data(), c.data()), kInv);
  EXPECT_EQ(be->gelu_forward(4, nullptr, c.data()), kInv);
  EXPECT_EQ(be->gelu_backward(-1, a.data(), b.data(), c.data()), kInv);
  // embedding: id 5 out of range for vocab 4; negative id
  EXPECT_EQ(be->embedding_forward(3, 4, 2, ids.data(), a.data(), c.data()), kInv);
  EXPECT_EQ(be->embedding_backward(3, 4, 2, ids.data(), a.data(), c.data()), kInv);
  std::vector<int32_t> neg = {0, -1};
  EXPECT_EQ(be->embedding_forward(2, 4, 2, neg.data(), a.data(), c.data()), kInv);
  EXPECT_EQ(be->embedding_forward(2, 4, 2, nullptr, a.data(), c.data()), kInv);
  // cross-entropy: label out of range, -2, null outputs
  double loss;
  int64_t valid;
  std::vector<int32_t> labels = {0, 7};
  EXPECT_EQ(be->cross_entropy(2, 4, a.data(), labels.data(), 1.f, &loss, &valid, nullptr), kInv);
  labels = {0, -2};
  EXPECT_EQ(be->cross_entropy(2, 4, a.data(), labels.data(), 1.f, &loss, &valid, nullptr), kInv);
  labels = {0, 1};
  EXPECT_EQ(be->cross_entropy(2, 4, a.data(), labels.data(), 1.f, nullptr, &valid, nullptr), kInv);
  EXPECT_EQ(be->cross_entropy(2, 0, a.data(), labels.data(), 1.f, &loss, &valid, nullptr), kInv);
  // adamw: step 0, beta 1, null
  Backend::AdamWParams hp{1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, 0};
  EXPECT_EQ(be->adamw_step(4, hp, a.data(), b.data(), c.data(), c.data()), kInv);
  hp.step = 1;
  hp.beta2 = 1.f;
  EXPECT_EQ(be->adamw_step(4, hp, a.data(), b.data(), c.data(), c.data()), kInv);
  hp.beta2 = 0.999f;
  EXPECT_EQ(be->adamw_step(4, hp, a.data(), nullptr, c.data(), c.data()), kInv);
  EXPECT_EQ(be->adamw_step(-4, hp, a.data(), b.data(), c.data(), c.data()), kInv);
  // top-k: k > n, negative, null
  EXPECT_EQ(be->topk_abs(4, 5, a.data(), idx.data(), c.data()), kInv);
  EXPECT_EQ(be->topk_abs(4, -1, a.data(), idx.data(), c.data()), kInv);
  EXPECT_EQ(be->topk_abs(4, 2, a.data(), nullptr, c.data()), kInv);
  EXPECT_EQ(be->topk_abs(4, 2, nullptr, idx.data(), c.data()), kInv);
  // elementwise
  EXPECT_EQ(be->fill(-1, 0.f, c.data()), kInv);
  EXPECT_EQ(be->scale(3, 2.f, nullptr), kInv);
  EXPECT_EQ(be->axpy(3, 2.f, nullptr, c.data()), kInv);
  EXPECT_EQ(be->add(3, a.data(), nullptr, c.data()), kInv);
  EXPECT_EQ(be->sum_squares(3, a.data(), nullptr), kInv);
  // zero sizes are fine with null pointers
  EXPECT_EQ(be->fill(0, 0.f, nullptr), Status::kOk);
  EXPECT_EQ(be->topk_abs(0, 0, nullptr, nullptr, nullptr), Status::kOk);
  EXPECT_EQ(
      be->gemm(DType::kF32, false, false, 0, 0, 0, 1.f, nullptr, 1, nullptr, 1, 0.f, nullptr, 1),
      Status::kOk);
}

TEST(Gemm, OpenBlasThreadsFollowTheBackend) {
  // Through the OpenBLAS provider whatever RING_GEMM says (gemm_test covers both providers).
  const cpu::GemmProvider before = cpu::active_gemm_provider();
  ASSERT_EQ(cpu::set_gemm_provider(cpu::GemmProvider::kOpenBlas), Status::kOk);
  const int64_t m = 257, n = 263, k = 129;  // large enough for OpenBLAS to use its threads
  Vec a = randn(m * k, 130), b = randn(k * n, 131), c(m * n), c_ref(m * n);
  ref::gemm(false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, c_ref.data(), n);
  for (int threads : {1, 2, 1}) {
    auto be = make_cpu(threads);
    ASSERT_EQ(be->gemm(DType::kF32, false, false, m, n, k, 1.f, a.data(), k, b.data(), n, 0.f,
                       c.data(), n),
              Status::kOk);
    EXPECT_EQ(openblas_get_num_threads(), threads);
    EXPECT_TRUE(close(c, c_ref, 1e-4, 1e-4)) << "threads=" << threads;
  }
  ASSERT_EQ(cpu::set_gemm_provider(before), Status::kOk);
}

TEST(OpsValidation, GemmWithZeroKScalesC) {
  auto be = make_cpu();
  Vec c = {1.f, 2.f, 3.f, 4.f};
  ASSERT_EQ(
      be->gemm(DType::kF32, false, false, 2, 2, 0, 1.f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2),
      Status::kOk);
  EXPECT_EQ(c, (Vec{0.5f, 1.f, 1.5f, 2.f}));
}

// ---- registry, memory, ISA selection -------------------------------------------------------
TEST(Registry, CpuIsAvailableAndCudaIsAClearError) {
  auto names = available_backends();
  ASSERT_FALSE(names.empty());
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
  // "cuda" is listed (first) when the build has the CUDA backend; creating it then either works
  // (a GPU is present) or fails with the reason (tests/gpu covers it).
  const bool cuda_built = std::find(names.begin(), names.end(), "cuda") != names.end();
  if (cuda_built) {
    EXPECT_EQ(names.front(), "cuda");
  }
  std::string err;
  auto cpu = create_backend("cpu", 0, &err);
  ASSERT_NE(cpu, nullptr) << err;
  EXPECT_STREQ(cpu->name(), "cpu");
  EXPECT_TRUE(cpu->supports(Op::kAdamW, DType::kF32));
  EXPECT_TRUE(cpu->supports(Op::kGemm, DType::kBF16));  // bf16 GEMM (kernels/cpu/gemm.h)
  EXPECT_FALSE(cpu->supports(Op::kAdamW, DType::kBF16));
  EXPECT_EQ(cpu->synchronize(), Status::kOk);
  for (const char* name : {"cuda", "tpu", ""}) {
    if (cuda_built && std::string(name) == "cuda") continue;
    err.clear();
    EXPECT_EQ(create_backend(name, 1, &err), nullptr) << name;
    EXPECT_NE(err.find(cuda_built ? "available: cuda, cpu" : "available: cpu"), std::string::npos)
        << err;
    EXPECT_NE(err.find(std::string("'") + name + "'"), std::string::npos) << err;
  }
  EXPECT_EQ(create_backend("cpu", -1, &err), nullptr);
  EXPECT_EQ(create_backend("nope", 1, nullptr), nullptr);  // null error pointer is fine
}

TEST(Registry, StatusAndDtypeHelpers) {
  EXPECT_STREQ(status_string(Status::kOk), "ok");
  EXPECT_STREQ(status_string(Status::kInvalidArgument), "invalid argument");
  EXPECT_STREQ(status_string(Status::kUnsupported), "unsupported");
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

TEST(CpuMemory, AllocIsAlignedAndCopiesRoundTrip) {
  auto be = make_cpu();
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4096}, size_t{1} << 20}) {
    void* p = nullptr;
    ASSERT_EQ(be->alloc(bytes, &p), Status::kOk);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    std::vector<char> src(bytes), dst(bytes);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<char>(i * 7);
    ASSERT_EQ(be->copy_to_device(p, src.data(), bytes), Status::kOk);
    ASSERT_EQ(be->copy_to_host(dst.data(), p, bytes), Status::kOk);
    EXPECT_EQ(src, dst);
    EXPECT_EQ(be->free(p), Status::kOk);
  }
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(be->alloc(0, &p), Status::kOk);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(be->alloc(16, nullptr), Status::kInvalidArgument);
  EXPECT_EQ(be->alloc(SIZE_MAX - 8, &p), Status::kOutOfMemory);
}

TEST(IsaSelection, ResolveHonoursKnownNamesAndWarnsOtherwise) {
  std::string w;
  EXPECT_EQ(cpu::resolve_isa("scalar", &w), Isa::kScalar);
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(cpu::resolve_isa("", &w), cpu::best_isa());
  EXPECT_EQ(cpu::resolve_isa("auto", &w), cpu::best_isa());
  EXPECT_TRUE(w.empty());
  w.clear();
  EXPECT_EQ(cpu::resolve_isa("avx9000", &w), cpu::best_isa());
  EXPECT_NE(w.find("unknown"), std::string::npos);
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    w.clear();
    Isa got = cpu::resolve_isa(cpu::isa_name(isa), &w);
    if (cpu::isa_supported(isa)) {
      EXPECT_EQ(got, isa);
      EXPECT_TRUE(w.empty());
    } else {
      EXPECT_EQ(got, cpu::best_isa());
      EXPECT_NE(w.find("lacks"), std::string::npos) << w;
      EXPECT_EQ(cpu::set_isa(isa), Status::kUnsupported);
    }
  }
}

TEST(IsaSelection, EnvironmentOverrideIsHonouredAtStartup) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!cpu::isa_supported(isa)) continue;
    // tests/kernels/print_isa.cc: the choice made at start-up of a fresh process.
    std::string cmd = std::string("RING_CPU_ISA=") + cpu::isa_name(isa) + " " + RING_PRINT_ISA +
                      " 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, got);
    EXPECT_EQ(pclose(pipe), 0) << out;
    EXPECT_NE(out.find(std::string("ACTIVE_ISA=") + cpu::isa_name(isa) + "\n"), std::string::npos)
        << out;
  }
}

}  // namespace
}  // namespace ring::kernels
