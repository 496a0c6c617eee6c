// Finding the node's GPUs without linking the CUDA driver.
//
// Order of sources: `nvidia-smi` when it is on PATH (`topo -m` for the links and affinities,
// `--query-gpu=... --format=csv,noheader,nounits` for names, UUIDs, bus ids and memory; parsed by
// gpu_topology.h); else NVML opened with dlopen("libnvidia-ml.so.1") when the library exists
// (never linked, so ringd runs on machines without a driver); else no GPUs. "No GPUs" is a
// normal answer (a CPU node), not an error. A tool that exists but fails, hangs past the
// timeout or prints something unparseable is an error (TopologyParseError / PlacementError):
// a GPU node that silently looked GPU-less would run its job on the CPU.
#pragma once

#include <string>
#include <vector>

#include "common/proc/run_command.h"
#include "daemon/placement/gpu_topology.h"

namespace ring::placement {

struct DiscoveryOptions {
  std::string nvidia_smi = "nvidia-smi";  // a name looked up on PATH, or a path
  int timeout_ms = 30000;                 // per nvidia-smi call (it can hang on a wedged driver)
  bool use_nvml = true;
  std::string nvml_library = "libnvidia-ml.so.1";
};

struct GpuDiscovery {
  GpuTopology topology;
  std::string source;              // "nvidia-smi", "nvml" or "none"
  std::vector<std::string> notes;  // why a source was skipped
};

// Runs the tools (seconds on a large node): call it once at start-up and keep the result.
GpuDiscovery discover_gpus(const DiscoveryOptions& options = {});

// Full path of an executable: `name` itself when it contains '/', else the first match on
// PATH; empty when there is none.
using proc::find_executable;

using CommandResult = proc::CommandResult;

// Runs argv[0] (a path) with no shell (proc::run_command), keeping 1 MiB of stdout and 64 KiB
// of stderr; kills it after timeout_ms. Throws PlacementError when it cannot be started.
CommandResult run_command(const std::vector<std::string>& argv, int timeout_ms);

// NVML through dlopen. Returns false (with `why`) when the library or a symbol is missing or
// NVML fails to initialise; fills `out` otherwise.
bool discover_gpus_nvml(const std::string& library, GpuTopology& out, std::string& why);

}  // namespace ring::placement
