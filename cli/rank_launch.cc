#include "cli/rank_launch.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "cli/exit_codes.h"
#include "common/proc/reap.h"
#include "common/proc/rank_group.h"

namespace ring::cli {

namespace fs = std::filesystem;

void add_rank_placement_flags(CLI::App* sc, const std::string& what, const RankPlacementFlags& f) {
  sc->add_option("--rank", *f.rank, "This process is rank R of --world (set by --ranks)")
      ->check(CLI::Range(0, 1 << 20));
  sc->add_option("--world", *f.world, "Ranks of " + what + " (set by --ranks)")
      ->check(CLI::Range(1, 1 << 20));
  sc->add_option("--rendezvous", *f.rendezvous,
                 "A directory every rank reaches, unique to the run (with --rank, or under srun)");
  sc->add_option("--transport", *f.transport, "The ranks' transport plugin (default ucx)");
  sc->add_option("--timeout", *f.timeout_s,
                 "Seconds a rank waits for the others at start and in each exchange (default 600)")
      ->check(CLI::Range(1, 86400));
}

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20)
    throw gen::UsageError(fmt::format("environment {}='{}': expected a count", name, v));
  return static_cast<int>(x);
}

gen::Identity rank_identity(const RankFlags& o) {
  gen::Identity id;
  if (o.rank >= 0 || o.world > 0) {
    if (o.rank < 0 || o.world < 1 || o.rank >= o.world)
      throw gen::UsageError(fmt::format(
          "--rank {} --world {}: a rank needs both, with 0 <= --rank < --world", o.rank, o.world));
    if (o.rendezvous.empty()) throw gen::UsageError("--rank/--world need --rendezvous DIR");
    id = {o.rank, o.world, o.rendezvous};
  } else if (const int tasks = env_int("SLURM_STEP_NUM_TASKS", 1); tasks > 1) {
    // Under srun: every task of the step is one rank.
    if (o.ranks > 1)
      throw gen::UsageError(
          fmt::format("--ranks {} under srun with {} tasks: srun starts the ranks (drop --ranks)",
                      o.ranks, tasks));
    if (o.rendezvous.empty())
      throw gen::UsageError(fmt::format(
          "under srun with {} tasks, --rendezvous DIR (a directory every task can reach, unique "
          "to this run) is required",
          tasks));
    const int procid = env_int("SLURM_PROCID", -1);
    if (procid < 0 || procid >= tasks)
      throw gen::UsageError(
          fmt::format("under srun with {} tasks: SLURM_PROCID is missing or out of "
                      "range",
                      tasks));
    id = {procid, tasks, o.rendezvous};
  }
  return id;
}

int launch_local_ranks(const std::string& command, const std::string& tag, int ranks,
                       const RankArgv& argv_of) {
  std::string tmpl = fs::temp_directory_path().string() + "/ring-" + tag + "-rdv-XXXXXX";
  if (!::mkdtemp(tmpl.data()))
    throw gen::InputError(fmt::format("mkdtemp {}: {}", tmpl, std::strerror(errno)));
  const std::string dir = tmpl;
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  std::vector<proc::SpawnOptions> procs(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    procs[static_cast<size_t>(r)].argv = argv_of(ec ? std::string("/proc/self/exe") : self, r, dir);
  proc::GroupRun how;
  how.signal_grace = std::chrono::seconds(5);
  how.on_failure = [command](const proc::RankEnd& e, int running) {
    std::cerr << fmt::format(
        "ringctl {}: rank {} {}{}\n", command, e.rank, proc::describe_status(e.status),
        running > 0 ? fmt::format("; stopping the other {}", running) : std::string());
  };
  const proc::GroupResult res = proc::run_group(procs, how);
  if (!res.start_error.empty()) std::cerr << "ringctl " << command << ": " << res.start_error << "\n";
  fs::remove_all(dir, ec);
  if (!res.start_error.empty()) return kExitFailed;
  // A rank killed by a signal is a failure of the command (1), not the shell's 128 + N.
  if (res.failure && !WIFEXITED(res.failure->status)) return kExitFailed;
  return res.exit_code;
}

}  // namespace ring::cli
