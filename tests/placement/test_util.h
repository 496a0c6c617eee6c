// Helpers shared by the placement tests.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "daemon/placement/cpu_topology.h"

namespace ring::placement::testing {

inline std::string fixture_path(const std::string& name) {
  return std::string(RING_SOURCE_DIR) + "/tests/placement/fixtures/" + name;
}

inline std::string read_fixture(const std::string& name) {
  std::ifstream in(fixture_path(name));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Linux numbering of an SMT machine: core c of node n has PUs n*cores+c and that plus all
// cores (so node 0 of a 2 x 56-core machine is "0-55,112-167", like nvidia-smi prints).
inline CpuTopology make_cpus(int nodes, int cores_per_node, int smt = 2) {
  CpuTopology t;
  const int total = nodes * cores_per_node;
  for (int n = 0; n < nodes; ++n) {
    t.numa_nodes.push_back(n);
    for (int c = 0; c < cores_per_node; ++c) {
      CpuCore core;
      core.id = static_cast<int>(t.cores.size());
      core.numa_node = n;
      for (int s = 0; s < smt; ++s) core.pus.push_back(n * cores_per_node + c + s * total);
      t.cores.push_back(core);
    }
  }
  return t;
}

}  // namespace ring::placement::testing
