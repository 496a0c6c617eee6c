// The simulated cluster as `ringctl simulate` and `ringctl plan --search` take it (--topology,
// --gpu, --calibration, --node-bw, ...), and `ringctl plan --search` itself (sim/search.h,
// docs/planning.md "Layout search").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/ctl_common.h"
#include "common/spec/spec.h"
#include "sim/simulate.h"

namespace ring::cli {

struct ClusterFlags {
  std::string topology = "fat-tree";
  std::string gpu;          // H100, H200, A100, cpu; empty: the spec's
  std::string calibration;  // --gpu cpu
  double node_bw_gb = 0;
  double oversubscription = 1;
  int64_t pod_nodes = 16;
  std::string routing = "minimal";
  double torus_link_gb = 0;
  std::string node_names = "wired";
  int64_t cluster_nodes = 0;

  // --topology and --gpu always; the rest with `all` (simulate's full set).
  void add_to(CLI::App* app, bool all);
};

// A flag's value among `names`; the error names `what`, the choices and the closest one.
CLI::Validator choice_of(std::vector<std::string> names, const char* what);

// Rates and cluster of `so` from the flags for spec s. Returns "" or the error, starting with
// the flag it is about ("--gpu: ...").
std::string sim_options_from(const ClusterFlags& f, const spec::JobSpec& s, sim::SimOptions* so);

// The spec's resources.gpu_type for a --gpu preset ("H200" -> "H200-141G"); empty for cpu.
std::string gpu_type_for(const std::string& gpu);

struct PlanSearchOpts {
  std::string file;
  bool json = false;
  bool what_if = false;
  SetFlags set;
  ClusterFlags cluster;
  int64_t nodes = 0;
  int top = 5;
  int simulate_top = 6;
  int64_t max_micro_batches = 4;
  int64_t sequences = 0;
  bool exhaustive = false;
  std::string expand = "auto";  // the simulations' expansion, as simulate --expand
  std::string write;
};

// ringctl plan --search: an exit code (kExitOk, kExitUsage, kExitFailed, kExitNoFit).
int run_plan_search(const PlanSearchOpts& o);

}  // namespace ring::cli
