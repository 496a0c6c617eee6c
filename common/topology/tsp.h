// Ring-order solvers shared by the node-local GPU ring (daemon/placement/local_order) and the
// global node ring (global_order): a symmetric travelling-salesman tour over the positions
// 0..n-1 of a cost matrix.
//
//   std::vector<std::vector<uint64_t>> c = ...;          // c[i][j]: cost between i and j
//   HeldKarpResult<uint64_t> r = held_karp_cycle(c);     // exact, r.cycle starts at 0
//   two_opt(c, tour);                                    // heuristic improvement in place
//
// Cost is an integer type (instantiated for int, int64_t and uint64_t); tour sums are kept in
// TourCost<Cost> (uint64_t for unsigned costs, int64_t for signed ones), so the caller keeps the
// headroom: n times the largest entry must fit in a quarter of that type.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace ring::topology {

template <class Cost>
using CostTable = std::vector<std::vector<Cost>>;

template <class Cost>
using TourCost = std::conditional_t<std::is_unsigned_v<Cost>, uint64_t, int64_t>;

// Held-Karp keeps 2^n * n sums: 20 positions is 160 MiB of uint64_t; callers stop far below
// (16 GPUs on a node, 12 nodes for the global ring).
inline constexpr int kHeldKarpMaxPositions = 20;

template <class Cost>
struct HeldKarpResult {
  std::vector<int> cycle;  // every position once, starting at 0 (empty for an empty matrix)
  TourCost<Cost> cost{};   // closing link included
};

// Minimum-cost Hamiltonian cycle (exact, dynamic programming over subsets). Ties: the table is
// filled from the full set down, so the cycle is rebuilt forwards taking the smallest next
// position among optimal ones, i.e. the lexicographically smallest optimal cycle starting at 0.
// Throws std::invalid_argument for a matrix that is not square or has more than
// kHeldKarpMaxPositions positions.
template <class Cost>
HeldKarpResult<Cost> held_karp_cycle(const CostTable<Cost>& cost);

// Sum of cost[t[k]][t[k+1]] over the tour, closing link included; 0 for fewer than 2 positions.
// Throws std::invalid_argument for a position outside the matrix.
template <class Cost>
TourCost<Cost> tour_cost(const CostTable<Cost>& cost, const std::vector<int>& tour);

// 2-opt on the closed tour `tour`, first improvement: for i < j (not the pair that would only
// reverse the whole tour) reverse tour[i+1..j] whenever that strictly shortens it, scanning on
// from the same (i, j). Repeats passes until one improves nothing or, when max_passes > 0, after
// max_passes passes. Never makes the tour more expensive; tour[0] stays first. Returns true when
// it stopped because no move helped (a 2-opt local optimum). Tours of fewer than 4 positions are
// left as they are. Throws std::invalid_argument for a position outside the matrix.
template <class Cost>
bool two_opt(const CostTable<Cost>& cost, std::vector<int>& tour, int max_passes = 0);

}  // namespace ring::topology
