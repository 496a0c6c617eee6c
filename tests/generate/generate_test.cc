// Generation over the paged KV cache against a teacher-forced full forward.
//
// A tiny random model (GQA: 4 query heads over 2 K/V heads; attention sharpened by scaling wq and
// wk so the softmax is far from uniform) prefills prompts of packed documents and decodes greedily;
// the logits of the prompt's last token and of every generated position must equal those of one
// full training forward (Model::forward with LocalAttention) over the same tokens:
//   max_i |logit_i - ref_i| <= 1e-5 * max_i |ref_i|      per position (relative to the row's scale)
// for every tier configuration (all fast, all host, mixed with promotion, a disk tier), and with
// prefix sharing for batches of 1-8 prompts. The fast tier's resident bytes never exceed its size.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"
#include "tests/generate/generate_ring_util.h"
#include "worker/generate/generator.h"
#include "worker/generate/sampling.h"
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

using test::argmax;
using test::packed_prompt;
using test::Prompt;
using test::rel_err;
using test::teacher;

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "ring-gen-test-XXXXXX").string();
    path_ = ::mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct GenRun {
  std::vector<std::vector<float>> logits;  // [prompt][position - first] rows of vocab
  std::vector<Prompt> full;                // prompt + generated tokens
  CacheStats stats;
  DecodeStats dstats;
  int64_t fast_peak = 0;
};

// Prefills every prompt, then decodes `steps` greedy tokens for all of them in one batch.
GenRun generate(const model::ModelConfig& c, kernels::Backend* be, const std::vector<float>& params,
             const GeneratorOptions& opt, const std::vector<Prompt>& prompts, int steps) {
  Generator g(c, params.data(), be, opt);
  GenRun r;
  std::vector<int> handles;
  std::vector<int32_t> next;
  for (const Prompt& p : prompts) {
    std::vector<float> l;
    handles.push_back(g.prefill(p.ids, p.docs, &l));
    r.logits.push_back(l);
    r.full.push_back(p);
    next.push_back(argmax(l.data(), c.vocab));
  }
  for (int s = 0; s < steps; ++s) {
    std::vector<float> l;
    g.step(handles, next, &l);
    for (size_t b = 0; b < prompts.size(); ++b) {
      r.full[b].ids.push_back(next[b]);
      r.full[b].docs.push_back(r.full[b].docs.back());
      const float* row = l.data() + static_cast<int64_t>(b) * c.vocab;
      r.logits[b].insert(r.logits[b].end(), row, row + c.vocab);
      next[b] = argmax(row, c.vocab);
    }
    const CacheStats cs = g.cache().stats();
    EXPECT_LE(cs.fast_resident_bytes, opt.cache.fast_bytes);
    r.fast_peak = std::max(r.fast_peak, cs.fast_peak_bytes);
  }
  r.stats = g.cache().stats();
  r.dstats = g.decode_stats();
  return r;
}

// Every generated position against the teacher-forced forward.
void expect_exact(const model::ModelConfig& c, kernels::Backend* be,
                  const std::vector<float>& params, const GenRun& r, const std::vector<Prompt>& prompts) {
  for (size_t b = 0; b < prompts.size(); ++b) {
    const std::vector<float> ref = teacher(c, be, params, r.full[b]);
    const int64_t first = static_cast<int64_t>(prompts[b].ids.size()) - 1;
    const int64_t rows = static_cast<int64_t>(r.logits[b].size()) / c.vocab;
    ASSERT_EQ(first + rows, static_cast<int64_t>(r.full[b].ids.size()));
    for (int64_t i = 0; i < rows; ++i) {
      const double e = rel_err(r.logits[b].data() + i * c.vocab,
                               ref.data() + (first + i) * c.vocab, c.vocab);
      EXPECT_LE(e, 1e-5) << "prompt " << b << " position " << first + i;
    }
  }
}

GeneratorOptions options(int64_t page_tokens, int64_t fast_bytes, int64_t window) {
  GeneratorOptions o;
  o.threads = 2;
  o.cache.page_tokens = page_tokens;
  o.cache.fast_bytes = fast_bytes;
  o.cache.window = window;
  return o;
}

