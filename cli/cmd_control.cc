// ringctl cancel JOB... / restart JOB [--from STEP] / checkpoint JOB: steer jobs through ring-coord. Only
// the job's owner (or root, or an admin uid of the coordinator) may; the coordinator checks the
// caller's uid from the connection. cancel stops the job's workers on every node (the job goes
// cancelling, then cancelled); restart ends the current attempt and starts the next from the
// latest complete checkpoint, or from --from STEP. --wait waits until the job has left the
// transitional state. cancel takes several jobs: each is reported on its own line, and the exit
// code is that of the first one that could not be cancelled (0 when all were).
#include <algorithm>
#include <iostream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/slurm_control.h"

namespace ring::cli {

namespace {

struct ControlOpts {
  CoordFlags coord;
  std::string job;
  std::vector<std::string> jobs;  // cancel
  std::optional<int64_t> from_step;
  bool json = false;
  bool wait = false;
  double wait_timeout = 60;
};

int finish(coord::Client& c, const ControlOpts& o, const protocol::OkReply& r,
           const std::string& transitional) {
  std::string state = r.state;
  if (o.wait && state == transitional) {
    install_stop_signals();
    auto end = now_unix() + o.wait_timeout;
    while (state == transitional && now_unix() < end && sleep_unless_stopped(0.2))
      state = c.status(r.job).state;
  }
  if (o.json) {
    std::cout << nlohmann::json{{"job", r.job}, {"state", state}, {"message", r.message}}.dump()
              << "\n";
  } else {
    std::cout << "job " << r.job << ": " << state_color(state)
              << (r.message.empty() ? "" : " (" + printable(r.message) + ")") << "\n";
  }
  if (o.wait && state == transitional) {
    std::cerr << "ringctl: job " << r.job << " is still " << state << " after " << o.wait_timeout
              << " s; `ringctl events " << r.job << "` shows what it waits for\n";
    return kExitFailed;
  }
  return kExitOk;
}

int cancel_one(coord::Client& c, const ControlOpts& o, int64_t job) {
  auto r = c.cancel(job);
  // A job submitted to Slurm (`ringctl submit`): end its Slurm job too (cli/slurm_control.h).
  try {
    if (auto note = slurm_cancel(c.status(job)); !note.empty()) r.message += "; " + note;
  } catch (const slurm::SlurmError& e) {
    std::cerr << "ringctl: job " << job << " is cancelled in ring-coord, but " << e.what() << "\n";
    return kExitFailed;
  }
  return finish(c, o, r, "cancelling");
}

int run_cancel(const ControlOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  // Every id is checked before any job is cancelled; a repeated one counts once.
  std::vector<int64_t> ids;
  int rc = guarded(ep, [&] {
    for (const auto& text : o.jobs)
      if (int64_t id = parse_job_id(text); std::find(ids.begin(), ids.end(), id) == ids.end())
        ids.push_back(id);
    return kExitOk;
  });
  if (rc != kExitOk) return rc;
  int first_failure = kExitOk;
  for (int64_t id : ids) {
    int one = guarded(ep, [&] {
      coord::Client c(o.coord.client_options());
      return cancel_one(c, o, id);
    });
    if (one != kExitOk && first_failure == kExitOk) first_failure = one;
    // No coordinator: the others would fail the same way.
    if (one == kExitNoCoord) break;
  }
  if (first_failure != kExitOk && ids.size() > 1)
    std::cerr << "ringctl: not every job was cancelled (exit " << first_failure
              << ": the first failure's code)\n";
  return first_failure;
}

int run_restart(const ControlOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    int64_t job = parse_job_id(o.job);
    coord::Client c(o.coord.client_options());
    // A job submitted to Slurm: Slurm requeues it; the batch script reports the new start and
    // ring-coord begins the next attempt from the latest checkpoint (cli/slurm_control.h).
    auto info = c.status(job);
    if (!info.slurm_job_id.empty()) {
      if (o.from_step)
        throw CLI::ValidationError("--from", "job " + std::to_string(job) + " runs on Slurm (job " +
                                                 info.slurm_job_id +
                                                 "): a requeue resumes from the latest complete "
                                                 "checkpoint; --from is for jobs without Slurm");
      // ring-coord first: it ends the attempt before Slurm's SIGTERM reaches the nodes, so a
      // worker that dies on a peer stopped a moment earlier is not taken for a failure.
      auto r = c.requeue(job);
      try {
        r.message = slurm_requeue(info);
      } catch (const slurm::SlurmError& e) {
        // Slurm would not requeue it: restart in the allocation it has (ring-coord rolls the
        // running daemons back to the latest checkpoint), and say so.
        std::cerr << "ringctl: " << e.what() << "; restarting it in its allocation instead\n";
        r = c.restart(job);
      }
      return finish(c, o, r, "restarting");
    }
    return finish(c, o, c.restart(job, o.from_step), "restarting");
  });
}

void common_flags(CLI::App* s, ControlOpts& o) {
  s->add_flag("--json", o.json, "Machine-readable output");
  s->add_flag("--wait", o.wait, "Wait until the job has left the transitional state");
  s->add_option("--wait-timeout", o.wait_timeout, "Seconds --wait waits at most")
      ->check(flags::seconds_in(0.1, 86400.0))
      ->capture_default_str();
  o.coord.add_to(s);
}

// ringctl checkpoint JOB: every node of a running job writes a checkpoint at its next step
// boundary (ring-coord's checkpoint_now), beside the periodic ones; `ringctl checkpoints JOB`
// then lists it.
int run_checkpoint(const ControlOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    coord::Client c(o.coord.client_options());
    return finish(c, o, c.checkpoint(parse_job_id(o.job)), "");
  });
}

}  // namespace

Subcommand add_checkpoint(CLI::App& app) {
  auto o = std::make_shared<ControlOpts>();
  auto* s = app.add_subcommand(
      "checkpoint", "Checkpoint a running job now, at every node's next step boundary");
  s->add_option("job", o->job, "Job id")->required();
  s->add_flag("--json", o->json, "Machine-readable output");
  o->coord.add_to(s);
  return {s, [o] { return run_checkpoint(*o); }};
}

Subcommand add_cancel(CLI::App& app) {
  auto o = std::make_shared<ControlOpts>();
  auto* s = app.add_subcommand("cancel", "Cancel jobs: stop their workers on every node");
  s->add_option("jobs", o->jobs, "Job ids")->required();
  common_flags(s, *o);
  return {s, [o] { return run_cancel(*o); }};
}

Subcommand add_restart(CLI::App& app) {
  auto o = std::make_shared<ControlOpts>();
  auto* s = app.add_subcommand(
      "restart", "Restart a job from its latest complete checkpoint (or --from STEP)");
  s->add_option("job", o->job, "Job id")->required();
  common_flags(s, *o);
  s->add_option("--from", o->from_step, "Resume from this checkpoint step instead")
      ->check(flags::integer_in(0, int64_t{1} << 40));
  return {s, [o] { return run_restart(*o); }};
}

}  // namespace ring::cli
