// Global ring order: the order of a job's nodes, and of every rank, around the ring.
//
//   ClusterTopology t = load_cluster_topology("configs/topology/topology.conf");
//   GlobalOrder g = global_ring_order(t, expand_hostlist("node[01-16]"), local_paths, 8);
//   // g.nodes: node order; g.ranks: (node, local worker) for global ranks 0..P-1
//
// Order of nodes:
// - trees and dragonflies: the job's nodes in a depth-first walk of the switch tree, children
//   and nodes in natural name order. Every switch subtree is then one contiguous stretch, so the
//   ring crosses each link of the tree that joins the job's nodes exactly twice, which is the
//   least any ring can (the order is optimal for this hop metric); dragonfly groups and routers
//   are contiguous, so the ring takes the fewest global and inter-router hops.
// - torus: the job's nodes in the snake (boustrophedon) order of the full torus, then 2-opt
//   on the hop metric (never worse than the snake).
// - up to kExactMaxNodes nodes: the exact optimum (Held-Karp), whatever the shape.
// Nodes missing from the topology go last, in node-list order, and are listed in `unknown`;
// their hop cost is max_hops() + 2 to anything.
//
// Ranks: each node contributes its local path (from ringd: entry GPU first, exit GPU last;
// daemon/placement LocalRing::path, with local worker k being path position k that is simply
// 0..w-1). Every second node in ring order runs its path backwards, so the GPU that leaves node
// i and the GPU that enters node i+1 have the same local index: on rail-optimised fabrics
// (GPU k of every node on leaf switch k) the inter-node hop then stays on one rail. With an odd
// number of nodes only the closing hop changes rail. The hop model above does not see rails;
// the rule costs nothing where there are none.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/topology/cluster.h"

namespace ring::topology {

inline constexpr int kExactMaxNodes = 12;

struct RankSlot {
  int node = 0;   // index into GlobalOrder::nodes
  int local = 0;  // local worker index on that node
};

struct GlobalOrder {
  std::vector<std::string> nodes;    // ring order
  std::vector<bool> reversed;        // per node: its local path runs backwards
  std::vector<RankSlot> ranks;       // global rank r -> (node, local worker)
  int64_t hops = 0;                  // ring cost of `nodes` (closing hop included)
  int64_t node_list_hops = 0;        // ring cost of the job's node list as given
  std::vector<std::string> unknown;  // job nodes the topology does not know
  std::string method;                // "tree-dfs", "snake+2opt", "exact", "trivial"
};

// Sum of hops between consecutive nodes, closing hop included (0 for fewer than 2 nodes).
int64_t ring_hops(const ClusterTopology& topology, const std::vector<std::string>& order);

// `local_paths[node]` overrides the default path 0..workers_per_node-1 (it must be a
// permutation of 0..workers_per_node-1). Throws TopologyError for duplicate nodes, an empty
// node list or a bad local path.
GlobalOrder global_ring_order(const ClusterTopology& topology,
                              const std::vector<std::string>& job_nodes,
                              const std::map<std::string, std::vector<int>>& local_paths = {},
                              int workers_per_node = 1);

}  // namespace ring::topology
