// The local launcher, ring-worker --launch-local (ring_programs.h, ring_main.h).

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log/log.h"
#include "common/proc/rank_group.h"
#include "common/proc/reap.h"
#include "worker/ring/rank_setup.h"
#include "worker/ring/ring_programs.h"

namespace ring::cp {
namespace {

using Args = worker::Flags;
using proc::describe_status;

}  // namespace

int launch_local(int argc, char** argv, const Args& args) {
  std::optional<spec::JobSpec> loaded = load(args);
  if (!loaded) return kExitUsage;
  // C x D ranks: rank g is position g % C of replica g / C (ring_rank.h).
  const int world =
      static_cast<int>(loaded->parallel.context_ranks * loaded->parallel.data_replicas);

  std::string tmpl = std::filesystem::temp_directory_path().string() + "/ring-rdv-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    logger()->error("mkdtemp {}: {}", tmpl, std::strerror(errno));
    return kExitRuntime;
  }
  const std::string dir = tmpl;

  // The ranks' command line: ours without --launch-local, plus the rank's identity. They run
  // this very binary (its path now, not argv[0], which may be a bare name).
  std::error_code exe_ec;
  const std::string self_exe = std::filesystem::read_symlink("/proc/self/exe", exe_ec).string();
  std::vector<proc::SpawnOptions> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::vector<std::string>& a = ranks[static_cast<size_t>(r)].argv;
    a.push_back(exe_ec ? std::string("/proc/self/exe") : self_exe);
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], "--launch-local") != 0) a.push_back(argv[i]);
    a.insert(a.end(), {"--rank", std::to_string(r), "--world", std::to_string(world),
                       "--rendezvous", dir});
  }
  proc::GroupRun how;
  how.on_started = [&](const std::vector<pid_t>& pids) {
    log::event(*logger(), spdlog::level::info,
               fmt::format("launched {} ranks (pids {}), rendezvous {}", world,
                           fmt::join(pids, " "), dir),
               {{"event", "ranks_launched"}, {"pids", pids}, {"rendezvous", dir}});
  };
  how.on_signal = [](int sig, int running) {
    logger()->warn("{}: stopping the {} ranks", strsignal(sig), running);
  };
  how.on_failure = [](const proc::RankEnd& e, int running) {
    const int status = WIFEXITED(e.status) ? WEXITSTATUS(e.status) : 128 + WTERMSIG(e.status);
    log::event(*logger(), spdlog::level::err,
               fmt::format("rank {} (pid {}) {}; stopping the other {} ranks", e.rank, e.pid,
                           describe_status(e.status), running),
               {{"event", "rank_failed"}, {"rank", e.rank}, {"pid", e.pid}, {"status", status}});
  };
  how.on_kill = [](int running) { logger()->warn("{} ranks still running: SIGKILL", running); };
  const proc::GroupResult res = proc::run_group(ranks, how);
  if (!res.start_error.empty()) logger()->error("{}", res.start_error);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return res.start_error.empty() ? res.exit_code : kExitRuntime;
}

}  // namespace ring::cp
