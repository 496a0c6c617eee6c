// A node's CPU cores and NUMA nodes, as hwloc sees them.
//
// Only the CPUs this process may use are listed: hwloc drops CPUs outside the cgroup cpuset,
// and the adapter drops those outside the calling thread's affinity mask (taskset, srun
// --cpu-bind), so a Slurm allocation's limits and bindings are respected and daemons bound to
// different CPUs of one host place their workers apart. The struct is plain data so placement can be
// tested on any shape; `discover_cpu_topology` is the adapter, and accepts an hwloc synthetic
// description ("package:2 numa:1 core:8 pu:2") for tests.
#pragma once

#include <string>
#include <vector>

namespace ring::placement {

struct CpuCore {
  int id = 0;            // dense index, in hwloc's logical order
  int numa_node = 0;     // OS index of its NUMA node (the number nvidia-smi and numactl use)
  std::vector<int> pus;  // OS indices of its hardware threads (what sched_setaffinity takes)
};

struct CpuTopology {
  std::vector<CpuCore> cores;
  std::vector<int> numa_nodes;  // OS indices, ascending

  // Cores of one NUMA node, in order.
  std::vector<const CpuCore*> cores_of(int numa_node) const;
};

// Reads the machine (synthetic empty) or an hwloc synthetic description. Throws PlacementError
// naming the hwloc call that failed.
CpuTopology discover_cpu_topology(const std::string& synthetic = "");

}  // namespace ring::placement
