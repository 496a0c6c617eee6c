#include "common/topology/global_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

namespace ring::topology {

namespace {

using Matrix = std::vector<std::vector<int>>;

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

// Held-Karp, rebuilt forwards so that ties go to the smallest next position (the input order).
std::vector<int> exact_cycle(const Matrix& c) {
  const int n = static_cast<int>(c.size());
  const uint32_t full = (uint32_t{1} << n) - 1;
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  std::vector<int64_t> rest((size_t{1} << n) * n, kInf);
  auto at = [&](uint32_t mask, int v) -> int64_t& { return rest[size_t{mask} * n + v]; };
  for (int v = 0; v < n; ++v) at(full, v) = c[v][0];
  for (uint32_t mask = full - 1; mask >= 1; --mask) {
    if (!(mask & 1u)) continue;
    for (int v = 0; v < n; ++v) {
      if (!(mask >> v & 1u)) continue;
      int64_t best = kInf;
      for (int u = 1; u < n; ++u)
        if (!(mask >> u & 1u)) best = std::min(best, c[v][u] + at(mask | (1u << u), u));
      at(mask, v) = best;
    }
  }
  std::vector<int> cycle{0};
  uint32_t mask = 1;
  int v = 0;
  while (mask != full) {
    for (int u = 1; u < n; ++u) {
      if (!(mask >> u & 1u) && c[v][u] + at(mask | (1u << u), u) == at(mask, v)) {
        mask |= 1u << u;
        v = u;
        cycle.push_back(u);
        break;
      }
    }
  }
  return cycle;
}

// 2-opt with first improvement until no move helps (or a pass budget runs out on huge jobs).
void two_opt(const Matrix& c, std::vector<int>& t) {
  const size_t n = t.size();
  if (n < 4) return;
  for (int pass = 0; pass < 100; ++pass) {
    bool improved = false;
    for (size_t i = 0; i + 2 < n; ++i) {
      for (size_t j = i + 2; j < n; ++j) {
        if (i == 0 && j == n - 1) continue;
        int a = t[i], b = t[i + 1], d = t[j], e = t[(j + 1) % n];
        if (c[a][d] + c[b][e] < c[a][b] + c[d][e]) {
          std::reverse(t.begin() + static_cast<long>(i) + 1, t.begin() + static_cast<long>(j) + 1);
          improved = true;
        }
      }
    }
    if (!improved) return;
  }
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
    for (int p : exact_cycle(hop_matrix(t, base))) g.nodes.push_back(base[p]);
    g.method = "exact";
  } else if (t.kind() == ClusterTopology::Kind::kTorus) {
    std::vector<int> order(base.size());
    std::iota(order.begin(), order.end(), 0);
    if (base.size() <= 4096) two_opt(hop_matrix(t, base), order);
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
