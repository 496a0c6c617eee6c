// bf16 storage in the CPU attention kernels (issue 33): AttentionArgs::dtype == kBF16 (q, k, v
// and dout as bf16 bits) in the forward, the backward and its prepare, and a bf16 K/V pool in
// the paged decode kernel (PagedDecodeArgs::dtype).
//
// (a) Bit identity. The kernels widen bf16 to fp32 (exact) when a tile is packed or a row is
//     read and run the fp32 code from there, so a bf16 call must give, bit for bit, what an fp32
//     call gives on the bf16 values widened to fp32: out, lse, delta, dq, dk, dv and the tile
//     statistics. Checked on every ISA path (cpu::set_isa; a path this CPU cannot run is skipped
//     and says so).
// (b) Against the float64 reference (kernels/reference/attention_ref.h) on the same bf16 inputs
//     widened to fp32. The reference sees exactly the kernel's inputs, so bf16 contributes no
//     error here: what is left is the kernel's fp32 arithmetic, bounded per element (the
//     derivation is at error_bound() below).
// (c) Bad input: a dtype that is neither kF32 nor kBF16 is kInvalidArgument (backend.h), and the
//     CPU backend says which ops take bf16 (supports()).
//
// Shapes: q_len and kv_len from {1, 7, 65, 130} (not multiples of the 64-key tile), 4 query
// heads over 1, 2 or 4 kv heads (GQA), head_dim 64, 128 and 17 (odd: every head_dim works on the
// CPU), causal or not, with and without document ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/numeric/bf16.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/reference/attention_ref.h"

namespace ring::kernels {
namespace {

using cpu::Isa;
constexpr double kU = 0x1p-24;  // unit roundoff of fp32 (round to nearest)

// A tensor stored as bf16 bits and the same values widened to fp32.
struct Bf16Tensor {
  std::vector<uint16_t> bits;
  std::vector<float> wide;
};

Bf16Tensor random_bf16(std::mt19937_64& rng, int64_t n, float range) {
  std::uniform_real_distribution<float> u(-range, range);
  Bf16Tensor t;
  for (int64_t i = 0; i < n; ++i) {
    t.bits.push_back(numeric::f32_to_bf16(u(rng)));
    t.wide.push_back(numeric::bf16_to_f32(t.bits.back()));
  }
  return t;
}

struct Shape {
  int64_t q_len, kv_len, heads, kv_heads, hd;
  bool causal, docs;
};

std::string describe(const Shape& s) {
  std::ostringstream o;
  o << "q_len " << s.q_len << " kv_len " << s.kv_len << " heads " << s.heads << "/" << s.kv_heads
    << " hd " << s.hd << (s.causal ? " causal" : " full") << (s.docs ? " docs" : "");
  return o.str();
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {1, 1, 4, 1, 64, true, false},    {1, 130, 4, 2, 128, true, true},
      {7, 65, 4, 4, 17, false, true},   {7, 7, 4, 1, 128, true, false},
      {65, 130, 4, 2, 64, true, true},  {65, 7, 4, 4, 128, false, false},
      {130, 65, 4, 1, 17, true, true},  {130, 130, 4, 2, 64, false, true},
      {130, 1, 4, 4, 64, false, false}, {65, 65, 4, 1, 17, true, false},
  };
  return s;
}

struct Problem {
  Shape s{};
  float scale = 1;
  Bf16Tensor q, k, v, dout;
  std::vector<int64_t> q_pos, k_pos;
  std::vector<int32_t> q_doc, k_doc;

