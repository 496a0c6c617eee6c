// Sharded generation across real processes (generate_rank_helper, one per rank, joined by the UCX
// transport on this host) against a teacher-forced full forward in this process.
//
// The prompt is prefilled over P ranks with ring attention (the training forward, zigzag or
// contiguous split), each rank keeps the K/V of its tokens as its cache pages, and every decode
// step merges the ranks' partial (o, lse). For every generated position (and the prompt's last):
//   max_i |logit_i - ref_i| <= 1e-5 * max_i |ref_i|
// where ref is Model::forward with LocalAttention over the prompt and the generated tokens. Every
// rank must hold bit-identical logits, the ranks' pages must partition the sequence (no rank holds
// another's tokens), and where pages live (all host, mixed with promotion, disk, all fast) must
// not change a bit. With the fast tier in a backend's memory on each rank (the device fast tier's
// code path, a cpu backend standing in for the GPU as in fast_tier_test), every position is
// within the same bound of the teacher and of the host-pool run: max_i |logit_i - ref_i| <= 1e-5
// * max_i |ref_i| (the fast pages' partials come from the backend's kernel: its own rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/test_proc.h"
#include "tests/generate/generate_ring_util.h"

namespace ring::gen {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ring::test::ProcGroup;
using ring::test::TempDir;

struct Case {
  int ranks = 2;
  int64_t tokens = 1000;
  int docs = 4;
  uint64_t seed = 5;
  int batch = 1;
  int64_t prefix = 0;
  int64_t vary = 0;  // prompt b is b x vary tokens shorter
  int steps = 40;
  int64_t page = 64;
  int64_t fast = 0;
  int64_t host = 0;
  std::string disk;
  int64_t window = 0;
  std::string balance = "zigzag";
  std::string device = "none";  // generate_rank_helper's device: none, cpu or renamed
  std::string dtype = "fp32";   // the model's dtype: fp32 or bf16
  int head_ranks = 1;           // the prefill's head groups (worker/ring/head_attention.h)
};

struct Result {
  int64_t batch = 0, rows = 0;
  std::vector<std::vector<int32_t>> tokens;  // [prompt] prompt + generated
  std::vector<std::vector<float>> logits;    // [prompt] rows x vocab
  std::vector<int64_t> local;                // [prompt] tokens this rank holds
  int64_t shared_hits = 0, fast_tasks = 0, host_tasks = 0, disk_tasks = 0, promotions = 0,
          fast_peak = 0, fast_limit = 0, device_rows = 0, fast_on_device = 0;
};

Result read_result(const std::string& path, const std::vector<test::Prompt>& prompts,
                   int64_t vocab) {
  const std::string raw = ring::test::slurp(path);
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    if (at + n > raw.size()) throw std::runtime_error(path + ": truncated");
    std::memcpy(dst, raw.data() + at, n);
    at += n;
  };
  auto i64 = [&] {
    int64_t x = 0;
    take(&x, sizeof(x));
    return x;
  };
  Result r;
  r.batch = i64();
  r.rows = i64();
  for (int64_t b = 0; b < r.batch; ++b) {
    const int64_t prompt_tokens =
        static_cast<int64_t>(prompts.at(static_cast<size_t>(b)).ids.size());
    std::vector<int32_t> t(static_cast<size_t>(prompt_tokens + r.rows - 1));
    take(t.data(), t.size() * sizeof(int32_t));
    std::vector<float> l(static_cast<size_t>(r.rows * vocab));
    take(l.data(), l.size() * sizeof(float));
    r.tokens.push_back(std::move(t));
    r.logits.push_back(std::move(l));
  }
  for (int64_t b = 0; b < r.batch; ++b) r.local.push_back(i64());
  r.shared_hits = i64();
  r.fast_tasks = i64();
  r.host_tasks = i64();
  r.disk_tasks = i64();
  r.promotions = i64();
  r.fast_peak = i64();
  r.fast_limit = i64();
  r.device_rows = i64();
  r.fast_on_device = i64();
  return r;
}

