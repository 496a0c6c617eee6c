// The CPU GEMM providers (kernels/cpu/gemm.h): every built provider against a float64 reference
// (all transposes, odd shapes, padded leading dimensions, alpha/beta, 1-3 threads), run-to-run
// determinism, the thread settings each provider leaves behind, and the automatic choice.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"

extern "C" int openblas_get_num_threads(void);

namespace ring::kernels {
namespace {

using cpu::GemmProvider;
using Vec = std::vector<float>;

Vec randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Shape {
  bool ta, tb;
  int64_t m, n, k;
};

// Row-major operands with padded leading dimensions, and C's float64 reference.
struct Problem {
  Shape s;
  int64_t lda, ldb, ldc;
  float alpha, beta;
  Vec a, b, c0;
  std::vector<double> want, bound;  // float64 result; error bound per element

  Problem(Shape shape, float alpha_, float beta_, uint32_t seed)
      : s(shape), alpha(alpha_), beta(beta_) {
    lda = (s.ta ? s.m : s.k) + 3;
    ldb = (s.tb ? s.k : s.n) + 1;
    ldc = s.n + 2;
    a = randn((s.ta ? s.k : s.m) * lda, seed);
    b = randn((s.tb ? s.n : s.k) * ldb, seed + 1);
    c0 = randn(s.m * ldc, seed + 2);
    if (beta == 0.f) {
      // BLAS semantics: beta 0 overwrites C, whatever it held.
      for (auto& x : c0) x = std::numeric_limits<float>::quiet_NaN();
    }
    want.assign(c0.size(), 0.0);
    bound.assign(c0.size(), 0.0);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0, mag = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          double x = s.ta ? a[p * lda + i] : a[i * lda + p];
          double y = s.tb ? b[j * ldb + p] : b[p * ldb + j];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        const size_t at = i * ldc + j;
        double c = beta == 0.f ? 0.0 : static_cast<double>(beta) * c0[at];
        want[at] = static_cast<double>(alpha) * sum + c;
        // fp32 rounding in any summation order, with or without FMA: |err| <= (k + 2) u (|alpha|
        // sum |a b| + |beta c|), u = 2^-24; doubled for the final scaling and the store.
        bound[at] =
            2.0 * (s.k + 2) * std::ldexp(1.0, -24) * (std::fabs(alpha) * mag + std::fabs(c)) +
            std::numeric_limits<float>::denorm_min();
      }
    }
  }

  // Checks C after a GEMM: every element of op within its bound, padding untouched.
  ::testing::AssertionResult check(const Vec& c) const {
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const size_t at = i * ldc + j;
        if (j >= s.n) {
          if (std::memcmp(&c[at], &c0[at], sizeof(float)) != 0) {
            return ::testing::AssertionFailure() << "padding C[" << i << "," << j << "] written";
          }
          continue;
        }
        double err = std::fabs(c[at] - want[at]);
        if (!(err <= bound[at])) {
          return ::testing::AssertionFailure()
                 << "C[" << i << "," << j << "] = " << c[at] << ", float64 reference " << want[at]
                 << " (error " << err << " > bound " << bound[at] << ")";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }
};

std::string label(const Shape& s) {
  return std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N") + " " + std::to_string(s.m) + "x" +
         std::to_string(s.n) + "x" + std::to_string(s.k);
}

Status run(GemmProvider p, const Problem& pr, Vec& c, int threads) {
  c = pr.c0;
  return cpu::sgemm(p, pr.s.ta, pr.s.tb, pr.s.m, pr.s.n, pr.s.k, pr.alpha, pr.a.data(), pr.lda,
                    pr.b.data(), pr.ldb, pr.beta, c.data(), pr.ldc, threads);
}

class GemmProviderTest : public ::testing::TestWithParam<GemmProvider> {
 protected:
  void SetUp() override {
    if (!cpu::gemm_provider_built(GetParam())) {
      GTEST_SKIP()
          << cpu::gemm_provider_name(GetParam())
          << " is not built in (libdnnl-dev missing at configure time, or RING_WITH_ONEDNN=OFF)";
    }
  }
};

TEST_P(GemmProviderTest, MatchesFloat64ReferenceForAllTransposesAndOddShapes) {
  // Degenerate vectors, primes below and above the providers' block sizes, and the model's
  // shapes scaled down (tokens x d_model x mlp_hidden).
  const int64_t dims[][3] = {{1, 1, 1},    {1, 17, 1},   {19, 1, 23},    {1, 1, 300},
                             {37, 29, 53}, {67, 5, 129}, {131, 97, 257}, {256, 88, 32}};
  uint32_t seed = 1;
  for (const auto& d : dims) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [alpha, beta] : {std::pair{1.f, 0.f}, {0.7f, 0.3f}, {-1.5f, 1.f}}) {
          Problem pr({ta, tb, d[0], d[1], d[2]}, alpha, beta, seed += 3);
          for (int threads : {1, 3}) {
            Vec c;
            ASSERT_EQ(run(GetParam(), pr, c, threads), Status::kOk);
            EXPECT_TRUE(pr.check(c))
                << label(pr.s) << " alpha " << alpha << " beta " << beta << " threads " << threads;
          }
        }
      }
    }
  }
}