  // bf16: the bits; f32: the widened values (the same numbers).
  AttentionArgs args(DType dtype) const {
    AttentionArgs a;
    a.q_len = s.q_len;
    a.kv_len = s.kv_len;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.head_dim = s.hd;
    a.scale = scale;
    a.causal = s.causal;
    a.dtype = dtype;
    const bool b = dtype == DType::kBF16;
    a.q = b ? static_cast<const void*>(q.bits.data()) : q.wide.data();
    a.k = b ? static_cast<const void*>(k.bits.data()) : k.wide.data();
    a.v = b ? static_cast<const void*>(v.bits.data()) : v.wide.data();
    a.q_pos = q_pos.data();
    a.k_pos = k_pos.data();
    a.q_doc = q_doc.empty() ? nullptr : q_doc.data();
    a.k_doc = k_doc.empty() ? nullptr : k_doc.data();
    return a;
  }
  const void* dout_of(DType dtype) const {
    return dtype == DType::kBF16 ? static_cast<const void*>(dout.bits.data()) : dout.wide.data();
  }
  int64_t q_elems() const { return s.q_len * s.heads * s.hd; }
  int64_t kv_elems() const { return s.kv_len * s.kv_heads * s.hd; }
  int64_t rows() const { return s.q_len * s.heads; }
};

// q in [-gain, gain] (gain 4 sharpens the softmax), k, v, dout in [-1, 1]; key positions start
// before, inside or after the queries; documents of random lengths over the global positions.
Problem make_problem(std::mt19937_64& rng, const Shape& s, float gain) {
  Problem p;
  p.s = s;
  p.scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  p.q = random_bf16(rng, p.q_elems(), gain);
  p.k = random_bf16(rng, p.kv_elems(), 1.f);
  p.v = random_bf16(rng, p.kv_elems(), 1.f);
  p.dout = random_bf16(rng, p.q_elems(), 1.f);
  std::uniform_int_distribution<int64_t> off(0, s.q_len + s.kv_len);
  const int64_t q0 = off(rng), k0 = off(rng);
  for (int64_t i = 0; i < s.q_len; ++i) p.q_pos.push_back(q0 + i);
  for (int64_t j = 0; j < s.kv_len; ++j) p.k_pos.push_back(k0 + j);
  if (s.docs) {
    const int64_t global = 2 * (s.q_len + s.kv_len) + 1;
    std::vector<int32_t> doc(static_cast<size_t>(global));
    std::uniform_int_distribution<int64_t> len(1, std::max<int64_t>(2, global / 4));
    int32_t id = 0;
    for (int64_t x = 0; x < global;) {
      const int64_t l = len(rng);
      for (int64_t e = x; e < std::min(global, x + l); ++e) doc[static_cast<size_t>(e)] = id;
      x += l;
      ++id;
    }
    for (int64_t x : p.q_pos) p.q_doc.push_back(doc[static_cast<size_t>(x)]);
    for (int64_t x : p.k_pos) p.k_doc.push_back(doc[static_cast<size_t>(x)]);
  }
  return p;
}

::testing::AssertionResult same_bits(const char* name, const std::vector<float>& a,
                                     const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << name << ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << name << "[" << i << "]: bf16 path " << a[i]
                                           << ", fp32 path " << b[i] << " (bits differ)";
    }
  }
  return ::testing::AssertionSuccess();
}

class AttentionBf16 : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu::isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(GetParam())
                   << " code (the path is compiled, not run here)";
    ASSERT_EQ(cpu::set_isa(GetParam()), Status::kOk);
  }
  void TearDown() override { cpu::set_isa(cpu::best_isa()); }
};

// ---- (a) bit identity with the fp32 path on the widened inputs ----------------------------
struct Results {
  std::vector<float> out, lse, delta, dq, dk, dv;
  AttentionStats fwd, bwd;
};

// Forward, prepare and backward of one dtype; the backward on top of the given prior gradients
// (the contract is +=) with the lse and delta of this run.
Results run_cpu(const Problem& p, DType dtype, const Results& prior, int threads) {
  Results r = prior;
  r.out.assign(static_cast<size_t>(p.q_elems()), std::nanf(""));
  r.lse.assign(static_cast<size_t>(p.rows()), std::nanf(""));
  r.delta.assign(static_cast<size_t>(p.rows()), std::nanf(""));
  const AttentionArgs a = p.args(dtype);
  EXPECT_EQ(cpu::attention_forward(a, r.out.data(), r.lse.data(), &r.fwd, threads), Status::kOk);
  EXPECT_EQ(cpu::attention_backward_prepare(dtype, p.s.q_len, p.s.heads, p.s.hd, r.out.data(),
                                            p.dout_of(dtype), r.delta.data(), threads),
            Status::kOk);
  EXPECT_EQ(cpu::attention_backward(a, p.dout_of(dtype), r.lse.data(), r.delta.data(), r.dq.data(),
                                    r.dk.data(), r.dv.data(), &r.bwd, threads),
            Status::kOk);
  return r;
}

