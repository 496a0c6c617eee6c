// ringctl nodes [--json]: the node daemons ring-coord knows: up or lost, whose daemon, GPUs,
// last heartbeat, the jobs they serve.
#include <algorithm>
#include <iostream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "coordinator/security.h"

namespace ring::cli {

namespace {

struct NodesOpts {
  CoordFlags coord;
  bool json = false;
  bool all = false;  // retired nodes too
};

int run_nodes(const NodesOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    coord::Client c(o.coord.client_options());
    auto nodes = c.nodes();
    size_t retired = 0;
    if (!o.all) {
      const auto end = std::remove_if(nodes.begin(), nodes.end(),
                                      [](const auto& n) { return n.state == "retired"; });
      retired = static_cast<size_t>(nodes.end() - end);
      nodes.erase(end, nodes.end());
    }
    if (o.json) {
      std::cout << protocol::to_json(protocol::NodesReply{0, nodes})["nodes"].dump(2) << "\n";
      return kExitOk;
    }
    if (nodes.empty()) {
      std::cout << (retired > 0 ? std::to_string(retired) +
                                      " retired node(s) (no heartbeat, every job ended): --all "
                                      "lists them\n"
                                : "no nodes have registered (ringd registers when it starts "
                                  "with --coord)\n");
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
    if (retired > 0)
      std::cout << retired << " retired node(s) not shown (no heartbeat, every job ended): --all\n";
    return kExitOk;
  });
}

}  // namespace

Subcommand add_nodes(CLI::App& app) {
  auto o = std::make_shared<NodesOpts>();
  auto* s = app.add_subcommand("nodes", "Node daemons: state, GPUs, heartbeat, jobs");
  s->add_flag("--json", o->json, "Machine-readable output");
  s->add_flag("--all", o->all,
              "Retired nodes too: no heartbeat, and every job they served has ended (each "
              "finished `ringctl run` leaves one)");
  o->coord.add_to(s);
  return {s, [o] { return run_nodes(*o); }};
}

}  // namespace ring::cli
