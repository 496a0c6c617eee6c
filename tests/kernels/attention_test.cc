// CPU attention kernels (kernels/cpu/attention.h) against
//   - the scalar double-accumulating reference (kernels/reference/attention_ref.h),
//   - PyTorch 1.13 autograd on an explicit masked softmax in float64
//     (tests/kernels/torch_attention.py, run through /usr/bin/python3),
//   - finite differences of the kernel's own forward.
// Inputs are random (fixed seeds); nothing is compared with hard-coded expected numbers.
//
// Tolerances (fp32 kernel vs an fp64 oracle), per element:
//   |got - want| <= rel * |want| + abs * max|want|   (max over the finite entries of the tensor)
//   out, dq, dk, dv, delta: rel 1e-4, abs 1e-5;  lse: rel 1e-5, abs 1e-5.
// -inf must match -inf exactly (empty rows) and NaN never passes.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/reference/attention_ref.h"

namespace ring::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Tol {
  double rel, abs;
};
constexpr Tol kTolOut{1e-4, 1e-5};
constexpr Tol kTolLse{1e-5, 1e-5};
constexpr Tol kTolGrad{1e-4, 1e-5};

::testing::AssertionResult all_close(const char* name, const std::vector<float>& got,
                                     const std::vector<float>& want, Tol tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << name << ": size " << got.size() << " vs " << want.size();
  }
  double scale = 0;
  for (float w : want) {
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  }
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    bool ok;
    if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;
    } else {
      const double err = std::fabs(g - w);
      ok = err <= tol.rel * std::fabs(w) + tol.abs * scale;  // false for NaN
      if (std::isfinite(err))
        worst = std::max(worst, err / (tol.rel * std::fabs(w) + tol.abs * scale + 1e-300));
    }
    if (!ok) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << bad << " of " << got.size() << " elements out of tolerance (rel "
         << tol.rel << ", abs " << tol.abs << " x max|want| = " << scale << "); first at " << first
         << ": got " << got[first] << ", want " << want[first] << "; worst err/tol " << worst;
}

// ---- problems -----------------------------------------------------------------------------
enum class PosMode {
  kShifted,  // q positions [q0, q0 + q_len), k positions [k0, k0 + kv_len), random offsets
  kZigzag,   // both blocks are zigzag rank blocks (chunks r and 2P-1-r) of one sequence
};

struct Problem {
  int64_t q_len = 0, kv_len = 0, heads = 1, kv_heads = 1, hd = 1;
  bool causal = true;
  float scale = 1;
  std::vector<float> q, k, v, dout;
  std::vector<int64_t> q_pos, k_pos;
  std::vector<int32_t> q_doc, k_doc;  // empty: no document mask

  AttentionArgs args() const {
    AttentionArgs a;
    a.q_len = q_len;
    a.kv_len = kv_len;
    a.heads = heads;
    a.kv_heads = kv_heads;
    a.head_dim = hd;
    a.scale = scale;
    a.causal = causal;
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.q_pos = q_pos.data();
    a.k_pos = k_pos.data();
    a.q_doc = q_doc.empty() ? nullptr : q_doc.data();
    a.k_doc = k_doc.empty() ? nullptr : k_doc.data();
    return a;
  }
  int64_t q_elems() const { return q_len * heads * hd; }
  int64_t kv_elems() const { return kv_len * kv_heads * hd; }
};

std::vector<float> random_vec(std::mt19937_64& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& e : x) e = u(rng);
  return x;
}

// Document id of every global position in [0, n): packed documents with random lengths in
// [1, max_len].
std::vector<int32_t> random_docs(std::mt19937_64& rng, int64_t n, int64_t max_len) {
  std::vector<int32_t> doc(n);
  std::uniform_int_distribution<int64_t> len(1, max_len);
  int32_t id = 0;
  for (int64_t p = 0; p < n;) {
    const int64_t l = len(rng);
    for (int64_t e = p; e < std::min(n, p + l); ++e) doc[e] = id;
    p += l;
    ++id;
  }
  return doc;
}

struct Shape {
  int64_t q_len, kv_len, heads, kv_heads, hd;
  bool causal, docs;
  PosMode mode;
};