TEST(Generate, AllFastAllHostMixedAndDiskAreExactAndIdentical) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 7, kSharpQK);
  const std::vector<Prompt> prompts = {packed_prompt(2000, 11, 3)};
  const int64_t page = 256, page_bytes = 2 * page * c.head_dim * 4;
  const int64_t pages = (2000 / page + 2) * c.layers * c.kv_heads;
  TempDir disk;
  struct Tiering {
    const char* name;
    GeneratorOptions opt;
  };
  std::vector<Tiering> cases;
  cases.push_back({"all fast", options(page, pages * page_bytes * 2, -1)});
  cases.push_back({"all host", options(page, 0, 0)});
  // The window (2 pages per layer and head) plus 3 more slots: pages compete by attention mass.
  cases.push_back({"mixed", options(page, (2 * c.layers * c.kv_heads + 3) * page_bytes, 64)});
  GeneratorOptions d = options(page, 0, 0);
  d.cache.host_bytes = 6 * page_bytes;  // most pages spill to the disk tier
  d.cache.disk_dir = disk.path();
  cases.push_back({"disk", d});
  std::vector<GenRun> runs;
  for (const auto& t : cases) {
    SCOPED_TRACE(t.name);
    runs.push_back(generate(c, be.get(), params, t.opt, prompts, 6));
    EXPECT_LE(runs.back().fast_peak, t.opt.cache.fast_bytes);
  }
  expect_exact(c, be.get(), params, runs[0], prompts);
  // Where a page lives never changes a bit of the result.
  for (size_t i = 1; i < runs.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    EXPECT_EQ(runs[i].logits, runs[0].logits);
  }
  // Each configuration computed where it said: fast only, host only, both, disk.
  EXPECT_EQ(runs[0].dstats.host_tasks, 0);
  EXPECT_EQ(runs[1].dstats.fast_tasks, 0);
  EXPECT_GT(runs[2].dstats.fast_tasks, 0);
  EXPECT_GT(runs[2].dstats.host_tasks, 0);
  EXPECT_GT(runs[2].stats.promotions, 2 * c.layers * c.kv_heads);
  EXPECT_GT(runs[3].dstats.disk_tasks, 0);
  EXPECT_GT(runs[3].stats.disk_pages, 0);
  // The disk tier's directory is gone with the generator.
  EXPECT_TRUE(fs::is_empty(disk.path()));
}

TEST(Generate, PromptLengthsOneToSixteenK) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 3, kSharpQK);
  for (int64_t t : {1024, 4096, 16384}) {
    SCOPED_TRACE(t);
    const std::vector<Prompt> prompts = {packed_prompt(t, 100 + t, 4)};
    const int64_t page = 1024, page_bytes = 2 * page * c.head_dim * 4;
    GeneratorOptions o = options(page, 12 * page_bytes, 512);  // mostly host, some promoted
    GenRun r = generate(c, be.get(), params, o, prompts, 3);
    expect_exact(c, be.get(), params, r, prompts);
    EXPECT_LE(r.fast_peak, o.cache.fast_bytes);
  }
}

TEST(Generate, PrefixSharingStoresThePrefixOnceAndStaysExact) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 5, kSharpQK);
  const int64_t page = 128;
  const Prompt prefix = packed_prompt(1024, 42, 2);  // 8 full pages
  for (int batch : {1, 3, 8}) {
    SCOPED_TRACE(batch);
    std::vector<Prompt> prompts;
    for (int b = 0; b < batch; ++b) {
      Prompt p = prefix;
      // Each prompt's own text continues the prefix's last document (its queries attend into
      // the shared pages).
      // The first prompt is the prefix alone: all its pages are shared, its first decoded token
      // opens a page of its own.
      Prompt tail = packed_prompt(b == 0 ? 0 : 40 + 37 * b, 1000 + b, 1);
      for (size_t i = 0; i < tail.ids.size(); ++i) {
        p.ids.push_back(tail.ids[i]);
        p.docs.push_back(prefix.docs.back());
      }
      prompts.push_back(p);
    }
    GeneratorOptions o = options(page, 0, 0);
    GenRun r = generate(c, be.get(), params, o, prompts, 3);
    expect_exact(c, be.get(), params, r, prompts);
    const int64_t prefix_pages = 1024 / page * c.layers * c.kv_heads;
    EXPECT_EQ(r.stats.shared_hits, (batch - 1) * prefix_pages);
    // Stored once: the prefix pages plus each sequence's own tail pages.
    const int64_t own = static_cast<int64_t>(batch) * c.layers * c.kv_heads *
                        ((40 + 37 * (batch - 1) + 3 + page - 1) / page + 1);
    EXPECT_LE(r.stats.pages, prefix_pages + own);
    if (batch > 1) {
      EXPECT_EQ(r.dstats.shared_tasks, 3 * prefix_pages);  // one task per prefix page per step
    }
  }
}

