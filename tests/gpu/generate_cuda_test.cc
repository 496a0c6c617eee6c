// Generation's device fast tier on the CUDA backend (loaded through create_backend("cuda")): the
// paged decode kernel against the CPU decode attention's page kernel, and whole generations on
// cuda against cpu. Every test skips with the reason create_backend gave when there is no GPU.
//
// Tolerances:
//   paged decode (tests/generate/paged_decode_check.h): per row and per merged head,
//     |out - want| <= 1e-5 x max|want| and |lse - want| <= 1e-5 x max(1, |lse|) (fp32 on both
//     sides; other summation order, expf against the CPU's Cephes exp).
//   generation: the logits of the prefill and of every decode step on cuda (prefill: the
//     training forward on the GPU; decode: the dense layers on the GPU, fast pages on the GPU
//     kernel, host pages on the CPU threads) within
//     max_i |logit_i - ref_i| <= 1e-5 x max_i |ref_i| of the cpu backend's (host fast pool).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"
#include "tests/generate/paged_decode_check.h"
#include "worker/generate/generator.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::gen {
namespace {

struct Backends {
  std::unique_ptr<kernels::Backend> gpu, cpu;
  std::string why;
};

Backends& backends() {
  static Backends b = [] {
    Backends x;
    std::string err;
    x.gpu = kernels::create_backend("cuda", 0, &err);
    if (!x.gpu) x.why = err;
    x.cpu = kernels::create_backend("cpu", 2, &err);
    return x;
  }();
  return b;
}

#define REQUIRE_GPU()                                                           \
  do {                                                                          \
    if (!backends().gpu) GTEST_SKIP() << "no CUDA backend: " << backends().why; \
  } while (0)

TEST(GenerateCuda, PagedDecodeMatchesTheCpuPageKernel) {
  REQUIRE_GPU();
  kernels::Backend* be = backends().gpu.get();
  ASSERT_TRUE(be->supports(kernels::Op::kPagedDecode, kernels::DType::kF32));
  for (int64_t hd : {16, 64, 128, 256})
    for (int64_t pages : {1, 2, 5, 9})
      for (int64_t pt : {64, 1024}) {
        SCOPED_TRACE("head_dim " + std::to_string(hd) + ", pages " + std::to_string(pages) +
                     ", page_tokens " + std::to_string(pt));
        testing::PagedCase c;
        c.head_dim = hd;
        c.pages = pages;
        c.page_tokens = pt;
        c.last_fill = pt == 64 ? 37 : 777;
        c.group = hd == 256 ? 2 : 4;
        c.seed = static_cast<uint64_t>(hd * 100 + pages * 10 + pt);
        testing::check_paged_decode(be, c, 1e-5, 1e-5);
      }
  // Above 256 the kernel says it does not support it.
  kernels::PagedDecodeArgs a;
  a.rows = 1;
  a.head_dim = 512;
  a.page_tokens = 16;
  float* dummy = nullptr;
  EXPECT_EQ(be->paged_decode_attention(a, dummy, dummy), kernels::Status::kUnsupported);
}

// The tiny model (tests/common/tiny_model.h) twice as wide: 8 query heads over 2 K/V heads of 16.
model::ModelConfig wide_config() {
  return test::tiny_model_config({.d_model = 128, .heads = 8, .mlp_hidden = 256});
}

struct GenRun {
  std::vector<std::vector<float>> logits;  // prefill rows, then every step's [B x vocab]
  CacheStats stats;
  DecodeStats dstats;
};

// Three prompts (two documents each), then fixed tokens for every step.
GenRun run(const model::ModelConfig& c, kernels::Backend* be, const std::vector<float>& params,
           const GeneratorOptions& opt, int steps) {
  Generator g(c, params.data(), be, opt);
  GenRun r;
  std::vector<int> h;
  for (int p = 0; p < 3; ++p) {
    std::mt19937_64 rng(200 + p);
    const int64_t t = 500 + 700 * p;
    std::vector<int32_t> ids, docs;
    for (int64_t i = 0; i < t; ++i) {
      ids.push_back(static_cast<int32_t>(rng() % 256));
      docs.push_back(i < t / 4 ? 0 : 1);
    }
    std::vector<float> l;
    h.push_back(g.prefill(ids, docs, &l));
    r.logits.push_back(l);
  }
  for (int s = 0; s < steps; ++s) {
    std::vector<float> l;
    std::vector<int32_t> tok;
    for (size_t b = 0; b < h.size(); ++b) tok.push_back(static_cast<int32_t>((s * 31 + b * 7) % 256));
    g.step(h, tok, &l);
    r.logits.push_back(l);
  }
  r.stats = g.cache().stats();
  r.dstats = g.decode_stats();
  return r;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return diff / scale;
}

TEST(GenerateCuda, DecodeOnCudaMatchesCpu) {
  REQUIRE_GPU();
  const auto c = wide_config();
  const auto params = test::tiny_params(c, backends().cpu.get(), 3, test::kSharpQK);
  const int64_t page = 128, page_bytes = 2 * page * c.head_dim * 4;
  struct Case {
    const char* name;
    int64_t fast_bytes;
    bool int8;
  };
  // Mixed: the three windows (2 pages per layer and head each) and 6 more slots, so pages are
  // promoted by mass and the host tier computes the rest on the CPU at the same time.
  const int64_t windows = 3 * 2 * c.layers * c.kv_heads;
  for (const Case& k : {Case{"mixed", (windows + 6) * page_bytes, false},
                        Case{"all fast", 256LL << 20, false},
                        Case{"mixed, int8 host pages", (windows + 6) * page_bytes, true}}) {
    SCOPED_TRACE(k.name);
    GeneratorOptions o;
    o.threads = 4;
    o.cache.page_tokens = page;
    o.cache.fast_bytes = k.fast_bytes;
    o.cache.window = 64;
    o.cache.host_int8 = k.int8;
    const GenRun ref = run(c, backends().cpu.get(), params, o, 10);
    const GenRun got = run(c, backends().gpu.get(), params, o, 10);
    ASSERT_EQ(ref.logits.size(), got.logits.size());
    double worst = 0;
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      const double e = rel_err(got.logits[i], ref.logits[i]);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << "row " << i << (i < 3 ? " (prefill)" : " (decode step)");
    }
    std::printf("%s: cuda vs cpu logits, max relative difference %.3g over %zu rows\n", k.name,
                worst, ref.logits.size());
    EXPECT_TRUE(got.stats.fast_on_device);
    EXPECT_GT(got.dstats.device_rows, 0);
    EXPECT_EQ(got.dstats.tasks, ref.dstats.tasks);
    EXPECT_GT(got.dstats.fast_tasks, 0);
    if (k.fast_bytes < (1LL << 20)) {
      EXPECT_GT(got.dstats.host_tasks, 0);
      EXPECT_GT(got.stats.promotions, windows);
      EXPECT_GT(got.stats.pinned_buffers, 0);
    }
  }
}

TEST(GenerateCuda, FastTierLargerThanTheDeviceSaysSo) {
  REQUIRE_GPU();
  const auto c = wide_config();
  const auto params = test::tiny_params(c, backends().cpu.get(), 3, test::kSharpQK);
  GeneratorOptions o;
  o.cache.page_tokens = 128;
  o.cache.fast_bytes = 1LL << 50;  // 1 PiB
  try {
    Generator g(c, params.data(), backends().gpu.get(), o);
    FAIL() << "a 1 PiB fast tier was allocated";
  } catch (const GenerateError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fast_bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace ring::gen
