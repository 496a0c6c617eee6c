// Node-local ring order: fixtures of real machine types and brute force on small nodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "daemon/placement/errors.h"
#include "daemon/placement/gpu_topology.h"
#include "daemon/placement/local_order.h"
#include "tests/placement/test_util.h"

namespace ring::placement {
namespace {

using testing::read_fixture;

GpuTopology load(const std::string& name) {
  return parse_topo_matrix(read_fixture(name), name);
}

// Minimum cycle cost by trying every permutation that starts at position 0.
uint64_t brute_force(const CostMatrix& c) {
  std::vector<int> p(c.size());
  std::iota(p.begin(), p.end(), 0);
  uint64_t best = UINT64_MAX;
  do {
    best = std::min(best, cycle_cost(c, p));
  } while (std::next_permutation(p.begin() + 1, p.end()));
  return best;
}

int count_links(const LocalRing& r, LinkKind kind) {
  return static_cast<int>(
      std::count_if(r.links.begin(), r.links.end(), [&](const Link& l) { return l.kind == kind; }));
}

// Positions of `group` in the cycle form one contiguous arc.
bool contiguous(const std::vector<int>& cycle, const std::set<int>& group) {
  const size_t n = cycle.size();
  int boundaries = 0;
  for (size_t k = 0; k < n; ++k) {
    bool in = group.count(cycle[k]) > 0, next = group.count(cycle[(k + 1) % n]) > 0;
    if (in != next) ++boundaries;
  }
  return boundaries <= 2;
}

bool is_permutation_of_all(const std::vector<int>& v, size_t n) {
  std::vector<int> s = v;
  std::sort(s.begin(), s.end());
  for (size_t i = 0; i < n; ++i)
    if (s.size() != n || s[i] != static_cast<int>(i)) return false;
  return true;
}

TEST(LocalOrder, TwoSocketFourGpusCrossesTheSocketLinkExactlyTwice) {
  GpuTopology t = load("two_socket_4gpu_topo.txt");
  LocalRing r = local_ring_order(t);
  // Lexicographically smallest optimum: 0 then its socket mate 2 is reached the other way round.
  EXPECT_EQ(r.cycle, (std::vector<int>{0, 1, 3, 2}));
  EXPECT_EQ(count_links(r, LinkKind::kSys), 2);
  EXPECT_TRUE(r.exact);
  // The naive order 0,1,2,3 crosses sockets four times.
  CostMatrix c = link_cost_matrix(t);
  EXPECT_LT(r.cost, cycle_cost(c, {0, 1, 2, 3}));
  EXPECT_EQ(r.cost, brute_force(c));
  // Cut for a multi-node ring: the path crosses the socket link once, at most-expensive link.
  int sys_in_path = 0;
  for (size_t k = 0; k + 1 < r.path.size(); ++k)
    if (t.gpu_links[r.path[k]][r.path[k + 1]].kind == LinkKind::kSys) ++sys_in_path;
  EXPECT_EQ(sys_in_path, 1);
  EXPECT_EQ(r.path.size(), 4u);
}

TEST(LocalOrder, PcieBoxKeepsSwitchesAndSocketsTogether) {
  GpuTopology t = load("pcie_8gpu_topo.txt");
  LocalRing r = local_ring_order(t);
  EXPECT_EQ(count_links(r, LinkKind::kSys), 2);
  EXPECT_EQ(count_links(r, LinkKind::kNode), 1);
  EXPECT_EQ(count_links(r, LinkKind::kPxb), 1);
  EXPECT_EQ(count_links(r, LinkKind::kPix), 4);
  for (const std::set<int>& g :
       std::vector<std::set<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {0, 1, 2, 3}, {4, 5, 6, 7}}) {
    EXPECT_TRUE(contiguous(r.cycle, g)) << "group starting " << *g.begin();
  }
  EXPECT_EQ(r.cycle, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.cost, brute_force(link_cost_matrix(t)));
}

TEST(LocalOrder, NvSwitchBoxesUseOnlyNvLinkAndAreDeterministic) {
  for (const char* f : {"dgx_a100_topo.txt", "dgx_h100_topo.txt", "hgx_h200_topo.txt"}) {
    GpuTopology t = load(f);
    LocalRing r = local_ring_order(t);
    EXPECT_EQ(r.cycle, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7})) << f;
    EXPECT_EQ(count_links(r, LinkKind::kNvLink), 8) << f;
    EXPECT_EQ(r.cost, brute_force(link_cost_matrix(t))) << f;
    EXPECT_TRUE(is_permutation_of_all(r.path, 8)) << f;
  }
}

