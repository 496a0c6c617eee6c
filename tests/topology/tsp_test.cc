// The shared ring-order solvers (common/topology/tsp.h) on small random matrices: Held-Karp
// against brute force over every cycle (cost and the lexicographically smallest optimum), and
// 2-opt never making a tour worse and stopping at a 2-opt local optimum.
#include "common/topology/tsp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>

namespace ring::topology {
namespace {

// Symmetric, zero diagonal, entries 1..range (small ranges make many ties).
template <class Cost>
CostTable<Cost> random_matrix(std::mt19937& rng, int n, int range) {
  CostTable<Cost> c(n, std::vector<Cost>(n, 0));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) c[i][j] = c[j][i] = static_cast<Cost>(1 + rng() % range);
  return c;
}

// Every cycle starting at 0, in lexicographic order: the first cheapest one.
template <class Cost>
HeldKarpResult<Cost> brute_force(const CostTable<Cost>& c) {
  std::vector<int> t(c.size());
  std::iota(t.begin(), t.end(), 0);
  HeldKarpResult<Cost> best;
  bool first = true;
  do {
    auto cost = tour_cost(c, t);
    if (first || cost < best.cost) {
      best.cycle = t;
      best.cost = cost;
      first = false;
    }
  } while (std::next_permutation(t.begin() + 1, t.end()));
  return best;
}

template <class Cost>
void held_karp_equals_brute_force(uint32_t seed) {
  std::mt19937 rng(seed);
  for (int n = 1; n <= 8; ++n) {
    for (int rep = 0; rep < 12; ++rep) {
      auto c = random_matrix<Cost>(rng, n, rep % 2 ? 3 : 1000);
      auto hk = held_karp_cycle(c);
      auto bf = brute_force(c);
      EXPECT_EQ(hk.cost, bf.cost) << "n=" << n << " rep=" << rep;
      EXPECT_EQ(hk.cycle, bf.cycle) << "n=" << n << " rep=" << rep;
      EXPECT_EQ(tour_cost(c, hk.cycle), hk.cost);
    }
  }
}

TEST(Tsp, HeldKarpEqualsBruteForceUint64) {
  held_karp_equals_brute_force<uint64_t>(7);
}
TEST(Tsp, HeldKarpEqualsBruteForceInt) {
  held_karp_equals_brute_force<int>(11);
}

TEST(Tsp, HeldKarpEmptyAndTiny) {
  EXPECT_TRUE(held_karp_cycle(CostTable<int>{}).cycle.empty());
  auto one = held_karp_cycle(CostTable<int>{{0}});
  EXPECT_EQ(one.cycle, std::vector<int>{0});
  EXPECT_EQ(one.cost, 0);
  auto two = held_karp_cycle(CostTable<uint64_t>{{0, 5}, {5, 0}});
  EXPECT_EQ(two.cycle, (std::vector<int>{0, 1}));
  EXPECT_EQ(two.cost, 10u);
}

TEST(Tsp, TwoOptNeverWorsensAndReachesLocalOptimum) {
  std::mt19937 rng(3);
  for (int n = 4; n <= 30; ++n) {
    for (int rep = 0; rep < 6; ++rep) {
      auto c = random_matrix<uint64_t>(rng, n, rep % 2 ? 4 : 100);
      std::vector<int> t(n);
      std::iota(t.begin(), t.end(), 0);
      std::shuffle(t.begin() + 1, t.end(), rng);
      const int start = t[0];
      const uint64_t before = tour_cost(c, t);
      EXPECT_TRUE(two_opt(c, t));
      EXPECT_LE(tour_cost(c, t), before) << "n=" << n;
      EXPECT_EQ(t[0], start);
      std::vector<int> s = t;
      std::sort(s.begin(), s.end());
      for (int k = 0; k < n; ++k) ASSERT_EQ(s[k], k);
      // No single 2-opt move improves the result.
      for (int i = 0; i + 2 < n; ++i)
        for (int j = i + 2; j < n; ++j) {
          if (i == 0 && j == n - 1) continue;
          int a = t[i], b = t[i + 1], d = t[j], e = t[(j + 1) % n];
          EXPECT_GE(c[a][d] + c[b][e], c[a][b] + c[d][e]) << "n=" << n << " i=" << i << " j=" << j;
        }
      // A one-pass budget also never worsens (and may stop before the local optimum).
      std::shuffle(t.begin() + 1, t.end(), rng);
      const uint64_t again = tour_cost(c, t);
      two_opt(c, t, 1);
      EXPECT_LE(tour_cost(c, t), again);
    }
  }
}

TEST(Tsp, BadInputIsAClearError) {
  CostTable<int> ragged{{0, 1}, {1}};
  try {
    held_karp_cycle(ragged);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "held_karp_cycle: cost matrix must be square: row 1 has 1 entries, expected 2");
  }
  CostTable<int> big(kHeldKarpMaxPositions + 1, std::vector<int>(kHeldKarpMaxPositions + 1, 1));
  EXPECT_THROW(held_karp_cycle(big), std::invalid_argument);
  CostTable<int> c{{0, 1}, {1, 0}};
  std::vector<int> t{0, 2};
  EXPECT_THROW(tour_cost(c, t), std::invalid_argument);
  EXPECT_THROW(two_opt(c, t), std::invalid_argument);
}

}  // namespace
}  // namespace ring::topology
