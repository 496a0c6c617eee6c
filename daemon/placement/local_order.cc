#include "daemon/placement/local_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>

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

// 2-opt until no improving move: reverse cycle[i+1..j] when that shortens the tour.
void two_opt(const CostMatrix& c, std::vector<int>& t) {
  const size_t n = t.size();
  if (n < 4) return;
  for (bool improved = true; improved;) {
    improved = false;
    for (size_t i = 0; i + 2 < n; ++i) {
      for (size_t j = i + 2; j < n; ++j) {
        if (i == 0 && j == n - 1) continue;
        int a = t[i], b = t[i + 1], d = t[j], e = t[(j + 1) % n];
        uint64_t before = c[a][b] + c[d][e], after = c[a][d] + c[b][e];
        if (after < before) {
          std::reverse(t.begin() + static_cast<long>(i) + 1, t.begin() + static_cast<long>(j) + 1);
          improved = true;
        }
      }
    }
  }
}

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
  if (cycle.size() < 2) return 0;
  uint64_t sum = 0;
  for (size_t k = 0; k < cycle.size(); ++k) sum += cost[cycle[k]][cycle[(k + 1) % cycle.size()]];
  return sum;
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
    // rest[mask][v]: cheapest way to visit every vertex outside `mask`, starting at v (in mask)
    // and returning to 0. Filling from the full mask down lets the cycle be rebuilt forwards,
    // taking the smallest next vertex among optimal ones: the lexicographically smallest optimum.
    const uint32_t full = (uint32_t{1} << n) - 1;
    std::vector<uint64_t> rest((size_t{1} << n) * n, kInf);
    auto at = [&](uint32_t mask, int v) -> uint64_t& { return rest[size_t{mask} * n + v]; };
    for (int v = 0; v < n; ++v) at(full, v) = c[v][0];
    for (uint32_t mask = full - 1; mask >= 1; --mask) {
      if (!(mask & 1u)) continue;
      for (int v = 0; v < n; ++v) {
        if (!(mask >> v & 1u)) continue;
        uint64_t best = kInf;
        for (int u = 1; u < n; ++u) {
          if (mask >> u & 1u) continue;
          uint64_t x = c[v][u] + at(mask | (1u << u), u);
          best = std::min(best, x);
        }
        at(mask, v) = best;
      }
    }
    r.cost = at(1, 0);
    r.cycle = {0};
    uint32_t mask = 1;
    int v = 0;
    while (mask != full) {
      for (int u = 1; u < n; ++u) {
        if (mask >> u & 1u) continue;
        if (c[v][u] + at(mask | (1u << u), u) == at(mask, v)) {
          mask |= 1u << u;
          v = u;
          r.cycle.push_back(u);
          break;
        }
      }
    }
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
    two_opt(c, t);
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