// Issue 31.8: the disk tier's page file has no name while in use (it used to stay behind after
// Ctrl-C, SIGTERM or a rank error), it is private (0600, seen through /proc/self/fd), and a full
// disk is an error naming ENOSPC instead of a SIGBUS at a store into the mapping.
TEST(Generate, DiskTierFileIsPrivateUnnamedAndReservesItsSpace) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 9, kSharpQK);
  TempDir disk;
  GeneratorOptions o = options(64, 0, 0);
  o.cache.host_bytes = 1;  // everything on disk
  o.cache.disk_dir = disk.path();
  {
    Generator g(c, params.data(), be.get(), o);
    std::vector<float> l;
    const Prompt p = packed_prompt(300, 1, 1);
    g.prefill(p.ids, p.docs, &l);
    EXPECT_GT(g.cache().stats().disk_pages, 0);
    // Nothing under disk_dir even now: a kill -9 here leaves nothing to clean up.
    EXPECT_TRUE(fs::is_empty(disk.path()));
    // The open page file: 0600, its blocks allocated (not sparse).
    bool found = false;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = fs::read_symlink(e.path(), ec).string();
      if (ec || target.rfind(disk.path(), 0) != 0) continue;
      struct stat st {};
      ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0600u);
      EXPECT_GE(st.st_blocks * 512, st.st_size);
      found = true;
    }
    EXPECT_TRUE(found);
  }
  EXPECT_TRUE(fs::is_empty(disk.path()));
  // A full disk: a 256 KiB tmpfs (needs root to mount; said and skipped otherwise).
  const std::string mnt = disk.path() + "/small";
  fs::create_directories(mnt);
  if (::geteuid() != 0 || ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0)
    GTEST_SKIP() << "the full-disk half needs root to mount a small tmpfs";
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  o.cache.disk_dir = mnt;
  Generator g(c, params.data(), be.get(), o);
  std::vector<float> l;
  const Prompt p = packed_prompt(2000, 1, 1);
  try {
    g.prefill(p.ids, p.docs, &l);
    ADD_FAILURE() << "a 256 KiB disk tier held " << g.cache().stats().disk_pages << " pages";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("ENOSPC"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(mnt), std::string::npos) << e.what();
  }
}

TEST(Generate, ConfigurationErrorsNameTheSetting) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 9, kSharpQK);
  {
    GeneratorOptions o = options(64, 64 * 16 * 4 * 2 * 3, 64);  // 3 slots: window needs 8
    Generator g(c, params.data(), be.get(), o);
    std::vector<float> l;
    const Prompt p = packed_prompt(100, 1, 1);
    const int s = g.prefill(p.ids, p.docs, &l);
    try {
      g.step({s}, {1}, &l);
      FAIL() << "expected an error";
    } catch (const GenerateError& e) {
      EXPECT_NE(std::string(e.what()).find("fast_bytes"), std::string::npos) << e.what();
    }
  }
  {
    GeneratorOptions o = options(64, 0, 0);
    o.cache.host_bytes = 1;  // no room, no disk tier
    Generator g(c, params.data(), be.get(), o);
    const Prompt p = packed_prompt(100, 1, 1);
    try {
      g.prefill(p.ids, p.docs, nullptr);
      FAIL() << "expected an error";
    } catch (const GenerateError& e) {
      EXPECT_NE(std::string(e.what()).find("host_bytes"), std::string::npos) << e.what();
    }
  }
  GeneratorOptions bad = options(8, 0, 0);
  EXPECT_THROW(Generator(c, params.data(), be.get(), bad), GenerateError);
  Generator g(c, params.data(), be.get(), options(64, 0, 0));
  EXPECT_THROW(g.prefill({1, 300}, {}, nullptr), GenerateError);
}