TEST_P(AttentionBf16, BitIdenticalToFp32OnTheWidenedInputs) {
  std::mt19937_64 rng(3301);
  int idx = 0;
  for (const Shape& s : shapes()) {
    for (float gain : {1.f, 4.f}) {
      SCOPED_TRACE(describe(s) + " gain " + std::to_string(gain));
      const int threads = 1 + idx++ % 3;
      const Problem p = make_problem(rng, s, gain);
      Results prior;
      prior.dq = random_bf16(rng, p.q_elems(), 1.f).wide;
      prior.dk = random_bf16(rng, p.kv_elems(), 1.f).wide;
      prior.dv = random_bf16(rng, p.kv_elems(), 1.f).wide;
      const Results b = run_cpu(p, DType::kBF16, prior, threads);
      const Results f = run_cpu(p, DType::kF32, prior, threads);
      EXPECT_TRUE(same_bits("out", b.out, f.out));
      EXPECT_TRUE(same_bits("lse", b.lse, f.lse));
      EXPECT_TRUE(same_bits("delta", b.delta, f.delta));
      EXPECT_TRUE(same_bits("dq", b.dq, f.dq));
      EXPECT_TRUE(same_bits("dk", b.dk, f.dk));
      EXPECT_TRUE(same_bits("dv", b.dv, f.dv));
      // The same tiles skipped, masked and computed.
      for (const auto& [x, y] : {std::pair{b.fwd, f.fwd}, std::pair{b.bwd, f.bwd}}) {
        EXPECT_EQ(x.tiles_total, y.tiles_total);
        EXPECT_EQ(x.tiles_skipped, y.tiles_skipped);
        EXPECT_EQ(x.tiles_masked, y.tiles_masked);
        EXPECT_EQ(x.flops, y.flops);
      }
      EXPECT_GT(b.fwd.tiles_total, 0);
    }
  }
}

// ---- (b) against the float64 reference ----------------------------------------------------
// Error bound, first order in u = 2^-24 (fp32 round to nearest), from the standard result that
// an fp32 sum of n terms (plain or fused multiply-adds) is within n u sum|terms| of the exact
// sum. With S = max over allowed (query row, key) of sum_x |q_x k_x| and s = scale:
//   - a score (the kernel: q pre-scaled by s log2 e, a dot of head_dim FMAs; the decode kernel:
//     products then sums) is off by at most (hd + 2) u s S; the softmax subtracts a max that is
//     itself such a score and exponentiates (exp2 polynomial < 2e-7 = 4u; std::exp < 1 ulp), so
//     each probability p has relative error at most
//       E = 2 (hd + 2) u s S + 4 u (s S + log(kv_len + 1) + 2) + 8 u
//     (the middle term: rounding of scores and lse of magnitude <= s S + log kv_len).
//   - out = sum_j p_j v_j / sum_j p_j: the p errors move it by <= 2 E M_out, the sums of kv_len
//     terms (plus one rescale per 64-key tile and the division) by (kv_len + kv_tiles + 4) u
//     M_out, where M_out = sum_j p_j |v_j| (exact p, computed in fp64 below).
//   - lse = m + log(sum p): <= 2 E + (kv_len + 8) u + 2 u |lse| (absolute).
//   - dv_j = sum_i p_ij dO_i over the group * q_len rows of kv head: <= (E + (group q_len + 4) u)
//     M_dv, M_dv = sum_i p_ij |dO_i|.
//   - dS_ij = s p_ij (dP_ij - delta_i), dP a dot of head_dim terms: relative to
//     A_ij = s p_ij (sum_x |dO_ix v_jx| + |delta_i|) it is off by <= (E + (hd + 4) u) A_ij;
//     dq_i = sum_j dS_ij k_j (kv_len terms, then up to kv_tiles partial dq sums and the +=):
//     <= (E + (hd + kv_len + kv_tiles + 8) u) M_dq, M_dq = sum_j A_ij |k_j|; dk_j = sum_i dS_ij
//     q_i: <= (E + (hd + group q_len + 8) u) M_dk, M_dk = sum_i A_ij |q_i|.
// Every bound gets a factor 2 for the second-order terms left out, plus u |want| for the final
// rounding to fp32. A row with no allowed key has M = 0: out 0, lse -inf and zero gradients
// must then be exact. Typical errors are far below the bound (random rounding errors grow like
// sqrt(n), not n); a wrong widening or a wrong mask is off by bf16's 2^-8 or more.
struct Magnitudes {
  std::vector<double> out, dq, dk, dv;
  double s_max = 0;  // S above
};

