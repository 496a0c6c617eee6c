// ringctl simulate: one training step of a spec on a simulated cluster (sim/simulate.h,
// docs/simulation.md): per-phase times, the critical path, effective ring bandwidth, the share of
// ring communication hidden behind compute; what-ifs on ring order, stagger, stragglers, slow
// links, shard mode and top-k density.
#include <sys/stat.h>

#include <cmath>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_search.h"
#include "common/topology/hostlist.h"
#include "fmt/format.h"
#include "sim/simulate.h"

namespace ring::cli {

namespace {

struct SimulateOpts {
  std::string file;
  ClusterFlags cluster;  // --topology, --gpu, --calibration, --node-bw, ... (cli/plan_search.h)
  int64_t nodes = 0;
  std::string ring_order;
  std::string stagger;
  int64_t stagger_us = -1;
  std::vector<std::string> stragglers;
  std::vector<std::string> slow_links;
  std::string shard;
  std::string compression;
  double density = 0;
  std::string expand = "auto";
  bool json = false;
  std::string trace;
  SetFlags set;
};

// "A:F" with A a non-negative integer and F a finite factor >= 1.
bool parse_target_factor(const std::string& v, int64_t* target, double* factor) {
  const auto colon = v.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == v.size()) return false;
  const std::string a = v.substr(0, colon), f = v.substr(colon + 1);
  if (a.find_first_not_of("0123456789") != std::string::npos || a.size() > 9) return false;
  char* end = nullptr;
  const double x = std::strtod(f.c_str(), &end);
  if (end != f.c_str() + f.size() || !std::isfinite(x) || x < 1 || x > 1e6) return false;
  *target = std::stoll(a);
  *factor = x;
  return true;
}

CLI::Validator target_factor(const char* target) {
  return CLI::Validator(
      [target](std::string& v) -> std::string {
        int64_t t;
        double f;
        if (parse_target_factor(v, &t, &f)) return "";
        return fmt::format("expected {}:FACTOR ({} a number, FACTOR >= 1, e.g. 3:2.5), got '{}'",
                           target, target, printable(v));
      },
      "", fmt::format("{}:FACTOR", target));
}

int run_simulate(const SimulateOpts& o) {
  const char* where = "ringctl simulate";
  auto load = [&](const std::vector<spec::Override>& extra) {
    auto lo = spec::job_spec_options();
    lo.allow_stdin = true;
    lo.runtime_limits_are_errors = false;  // a design is simulated like `plan --what-if`
    lo.overrides = o.set.overrides();
    lo.overrides.insert(lo.overrides.end(), extra.begin(), extra.end());
    return spec::load_spec_file(o.file, lo);
  };
  std::vector<spec::Override> extra;
  if (!o.shard.empty()) extra.push_back({"parallel.shard", o.shard});
  if (!o.compression.empty()) extra.push_back({"optimizer.compression", o.compression});
  if (o.density > 0) extra.push_back({"optimizer.density", fmt::format("{}", o.density)});
  auto r = load(extra);
  auto print = [&](const spec::LoadResult& x) {
    for (const auto& d : x.diagnostics)
      if (d.severity == spec::Diagnostic::Severity::kError) std::cerr << d.str() << "\n";
  };
  if (!r.ok()) {
    print(r);
    std::cerr << o.file << ": " << r.error_count() << " error(s); fix them before simulating\n";
    return kExitFailed;
  }
  if (r.spec->job.kind == spec::JobKind::kGenerate) {
    std::cerr << o.file << ": job.kind is generate: ringctl simulate models a training step\n";
    return kExitFailed;
  }
  if (o.nodes > 0) {
    // More (or fewer) nodes: the same rings, as many data replicas as the nodes hold.
    const int64_t wpn = r.spec->resources.workers_per_node, c = r.spec->parallel.context_ranks;
    if ((o.nodes * wpn) % c != 0) {
      std::cerr << where << ": --nodes: " << o.nodes << " nodes x " << wpn
                << " workers per node is not a multiple of parallel.context_ranks " << c << "\n";
      return kExitUsage;
    }
    extra.push_back({"resources.nodes", std::to_string(o.nodes)});
    extra.push_back({"parallel.data_replicas", std::to_string(o.nodes * wpn / c)});
    r = load(extra);
    if (!r.ok()) {
      print(r);
      std::cerr << where << ": --nodes " << o.nodes << ": the spec does not validate with that many nodes\n";
      return kExitFailed;
    }
  }
  const spec::JobSpec& s = *r.spec;

  sim::SimOptions so;
  if (std::string err = sim_options_from(o.cluster, s, &so); !err.empty()) {
    std::cerr << where << ": " << err << "\n";
    return kExitUsage;
  }
  // What-ifs.
  if (o.ring_order == "natural") so.ring_order = sim::RingOrderChoice::kNatural;
  if (o.ring_order == "topology") so.ring_order = sim::RingOrderChoice::kTopology;
  if (o.stagger == "off") so.stagger_us = 0;
  if (o.stagger == "on")
    so.stagger_us = o.stagger_us >= 0 ? o.stagger_us : (s.parallel.stagger_us > 0 ? s.parallel.stagger_us : 50);
  else if (o.stagger.empty() && o.stagger_us >= 0)
    so.stagger_us = o.stagger_us;
  for (const auto& v : o.stragglers) {
    sim::Straggler x;
    parse_target_factor(v, &x.rank, &x.factor);
    so.stragglers.push_back(x);
  }
  for (const auto& v : o.slow_links) {
    sim::SlowLink x;
    parse_target_factor(v, &x.node, &x.factor);
    so.slow_links.push_back(x);
  }
  so.expand = o.expand == "full" ? sim::Expand::kFull
              : o.expand == "reduced" ? sim::Expand::kReduced : sim::Expand::kAuto;
  so.keep_trace = !o.trace.empty();
  for (const auto& x : so.stragglers)
    if (x.rank >= s.resources.nodes * s.resources.workers_per_node) {
      std::cerr << where << ": --straggler: rank " << x.rank << " is not one of the job's 0.."
                << s.resources.nodes * s.resources.workers_per_node - 1 << "\n";
      return kExitUsage;
    }
  for (const auto& x : so.slow_links)
    if (x.node >= s.resources.nodes) {
      std::cerr << where << ": --slow-link: node " << x.node << " is not one of the job's 0.."
                << s.resources.nodes - 1 << "\n";
      return kExitUsage;
    }

  sim::SimResult res;
  try {
    res = sim::simulate(s, so);
  } catch (const topology::TopologyError& e) {
    std::cerr << where << ": --topology: " << e.what() << "\n";
    return kExitFailed;
  } catch (const std::exception& e) {
    std::cerr << where << ": " << e.what() << "\n";
    return kExitFailed;
  }
  if (!o.trace.empty()) {
    try {
      sim::write_trace(res, o.trace);
    } catch (const std::exception& e) {
      std::cerr << where << ": --trace: " << e.what() << "\n";
      return kExitFailed;
    }
  }
  if (o.json)
    std::cout << sim::to_json(res).dump(2) << "\n";
  else
    std::cout << sim::to_text(res);
  return kExitOk;
}

}  // namespace

