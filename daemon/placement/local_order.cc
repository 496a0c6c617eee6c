#include "daemon/placement/local_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "common/topology/tsp.h"
#include "daemon/placement/errors.h"

namespace ring::placement {

namespace {

// Position of a class in the closeness order; NVLink classes come first, more links first.
int class_order(const Link& l) {
  switch (l.kind) {
    case LinkKind::kSelf:
      return -1;
    case LinkKind::kNvLink:
      return 0;
    case LinkKind::kPix:
      return 1;
    case LinkKind::kPxb:
      return 2;
    case LinkKind::kPhb:
      return 3;
    case LinkKind::kNode:
      return 4;
    case LinkKind::kSys:
      return 5;
  }
  return 6;
}

constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max() / 4;

// Rotates to start at 0 and picks the direction with the smaller second element.
void canonical(std::vector<int>& t) {
  auto zero = std::find(t.begin(), t.end(), 0);
  std::rotate(t.begin(), zero, t.end());
  if (t.size() > 2 && t.back() < t[1]) std::reverse(t.begin() + 1, t.end());
}

}  // namespace

bool closer(const Link& a, const Link& b) {
  int ca = class_order(a), cb = class_order(b);
  if (ca != cb) return ca < cb;
  return a.kind == LinkKind::kNvLink && a.nvlinks > b.nvlinks;
}

CostMatrix link_cost_matrix(const GpuTopology& topology, const std::vector<int>& gpus_in) {
  std::vector<int> gpus = gpus_in;
  if (gpus.empty()) {
    gpus.resize(topology.gpus.size());
    std::iota(gpus.begin(), gpus.end(), 0);
  }
  const size_t n = gpus.size();
  for (int g : gpus) {
    if (g < 0 || static_cast<size_t>(g) >= topology.gpu_links.size()) {
      throw PlacementError(
          fmt::format("GPU {} is not on this node (it has {} GPUs)", g, topology.gpu_links.size()));
    }
  }
  // Worse direction of each pair, then the distinct classes present, best first.
  auto link = [&](size_t a, size_t b) {
    const Link& x = topology.gpu_links[gpus[a]][gpus[b]];
    const Link& y = topology.gpu_links[gpus[b]][gpus[a]];
    return closer(x, y) ? y : x;
  };
  std::vector<Link> classes;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b)
      if (a != b) {
        Link l = link(a, b);
        if (std::find(classes.begin(), classes.end(), l) == classes.end()) classes.push_back(l);
      }
  std::sort(classes.begin(), classes.end(), closer);
  // Base n+1 makes the sum an exact lexicographic key (a cycle has at most n links of a class);
  // if that would overflow (more than ~10 classes on 64 GPUs), a smaller base keeps the order of
  // classes and only loses exactness between many better links and one worse link.
  uint64_t base = n + 1;
  const uint64_t limit = uint64_t{1} << 56;
  while (base > 2) {
    uint64_t w = 1;
    bool ok = true;
    for (size_t r = 1; r < classes.size() && ok; ++r) {
      if (w > limit / base) ok = false;
      w *= base;
    }
    if (ok) break;
    --base;
  }
  std::vector<uint64_t> weight(classes.size());
  for (size_t r = 0; r < classes.size(); ++r) weight[r] = r == 0 ? 1 : weight[r - 1] * base;
  CostMatrix cost(n, std::vector<uint64_t>(n, 0));
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b)
      if (a != b) {
        size_t r = std::find(classes.begin(), classes.end(), link(a, b)) - classes.begin();
        cost[a][b] = weight[r];
      }
  return cost;
}

uint64_t cycle_cost(const CostMatrix& cost, const std::vector<int>& cycle) {
  return topology::tour_cost(cost, cycle);
}

CycleResult best_cycle(const CostMatrix& c) {
  const int n = static_cast<int>(c.size());
  CycleResult r;
  if (n == 0) return r;
  if (n <= 3) {
    r.cycle.resize(n);
    std::iota(r.cycle.begin(), r.cycle.end(), 0);
    r.cost = cycle_cost(c, r.cycle);
    r.exact = true;
    return r;
  }
  if (n <= kExactMaxGpus) {
    // Held-Karp: the lexicographically smallest optimal cycle starting at 0.
    auto hk = topology::held_karp_cycle(c);
    r.cycle = std::move(hk.cycle);
    r.cost = hk.cost;
    r.exact = true;
    return r;
  }
  // Heuristic: nearest neighbour from every start (ties to the lowest index), 2-opt, keep the
  // cheapest, canonical form.
  uint64_t best_cost = kInf;
  for (int s = 0; s < n; ++s) {
    std::vector<int> t{s};
    std::vector<bool> used(n, false);
    used[s] = true;
    for (int k = 1; k < n; ++k) {
      int last = t.back(), pick = -1;
      for (int u = 0; u < n; ++u)
        if (!used[u] && (pick < 0 || c[last][u] < c[last][pick])) pick = u;
      used[pick] = true;
      t.push_back(pick);
    }
    topology::two_opt(c, t);  // until no move helps
    canonical(t);
    uint64_t cost = cycle_cost(c, t);
    if (cost < best_cost || (cost == best_cost && t < r.cycle)) {
      best_cost = cost;
      r.cycle = t;
    }
  }
  r.cost = best_cost;
  r.exact = false;
  return r;
}

LocalRing local_ring_order(const GpuTopology& topology, const std::vector<int>& gpus_in) {
  std::vector<int> gpus = gpus_in;
  if (gpus.empty()) {
    gpus.resize(topology.gpus.size());
    std::iota(gpus.begin(), gpus.end(), 0);
  }
  std::sort(gpus.begin(), gpus.end());
  CostMatrix cost = link_cost_matrix(topology, gpus);
  CycleResult cr = best_cycle(cost);
  LocalRing out;
  out.cost = cr.cost;
  out.exact = cr.exact;
  for (int p : cr.cycle) out.cycle.push_back(gpus[p]);
  const size_t n = out.cycle.size();
  for (size_t k = 0; k < n && n > 1; ++k) {
    out.links.push_back(topology.gpu_links[out.cycle[k]][out.cycle[(k + 1) % n]]);
  }
  if (n <= 1) {
    out.path = out.cycle;
    return out;
  }
  // NIC closeness of a GPU: its best GPU-NIC link class (lower is closer); 0 without NICs.
  auto nic_rank = [&](int g) {
    int best = 0;
    if (static_cast<size_t>(g) < topology.gpu_nic_links.size() &&
        !topology.gpu_nic_links[g].empty()) {
      best = 100;
      for (const Link& l : topology.gpu_nic_links[g]) best = std::min(best, class_order(l));
    }
    return best;
  };
  // Cut candidates in preference order among the most expensive links: closest to NICs, then
  // the closing link (k = n-1, which leaves the path in cycle order), then first in the cycle.
  size_t cut = n - 1;
  auto key = [&](size_t k) {
    uint64_t w = cost[cr.cycle[k]][cr.cycle[(k + 1) % n]];
    int nic = nic_rank(out.cycle[k]) + nic_rank(out.cycle[(k + 1) % n]);
    return std::make_tuple(w, -nic, k == n - 1 ? 1 : 0, -static_cast<long>(k));
  };
  for (size_t k = 0; k < n; ++k)
    if (key(k) > key(cut)) cut = k;
  for (size_t k = 1; k <= n; ++k) out.path.push_back(out.cycle[(cut + k) % n]);
  return out;
}

}  // namespace ring::placement