// Runs the ranks of a case; every rank must exit 0. Returns each rank's result.
std::vector<Result> run_case(const Case& c, const std::string& dir) {
  ProcGroup procs;
  const std::string rdv = dir + "/rdv";
  for (int r = 0; r < c.ranks; ++r) {
    auto kv = [](const std::string& k, const auto& v) {
      if constexpr (std::is_convertible_v<decltype(v), std::string>) {
        return k + "=" + std::string(v);
      } else {
        return k + "=" + std::to_string(v);
      }
    };
    procs.start(
        {GENERATE_RANK_HELPER, kv("rank", r), kv("ranks", c.ranks), kv("dir", rdv),
         kv("out", dir + "/out-" + std::to_string(r)), kv("tokens", c.tokens), kv("docs", c.docs),
         kv("seed", c.seed), kv("batch", c.batch), kv("prefix", c.prefix), kv("vary", c.vary),
         kv("steps", c.steps), kv("page", c.page), kv("fast", c.fast), kv("host", c.host),
         kv("disk", c.disk), kv("window", c.window), kv("balance", c.balance),
         kv("device", c.device), kv("dtype", c.dtype), kv("head_ranks", c.head_ranks)},
        dir + "/log-" + std::to_string(r), dir + "/log-" + std::to_string(r),
        ring::test::ucx_loopback());
  }
  std::vector<Result> out;
  EXPECT_TRUE(procs.wait_all(300s)) << "ranks did not finish in 300 s\n" << procs.logs("rank");
  for (int r = 0; r < c.ranks; ++r) EXPECT_EQ(procs.status(r), 0) << procs.logs("rank");
  if (::testing::Test::HasFailure()) return out;
  const auto cfg = test::tiny_model_config();
  const auto prompts = test::ring_prompts(c.tokens, c.docs, c.seed, c.batch, c.prefix, c.vary);
  for (int r = 0; r < c.ranks; ++r)
    out.push_back(read_result(dir + "/out-" + std::to_string(r), prompts, cfg.vocab));
  return out;
}

// Teacher-forced logits of every position: [T, vocab].
std::vector<float> teacher(const std::vector<float>& params, const std::vector<int32_t>& ids,
                           const std::vector<int32_t>& docs,
                           spec::DType dtype = spec::DType::kFp32) {
  auto cfg = test::tiny_model_config();
  cfg.dtype = dtype;
  auto be = test::cpu(2);
  return test::teacher_logits(cfg, be.get(), params, ids, docs);
}

using test::rel_err;

// Every rank identical, the ranks' tokens a partition of each sequence, and every position
// within 1e-5 of the teacher. Returns the worst relative error.
double expect_exact(const Case& c, const std::vector<Result>& res) {
  if (res.empty()) return 0;
  const auto cfg = test::tiny_model_config();
  for (int r = 1; r < c.ranks; ++r) {
    EXPECT_EQ(res[static_cast<size_t>(r)].tokens, res[0].tokens) << "rank " << r;
    EXPECT_EQ(res[static_cast<size_t>(r)].logits, res[0].logits) << "rank " << r;
  }
  const auto prompts = test::ring_prompts(c.tokens, c.docs, c.seed, c.batch, c.prefix, c.vary);
  for (int64_t b = 0; b < c.batch; ++b) {
    int64_t held = 0;
    for (const Result& r : res) {
      EXPECT_GT(r.local[static_cast<size_t>(b)], 0);
      held += r.local[static_cast<size_t>(b)];
    }
    EXPECT_EQ(held, static_cast<int64_t>(prompts[static_cast<size_t>(b)].ids.size()) + c.steps)
        << "prompt " << b << ": pages must partition it";
  }
  auto be = test::cpu(1);
  const std::vector<float> params = test::tiny_params(cfg, be.get(), 7, test::kSharpQK);
  double worst = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto& ids = res[0].tokens[static_cast<size_t>(b)];
    EXPECT_TRUE(std::equal(prompts[static_cast<size_t>(b)].ids.begin(),
                           prompts[static_cast<size_t>(b)].ids.end(), ids.begin()));
    std::vector<int32_t> docs = prompts[static_cast<size_t>(b)].docs;
    docs.resize(ids.size(), docs.back());
    const std::vector<float> ref = teacher(params, ids, docs);
    for (int64_t i = 0; i < res[0].rows; ++i) {
      const int64_t p = static_cast<int64_t>(prompts[static_cast<size_t>(b)].ids.size()) - 1 + i;
      const double e = rel_err(res[0].logits[static_cast<size_t>(b)].data() + i * cfg.vocab,
                               ref.data() + p * cfg.vocab, cfg.vocab);
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-5) << "prompt " << b << " position " << p;
    }
  }
  return worst;
}

class GenerateRanks : public ::testing::TestWithParam<int> {};

