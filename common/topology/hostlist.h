// Slurm hostlist expressions: "node[01-16]", "gpu[1-3,7],login1", "r[1-2]n[01-02]".
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ring::topology {

// Malformed cluster topology input. The message starts with "<file>:<line>:" when the input
// came from a file, and says what is wrong.
class TopologyError : public std::runtime_error {
 public:
  explicit TopologyError(const std::string& message) : std::runtime_error(message) {}
};

// Refuses expressions that expand to more names than this (a typo like n[0-99999999]).
inline constexpr size_t kMaxHostlistNames = 1 << 20;

// Expands a hostlist in Slurm's order: comma-separated items (commas inside brackets separate
// ranges); each bracket group is a list of N or N-M; zero padding follows the width of the
// lower bound as written ("[08-10]" -> 08 09 10; "[8-10]" -> 8 9 10); several groups in one
// item expand as a cartesian product, the last group fastest ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1
// r2n2). Whitespace around items is ignored. Duplicates are kept (Slurm keeps them too).
// Throws TopologyError naming the position and the problem.
std::vector<std::string> expand_hostlist(std::string_view expression);

// Compares names with their digit runs as numbers: "n2" < "n10", then as text.
bool natural_less(const std::string& a, const std::string& b);

// The host of a node name as ringd registers it with ring-coord, "<host>-j<job>-n<node rank>"
// (daemon/ringd/coord_link.h: unique per job and node rank): "node7-j12-n1" -> "node7". Any other
// name is a host name already and comes back unchanged.
std::string host_of_daemon_node(const std::string& node);

}  // namespace ring::topology