Problem make_problem(std::mt19937_64& rng, const Shape& s, float logit_gain = 1.f) {
  Problem p;
  p.q_len = s.q_len;
  p.kv_len = s.kv_len;
  p.heads = s.heads;
  p.kv_heads = s.kv_heads;
  p.hd = s.hd;
  p.causal = s.causal;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  // logit_gain widens the score range (sharper softmax) to stress the online rescaling.
  p.q = random_vec(rng, p.q_elems(), -logit_gain, logit_gain);
  p.k = random_vec(rng, p.kv_elems(), -1.f, 1.f);
  p.v = random_vec(rng, p.kv_elems(), -1.f, 1.f);
  p.dout = random_vec(rng, p.q_elems(), -1.f, 1.f);
  int64_t global = 0;
  if (s.mode == PosMode::kShifted) {
    // A window of the sequence that contains both blocks; keys may start before, inside or
    // after the queries, so some rows see all, some part, some none of the block.
    std::uniform_int_distribution<int64_t> off(0, s.q_len + s.kv_len);
    const int64_t q0 = off(rng), k0 = off(rng);
    for (int64_t i = 0; i < s.q_len; ++i) p.q_pos.push_back(q0 + i);
    for (int64_t j = 0; j < s.kv_len; ++j) p.k_pos.push_back(k0 + j);
    global = 2 * (s.q_len + s.kv_len) + 1;
  } else {
    // P ranks, 2P chunks of c tokens; rank r holds chunks r and 2P-1-r (DESIGN.md).
    EXPECT_EQ(s.q_len, s.kv_len);
    EXPECT_EQ(s.q_len % 2, 0);
    const int64_t c = s.q_len / 2, ranks = 3;
    std::uniform_int_distribution<int64_t> rank(0, ranks - 1);
    const int64_t rq = rank(rng), rk = rank(rng);
    const auto block = [&](int64_t r, std::vector<int64_t>& pos) {
      for (int64_t chunk : {r, 2 * ranks - 1 - r}) {
        for (int64_t t = 0; t < c; ++t) pos.push_back(chunk * c + t);
      }
    };
    block(rq, p.q_pos);
    block(rk, p.k_pos);
    global = 2 * ranks * c;
  }
  if (s.docs) {
    const std::vector<int32_t> doc = random_docs(rng, global, std::max<int64_t>(2, global / 5));
    for (int64_t x : p.q_pos) p.q_doc.push_back(doc[x]);
    for (int64_t x : p.k_pos) p.k_doc.push_back(doc[x]);
  }
  return p;
}

struct Fwd {
  std::vector<float> out, lse;
  AttentionStats stats;
};

Fwd cpu_forward(const Problem& p, int threads) {
  Fwd f;
  f.out.assign(p.q_elems(), std::nanf(""));  // every element must be written
  f.lse.assign(p.q_len * p.heads, std::nanf(""));
  EXPECT_EQ(cpu::attention_forward(p.args(), f.out.data(), f.lse.data(), &f.stats, threads),
            Status::kOk);
  return f;
}

Fwd ref_forward(const Problem& p) {
  Fwd f;
  f.out.assign(p.q_elems(), std::nanf(""));
  f.lse.assign(p.q_len * p.heads, std::nanf(""));
  EXPECT_EQ(ref::attention_forward(p.args(), f.out.data(), f.lse.data()), Status::kOk);
  return f;
}

struct Grads {
  std::vector<float> dq, dk, dv;
  AttentionStats stats;
};

// Gradients accumulated on top of `prior` (the contract is +=).
Grads cpu_backward(const Problem& p, const std::vector<float>& lse, const std::vector<float>& delta,
                   const Grads& prior, int threads) {
  Grads g = prior;
  g.stats = {};
  EXPECT_EQ(cpu::attention_backward(p.args(), p.dout.data(), lse.data(), delta.data(), g.dq.data(),
                                    g.dk.data(), g.dv.data(), &g.stats, threads),
            Status::kOk);
  return g;
}

Grads ref_backward(const Problem& p, const std::vector<float>& lse, const std::vector<float>& delta,
                   const Grads& prior) {
  Grads g = prior;
  EXPECT_EQ(ref::attention_backward(p.args(), p.dout.data(), lse.data(), delta.data(), g.dq.data(),
                                    g.dk.data(), g.dv.data()),
            Status::kOk);
  return g;
}

Grads zero_grads(const Problem& p) {
  return Grads{std::vector<float>(p.q_elems(), 0.f),
               std::vector<float>(p.kv_elems(), 0.f),
               std::vector<float>(p.kv_elems(), 0.f),
               {}};
}

std::vector<float> ref_delta(const Problem& p, const std::vector<float>& out) {
  std::vector<float> delta(p.q_len * p.heads);
  EXPECT_EQ(ref::attention_backward_prepare(DType::kF32, p.q_len, p.heads, p.hd, out.data(),
                                            p.dout.data(), delta.data()),
            Status::kOk);
  return delta;
}

std::string describe(const Shape& s) {
  std::ostringstream o;
  o << "q_len " << s.q_len << " kv_len " << s.kv_len << " heads " << s.heads << "/" << s.kv_heads
    << " hd " << s.hd << (s.causal ? " causal" : " full") << (s.docs ? " docs" : "")
    << (s.mode == PosMode::kZigzag ? " zigzag" : " shifted");
  return o.str();
}

