// `ringctl plan --search` (sim/search.h) and the cluster flags it shares with `ringctl simulate`.
#include "cli/plan_search.h"

#include <sys/stat.h>

#include <algorithm>
#include <iostream>

#include "cli/commands.h"
#include "fmt/format.h"
#include "sim/search.h"

namespace ring::cli {

namespace {

const std::vector<std::string> kShapes = {"fat-tree", "dragonfly+", "torus3d"};

bool is_regular_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

CLI::Validator choice_of(std::vector<std::string> names, const char* what) {
  return CLI::Validator(
      [names, what](std::string& v) -> std::string {
        if (std::find(names.begin(), names.end(), v) != names.end()) return "";
        std::string all;
        for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
        auto c = closest(v, names);
        return fmt::format("unknown {} '{}'{} (choose {})", what, printable(v),
                           c.empty() ? "" : "; did you mean '" + c + "'?", all);
      },
      "", "NAME");
}

void ClusterFlags::add_to(CLI::App* s, bool all) {
  s->add_option("--topology", topology, "fat-tree, dragonfly+, torus3d, or a topology FILE")
      ->type_name("SHAPE|FILE")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (std::find(kShapes.begin(), kShapes.end(), v) != kShapes.end()) return "";
            if (is_regular_file(v)) return "";
            auto c = closest(v, kShapes);
            return fmt::format(
                "'{}' is neither a topology (fat-tree, dragonfly+, torus3d){} nor a readable "
                "file (*.yaml graph or topology.conf)",
                printable(v), c.empty() ? "" : "; did you mean '" + c + "'?");
          },
          "", "TOPOLOGY"));
  s->add_option("--gpu", gpu, "Device rates: H100, H200, A100 (presets) or cpu (--calibration); "
                              "default: the spec's")
      ->type_name("TYPE")
      ->check(choice_of({"H100", "H200", "A100", "cpu"}, "GPU type"));
  s->add_option("--calibration", calibration,
                "Calibration JSON for --gpu cpu (bench/sim_calibrate.sh)")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
  s->add_option("--node-bw", node_bw_gb, "Network bandwidth per node, GB/s (all NICs)")
      ->type_name("GB/s")
      ->check(flags::seconds_in(0.001, 1e6));
  if (!all) return;
  s->add_option("--oversubscription", oversubscription,
                "Uplink oversubscription (fat-tree, global links)")
      ->type_name("X")
      ->capture_default_str()
      ->check(flags::seconds_in(1, 1000));
  s->add_option("--pod-nodes", pod_nodes, "Fat-tree pod (rack) size in nodes")
      ->capture_default_str()
      ->check(flags::integer_in(1, 100000));
  s->add_option("--routing", routing, "dragonfly+ routing: minimal or valiant")
      ->capture_default_str()
      ->check(choice_of({"minimal", "valiant"}, "routing"));
  s->add_option("--torus-link-bw", torus_link_gb,
                "3D torus link bandwidth per direction, GB/s (default: node bandwidth / 6)")
      ->type_name("GB/s")
      ->check(flags::seconds_in(0.001, 1e6));
  s->add_option("--node-names", node_names,
                "wired: node names follow the racks; shuffled: they do not (the sorted node list "
                "crosses racks)")
      ->capture_default_str()
      ->check(choice_of({"wired", "shuffled"}, "naming"));
  s->add_option("--cluster-nodes", cluster_nodes, "Nodes in the cluster (default: the job's)")
      ->type_name("N")
      ->check(flags::integer_in(1, 1000000));
}