Subcommand add_simulate(CLI::App& app) {
  auto o = std::make_shared<SimulateOpts>();
  auto* s = app.add_subcommand(
      "simulate", "Predict one training step of a spec on a simulated cluster (time per phase, "
                  "critical path, ring bandwidth)");
  s->footer(
      "Topologies: fat-tree (rail-optimised, 200 GB/s per node by default), dragonfly+ (400), "
      "torus3d (300), or a file: *.yaml (a link graph) or a Slurm topology.conf (LinkSpeed= in "
      "GB/s). docs/simulation.md describes the model and its assumptions.");
  s->add_option("file", o->file, "Spec file (YAML, a regular file); - reads standard input")->required();
  s->add_option("--nodes", o->nodes, "Nodes of the job (data replicas scale to fill them)")
      ->type_name("N")
      ->check(flags::integer_in(1, 1000000));
  o->cluster.add_to(s, true);
  s->add_option("--ring-order", o->ring_order, "natural or topology (default: the spec's)")
      ->type_name("ORDER")
      ->check(choice_of({"natural", "topology"}, "ring order"));
  s->add_option("--stagger", o->stagger, "on or off: staggered ring sends (default: the spec's; on without --stagger-us: the spec's "
                   "stagger_us, else 50 us)")
      ->type_name("on|off")
      ->check(choice_of({"on", "off"}, "stagger setting"));
  s->add_option("--stagger-us", o->stagger_us, "Stagger per ring position, microseconds")
      ->type_name("US")
      ->check(flags::integer_in(0, 1000000));
  s->add_option("--straggler", o->stragglers, "A slow rank: its compute takes FACTOR x as long (repeatable)")
      ->type_name("RANK:FACTOR")
      ->check(target_factor("RANK"));
  s->add_option("--slow-link", o->slow_links, "A slow node link: the NICs of job node NODE at bandwidth / FACTOR (repeatable)")
      ->type_name("NODE:FACTOR")
      ->check(target_factor("NODE"));
  s->add_option("--shard", o->shard, "parallel.shard: none, optimizer or full")
      ->type_name("MODE")
      ->check(choice_of({"none", "optimizer", "full"}, "shard mode"));
  s->add_option("--compression", o->compression, "optimizer.compression: none or topk")
      ->type_name("KIND")
      ->check(choice_of({"none", "topk"}, "compression"));
  s->add_option("--density", o->density, "optimizer.density of top-k (0 < density <= 1)")
      ->type_name("X")
      ->check(flags::seconds_in(1e-9, 1));
  s->add_option("--expand", o->expand, "auto, full (every rank) or reduced (one ring's period)")
      ->capture_default_str()
      ->check(choice_of({"auto", "full", "reduced"}, "expansion"));
  s->add_flag("--json", o->json, "Machine-readable output");
  s->add_option("--trace", o->trace, "Write a Chrome/Perfetto trace of the simulated step to FILE")
      ->type_name("FILE");
  o->set.add_to(s);
  return {s, [o] { return run_simulate(*o); }};
}

}  // namespace ring::cli