// Odd lengths (not multiples of the 64-key or 16..64-query tiles), q_len != kv_len, GQA groups
// 1..16, head_dim from 1 to 128 (not multiples of the vector width), all mask kinds.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {1, 1, 1, 1, 1, false, false, PosMode::kShifted},
      {7, 13, 2, 1, 5, true, false, PosMode::kShifted},
      {64, 64, 4, 4, 64, true, false, PosMode::kShifted},
      {65, 130, 4, 2, 64, true, true, PosMode::kShifted},
      {200, 77, 8, 2, 128, false, true, PosMode::kShifted},
      {140, 140, 6, 3, 80, true, false, PosMode::kZigzag},
      {96, 96, 16, 1, 32, true, true, PosMode::kZigzag},
      {33, 257, 3, 3, 24, true, true, PosMode::kShifted},
      {258, 258, 2, 2, 128, true, true, PosMode::kZigzag},
      {50, 190, 32, 2, 17, false, false, PosMode::kShifted},
      {129, 65, 4, 1, 3, true, true, PosMode::kShifted},
      {180, 180, 2, 1, 100, true, false, PosMode::kZigzag},
  };
  return s;
}

// ---- forward and backward against the reference -------------------------------------------
TEST(AttentionCpu, MatchesReferenceOnRandomShapes) {
  std::mt19937_64 rng(1234);
  int idx = 0;
  for (const Shape& s : shapes()) {
    for (float gain : {1.f, 6.f}) {
      SCOPED_TRACE(describe(s) + " gain " + std::to_string(gain));
      const int threads = 1 + idx++ % 3;
      const Problem p = make_problem(rng, s, gain);
      const Fwd got = cpu_forward(p, threads);
      const Fwd want = ref_forward(p);
      EXPECT_TRUE(all_close("out", got.out, want.out, kTolOut));
      EXPECT_TRUE(all_close("lse", got.lse, want.lse, kTolLse));

      // delta: the CPU prepare vs the reference prepare on the same (reference) output.
      std::vector<float> delta(p.q_len * p.heads);
      ASSERT_EQ(
          cpu::attention_backward_prepare(DType::kF32, p.q_len, p.heads, p.hd, want.out.data(),
                                          p.dout.data(), delta.data(), threads),
          Status::kOk);
      const std::vector<float> delta_ref = ref_delta(p, want.out);
      EXPECT_TRUE(all_close("delta", delta, delta_ref, kTolGrad));

      // Random prior gradients check accumulation (+=) rather than overwrite.
      Grads prior{random_vec(rng, p.q_elems(), -1, 1),
                  random_vec(rng, p.kv_elems(), -1, 1),
                  random_vec(rng, p.kv_elems(), -1, 1),
                  {}};
      const Grads g = cpu_backward(p, want.lse, delta_ref, prior, threads);
      const Grads r = ref_backward(p, want.lse, delta_ref, prior);
      // Compare the increments, so the tolerance is relative to the gradient, not the prior.
      const auto diff = [](std::vector<float> a, const std::vector<float>& b) {
        for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
        return a;
      };
      EXPECT_TRUE(all_close("dq", diff(g.dq, prior.dq), diff(r.dq, prior.dq), kTolGrad));
      EXPECT_TRUE(all_close("dk", diff(g.dk, prior.dk), diff(r.dk, prior.dk), kTolGrad));
      EXPECT_TRUE(all_close("dv", diff(g.dv, prior.dv), diff(r.dv, prior.dv), kTolGrad));

      // Tile accounting: the backward skips exactly the tiles the forward skips.
      EXPECT_GT(got.stats.tiles_total, 0);
      EXPECT_EQ(g.stats.tiles_total, got.stats.tiles_total);
      EXPECT_EQ(g.stats.tiles_skipped, got.stats.tiles_skipped);
      EXPECT_EQ(g.stats.tiles_masked, got.stats.tiles_masked);
      EXPECT_DOUBLE_EQ(g.stats.flops, got.stats.flops * 10.0 / 4.0);
      if (!s.causal && !s.docs) {
        EXPECT_EQ(got.stats.tiles_skipped, 0);
        EXPECT_DOUBLE_EQ(got.stats.flops, 4.0 * s.q_len * s.kv_len * s.hd * s.heads);
      }
    }
  }
}

// The causal diagonal block of a long sequence: about half the tiles are skipped, and the
// counted FLOPs are those of the computed tiles only.
TEST(AttentionCpu, CausalSkipsTilesAboveTheDiagonal) {
  std::mt19937_64 rng(7);
  Problem p = make_problem(rng, {512, 512, 2, 2, 32, true, false, PosMode::kShifted});
  for (int64_t i = 0; i < 512; ++i) p.q_pos[i] = p.k_pos[i] = 1000 + i;
  const Fwd f = cpu_forward(p, 2);
  EXPECT_TRUE(all_close("out", f.out, ref_forward(p).out, kTolOut));
  const double dense = 4.0 * 512 * 512 * 32 * 2;
  EXPECT_GT(f.stats.tiles_skipped, f.stats.tiles_total / 3);
  EXPECT_GT(f.stats.tiles_masked, 0);
  EXPECT_LT(f.stats.flops, 0.7 * dense);
  EXPECT_GT(f.stats.flops, 0.4 * dense);
}