// The approximate mode against the exact one on a cache built by hand: 20 pages of weak keys and
// a last page of keys aligned with the queries. Skipped pages must exist, and for every head the
// softmax mass actually left out, 1 - exp(lse_approx - lse_exact), must be within the reported
// bound; the output moves by at most 2 x that mass x max |v|. Threshold 0 is the exact result.
TEST(Generate, ApproximateModeBoundsTheSkippedMass) {
  const int64_t hd = 16, heads = 2, kv_heads = 1, pt = 64, pages = 21;
  CacheConfig cc;
  cc.page_tokens = pt;
  cc.fast_bytes = 0;
  cc.window = 0;
  KvCache cache(cc, 1, static_cast<int>(kv_heads), hd);
  ThreadPool pool(2);
  DecodeAttention att(&cache, &pool, heads, kv_heads, hd);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(static_cast<size_t>(heads * hd));
  for (auto& x : q) x = nd(rng);
  std::vector<std::vector<PageId>> list(1);
  float vmax = 0;
  for (int64_t p = 0; p < pages; ++p) {
    const PageId id = cache.create(0, 0);
    list[0].push_back(id);
    for (int64_t r = 0; r < pt; ++r) {
      std::vector<float> k(static_cast<size_t>(hd)), v(static_cast<size_t>(hd));
      for (int64_t d = 0; d < hd; ++d) {
        // The last page: keys along the queries (large scores); the others weak.
        k[static_cast<size_t>(d)] = p == pages - 1 ? 5.f * (q[d] + q[hd + d]) + 0.1f * nd(rng)
                                                   : 0.2f * nd(rng);
        v[static_cast<size_t>(d)] = nd(rng);
        vmax = std::max(vmax, std::fabs(v[static_cast<size_t>(d)]));
      }
      cache.write_row(id, r, k.data(), v.data(), 0);
    }
  }
  std::vector<SeqView> views = {SeqView{&list, 0}};
  std::vector<float> o_exact(static_cast<size_t>(heads * hd)), l_exact(heads);
  std::vector<float> o_approx(o_exact.size()), l_approx(heads), bound(heads, -1.f);
  DecodeStats es, as;
  att.forward(views, q.data(), o_exact.data(), l_exact.data(), &es);
  att.forward(views, q.data(), o_approx.data(), l_approx.data(), &as, 1e-3, bound.data());
  EXPECT_EQ(es.skipped_tasks, 0);
  EXPECT_GT(as.skipped_tasks, 0);
  for (int64_t h = 0; h < heads; ++h) {
    const double left_out = 1.0 - std::exp(static_cast<double>(l_approx[h]) - l_exact[h]);
    EXPECT_GE(left_out, -1e-6) << h;
    EXPECT_LE(left_out, bound[h] + 1e-6) << h << " bound " << bound[h];
    EXPECT_LE(bound[h], 1e-3 * static_cast<double>(as.skipped_tasks)) << h;
    for (int64_t d = 0; d < hd; ++d)
      EXPECT_LE(std::fabs(o_exact[h * hd + d] - o_approx[h * hd + d]),
                2 * left_out * vmax + 1e-5);
  }
  std::vector<float> o_zero(o_exact.size()), l_zero(heads);
  att.forward(views, q.data(), o_zero.data(), l_zero.data(), nullptr, 0.0, nullptr);
  EXPECT_EQ(o_zero, o_exact);
  EXPECT_EQ(l_zero, l_exact);
}

