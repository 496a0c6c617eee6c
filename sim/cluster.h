// Simulated clusters: nodes of GPUs on an explicit link graph (sim/network.h), with the routing
// each fabric uses, and the matching common/topology description for ring ordering (the same
// global_ring_order the coordinator runs).
//
// Every node: its GPUs joined by an NVLink/NVSwitch domain (one duplex link per GPU to the
// node's switch), and one NIC per GPU (bandwidth = node bandwidth / GPUs per node).
// - fat-tree: rail-optimised two-level Clos. Nodes sit in pods of `pod_nodes`; NIC k of every
//   node of a pod goes to the pod's rail-k leaf; every leaf has one aggregated uplink to the core
//   of (pod_nodes x NIC bandwidth) / oversubscription. Same pod and rail: NIC-leaf-NIC; else
//   through the core (4 links).
// - dragonfly+: groups of `group_routers` leaf routers with `router_nodes` nodes each; inside a
//   group the leaves reach one another through the group's spine (non-blocking); every pair of
//   groups has one aggregated global link of (group nodes x node bandwidth) / (groups - 1) /
//   oversubscription. Minimal routing: leaf-spine-global-spine-leaf; Valiant: through the spine
//   of an intermediate group chosen per (source, destination) pair.
// - torus3d: one router per node in an X x Y x Z torus (every dimension wraps); six duplex links
//   of `torus_link` bandwidth (default node bandwidth / 6); dimension-order routing (x, then y,
//   then z, the shorter way round; ties go positive).
// - graph file (YAML): named nodes and switches and the links between them (see
//   docs/simulation.md); routing: fewest hops.
// - Slurm topology.conf: the switch tree common/topology parses; each switch's LinkSpeed= (GB/s)
//   is the bandwidth of its uplink (default: its children's bandwidth / oversubscription).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/topology/cluster.h"
#include "sim/network.h"

namespace ring::sim {

enum class Shape { kFatTree, kDragonflyPlus, kTorus3d, kGraphFile, kSlurmConf };

struct ClusterOptions {
  Shape shape = Shape::kFatTree;
  std::string file;           // graph YAML or topology.conf
  int nodes = 1;              // nodes in the cluster
  int gpus_per_node = 1;
  double node_bw = 200e9;     // bytes/s, all NICs of a node together
  double nvlink_bw = 450e9;   // bytes/s per GPU and direction
  double nvlink_latency = 1e-6;
  double nic_latency = 2e-6;     // GPU <-> first switch
  double switch_latency = 1e-6;  // every switch-to-switch link
  double oversubscription = 1.0;
  int pod_nodes = 16;          // fat-tree pod (rack) size
  int group_routers = 4;       // dragonfly+
  int router_nodes = 4;
  bool valiant = false;
  double torus_link = 0;       // bytes/s; 0: node_bw / 6
  // Node names do not follow the wiring (a cluster renamed or repaired over time): names are
  // dealt to positions by a fixed shuffle, so the sorted node list crosses racks at random.
  bool shuffled_names = false;
};

class Cluster {
 public:
  static std::unique_ptr<Cluster> build(const ClusterOptions& o);

  const Network& net() const { return net_; }
  Network& net() { return net_; }
  int nodes() const { return static_cast<int>(node_names_.size()); }
  int gpus_per_node() const { return gpn_; }
  const std::vector<std::string>& node_names() const { return node_names_; }  // by index
  int node_index(const std::string& name) const;
  int gpu_vertex(int node, int local) const { return gpu_vertex_[node * gpn_ + local]; }
  // The links from GPU (na, la) to GPU (nb, lb), in order.
  std::vector<int> route(int na, int la, int nb, int lb) const;
  const topology::ClusterTopology& topology() const { return *topo_; }
  // The NIC links of a node's GPUs, both directions (for a slow-link what-if).
  std::vector<int> nic_links(int node) const;
  std::string describe() const { return describe_; }
  // > 0: every node of the cluster runs on one machine of this many cores (a graph file's
  // host_cores: emulated nodes), whose ranks and daemons share them; 0: a machine per node.
  double host_cores() const { return host_cores_; }
  Shape shape() const { return o_.shape; }

 private:
  friend struct ClusterBuilder;  // cluster.cc: one builder per shape
  Cluster() = default;
  void add_node_gpus(int node, int attach_vertex_or_minus1);
  std::vector<int> inter_node(int na, int la, int nb, int lb) const;
  std::vector<int> bfs_cached(int from, int to) const;

  ClusterOptions o_;
  Network net_;
  int gpn_ = 1;
  std::vector<std::string> node_names_;
  std::map<std::string, int> by_name_;
  std::vector<int> gpu_vertex_;   // [node * gpn + local]
  std::vector<int> gpu_up_, gpu_down_;  // GPU <-> NVSwitch links (or -1)
  std::vector<int> nic_up_, nic_down_;  // GPU <-> first fabric vertex
  std::vector<int> node_vertex_;  // graph / slurm / torus: the node's fabric vertex
  // fat-tree
  std::vector<int> leaf_up_, leaf_down_;  // [pod * gpn + rail]
  // dragonfly+
  int groups_ = 0;
  std::vector<int> router_up_, router_down_;  // [group * routers + router]
  std::vector<int> global_;                   // [ga * groups + gb] link ga -> gb
  // torus
  int dims_[3] = {1, 1, 1};
  std::vector<int> torus_link_;  // [node * 6 + dir] dir: +x -x +y -y +z -z
  std::vector<int> slot_of_;     // node index -> wiring position
  mutable std::map<std::pair<int, int>, std::vector<int>> bfs_cache_;
  std::unique_ptr<topology::ClusterTopology> topo_;
  std::string describe_;
  double host_cores_ = 0;
};

// Splits n into three factors as equal as possible (x >= y >= z), for the torus's shape.
void torus_dims(int n, int out[3]);

}  // namespace ring::sim
