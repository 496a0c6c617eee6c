// Generation in bf16 (docs/precision.md, docs/generation.md "bf16").
//
// The KV cache with bf16 pages: every tier (the fast pool in host memory, the host tier, the disk
// tier's mapped file, a fast pool in a backend's memory) holds exactly the bf16 of what was
// written (common/numeric/bf16.h's rounding, bit for bit), a promotion copies those bits, and the
// int8 option on top dequantizes to bf16 values (so its fast copy holds the same bits). A page is
// half the bytes of an fp32 one, measured on the host tier's count and the disk tier's file.
//
// The decode of a bf16 model (ModelConfig::dtype bf16: the prefill is the model's bf16 forward,
// the decode step makes the same rounding points) against a bf16 teacher-forced full forward
// (Model::forward, LocalAttention) over the same tokens. The two differ only in fp32 summation
// order (GEMMs of 1 row against T rows, paged partials merged by log-sum-exp against the flash
// kernel's tiles): at fp32 this is the 1e-5 of generate_test.cc. In bf16 each such fp32
// difference, where it straddles a bf16 rounding point (Q, K, V after RoPE, every GEMM input),
// becomes one bf16 ulp of that value, 2^-8 relative, instead of 2^-24. A flip is rare (its
// chance is about the fp32 difference over a bf16 ulp, ~1e-4 per value), and a logit is a sum
// over d_model of such inputs times the weights, so a position's logits move by at most about one
// bf16 ulp of the row's scale:
//   max_i |logit_i - ref_i| <= 2^-8 * max_i |ref_i|       per position
// and over all positions the mean is far below it: flips are rare, so it is asserted <= 2^-12.
// (Measured: worst 1.7e-7, mean 6.7e-8 here, no flip at all.) The mean bound would not
// hold for a run missing a rounding point: the bf16 teacher against the fp32 one is printed, and
// asserted to be above the mean bound (the test tells a bf16 run from an fp32 one).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/numeric/bf16.h"
#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"
#include "tests/generate/generate_ring_util.h"
#include "worker/generate/generator.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace ring::gen {
namespace {

namespace fs = std::filesystem;
using test::kSharpQK;
using test::tiny_model_config;
using test::tiny_params;

constexpr double kBf16Ulp = 1.0 / 256;  // 2^-8: one bf16 ulp, relative

std::unique_ptr<kernels::Backend> cpu(int threads = 2) {
  std::string err;
  auto b = kernels::create_backend("cpu", threads, &err);
  EXPECT_NE(b, nullptr) << err;
  return b;
}

model::ModelConfig config_of(spec::DType dtype) {
  model::ModelConfig c = tiny_model_config();
  c.dtype = dtype;
  return c;
}

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "ring-bf16-gen-XXXXXX").string();
    path_ = ::mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Values that exercise the rounding: ordinary ones, ties, values just off ties, subnormals,
// beyond the bf16 range.
std::vector<float> tricky_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    float x = nd(rng);
    switch (rng() % 8) {
      case 0:  // a tie: exactly half way between two bf16
        std::memcpy(&bits, &x, 4);
        bits = (bits & 0xffff0000u) | 0x8000u;
        std::memcpy(&x, &bits, 4);
        break;
      case 1:  // a subnormal
        x = std::ldexp(nd(rng), -130);
        break;
      case 2:  // just above the largest bf16: rounds to infinity
        x = 3.39e38f;
        break;
      default:
        break;
    }
    v[i] = x;
  }
  return v;
}

struct RowBits {
  std::vector<uint16_t> k, v;  // [tokens, head_dim] expected bf16 bits
};

// The page's stored K and V (filled rows) as bf16 bits, from where the CPU reads it.
RowBits stored(const KvCache& c, PageId id) {
  const int64_t n = c.page(id).tokens * c.head_dim();
  const auto* k = static_cast<const uint16_t*>(c.k_of(id));
  const auto* v = static_cast<const uint16_t*>(c.v_of(id));
  return {std::vector<uint16_t>(k, k + n), std::vector<uint16_t>(v, v + n)};
}

