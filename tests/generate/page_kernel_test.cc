// The decode attention's page kernel (worker/generate/decode_attention.h page_partial) on every
// ISA this CPU can run (scalar, AVX2+FMA, AVX-512; cpu::set_isa forces each, an ISA the CPU lacks
// is skipped with a reason) against a double-precision reference: head_dim a multiple of the
// vector width and not (partial last vector), 1-8 query rows (GQA groups, blocked by 2 and 4),
// page fills that are and are not a multiple of the width, keys of one document, of two, and of
// none the query may see (an empty partial: out 0, lse -inf).
//
// Tolerance: |out - ref| <= 1e-5 x max_d |ref_d| per row and |lse - ref| <= 1e-5 x max(1, |ref|)
// (fp32 dot products of <= 128 terms and the Cephes exp against double). Also exact properties:
// a row's bits never depend on the other rows of the call (the same row alone gives the same
// bits), which is what makes prefix sharing and batching exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/numeric/bf16.h"
#include "kernels/cpu/ops.h"
#include "worker/generate/decode_attention.h"

namespace ring::gen {
namespace {

namespace cpu = kernels::cpu;
using cpu::Isa;

class PageKernel : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu::isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(GetParam())
                   << " code (the path is compiled, not run here)";
    ASSERT_EQ(cpu::set_isa(GetParam()), kernels::Status::kOk);
  }
  void TearDown() override { cpu::set_isa(cpu::best_isa()); }
};

struct Ref {
  std::vector<double> out;
  double lse;
};

Ref reference(int64_t hd, float scale, const float* q, int32_t q_doc, int64_t tokens,
              const float* k, const float* v, const int32_t* docs) {
  std::vector<double> s(static_cast<size_t>(tokens), -INFINITY);
  double mx = -INFINITY;
  for (int64_t j = 0; j < tokens; ++j) {
    if (docs[j] != q_doc) continue;
    double dot = 0;
    for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[j * hd + d];
    s[static_cast<size_t>(j)] = dot * scale;
    mx = std::max(mx, s[static_cast<size_t>(j)]);
  }
  Ref r{std::vector<double>(static_cast<size_t>(hd), 0.0), -INFINITY};
  if (mx == -INFINITY) return r;
  double sum = 0;
  for (int64_t j = 0; j < tokens; ++j) {
    if (s[static_cast<size_t>(j)] == -INFINITY) continue;
    const double p = std::exp(s[static_cast<size_t>(j)] - mx);
    sum += p;
    for (int64_t d = 0; d < hd; ++d) r.out[static_cast<size_t>(d)] += p * v[j * hd + d];
  }
  for (double& o : r.out) o /= sum;
  r.lse = mx + std::log(sum);
  return r;
}

TEST_P(PageKernel, MatchesADoubleReferenceAndRowsAreIndependent) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  int cases = 0;
  for (int64_t hd : {16, 40, 64, 80, 128})
    for (int64_t m : {1, 2, 3, 4, 5, 8})
      for (int64_t tokens : {1, 9, 16, 37, 64, 256})
        for (int docs_kind = 0; docs_kind < 3; ++docs_kind) {
          SCOPED_TRACE("head_dim " + std::to_string(hd) + ", rows " + std::to_string(m) +
                       ", tokens " + std::to_string(tokens) + ", docs " +
                       std::to_string(docs_kind));
          std::vector<float> k(static_cast<size_t>(tokens * hd)), v(k.size()),
              q(static_cast<size_t>(m * hd));
          for (float& x : k) x = 1.5f * nd(rng);
          for (float& x : v) x = nd(rng);
          for (float& x : q) x = 1.5f * nd(rng);
          // 0: one document (the query's); 1: two, mixed; 2: one the query never sees.
          std::vector<int32_t> docs(static_cast<size_t>(tokens));
          for (int32_t& d : docs) d = docs_kind == 0 ? 1 : docs_kind == 2 ? 5 : (rng() % 3 ? 1 : 2);
          std::vector<int32_t> q_doc(static_cast<size_t>(m));
          for (int64_t r = 0; r < m; ++r) q_doc[static_cast<size_t>(r)] = r % 3 == 2 ? 2 : 1;
          const float scale = 1.f / std::sqrt(static_cast<float>(hd));
          std::vector<float> out(static_cast<size_t>(m * hd)), lse(static_cast<size_t>(m)),
              sc(static_cast<size_t>(m * tokens)), inv(static_cast<size_t>(m));
          page_partial(m, hd, scale, q.data(), q_doc.data(), tokens, k.data(), v.data(),
                       docs.data(), out.data(), lse.data(), sc.data(), inv.data());
          for (int64_t r = 0; r < m; ++r) {
            const Ref want = reference(hd, scale, q.data() + r * hd, q_doc[static_cast<size_t>(r)],
                                       tokens, k.data(), v.data(), docs.data());
            const float got_l = lse[static_cast<size_t>(r)];
            if (want.lse == -INFINITY) {
              EXPECT_EQ(got_l, -INFINITY) << "row " << r;
              for (int64_t d = 0; d < hd; ++d) EXPECT_EQ(out[static_cast<size_t>(r * hd + d)], 0.f);
            } else {
              double mx = 0;
              for (double x : want.out) mx = std::max(mx, std::fabs(x));
              for (int64_t d = 0; d < hd; ++d)
                EXPECT_LE(std::fabs(out[static_cast<size_t>(r * hd + d)] -
                                    want.out[static_cast<size_t>(d)]),
                          1e-5 * mx)
                    << "row " << r << " dim " << d;
              EXPECT_LE(std::fabs(got_l - want.lse), 1e-5 * std::max(1.0, std::fabs(want.lse)))
                  << "row " << r;
            }
            // The same row alone: the same bits.
            std::vector<float> o1(static_cast<size_t>(hd));
            float l1 = 0, inv1 = 0;
            std::vector<float> sc1(static_cast<size_t>(tokens));
            page_partial(1, hd, scale, q.data() + r * hd, &q_doc[static_cast<size_t>(r)], tokens,
                         k.data(), v.data(), docs.data(), o1.data(), &l1, sc1.data(), &inv1);
            EXPECT_EQ(std::memcmp(&l1, &lse[static_cast<size_t>(r)], 4), 0) << "row " << r;
            EXPECT_EQ(std::memcmp(o1.data(), out.data() + r * hd, static_cast<size_t>(hd) * 4), 0)
                << "row " << r;
          }
          ++cases;
        }
  EXPECT_EQ(cases, 5 * 6 * 6 * 3);
}

