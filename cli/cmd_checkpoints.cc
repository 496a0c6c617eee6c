#include "cli/cmd_checkpoints.h"

#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli/ctl_common.h"
#include "cli/local_state.h"
#include "common/checkpoint/checkpoint.h"

namespace ring::cli {

namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string local_time(double t) {
  if (t <= 0) return "-";
  std::time_t s = static_cast<std::time_t>(t);
  std::tm tm{};
  localtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

int run_checkpoints(const std::string& dir, bool verify, bool json) {
  std::vector<ckpt::CheckpointInfo> list;
  try {
    list = ckpt::list_checkpoints(dir, verify);
  } catch (const ckpt::CheckpointError& e) {
    std::cerr << "ringctl checkpoints: " << e.what() << "\n";
    return 1;
  }
  int corrupt = 0, complete = 0;
  for (const auto& c : list) {
    corrupt += c.status == ckpt::Status::kCorrupt;
    complete += c.status == ckpt::Status::kComplete;
  }
  if (json) {
    auto arr = nlohmann::json::array();
    for (const auto& c : list)
      arr.push_back({{"step", c.step},
                     {"name", c.name},
                     {"path", c.path},
                     {"status", ckpt::status_name(c.status)},
                     {"time", c.time},
                     {"bytes", c.bytes},
                     {"nodes", c.nodes},
                     {"latest", c.latest},
                     {"lineage", c.in_lineage ? "current" : c.superseded ? "superseded" : ""},
                     {"tag", c.tag},
                     {"parent", c.parent ? nlohmann::json{{"tag", c.parent->tag},
                                                          {"step", c.parent->step}}
                                         : nlohmann::json()},
                     {"format_version", c.format_version},
                     {"layout", c.layout ? ckpt::layout_json(*c.layout) : nlohmann::json()},
                     {"verified", verify},
                     {"problems", c.problems}});
    std::cout << arr.dump(1) << "\n";
    return corrupt ? 1 : 0;
  }
  if (list.empty()) {
    std::cout << "no checkpoints in " << dir << "\n";
    return 0;
  }
  bool color = isatty(STDOUT_FILENO) && !getenv("NO_COLOR");
  std::printf("%-10s %-19s %10s %5s %-9s %-8s %-10s  %s\n", "STEP", "TIME", "SIZE", "NODES",
              "SHARD", "RESIDUAL", "LINEAGE", "STATUS");
  for (const auto& c : list) {
    std::string status = ckpt::status_name(c.status);
    if (c.status == ckpt::Status::kComplete && verify) status += " (verified)";
    if (c.status == ckpt::Status::kIncomplete) status += " (" + c.name + ")";
    if (c.latest) status += "  <- latest";
    const char* on = "";
    const char* off = "";
    if (color && c.status == ckpt::Status::kCorrupt) on = "\033[31m", off = "\033[0m";
    // The writer's shard mode (format 2 records it); "-" for format 1 or when unknown.
    const std::string shard = c.layout ? c.layout->shard : "-";
    // Where the writer kept the top-k residual: at the owners of the ranges, per node, or "-"
    // (none, or not recorded).
    const std::string residual = !c.layout || c.layout->residual.empty() ? "-"
                                 : c.layout->residual == "owner"         ? "owner"
                                                                         : "per-node";
    // current: on the chain a resume follows; superseded: of an abandoned branch or an earlier
    // run, never resumed, removed by retention.
    const char* lineage = c.in_lineage ? "current" : c.superseded ? "superseded" : "-";
    if (c.superseded && c.name.find(".superseded-") != std::string::npos)
      status += " (" + c.name + ")";
    std::printf("%-10lld %-19s %10s %5d %-9s %-8s %-10s  %s%s%s\n",
                static_cast<long long>(c.step), local_time(c.time).c_str(),
                human_bytes(c.bytes).c_str(), c.nodes, shard.c_str(), residual.c_str(), lineage,
                on, status.c_str(), off);
    if (c.status == ckpt::Status::kCorrupt)
      for (const auto& p : c.problems) std::printf("           %s\n", p.c_str());
  }
  int superseded = 0;
  for (const auto& c : list) superseded += c.superseded;
  std::printf("%d complete (%d superseded), %d corrupt, %zu incomplete%s\n", complete, superseded,
              corrupt, list.size() - complete - corrupt,
              verify ? "; every checksum of the complete ones verified" : "");
  return corrupt ? 1 : 0;
}

}  // namespace

CheckpointsCommand add_checkpoints(CLI::App& app) {
  struct Args {
    std::string dir;
    bool verify = false, json = false;
    CoordFlags coord;
  };
  auto a = std::make_shared<Args>();
  auto* sc = app.add_subcommand(
      "checkpoints",
      "List the checkpoints in a checkpoint directory, or of a job (step, time, size, the "
      "writer's node count and shard mode, current lineage or superseded, "
      "complete/incomplete/corrupt); exit 1 if one is corrupt");
  sc->add_option("dir", a->dir,
                 "Checkpoint directory (the spec's checkpoint.dir), or a job id: the job's "
                 "checkpoint directory as ring-coord recorded it")
      ->required();
  sc->add_flag("--verify", a->verify, "Read every data file and check every tensor checksum");
  sc->add_flag("--json", a->json,
               "Machine-readable output (an array of objects, with each writer's layout: shard "
               "mode, nodes, node ranges, model)");
  a->coord.add_to(sc);
  return {sc, [a] {
            // A job id (and no directory of that name): ask ring-coord where its checkpoints are.
            std::string dir = a->dir;
            bool digits = !dir.empty() && dir.find_first_not_of("0123456789") == std::string::npos;
            if (digits && ::access(dir.c_str(), F_OK) != 0) {
              int rc = guarded(a->coord.resolved_endpoint(), [&] {
                int64_t job = parse_job_id(a->dir);
                // Answered from the state a stopped ring-coord left, as status and logs are.
                coord::Client c(with_local_state(a->coord.client_options()));
                dir = c.status(job).checkpoint_dir;
                if (dir.empty()) {
                  std::cerr << "ringctl: job " << job
                            << " has no checkpoint directory recorded; pass the directory\n";
                  return kExitFailed;
                }
                return kExitOk;
              });
              if (rc != kExitOk) return rc;
            }
            return run_checkpoints(dir, a->verify, a->json);
          }};
}

}  // namespace ring::cli