TEST(LocalOrder, FixturesMatchBruteForce) {
  for (const char* f : {"two_socket_4gpu_topo.txt", "pcie_8gpu_topo.txt", "dgx_a100_topo.txt",
                        "dgx_h100_topo.txt", "hgx_h200_topo.txt", "single_gpu_topo.txt"}) {
    GpuTopology t = load(f);
    CostMatrix c = link_cost_matrix(t);
    EXPECT_EQ(local_ring_order(t).cost, brute_force(c)) << f;
  }
}

TEST(LocalOrder, SingleGpuRingIsTrivial) {
  LocalRing r = local_ring_order(load("single_gpu_topo.txt"));
  EXPECT_EQ(r.cycle, std::vector<int>{0});
  EXPECT_EQ(r.path, std::vector<int>{0});
  EXPECT_EQ(r.cost, 0u);
}

// Random matrices of link classes: the exact search equals brute force for every n <= 9.
TEST(LocalOrder, RandomTopologiesMatchBruteForce) {
  std::mt19937 rng(7);
  const Link kinds[] = {{LinkKind::kNvLink, 12}, {LinkKind::kNvLink, 4}, {LinkKind::kPix, 0},
                        {LinkKind::kPxb, 0},     {LinkKind::kPhb, 0},    {LinkKind::kNode, 0},
                        {LinkKind::kSys, 0}};
  for (int n = 2; n <= 9; ++n) {
    for (int trial = 0; trial < 6; ++trial) {
      GpuTopology t;
      t.gpus.resize(n);
      t.gpu_links.assign(n, std::vector<Link>(n, Link{LinkKind::kSelf, 0}));
      for (int i = 0; i < n; ++i)
        for (int j = i + 1; j < n; ++j) t.gpu_links[i][j] = t.gpu_links[j][i] = kinds[rng() % 7];
      CostMatrix c = link_cost_matrix(t);
      LocalRing r = local_ring_order(t);
      ASSERT_TRUE(is_permutation_of_all(r.cycle, n));
      EXPECT_EQ(r.cost, cycle_cost(c, r.cycle));
      EXPECT_EQ(r.cost, brute_force(c)) << "n=" << n << " trial " << trial;
      // Deterministic: the same input gives the same cycle.
      EXPECT_EQ(local_ring_order(t).cycle, r.cycle);
    }
  }
}

// Weights make the sum lexicographic: one SYS link costs more than n-1... of every better class.
TEST(LocalOrder, CostIsLexicographicInLinkClasses) {
  GpuTopology t = load("pcie_8gpu_topo.txt");
  CostMatrix c = link_cost_matrix(t);
  uint64_t sys = c[0][4], node = c[4][6], pxb = c[0][2], pix = c[0][1];
  EXPECT_GT(sys, 8 * node);
  EXPECT_GT(node, 8 * pxb);
  EXPECT_GT(pxb, 8 * pix);
}

TEST(LocalOrder, LargeNodesUseTheHeuristic) {
  // 24 GPUs: 6 quads behind PCIe switches, 3 per socket.
  const int n = 24;
  GpuTopology t;
  t.gpus.resize(n);
  t.gpu_links.assign(n, std::vector<Link>(n));
  std::vector<int> label(n);
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));  // scrambled enumeration
  for (int i = 0; i < n; ++i) label[perm[i]] = i;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int a = label[i], b = label[j];
      t.gpu_links[i][j] = i == j             ? Link{LinkKind::kSelf, 0}
                          : a / 4 == b / 4   ? Link{LinkKind::kPix, 0}
                          : a / 12 == b / 12 ? Link{LinkKind::kNode, 0}
                                             : Link{LinkKind::kSys, 0};
    }
  LocalRing r = local_ring_order(t);
  EXPECT_FALSE(r.exact);
  ASSERT_TRUE(is_permutation_of_all(r.cycle, n));
  EXPECT_EQ(count_links(r, LinkKind::kSys), 2);
  EXPECT_EQ(count_links(r, LinkKind::kNode), 4);  // 3 quads per socket: 2 joins inside each
  std::vector<int> natural(n);
  std::iota(natural.begin(), natural.end(), 0);
  EXPECT_LT(r.cost, cycle_cost(link_cost_matrix(t), natural));
}

TEST(LocalOrder, SubsetOfGpus) {
  GpuTopology t = load("two_socket_4gpu_topo.txt");
  LocalRing r = local_ring_order(t, {3, 1});
  EXPECT_EQ(r.cycle, (std::vector<int>{1, 3}));
  EXPECT_THROW(local_ring_order(t, {0, 9}), PlacementError);
}

}  // namespace
}  // namespace ring::placement
