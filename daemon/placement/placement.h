// Which GPU and which cores each worker of a node gets.
//
//   Placement p = place_workers(gpu_topology, cpu_topology, {.workers = 8, .device = kGpu});
//   // p.workers[k]: local rank k, in ring order: worker k sends to worker k+1
//
// A pure function of the topology and the request, so every machine type is testable here;
// ringd applies the result (CUDA_VISIBLE_DEVICES in the worker's environment, apply_cpuset).
//
// GPU workers: the GPUs are taken along the node's best ring (local_order.h); with fewer
// workers than GPUs, the contiguous stretch of that ring whose own ring is cheapest. Worker k
// is the k-th GPU of the ring's path, so local ranks are already in ring order. Each worker
// gets cores of its GPU's NUMA node (from `NUMA Affinity`, else the node holding most of its
// `CPU Affinity`).
//
// CPU workers: blocks of consecutive workers per NUMA node (worker k on node
// floor(k * nodes / workers)), so ring neighbours share a node's memory.
//
// Cores: `cpus_per_worker` whole cores (all their hardware threads), disjoint between workers,
// lowest core first, from the worker's home NUMA node. When the home node runs out, the rest
// comes from the nearest other node (by OS index distance: hwloc gives no better distance
// everywhere) and a note says so. When the whole node has fewer free cores than asked, the
// worker shares: it takes cores of its home node round-robin that other workers also hold,
// `shared` is set and a note says so. Nothing fails for lack of cores; it only gets slower.
// `cpus_per_worker` 0 means: the home node's cores divided by the workers homed there (>= 1).
#pragma once

#include <string>
#include <vector>

#include "daemon/placement/cpu_topology.h"
#include "daemon/placement/gpu_topology.h"
#include "daemon/placement/local_order.h"

namespace ring::placement {

enum class Device { kGpu, kCpu };

struct PlacementRequest {
  int workers = 1;
  int cpus_per_worker = 0;  // whole cores per worker; 0 = an even share of the home node
  Device device = Device::kGpu;
};

struct WorkerPlacement {
  int local_rank = 0;                // position in the node's ring path
  int gpu = -1;                      // GPU index (nvidia-smi order); -1 for CPU workers
  std::string cuda_visible_devices;  // the GPU's UUID when known (immune to CUDA's device
                                     // reordering), else its index; empty for CPU workers
  int numa_node = -1;                // home NUMA node (OS index); -1 when unknown
  std::vector<int> cores;            // CpuCore::id of the cores given
  std::vector<int> cpus;             // OS CPU indices: what apply_cpuset takes
  bool shared = false;               // some cores are also given to another worker
};

struct Placement {
  std::vector<WorkerPlacement> workers;
  LocalRing ring;  // GPU workers: the ring over the chosen GPUs; empty for CPU workers
  std::vector<std::string> notes;  // policy decisions worth logging (spill, sharing)
};

// Throws PlacementError for impossible requests: workers < 1, cpus_per_worker < 0, GPU workers
// with no GPUs or more workers than GPUs, a topology without cores.
Placement place_workers(const GpuTopology& gpus, const CpuTopology& cpus,
                        const PlacementRequest& request);

}  // namespace ring::placement
