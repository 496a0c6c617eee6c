// ringctl status [JOB] [--json] [--follow]: the jobs ring-coord knows, in the spirit of squeue.
//
//   JOBID  NAME  USER  STATE    STEP/TOTAL  LOSS    TOK/S  ATTEMPT  NODES  AGE    CKPT
//   7      tiny  ada   running  120/200     2.3456  14.2k  1        1      3m05s  100
//
// With JOB: the same row plus the details (reason, restarts, ring order, directories).
// --json: the coordinator's job objects (an array; one object with JOB). --follow: refresh every
// --interval seconds until Ctrl-C; with JOB it ends when the job reaches a final state. Not on
// a terminal, --follow prints a new table (or JSON line) only when something changed.
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/local_state.h"
#include "cli/slurm_control.h"

namespace ring::cli {

namespace {

struct StatusOpts {
  CoordFlags coord;
  std::string job;
  bool json = false;
  bool follow = false;
  double interval = 2;
};

bool final_state(const std::string& s) {
  return s == "completed" || s == "failed" || s == "cancelled";
}

std::vector<std::string> row(const protocol::JobInfo& j, double now) {
  char loss[32] = "-";
  if (j.loss) std::snprintf(loss, sizeof loss, "%.4f", *j.loss);
  return {std::to_string(j.job),
          printable(j.name),
          j.owner.empty() ? std::to_string(j.owner_uid) : printable(j.owner),
          state_color(j.state),
          std::to_string(j.step) + "/" + std::to_string(j.total_steps),
          loss,
          j.tokens_per_s ? format_rate(*j.tokens_per_s) : "-",
          std::to_string(j.attempt),
          j.nodes.empty() ? "-" : std::to_string(j.nodes.size()),
          format_duration(now - j.created_at),
          j.last_checkpoint_step ? std::to_string(*j.last_checkpoint_step) : "-"};
}

std::string table(const std::vector<protocol::JobInfo>& jobs) {
  double now = now_unix();
  std::vector<std::vector<std::string>> rows;
  for (const auto& j : jobs) rows.push_back(row(j, now));
  std::vector<std::string> header{"JOBID", "NAME", "USER", "STATE", "STEP/TOTAL", "LOSS",
                                  "TOK/S", "ATTEMPT", "NODES", "AGE", "CKPT"};
  // Jobs submitted to Slurm: its id and state ("1234:RUNNING", "1234:PENDING(Resources)").
  auto views = slurm_views(jobs);
  if (!views.empty()) {
    header.push_back("SLURM");
    for (size_t i = 0; i < jobs.size(); ++i) {
      const auto& id = jobs[i].slurm_job_id;
      if (id.empty()) {
        rows[i].push_back("-");
        continue;
      }
      const auto& v = views[id];
      std::string cell = id + ":" + (v.found ? v.state : "?");
      if (v.found && v.state == "PENDING" && !v.reason.empty()) cell += "(" + v.reason + ")";
      rows[i].push_back(printable(cell));
    }
  }
  return format_table(header, rows, {0, 5, 6, 7, 8, 10});
}

// job_json plus, for a job submitted to Slurm, "slurm": Slurm's view (slurm::to_json).
nlohmann::json job_json_with_slurm(const protocol::JobInfo& j,
                                   std::map<std::string, slurm::JobView>& views) {
  auto o = job_json(j);
  if (!j.slurm_job_id.empty()) o["slurm"] = slurm::to_json(views[j.slurm_job_id]);
  return o;
}

std::string details(const protocol::JobInfo& j) {
  std::ostringstream os;
  auto join = [](const std::vector<std::string>& v, const char* sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + printable(v[i]);
    return s.empty() ? std::string("-") : s;
  };
  os << table({j}) << "\n";
  os << "state:        " << state_color(j.state)
     << (j.state_reason.empty() ? "" : " (" + printable(j.state_reason) + ")") << "\n";
  os << "restarts:     " << j.restarts << " of " << j.max_restarts << " automatic\n";
  os << "nodes:        " << join(j.nodes, " ") << "\n";
  os << "ring order:   " << join(j.ring_order, " -> ") << "\n";
  os << "job dir:      " << (j.job_dir.empty() ? "-" : printable(j.job_dir)) << "\n";
  os << "checkpoints:  " << (j.checkpoint_dir.empty() ? "-" : printable(j.checkpoint_dir))
     << (j.last_checkpoint_step
             ? " (latest complete: step " + std::to_string(*j.last_checkpoint_step) + ")"
             : " (none complete yet)")
     << "\n";
  if (!j.slurm_job_id.empty()) {
    auto v = slurm_views({j});
    os << "slurm job:    " << printable(j.slurm_job_id) << ": "
       << printable(slurm::summary(v[j.slurm_job_id])) << "\n";
  }
  os << "spec:         " << printable(j.spec_hash) << "\n";
  os << "submitted:    " << format_time(j.created_at) << "; updated " << format_time(j.updated_at)
     << "\n";
  return os.str();
}

int run_status(const StatusOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    std::optional<int64_t> job;
    if (!o.job.empty()) job = parse_job_id(o.job);
    coord::Client c(with_local_state(o.coord.client_options()));
    auto fetch = [&] { return job ? std::vector<protocol::JobInfo>{c.status(*job)} : c.status(); };
    auto render = [&](const std::vector<protocol::JobInfo>& jobs) -> std::string {
      if (o.json) {
        auto views = slurm_views(jobs);
        if (job) return job_json_with_slurm(jobs[0], views).dump(o.follow ? -1 : 2) + "\n";
        nlohmann::json a = nlohmann::json::array();
        for (const auto& j : jobs) a.push_back(job_json_with_slurm(j, views));
        return a.dump(o.follow ? -1 : 2) + "\n";
      }
      if (jobs.empty()) return "no jobs (submit one with `ringctl run SPEC` or `ringctl submit`)\n";
      return job ? details(jobs[0]) : table(jobs);
    };
    if (!o.follow) {
      std::cout << render(fetch());
      return kExitOk;
    }
    install_stop_signals();
    bool tty = stdout_is_tty() && !o.json;
    std::string last;
    while (true) {
      auto jobs = fetch();
      // Ages change every second: compare what changed apart from them.
      std::string key = o.json ? render(jobs) : [&] {
        std::string k;
        for (const auto& j : jobs) k += job_json(j).dump();
        return k;
      }();
      if (tty) {
        std::cout << "\033[H\033[2J" << format_time(now_unix()) << "  (every " << o.interval
                  << " s; Ctrl-C to stop)\n\n"
                  << render(jobs) << std::flush;
      } else if (key != last) {
        std::cout << render(jobs) << (o.json ? "" : "\n") << std::flush;
      }
      last = key;
      if (job && final_state(jobs[0].state)) break;
      if (!sleep_unless_stopped(o.interval)) break;
    }
    return kExitOk;
  });
}

}  // namespace

Subcommand add_status(CLI::App& app) {
  auto o = std::make_shared<StatusOpts>();
  auto* s = app.add_subcommand("status", "Jobs, their state and progress (like squeue)");
  s->add_option("job", o->job, "Only this job, with details");
  s->add_flag("--json", o->json, "Machine-readable output (the coordinator's job objects)");
  s->add_flag("-f,--follow", o->follow,
              "Refresh until Ctrl-C (with JOB: until the job ends); not on a terminal, print "
              "only changes");
  s->add_option("--interval", o->interval, "Seconds between refreshes with --follow")
      ->check(seconds_in(0.1, 3600.0))
      ->capture_default_str();
  o->coord.add_to(s);
  return {s, [o] { return run_status(*o); }};
}

}  // namespace ring::cli
