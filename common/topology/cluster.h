// The cluster's network as ring ordering needs it: where each node sits and how many switch
// hops separate two nodes.
//
// Three shapes:
// - tree: a switch tree (Slurm's topology.conf, or racks/pods/tiers from a YAML file); hops =
//   links on the path between two nodes through their lowest common switch, i.e. 2 x levels up
//   to it when leaves are at one depth (same leaf switch: 2). Separate trees (Slurm allows
//   them) are joined by a virtual root.
// - dragonfly: groups of routers, nodes on routers; hops = `router` on one router, `group`
//   between routers of one group, `global` between groups (defaults 2, 3, 5: node-router-
//   router-node, and the minimal route local-global-local).
// - torus: node coordinates in a D-dimensional torus; hops = Manhattan distance with
//   wrap-around on each dimension that wraps.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/topology/hostlist.h"

namespace ring::topology {

struct Switch {
  std::string name;
  int parent = -1;                 // index into switches; -1 for a root
  std::vector<int> children;       // switch indices, in natural name order
  std::vector<std::string> nodes;  // nodes attached here, in natural order
  int depth = 0;                   // roots 0
  int line = 0;                    // where it was defined (for messages); 0 when generated
};

class ClusterTopology {
 public:
  enum class Kind { kTree, kDragonfly, kTorus };

  // Trees and dragonflies: `switches` (for a dragonfly: roots are groups, their children
  // routers). Finalises depths, child order and the node index; throws TopologyError on a
  // cycle, an undefined parent or a node attached twice.
  static ClusterTopology tree(std::vector<Switch> switches, Kind kind = Kind::kTree);
  // A torus of `dims` (wrap[d] says whether dimension d wraps) with node coordinates.
  static ClusterTopology torus(std::vector<int> dims, std::vector<bool> wrap,
                               std::map<std::string, std::vector<int>> coords);

  Kind kind() const { return kind_; }
  const std::vector<Switch>& switches() const { return switches_; }
  const std::vector<int>& dims() const { return dims_; }
  bool contains(const std::string& node) const;
  size_t node_count() const;

  // Switch hops between two known nodes (0 for the same node). Throws for unknown nodes.
  int hops(const std::string& a, const std::string& b) const;
  // An upper bound on hops between any two nodes (used as the cost of unknown nodes).
  int max_hops() const;

  // Every node in the topology's own order: DFS over switches in natural name order (trees,
  // dragonflies) or the snake order over coordinates (torus).
  std::vector<std::string> structural_order() const;
  // Torus: coordinates of a node.
  const std::vector<int>& coords(const std::string& node) const;

  struct DragonflyHops {
    int router = 2, group = 3, global = 5;
  } dragonfly_hops;

 private:
  Kind kind_ = Kind::kTree;
  std::vector<Switch> switches_;
  std::map<std::string, int> node_switch_;  // node -> switch it is attached to
  std::vector<int> dims_;
  std::vector<bool> wrap_;
  std::map<std::string, std::vector<int>> coords_;
};

// Slurm topology.conf (topology/tree): "SwitchName=s1 Switches=s[2-3]", "SwitchName=s2
// Nodes=node[01-16]", comments, "\" continuation; LinkSpeed and other tree keys are accepted
// and ignored. Errors: "<source>:<line>: <what>".
ClusterTopology parse_slurm_topology(std::string_view text, const std::string& source);
// A cluster topology YAML (see configs/topology/cluster.yaml). Errors: "<source>:<line>:<col>:".
ClusterTopology parse_cluster_yaml(std::string_view text, const std::string& source);
// By file name: *.yaml / *.yml as YAML, anything else as topology.conf.
ClusterTopology load_cluster_topology(const std::string& path);

}  // namespace ring::topology
