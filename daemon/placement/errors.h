// Errors of node placement (daemon/placement/).
//
// Output of nvidia-smi or hwloc that cannot be understood is a TopologyParseError naming the
// source ("nvidia-smi topo -m", line 3) and what was expected; a request that cannot be placed
// (more GPU workers than GPUs, a cpuset that the kernel refuses) is a PlacementError. Nothing in
// daemon/placement aborts on bad input: ringd turns these into a refused job, not a crash.
#pragma once

#include <stdexcept>
#include <string>

namespace ring::placement {

class TopologyParseError : public std::runtime_error {
 public:
  explicit TopologyParseError(const std::string& message) : std::runtime_error(message) {}
};

class PlacementError : public std::runtime_error {
 public:
  explicit PlacementError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ring::placement