// ---- fully masked blocks ------------------------------------------------------------------
void expect_empty_block(Problem p) {
  const Fwd f = cpu_forward(p, 2);
  for (float x : f.out) ASSERT_EQ(x, 0.f);
  for (float x : f.lse) ASSERT_EQ(x, -kInf);
  EXPECT_EQ(f.stats.tiles_skipped, f.stats.tiles_total);
  EXPECT_EQ(f.stats.flops, 0.0);
  const Fwd r = ref_forward(p);
  EXPECT_TRUE(all_close("out", f.out, r.out, kTolOut));
  EXPECT_TRUE(all_close("lse", f.lse, r.lse, kTolLse));
  // Backward with an lse of -inf (rows that attend nothing anywhere) adds nothing.
  std::mt19937_64 rng(5);
  Grads prior{random_vec(rng, p.q_elems(), -1, 1),
              random_vec(rng, p.kv_elems(), -1, 1),
              random_vec(rng, p.kv_elems(), -1, 1),
              {}};
  const std::vector<float> delta(p.q_len * p.heads, 0.3f);
  const Grads g = cpu_backward(p, f.lse, delta, prior, 2);
  EXPECT_EQ(g.dq, prior.dq);
  EXPECT_EQ(g.dk, prior.dk);
  EXPECT_EQ(g.dv, prior.dv);
  EXPECT_EQ(g.stats.tiles_skipped, g.stats.tiles_total);
}

TEST(AttentionCpu, FullyMaskedBlocksGiveEmptyPartials) {
  std::mt19937_64 rng(99);
  {
    SCOPED_TRACE("causal: every key after every query");
    Problem p = make_problem(rng, {100, 150, 4, 2, 40, true, false, PosMode::kShifted});
    for (int64_t i = 0; i < p.q_len; ++i) p.q_pos[i] = i;
    for (int64_t j = 0; j < p.kv_len; ++j) p.k_pos[j] = 100 + j;
    expect_empty_block(p);
  }
  {
    SCOPED_TRACE("documents: no shared document");
    Problem p = make_problem(rng, {70, 90, 2, 2, 16, false, true, PosMode::kShifted});
    for (auto& d : p.q_doc) d = 3 + (&d - p.q_doc.data()) % 2;  // docs 3, 4
    for (auto& d : p.k_doc) d = 7 + (&d - p.k_doc.data()) % 3;  // docs 7, 8, 9
    expect_empty_block(p);
  }
  {
    SCOPED_TRACE("documents interleaved within tiles: min/max overlap, exact mask empty");
    Problem p = make_problem(rng, {70, 90, 2, 1, 16, false, true, PosMode::kShifted});
    for (size_t i = 0; i < p.q_doc.size(); ++i) p.q_doc[i] = 2 * static_cast<int32_t>(i % 5);
    for (size_t j = 0; j < p.k_doc.size(); ++j) p.k_doc[j] = 2 * static_cast<int32_t>(j % 5) + 1;
    expect_empty_block(p);
  }
  {
    SCOPED_TRACE("zero keys");
    Problem p = make_problem(rng, {33, 1, 2, 2, 8, true, false, PosMode::kShifted});
    p.kv_len = 0;
    p.k.clear();
    p.v.clear();
    p.k_pos.clear();
    const Fwd f = cpu_forward(p, 1);
    for (float x : f.out) ASSERT_EQ(x, 0.f);
    for (float x : f.lse) ASSERT_EQ(x, -kInf);
  }
}

// Some rows of a block see keys, others none: the empty rows are exactly (0, -inf).
TEST(AttentionCpu, PartlyMaskedRows) {
  std::mt19937_64 rng(11);
  Problem p = make_problem(rng, {90, 70, 4, 4, 32, true, false, PosMode::kShifted});
  for (int64_t i = 0; i < p.q_len; ++i) p.q_pos[i] = 10 + i;  // rows 0..39 precede all keys
  for (int64_t j = 0; j < p.kv_len; ++j) p.k_pos[j] = 50 + j;
  const Fwd f = cpu_forward(p, 2);
  const Fwd r = ref_forward(p);
  EXPECT_TRUE(all_close("out", f.out, r.out, kTolOut));
  EXPECT_TRUE(all_close("lse", f.lse, r.lse, kTolLse));
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(f.lse[i * p.heads], -kInf) << i;
  for (int64_t i = 40; i < 90; ++i) EXPECT_TRUE(std::isfinite(f.lse[i * p.heads])) << i;
}

