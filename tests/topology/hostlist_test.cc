// Slurm hostlist expansion and natural ordering.
#include <gtest/gtest.h>

#include "common/topology/hostlist.h"

namespace ring::topology {
namespace {

using V = std::vector<std::string>;

TEST(Hostlist, PlainNamesAndRanges) {
  EXPECT_EQ(expand_hostlist("login1"), V{"login1"});
  EXPECT_EQ(expand_hostlist("a,b , c"), (V{"a", "b", "c"}));
  EXPECT_EQ(expand_hostlist("node[1-3]"), (V{"node1", "node2", "node3"}));
  EXPECT_EQ(expand_hostlist("node[1-2,7]"), (V{"node1", "node2", "node7"}));
  EXPECT_EQ(expand_hostlist("n[3]"), V{"n3"});
}

TEST(Hostlist, ZeroPaddingFollowsTheLowerBound) {
  EXPECT_EQ(expand_hostlist("node[08-10]"), (V{"node08", "node09", "node10"}));
  EXPECT_EQ(expand_hostlist("node[8-10]"), (V{"node8", "node9", "node10"}));
  EXPECT_EQ(expand_hostlist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_hostlist("nid[0001-0016]").back(), "nid0016");
}

TEST(Hostlist, SeveralGroupsAndItems) {
  EXPECT_EQ(expand_hostlist("r[1-2]n[01-02]"), (V{"r1n01", "r1n02", "r2n01", "r2n02"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-gpu[1,3].ib"),
            (V{"rack1-gpu1.ib", "rack1-gpu3.ib", "rack2-gpu1.ib", "rack2-gpu3.ib"}));
  EXPECT_EQ(expand_hostlist("a[1-2],b[5],c"), (V{"a1", "a2", "b5", "c"}));
  EXPECT_EQ(expand_hostlist("n[1-2],n[1]"), (V{"n1", "n2", "n1"}));  // duplicates kept
}

TEST(Hostlist, ErrorsSayWhereAndWhat) {
  auto msg = [](const char* e) {
    try {
      expand_hostlist(e);
    } catch (const TopologyError& x) {
      return std::string(x.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("").find("empty"), std::string::npos);
  EXPECT_NE(msg("node[1-3").find("'[' is not closed"), std::string::npos);
  EXPECT_NE(msg("node1-3]").find("']' without '['"), std::string::npos);
  EXPECT_NE(msg("node[3-1]").find("range '3-1' goes down"), std::string::npos);
  EXPECT_NE(msg("node[a-b]").find("'a-b' is not a number"), std::string::npos);
  EXPECT_NE(msg("node[]").find("empty brackets"), std::string::npos);
  EXPECT_NE(msg("a,,b").find("character 3: empty item"), std::string::npos);
  EXPECT_NE(msg("n[1-2[3]]").find("nested"), std::string::npos);
  EXPECT_NE(msg("n[0-99999999]").find("more than"), std::string::npos);
  EXPECT_NE(msg("n[1-5]").find("no error"), std::string::npos);
}

TEST(Hostlist, NaturalOrder) {
  EXPECT_TRUE(natural_less("n2", "n10"));
  EXPECT_FALSE(natural_less("n10", "n2"));
  EXPECT_TRUE(natural_less("n02", "n10"));
  EXPECT_TRUE(natural_less("a9", "b1"));
  EXPECT_TRUE(natural_less("n1", "n1a"));
  EXPECT_TRUE(natural_less("n01", "n1"));  // equal numbers: decided as text, deterministically
  EXPECT_FALSE(natural_less("n1", "n1"));
  EXPECT_TRUE(natural_less("s1", "s00000000000000000000000002"));  // no overflow
}

TEST(Hostlist, HostOfADaemonNodeName) {
  EXPECT_EQ(host_of_daemon_node("node7-j12-n1"), "node7");
  EXPECT_EQ(host_of_daemon_node("gpu-a-01-j3-n0"), "gpu-a-01");
  EXPECT_EQ(host_of_daemon_node("r1-j2-n3-j4-n5"), "r1-j2-n3");  // only ringd's one suffix
  for (const char* same : {"node7", "node7-j12", "node7-n1", "-j1-n2", "node7-jx-n1",
                           "node7-j1-n", "node7-j-n1", "a-j1-n2x"})
    EXPECT_EQ(host_of_daemon_node(same), same) << same;
}

}  // namespace
}  // namespace ring::topology