// Writes `rows` random rows to a new page of (0, head); returns the bits they must be stored as.
RowBits fill_page(KvCache& c, PageId id, int64_t rows, uint64_t seed) {
  const int64_t hd = c.head_dim();
  const std::vector<float> k = tricky_values(static_cast<size_t>(rows * hd), seed);
  const std::vector<float> v = tricky_values(static_cast<size_t>(rows * hd), seed + 1000);
  RowBits want;
  for (int64_t r = 0; r < rows; ++r) c.write_row(id, r, k.data() + r * hd, v.data() + r * hd, 0);
  for (float x : k) want.k.push_back(numeric::f32_to_bf16(x));
  for (float x : v) want.v.push_back(numeric::f32_to_bf16(x));
  return want;
}

TEST(KvCacheBf16, EveryTierHoldsTheRoundedValuesBitForBit) {
  TempDir disk;
  const int64_t hd = 32, pt = 64;
  CacheConfig cc;
  cc.page_tokens = pt;
  cc.dtype = kernels::DType::kBF16;
  cc.window = 0;
  const int64_t page_bytes = 2 * pt * hd * 2;
  cc.fast_bytes = 2 * page_bytes;
  cc.host_bytes = 3 * page_bytes;  // pages 3.. go to the disk tier
  cc.disk_dir = disk.path();
  KvCache c(cc, 1, 1, hd);
  EXPECT_EQ(c.page_bytes(), page_bytes);
  std::vector<PageId> ids;
  std::vector<RowBits> want;
  for (int p = 0; p < 6; ++p) {
    ids.push_back(c.create(0, 0));
    want.push_back(fill_page(c, ids.back(), p == 5 ? 17 : pt, 100 + p));  // the last partial
  }
  for (int p = 0; p < 6; ++p) {
    SCOPED_TRACE(p);
    EXPECT_EQ(c.tier_of(ids[p]), p < 3 ? Tier::kHost : Tier::kDisk);
    const RowBits got = stored(c, ids[p]);
    EXPECT_EQ(got.k, want[p].k);
    EXPECT_EQ(got.v, want[p].v);
  }
  // Promoted into the fast pool (one from each tier): the copy holds the same bits.
  c.place({ids[1], ids[4]});
  for (int p : {1, 4}) {
    SCOPED_TRACE(p);
    EXPECT_EQ(c.tier_of(ids[p]), Tier::kFast);
    const RowBits got = stored(c, ids[p]);
    EXPECT_EQ(got.k, want[p].k);
    EXPECT_EQ(got.v, want[p].v);
  }
  // A row written to a page with a fast copy goes to both.
  c.place({ids[5]});
  const RowBits more = fill_page(c, ids[5], pt, 900);  // rewrites rows 0.. and fills the page
  EXPECT_EQ(stored(c, ids[5]).k, more.k);
  c.place({});
  EXPECT_EQ(c.tier_of(ids[5]), Tier::kDisk);  // demoted: read back from its disk slot
  EXPECT_EQ(stored(c, ids[5]).k, more.k);
  EXPECT_EQ(stored(c, ids[5]).v, more.v);
  // The keys' bounds are the stored values' (what attention reads).
  const Page& pg = c.page(ids[0]);
  for (int64_t d = 0; d < hd; ++d) {
    float lo = INFINITY;
    for (int64_t t = 0; t < pt; ++t)
      lo = std::min(lo, numeric::bf16_to_f32(want[0].k[static_cast<size_t>(t * hd + d)]));
    EXPECT_EQ(pg.kmin[static_cast<size_t>(d)], lo) << d;
  }
}

