// The fast tier in a backend's memory (the device fast tier's code path) on the cpu backend:
// the cpu backend's paged decode kernel against the CPU decode attention's page kernel, whole
// generations with the fast tier held by the backend against the host pool, and the generator's
// path for a backend other than cpu (the cpu backend under another name: the decode step's dense
// ops on it too) with its refusals.
//
// Tolerances: paged decode rows and merged heads, |out - want| <= 1e-5 x max|want| per row and
// |lse - want| <= 1e-5 x max(1, |lse|) (std::exp against the page kernel's Cephes exp, other
// summation order). Generation: the logits of every position with the backend fast tier within
// max_i |logit_i - ref_i| <= 1e-5 x max_i |ref_i| of the host pool's (the same pages, the fast
// ones computed by the other kernel).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"
#include "tests/generate/paged_decode_check.h"
#include "tests/generate/renamed_backend.h"
#include "worker/generate/generator.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::gen {
namespace {

namespace fs = std::filesystem;

// The tiny model (tests/common/tiny_model.h) with random weights, attention sharpened (wq, wk x 6).
using test::kSharpQK;
using test::tiny_model_config;
using test::tiny_params;

std::unique_ptr<kernels::Backend> cpu() {
  std::string err;
  auto b = kernels::create_backend("cpu", 2, &err);
  EXPECT_NE(b, nullptr) << err;
  return b;
}

TEST(PagedDecode, CpuBackendMatchesThePageKernel) {
  auto be = cpu();
  ASSERT_TRUE(be->supports(kernels::Op::kPagedDecode, kernels::DType::kF32));
  for (int64_t hd : {16, 64})
    for (int64_t pages : {1, 2, 5}) {
      SCOPED_TRACE("head_dim " + std::to_string(hd) + ", pages " + std::to_string(pages));
      testing::PagedCase c;
      c.head_dim = hd;
      c.pages = pages;
      c.seed = static_cast<uint64_t>(hd * 10 + pages);
      testing::check_paged_decode(be.get(), c, 1e-5, 1e-5);
    }
}

// A bf16 pool: the CPU backend against the page kernel on the same values widened to fp32 (the
// kernel widens as it reads, so the fp32 tolerance holds).
TEST(PagedDecode, CpuBackendReadsABf16Pool) {
  auto be = cpu();
  ASSERT_TRUE(be->supports(kernels::Op::kPagedDecode, kernels::DType::kBF16));
  for (int64_t hd : {16, 64, 128})
    for (int64_t pages : {1, 5}) {
      SCOPED_TRACE("head_dim " + std::to_string(hd) + ", pages " + std::to_string(pages));
      testing::PagedCase c;
      c.head_dim = hd;
      c.pages = pages;
      c.seed = static_cast<uint64_t>(hd * 10 + pages + 7);
      c.dtype = kernels::DType::kBF16;
      testing::check_paged_decode(be.get(), c, 1e-5, 1e-5);
    }
}

TEST(PagedDecode, BadArgumentsAreRefused) {
  auto be = cpu();
  kernels::PagedDecodeArgs a;
  a.rows = 1;
  a.head_dim = 0;
  a.page_tokens = 16;
  float o[1], l[1];
  EXPECT_EQ(be->paged_decode_attention(a, o, l), kernels::Status::kInvalidArgument);
  a.head_dim = 1;
  EXPECT_EQ(be->paged_decode_attention(a, o, l), kernels::Status::kInvalidArgument);  // nulls
  a.dtype = static_cast<kernels::DType>(7);  // neither fp32 nor bf16
  EXPECT_EQ(be->paged_decode_attention(a, o, l), kernels::Status::kInvalidArgument);
  EXPECT_FALSE(be->supports(kernels::Op::kPagedDecode, static_cast<kernels::DType>(7)));
}

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return diff / scale;
}

struct GenRun {
  std::vector<std::vector<float>> logits;  // prefill, then every step: [B x vocab] each
  CacheStats stats;
  DecodeStats dstats;
};