// ---- merge --------------------------------------------------------------------------------
TEST(AttentionCpu, MergeHandlesEmptyAndExtremePartials) {
  const int64_t heads = 1, hd = 4;
  // rows: (a, b) = (-inf, -inf), (-inf, 2), (3, -inf), (100, -100), (-100, 100), (5, 5), (0, 1e-3)
  const std::vector<float> la = {-kInf, -kInf, 3, 100, -100, 5, 0};
  const std::vector<float> lb = {-kInf, 2, -kInf, -100, 100, 5, 1e-3f};
  const int64_t tokens = static_cast<int64_t>(la.size());
  std::mt19937_64 rng(3);
  std::vector<float> oa = random_vec(rng, tokens * hd, -1, 1);
  std::vector<float> ob = random_vec(rng, tokens * hd, -1, 1);
  for (int x = 0; x < hd; ++x) oa[x] = 0.f;  // empty partials carry out = 0
  for (int x = 0; x < hd; ++x) ob[x] = 0.f;
  for (int x = 0; x < hd; ++x) oa[hd + x] = 0.f;
  for (int x = 0; x < hd; ++x) ob[2 * hd + x] = 0.f;
  std::vector<float> got_o = oa, got_l = la, want_o = oa, want_l = la;
  ASSERT_EQ(
      cpu::attention_merge(tokens, heads, hd, got_o.data(), got_l.data(), ob.data(), lb.data(), 2),
      Status::kOk);
  ASSERT_EQ(
      ref::attention_merge(tokens, heads, hd, want_o.data(), want_l.data(), ob.data(), lb.data()),
      Status::kOk);
  for (float x : got_o) ASSERT_FALSE(std::isnan(x));
  for (float x : got_l) ASSERT_FALSE(std::isnan(x));
  EXPECT_TRUE(all_close("out", got_o, want_o, kTolOut));
  EXPECT_TRUE(all_close("lse", got_l, want_l, kTolLse));
  EXPECT_EQ(got_l[0], -kInf);
  for (int x = 0; x < hd; ++x) EXPECT_EQ(got_o[x], 0.f);
  for (int x = 0; x < hd; ++x) EXPECT_EQ(got_o[hd + x], ob[hd + x]);          // takes b
  for (int x = 0; x < hd; ++x) EXPECT_EQ(got_o[2 * hd + x], oa[2 * hd + x]);  // keeps a
  EXPECT_EQ(got_l[1], 2.f);
  EXPECT_EQ(got_l[2], 3.f);
  EXPECT_NEAR(got_l[5], 5.f + std::log(2.f), 1e-6);
}

// Ring attention in one process: the K/V block is split into parts (as if held by different
// ranks, some fully masked), each part's partial is merged; the result equals attention over
// the whole block, and the per-part backward with the FINAL lse/delta sums to the whole
// backward.
TEST(AttentionCpu, MergedPartsEqualWholeBlock) {
  std::mt19937_64 rng(2024);
  const std::vector<Shape> cases = {
      {150, 300, 4, 2, 64, true, true, PosMode::kShifted},
      {240, 240, 2, 1, 32, true, false, PosMode::kZigzag},
      {100, 220, 3, 3, 48, false, true, PosMode::kShifted},
  };
  for (const Shape& s : cases) {
    SCOPED_TRACE(describe(s));
    const Problem whole = make_problem(rng, s);
    // Random cut points, not tile aligned; parts in a random order.
    std::uniform_int_distribution<int64_t> cut(1, s.kv_len - 1);
    std::vector<int64_t> cuts = {0, cut(rng), cut(rng), s.kv_len};
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<Problem> parts;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      Problem part = whole;
      const int64_t b = cuts[c], e = cuts[c + 1], row = s.kv_heads * s.hd;
      part.kv_len = e - b;
      part.k.assign(whole.k.begin() + b * row, whole.k.begin() + e * row);
      part.v.assign(whole.v.begin() + b * row, whole.v.begin() + e * row);
      part.k_pos.assign(whole.k_pos.begin() + b, whole.k_pos.begin() + e);
      if (!whole.k_doc.empty()) part.k_doc.assign(whole.k_doc.begin() + b, whole.k_doc.begin() + e);
      parts.push_back(std::move(part));
    }
    std::shuffle(parts.begin(), parts.end(), rng);
    // An extra part that no query may see (future keys / foreign document): an empty partial.
    {
      Problem empty = parts.front();
      for (auto& x : empty.k_pos) x += 1'000'000;
      for (auto& d : empty.k_doc) d = -5;
      if (!s.causal && s.docs) parts.push_back(empty);
      if (s.causal) parts.push_back(empty);
    }

    std::vector<float> out(whole.q_elems(), 0.f), lse(whole.q_len * s.heads, -kInf);
    for (const Problem& part : parts) {
      const Fwd f = cpu_forward(part, 2);
      ASSERT_EQ(cpu::attention_merge(whole.q_len, s.heads, s.hd, out.data(), lse.data(),
                                     f.out.data(), f.lse.data(), 2),
                Status::kOk);
    }
    const Fwd want = ref_forward(whole);
    EXPECT_TRUE(all_close("merged out", out, want.out, kTolOut));
    EXPECT_TRUE(all_close("merged lse", lse, want.lse, kTolLse));

    const std::vector<float> delta = ref_delta(whole, want.out);
    const Grads r = ref_backward(whole, want.lse, delta, zero_grads(whole));
    std::vector<float> dq(whole.q_elems(), 0.f), dk, dv;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {  // the original order, for dk/dv layout
      const int64_t b = cuts[c], e = cuts[c + 1];
      auto it = std::find_if(parts.begin(), parts.end(), [&](const Problem& x) {
        return x.k_pos == std::vector<int64_t>(whole.k_pos.begin() + b, whole.k_pos.begin() + e);
      });
      ASSERT_NE(it, parts.end());
      Grads prior = zero_grads(*it);
      prior.dq = dq;
      const Grads g = cpu_backward(*it, lse, delta, prior, 2);
      dq = g.dq;
      dk.insert(dk.end(), g.dk.begin(), g.dk.end());
      dv.insert(dv.end(), g.dv.begin(), g.dv.end());
    }
    EXPECT_TRUE(all_close("dq", dq, r.dq, kTolGrad));
    EXPECT_TRUE(all_close("dk", dk, r.dk, kTolGrad));
    EXPECT_TRUE(all_close("dv", dv, r.dv, kTolGrad));
  }
}