Magnitudes magnitudes(const Problem& p, const std::vector<float>& lse,
                      const std::vector<float>& delta) {
  const AttentionArgs a = p.args(DType::kF32);
  const int64_t hd = p.s.hd, group = p.s.heads / p.s.kv_heads;
  const std::vector<float>&q = p.q.wide, &k = p.k.wide, &v = p.v.wide, &g = p.dout.wide;
  Magnitudes m;
  m.out.assign(static_cast<size_t>(p.q_elems()), 0);
  m.dq.assign(static_cast<size_t>(p.q_elems()), 0);
  m.dk.assign(static_cast<size_t>(p.kv_elems()), 0);
  m.dv.assign(static_cast<size_t>(p.kv_elems()), 0);
  for (int64_t i = 0; i < p.s.q_len; ++i)
    for (int64_t h = 0; h < p.s.heads; ++h) {
      const int64_t row = i * p.s.heads + h, kvh = h / group;
      const float* qr = q.data() + row * hd;
      const float* gr = g.data() + row * hd;
      const double l = lse[static_cast<size_t>(row)];
      for (int64_t j = 0; j < p.s.kv_len; ++j) {
        if (!ref::attention_allowed(a, i, j)) continue;
        const int64_t col = (j * p.s.kv_heads + kvh) * hd;
        double dot = 0, abs_dot = 0, abs_dp = 0;
        for (int64_t x = 0; x < hd; ++x) {
          dot += static_cast<double>(qr[x]) * k[col + x];
          abs_dot += std::fabs(static_cast<double>(qr[x]) * k[col + x]);
          abs_dp += std::fabs(static_cast<double>(gr[x]) * v[col + x]);
        }
        m.s_max = std::max(m.s_max, abs_dot);
        if (std::isinf(l)) continue;
        const double pr = std::exp(dot * p.scale - l);
        const double A = p.scale * pr * (abs_dp + std::fabs(delta[static_cast<size_t>(row)]));
        for (int64_t x = 0; x < hd; ++x) {
          m.out[row * hd + x] += pr * std::fabs(v[col + x]);
          m.dq[row * hd + x] += A * std::fabs(k[col + x]);
          m.dk[col + x] += A * std::fabs(qr[x]);
          m.dv[col + x] += pr * std::fabs(gr[x]);
        }
      }
    }
  return m;
}

// p's relative error E above.
double prob_error(const Problem& p, double s_max) {
  const double s = p.scale;
  return 2 * (p.s.hd + 2) * kU * s * s_max +
         4 * kU * (s * s_max + std::log(static_cast<double>(p.s.kv_len) + 1) + 2) + 8 * kU;
}

// |got - want| <= 2 rel M + u |want| element by element; infinities must match exactly.
::testing::AssertionResult within(const char* name, const std::vector<float>& got,
                                  const std::vector<float>& want, double rel,
                                  const std::vector<double>& mag) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w)
        return ::testing::AssertionFailure() << name << "[" << i << "]: " << g << " vs " << w;
      continue;
    }
    const double bound = 2 * rel * mag[i] + kU * std::fabs(w);
    const double err = std::fabs(g - w);
    if (!(err <= bound)) {  // also NaN
      return ::testing::AssertionFailure() << name << "[" << i << "]: got " << g << ", want " << w
                                           << ", |err| " << err << " > bound " << bound;
    }
    if (bound > 0) worst = std::max(worst, err / bound);
  }
  return ::testing::AssertionSuccess() << name << ": worst err/bound " << worst;
}