// int8 host pages (opt-in, not exact): the next-token distributions of every generated position
// against the exact run on the same tokens, as KL(exact || int8) in nats; the host tier shrinks to
// about a quarter; and where an int8 page is read (fast copy or host) never changes a bit.
TEST(Generate, Int8HostPagesErrorAndSize) {
  auto be = cpu();
  const auto c = tiny_model_config();
  const auto params = tiny_params(c, be.get(), 13, kSharpQK);
  const std::vector<Prompt> prompts = {packed_prompt(2048, 17, 2)};
  const int64_t page = 128;
  GeneratorOptions exact = options(page, 0, 0);
  GeneratorOptions q8 = exact;
  q8.cache.host_int8 = true;
  GeneratorOptions q8fast = q8;
  q8fast.cache.fast_bytes = 1 << 30;  // every page promoted (dequantized copies)
  q8fast.cache.window = 128;
  const GenRun e = generate(c, be.get(), params, exact, prompts, 6);
  // The int8 runs decode the exact run's tokens (teacher-forced), so positions line up.
  auto forced = [&](const GeneratorOptions& o, CacheStats* cs) {
    Generator g(c, params.data(), be.get(), o);
    std::vector<float> all, l;
    const int s = g.prefill(prompts[0].ids, prompts[0].docs, &l);
    all = l;
    for (size_t i = prompts[0].ids.size(); i < e.full[0].ids.size(); ++i) {
      g.step({s}, {e.full[0].ids[i]}, &l);
      all.insert(all.end(), l.begin(), l.end());
    }
    *cs = g.cache().stats();
    return all;
  };
  CacheStats q8_stats, fast_stats;
  const std::vector<float> a = forced(q8, &q8_stats);
  const std::vector<float> b = forced(q8fast, &fast_stats);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), e.logits[0].size());
  double worst = 0, sum = 0;
  const int64_t rows = static_cast<int64_t>(a.size()) / c.vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = e.logits[0].data() + r * c.vocab;
    const float* y = a.data() + r * c.vocab;
    double mx = -INFINITY, my = -INFINITY, zx = 0, zy = 0;
    for (int64_t i = 0; i < c.vocab; ++i) {
      mx = std::max(mx, static_cast<double>(x[i]));
      my = std::max(my, static_cast<double>(y[i]));
    }
    for (int64_t i = 0; i < c.vocab; ++i) {
      zx += std::exp(x[i] - mx);
      zy += std::exp(y[i] - my);
    }
    double kl = 0;
    for (int64_t i = 0; i < c.vocab; ++i) {
      const double lp = x[i] - mx - std::log(zx), lq = y[i] - my - std::log(zy);
      kl += std::exp(lp) * (lp - lq);
    }
    worst = std::max(worst, kl);
    sum += kl;
  }
  std::printf("int8 host pages: KL(exact || int8) mean %.3g max %.3g nats over %lld positions; "
              "host bytes %lld vs exact %lld\n",
              sum / static_cast<double>(rows), worst, static_cast<long long>(rows),
              static_cast<long long>(q8_stats.host_bytes),
              static_cast<long long>(e.stats.host_bytes));
  EXPECT_LT(worst, 1e-3);
  EXPECT_GT(worst, 0.0);  // it is not exact
  // Full pages at ~0.29 of their fp32 size (scales included); the last page of each layer and
  // head stays fp32 while it is written.
  EXPECT_LT(q8_stats.host_bytes, e.stats.host_bytes * 35 / 100);
}

TEST(Sampling, GreedyTopPAndSeeds) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f};
  Sampler greedy(SamplingParams{}, 0);
  EXPECT_EQ(greedy.sample(logits.data(), 5), 1);  // first of the tied maxima
  // top_p tiny: only the most likely token (the first of the ties by id).
  Sampler nucleus(SamplingParams{1.0, 1e-6, 3}, 0);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(nucleus.sample(logits.data(), 5), 1);
  // Same seed and stream: same tokens; another seed: another sequence.
  auto draw = [&](uint64_t seed, uint64_t stream) {
    Sampler s(SamplingParams{1.0, 1.0, seed}, stream);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits.data(), 5));
    return out;
  };
  EXPECT_EQ(draw(5, 0), draw(5, 0));
  EXPECT_NE(draw(5, 0), draw(6, 0));
  EXPECT_NE(draw(5, 0), draw(5, 1));
  // Temperature 1: frequencies follow the softmax (20000 draws, within 0.02 absolute).
  Sampler s(SamplingParams{1.0, 1.0, 1}, 0);
  std::vector<int> count(5, 0);
  for (int i = 0; i < 20000; ++i) ++count[static_cast<size_t>(s.sample(logits.data(), 5))];
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(count[static_cast<size_t>(i)] / 20000.0, std::exp(logits[i]) / z, 0.02) << i;
  // top_p 0.5 keeps the two tied most likely tokens (mass 0.37 each) only.
  Sampler half(SamplingParams{1.0, 0.5, 2}, 0);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = half.sample(logits.data(), 5);
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
  EXPECT_THROW(Sampler(SamplingParams{-1.0, 1.0, 0}, 0), GenerateError);
  EXPECT_THROW(Sampler(SamplingParams{1.0, 0.0, 0}, 0), GenerateError);
}

}  // namespace
}  // namespace ring::gen