// ---- threads ------------------------------------------------------------------------------
// The forward does not depend on the thread count at all (each output tile is computed by one
// thread in a fixed order); the backward only through fp32 summation order of dq chunks.
TEST(AttentionCpu, ThreadCountDoesNotChangeResults) {
  std::mt19937_64 rng(8);
  for (const Shape& s : {Shape{300, 333, 4, 1, 64, true, true, PosMode::kShifted},
                         Shape{256, 256, 6, 3, 32, true, false, PosMode::kZigzag}}) {
    SCOPED_TRACE(describe(s));
    const Problem p = make_problem(rng, s);
    const Fwd one = cpu_forward(p, 1);
    const std::vector<float> delta = ref_delta(p, one.out);
    const Grads g1 = cpu_backward(p, one.lse, delta, zero_grads(p), 1);
    for (int threads : {2, 3, 4, 7}) {
      SCOPED_TRACE(threads);
      const Fwd f = cpu_forward(p, threads);
      EXPECT_EQ(f.out, one.out);
      EXPECT_EQ(f.lse, one.lse);
      EXPECT_EQ(f.stats.tiles_skipped, one.stats.tiles_skipped);
      const Grads g = cpu_backward(p, one.lse, delta, zero_grads(p), threads);
      EXPECT_TRUE(all_close("dq", g.dq, g1.dq, kTolGrad));
      EXPECT_EQ(g.dk, g1.dk);  // dk/dv: one owner per row, fixed order
      EXPECT_EQ(g.dv, g1.dv);
      // Repeatable with the same thread count.
      const Grads again = cpu_backward(p, one.lse, delta, zero_grads(p), threads);
      EXPECT_EQ(again.dq, g.dq);
    }
  }
}

// ---- finite differences -------------------------------------------------------------------
// L = sum(out * W) with the kernel's own fp32 forward; central differences with h = 3e-3.
// Truncation ~h^2 and fp32 rounding ~1e-7/h give errors ~1e-4; tolerance 1e-3 + 1e-2 |grad|.
TEST(AttentionCpu, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(42);
  Problem p = make_problem(rng, {6, 9, 4, 2, 3, true, true, PosMode::kShifted}, 2.f);
  for (int64_t i = 0; i < 6; ++i) p.q_pos[i] = 4 + i;
  for (int64_t j = 0; j < 9; ++j) p.k_pos[j] = j;
  p.q_doc = {0, 0, 1, 1, 1, 1};
  p.k_doc = {0, 0, 0, 0, 0, 1, 1, 1, 1};
  const auto loss = [&](const Problem& x) {
    const Fwd f = cpu_forward(x, 1);
    double l = 0;
    for (size_t e = 0; e < f.out.size(); ++e) l += static_cast<double>(f.out[e]) * x.dout[e];
    return l;
  };
  const Fwd f = cpu_forward(p, 1);
  std::vector<float> delta(p.q_len * p.heads);
  ASSERT_EQ(cpu::attention_backward_prepare(DType::kF32, p.q_len, p.heads, p.hd, f.out.data(),
                                            p.dout.data(), delta.data(), 1),
            Status::kOk);
  const Grads g = cpu_backward(p, f.lse, delta, zero_grads(p), 1);
  const double h = 3e-3;
  int checked = 0;
  const auto check = [&](const char* name, std::vector<float> Problem::*field,
                         const std::vector<float>& grad) {
    for (size_t e = 0; e < grad.size(); ++e) {
      Problem plus = p, minus = p;
      (plus.*field)[e] += static_cast<float>(h);
      (minus.*field)[e] -= static_cast<float>(h);
      const double fd = (loss(plus) - loss(minus)) / (2 * h);
      EXPECT_NEAR(grad[e], fd, 1e-3 + 1e-2 * std::fabs(fd)) << name << "[" << e << "]";
      ++checked;
    }
  };
  check("dq", &Problem::q, g.dq);
  check("dk", &Problem::k, g.dk);
  check("dv", &Problem::v, g.dv);
  EXPECT_EQ(checked, 6 * 4 * 3 + 2 * 9 * 2 * 3);
}