TEST_P(AttentionBf16, MatchesTheFloat64ReferenceOnTheSameBf16Inputs) {
  std::mt19937_64 rng(3302);
  int idx = 0;
  for (const Shape& s : shapes()) {
    for (float gain : {1.f, 4.f}) {
      SCOPED_TRACE(describe(s) + " gain " + std::to_string(gain));
      const int threads = 1 + idx++ % 3;
      const Problem p = make_problem(rng, s, gain);
      const AttentionArgs bf = p.args(DType::kBF16), wide = p.args(DType::kF32);
      // Forward.
      std::vector<float> out(static_cast<size_t>(p.q_elems())), lse(static_cast<size_t>(p.rows()));
      std::vector<float> rout(out.size()), rlse(lse.size());
      ASSERT_EQ(cpu::attention_forward(bf, out.data(), lse.data(), nullptr, threads), Status::kOk);
      ASSERT_EQ(ref::attention_forward(wide, rout.data(), rlse.data()), Status::kOk);
      // delta: the bf16 prepare vs the reference prepare, both on the reference output.
      std::vector<float> delta(lse.size()), rdelta(lse.size());
      ASSERT_EQ(cpu::attention_backward_prepare(DType::kBF16, s.q_len, s.heads, s.hd, rout.data(),
                                                p.dout.bits.data(), delta.data(), threads),
                Status::kOk);
      ASSERT_EQ(ref::attention_backward_prepare(DType::kF32, s.q_len, s.heads, s.hd, rout.data(),
                                                p.dout.wide.data(), rdelta.data()),
                Status::kOk);
      // Backward from the reference's lse and delta (zero priors: the increments themselves).
      std::vector<float> dq(out.size(), 0.f), dk(static_cast<size_t>(p.kv_elems()), 0.f),
          dv(dk.size(), 0.f), rdq(dq), rdk(dk), rdv(dk);
      ASSERT_EQ(cpu::attention_backward(bf, p.dout.bits.data(), rlse.data(), rdelta.data(),
                                        dq.data(), dk.data(), dv.data(), nullptr, threads),
                Status::kOk);
      ASSERT_EQ(ref::attention_backward(wide, p.dout.wide.data(), rlse.data(), rdelta.data(),
                                        rdq.data(), rdk.data(), rdv.data()),
                Status::kOk);

      const Magnitudes m = magnitudes(p, rlse, rdelta);
      const double e = prob_error(p, m.s_max);
      const double tiles = static_cast<double>((s.kv_len + 63) / 64);
      const double group_rows = static_cast<double>(s.heads / s.kv_heads * s.q_len);
      EXPECT_TRUE(within("out", out, rout, 2 * e + (s.kv_len + tiles + 4) * kU, m.out));
      // lse: absolute, 2 E + (kv_len + 8) u + 2 u |lse|, as M = max(1, |lse|) times the rel.
      std::vector<double> lse_mag(lse.size());
      for (size_t x = 0; x < lse.size(); ++x)
        lse_mag[x] = std::isinf(rlse[x]) ? 0.0 : std::max(1.0, std::fabs(double{rlse[x]}));
      EXPECT_TRUE(within("lse", lse, rlse, 2 * e + (s.kv_len + 10) * kU, lse_mag));
      // delta = sum_x dO out in double, one rounding: u |delta| (within()'s last term).
      EXPECT_TRUE(within("delta", delta, rdelta, 0, std::vector<double>(lse.size(), 0)));
      EXPECT_TRUE(within("dv", dv, rdv, e + (group_rows + 4) * kU, m.dv));
      EXPECT_TRUE(within("dq", dq, rdq, e + (s.hd + s.kv_len + tiles + 8) * kU, m.dq));
      EXPECT_TRUE(within("dk", dk, rdk, e + (s.hd + group_rows + 8) * kU, m.dk));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, AttentionBf16,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& i) {
                           return std::string(cpu::isa_name(i.param));
                         });

// ---- paged decode with a bf16 pool ---------------------------------------------------------
// The decode kernel is one plain C++ path (no per-ISA code), so these run once.
struct DecodeCase {
  int64_t hd, page_tokens, slots, rows;
};

struct DecodeProblem {
  DecodeCase c{};
  float scale = 1;
  Bf16Tensor pool;  // [slots, 2, page_tokens, hd]
  std::vector<int32_t> pool_docs, q_doc, slot, tokens;
  std::vector<float> q;  // fp32: the query stays fp32 whatever the pool is

  PagedDecodeArgs args(DType dtype) const {
    PagedDecodeArgs a;
    a.rows = c.rows;
    a.head_dim = c.hd;
    a.page_tokens = c.page_tokens;
    a.scale = scale;
    a.dtype = dtype;
    a.pool = dtype == DType::kBF16 ? static_cast<const void*>(pool.bits.data()) : pool.wide.data();
    a.pool_docs = pool_docs.data();
    a.q = q.data();
    a.q_doc = q_doc.data();
    a.slot = slot.data();
    a.tokens = tokens.data();
    return a;
  }
};

// Rows read random slots, filled 0..page_tokens (0: an empty page, an empty partial), keys of
// two documents and queries of three (document 2 has no key: an empty partial too).
DecodeProblem make_decode(std::mt19937_64& rng, const DecodeCase& c) {
  DecodeProblem p;
  p.c = c;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.hd));
  p.pool = random_bf16(rng, c.slots * 2 * c.page_tokens * c.hd, 1.5f);
  for (int64_t x = 0; x < c.slots * c.page_tokens; ++x) p.pool_docs.push_back(rng() % 4 == 0);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t x = 0; x < c.rows * c.hd; ++x) p.q.push_back(u(rng));
  for (int64_t r = 0; r < c.rows; ++r) {
    p.q_doc.push_back(r % 7 == 3 ? 2 : static_cast<int32_t>(rng() % 2));
    p.slot.push_back(static_cast<int32_t>(rng() % c.slots));
    p.tokens.push_back(r == 0 ? 0 : static_cast<int32_t>(rng() % (c.page_tokens + 1)));
  }
  return p;
}