// 1, 2 and 4 prefill ranks, packed documents, GQA, all pages in host memory; the 40 generated
// tokens cross a page boundary, so they land on two ranks in turn.
TEST_P(GenerateRanks, EveryGeneratedPositionMatchesTheTeacher) {
  TempDir dir("gen-ring-test");
  Case c;
  c.ranks = GetParam();
  const auto res = run_case(c, dir.path);
  const double worst = expect_exact(c, res);
  std::printf("ranks %d: worst relative error %.3g\n", c.ranks, worst);
  if (c.ranks > 1 && !res.empty()) {
    // Decode positions 1000..1039 fall in pages 15 and 16: ranks 15 mod P and 16 mod P store them.
    int growing = 0;
    for (int r = 0; r < c.ranks; ++r) {
      const int64_t prompt_share = c.tokens / c.ranks;  // 1000 splits evenly over 2 and 4 ranks
      growing += res[static_cast<size_t>(r)].local[0] > prompt_share;
    }
    EXPECT_EQ(growing, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GenerateRanks, ::testing::Values(1, 2, 4));

// The prefill in two levels (parallel.head_ranks): 4 ranks as 2 groups of 2 (the tiny model's 2
// K/V heads split) and as 1 group of 4 (each K/V head replicated on 2 ranks); the decode is
// sharded by tokens as before. Every generated position matches the teacher as the single ring
// does, and the greedy tokens are the single ring's.
TEST(GenerateRanksHeadGroups, TwoLevelPrefillMatchesTheTeacherAndTheSingleRing) {
  std::vector<int32_t> single;
  for (int u : {1, 2, 4}) {
    TempDir dir("gen-ring-test");
    Case c;
    c.ranks = 4;
    c.head_ranks = u;
    const auto res = run_case(c, dir.path);
    if (::testing::Test::HasFailure()) return;
    const double worst = expect_exact(c, res);
    std::printf("4 ranks, head_ranks %d: worst relative error %.3g\n", u, worst);
    ASSERT_FALSE(res.empty());
    if (u == 1) single = res[0].tokens[0];
    else EXPECT_EQ(res[0].tokens[0], single) << "head_ranks " << u;
  }
}

// Tier layouts over two ranks: all host, mixed (a small fast pool, promotion by attention mass),
// a disk tier, all fast. Exact, and identical to each other bit for bit.
TEST(GenerateRanksTiers, AllHostMixedDiskAndAllFastAreExactAndIdentical) {
  TempDir dir("gen-ring-tiers");
  const int64_t page = 64, page_bytes = 2 * page * 16 * 4;
  std::vector<std::pair<std::string, Case>> cases;
  Case host;
  cases.push_back({"all host", host});
  Case mixed;
  mixed.window = 32;
  mixed.fast = (2 * 2 * 2 + 3) * page_bytes;  // window pages (2 per layer and head) + 3
  cases.push_back({"mixed", mixed});
  Case disk;
  disk.host = 4 * page_bytes;
  disk.disk = dir.path + "/disk";
  fs::create_directories(disk.disk);
  cases.push_back({"disk", disk});
  Case fast;
  fast.window = -1;
  fast.fast = 64 * page_bytes;
  cases.push_back({"all fast", fast});
  std::vector<std::vector<Result>> runs;
  for (auto& [name, c] : cases) {
    SCOPED_TRACE(name);
    c.page = page;
    const std::string sub = dir.path + "/" + std::to_string(runs.size());
    fs::create_directories(sub);
    runs.push_back(run_case(c, sub));
    if (HasFailure()) return;
    expect_exact(c, runs.back());
    for (const Result& r : runs.back()) EXPECT_LE(r.fast_peak, r.fast_limit);
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    EXPECT_EQ(runs[i][0].logits, runs[0][0].logits);
  }
  for (const Result& r : runs[0]) EXPECT_EQ(r.fast_tasks, 0);
  for (const Result& r : runs[1]) {
    EXPECT_GT(r.fast_tasks, 0);
    EXPECT_GT(r.host_tasks, 0);
    EXPECT_GT(r.promotions, 0);
  }
  for (const Result& r : runs[2]) EXPECT_GT(r.disk_tasks, 0);
  for (const Result& r : runs[3]) EXPECT_EQ(r.host_tasks, 0);
  EXPECT_TRUE(fs::is_empty(dir.path + "/disk"));  // the disk files are gone with the ranks
}

// The device fast tier over two ranks: each rank's fast pool in its own backend's memory (a
// second cpu backend, and a backend under another name that runs the decode step's dense ops
// too, on its copy of the weights: a GPU rank's path), its fast pages' partials by the backend's
// paged decode kernel, its host pages' by the CPU threads, the per-rank partials merged as
// before. Mixed tiers with promotion, and all fast: exact against the teacher and within 1e-5 of
// the host-pool run of the same case.
TEST(GenerateRanksDeviceTier, FastPoolInEachRanksBackendMatchesTheHostPool) {
  TempDir dir("gen-ring-device");
  const int64_t page = 64, page_bytes = 2 * page * 16 * 4;
  std::vector<std::pair<std::string, Case>> layouts;
  Case mixed;
  mixed.window = 32;
  mixed.fast = (2 * 2 * 2 + 3) * page_bytes;  // window pages (2 per layer and head) + 3
  layouts.push_back({"mixed", mixed});
  Case fast;
  fast.window = -1;
  fast.fast = 64 * page_bytes;
  layouts.push_back({"all fast", fast});
  int sub = 0;
  for (auto& [name, base] : layouts) {
    base.page = page;
    std::vector<Result> host;
    for (const std::string device : {"none", "cpu", "renamed"}) {
      SCOPED_TRACE(name + ", device " + device);
      Case c = base;
      c.device = device;
      const std::string d = dir.path + "/" + std::to_string(sub++);
      fs::create_directories(d);
      const std::vector<Result> res = run_case(c, d);
      if (HasFailure()) return;
      const double worst = expect_exact(c, res);
      for (const Result& r : res) EXPECT_LE(r.fast_peak, r.fast_limit);
      if (device == "none") {
        host = res;
        for (const Result& r : res) EXPECT_EQ(r.fast_on_device, 0);
        std::printf("%s, host pool: worst relative error vs the teacher %.3g\n", name.c_str(),
                    worst);
        continue;
      }
      double vs_host = 0;
      for (const Result& r : res) {
        EXPECT_EQ(r.fast_on_device, 1);
        EXPECT_GT(r.device_rows, 0);  // every rank's kernel computed its fast pages
        EXPECT_GT(r.fast_tasks, 0);
        if (name == "mixed") {
          EXPECT_GT(r.host_tasks, 0);
          EXPECT_GT(r.promotions, 0);
        } else {
          EXPECT_EQ(r.host_tasks, 0);
        }
      }
      // Against the host pool's run: the same tokens, the logits within the bound.
      ASSERT_EQ(res[0].tokens, host[0].tokens);
      const int64_t vocab = test::tiny_model_config().vocab;
      for (int64_t i = 0; i < res[0].rows; ++i) {
        const double e = rel_err(res[0].logits[0].data() + i * vocab,
                                 host[0].logits[0].data() + i * vocab, vocab);
        vs_host = std::max(vs_host, e);
        EXPECT_LE(e, 1e-5) << "row " << i;
      }
      std::printf(
          "%s, device %s: worst relative error vs the teacher %.3g, vs the host pool %.3g\n",
          name.c_str(), device.c_str(), worst, vs_host);
    }
  }
}

// A batch of 3 prompts sharing a 512-token prefix, contiguous split over 2 ranks: each rank stores
// its prefix pages once, and every prompt is exact.
TEST(GenerateRanksPrefix, SharedPrefixBatchOverTwoRanksIsExact) {
  TempDir dir("gen-ring-prefix");
  Case c;
  c.batch = 3;
  c.prefix = 512;
  c.steps = 12;
  c.balance = "contiguous";
  const auto res = run_case(c, dir.path);
  expect_exact(c, res);
  // Rank 0 holds tokens 0..499, all in the common prefix: its 7 full pages per (layer, head) are
  // stored once and found twice more.
  if (!res.empty()) {
    EXPECT_EQ(res[0].shared_hits, 2 * 7 * 2 * 2);
  }
}

// A batch of 4 prompts of different lengths (1000, 969, 938, 907 tokens) over 4 ranks: each
// sequence's new tokens go to the rank of its own position (different ranks in one step), each
// prompt is cut differently, and every position of every prompt is exact.
TEST(GenerateRanksBatch, PromptsOfDifferentLengthsOverFourRanksAreExact) {
  TempDir dir("gen-ring-batch");
  Case c;
  c.ranks = 4;
  c.batch = 4;
  c.vary = 31;
  c.page = 16;
  c.steps = 24;
  const auto res = run_case(c, dir.path);
  expect_exact(c, res);
}

// bf16 (docs/precision.md): each rank's prefill is the model's bf16 forward with its K/V on the
// ring in bf16, its pages bf16. One process and ring prefills over 2 and 4 ranks generate the same
// 40 greedy tokens, every rank of a run holds the same logits, and every position of every run is
// within generate_bf16_test.cc's bound of the bf16 teacher-forced forward: 2^-8 of the row's
// scale per position (one bf16 ulp: a summation-order difference that straddles a rounding
// point), 2^-12 on average.
TEST(GenerateRanksBf16, OneTwoAndFourRanksGenerateTheSameTokens) {
  TempDir dir("gen-ring-bf16");
  const auto cfg = test::tiny_model_config();
  auto be = test::cpu(1);
  const std::vector<float> params = test::tiny_params(cfg, be.get(), 7, test::kSharpQK);
  std::vector<int32_t> tokens_of_one;
  for (int ranks : {1, 2, 4}) {
    SCOPED_TRACE(ranks);
    Case c;
    c.ranks = ranks;
    c.dtype = "bf16";
    const std::string sub = dir.path + "/" + std::to_string(ranks);
    fs::create_directories(sub);
    const std::vector<Result> res = run_case(c, sub);
    if (HasFailure()) return;
    for (int r = 1; r < ranks; ++r) {
      EXPECT_EQ(res[static_cast<size_t>(r)].tokens, res[0].tokens) << "rank " << r;
      EXPECT_EQ(res[static_cast<size_t>(r)].logits, res[0].logits) << "rank " << r;
    }
    const std::vector<int32_t>& ids = res[0].tokens[0];
    if (ranks == 1) tokens_of_one = ids;
    EXPECT_EQ(ids, tokens_of_one) << "greedy tokens of " << ranks << " ranks against one";
    std::vector<int32_t> docs = test::ring_prompts(c.tokens, c.docs, c.seed, 1, 0)[0].docs;
    const int64_t first = static_cast<int64_t>(docs.size()) - 1;
    docs.resize(ids.size(), docs.back());
    const std::vector<float> ref = teacher(params, ids, docs, spec::DType::kBf16);
    double worst = 0, sum = 0;
    for (int64_t i = 0; i < res[0].rows; ++i) {
      const double e = rel_err(res[0].logits[0].data() + i * cfg.vocab,
                               ref.data() + (first + i) * cfg.vocab, cfg.vocab);
      EXPECT_LE(e, 1.0 / 256) << "position " << first + i;
      worst = std::max(worst, e);
      sum += e;
    }
    EXPECT_LE(sum / static_cast<double>(res[0].rows), 1.0 / 4096);
    std::printf("bf16, %d rank(s): worst relative error vs the bf16 teacher %.3g, mean %.3g\n",
                ranks, worst, sum / static_cast<double>(res[0].rows));
  }
}

// A prompt too short to cut over the ranks is an error naming the rule, on every rank.
TEST(GenerateRanksErrors, PromptShorterThanTheSplitIsAClearError) {
  TempDir dir("gen-ring-short");
  ProcGroup procs;
  for (int r = 0; r < 2; ++r)
    procs.start({GENERATE_RANK_HELPER, "rank=" + std::to_string(r), "ranks=2",
                 "dir=" + dir.path + "/rdv", "out=" + dir.path + "/out", "tokens=3", "docs=1"},
                dir.path + "/log-" + std::to_string(r), dir.path + "/log-" + std::to_string(r),
                ring::test::ucx_loopback());
  ASSERT_TRUE(procs.wait_all(120s)) << procs.logs("rank");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(procs.status(r), 1) << procs.logs("rank");
    EXPECT_NE(procs.log(r).find("a prompt of 3 tokens cannot be cut over 2 ranks (the zigzag "
                                "split needs at least 4)"),
              std::string::npos)
        << procs.log(r);
  }
}

// A 64K-token prompt (32 packed documents) over 2 ranks, pages of 1024 in host memory.
TEST(GenerateRanksLong, SixtyFourKPromptOverTwoRanksIsExact) {
  TempDir dir("gen-ring-64k");
  Case c;
  c.tokens = 65536;
  c.docs = 32;
  c.page = 1024;
  c.steps = 4;
  const auto t0 = std::chrono::steady_clock::now();
  const auto res = run_case(c, dir.path);
  const double ranks_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double worst = expect_exact(c, res);
  std::printf("64K prompt over 2 ranks: %.1f s for the ranks, worst relative error %.3g\n", ranks_s,
              worst);
}

}  // namespace
}  // namespace ring::gen