TEST(KvCacheBf16, DeviceFastPoolHoldsTheSameBits) {
  auto dev = cpu();
  const int64_t hd = 16, pt = 32;
  CacheConfig cc;
  cc.page_tokens = pt;
  cc.dtype = kernels::DType::kBF16;
  cc.window = 0;
  cc.fast_bytes = 4 * 2 * pt * hd * 2;
  KvCache c(cc, 1, 1, hd, dev.get());
  ASSERT_TRUE(c.fast_on_device());
  std::vector<PageId> ids;
  std::vector<RowBits> want;
  for (int p = 0; p < 3; ++p) {
    ids.push_back(c.create(0, 0));
    want.push_back(fill_page(c, ids.back(), p == 2 ? 5 : pt, 300 + p));
  }
  c.place(ids);
  c.sync_fast();
  for (int p = 0; p < 3; ++p) {
    SCOPED_TRACE(p);
    const int64_t slot = c.page(ids[p]).fast_slot;
    ASSERT_GE(slot, 0);
    std::vector<uint16_t> pool(static_cast<size_t>(2 * pt * hd));
    ASSERT_EQ(dev->copy_to_host(pool.data(),
                                static_cast<const char*>(c.device_pool()) + slot * c.page_bytes(),
                                static_cast<size_t>(c.page_bytes())),
              kernels::Status::kOk);
    const size_t n = want[p].k.size();
    EXPECT_TRUE(std::equal(want[p].k.begin(), want[p].k.end(), pool.begin()));
    EXPECT_TRUE(std::equal(want[p].v.begin(), want[p].v.end(), pool.begin() + pt * hd));
    EXPECT_EQ(n, static_cast<size_t>(c.page(ids[p]).tokens * hd));
  }
}

// int8 on top of bf16: quantized from the page's bf16 values, dequantized to bf16 values, and a
// fast copy of the page holds those same bits (where it is read changes nothing).
TEST(KvCacheBf16, Int8PagesDequantizeToBf16ValuesInEveryTier) {
  const int64_t hd = 16, pt = 32;
  CacheConfig cc;
  cc.page_tokens = pt;
  cc.dtype = kernels::DType::kBF16;
  cc.host_int8 = true;
  cc.window = 0;
  cc.fast_bytes = 2 * 2 * pt * hd * 2;
  KvCache c(cc, 1, 1, hd);
  const PageId id = c.create(0, 0);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(static_cast<size_t>(pt * hd)), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (int64_t r = 0; r < pt; ++r) c.write_row(id, r, k.data() + r * hd, v.data() + r * hd, 0);
  c.seal(id, PageKey{1, 2});
  ASSERT_NE(c.page(id).q8, nullptr);
  ASSERT_TRUE(c.needs_dequant(id));
  std::vector<float> deq(static_cast<size_t>(2 * pt * hd));
  c.dequantize(id, deq.data());
  double worst = 0;
  for (size_t i = 0; i < deq.size(); ++i) {
    EXPECT_EQ(numeric::round_bf16(deq[i]), deq[i]) << i;  // a bf16 value
    const float ref = i < k.size() ? k[i] : v[i - k.size()];
    worst = std::max(worst, static_cast<double>(std::fabs(deq[i] - ref)));
  }
  EXPECT_LT(worst, 0.05);  // int8 of N(0, 1) values: a step of max|x| / 127 at most, plus bf16
  c.place({id});
  ASSERT_EQ(c.tier_of(id), Tier::kFast);
  ASSERT_FALSE(c.needs_dequant(id));
  const auto* fk = static_cast<const uint16_t*>(c.k_of(id));
  const auto* fv = static_cast<const uint16_t*>(c.v_of(id));
  for (int64_t i = 0; i < pt * hd; ++i) {
    EXPECT_EQ(fk[i], numeric::f32_to_bf16(deq[static_cast<size_t>(i)])) << i;
    EXPECT_EQ(fv[i], numeric::f32_to_bf16(deq[static_cast<size_t>(pt * hd + i)])) << i;
  }
}

