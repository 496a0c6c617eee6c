#include "common/topology/global_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "common/topology/tsp.h"

namespace ring::topology {

namespace {

using Matrix = CostTable<int>;

constexpr int kTorusTwoOptPasses = 100;

int hop(const ClusterTopology& t, const std::string& a, const std::string& b) {
  if (a == b) return 0;
  if (!t.contains(a) || !t.contains(b)) return t.max_hops() + 2;
  return t.hops(a, b);
}

Matrix hop_matrix(const ClusterTopology& t, const std::vector<std::string>& nodes) {
  const size_t n = nodes.size();
  Matrix m(n, std::vector<int>(n, 0));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) m[i][j] = m[j][i] = hop(t, nodes[i], nodes[j]);
  return m;
}

}  // namespace

int64_t ring_hops(const ClusterTopology& t, const std::vector<std::string>& order) {
  if (order.size() < 2) return 0;
  int64_t sum = 0;
  for (size_t k = 0; k < order.size(); ++k) sum += hop(t, order[k], order[(k + 1) % order.size()]);
  return sum;
}

GlobalOrder global_ring_order(const ClusterTopology& t, const std::vector<std::string>& job_nodes,
                              const std::map<std::string, std::vector<int>>& local_paths,
                              int workers_per_node) {
  if (job_nodes.empty()) throw TopologyError("the job has no nodes");
  if (workers_per_node < 1) {
    throw TopologyError(
        fmt::format("workers per node must be at least 1 (got {})", workers_per_node));
  }
  std::set<std::string> seen;
  for (const auto& n : job_nodes)
    if (!seen.insert(n).second) throw TopologyError(fmt::format("node {} is listed twice", n));
  for (const auto& [node, path] : local_paths) {
    std::vector<int> s = path;
    std::sort(s.begin(), s.end());
    bool perm = static_cast<int>(s.size()) == workers_per_node;
    for (int k = 0; perm && k < workers_per_node; ++k) perm = s[k] == k;
    if (!perm) {
      throw TopologyError(fmt::format("local path of node {} is not a permutation of 0..{}", node,
                                      workers_per_node - 1));
    }
  }

  GlobalOrder g;
  std::set<std::string> known;
  for (const auto& n : job_nodes) {
    if (t.contains(n))
      known.insert(n);
    else
      g.unknown.push_back(n);
  }
  // The job's known nodes in the topology's own order (DFS or snake).
  std::vector<std::string> base;
  for (const auto& n : t.structural_order())
    if (known.count(n)) base.push_back(n);

  if (base.size() <= 3) {
    g.nodes = base;
    g.method = "trivial";
  } else if (static_cast<int>(base.size()) <= kExactMaxNodes) {
    // Held-Karp: ties go to the smallest next position (the structural order).
    for (int p : held_karp_cycle(hop_matrix(t, base)).cycle) g.nodes.push_back(base[p]);
    g.method = "exact";
  } else if (t.kind() == ClusterTopology::Kind::kTorus) {
    std::vector<int> order(base.size());
    std::iota(order.begin(), order.end(), 0);
    // 2-opt, first improvement, at most 100 passes (a budget for huge jobs).
    if (base.size() <= 4096) two_opt(hop_matrix(t, base), order, kTorusTwoOptPasses);
    for (int p : order) g.nodes.push_back(base[p]);
    g.method = "snake+2opt";
  } else {
    g.nodes = base;
    g.method = t.kind() == ClusterTopology::Kind::kDragonfly ? "dragonfly-dfs" : "tree-dfs";
  }
  g.nodes.insert(g.nodes.end(), g.unknown.begin(), g.unknown.end());
  g.hops = ring_hops(t, g.nodes);
  g.node_list_hops = ring_hops(t, job_nodes);

  for (size_t i = 0; i < g.nodes.size(); ++i) {
    bool reverse = i % 2 == 1;
    g.reversed.push_back(reverse);
    std::vector<int> path(workers_per_node);
    std::iota(path.begin(), path.end(), 0);
    if (auto it = local_paths.find(g.nodes[i]); it != local_paths.end()) path = it->second;
    if (reverse) std::reverse(path.begin(), path.end());
    for (int w : path) g.ranks.push_back(RankSlot{static_cast<int>(i), w});
  }
  return g;
}

}  // namespace ring::topology