const std::vector<DecodeCase>& decode_cases() {
  static const std::vector<DecodeCase> c = {
      {64, 1, 3, 5}, {128, 7, 4, 9}, {17, 65, 3, 12}, {64, 130, 5, 16}, {128, 65, 2, 7},
  };
  return c;
}

TEST(PagedDecodeBf16, BitIdenticalToAnFp32PoolOfTheWidenedValues) {
  std::mt19937_64 rng(3303);
  int idx = 0;
  for (const DecodeCase& c : decode_cases()) {
    SCOPED_TRACE("head_dim " + std::to_string(c.hd) + " page_tokens " +
                 std::to_string(c.page_tokens));
    const int threads = 1 + idx++ % 3;
    const DecodeProblem p = make_decode(rng, c);
    std::vector<float> ob(static_cast<size_t>(c.rows * c.hd), std::nanf("")), of(ob);
    std::vector<float> lb(static_cast<size_t>(c.rows), std::nanf("")), lf(lb);
    ASSERT_EQ(cpu::paged_decode_attention(p.args(DType::kBF16), ob.data(), lb.data(), threads),
              Status::kOk);
    ASSERT_EQ(cpu::paged_decode_attention(p.args(DType::kF32), of.data(), lf.data(), threads),
              Status::kOk);
    EXPECT_TRUE(same_bits("out", ob, of));
    EXPECT_TRUE(same_bits("lse", lb, lf));
  }
}