// ---- PyTorch ------------------------------------------------------------------------------
template <class T>
void write_raw(const std::filesystem::path& path, const std::vector<T>& x) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(x.data()),
          static_cast<std::streamsize>(x.size() * sizeof(T)));
  ASSERT_TRUE(f.good()) << path;
}

std::vector<float> read_raw(const std::filesystem::path& path, size_t n) {
  std::vector<float> x(n);
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(n * sizeof(float)));
  EXPECT_TRUE(f.good() && f.gcount() == static_cast<std::streamsize>(n * sizeof(float)))
      << "short or missing " << path;
  return x;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(AttentionTorch, MatchesPyTorchAutograd) {
  char tmpl[] = "/tmp/ring_attention_torch_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::filesystem::path root(tmpl);
  std::mt19937_64 rng(77);
  const std::vector<Shape> cases = {
      {70, 130, 4, 2, 32, true, true, PosMode::kShifted},
      {128, 128, 8, 2, 64, true, true, PosMode::kZigzag},
      {45, 200, 3, 1, 20, false, false, PosMode::kShifted},
      {100, 60, 2, 2, 16, true, false, PosMode::kShifted},
  };
  // Write every case, run PyTorch once (importing torch dominates the run time), compare.
  std::vector<Problem> problems;
  std::string cmd =
      std::string("/usr/bin/python3 ") + RING_SOURCE_DIR + "/tests/kernels/torch_attention.py";
  for (size_t c = 0; c < cases.size(); ++c) {
    Problem p = make_problem(rng, cases[c], 3.f);
    if (c + 1 == cases.size()) {  // rows 0..19 precede every key: empty rows
      for (int64_t i = 0; i < p.q_len; ++i) p.q_pos[i] = 100 + i;
      for (int64_t j = 0; j < p.kv_len; ++j) p.k_pos[j] = 120 + j;
    }
    const std::filesystem::path dir = root / ("case" + std::to_string(c));
    std::filesystem::create_directory(dir);
    {
      std::ofstream meta(dir / "meta.txt");
      meta.precision(9);
      meta << p.q_len << " " << p.kv_len << " " << p.heads << " " << p.kv_heads << " " << p.hd
           << " " << int(p.causal) << " " << int(!p.q_doc.empty()) << " " << p.scale << "\n";
    }
    write_raw(dir / "q.bin", p.q);
    write_raw(dir / "k.bin", p.k);
    write_raw(dir / "v.bin", p.v);
    write_raw(dir / "dout.bin", p.dout);
    write_raw(dir / "q_pos.bin", p.q_pos);
    write_raw(dir / "k_pos.bin", p.k_pos);
    if (!p.q_doc.empty()) {
      write_raw(dir / "q_doc.bin", p.q_doc);
      write_raw(dir / "k_doc.bin", p.k_doc);
    }
    cmd += ' ';
    cmd += dir.string();
    problems.push_back(std::move(p));
  }
  const std::filesystem::path log = root / "log.txt";
  cmd += " > ";
  cmd += log.string();
  cmd += " 2>&1";
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "PyTorch reference failed (is python3-torch installed?):\n"
                   << cmd << "\n"
                   << read_text(log);

  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(describe(cases[c]));
    const Problem& p = problems[c];
    const std::filesystem::path dir = root / ("case" + std::to_string(c));
    const Fwd f = cpu_forward(p, 2);
    std::vector<float> delta(p.q_len * p.heads);
    ASSERT_EQ(cpu::attention_backward_prepare(DType::kF32, p.q_len, p.heads, p.hd, f.out.data(),
                                              p.dout.data(), delta.data(), 2),
              Status::kOk);
    const Grads g = cpu_backward(p, f.lse, delta, zero_grads(p), 2);
    EXPECT_TRUE(all_close("out", f.out, read_raw(dir / "out.bin", f.out.size()), kTolOut));
    EXPECT_TRUE(all_close("lse", f.lse, read_raw(dir / "lse.bin", f.lse.size()), kTolLse));
    EXPECT_TRUE(all_close("dq", g.dq, read_raw(dir / "dq.bin", g.dq.size()), kTolGrad));
    EXPECT_TRUE(all_close("dk", g.dk, read_raw(dir / "dk.bin", g.dk.size()), kTolGrad));
    EXPECT_TRUE(all_close("dv", g.dv, read_raw(dir / "dv.bin", g.dv.size()), kTolGrad));
  }
  std::filesystem::remove_all(root);
}

