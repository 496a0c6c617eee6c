// Global ring order on generated fat trees, dragonflies and tori (8 to 1024 nodes), against
// the job's node-list order and, for small jobs, against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "common/topology/global_order.h"

namespace ring::topology {
namespace {

std::string name(int i) {
  char b[16];
  std::snprintf(b, sizeof b, "n%05d", i);
  return b;
}

// levels 2: core -> leaves -> nodes; levels 3: core -> pods -> leaves -> nodes. Written as
// topology.conf text so the parser runs at scale too.
ClusterTopology fat_tree(int levels, int nodes, int per_leaf, int leaves_per_pod) {
  std::string conf;
  const int leaves = (nodes + per_leaf - 1) / per_leaf;
  for (int l = 0; l < leaves; ++l) {
    conf += "SwitchName=leaf" + std::to_string(l) + " Nodes=";
    for (int i = l * per_leaf; i < std::min(nodes, (l + 1) * per_leaf); ++i) {
      if (i != l * per_leaf) conf += ',';
      conf += name(i);
    }
    conf += "\n";
  }
  if (levels == 2) {
    conf += "SwitchName=core Switches=leaf[0-" + std::to_string(leaves - 1) + "]\n";
  } else {
    const int pods = (leaves + leaves_per_pod - 1) / leaves_per_pod;
    for (int p = 0; p < pods; ++p) {
      conf += "SwitchName=pod" + std::to_string(p) + " Switches=leaf[" +
              std::to_string(p * leaves_per_pod) + "-" +
              std::to_string(std::min(leaves, (p + 1) * leaves_per_pod) - 1) + "]\n";
    }
    conf += "SwitchName=core Switches=pod[0-" + std::to_string(pods - 1) + "]\n";
  }
  return parse_slurm_topology(conf, "generated.conf");
}

ClusterTopology dragonfly(int groups, int routers, int per_router) {
  std::vector<Switch> s;
  int node = 0;
  for (int g = 0; g < groups; ++g) {
    int gi = static_cast<int>(s.size());
    Switch group;
    group.name = "g" + std::to_string(g);
    s.push_back(group);
    for (int r = 0; r < routers; ++r) {
      Switch router;
      router.name = "g" + std::to_string(g) + "r" + std::to_string(r);
      router.parent = gi;
      for (int k = 0; k < per_router; ++k) router.nodes.push_back(name(node++));
      s.push_back(router);
    }
  }
  return ClusterTopology::tree(s, ClusterTopology::Kind::kDragonfly);
}

ClusterTopology torus(std::vector<int> dims) {
  std::map<std::string, std::vector<int>> coords;
  int total = 1;
  for (int d : dims) total *= d;
  for (int i = 0; i < total; ++i) {
    std::vector<int> c;
    int rest = i;
    for (int d : dims) c.push_back(rest % d), rest /= d;
    coords[name(i)] = c;
  }
  return ClusterTopology::torus(dims, {}, coords);
}

std::vector<std::string> all_nodes(const ClusterTopology& t) {
  return t.structural_order();
}

// A random subset of `count` nodes in random order: what Slurm hands a job on a busy cluster.
std::vector<std::string> random_job(const ClusterTopology& t, size_t count, std::mt19937& rng) {
  std::vector<std::string> n = all_nodes(t);
  std::shuffle(n.begin(), n.end(), rng);
  n.resize(std::min(count, n.size()));
  return n;
}

int64_t brute_force(const ClusterTopology& t, std::vector<std::string> nodes) {
  std::sort(nodes.begin(), nodes.end());
  int64_t best = INT64_MAX;
  do {
    best = std::min(best, ring_hops(t, nodes));
  } while (std::next_permutation(nodes.begin() + 1, nodes.end()));
  return best;
}

struct Case {
  std::string label;
  ClusterTopology topo;
};

std::vector<Case> generated() {
  std::vector<Case> c;
  c.push_back({"fat-tree 2-level, 8 nodes (4/leaf)", fat_tree(2, 8, 4, 0)});
  c.push_back({"fat-tree 2-level, 64 nodes (8/leaf)", fat_tree(2, 64, 8, 0)});
  c.push_back({"fat-tree 3-level, 256 nodes (16/leaf, 4 leaves/pod)", fat_tree(3, 256, 16, 4)});
  c.push_back({"fat-tree 3-level, 1024 nodes (32/leaf, 8 leaves/pod)", fat_tree(3, 1024, 32, 8)});
  c.push_back({"dragonfly 2x2x2 = 8 nodes", dragonfly(2, 2, 2)});
  c.push_back({"dragonfly 4x4x4 = 64 nodes", dragonfly(4, 4, 4)});
  c.push_back({"dragonfly 16x8x8 = 1024 nodes", dragonfly(16, 8, 8)});
  c.push_back({"torus 2x2x2 = 8 nodes", torus({2, 2, 2})});
  c.push_back({"torus 4x4x4 = 64 nodes", torus({4, 4, 4})});
  c.push_back({"torus 8x8x8 = 512 nodes", torus({8, 8, 8})});
  c.push_back({"torus 8x8x16 = 1024 nodes", torus({8, 8, 16})});
  return c;
}

TEST(GlobalOrder, GeneratedTopologiesBeatTheNodeList) {
  std::mt19937 rng(2024);
  std::printf("%-52s %6s %10s %12s %s\n", "topology", "job", "ours", "node-list", "method");
  for (const Case& c : generated()) {
    const size_t total = c.topo.node_count();
    for (size_t job : {total, std::max<size_t>(4, total * 3 / 8)}) {
      std::vector<std::string> nodes = random_job(c.topo, job, rng);
      GlobalOrder g = global_ring_order(c.topo, nodes);
      std::printf("%-52s %6zu %10lld %12lld %s\n", c.label.c_str(), nodes.size(),
                  static_cast<long long>(g.hops), static_cast<long long>(g.node_list_hops),
                  g.method.c_str());
      EXPECT_LE(g.hops, g.node_list_hops) << c.label;
      EXPECT_EQ(g.hops, ring_hops(c.topo, g.nodes));
      std::vector<std::string> a = g.nodes, b = nodes;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << "the order must be a permutation of the job's nodes";
      if (nodes.size() >= 64) {
        EXPECT_LT(g.hops * 3, g.node_list_hops * 2) << c.label;  // at least 1.5x fewer hops
      }
    }
  }
}

TEST(GlobalOrder, SmallJobsAreOptimal) {
  std::mt19937 rng(99);
  for (const Case& c : generated()) {
    for (size_t n = 2; n <= 9; ++n) {
      std::vector<std::string> nodes = random_job(c.topo, n, rng);
      GlobalOrder g = global_ring_order(c.topo, nodes);
      EXPECT_EQ(g.hops, brute_force(c.topo, nodes)) << c.label << ", " << n << " nodes";
    }
  }
}

// The structural orders themselves (not only the exact search) are optimal on trees and
// dragonflies: checked against brute force on random small jobs.
TEST(GlobalOrder, DepthFirstOrderIsOptimalOnTreesAndDragonflies) {
  std::mt19937 rng(5);
  for (const Case& c : generated()) {
    if (c.topo.kind() == ClusterTopology::Kind::kTorus) continue;
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<std::string> nodes = random_job(c.topo, 8, rng);
      std::vector<std::string> dfs;
      for (const auto& n : c.topo.structural_order())
        if (std::find(nodes.begin(), nodes.end(), n) != nodes.end()) dfs.push_back(n);
      EXPECT_EQ(ring_hops(c.topo, dfs), brute_force(c.topo, nodes)) << c.label;
    }
  }
}

TEST(GlobalOrder, LargeTreeJobsKeepLeavesAndPodsContiguous) {
  ClusterTopology t = fat_tree(3, 1024, 32, 8);
  std::mt19937 rng(11);
  std::vector<std::string> nodes = random_job(t, 300, rng);
  GlobalOrder g = global_ring_order(t, nodes);
  EXPECT_EQ(g.method, "tree-dfs");
  // Hops of 6 (between pods) happen exactly once per pod boundary around the ring, 4 (between
  // leaves of a pod) once per leaf boundary inside a pod.
  std::map<int, int> count;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    ++count[t.hops(g.nodes[k], g.nodes[(k + 1) % g.nodes.size()])];
  std::set<std::string> pods, leaves;
  for (const auto& n : nodes) {
    int i = std::stoi(n.substr(1));
    pods.insert(std::to_string(i / 256));
    leaves.insert(std::to_string(i / 32));
  }
  EXPECT_EQ(count[6], static_cast<int>(pods.size()));
  EXPECT_EQ(count[4], static_cast<int>(leaves.size() - pods.size()));
}

TEST(GlobalOrder, FullTorusSnakeIsOneHopPerStep) {
  for (std::vector<int> dims : {std::vector<int>{4, 4, 4}, {8, 8, 16}, {6, 4, 2}}) {
    ClusterTopology t = torus(dims);
    auto snake = t.structural_order();
    for (size_t k = 0; k + 1 < snake.size(); ++k) {
      ASSERT_EQ(t.hops(snake[k], snake[k + 1]), 1) << snake[k] << " " << snake[k + 1];
    }
    EXPECT_EQ(t.hops(snake.back(), snake.front()), 1);  // even dimensions: the wrap is 1 hop
    GlobalOrder g = global_ring_order(t, snake);
    EXPECT_EQ(g.hops, static_cast<int64_t>(snake.size()));
  }
  // Odd sizes: still one hop per step; the closing hop is short thanks to wrap-around.
  ClusterTopology odd = torus({3, 3, 3});
  auto s = odd.structural_order();
  for (size_t k = 0; k + 1 < s.size(); ++k) ASSERT_EQ(odd.hops(s[k], s[k + 1]), 1);
  EXPECT_LE(odd.hops(s.back(), s.front()), 3);
}

TEST(GlobalOrder, RankOrderAlternatesDirection) {
  ClusterTopology t = fat_tree(2, 8, 4, 0);
  std::vector<std::string> nodes = {name(5), name(0), name(4), name(1)};
  std::map<std::string, std::vector<int>> paths = {{name(0), {2, 0, 1}}};
  GlobalOrder g = global_ring_order(t, nodes, paths, 3);
  ASSERT_EQ(g.nodes.size(), 4u);
  EXPECT_EQ(g.nodes, (std::vector<std::string>{name(0), name(1), name(4), name(5)}));
  EXPECT_EQ(g.reversed, (std::vector<bool>{false, true, false, true}));
  ASSERT_EQ(g.ranks.size(), 12u);
  // Node 0 uses its own path; node 1 runs 0..2 backwards; and so on.
  std::vector<int> local;
  for (const auto& r : g.ranks) local.push_back(r.local);
  EXPECT_EQ(local, (std::vector<int>{2, 0, 1, 2, 1, 0, 0, 1, 2, 2, 1, 0}));
  // Exit of node i and entry of node i+1 share a local index (same rail) from node 1 on.
  EXPECT_EQ(g.ranks[5].local, g.ranks[6].local);
  EXPECT_EQ(g.ranks[8].local, g.ranks[9].local);
  EXPECT_EQ(g.ranks[11].local, 0);
}

TEST(GlobalOrder, UnknownNodesGoLastAndBadInputIsAnError) {
  ClusterTopology t = fat_tree(2, 8, 4, 0);
  GlobalOrder g = global_ring_order(t, {"elsewhere", name(3), name(0)});
  EXPECT_EQ(g.nodes.back(), "elsewhere");
  EXPECT_EQ(g.unknown, std::vector<std::string>{"elsewhere"});
  EXPECT_THROW(global_ring_order(t, {}), TopologyError);
  EXPECT_THROW(global_ring_order(t, {name(1), name(1)}), TopologyError);
  EXPECT_THROW(global_ring_order(t, {name(1)}, {{name(1), {0, 0}}}, 2), TopologyError);
  EXPECT_THROW(global_ring_order(t, {name(1)}, {}, 0), TopologyError);
  GlobalOrder one = global_ring_order(t, {name(2)}, {}, 4);
  EXPECT_EQ(one.hops, 0);
  EXPECT_EQ(one.ranks.size(), 4u);
}

TEST(GlobalOrder, ExampleConfigs) {
  ClusterTopology t =
      load_cluster_topology(std::string(RING_SOURCE_DIR) + "/configs/topology/topology.conf");
  std::vector<std::string> job = expand_hostlist("gpu[050-052],gpu[001-003],gpu[020-021]");
  GlobalOrder g = global_ring_order(t, job);
  EXPECT_EQ(g.nodes, (std::vector<std::string>{"gpu001", "gpu002", "gpu003", "gpu020", "gpu021",
                                               "gpu050", "gpu051", "gpu052"}));
  std::printf("topology.conf example, job %zu nodes: ours %lld hops, node list %lld\n", job.size(),
              static_cast<long long>(g.hops), static_cast<long long>(g.node_list_hops));
  EXPECT_LE(g.hops, g.node_list_hops);
}

}  // namespace
}  // namespace ring::topology
