#include "daemon/placement/cpu_topology.h"

#include <fmt/format.h>
#include <hwloc.h>

#include <algorithm>
#include <memory>

#include "daemon/placement/errors.h"

namespace ring::placement {

std::vector<const CpuCore*> CpuTopology::cores_of(int numa_node) const {
  std::vector<const CpuCore*> out;
  for (const auto& c : cores)
    if (c.numa_node == numa_node) out.push_back(&c);
  return out;
}

CpuTopology discover_cpu_topology(const std::string& synthetic) {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) throw PlacementError("hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> guard(topo, hwloc_topology_destroy);
  if (!synthetic.empty() && hwloc_topology_set_synthetic(topo, synthetic.c_str()) != 0) {
    throw PlacementError(fmt::format("hwloc rejects the synthetic topology '{}'", synthetic));
  }
  if (hwloc_topology_load(topo) != 0) throw PlacementError("hwloc_topology_load failed");

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
      c.pus.push_back(pu);
    }
    c.numa_node = 0;
    for (hwloc_obj_t o : numa) {
      if (hwloc_bitmap_isincluded(core->cpuset, o->cpuset)) {
        c.numa_node = static_cast<int>(o->os_index);
        break;
      }
    }
    out.cores.push_back(std::move(c));
  }
  if (out.cores.empty()) throw PlacementError("hwloc found no CPU cores this process may use");
  for (const auto& c : out.cores) out.numa_nodes.push_back(c.numa_node);
  std::sort(out.numa_nodes.begin(), out.numa_nodes.end());
  out.numa_nodes.erase(std::unique(out.numa_nodes.begin(), out.numa_nodes.end()),
                       out.numa_nodes.end());
  return out;
}

}  // namespace ring::placement
