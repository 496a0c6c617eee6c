#include "common/topology/tsp.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace ring::topology {

namespace {

template <class Cost>
void check_square(const CostTable<Cost>& c, const char* what) {
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i].size() != c.size()) {
      throw std::invalid_argument(
          fmt::format("{}: cost matrix must be square: row {} has {} entries, expected {}", what, i,
                      c[i].size(), c.size()));
    }
  }
}

template <class Cost>
void check_tour(const CostTable<Cost>& c, const std::vector<int>& t, const char* what) {
  for (int p : t) {
    if (p < 0 || static_cast<size_t>(p) >= c.size()) {
      throw std::invalid_argument(fmt::format(
          "{}: tour position {} is outside the {}x{} cost matrix", what, p, c.size(), c.size()));
    }
  }
}

}  // namespace

template <class Cost>
HeldKarpResult<Cost> held_karp_cycle(const CostTable<Cost>& c) {
  using Sum = TourCost<Cost>;
  check_square(c, "held_karp_cycle");
  const int n = static_cast<int>(c.size());
  if (n > kHeldKarpMaxPositions) {
    throw std::invalid_argument(fmt::format(
        "held_karp_cycle: {} positions, at most {} are allowed (memory grows as 2^n * n)", n,
        kHeldKarpMaxPositions));
  }
  HeldKarpResult<Cost> r;
  if (n == 0) return r;
  // rest[mask][v]: cheapest way to visit every position outside `mask`, starting at v (in mask)
  // and returning to 0. Filling from the full mask down lets the cycle be rebuilt forwards,
  // taking the smallest next position among optimal ones.
  constexpr Sum kInf = std::numeric_limits<Sum>::max() / 4;
  const uint32_t full = (uint32_t{1} << n) - 1;
  std::vector<Sum> rest((size_t{1} << n) * n, kInf);
  auto at = [&](uint32_t mask, int v) -> Sum& { return rest[size_t{mask} * n + v]; };
  for (int v = 0; v < n; ++v) at(full, v) = static_cast<Sum>(c[v][0]);
  for (uint32_t mask = full - 1; mask >= 1; --mask) {
    if (!(mask & 1u)) continue;
    for (int v = 0; v < n; ++v) {
      if (!(mask >> v & 1u)) continue;
      Sum best = kInf;
      for (int u = 1; u < n; ++u)
        if (!(mask >> u & 1u))
          best = std::min(best, static_cast<Sum>(c[v][u]) + at(mask | (1u << u), u));
      at(mask, v) = best;
    }
  }
  r.cost = at(1, 0);
  r.cycle = {0};
  uint32_t mask = 1;
  int v = 0;
  while (mask != full) {
    for (int u = 1; u < n; ++u) {
      if (!(mask >> u & 1u) && static_cast<Sum>(c[v][u]) + at(mask | (1u << u), u) == at(mask, v)) {
        mask |= 1u << u;
        v = u;
        r.cycle.push_back(u);
        break;
      }
    }
  }
  return r;
}

template <class Cost>
TourCost<Cost> tour_cost(const CostTable<Cost>& c, const std::vector<int>& t) {
  using Sum = TourCost<Cost>;
  check_tour(c, t, "tour_cost");
  if (t.size() < 2) return 0;
  Sum sum = 0;
  for (size_t k = 0; k < t.size(); ++k) sum += static_cast<Sum>(c[t[k]][t[(k + 1) % t.size()]]);
  return sum;
}

template <class Cost>
bool two_opt(const CostTable<Cost>& c, std::vector<int>& t, int max_passes) {
  using Sum = TourCost<Cost>;
  check_square(c, "two_opt");
  check_tour(c, t, "two_opt");
  const size_t n = t.size();
  if (n < 4) return true;
  for (int pass = 0; max_passes <= 0 || pass < max_passes; ++pass) {
    bool improved = false;
    for (size_t i = 0; i + 2 < n; ++i) {
      for (size_t j = i + 2; j < n; ++j) {
        if (i == 0 && j == n - 1) continue;
        int a = t[i], b = t[i + 1], d = t[j], e = t[(j + 1) % n];
        Sum before = static_cast<Sum>(c[a][b]) + static_cast<Sum>(c[d][e]);
        Sum after = static_cast<Sum>(c[a][d]) + static_cast<Sum>(c[b][e]);
        if (after < before) {
          std::reverse(t.begin() + static_cast<long>(i) + 1, t.begin() + static_cast<long>(j) + 1);
          improved = true;
        }
      }
    }
    if (!improved) return true;
  }
  return false;
}

#define RING_TSP_INSTANTIATE(Cost)                                                          \
  template HeldKarpResult<Cost> held_karp_cycle<Cost>(const CostTable<Cost>&);              \
  template TourCost<Cost> tour_cost<Cost>(const CostTable<Cost>&, const std::vector<int>&); \
  template bool two_opt<Cost>(const CostTable<Cost>&, std::vector<int>&, int);

RING_TSP_INSTANTIATE(int)
RING_TSP_INSTANTIATE(int64_t)
RING_TSP_INSTANTIATE(uint64_t)

#undef RING_TSP_INSTANTIATE

}  // namespace ring::topology