// The cache's bytes per token: a bf16 page is half an fp32 one, in each tier, measured on the
// allocation itself (the host tier's count of its page buffers, the disk tier's file on disk).
TEST(KvCacheBf16, BytesPerTokenAreHalfOfFp32) {
  const int64_t hd = 32, pt = 64, pages = 6;
  struct Measured {
    int64_t page_bytes = 0, host_bytes = 0, disk_bytes = 0, file_bytes = 0, file_blocks = 0,
            fast_slots = 0;
  };
  auto measure = [&](kernels::DType dtype) {
    TempDir disk;
    CacheConfig cc;
    cc.page_tokens = pt;
    cc.dtype = dtype;
    cc.window = 0;
    cc.fast_bytes = 8 * 2 * pt * hd * 4;  // 8 fp32 pages' bytes
    cc.host_bytes = 3 * 2 * pt * hd * (dtype == kernels::DType::kBF16 ? 2 : 4);
    cc.disk_dir = disk.path();
    KvCache c(cc, 1, 1, hd);
    for (int p = 0; p < pages; ++p) fill_page(c, c.create(0, 0), pt, 50 + p);
    Measured m;
    m.page_bytes = c.page_bytes();
    const CacheStats s = c.stats();
    EXPECT_EQ(s.host_pages, 3);
    EXPECT_EQ(s.disk_pages, 3);
    m.host_bytes = s.host_bytes;
    m.disk_bytes = s.disk_bytes;
    m.fast_slots = c.fast_slots();
    // The disk tier's open file (unnamed, under disk_dir): its size and its blocks on disk.
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = fs::read_symlink(e.path(), ec).string();
      if (ec || target.rfind(disk.path(), 0) != 0) continue;
      struct stat st {};
      EXPECT_EQ(::stat(e.path().c_str(), &st), 0);
      m.file_bytes += st.st_size;
      m.file_blocks += st.st_blocks * 512;
    }
    return m;
  };
  const Measured f = measure(kernels::DType::kF32), b = measure(kernels::DType::kBF16);
  std::printf("per page (64 tokens x 32 x K,V): fp32 %lld bytes, bf16 %lld; host tier %lld vs "
              "%lld; disk file %lld vs %lld bytes (%lld vs %lld allocated)\n",
              static_cast<long long>(f.page_bytes), static_cast<long long>(b.page_bytes),
              static_cast<long long>(f.host_bytes), static_cast<long long>(b.host_bytes),
              static_cast<long long>(f.file_bytes), static_cast<long long>(b.file_bytes),
              static_cast<long long>(f.file_blocks), static_cast<long long>(b.file_blocks));
  EXPECT_EQ(f.page_bytes, 2 * pt * hd * 4);
  EXPECT_EQ(2 * b.page_bytes, f.page_bytes);
  EXPECT_EQ(2 * b.host_bytes, f.host_bytes);
  EXPECT_EQ(2 * b.disk_bytes, f.disk_bytes);
  EXPECT_EQ(f.file_bytes, f.disk_bytes);
  EXPECT_EQ(b.file_bytes, b.disk_bytes);
  EXPECT_EQ(2 * b.file_blocks, f.file_blocks);
  EXPECT_EQ(b.fast_slots, 2 * f.fast_slots);  // the same fast_bytes hold twice the pages
}

// ---- generation ----------------------------------------------------------------------------

using test::argmax;
using test::packed_prompt;
using test::Prompt;
using test::rel_err;
using test::teacher;

struct GenRun {
  std::vector<float> logits;  // rows of vocab: the prompt's last token, then each step
  Prompt full;                // prompt + generated tokens
  CacheStats stats;
  DecodeStats dstats;
};

GenRun generate(const model::ModelConfig& c, kernels::Backend* be,
                const std::vector<float>& params, const GeneratorOptions& opt, const Prompt& p,
                int steps) {
  Generator g(c, params.data(), be, opt);
  GenRun r;
  r.full = p;
  const int s = g.prefill(p.ids, p.docs, &r.logits);
  int32_t next = argmax(r.logits.data(), c.vocab);
  for (int i = 0; i < steps; ++i) {
    std::vector<float> l;
    g.step({s}, {next}, &l);
    r.full.ids.push_back(next);
    r.full.docs.push_back(r.full.docs.back());
    r.logits.insert(r.logits.end(), l.begin(), l.end());
    next = argmax(l.data(), c.vocab);
  }
  r.stats = g.cache().stats();
  r.dstats = g.decode_stats();
  EXPECT_EQ(g.cache().dtype(),
            c.dtype == spec::DType::kBf16 ? kernels::DType::kBF16 : kernels::DType::kF32);
  return r;
}

