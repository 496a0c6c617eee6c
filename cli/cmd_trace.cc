// ringctl trace JOB [--step N] -o trace.json: the job's recent phase timeline of every rank as a
// Chrome / Perfetto trace (open it in ui.perfetto.dev or chrome://tracing).
//
// Where it comes from: every ringd keeps its workers' timelines node-local (files on /dev/shm
// that it maps; common/contract/timeline.h) and writes the last 32 steps of
// them to <job dir>/timeline/node-<K>.jsonl at most every 5 s, at once on a hang and at the end
// of an attempt. ringctl reads those files from the job directory the coordinator recorded (or
// --job-dir DIR without a coordinator): the job directory is where `ringctl logs` reads too, on a
// shared file system under Slurm, so this works the same locally and on a cluster, after the job
// ended, and for a hung job whose workers cannot answer anything (docs/observability.md).
#include <sys/stat.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/local_state.h"
#include "cli/trace_export.h"

namespace ring::cli {

namespace {

struct TraceOpts {
  CoordFlags coord;
  std::string job;
  std::string job_dir;
  std::optional<int64_t> step;
  std::string out;
};

int write_trace(const std::string& job_dir, const TraceOpts& o) {
  const std::vector<std::string> paths = timeline_files(job_dir);
  if (paths.empty()) {
    std::cerr << "ringctl: no timeline in " << job_dir
              << "/timeline yet (ringd writes it every 5 s while the job runs)\n";
    return kExitFailed;
  }
  std::vector<std::pair<std::string, std::string>> files;
  for (const std::string& p : paths) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) {
      std::cerr << "ringctl: cannot read " << p << "\n";
      return kExitFailed;
    }
    files.emplace_back(p, ss.str());
  }
  nlohmann::json trace;
  try {
    trace = build_trace(files, {o.step});
  } catch (const std::exception& e) {
    std::cerr << "ringctl: " << e.what() << "\n";
    return kExitFailed;
  }
  size_t n = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") ++n;
  if (n == 0) {
    std::cerr << "ringctl: the timeline in " << job_dir << "/timeline has no records"
              << (o.step ? " of step " + std::to_string(*o.step) : std::string()) << "\n";
    return kExitFailed;
  }
  const std::string text = trace.dump() + "\n";
  if (o.out == "-") {
    std::cout << text;
  } else {
    try {
      write_file_as(o.out, text, 0600);
    } catch (const std::exception& e) {
      std::cerr << "ringctl: " << e.what() << "\n";
      return kExitFailed;
    }
    std::cerr << "wrote " << n << " events of " << paths.size() << " node(s) to " << o.out << "\n";
  }
  return kExitOk;
}

int run_trace(const TraceOpts& o) {
  if (!o.job_dir.empty()) return write_trace(o.job_dir, o);
  if (o.job.empty()) {
    std::cerr << "ringctl: trace needs JOB (or --job-dir DIR)\n";
    return kExitUsage;
  }
  const std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    const int64_t job = parse_job_id(o.job);
    coord::Client c(with_local_state(o.coord.client_options()));
    const auto st = c.status(job);
    if (st.job_dir.empty()) {
      std::cerr << "ringctl: job " << job << " has no job directory recorded; give --job-dir\n";
      return kExitFailed;
    }
    struct stat sb {};
    if (::stat(st.job_dir.c_str(), &sb) != 0) {
      std::cerr << "ringctl: job " << job << "'s directory " << st.job_dir
                << " does not exist on this host (run ringctl trace on a node that mounts it)\n";
      return kExitFailed;
    }
    return write_trace(st.job_dir, o);
  });
}

}  // namespace

Subcommand add_trace(CLI::App& app) {
  auto o = std::make_shared<TraceOpts>();
  auto* s = app.add_subcommand(
      "trace", "A job's recent per-rank phase timeline as a Chrome/Perfetto trace (JSON)");
  s->add_option("job", o->job, "Job id");
  s->add_option("--job-dir", o->job_dir,
                "Read <DIR>/timeline directly (a ringd run without a coordinator)")
      ->type_name("DIR");
  s->add_option("--step", o->step, "Only this step")->check(flags::integer_in(1, int64_t{1} << 53));
  s->add_option("-o,--output", o->out, "The trace file to write (- for stdout)")->required();
  o->coord.add_to(s);
  return {s, [o] { return run_trace(*o); }};
}

}  // namespace ring::cli
