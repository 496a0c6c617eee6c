// ringctl events JOB [--follow] [--json]: what happened to a job, oldest first (submitted,
// state changes, nodes joining, workers started/died with their signal and last log lines,
// checkpoints, ring order). --follow keeps printing new events until the job reaches a final
// state (or Ctrl-C). --json prints one JSON object per line (JSON Lines), also with --follow.
#include <iostream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/local_state.h"

namespace ring::cli {

namespace {

struct EventsOpts {
  CoordFlags coord;
  std::string job;
  bool json = false;
  bool follow = false;
  int64_t after = 0;
  double interval = 0.5;
};

// The event's data as short "key=value" text; last_log lines on their own indented lines.
std::string describe(const protocol::EventRecord& e) {
  std::string s, log;
  for (auto it = e.data.begin(); it != e.data.end(); ++it) {
    if (it.key() == "last_log" && it->is_array()) {
      for (const auto& l : *it)
        log += "\n    | " + printable(l.is_string() ? l.get<std::string>() : l.dump());
      continue;
    }
    if (!s.empty()) s += " ";
    s += printable(it.key()) + "=" +
         printable(it->is_string() ? it->get<std::string>() : it->dump());
  }
  return s + log;
}

int run_events(const EventsOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    int64_t job = parse_job_id(o.job);
    coord::Client c(with_local_state(o.coord.client_options()));
    int64_t after = o.after;
    if (o.follow) install_stop_signals();
    bool header = false;
    while (true) {
      // Pages of 500 until caught up.
      while (true) {
        auto ev = c.events(job, after, 500);
        for (const auto& e : ev) {
          after = std::max(after, e.id);
          if (o.json) {
            nlohmann::json j = {{"id", e.id},     {"time", e.time}, {"attempt", e.attempt},
                                {"node", e.node}, {"kind", e.kind}, {"data", e.data}};
            if (e.job) j["job"] = *e.job;
            std::cout << j.dump() << "\n";
            continue;
          }
          if (!header) {
            std::cout << "TIME                 ATTEMPT  NODE        EVENT\n";
            header = true;
          }
          char line[128];
          std::snprintf(line, sizeof line, "%-19s  %7lld  %-10s  ", format_time(e.time).c_str(),
                        static_cast<long long>(e.attempt),
                        e.node.empty() ? "-" : printable(e.node).c_str());
          std::string kind = e.kind == "worker_died" || e.kind == "checkpoint_failed"
                                 ? paint(e.kind, "31")
                                 : printable(e.kind);
          std::cout << line << kind << "  " << describe(e) << "\n";
        }
        if (ev.size() < 500) break;
      }
      std::cout << std::flush;
      if (!o.follow) break;
      auto st = c.status(job);
      if (st.state == "completed" || st.state == "failed" || st.state == "cancelled" ||
          st.state == "stopped") {
        // Events written with the final state change are already in; one more read catches a
        // straggler from a node that reported late.
        auto ev = c.events(job, after, 500);
        if (ev.empty()) break;
        continue;
      }
      if (!sleep_unless_stopped(o.interval)) break;
    }
    return kExitOk;
  });
}

}  // namespace

Subcommand add_events(CLI::App& app) {
  auto o = std::make_shared<EventsOpts>();
  auto* s = app.add_subcommand("events", "A job's events: state changes, workers, checkpoints");
  s->add_option("job", o->job, "Job id")->required();
  s->add_flag("--json", o->json, "One JSON object per line");
  s->add_flag("-f,--follow", o->follow, "Keep printing new events until the job ends");
  s->add_option("--after", o->after, "Only events with a larger id")
      ->check(flags::integer_in(0, int64_t{1} << 53));
  o->coord.add_to(s);
  return {s, [o] { return run_events(*o); }};
}

}  // namespace ring::cli
