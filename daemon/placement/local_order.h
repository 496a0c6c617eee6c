// Node-local ring order: the cycle through a node's GPUs that uses the best links.
//
//   LocalRing r = local_ring_order(topology);   // r.cycle: GPU indices, r.path: cut for a job
//                                               // that spans several nodes
//
// Cost model. Every link of a ring carries the same bytes per step, so a ring is as slow as its
// worst links, and links of the same class share resources (a PCIe switch uplink, the socket
// interconnect). The cycle therefore minimises, lexicographically, the number of links of the
// worst class used, then of the next class, and so on. Link classes, best first: NVLink with
// more links before fewer (NV18 < NV12 < NV4), then PIX < PXB < PHB < NODE < SYS. Only the
// classes present on the node count, and class r weighs B^r with B = GPUs + 1, so the sum of the
// weights of a cycle (its cost) compares exactly like that lexicographic vector.
//
// Search: exact (Held-Karp dynamic programming over subsets) for up to kExactMaxGpus GPUs, which
// covers every node built today; beyond it nearest-neighbour from every start plus 2-opt.
// Ties are broken deterministically: the lexicographically smallest cycle starting at the first
// GPU (so the same topology always yields the same order).
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/placement/gpu_topology.h"

namespace ring::placement {

inline constexpr int kExactMaxGpus = 16;

// cost[i][j]: weight of the link between GPU i and GPU j (symmetric: the worse of the two
// directions when the matrix is not symmetric); 0 on the diagonal.
using CostMatrix = std::vector<std::vector<uint64_t>>;

// 0 for the best class. Ordering of links by closeness (NV more links < NV fewer < PIX < ...).
bool closer(const Link& a, const Link& b);

// Weights for the GPUs in `gpus` (indices into topology.gpus; all GPUs when empty), in that
// order: cost[a][b] is between gpus[a] and gpus[b].
CostMatrix link_cost_matrix(const GpuTopology& topology, const std::vector<int>& gpus = {});

// Sum of cost[c[k]][c[k+1]] over the cycle, including the closing link. 0 for fewer than 2.
uint64_t cycle_cost(const CostMatrix& cost, const std::vector<int>& cycle);

struct CycleResult {
  std::vector<int> cycle;  // positions 0..n-1 of the cost matrix, starting at 0
  uint64_t cost = 0;
  bool exact = false;  // optimal (dynamic programming) or heuristic
};

// Minimum-cost Hamiltonian cycle over all positions of `cost` (see the header comment).
CycleResult best_cycle(const CostMatrix& cost);

struct LocalRing {
  std::vector<int> cycle;  // GPU indices in ring order, starting at the lowest
  uint64_t cost = 0;
  bool exact = false;
  // The cycle cut open for a multi-node ring: entry GPU first, exit GPU last. The cut removes
  // the most expensive link of the cycle (the inter-node hop replaces it); among equally
  // expensive links, the one whose two GPUs are closest to a NIC, then the closing link, then
  // the first in cycle order.
  std::vector<int> path;
  std::vector<Link> links;  // links[k]: between cycle[k] and cycle[k+1 mod n]
};

// Ring over `gpus` (all GPUs when empty). Throws PlacementError for an index out of range.
LocalRing local_ring_order(const GpuTopology& topology, const std::vector<int>& gpus = {});

}  // namespace ring::placement