// Each position of r against the teacher of its tokens: the worst and the mean relative error.
std::pair<double, double> against_teacher(const model::ModelConfig& c, kernels::Backend* be,
                                          const std::vector<float>& params, const GenRun& r,
                                          size_t prompt_tokens) {
  const std::vector<float> ref = teacher(c, be, params, r.full);
  const int64_t rows = static_cast<int64_t>(r.logits.size()) / c.vocab;
  const int64_t first = static_cast<int64_t>(prompt_tokens) - 1;
  double worst = 0, sum = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const double e =
        rel_err(r.logits.data() + i * c.vocab, ref.data() + (first + i) * c.vocab, c.vocab);
    worst = std::max(worst, e);
    sum += e;
  }
  return {worst, sum / static_cast<double>(rows)};
}

GeneratorOptions options(int64_t page_tokens, int64_t fast_bytes, int64_t window) {
  GeneratorOptions o;
  o.threads = 2;
  o.cache.page_tokens = page_tokens;
  o.cache.fast_bytes = fast_bytes;
  o.cache.window = window;
  return o;
}

TEST(GenerateBf16, DecodeFollowsTheBf16TeacherInEveryTierLayout) {
  auto be = cpu();
  const model::ModelConfig c = config_of(spec::DType::kBf16);
  const std::vector<float> params = tiny_params(c, be.get(), 7, kSharpQK);
  const Prompt prompt = packed_prompt(1500, 11, 3);
  const int steps = 24;
  const int64_t page = 128, page_bytes = 2 * page * c.head_dim * 2;  // bf16 pages
  const int64_t pages = (1500 / page + 2) * c.layers * c.kv_heads;
  TempDir disk;
  std::vector<std::pair<std::string, GeneratorOptions>> cases;
  cases.push_back({"all fast", options(page, 2 * pages * page_bytes, -1)});
  cases.push_back({"all host", options(page, 0, 0)});
  cases.push_back({"mixed", options(page, (2 * c.layers * c.kv_heads + 3) * page_bytes, 64)});
  GeneratorOptions d = options(page, 0, 0);
  d.cache.host_bytes = 6 * page_bytes;
  d.cache.disk_dir = disk.path();
  cases.push_back({"disk", d});
  std::vector<GenRun> runs;
  for (const auto& [name, o] : cases) {
    SCOPED_TRACE(name);
    runs.push_back(generate(c, be.get(), params, o, prompt, steps));
  }
  // Where a page lives never changes a bit: bf16 pages are read back exactly from every tier.
  for (size_t i = 1; i < runs.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    EXPECT_EQ(runs[i].logits, runs[0].logits);
  }
  EXPECT_EQ(runs[1].dstats.fast_tasks, 0);
  EXPECT_GT(runs[2].dstats.fast_tasks, 0);
  EXPECT_GT(runs[2].dstats.host_tasks, 0);
  EXPECT_GT(runs[3].dstats.disk_tasks, 0);
  EXPECT_TRUE(fs::is_empty(disk.path()));
  // Against the bf16 teacher-forced forward (the bound in the header comment).
  const auto [worst, mean] = against_teacher(c, be.get(), params, runs[0], prompt.ids.size());
  // The bf16 teacher against the fp32 one on the same tokens (what a run missing the rounding
  // points would look like).
  const model::ModelConfig f = config_of(spec::DType::kFp32);
  const std::vector<float> ref16 = teacher(c, be.get(), params, runs[0].full);
  const std::vector<float> ref32 = teacher(f, be.get(), params, runs[0].full);
  double apart = 0;
  const int64_t first = static_cast<int64_t>(prompt.ids.size()) - 1;
  for (int64_t i = 0; i <= steps; ++i)
    apart += rel_err(ref16.data() + (first + i) * c.vocab, ref32.data() + (first + i) * c.vocab,
                     c.vocab) / (steps + 1);
  std::printf("bf16 decode vs bf16 teacher: worst %.3g, mean %.3g relative (bound %.3g, mean "
              "bound %.3g); bf16 teacher vs fp32 teacher: mean %.3g\n",
              worst, mean, kBf16Ulp, kBf16Ulp / 16, apart);
  EXPECT_LE(worst, kBf16Ulp);
  EXPECT_LE(mean, kBf16Ulp / 16);
  EXPECT_GT(apart, kBf16Ulp / 16);  // an fp32 run would fail the mean bound
  // Greedy: every generated token is the teacher's argmax at its position.
  for (int64_t i = 0; i < steps; ++i)
    EXPECT_EQ(runs[0].full.ids[static_cast<size_t>(first + 1 + i)],
              argmax(ref16.data() + (first + i) * c.vocab, c.vocab))
        << "position " << first + 1 + i;
}