// Two prompts of two documents each; `steps` decode steps on fixed tokens (the same for every
// configuration, so the runs stay comparable).
GenRun run(const model::ModelConfig& c, kernels::Backend* be, const std::vector<float>& params,
        const GeneratorOptions& opt, int steps) {
  Generator g(c, params.data(), be, opt);
  GenRun r;
  std::vector<int> h;
  for (int p = 0; p < 2; ++p) {
    std::mt19937_64 rng(100 + p);
    const int64_t t = p == 0 ? 1100 : 700;
    std::vector<int32_t> ids, docs;
    for (int64_t i = 0; i < t; ++i) {
      ids.push_back(static_cast<int32_t>(rng() % 256));
      docs.push_back(i < t / 3 ? 0 : 1);
    }
    std::vector<float> l;
    h.push_back(g.prefill(ids, docs, &l));
    r.logits.push_back(l);
  }
  for (int s = 0; s < steps; ++s) {
    std::vector<float> l;
    g.step(h, {static_cast<int32_t>(s * 7 % 256), static_cast<int32_t>(s * 13 % 256)}, &l);
    r.logits.push_back(l);
    EXPECT_LE(g.cache().stats().fast_resident_bytes, opt.cache.fast_bytes);
  }
  r.stats = g.cache().stats();
  r.dstats = g.decode_stats();
  return r;
}

GeneratorOptions mixed(const model::ModelConfig& c, bool on_backend) {
  GeneratorOptions o;
  o.threads = 2;
  o.cache.page_tokens = 128;
  const int64_t page_bytes = 2 * 128 * c.head_dim * 4;
  // Both sequences' windows (2 pages per layer and head each) and 5 more slots: pages compete
  // by attention mass, so some are promoted and some stay in the host tier.
  o.cache.fast_bytes = (2 * 2 * c.layers * c.kv_heads + 5) * page_bytes;
  o.cache.window = 64;
  o.fast_on_backend = on_backend;
  return o;
}

TEST(GenerateBackendFastTier, MatchesTheHostPool) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 5, kSharpQK);
  struct Case {
    const char* name;
    GeneratorOptions host, dev;
  };
  std::vector<Case> cases;
  cases.push_back({"mixed", mixed(c, false), mixed(c, true)});
  Case all{"all fast", mixed(c, false), mixed(c, true)};
  all.host.cache.fast_bytes = all.dev.cache.fast_bytes = 64LL << 20;
  cases.push_back(all);
  Case q8{"int8 host pages", mixed(c, false), mixed(c, true)};
  q8.host.cache.host_int8 = q8.dev.cache.host_int8 = true;
  cases.push_back(q8);
  Case ap{"approximate", mixed(c, false), mixed(c, true)};
  ap.host.approximate = ap.dev.approximate = 0.01;
  cases.push_back(ap);
  std::string tmpl = (fs::temp_directory_path() / "ring-fast-tier-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path disk = tmpl;
  Case dk{"disk tier", mixed(c, false), mixed(c, true)};
  dk.host.cache.host_bytes = dk.dev.cache.host_bytes = 8 * 2 * 128 * c.head_dim * 4;
  dk.host.cache.disk_dir = dk.dev.cache.disk_dir = disk.string();
  cases.push_back(dk);
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const GenRun h = run(c, be.get(), params, k.host, 8);
    const GenRun d = run(c, be.get(), params, k.dev, 8);
    ASSERT_EQ(h.logits.size(), d.logits.size());
    double worst = 0;
    for (size_t i = 0; i < h.logits.size(); ++i) {
      const double e = rel_err(d.logits[i], h.logits[i]);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << "row " << i;
    }
    std::printf("%s: logits max relative difference %.3g over %zu rows\n", k.name, worst,
                h.logits.size());
    // The same pages (placement by mass may differ where two pages' masses are within rounding);
    // the backend's kernel computed the fast pages (every (page, sequence, query head) row),
    // the CPU threads the others.
    EXPECT_TRUE(d.stats.fast_on_device);
    EXPECT_FALSE(h.stats.fast_on_device);
    EXPECT_EQ(d.dstats.tasks, h.dstats.tasks);
    EXPECT_GT(d.dstats.fast_tasks, 0);
    EXPECT_GT(d.dstats.device_rows, 0);
    EXPECT_EQ(h.dstats.device_rows, 0);
    EXPECT_GT(d.stats.pinned_buffers, 0);  // the cpu backend's pin_host: a no-op that succeeds
  }
  EXPECT_GT(cases.size(), 0u);
  fs::remove_all(disk);
}

