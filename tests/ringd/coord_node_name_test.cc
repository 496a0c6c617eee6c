// The node name ringd registers with ring-coord: unique per job and node rank, also under Slurm
// where several ringd share one $SLURMD_NODENAME (two jobs, or two steps of one job, on a node).
#include <stdlib.h>

#include <gtest/gtest.h>

#include <string>

#include "daemon/ringd/coord_link.h"

namespace {

using ring::ringd::coord_node_name;

struct Env {
  std::string name;
  std::string old;
  bool had;
  Env(const char* n, const char* v) : name(n) {
    const char* o = getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v) setenv(n, v, 1);
    else unsetenv(n);
  }
  ~Env() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

TEST(CoordNodeName, SlurmNodesAreUniquePerJobAndNodeRank) {
  Env e("SLURMD_NODENAME", "node7");
  EXPECT_EQ(coord_node_name(12, 1), "node7-j12-n1");
  EXPECT_NE(coord_node_name(12, 0), coord_node_name(13, 0));  // two jobs on node7
  EXPECT_NE(coord_node_name(12, 0), coord_node_name(12, 1));  // two node ranks of one job
}

TEST(CoordNodeName, WithoutSlurmTheHostNameIsTheStem) {
  Env e("SLURMD_NODENAME", nullptr);
  const std::string n = coord_node_name(5, 2);
  ASSERT_GT(n.size(), 6u);
  EXPECT_EQ(n.substr(n.size() - 6), "-j5-n2");
}

TEST(CoordNodeName, AnInvalidSlurmNameFallsBackToTheHost) {
  Env e("SLURMD_NODENAME", "bad name\n");
  const std::string n = coord_node_name(5, 0);
  EXPECT_EQ(n.find(' '), std::string::npos);
  EXPECT_EQ(n.substr(n.size() - 6), "-j5-n0");
}

}  // namespace