// The fast tier in a backend's memory (the device tier's code path on the cpu backend): its
// paged decode kernel reads the bf16 pool; the same tokens as the host pool, logits within the
// bound of the header comment.
TEST(GenerateBf16, DeviceFastTierReadsBf16Pages) {
  auto be = cpu();
  const model::ModelConfig c = config_of(spec::DType::kBf16);
  const std::vector<float> params = tiny_params(c, be.get(), 5, kSharpQK);
  const Prompt prompt = packed_prompt(700, 3, 2);
  const int64_t page = 64, page_bytes = 2 * page * c.head_dim * 2;
  GeneratorOptions host = options(page, (2 * c.layers * c.kv_heads + 4) * page_bytes, 32);
  GeneratorOptions dev = host;
  dev.fast_on_backend = true;
  const GenRun a = generate(c, be.get(), params, host, prompt, 12);
  const GenRun b = generate(c, be.get(), params, dev, prompt, 12);
  EXPECT_TRUE(b.stats.fast_on_device);
  EXPECT_GT(b.dstats.device_rows, 0);
  EXPECT_EQ(a.full.ids, b.full.ids);
  const int64_t rows = static_cast<int64_t>(a.logits.size()) / c.vocab;
  for (int64_t i = 0; i < rows; ++i)
    EXPECT_LE(rel_err(b.logits.data() + i * c.vocab, a.logits.data() + i * c.vocab, c.vocab),
              kBf16Ulp)
        << "row " << i;
  const auto [worst, mean] = against_teacher(c, be.get(), params, b, prompt.ids.size());
  EXPECT_LE(worst, kBf16Ulp);
  EXPECT_LE(mean, kBf16Ulp / 16);
}

// A whole generation's cache: the same prompt and tokens in an fp32 and a bf16 model, all pages in
// the host tier: half the bytes, page for page.
TEST(GenerateBf16, CacheOfAGenerationIsHalfTheFp32One) {
  auto be = cpu();
  const Prompt prompt = packed_prompt(1000, 21, 2);
  auto run = [&](spec::DType dt) {
    const model::ModelConfig c = config_of(dt);
    const std::vector<float> params = tiny_params(c, be.get(), 9, kSharpQK);
    return generate(c, be.get(), params, options(64, 0, 0), prompt, 8);
  };
  const GenRun f = run(spec::DType::kFp32), b = run(spec::DType::kBf16);
  EXPECT_EQ(f.stats.pages, b.stats.pages);
  EXPECT_EQ(2 * b.stats.host_bytes, f.stats.host_bytes);
  EXPECT_EQ(2 * b.dstats.kv_bytes, f.dstats.kv_bytes);  // and half the bytes read per step
  std::printf("1008 tokens: host tier fp32 %lld bytes, bf16 %lld\n",
              static_cast<long long>(f.stats.host_bytes),
              static_cast<long long>(b.stats.host_bytes));
}

TEST(GenerateBf16, Fp16IsRefusedNamingTheKey) {
  auto be = cpu();
  model::ModelConfig c = config_of(spec::DType::kFp32);
  const std::vector<float> params = tiny_params(c, be.get(), 9, kSharpQK);
  c.dtype = spec::DType::kFp16;
  try {
    Generator g(c, params.data(), be.get(), options(64, 0, 0));
    FAIL() << "fp16 accepted";
  } catch (const GenerateError& e) {
    EXPECT_NE(std::string(e.what()).find("model.dtype fp16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ring::gen