TEST(GenerateBackendFastTier, MixedRunsBothSidesAndPromotes) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 9, kSharpQK);
  const GenRun d = run(c, be.get(), params, mixed(c, true), 8);
  EXPECT_GT(d.dstats.fast_tasks, 0);
  EXPECT_GT(d.dstats.host_tasks, 0);
  EXPECT_GT(d.stats.promotions, 2 * 2 * c.layers * c.kv_heads);  // beyond the windows
}


TEST(GenerateBackendFastTier, AnotherBackendRunsTheStepOnItAndMatches) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 5, kSharpQK);
  Renamed dev(cpu(), true);
  const GenRun h = run(c, be.get(), params, mixed(c, false), 8);
  const GenRun d = run(c, &dev, params, mixed(c, false), 8);  // forced onto the backend
  ASSERT_EQ(h.logits.size(), d.logits.size());
  for (size_t i = 0; i < h.logits.size(); ++i)
    EXPECT_LE(rel_err(d.logits[i], h.logits[i]), 1e-5) << "row " << i;
  EXPECT_TRUE(d.stats.fast_on_device);
  EXPECT_GT(d.dstats.device_rows, 0);
  EXPECT_GT(d.dstats.host_tasks, 0);
}

// The device given apart from the prefill's backend (GeneratorOptions::device, what each rank of
// a sharded generation on a device does): the prefill on the cpu backend, the fast tier and the
// decode step's dense ops on the other one, on its own copy of the weights.
TEST(GenerateBackendFastTier, ASeparateDeviceHoldsTheFastTierAndMatches) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 5, kSharpQK);
  Renamed dev(cpu(), true);
  const GenRun h = run(c, be.get(), params, mixed(c, false), 8);
  GeneratorOptions o = mixed(c, false);
  o.device = &dev;
  const GenRun d = run(c, be.get(), params, o, 8);
  ASSERT_EQ(h.logits.size(), d.logits.size());
  double worst = 0;
  for (size_t i = 0; i < h.logits.size(); ++i) {
    worst = std::max(worst, rel_err(d.logits[i], h.logits[i]));
    EXPECT_LE(rel_err(d.logits[i], h.logits[i]), 1e-5) << "row " << i;
  }
  std::printf("separate device: logits max relative difference %.3g\n", worst);
  EXPECT_TRUE(d.stats.fast_on_device);
  EXPECT_GT(d.dstats.device_rows, 0);
  EXPECT_GT(d.dstats.host_tasks, 0);
  EXPECT_GT(d.stats.promotions, 0);
}

TEST(GenerateBackendFastTier, RefusalsNameTheBackend) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 5, kSharpQK);
  Renamed without(cpu(), false);
  try {
    Generator g(c, params.data(), &without, mixed(c, true));
    FAIL() << "a backend without paged decode attention was taken";
  } catch (const GenerateError& e) {
    EXPECT_NE(std::string(e.what()).find("'renamed' backend needs its paged decode attention"),
              std::string::npos)
        << e.what();
  }
  Renamed with(cpu(), true);
  GeneratorOptions o = mixed(c, true);
  o.shard.ranks = 2;
  try {
    Generator g(c, params.data(), &with, o);
    FAIL() << "a device fast tier over 2 ranks was taken";
  } catch (const GenerateError& e) {
    EXPECT_NE(std::string(e.what()).find("prefills on the cpu backend (asked for 'renamed'"),
              std::string::npos)
        << e.what();
  }
  // A separate device needs the prefill on the cpu backend.
  Renamed other(cpu(), true);
  GeneratorOptions sep = mixed(c, false);
  sep.device = &other;
  try {
    Generator g(c, params.data(), &with, sep);
    FAIL() << "a separate device with the prefill on 'renamed' was taken";
  } catch (const GenerateError& e) {
    EXPECT_NE(std::string(e.what()).find("needs the prefill on the cpu backend (asked for "
                                         "'renamed')"),
              std::string::npos)
        << e.what();
  }
  // The cpu backend's own fast_on_backend needs nothing more.
  EXPECT_NO_THROW(Generator(c, params.data(), be.get(), mixed(c, true)));
}

}  // namespace
}  // namespace ring::gen
