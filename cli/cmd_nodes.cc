// ringctl nodes [--json]: the node daemons ring-coord knows: up or lost, whose daemon, GPUs,
// last heartbeat, the jobs they serve.
#include <iostream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "coordinator/security.h"

namespace ring::cli {

namespace {

struct NodesOpts {
  CoordFlags coord;
  bool json = false;
};

int run_nodes(const NodesOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    coord::Client c(o.coord.client_options());
    auto nodes = c.nodes();
    if (o.json) {
      std::cout << protocol::to_json(protocol::NodesReply{0, nodes})["nodes"].dump(2) << "\n";
      return kExitOk;
    }
    if (nodes.empty()) {
      std::cout << "no nodes have registered (ringd registers when it starts with --coord)\n";
      return kExitOk;
    }
    double now = now_unix();
    std::vector<std::vector<std::string>> rows;
    for (const auto& n : nodes) {
      std::string jobs;
      for (auto j : n.jobs) jobs += (jobs.empty() ? "" : ",") + std::to_string(j);
      rows.push_back({printable(n.name), state_color(n.state),
                      coord::user_name(static_cast<uint32_t>(n.uid)), std::to_string(n.gpus),
                      format_duration(now - n.last_heartbeat) + " ago", jobs.empty() ? "-" : jobs,
                      printable(n.ringd_version)});
    }
    std::cout << format_table({"NODE", "STATE", "USER", "GPUS", "HEARTBEAT", "JOBS", "RINGD"}, rows,
                              {3});
    return kExitOk;
  });
}

}  // namespace

Subcommand add_nodes(CLI::App& app) {
  auto o = std::make_shared<NodesOpts>();
  auto* s = app.add_subcommand("nodes", "Node daemons: state, GPUs, heartbeat, jobs");
  s->add_flag("--json", o->json, "Machine-readable output");
  o->coord.add_to(s);
  return {s, [o] { return run_nodes(*o); }};
}

}  // namespace ring::cli
