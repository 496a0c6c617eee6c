#include "daemon/ringd/startup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "common/contract/layout.h"
#include "common/contract/model_config.h"
#include "common/spec/parse.h"
#include "common/install/locate.h"

namespace ring::ringd {

namespace fs = std::filesystem;

std::optional<StartupFailure> check_spec(const spec::JobSpec& s, const Options& o) {
  const auto usage = [&](std::string what) {
    return StartupFailure{kExitUsage, o.spec + ": " + std::move(what)};
  };
  const int64_t world = s.resources.workers_per_node * o.nodes;
  // One worker per rank: D data replicas of context_ranks ranks each (ring-worker forms the rings).
  if (s.parallel.context_ranks * s.parallel.data_replicas != world)
    return usage(
        fmt::format("parallel.context_ranks {} x data_replicas {} = {} ranks but {} node(s) x "
                    "resources.workers_per_node {} = {} workers",
                    s.parallel.context_ranks, s.parallel.data_replicas,
                    s.parallel.context_ranks * s.parallel.data_replicas, o.nodes,
                    s.resources.workers_per_node, world));
  if (s.resources.nodes != o.nodes)
    return usage(fmt::format(
        "resources.nodes = {} but {} ringd node(s) were started (--nodes / SLURM_NNODES)",
        s.resources.nodes, o.nodes));
  // A generate job has no optimizer: the rest is about training.
  if (s.job.kind == spec::JobKind::kGenerate) return std::nullopt;
  // Data this node does not have: every attempt's workers would fail on it, restart after
  // restart. Said now, once (exit 1, no restart).
  if (const auto missing = spec::missing_data_paths(s); !missing.empty())
    return StartupFailure{kExitFailed, o.spec + ": " + missing.front() + " on this node"};
  if (s.optimizer.offload != spec::Offload::kCpu)
    return usage(
        "optimizer.offload = none: the in-worker optimizer is ring-worker --launch-local; ringd "
        "runs optimizer.offload: cpu");
  if (s.optimizer.update == spec::UpdateMode::kLazy) {
    // The lazy-update index in shared memory (common/contract/shm.h) holds 32-bit coordinates:
    // a larger model would update the wrong coordinates silently.
    const int64_t n = contract::ParamLayout(contract::ModelConfig::from_spec(s)).total();
    if (n > (int64_t{1} << 32))
      return usage(fmt::format(
          "optimizer.update = lazy with {} parameters: the lazy-update index holds 32-bit "
          "coordinates (at most {} parameters); use optimizer.update: dense",
          n, int64_t{1} << 32));
  }
  return std::nullopt;
}

std::string find_worker_bin(const std::string& given) {
  if (!given.empty()) return given;
  // Next to ringd, the install bindir, the build tree when ringd runs from it, PATH; when none
  // is executable the caller's message shows every place tried.
  std::vector<std::string> tried;
  std::string found = install::find_program("ring-worker", {"RING_WORKER_BIN"}, "worker", &tried);
  if (!found.empty()) return found;
  std::string all;
  for (const auto& t : tried) all += (all.empty() ? "" : ", ") + t;
  return all;
}

std::optional<StartupFailure> prepare_job_dir(std::string* dir) {
  std::error_code ec;
  // What ringd creates is private: the job directory (when missing) and logs/ are 0700.
  if (!fs::exists(fs::symlink_status(*dir, ec))) {
    fs::create_directories(*dir, ec);
    if (!ec && ::chmod(dir->c_str(), 0700) != 0) ec.assign(errno, std::generic_category());
  }
  if (!ec && ::mkdir((*dir + "/logs").c_str(), 0700) != 0 && errno != EEXIST)
    ec.assign(errno, std::generic_category());
  if (ec) return StartupFailure{kExitUsage, "--job-dir " + *dir + ": " + ec.message()};
  struct stat st;
  if (::lstat((*dir + "/logs").c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return StartupFailure{kExitFailed,
                          "--job-dir " + *dir +
                              ": logs is not a directory (a symbolic link?); refusing to write "
                              "there"};
  *dir = fs::absolute(*dir).string();
  return std::nullopt;
}

std::string rendezvous_root(const Options& o, const std::string& job_dir,
                            const char* (*env)(const char*)) {
  if (!env) env = [](const char* name) -> const char* { return std::getenv(name); };
  std::string root = o.rendezvous.empty() ? job_dir + "/rendezvous" : o.rendezvous;
  if (const char* id = env("SLURM_JOB_ID"); id && *id && o.rendezvous.empty()) {
    const char* rc = env("SLURM_RESTART_COUNT");
    root += fmt::format("/slurm-{}.{}", id, rc && *rc ? rc : "0");
  }
  return root;
}

std::optional<StartupFailure> prepare_checkpoint_dir(const std::string& spec_dir,
                                                     const std::string& job_dir,
                                                     std::string* dir) {
  // checkpoint.dir (common/spec/keys.cc): empty means no checkpoints; a relative path is taken
  // from the job directory. With a directory, stop and on-demand checkpoints are written even
  // when checkpoint.every_steps is 0 (no periodic ones then).
  *dir = spec_dir;
  if (!dir->empty() && (*dir)[0] != '/') *dir = (fs::path(job_dir) / *dir).lexically_normal().string();
  if (dir->empty()) return std::nullopt;
  // A checkpoint directory that cannot be written is said now, not at the first checkpoint
  // (which could be the stop checkpoint of a preemption). Created 0700: it holds the weights.
  std::error_code cec;
  if (!fs::exists(*dir, cec)) {
    fs::create_directories(*dir, cec);
    if (!cec) ::chmod(dir->c_str(), 0700);
  }
  if (cec || !fs::is_directory(*dir, cec) || ::access(dir->c_str(), W_OK | X_OK) != 0)
    return StartupFailure{
        kExitFailed, "checkpoint.dir " + *dir + ": " +
                         (cec ? cec.message()
                              : fs::is_directory(*dir) ? std::string(std::strerror(errno))
                                                       : std::string("not a directory"))};
  return std::nullopt;
}

}  // namespace ring::ringd