std::string sim_options_from(const ClusterFlags& f, const spec::JobSpec& s, sim::SimOptions* so) {
  std::string gpu = f.gpu;
  if (gpu.empty())
    gpu = s.resources.backend == spec::Backend::kCpu ? "cpu" : spec::to_string(s.resources.gpu_type);
  try {
    if (gpu == "cpu") {
      if (f.calibration.empty())
        return "--calibration: --gpu cpu needs a calibration file (bench/sim_calibrate.sh "
               "measures this machine and writes one)";
      so->rates = sim::load_calibration(f.calibration);
    } else {
      so->rates = sim::preset_rates(gpu);
    }
  } catch (const std::exception& e) {
    return std::string(gpu == "cpu" ? "--calibration: " : "--gpu: ") + e.what();
  }
  sim::ClusterOptions& c = so->cluster;
  double default_bw = 200;
  if (f.topology == "fat-tree") {
    c.shape = sim::Shape::kFatTree;
  } else if (f.topology == "dragonfly+") {
    c.shape = sim::Shape::kDragonflyPlus;
    default_bw = 400;
  } else if (f.topology == "torus3d") {
    c.shape = sim::Shape::kTorus3d;
    default_bw = 300;
  } else {
    const std::string& t = f.topology;
    const bool yaml = t.size() > 5 && (t.ends_with(".yaml") || t.ends_with(".yml"));
    c.shape = yaml ? sim::Shape::kGraphFile : sim::Shape::kSlurmConf;
    c.file = t;
  }
  if (so->rates.network_bw > 0) default_bw = so->rates.network_bw / 1e9;
  c.node_bw = (f.node_bw_gb > 0 ? f.node_bw_gb : default_bw) * 1e9;
  c.oversubscription = f.oversubscription;
  c.pod_nodes = static_cast<int>(f.pod_nodes);
  c.valiant = f.routing == "valiant";
  c.torus_link = f.torus_link_gb * 1e9;
  c.shuffled_names = f.node_names == "shuffled";
  c.nodes = static_cast<int>(f.cluster_nodes);
  if (so->rates.network_latency > 0)
    c.nic_latency = so->rates.network_latency / 2, c.switch_latency = 0;
  return "";
}

std::string gpu_type_for(const std::string& gpu) {
  if (gpu == "H100") return "H100-80G";
  if (gpu == "H200") return "H200-141G";
  if (gpu == "A100") return "A100-80G";
  return "";
}

namespace {

// The command line that reproduces a search, for the written spec's header.
std::string command_line(const PlanSearchOpts& o, const spec::JobSpec& s) {
  std::string c = "ringctl plan --search " + o.file + " --nodes " + std::to_string(s.resources.nodes);
  if (!o.cluster.gpu.empty()) c += " --gpu " + o.cluster.gpu;
  c += " --topology " + o.cluster.topology;
  if (o.cluster.node_bw_gb > 0) c += fmt::format(" --node-bw {}", o.cluster.node_bw_gb);
  if (o.sequences > 0) c += " --sequences " + std::to_string(o.sequences);
  if (o.max_micro_batches != 4) c += " --max-micro-batches " + std::to_string(o.max_micro_batches);
  if (o.expand != "auto") c += " --expand " + o.expand;
  if (o.what_if) c += " --what-if";
  for (const auto& a : o.set.args) c += " --set " + a;
  return c;
}

// --write: the user's file with the changed keys, checked to load back to the best layout.
int write_best(const PlanSearchOpts& o, const spec::LoadResult& plain,
               const spec::LoadResult& user, const sim::SearchResult& r,
               const spec::LoadOptions& lo, const std::vector<spec::Override>& cluster_keys) {
  const sim::Candidate& b = r.ranked.front();
  std::vector<spec::Override> keys = o.set.overrides();
  keys.insert(keys.end(), cluster_keys.begin(), cluster_keys.end());
  for (const auto& k : b.layout.keys()) keys.push_back(k);
  keys.push_back({"resources.nodes", std::to_string(r.nodes)});
  const std::string& original = plain.text;  // the file's own, comments kept
  const std::string header = fmt::format(
      "# Layout picked by `{}`:\n# {}; predicted step {:.2f} s, {:.0f} tokens/s, MFU {:.2f} % "
      "(ringctl simulate, {}).\n",
      command_line(o, *user.spec), b.layout.describe(), b.result.step_s, b.result.tokens_per_s,
      100 * b.result.mfu, o.cluster.topology);
  const std::string text = header + sim::set_yaml_keys(original, keys);
  spec::LoadOptions check = lo;
  check.overrides.clear();
  auto back = spec::load_spec_string(text, o.write, check);
  if (!back.ok()) {
    for (const auto& d : back.diagnostics) std::cerr << d.str() << "\n";
    std::cerr << "ringctl plan --search: --write: the rewritten spec does not validate (a bug: "
                 "please report it); nothing written\n";
    return kExitFailed;
  }
  const auto& s = *back.spec;
  const auto& l = b.layout;
  if (s.parallel.head_ranks != l.head_ranks || s.parallel.context_ranks != l.context_ranks ||
      s.parallel.data_replicas != l.data_replicas || s.train.micro_batches != l.micro_batches ||
      s.parallel.shard != l.shard || s.model.recompute != l.recompute ||
      (l.recompute &&
       (s.model.recompute_policy == spec::RecomputePolicy::kSelective) != l.selective) ||
      s.optimizer.compression != l.compression || s.resources.nodes != r.nodes) {
    std::cerr << "ringctl plan --search: --write: the rewritten spec does not read back as the "
                 "chosen layout (a bug: please report it); nothing written\n";
    return kExitFailed;
  }
  try {
    write_file_as(o.write, text, 0644);
  } catch (const std::exception& e) {
    std::cerr << "ringctl plan --search: --write: " << e.what() << "\n";
    return kExitFailed;
  }
  if (!o.json) std::cerr << "wrote " << o.write << " (" << l.describe() << ")\n";
  return kExitOk;
}

}  // namespace

