#include "daemon/placement/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>

#include "daemon/placement/errors.h"

namespace ring::placement {

namespace {

// NUMA node of a GPU: nvidia-smi's NUMA Affinity when it names a node this process has cores
// on, else the node holding most of the GPU's CPU Affinity, else -1.
int gpu_home(const GpuInfo& g, const CpuTopology& cpus) {
  const auto& nodes = cpus.numa_nodes;
  if (g.numa_node >= 0 && std::find(nodes.begin(), nodes.end(), g.numa_node) != nodes.end()) {
    return g.numa_node;
  }
  std::map<int, int> hits;
  for (const auto& core : cpus.cores)
    for (int pu : core.pus)
      if (std::binary_search(g.cpu_affinity.begin(), g.cpu_affinity.end(), pu)) {
        ++hits[core.numa_node];
      }
  int best = -1, best_hits = 0;
  for (auto [node, h] : hits)
    if (h > best_hits) best = node, best_hits = h;
  return best;
}

}  // namespace

Placement place_workers(const GpuTopology& gpus, const CpuTopology& cpus,
                        const PlacementRequest& req) {
  if (req.workers < 1) {
    throw PlacementError(fmt::format("workers per node must be at least 1 (got {})", req.workers));
  }
  if (req.cpus_per_worker < 0) {
    throw PlacementError(
        fmt::format("cpus per worker must be 0 (automatic) or more (got {})", req.cpus_per_worker));
  }
  if (cpus.cores.empty()) throw PlacementError("the node has no CPU cores to place workers on");
  Placement out;
  out.workers.resize(static_cast<size_t>(req.workers));
  const int n_gpus = static_cast<int>(gpus.gpus.size());

  if (req.device == Device::kGpu) {
    if (n_gpus == 0) {
      throw PlacementError(
          fmt::format("{} GPU workers requested but this node has no GPUs "
                      "(nvidia-smi absent or lists none); use CPU workers",
                      req.workers));
    }
    if (req.workers > n_gpus) {
      throw PlacementError(
          fmt::format("{} GPU workers requested but this node has {} GPUs", req.workers, n_gpus));
    }
    LocalRing full = local_ring_order(gpus);
    if (req.workers == n_gpus) {
      out.ring = full;
    } else {
      // Windows of consecutive GPUs along the full ring keep close GPUs together; the window
      // whose own ring is cheapest wins (ties: earliest window).
      bool have = false;
      for (int s = 0; s < n_gpus; ++s) {
        std::vector<int> subset;
        for (int k = 0; k < req.workers; ++k) subset.push_back(full.cycle[(s + k) % n_gpus]);
        LocalRing r = local_ring_order(gpus, subset);
        if (!have || r.cost < out.ring.cost) out.ring = r, have = true;
      }
    }
    for (int k = 0; k < req.workers; ++k) {
      WorkerPlacement& w = out.workers[k];
      w.local_rank = k;
      w.gpu = out.ring.path[k];
      const GpuInfo& g = gpus.gpus[w.gpu];
      w.cuda_visible_devices = g.uuid.empty() ? std::to_string(w.gpu) : g.uuid;
      w.numa_node = gpu_home(g, cpus);
    }
  } else {
    const int n_nodes = static_cast<int>(cpus.numa_nodes.size());
    for (int k = 0; k < req.workers; ++k) {
      WorkerPlacement& w = out.workers[k];
      w.local_rank = k;
      w.numa_node =
          cpus.numa_nodes[static_cast<size_t>(static_cast<long>(k) * n_nodes / req.workers)];
    }
  }

  // Cores. Home node -1 (unknown) draws from every node in order.
  std::map<int, int> homed;  // workers per home node
  for (const auto& w : out.workers) ++homed[w.numa_node];
  std::vector<bool> taken(cpus.cores.size(), false);
  for (auto& w : out.workers) {
    std::vector<const CpuCore*> home =
        w.numa_node >= 0 ? cpus.cores_of(w.numa_node) : std::vector<const CpuCore*>{};
    if (home.empty())
      for (const auto& c : cpus.cores) home.push_back(&c);
    int want = req.cpus_per_worker;
    if (want == 0) want = std::max(1, static_cast<int>(home.size()) / homed[w.numa_node]);
    auto take = [&](const CpuCore* c) {
      taken[c->id] = true;
      w.cores.push_back(c->id);
    };
    for (const CpuCore* c : home)
      if (static_cast<int>(w.cores.size()) < want && !taken[c->id]) take(c);
    int spilled = 0;
    if (static_cast<int>(w.cores.size()) < want) {
      // Other nodes, nearest OS index first (ties: lower index).
      std::vector<int> others;
      for (int node : cpus.numa_nodes)
        if (node != w.numa_node) others.push_back(node);
      std::stable_sort(others.begin(), others.end(), [&](int a, int b) {
        return std::abs(a - w.numa_node) < std::abs(b - w.numa_node);
      });
      for (int node : others)
        for (const CpuCore* c : cpus.cores_of(node))
          if (static_cast<int>(w.cores.size()) < want && !taken[c->id]) take(c), ++spilled;
    }
    if (spilled > 0) {
      out.notes.push_back(
          fmt::format("worker {}: {} of its {} cores come from outside its NUMA "
                      "node {} (not enough free cores there)",
                      w.local_rank, spilled, want, w.numa_node));
    }
    if (static_cast<int>(w.cores.size()) < want) {
      // Every core is given: share cores of the home node, round-robin from the worker's rank
      // so sharing spreads evenly.
      int missing = want - static_cast<int>(w.cores.size());
      for (size_t i = 0; missing > 0 && i < home.size(); ++i) {
        const CpuCore* c = home[(static_cast<size_t>(w.local_rank) * want + i) % home.size()];
        if (std::find(w.cores.begin(), w.cores.end(), c->id) == w.cores.end()) {
          w.cores.push_back(c->id);
          --missing;
        }
      }
      w.shared = true;
      out.notes.push_back(
          fmt::format("worker {}: shares cores with other workers (the node has "
                      "{} cores for {} workers x {} cores)",
                      w.local_rank, cpus.cores.size(), req.workers, want));
    }
    std::sort(w.cores.begin(), w.cores.end());
    for (int id : w.cores)
      for (int pu : cpus.cores[id].pus) w.cpus.push_back(pu);
    std::sort(w.cpus.begin(), w.cpus.end());
  }
  // A worker that took only free cores may still hold a core a later worker shares.
  std::vector<int> holders(cpus.cores.size(), 0);
  for (const auto& w : out.workers)
    for (int id : w.cores) ++holders[id];
  for (auto& w : out.workers)
    for (int id : w.cores)
      if (holders[id] > 1) w.shared = true;
  return out;
}

}  // namespace ring::placement
