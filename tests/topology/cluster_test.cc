// topology.conf and cluster YAML parsers, hop model.
#include <gtest/gtest.h>

#include "common/topology/cluster.h"

namespace ring::topology {
namespace {

std::string error_of(auto f) {
  try {
    f();
  } catch (const TopologyError& e) {
    return e.what();
  }
  return "no error";
}

#define EXPECT_ERROR(expr, fragment)                    \
  do {                                                  \
    std::string m_ = error_of([&] { (void)(expr); });   \
    EXPECT_NE(m_.find(fragment), std::string::npos)     \
        << "'" << m_ << "' lacks '" << fragment << "'"; \
  } while (0)

std::string source(const char* rel) {
  return std::string(RING_SOURCE_DIR) + "/" + rel;
}

TEST(SlurmTopology, ExampleFile) {
  ClusterTopology t = load_cluster_topology(source("configs/topology/topology.conf"));
  EXPECT_EQ(t.kind(), ClusterTopology::Kind::kTree);
  EXPECT_EQ(t.node_count(), 64u);
  EXPECT_EQ(t.hops("gpu001", "gpu016"), 2);
  EXPECT_EQ(t.hops("gpu001", "gpu017"), 4);
  EXPECT_EQ(t.hops("gpu001", "gpu064"), 6);
  EXPECT_EQ(t.hops("gpu005", "gpu005"), 0);
  auto order = t.structural_order();
  EXPECT_EQ(order.front(), "gpu001");
  EXPECT_EQ(order.back(), "gpu064");
}

TEST(SlurmTopology, SyntaxVariants) {
  ClusterTopology t = parse_slurm_topology(
      "# comment\n"
      "switchname=top switches=s[1-2]  # trailing comment\n"
      "SwitchName=s2 Nodes=b[1-2]\n"
      "SwitchName=s1 \\\n"
      "   Nodes=a[1-2],a10\n",
      "t.conf");
  EXPECT_EQ(t.hops("a1", "a10"), 2);
  EXPECT_EQ(t.hops("a1", "b2"), 4);
  // Natural order: a2 before a10, s1 before s2.
  EXPECT_EQ(t.structural_order(), (std::vector<std::string>{"a1", "a2", "a10", "b1", "b2"}));
  // Separate trees meet at a virtual root.
  ClusterTopology two = parse_slurm_topology("SwitchName=x Nodes=n1\nSwitchName=y Nodes=n2\n", "t");
  EXPECT_EQ(two.hops("n1", "n2"), 4);
}

TEST(SlurmTopology, ErrorsNameFileLineAndProblem) {
  auto p = [](const char* text) { return parse_slurm_topology(text, "t.conf"); };
  EXPECT_ERROR(p(""), "t.conf: no SwitchName");
  EXPECT_ERROR(p("\nNodes=n1\n"), "t.conf:2: line has no SwitchName=");
  EXPECT_ERROR(p("SwitchName=s1\n"), "t.conf:1: switch s1 has neither");
  EXPECT_ERROR(p("SwitchName=s1 Nodes=n1\nSwitchName=s1 Nodes=n2\n"),
               "t.conf:2: switch s1 is already defined on line 1");
  EXPECT_ERROR(p("SwitchName=s0 Switches=s9\n"),
               "t.conf:1: switch s0 lists switch s9, which is "
               "not defined");
  EXPECT_ERROR(p("SwitchName=a Switches=c\nSwitchName=b Switches=c\nSwitchName=c Nodes=n\n"),
               "t.conf:2: switch c already has parent a");
  EXPECT_ERROR(p("SwitchName=a Switches=b\nSwitchName=b Switches=a Nodes=n\n"), "cycle");
  EXPECT_ERROR(p("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n2\n"),
               "node n2 is attached to switch a and to switch b");
  EXPECT_ERROR(p("SwitchName=a Nodes=n[1-\n"), "t.conf:1: hostlist 'n[1-': at character 2");
  EXPECT_ERROR(p("SwitchName=a Nodes=n1 Speed=3\n"), "t.conf:1: unknown key 'Speed'");
  EXPECT_ERROR(p("SwitchName=a Nodes\n"), "t.conf:1: 'Nodes' is not Key=Value");
  EXPECT_ERROR(p("BlockName=b1 Nodes=n[1-4]\n"), "topology/block");
  EXPECT_ERROR(p("SwitchName=a[1-2] Nodes=n1\n"), "names 2 switches");
  EXPECT_ERROR(p("SwitchName=a Switches=a\n"), "lists itself");
  EXPECT_ERROR(load_cluster_topology("/nonexistent/topology.conf"), "cannot open");
}

TEST(ClusterYaml, ExampleTree) {
  ClusterTopology t = load_cluster_topology(source("configs/topology/cluster.yaml"));
  EXPECT_EQ(t.node_count(), 32u);
  EXPECT_EQ(t.hops("node001", "node008"), 2);
  EXPECT_EQ(t.hops("node001", "node009"), 4);
  EXPECT_EQ(t.hops("node001", "node032"), 6);
  EXPECT_EQ(t.hops("node026", "node027"), 2);
}

TEST(ClusterYaml, ExampleTorusAndDragonfly) {
  ClusterTopology t = load_cluster_topology(source("configs/topology/torus.yaml"));
  EXPECT_EQ(t.kind(), ClusterTopology::Kind::kTorus);
  EXPECT_EQ(t.node_count(), 64u);
  EXPECT_EQ(t.coords("nid005"), (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(t.hops("nid000", "nid003"), 1);  // x wraps
  EXPECT_EQ(t.hops("nid000", "nid042"), 6);  // (2,2,2)
  EXPECT_EQ(t.max_hops(), 6);
  ClusterTopology d = load_cluster_topology(source("configs/topology/dragonfly.yaml"));
  EXPECT_EQ(d.kind(), ClusterTopology::Kind::kDragonfly);
  EXPECT_EQ(d.hops("x1000", "x1003"), 2);
  EXPECT_EQ(d.hops("x1000", "x1004"), 3);
  EXPECT_EQ(d.hops("x1000", "x1104"), 5);
}

TEST(ClusterYaml, TorusWithExplicitCoordinatesAndNoWrap) {
  ClusterTopology t = parse_cluster_yaml(
      "kind: torus\ndims: [4, 2]\nwrap: [false, true]\nnodes:\n  a: [0, 0]\n  b: [3, 1]\n", "t");
  EXPECT_EQ(t.hops("a", "b"), 4);  // 3 along x (no wrap) + 1 along y
}

TEST(ClusterYaml, ErrorsNameFileLineColumnAndKey) {
  auto p = [](const char* text) { return parse_cluster_yaml(text, "c.yaml"); };
  EXPECT_ERROR(p("kind: [\n"), "c.yaml:");
  EXPECT_ERROR(p("- a\n"), "expected a mapping");
  EXPECT_ERROR(p("switches: []\n"), "kind: missing");
  EXPECT_ERROR(p("kind: ring\n"), "c.yaml:1:7: kind: 'ring' is not tree, dragonfly or torus");
  EXPECT_ERROR(p("kind: tree\nswitchs: []\n"), "c.yaml:2:1: switchs: unknown key");
  EXPECT_ERROR(p("kind: tree\nswitches:\n  - name: s\n    nodes: n[1-\n"),
               "c.yaml:4:12: switches[0].nodes: hostlist");
  EXPECT_ERROR(p("kind: tree\nswitches:\n  - name: s\n    children:\n      - name: t\n"),
               "c.yaml:5:9: switches[0].children[0]: switch t has neither");
  EXPECT_ERROR(p("kind: tree\nswitches:\n  - nodes: n1\n"),
               "c.yaml:3:5: switches[0]: missing 'name'");
  EXPECT_ERROR(p("kind: tree\nswitches:\n  - {name: s, nodes: n1}\n  - {name: s, nodes: n2}\n"),
               "c.yaml:4: switch s is defined twice");
  EXPECT_ERROR(p("kind: tree\nswitches:\n  - {name: s, nodes: n1}\n  - {name: t, nodes: n1}\n"),
               "node n1 is attached to switch s and to switch t");
  EXPECT_ERROR(p("kind: torus\ndims: [2, 0]\nhostlist: n[1-2]\n"),
               "c.yaml:2:11: dims[1]: 0 is "
               "outside");
  EXPECT_ERROR(p("kind: torus\ndims: [2, 2]\nhostlist: n[1-5]\n"), "5 names for a torus of 4");
  EXPECT_ERROR(p("kind: torus\ndims: [2, 2]\nnodes: {a: [0, 2]}\n"), "coordinate 1 = 2");
  EXPECT_ERROR(p("kind: torus\ndims: [2, 2]\nnodes: {a: [0, 1], b: [0, 1]}\n"), "same coordinates");
  EXPECT_ERROR(p("kind: torus\ndims: [2, 2]\nnodes: {a: [0]}\n"), "has 1 coordinates");
  EXPECT_ERROR(p("kind: torus\ndims: [2, 2]\n"), "nodes: missing");
  EXPECT_ERROR(p("kind: torus\ndims: [2]\nwrap: [maybe]\nhostlist: n1\n"),
               "c.yaml:3:8: wrap[0]: "
               "expected true or false");
  EXPECT_ERROR(p("kind: dragonfly\ngroups:\n  - {name: g, routers: [{name: r, nodes: n1}]}\n"
                 "hops: {router: 5, group: 3}\n"),
               "router <= group <= global");
  EXPECT_ERROR(p("kind: dragonfly\ngroups:\n  - {name: g, nodes: n1}\n"),
               "group g has nodes; nodes go on routers");
}

TEST(Hops, UnknownNodesAreErrors) {
  ClusterTopology t = parse_slurm_topology("SwitchName=s Nodes=n1\n", "t");
  EXPECT_ERROR(t.hops("n1", "zz"), "node zz is not in the topology");
}

}  // namespace
}  // namespace ring::topology