int run_plan_search(const PlanSearchOpts& o) {
  const char* where = "ringctl plan --search";
  auto lo = spec::job_spec_options();
  lo.allow_stdin = true;
  lo.runtime_limits_are_errors = !o.what_if;
  lo.overrides = o.set.overrides();
  std::vector<spec::Override> cluster_keys;
  const std::string gpu_type = gpu_type_for(o.cluster.gpu);
  if (!gpu_type.empty()) cluster_keys.push_back({"resources.gpu_type", gpu_type});
  auto user_lo = lo;
  user_lo.overrides.insert(user_lo.overrides.end(), cluster_keys.begin(), cluster_keys.end());
  if (o.file == "-") {
    std::cerr << where << ": the spec must be a file (the search loads it once per layout)\n";
    return kExitUsage;
  }
  // The file's own text once; every layout is that text with its keys as overrides.
  const spec::LoadResult plain = spec::load_spec_file(o.file, spec::LoadOptions{});
  if (plain.text.empty()) {
    for (const auto& d : plain.diagnostics) std::cerr << d.str() << "\n";
    return kExitFailed;
  }
  auto user = spec::load_spec_string(plain.text, o.file, user_lo);
  if (!user.ok()) {
    for (const auto& d : user.diagnostics)
      if (d.severity == spec::Diagnostic::Severity::kError) std::cerr << d.str() << "\n";
    std::cerr << o.file << ": " << user.error_count()
              << " error(s); fix them before searching (the search starts from a valid spec)\n";
    return kExitFailed;
  }
  const spec::JobSpec& s = *user.spec;
  if (s.job.kind == spec::JobKind::kGenerate) {
    std::cerr << o.file << ": job.kind is generate: --search lays out a training step\n";
    return kExitFailed;
  }
  if (o.nodes == 0 && !user.source.keys.count("resources.nodes") &&
      !user.source.overrides.count("resources.nodes")) {
    std::cerr << where << ": --nodes: " << o.file
              << " does not set resources.nodes; name the cluster's size with --nodes N\n";
    return kExitUsage;
  }
  sim::SearchOptions so;
  so.nodes = o.nodes > 0 ? o.nodes : s.resources.nodes;
  so.max_micro_batches = o.max_micro_batches;
  so.sequences = o.sequences;
  so.simulate_top = o.simulate_top;
  so.exhaustive = o.exhaustive;
  so.sim.expand = o.expand == "full"      ? sim::Expand::kFull
                  : o.expand == "reduced" ? sim::Expand::kReduced
                                          : sim::Expand::kAuto;
  if (std::string err = sim_options_from(o.cluster, s, &so.sim); !err.empty()) {
    std::cerr << where << ": " << err << "\n";
    return kExitUsage;
  }
  auto load = [&](const std::vector<spec::Override>& keys) {
    auto x = user_lo;
    x.overrides.insert(x.overrides.end(), keys.begin(), keys.end());
    return spec::load_spec_string(plain.text, o.file, x);
  };
  sim::SearchResult r;
  try {
    r = sim::search_layouts(s, load, so);
  } catch (const topology::TopologyError& e) {
    std::cerr << where << ": --topology: " << e.what() << "\n";
    return kExitFailed;
  } catch (const std::invalid_argument& e) {
    std::cerr << where << ": " << o.file << ": " << e.what() << "\n";
    return std::string(e.what()).find("no layout fits") != std::string::npos ? kExitNoFit
                                                                              : kExitFailed;
  }
  if (o.json)
    std::cout << sim::to_json(r, o.top).dump(2) << "\n";
  else
    std::cout << sim::to_text(r, o.top);
  if (o.write.empty()) return kExitOk;
  return write_best(o, plain, user, r, lo, cluster_keys);
}

}  // namespace ring::cli