// Each row against the float64 reference forward of one query over the page's filled rows
// (non-causal, the document mask), on the widened pool. Bound: error_bound()'s out and lse
// terms with kv_len = the filled rows, the sums doubled (the decode kernel multiplies then adds:
// two roundings per term).
TEST(PagedDecodeBf16, MatchesTheFloat64ReferenceOnTheSameBf16Pool) {
  std::mt19937_64 rng(3304);
  for (const DecodeCase& c : decode_cases()) {
    SCOPED_TRACE("head_dim " + std::to_string(c.hd) + " page_tokens " +
                 std::to_string(c.page_tokens));
    const DecodeProblem p = make_decode(rng, c);
    std::vector<float> out(static_cast<size_t>(c.rows * c.hd)), lse(static_cast<size_t>(c.rows));
    ASSERT_EQ(cpu::paged_decode_attention(p.args(DType::kBF16), out.data(), lse.data(), 2),
              Status::kOk);
    for (int64_t r = 0; r < c.rows; ++r) {
      SCOPED_TRACE("row " + std::to_string(r));
      // The row as an attention problem of one query over the page's first tokens[r] rows.
      Problem one;
      one.s = {1, p.tokens[static_cast<size_t>(r)], 1, 1, c.hd, false, true};
      one.scale = p.scale;
      const int64_t base = p.slot[static_cast<size_t>(r)] * 2 * c.page_tokens * c.hd;
      const int64_t n = one.s.kv_len * c.hd;
      one.q.wide.assign(p.q.begin() + r * c.hd, p.q.begin() + (r + 1) * c.hd);
      one.k.wide.assign(p.pool.wide.begin() + base, p.pool.wide.begin() + base + n);
      const int64_t vb = base + c.page_tokens * c.hd;
      one.v.wide.assign(p.pool.wide.begin() + vb, p.pool.wide.begin() + vb + n);
      one.dout.wide.assign(static_cast<size_t>(c.hd), 0.f);
      one.q_pos = {0};
      one.k_pos.assign(static_cast<size_t>(one.s.kv_len), 0);
      one.q_doc = {p.q_doc[static_cast<size_t>(r)]};
      const int32_t* docs = p.pool_docs.data() + p.slot[static_cast<size_t>(r)] * c.page_tokens;
      one.k_doc.assign(docs, docs + one.s.kv_len);
      if (one.k_doc.empty()) one.k_doc.push_back(0);  // an empty page: k_doc given, never read
      std::vector<float> want(static_cast<size_t>(c.hd)), want_lse(1);
      ASSERT_EQ(ref::attention_forward(one.args(DType::kF32), want.data(), want_lse.data()),
                Status::kOk);
      const Magnitudes m = magnitudes(one, want_lse, std::vector<float>(1, 0.f));
      const double e = prob_error(one, m.s_max);
      const std::vector<float> got(out.begin() + r * c.hd, out.begin() + (r + 1) * c.hd);
      EXPECT_TRUE(within("out", got, want, 2 * e + (2 * one.s.kv_len + 4) * kU, m.out));
      const double lmag =
          std::isinf(want_lse[0]) ? 0.0 : std::max(1.0, std::fabs(double{want_lse[0]}));
      EXPECT_TRUE(within("lse", {lse[static_cast<size_t>(r)]}, want_lse,
                         2 * e + (2 * one.s.kv_len + 10) * kU, {lmag}));
    }
  }
}

// ---- (c) bad input --------------------------------------------------------------------------
TEST(AttentionBf16Args, ADtypeOtherThanF32OrBf16IsAnInvalidArgument) {
  std::mt19937_64 rng(3305);
  const Problem p = make_problem(rng, {7, 7, 4, 2, 64, true, true}, 1.f);
  const DType bad = static_cast<DType>(7);
  std::vector<float> out(static_cast<size_t>(p.q_elems())), lse(static_cast<size_t>(p.rows())),
      delta(lse.size()), dq(out.size()), dk(static_cast<size_t>(p.kv_elems())), dv(dk.size());
  AttentionArgs a = p.args(DType::kBF16);
  a.dtype = bad;
  EXPECT_EQ(cpu::attention_forward(a, out.data(), lse.data(), nullptr, 1),
            Status::kInvalidArgument);
  EXPECT_EQ(cpu::attention_backward(a, p.dout.bits.data(), lse.data(), delta.data(), dq.data(),
                                    dk.data(), dv.data(), nullptr, 1),
            Status::kInvalidArgument);
  EXPECT_EQ(cpu::attention_backward_prepare(bad, p.s.q_len, p.s.heads, p.s.hd, out.data(),
                                            p.dout.bits.data(), delta.data(), 1),
            Status::kInvalidArgument);
  std::mt19937_64 rng2(3306);
  const DecodeProblem d = make_decode(rng2, {64, 7, 2, 3});
  PagedDecodeArgs da = d.args(DType::kBF16);
  da.dtype = bad;
  std::vector<float> dout_(static_cast<size_t>(3 * 64)), dlse(3);
  EXPECT_EQ(cpu::paged_decode_attention(da, dout_.data(), dlse.data(), 1),
            Status::kInvalidArgument);

  // What the CPU backend says it takes: bf16 for attention and decode, not for the merge (fp32
  // partials by contract).
  std::string error;
  const std::unique_ptr<Backend> be = create_backend("cpu", 1, &error);
  ASSERT_NE(be, nullptr) << error;
  for (Op op : {Op::kAttentionForward, Op::kAttentionBackward, Op::kPagedDecode}) {
    EXPECT_TRUE(be->supports(op, DType::kF32));
    EXPECT_TRUE(be->supports(op, DType::kBF16));
    EXPECT_FALSE(be->supports(op, bad));
  }
  EXPECT_FALSE(be->supports(Op::kAttentionMerge, DType::kBF16));
}

}  // namespace
}  // namespace ring::kernels