// bf16 pages (a bf16 model's cache): the kernel widens each bf16 value to fp32 as it reads it,
// so its result is bit for bit the fp32 kernel's on the widened values, for every head_dim (the
// partial last vector included), row count and fill.
TEST_P(PageKernel, Bf16PagesGiveTheFp32KernelsBitsOnTheWidenedValues) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  int cases = 0;
  for (int64_t hd : {8, 16, 20, 64, 128})
    for (int64_t m : {1, 3, 4, 8})
      for (int64_t tokens : {1, 17, 64}) {
        const float scale = 1.f / std::sqrt(static_cast<float>(hd));
        std::vector<float> q(static_cast<size_t>(m * hd)), kw(static_cast<size_t>(tokens * hd)),
            vw(kw.size());
        std::vector<uint16_t> kb(kw.size()), vb(kw.size());
        for (auto& x : q) x = 2.f * nd(rng);
        for (size_t i = 0; i < kw.size(); ++i) {
          kb[i] = numeric::f32_to_bf16(2.f * nd(rng));
          vb[i] = numeric::f32_to_bf16(nd(rng));
          kw[i] = numeric::bf16_to_f32(kb[i]);
          vw[i] = numeric::bf16_to_f32(vb[i]);
        }
        std::vector<int32_t> docs(static_cast<size_t>(tokens)), q_doc(static_cast<size_t>(m));
        for (int64_t j = 0; j < tokens; ++j) docs[static_cast<size_t>(j)] = j % 5 == 4;
        for (int64_t r = 0; r < m; ++r) q_doc[static_cast<size_t>(r)] = r % 3 == 2;
        std::vector<float> o32(q.size()), o16(q.size()), l32(static_cast<size_t>(m)),
            l16(l32.size()), inv(l32.size()), sc(static_cast<size_t>(m * tokens));
        page_partial(m, hd, scale, q.data(), q_doc.data(), tokens, kw.data(), vw.data(),
                     docs.data(), o32.data(), l32.data(), sc.data(), inv.data());
        page_partial(m, hd, scale, q.data(), q_doc.data(), tokens, kb.data(), vb.data(),
                     docs.data(), o16.data(), l16.data(), sc.data(), inv.data());
        EXPECT_EQ(std::memcmp(o32.data(), o16.data(), o32.size() * 4), 0)
            << "head_dim " << hd << " rows " << m << " tokens " << tokens;
        EXPECT_EQ(std::memcmp(l32.data(), l16.data(), l32.size() * 4), 0)
            << "head_dim " << hd << " rows " << m << " tokens " << tokens;
        ++cases;
      }
  EXPECT_EQ(cases, 5 * 4 * 3);
}

INSTANTIATE_TEST_SUITE_P(Isas, PageKernel,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(cpu::isa_name(info.param));
                         });

}  // namespace
}  // namespace ring::gen