TEST_P(GemmProviderTest, SameBitsRunToRunWithAFixedThreadCount) {
  // Bit-identical resume needs the same bits for the same inputs, shape and thread count, in
  // fresh buffers too. Shapes where the providers split k or n across threads.
  for (Shape s : {Shape{false, true, 1024, 704, 256}, Shape{true, false, 256, 176, 2048},
                  Shape{false, false, 509, 263, 701}}) {
    Problem pr(s, 1.f, 1.f, 7);
    for (int threads : {1, 2}) {
      Vec first;
      ASSERT_EQ(run(GetParam(), pr, first, threads), Status::kOk);
      for (int rep = 0; rep < 3; ++rep) {
        auto fresh = std::make_unique<Problem>(pr);  // other addresses, same values
        Vec again;
        ASSERT_EQ(run(GetParam(), *fresh, again, threads), Status::kOk);
        ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0)
            << label(s) << " threads " << threads << " rep " << rep;
      }
    }
  }
}

TEST_P(GemmProviderTest, ThreadSettingsAfterACall) {
  // OpenBLAS keeps the last count (process-wide); oneDNN's OpenMP setting is restored.
  Problem pr({false, false, 257, 263, 129}, 1.f, 0.f, 11);
  const int omp_before = omp_get_max_threads();
  for (int threads : {1, 2, 1}) {
    Vec c;
    ASSERT_EQ(run(GetParam(), pr, c, threads), Status::kOk);
    EXPECT_TRUE(pr.check(c)) << "threads " << threads;
    if (GetParam() == GemmProvider::kOpenBlas) {
      EXPECT_EQ(openblas_get_num_threads(), threads);
    }
    EXPECT_EQ(omp_get_max_threads(), omp_before);
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, GemmProviderTest, ::testing::ValuesIn(cpu::kGemmProviders),
                         [](const ::testing::TestParamInfo<GemmProvider>& info) {
                           return std::string(cpu::gemm_provider_name(info.param));
                         });

// ---- the choice -----------------------------------------------------------------------------
cpu::GemmFacts facts(const char* core, int level, bool onednn = true) {
  return {core, level, onednn};
}

TEST(GemmChoice, CoreVectorLevels) {
  EXPECT_EQ(cpu::openblas_core_vector_level("SkylakeX"), 2);
  EXPECT_EQ(cpu::openblas_core_vector_level("Cooperlake"), 2);
  EXPECT_EQ(cpu::openblas_core_vector_level("Haswell"), 1);
  EXPECT_EQ(cpu::openblas_core_vector_level("Zen"), 1);
  for (const char* old :
       {"Prescott", "Core2", "Nehalem", "Sandybridge", "Barcelona", "Unknown", ""}) {
    EXPECT_EQ(cpu::openblas_core_vector_level(old), 0) << old;
  }
}

TEST(GemmChoice, AutoPicksOneDnnOnlyWhenOpenBlasFellBack) {
  struct Case {
    const char* core;
    int level;
    GemmProvider want;
  } cases[] = {
      {"Prescott", 2, GemmProvider::kOneDnn},    // AVX-512 Xeon unknown to the model table
      {"Haswell", 2, GemmProvider::kOneDnn},     // AVX2 kernels on an AVX-512 CPU
      {"SkylakeX", 2, GemmProvider::kOpenBlas},  // its own kernels
      {"Cooperlake", 2, GemmProvider::kOpenBlas},
      {"Haswell", 1, GemmProvider::kOpenBlas},    // AVX2 Intel
      {"Zen", 1, GemmProvider::kOpenBlas},        // AMD EPYC (Zen maps to Haswell kernels)
      {"Sandybridge", 1, GemmProvider::kOneDnn},  // AVX without FMA on an AVX2 CPU
      {"Prescott", 0, GemmProvider::kOpenBlas},   // nothing better to pick
  };
  for (const Case& c : cases) {
    for (const char* env : {"", "auto"}) {
      auto choice = cpu::resolve_gemm_provider(env, facts(c.core, c.level));
      EXPECT_EQ(choice.value, c.want) << c.core << " level " << c.level << ": " << choice.reason;
      EXPECT_FALSE(choice.warning);
      EXPECT_NE(choice.reason.find(std::string("OpenBLAS core ") + c.core), std::string::npos)
          << choice.reason;
    }
  }
  auto fell_back = cpu::resolve_gemm_provider("", facts("Prescott", 2));
  EXPECT_NE(fell_back.reason.find("fell back"), std::string::npos) << fell_back.reason;
  // Without oneDNN in the build, auto stays on OpenBLAS and says why.
  auto without = cpu::resolve_gemm_provider("", facts("Prescott", 2, false));
  EXPECT_EQ(without.value, GemmProvider::kOpenBlas);
  EXPECT_NE(without.reason.find("no oneDNN"), std::string::npos) << without.reason;
}

TEST(GemmChoice, EnvironmentOverridesAndBadValuesAreNamed) {
  for (const char* core : {"Prescott", "SkylakeX"}) {
    auto o = cpu::resolve_gemm_provider("openblas", facts(core, 2));
    EXPECT_EQ(o.value, GemmProvider::kOpenBlas);
    EXPECT_EQ(o.reason, "RING_GEMM=openblas");
    auto d = cpu::resolve_gemm_provider("onednn", facts(core, 2));
    EXPECT_EQ(d.value, GemmProvider::kOneDnn);
    EXPECT_FALSE(d.warning);
  }
  auto missing = cpu::resolve_gemm_provider("onednn", facts("Prescott", 2, false));
  EXPECT_EQ(missing.value, GemmProvider::kOpenBlas);
  EXPECT_TRUE(missing.warning);
  EXPECT_NE(missing.reason.find("RING_GEMM=onednn"), std::string::npos) << missing.reason;
  auto bad = cpu::resolve_gemm_provider("mkl", facts("Prescott", 2));
  EXPECT_TRUE(bad.warning);
  EXPECT_EQ(bad.value, GemmProvider::kOneDnn);  // the automatic choice
  EXPECT_NE(bad.reason.find("RING_GEMM=mkl: unknown (expected openblas, onednn or auto)"),
            std::string::npos)
      << bad.reason;
}

TEST(GemmChoice, ThisMachinesFacts) {
  auto f = cpu::gemm_facts();
  EXPECT_FALSE(f.openblas_core.empty());
  EXPECT_GE(f.cpu_vector_level, 0);
  EXPECT_LE(f.cpu_vector_level, 2);
  EXPECT_EQ(f.onednn_built, cpu::gemm_provider_built(GemmProvider::kOneDnn));
  if (!f.onednn_built) {
    EXPECT_EQ(cpu::set_gemm_provider(GemmProvider::kOneDnn), Status::kUnsupported);
  }
}

// Runs first in its own process (ctest runs each test alone; gemm_test_env_* set RING_GEMM):
// the provider follows RING_GEMM and is logged once, with the reason.
TEST(GemmEnv, ActiveProviderFollowsRingGemmAndIsLoggedOnce) {
  const char* env = std::getenv("RING_GEMM");
  auto want = cpu::resolve_gemm_provider(env ? env : "", cpu::gemm_facts());
  ::testing::internal::CaptureStderr();
  GemmProvider got = cpu::active_gemm_provider();
  cpu::active_gemm_provider();
  const std::string log = ::testing::internal::GetCapturedStderr();
  if (log.empty()) GTEST_SKIP() << "another test in this process chose the provider first";
  EXPECT_EQ(got, want.value);
  const std::string line =
      std::string("GEMM provider ") + cpu::gemm_provider_name(got) + " (" + want.reason + ")\n";
  EXPECT_NE(log.find(line), std::string::npos) << log;
  EXPECT_EQ(log.find("GEMM provider"), log.rfind("GEMM provider")) << "logged twice: " << log;
  // The spelled-out overrides, independently of resolve_gemm_provider.
  if (env != nullptr && std::string(env) == "openblas") {
    EXPECT_EQ(got, GemmProvider::kOpenBlas);
  }
  if (env != nullptr && std::string(env) == "onednn" &&
      cpu::gemm_provider_built(GemmProvider::kOneDnn)) {
    EXPECT_EQ(got, GemmProvider::kOneDnn);
  }
}

TEST(GemmEnv, SetProviderSwitchesLaterCalls) {
  const GemmProvider before = cpu::active_gemm_provider();
  for (GemmProvider p : cpu::kGemmProviders) {
    if (!cpu::gemm_provider_built(p)) continue;
    ASSERT_EQ(cpu::set_gemm_provider(p), Status::kOk);
    EXPECT_EQ(cpu::active_gemm_provider(), p);
  }
  EXPECT_EQ(cpu::set_gemm_provider(static_cast<GemmProvider>(7)), Status::kInvalidArgument);
  ASSERT_EQ(cpu::set_gemm_provider(before), Status::kOk);
}

}  // namespace
}  // namespace ring::kernels