// ---- argument checking --------------------------------------------------------------------
TEST(AttentionCpu, RejectsBadArgumentsWithoutCrashing) {
  std::mt19937_64 rng(1);
  const Problem p = make_problem(rng, {8, 8, 4, 2, 16, true, false, PosMode::kShifted});
  std::vector<float> out(p.q_elems()), lse(p.q_len * p.heads), dq(p.q_elems()), dk(p.kv_elems()),
      dv(p.kv_elems()), delta(p.q_len * p.heads);
  const auto fwd = [&](AttentionArgs a) {
    return cpu::attention_forward(a, out.data(), lse.data(), nullptr, 2);
  };
  const auto bwd = [&](AttentionArgs a) {
    return cpu::attention_backward(a, p.dout.data(), lse.data(), delta.data(), dq.data(), dk.data(),
                                   dv.data(), nullptr, 2);
  };
  const auto both = [&](AttentionArgs a, Status want, const char* what) {
    EXPECT_EQ(fwd(a), want) << what;
    EXPECT_EQ(bwd(a), want) << what;
  };
  AttentionArgs a = p.args();
  EXPECT_EQ(fwd(a), Status::kOk);
  a.kv_heads = 3;
  both(a, Status::kInvalidArgument, "heads % kv_heads != 0");
  a = p.args();
  a.kv_heads = 0;
  both(a, Status::kInvalidArgument, "kv_heads 0");
  a = p.args();
  a.head_dim = 0;
  both(a, Status::kInvalidArgument, "head_dim 0");
  a = p.args();
  a.q_len = -1;
  both(a, Status::kInvalidArgument, "negative q_len");
  a = p.args();
  a.q = nullptr;
  both(a, Status::kInvalidArgument, "null q");
  a = p.args();
  a.v = nullptr;
  both(a, Status::kInvalidArgument, "null v");
  a = p.args();
  a.k_pos = nullptr;
  both(a, Status::kInvalidArgument, "causal without key positions");
  a = p.args();
  a.q_doc = reinterpret_cast<const int32_t*>(p.q_pos.data());
  both(a, Status::kInvalidArgument, "q_doc without k_doc");
  a = p.args();
  a.scale = std::nanf("");
  both(a, Status::kInvalidArgument, "NaN scale");
  a = p.args();
  a.q_len = int64_t{1} << 40;
  both(a, Status::kInvalidArgument, "size overflow");
  a = p.args();
  a.dtype = static_cast<DType>(7);
  both(a, Status::kInvalidArgument, "a dtype that is neither f32 nor bf16");
  a = p.args();
  EXPECT_EQ(cpu::attention_forward(a, nullptr, lse.data(), nullptr, 1), Status::kInvalidArgument);
  EXPECT_EQ(cpu::attention_backward(a, p.dout.data(), lse.data(), delta.data(), dq.data(), nullptr,
                                    dv.data(), nullptr, 1),
            Status::kInvalidArgument);
  EXPECT_EQ(cpu::attention_merge(4, 0, 8, out.data(), lse.data(), out.data(), lse.data(), 1),
            Status::kInvalidArgument);
  EXPECT_EQ(cpu::attention_merge(4, 2, 8, nullptr, lse.data(), out.data(), lse.data(), 1),
            Status::kInvalidArgument);
  EXPECT_EQ(cpu::attention_backward_prepare(static_cast<DType>(7), 8, 4, 16, out.data(),
                                            p.dout.data(), delta.data(), 1),
            Status::kInvalidArgument);
  EXPECT_EQ(
      cpu::attention_backward_prepare(DType::kF32, 8, 4, 16, out.data(), nullptr, delta.data(), 1),
      Status::kInvalidArgument);
  // Empty query block: nothing to do, not an error.
  a = p.args();
  a.q_len = 0;
  EXPECT_EQ(fwd(a), Status::kOk);
  EXPECT_EQ(bwd(a), Status::kOk);
}

// ---- every ISA path -----------------------------------------------------------------------
// The kernels pick AVX-512, AVX2 or scalar once per process; rerun the numerical tests in child
// processes with the choice lowered through RING_CPU_ISA so every path this CPU can execute is
// checked (an unsupported request falls back to the best available one, never higher).
TEST(AttentionCpu, EveryIsaPathMatchesReference) {
  if (std::getenv("RING_CPU_ISA") != nullptr) GTEST_SKIP() << "child process";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  for (const char* isa : {"avx2", "scalar"}) {
    const std::string cmd = std::string("RING_CPU_ISA=") + isa + " " + self +
                            " --gtest_filter='AttentionCpu.MatchesReference*:AttentionCpu.Merged*:"
                            "AttentionCpu.FullyMasked*:AttentionCpu.BackwardMatchesFinite*'"
                            " > /dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "ISA " << isa << " failed; rerun: " << cmd;
  }
}

}  // namespace
}  // namespace ring::kernels
