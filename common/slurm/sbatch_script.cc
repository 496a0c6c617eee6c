#include "common/slurm/sbatch_script.h"

#include <fmt/format.h>

#include <algorithm>

namespace ring::slurm {

namespace {

bool bare_char(unsigned char c) {
  return std::isalnum(c) || std::string_view("_@%+=:,./-").find(static_cast<char>(c)) !=
                                std::string_view::npos;
}

bool has_control(std::string_view s) {
  return std::any_of(s.begin(), s.end(),
                     [](unsigned char c) { return c < 0x20 || c == 0x7f; });
}

// An absolute path that can sit in the script and in #SBATCH lines.
void check_path(std::string_view p, std::string_view what) {
  if (p.empty()) throw ScriptError(fmt::format("{}: empty path", what));
  if (p[0] != '/')
    throw ScriptError(fmt::format("{}: '{}' is not an absolute path (every node must find it at "
                                  "the same place)",
                                  what, p));
  if (has_control(p))
    throw ScriptError(fmt::format("{}: the path contains a line break or control character", what));
}

}  // namespace

std::string shell_quote(std::string_view s) {
  if (!s.empty() && std::all_of(s.begin(), s.end(),
                                [](unsigned char c) { return bare_char(c); }))
    return std::string(s);
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  q += '\'';
  return q;
}

std::string directive_value(std::string_view s, std::string_view what) {
  if (has_control(s))
    throw ScriptError(fmt::format("{}: contains a line break or control character", what));
  if (s.find('"') != std::string_view::npos)
    throw ScriptError(fmt::format("{}: contains a double quote, which an #SBATCH line cannot carry",
                                  what));
  if (s.find_first_of(" \t") == std::string_view::npos) return std::string(s);
  // (appended, not "\"" + std::string(s): GCC 12 warns falsely (-Wrestrict) on that form)
  std::string q;
  q.reserve(s.size() + 2);
  q.append(1, '"').append(s).append(1, '"');
  return q;
}

std::string render_sbatch_script(const spec::JobSpec& spec, const ScriptInputs& in) {
  check_path(in.spec_path, "spec path");
  check_path(in.job_dir, "job dir");
  check_path(in.ringd, "ringd");
  if (!in.ringctl.empty()) check_path(in.ringctl, "ringctl");
  if (in.job_dir.find('%') != std::string::npos)
    throw ScriptError(fmt::format("job dir: '{}' contains '%', which sbatch expands in output "
                                  "file names; choose a directory without it",
                                  in.job_dir));
  if (in.job_dir.find('"') != std::string::npos)
    throw ScriptError("job dir: contains a double quote, which an #SBATCH line cannot carry");
  if (in.coord_job < 0)
    throw ScriptError(fmt::format("coordinator job id must be positive, got {}", in.coord_job));
  if (has_control(in.coord_endpoint))
    throw ScriptError("coordinator endpoint: contains a line break or control character");
  const auto& r = spec.resources;
  const auto& s = spec.slurm;
  if (r.nodes < 1) throw ScriptError(fmt::format("resources.nodes: {} is below 1", r.nodes));

  std::string o;
  auto line = [&](const std::string& l) {
    o += l;
    o += '\n';
  };
  auto directive = [&](std::string_view opt, std::string_view value, std::string_view key) {
    line(fmt::format("#SBATCH {}={}", opt, directive_value(value, key)));
  };

  line("#!/bin/bash");
  line(fmt::format("# ringmaster job '{}'{}, rendered by `ringctl submit` from {}.", spec.job.name,
                   in.coord_job > 0 ? fmt::format(" (ring-coord job {})", in.coord_job) : "",
                   in.spec_path));
  line("# One ringd per node; a requeued start resumes from the latest complete checkpoint.");
  directive("--job-name", spec.job.name, "job.name");
  line(fmt::format("#SBATCH --nodes={}", r.nodes));
  line("#SBATCH --ntasks-per-node=1");
  int64_t cpus = std::max<int64_t>(1, r.workers_per_node * r.cpus_per_worker);
  line(fmt::format("#SBATCH --cpus-per-task={}", cpus));
  if (r.gpus_per_node > 0) line(fmt::format("#SBATCH --gres=gpu:{}", r.gpus_per_node));
  if (!s.partition.empty()) directive("--partition", s.partition, "slurm.partition");
  if (!s.account.empty()) directive("--account", s.account, "slurm.account");
  if (!s.qos.empty()) directive("--qos", s.qos, "slurm.qos");
  if (!s.constraint.empty()) directive("--constraint", s.constraint, "slurm.constraint");
  if (!s.time.empty()) directive("--time", s.time, "slurm.time");
  line(s.requeue ? "#SBATCH --requeue" : "#SBATCH --no-requeue");
  if (s.signal_before_s > 0) line(fmt::format("#SBATCH --signal=B:USR1@{}", s.signal_before_s));
  // Requeued starts append to the same file instead of truncating it.
  line("#SBATCH --open-mode=append");
  directive("--output", in.job_dir + "/slurm-%j.out", "job dir");
  for (const auto& e : s.extra_sbatch) {
    if (e.empty() || e[0] != '-')
      throw ScriptError(fmt::format("slurm.extra_sbatch: item '{}' is not an sbatch option", e));
    if (has_control(e))
      throw ScriptError(fmt::format("slurm.extra_sbatch: item '{}' contains a line break or control "
                                    "character",
                                    e.substr(0, 80)));
    line("#SBATCH " + e);
  }
  line("");
  line("set -u");
  line("export RING_JOB_DIR=" + shell_quote(in.job_dir));
  line("spec=" + shell_quote(in.spec_path));
  line("ringd=" + shell_quote(in.ringd));
  line(std::string("requeue=") + (s.requeue ? "1" : "0"));
  if (!in.coord_endpoint.empty()) {
    line("coord=" + shell_quote(in.coord_endpoint));
    if (in.coord_job > 0)
      line(fmt::format("coord_job={}", in.coord_job));
    else  // ringctl submit --dry-run: the id exists only once ring-coord accepted the job
      line("coord_job=${RING_COORD_JOB:?set RING_COORD_JOB to the ring-coord job id (ringctl "
           "submit does)}");
  }
  line("mkdir -p \"$RING_JOB_DIR/logs\"");
  line("start=$((${SLURM_RESTART_COUNT:-0} + 1))");
  line("echo \"ringmaster: Slurm job $SLURM_JOB_ID, start $start, nodes $SLURM_JOB_NODELIST, "
       "$(date -u +%Y-%m-%dT%H:%M:%SZ)\"");
  if (!in.ringctl.empty() && !in.coord_endpoint.empty()) {
    line("# Record this start (the first, or a requeue after node failure or preemption).");
    line(fmt::format("{} slurm-started \"$coord_job\" --coord \"$coord\" --slurm-job "
                     "\"$SLURM_JOB_ID\" --restarts \"${{SLURM_RESTART_COUNT:-0}}\" --nodes "
                     "\"$SLURM_JOB_NODELIST\"",
                     shell_quote(in.ringctl)));
    line("case $? in");
    line("  0) ;;");
    line("  10)");
    line("    # A node the job excludes (its loss failed an attempt): ring-coord requeues the job");
    line("    # without it (scontrol requeuehold, ExcNodeList, release), which ends this script.");
    line("    echo \"ringmaster: this allocation holds a node the job excludes; waiting for the "
         "requeue without it\"");
    line("    for _ in $(seq 60); do sleep 5; done");
    line("    echo \"ringmaster: no requeue came within 300 s; running on this allocation\" >&2 ;;");
    line("  *) echo \"ringmaster: could not record this start with ring-coord; ringd reports to "
         "it anyway\" >&2 ;;");
    line("esac");
  }
  line("");
  line("# Slurm's time-limit warning (--signal=B:USR1) reaches this shell only: pass it to ringd,");
  line("# which checkpoints and exits 75. SIGTERM (cancel, requeue, preemption) reaches ringd from");
  line("# Slurm directly; the trap only keeps this shell alive to log the outcome.");
  line("srun_pid=");
  line("warned=0");
  line("trap 'warned=1; echo \"ringmaster: time-limit warning: ringd checkpoints and stops\"; "
       "[ -n \"$srun_pid\" ] && kill -USR1 \"$srun_pid\" 2>/dev/null' USR1");
  line("trap 'echo \"ringmaster: SIGTERM: ringd checkpoints and stops\"' TERM");
  std::string srun = fmt::format("srun --nodes={} --ntasks-per-node=1 --cpus-per-task={} "
                                 "--kill-on-bad-exit=1",
                                 r.nodes, cpus);
  if (in.spank && !in.coord_endpoint.empty())
    srun += " --ring-job=\"$coord_job\" --ring-coord=\"$coord\"";
  srun += " \"$ringd\" --spec \"$spec\" --job-dir \"$RING_JOB_DIR\"";
  if (!in.coord_endpoint.empty() && in.ringd_reports)
    srun += " --coord \"$coord\" --job \"$coord_job\"";
  // The first start finds no checkpoint and starts at step 0; a requeued start resumes (with
  // ring-coord, from the step it names; without, from the lineage's newest checkpoint).
  srun += " --resume-if-any &";
  line(srun);
  line("srun_pid=$!");
  line("# wait returns early (> 128) when a trapped signal arrives: wait again until srun ends.");
  line("while :; do");
  line("  wait \"$srun_pid\"; rc=$?");
  line("  if [ \"$rc\" -gt 128 ] && kill -0 \"$srun_pid\" 2>/dev/null; then continue; fi");
  line("  break");
  line("done");
  line("case $rc in");
  line("  0) echo \"ringmaster: ringd finished on every node\" ;;");
  line("  75)");
  line("    echo \"ringmaster: ringd stopped after a checkpoint (exit 75; resumable)\"");
  line("    if [ \"$warned\" = 1 ] && [ \"$requeue\" = 1 ]; then");
  line("      echo \"ringmaster: requeueing before the time limit\"");
  line("      scontrol requeue \"$SLURM_JOB_ID\"");
  line("    fi ;;");
  line("  *) echo \"ringmaster: ringd failed (exit $rc); see $RING_JOB_DIR/logs\" >&2 ;;");
  line("esac");
  line("exit \"$rc\"");
  return o;
}

}  // namespace ring::slurm
