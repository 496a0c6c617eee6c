#include "daemon/placement/cpu_topology.h"

#include <fmt/format.h>
#include <hwloc.h>

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "daemon/placement/errors.h"

namespace ring::placement {

std::vector<const CpuCore*> CpuTopology::cores_of(int numa_node) const {
  std::vector<const CpuCore*> out;
  for (const auto& c : cores)
    if (c.numa_node == numa_node) out.push_back(&c);
  return out;
}

namespace {

// The CPUs the calling thread may run on (its affinity mask: taskset, srun --cpu-bind, Slurm's
// task/affinity), ascending. hwloc's own restriction covers the cgroup cpuset only.
std::vector<int> bound_cpus() {
  for (int n = CPU_SETSIZE;; n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) throw PlacementError("CPU_ALLOC failed");
    const size_t size = CPU_ALLOC_SIZE(n);
    if (sched_getaffinity(0, size, set) != 0) {
      const int e = errno;
      CPU_FREE(set);
      if (e == EINVAL && n < (1 << 20)) continue;  // more CPUs than the mask holds
      throw PlacementError(fmt::format("sched_getaffinity failed: {}", std::strerror(e)));
    }
    std::vector<int> out;
    for (int c = 0; c < n; ++c)
      if (CPU_ISSET_S(c, size, set)) out.push_back(c);
    CPU_FREE(set);
    return out;
  }
}

}  // namespace

CpuTopology discover_cpu_topology(const std::string& synthetic) {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) throw PlacementError("hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> guard(topo, hwloc_topology_destroy);
  if (!synthetic.empty() && hwloc_topology_set_synthetic(topo, synthetic.c_str()) != 0) {
    throw PlacementError(fmt::format("hwloc rejects the synthetic topology '{}'", synthetic));
  }
  if (hwloc_topology_load(topo) != 0) throw PlacementError("hwloc_topology_load failed");

  // On this machine, only the CPUs the process is bound to: several daemons on one host (jobs
  // sharing a node, each bound by Slurm; emulated nodes) must not all place their workers on
  // the machine's first cores.
  const std::vector<int> bound = synthetic.empty() ? bound_cpus() : std::vector<int>{};
  auto usable = [&](int pu) {
    return synthetic.empty() ? std::binary_search(bound.begin(), bound.end(), pu) : true;
  };
  CpuTopology out;
  const int n_numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  std::vector<hwloc_obj_t> numa;
  for (int i = 0; i < n_numa; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    // A memory-only node (CXL, HBM, a Grace GPU's memory) has no CPUs: no cores to place there.
    if (o && o->cpuset && !hwloc_bitmap_iszero(o->cpuset)) numa.push_back(o);
  }
  const int n_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  for (int i = 0; i < n_cores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    if (!core || !core->cpuset || hwloc_bitmap_iszero(core->cpuset)) continue;
    CpuCore c;
    c.id = static_cast<int>(out.cores.size());
    for (int pu = hwloc_bitmap_first(core->cpuset); pu >= 0;
         pu = hwloc_bitmap_next(core->cpuset, pu)) {
      if (usable(pu)) c.pus.push_back(pu);
    }
    if (c.pus.empty()) continue;  // outside this process's affinity
    c.numa_node = 0;
    for (hwloc_obj_t o : numa) {
      if (hwloc_bitmap_isincluded(core->cpuset, o->cpuset)) {
        c.numa_node = static_cast<int>(o->os_index);
        break;
      }
    }
    out.cores.push_back(std::move(c));
  }
  if (out.cores.empty())
    throw PlacementError("hwloc found no CPU cores this process may use (its cgroup cpuset and "
                         "affinity mask)");
  for (const auto& c : out.cores) out.numa_nodes.push_back(c.numa_node);
  std::sort(out.numa_nodes.begin(), out.numa_nodes.end());
  out.numa_nodes.erase(std::unique(out.numa_nodes.begin(), out.numa_nodes.end()),
                       out.numa_nodes.end());
  return out;
}

}  // namespace ring::placement
