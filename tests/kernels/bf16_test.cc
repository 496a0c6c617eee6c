// bf16 storage: the one rounding (common/numeric/bf16.h) against an independent definition of
// round-to-nearest-even, and the CPU backend's vectorised conversions (kernels/cpu/ops.h
// to_bf16, from_bf16, round_bf16) against it bit for bit on every ISA this CPU runs.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/numeric/bf16.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"

namespace ring::kernels {
namespace {

using cpu::Isa;
namespace nu = ring::numeric;

// Round to nearest even by value: of the two bf16 neighbours of x (x's bits with the low 16
// cleared, and the next bf16 away from zero), the nearer in exact (double) arithmetic, the one
// with an even last bit on a tie. Infinity when x rounds past the largest bf16.
uint16_t rne_by_value(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next magnitude, same sign
  const double dx = std::fabs(static_cast<double>(x));
  const double dlo = std::fabs(static_cast<double>(nu::bf16_to_f32(lo)));
  // The next magnitude of the largest finite bf16 (0x7F7F) is infinity: compare with the
  // halfway point 2^128 - 2^119 (what IEEE rounding uses) instead.
  const double dhi = (lo & 0x7FFF) == 0x7F7F ? std::ldexp(1.0, 128)
                                             : std::fabs(static_cast<double>(nu::bf16_to_f32(hi)));
  const double a = dx - dlo, b = dhi - dx;
  if (a < b) return lo;
  if (b < a) return hi;
  return (lo & 1) ? hi : lo;
}

std::vector<float> specials() {
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, 3.14159265f, 65504.f, 1e-40f, -1e-40f,
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  // Exact ties (low 16 bits 0x8000) with even and odd kept bits, and one ulp either side.
  for (uint32_t base : {0x3F800000u, 0x3F810000u, 0x00010000u, 0x7F7E0000u, 0x7F7F0000u}) {
    for (uint32_t low : {0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      for (uint32_t sign : {0u, 0x80000000u}) v.push_back(std::bit_cast<float>(sign | base | low));
  }
  return v;
}

TEST(Bf16Rounding, MatchesRoundToNearestEvenByValue) {
  for (float x : specials()) {
    if (std::isnan(x) || std::isinf(x)) continue;
    EXPECT_EQ(nu::f32_to_bf16(x), rne_by_value(x)) << std::hex << std::bit_cast<uint32_t>(x);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(nu::f32_to_bf16(x), rne_by_value(x)) << std::hex << std::bit_cast<uint32_t>(x);
  }
}

TEST(Bf16Rounding, EdgesAreIeee) {
  // Past the largest bf16 rounds to infinity; the largest float does too.
  EXPECT_EQ(nu::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(nu::f32_to_bf16(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(nu::f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  // Subnormals are kept, not flushed.
  EXPECT_EQ(nu::f32_to_bf16(std::bit_cast<float>(0x00010000u)), 0x0001);
  EXPECT_NE(nu::round_bf16(1e-40f), 0.f);
  // NaN stays NaN, quiet, with its sign, even when its payload is only in the dropped bits.
  for (uint32_t bits : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7F80FFFFu}) {
    const uint16_t h = nu::f32_to_bf16(std::bit_cast<float>(bits));
    EXPECT_TRUE(std::isnan(nu::bf16_to_f32(h))) << std::hex << bits;
    EXPECT_EQ(h & 0x8000, (bits >> 16) & 0x8000);
    EXPECT_NE(h & 0x0040, 0);
  }
  // bf16 -> fp32 is exact and round-trips.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = nu::bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(nu::f32_to_bf16(f), h);
  }
}

class Bf16Convert : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu::isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU cannot run " << cpu::isa_name(GetParam())
                   << " code (the path is compiled, not run here)";
    ASSERT_EQ(cpu::set_isa(GetParam()), Status::kOk);
  }
  void TearDown() override { cpu::set_isa(cpu::best_isa()); }
};

// Every ISA gives the scalar rounding's bits, on odd lengths (tails) and on several threads.
TEST_P(Bf16Convert, EveryIsaGivesTheOneRoundingBitForBit) {
  std::mt19937 rng(11);
  for (int64_t n : {1, 7, 15, 16, 17, 33, 1003, 100003}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      // Random bit patterns (NaN, inf, subnormals included) and the special values.
      x[i] = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    }
    const std::vector<float> sp = specials();
    for (size_t i = 0; i < sp.size() && i < x.size(); ++i) x[i * 3 % x.size()] = sp[i];
    std::vector<uint16_t> h(x.size());
    ASSERT_EQ(cpu::to_bf16(n, x.data(), h.data(), 3), Status::kOk);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(h[i], nu::f32_to_bf16(x[i]))
          << "n " << n << " i " << i << " x " << std::hex << std::bit_cast<uint32_t>(x[i]);
    std::vector<float> back(x.size());
    ASSERT_EQ(cpu::from_bf16(n, h.data(), back.data(), 3), Status::kOk);
    std::vector<float> rounded = x;
    ASSERT_EQ(cpu::round_bf16(n, rounded.data(), 2), Status::kOk);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), static_cast<uint32_t>(h[i]) << 16);
      ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), std::bit_cast<uint32_t>(back[i]));
    }
  }
}

TEST_P(Bf16Convert, BadArgumentsAreRefused) {
  std::vector<uint16_t> h(4);
  EXPECT_EQ(cpu::to_bf16(4, nullptr, h.data(), 1), Status::kInvalidArgument);
  EXPECT_EQ(cpu::from_bf16(-1, h.data(), nullptr, 1), Status::kInvalidArgument);
  EXPECT_EQ(cpu::round_bf16(0, nullptr, 1), Status::kOk);
}

// The Backend's conversion ops are the same functions: f32 -> bf16 -> f32 and the in-place
// rounding agree bit for bit; a same-dtype convert copies; other combinations are refused.
TEST_P(Bf16Convert, BackendConvertAndRoundAreTheOneRounding) {
  std::string err;
  auto be = create_backend("cpu", 2, &err);
  ASSERT_NE(be, nullptr) << err;
  std::mt19937 rng(3);
  const int64_t n = 4099;
  std::vector<float> x(n), back(n), rounded(n), copy(n);
  for (float& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  std::vector<uint16_t> h(n);
  ASSERT_EQ(be->convert(DType::kF32, DType::kBF16, n, x.data(), h.data()), Status::kOk);
  ASSERT_EQ(be->convert(DType::kBF16, DType::kF32, n, h.data(), back.data()), Status::kOk);
  rounded = x;
  ASSERT_EQ(be->round_to_bf16(n, rounded.data()), Status::kOk);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i], nu::f32_to_bf16(x[i]));
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(rounded[i]));
  }
  ASSERT_EQ(be->convert(DType::kF32, DType::kF32, n, x.data(), copy.data()), Status::kOk);
  EXPECT_EQ(std::memcmp(copy.data(), x.data(), n * sizeof(float)), 0);
  EXPECT_EQ(be->convert(DType::kF32, DType::kBF16, 4, nullptr, h.data()),
            Status::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Isa, Bf16Convert,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& i) {
                           return std::string(cpu::isa_name(i.param));
                         });

}  // namespace
}  // namespace ring::kernels
