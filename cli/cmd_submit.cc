// ringctl submit SPEC [--dry-run] [--job-dir DIR]: run a job on Slurm. The spec is validated,
// submitted to ring-coord (the system of record), copied into the job directory with the sbatch
// script rendered from it (common/slurm/sbatch_script), and handed to sbatch; the Slurm job id is
// recorded with the job and both ids are printed. --dry-run prints the script and submits nothing.
//
// ringctl slurm-started JOB --slurm-job ID --restarts N --nodes LIST: what the batch script runs
// first on every start; ring-coord records the start and, after a requeue (node failure,
// preemption, `ringctl restart`), begins the next attempt from the latest complete checkpoint.
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "common/cli/job_dir.h"
#include "common/files/atomic_write.h"
#include "common/install/locate.h"
#include "common/slurm/sbatch_script.h"
#include "common/slurm/slurm_cli.h"
#include "common/spec/parse.h"

namespace fs = std::filesystem;

namespace ring::cli {

namespace {

struct SubmitOpts {
  CoordFlags coord;
  std::string spec;
  std::string job_dir;
  std::string name;
  std::string ringd;
  std::string spank = "auto";
  std::string ringd_coord = "on";
  bool dry_run = false;
  bool json = false;
  bool local_job_dir_ok = false;
  SetFlags set;
};

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

bool executable(const fs::path& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

// --ringd, $RING_RINGD_BIN, next to ringctl, the install bindir, the build tree, then PATH
// (common/install/locate.h). Returns "" when none is found.
std::string find_ringd(const std::string& given) {
  if (!given.empty()) return fs::absolute(given).lexically_normal().string();
  return install::find_program("ringd", {"RING_RINGD_BIN", "RINGD", "RING_RINGD"}, "daemon/ringd",
                               nullptr);
}

int run_submit(const SubmitOpts& o) {
  auto load = spec::job_spec_options();
  load.overrides = o.set.overrides();
  auto r = spec::load_spec_file(o.spec, load);
  for (const auto& d : r.diagnostics) std::cerr << d.str() << "\n";
  if (!r.ok()) {
    std::cerr << o.spec << ": " << r.error_count()
              << " error(s); fix them (`ringctl validate " << o.spec << "`) before submitting\n";
    return kExitFailed;
  }
  // A generate job's relative inputs, from here (the batch job runs in the job directory).
  if (absolute_generate_paths(*r.spec, &load.overrides)) r = spec::load_spec_file(o.spec, load);
  if (!r.ok()) return kExitFailed;
  const auto& spec = *r.spec;
  std::string name = o.name.empty() ? spec.job.name : o.name;
  if (const std::string why = generate_inputs_problem(spec); !why.empty()) {
    std::cerr << o.spec << ": " << why << "\n";
    return kExitFailed;
  }
  const std::string& text = r.text;  // what was validated, not a second read of the file

  // The job directory: every node reads the spec copy and writes its logs and rendezvous there.
  // The default (/tmp/ringmaster-<uid>/jobs/NAME, common/cli/job_dir.h) is on this node only:
  // a multi-node job names a directory on a shared file system, and a node-local one is refused
  // (unless this "cluster" is one machine: --local-job-dir-ok).
  if (spec.resources.nodes > 1) {
    if (o.job_dir.empty()) {
      std::cerr << "ringctl: resources.nodes is " << spec.resources.nodes
                << ": give --job-dir DIR on a file system every node mounts (the default, "
                << jobdir::user_root(::geteuid())
                << "/jobs/<name>, is on this node only: the other nodes would not find the spec "
                   "or the rendezvous)\n";
      return kExitUsage;
    }
    if (std::string why = jobdir::node_local_reason(o.job_dir);
        !why.empty() && !o.local_job_dir_ok) {
      std::cerr << "ringctl: --job-dir " << o.job_dir << " is " << why
                << ", which each node has for itself: the " << spec.resources.nodes
                << " nodes of this job would not see the spec or the rendezvous; choose a "
                   "directory on a shared file system (--local-job-dir-ok if every node of "
                   "this cluster is this machine)\n";
      return kExitUsage;
    }
  }
  std::string jd;
  try {
    if (o.dry_run) {  // creates nothing
      jd = o.job_dir.empty() ? jobdir::default_job_dir(name, ::geteuid())
                             : fs::absolute(o.job_dir).lexically_normal().string();
      while (jd.size() > 1 && jd.back() == '/') jd.pop_back();
    } else {  // before ring-coord records anything
      jd = choose_job_dir(o.job_dir, name, std::cerr);
    }
  } catch (const jobdir::JobDirError& e) {
    std::cerr << "ringctl: " << e.what() << "\n";
    return kExitFailed;
  }
  fs::path job_dir = jd;

  slurm::ScriptInputs in;
  in.job_dir = jd;
  in.ringd = find_ringd(o.ringd);
  if (in.ringd.empty()) {
    if (!o.dry_run) {
      std::cerr << "ringctl: ringd not found (next to ringctl, in the build tree or in PATH); give "
                   "--ringd PATH or set RING_RINGD_BIN\n";
      return kExitUsage;
    }
    in.ringd = (fs::path(self_exe()).parent_path() / "ringd").string();
    std::cerr << "ringctl: warning: ringd not found; the script names " << in.ringd << "\n";
  } else if (!o.ringd.empty() && !executable(in.ringd) && !o.dry_run) {
    std::cerr << "ringctl: --ringd " << o.ringd << ": not an executable file\n";
    return kExitUsage;
  }
  in.ringctl = self_exe();
  in.ringd_reports = o.ringd_coord == "on";
  in.coord_endpoint = o.coord.resolved_endpoint();
  if (o.spank == "on") in.spank = true;
  else if (o.spank == "auto") in.spank = slurm::spank_plugin_active();

  if (o.dry_run) {
    // A real submit copies the spec to <job-dir>/spec-<ring-coord job id>.yaml; with no id yet,
    // the script names <job-dir>/spec.yaml (copy the spec there to sbatch it by hand).
    in.spec_path = jd + "/spec.yaml";
    try {
      std::cout << slurm::render_sbatch_script(spec, in);
    } catch (const slurm::ScriptError& e) {
      std::cerr << "ringctl: cannot render the sbatch script: " << e.what() << "\n";
      return kExitUsage;
    }
    return kExitOk;
  }

  std::string ep = in.coord_endpoint;
  return guarded(ep, [&]() -> int {
    coord::Client c(o.coord.client_options());
    // Render once before submitting, so a bad path fails before ring-coord records anything.
    in.coord_job = 1;
    in.spec_path = jd + "/spec.yaml";
    try {
      slurm::render_sbatch_script(spec, in);
    } catch (const slurm::ScriptError& e) {
      std::cerr << "ringctl: cannot render the sbatch script: " << e.what() << "\n";
      return kExitUsage;
    }
    auto sub = c.submit(text, o.name, jd);
    in.coord_job = sub.job;
    auto fail = [&](const std::string& why) {
      std::cerr << "ringctl: " << why << "\n";
      protocol::SlurmJobRequest f;
      f.job = sub.job;
      f.event = "submit_failed";
      f.message = why.substr(0, 4000);
      try {
        c.slurm_job(f);
        std::cerr << "  ring-coord job " << sub.job << " is marked failed\n";
      } catch (const std::exception& e) {
        std::cerr << "  and ring-coord could not be told: " << e.what() << "\n";
      }
      return kExitFailed;
    };
    fs::path script;
    try {
      in.spec_path = jd + "/spec-" + std::to_string(sub.job) + ".yaml";
      write_file_as(in.spec_path, text, 0600);
      script = job_dir / ("job-" + std::to_string(sub.job) + ".sbatch");
      write_file_as(script, slurm::render_sbatch_script(spec, in), 0700);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    std::string sid;
    try {
      sid = slurm::sbatch(script.string(), {"--chdir=" + jd});
    } catch (const slurm::SlurmError& e) {
      return fail(e.what());
    }
    protocol::SlurmJobRequest s;
    s.job = sub.job;
    s.event = "submitted";
    s.slurm_job_id = sid;
    c.slurm_job(s);
    if (o.json) {
      std::cout << nlohmann::json{{"job", sub.job},
                                  {"name", sub.name},
                                  {"slurm_job_id", sid},
                                  {"job_dir", jd},
                                  {"script", script.string()},
                                  {"output", jd + "/slurm-" + sid + ".out"},
                                  {"overrides", o.set.args}}
                       .dump()
                << "\n";
    } else {
      std::cout << "job " << sub.job << " (" << sub.name << ") submitted to Slurm as job " << sid
                << "\n  script " << script.string() << "\n  output " << jd << "/slurm-" << sid
                << ".out\n  follow with `ringctl status " << sub.job << "`\n";
    }
    return kExitOk;
  });
}

struct StartedOpts {
  CoordFlags coord;
  std::string job;
  std::string slurm_job;
  int64_t restarts = 0;
  std::string nodes;
};

int run_started(const StartedOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    int64_t job = parse_job_id(o.job);
    if (!slurm::valid_job_id(o.slurm_job))
      throw CLI::ValidationError("--slurm-job", "'" + o.slurm_job + "' is not a Slurm job id");
    coord::Client c(o.coord.client_options());
    protocol::SlurmJobRequest s;
    s.job = job;
    s.event = "started";
    s.slurm_job_id = o.slurm_job;
    s.restarts = o.restarts;
    s.nodes = o.nodes;
    // A requeue: which nodes Slurm holds unfit now (a node failure requeued the job with the
    // failed node down), so ring-coord can exclude the failed one from later allocations.
    if (o.restarts > 0) {
      try {
        s.unhealthy_nodes = slurm::unhealthy_nodes();
      } catch (const slurm::SlurmError& e) {
        std::cerr << "ringmaster: " << e.what() << "; no failed node is excluded this time\n";
      }
    }
    auto r = c.slurm_job(s);
    std::cout << "ringmaster: ring-coord job " << job << " is " << r.state << " (" << r.message
              << ")\n";
    return r.requeue_without.empty() ? kExitOk : kExitRequeue;
  });
}

}  // namespace

Subcommand add_submit(CLI::App& app) {
  auto o = std::make_shared<SubmitOpts>();
  auto* sc = app.add_subcommand(
      "submit", "Submit a job spec to Slurm: ring-coord records it, sbatch runs one ringd per node");
  // A missing spec is bad input (exit 1, named by the spec loader), not a usage error.
  sc->add_option("spec", o->spec, "Spec file (YAML)")->required();
  sc->add_flag("--dry-run", o->dry_run, "Print the sbatch script; submit nothing");
  sc->add_option("--job-dir", o->job_dir,
                 "Job directory on a file system every node sees, yours and not writable by "
                 "others; required when resources.nodes > 1 (default, one node only: "
                 "/tmp/ringmaster-<uid>/jobs/<name>)");
  sc->add_flag("--local-job-dir-ok", o->local_job_dir_ok,
               "Accept a node-local --job-dir (/tmp, /dev/shm, ...) for a multi-node job: every "
               "node of this cluster is this machine");
  sc->add_option("--name", o->name, "Job name (default: job.name of the spec)")
      ->check(job_name_rule());
  sc->add_option("--ringd", o->ringd,
                 "ringd on the compute nodes (default: $RING_RINGD_BIN, next to ringctl, the "
                 "install, the build tree, PATH)");
  sc->add_option("--spank", o->spank,
                 "Pass --ring-job/--ring-coord to srun: on, off, or auto (when srun --help "
                 "shows them)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sc->add_option("--ringd-coord", o->ringd_coord,
                 "on: ringd reports to ring-coord (--coord/--job); off: ringd runs without it "
                 "(nodes that cannot reach the endpoint); Slurm starts are recorded either way")
      ->check(CLI::IsMember({"on", "off"}));
  sc->add_flag("--json", o->json, "Machine-readable output");
  o->set.add_to(sc);
  o->coord.add_to(sc);
  return {sc, [o] { return run_submit(*o); }};
}

Subcommand add_slurm_started(CLI::App& app) {
  auto o = std::make_shared<StartedOpts>();
  auto* sc = app.add_subcommand(
      "slurm-started",
      "Used by the batch script of `ringctl submit`: record a Slurm start (or requeue) of a job");
  sc->add_option("job", o->job, "ring-coord job id")->required();
  sc->add_option("--slurm-job", o->slurm_job, "Slurm job id ($SLURM_JOB_ID)")->required();
  sc->add_option("--restarts", o->restarts, "$SLURM_RESTART_COUNT")->check(flags::integer_in(0, 1000000));
  sc->add_option("--nodes", o->nodes, "$SLURM_JOB_NODELIST");
  o->coord.add_to(sc);
  return {sc, [o] { return run_started(*o); }};
}

}  // namespace ring::cli
