// ringd's flags with CLI11, like ringctl and ring-coord. Numbers are strict (flags::parse_int,
// flags::parse_seconds: the whole value, in range, decimal); every error names the flag and the
// rule, and exits 2.
#include "daemon/ringd/options.h"

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli/cli11_flags.h"
#include "common/cli/edit_distance.h"
#include "common/cli/flags.h"
#include "common/protocol/protocol.h"
#include "common/version.h"

namespace ring::ringd {
namespace {

CLI::Validator integer_in(int64_t lo, int64_t hi) { return flags::integer_in(lo, hi); }
CLI::Validator seconds() { return flags::seconds_in(flags::kMinSeconds, flags::kMaxSeconds); }

// The flag closest to a misspelt one (two edits at most), or "".
std::string closest_flag(const std::string& word, const CLI::App& app) {
  std::string best;
  size_t best_d = 3;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) {
      const size_t d = cli::edit_distance(word, "--" + l);
      if (d < best_d) best_d = d, best = "--" + l;
    }
  }
  return best;
}

}  // namespace

ParsedOptions parse_options(int argc, const char* const* argv, const char* (*env)(const char*)) {
  if (!env) env = [](const char* name) -> const char* { return std::getenv(name); };
  ParsedOptions out;
  Options& o = out.options;
  auto usage_error = [&](const std::string& msg) {
    std::cerr << "ringd: " << msg << "\n  `ringd --help` lists the flags\n";
    out.exit_code = kExitUsage;
    return out;
  };

  CLI::App app{
      "The node daemon: runs this node's ring-worker processes, owns the optimizer (CPU AdamW, "
      "top-k), checkpoints, restarts. Contract: daemon/INTERFACE.md.",
      "ringd"};
  app.set_version_flag("--version", std::string("ringd ") + ring::kVersion +
                                        " (coordinator protocol v" +
                                        std::to_string(protocol::kVersion) + ")");
  app.allow_extras();  // unknown flags are named below, with the closest one
  // A flag given twice: the later one counts (the order of the command line is what counts).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  int64_t steps = 0;
  std::string job;
  app.add_option("--spec", o.spec, "The job spec (YAML); required");
  app.add_option("--job-dir", o.job_dir,
                 "Where the job's files live (default /tmp/ringmaster-<uid>/jobs/<job.name>)");
  CLI::Option* node_rank =
      app.add_option("--node-rank", o.node_rank, "This daemon is node N (with --nodes)")
          ->check(integer_in(0, 65535));
  CLI::Option* nodes =
      app.add_option("--nodes", o.nodes, "Of M nodes (default: SLURM_NNODES, else 1)")
          ->check(integer_in(1, 65536));
  app.add_option("--rendezvous", o.rendezvous,
                 "Transport bootstrap directory (default <job-dir>/rendezvous)");
  app.add_option("--coord", o.coord, "Report to ring-coord at ENDPOINT (with --job)")
      ->check(flags::endpoint_rule(flags::EndpointUse::kConnect));
  app.add_option("--job", job, "The job's number at ring-coord (with --coord)")
      ->check(integer_in(1, int64_t{1} << 53));
  CLI::Option* steps_opt = app.add_option("--steps", steps, "Override train.steps")
                               ->check(integer_in(1, int64_t{1} << 40));
  app.add_flag("--resume", o.resume,
               "Continue from the latest complete checkpoint of the current lineage; fail when "
               "none loads");
  app.add_flag("--resume-if-any", o.resume_if_any,
               "Without --coord: resume when the checkpoint directory's current lineage has a "
               "checkpoint (a Slurm requeue), start from step 0 when it has none (the first "
               "start); with --coord ring-coord's resume step decides");
  app.add_option("--threads", o.threads, "Optimizer threads (default 0: all cores)")
      ->check(integer_in(0, 4096));
  app.add_flag("--json", o.json, "stdout carries the steps.jsonl lines and events as JSON");
  app.add_option("--log-format", o.log_format,
                 "stderr's log lines: text, or json (one object per line, through spdlog)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  const std::string ops = "Beyond the contract (tests, operators)";
  app.add_option("--worker-bin", o.worker_bin,
                 "ring-worker to spawn (default: $RING_WORKER_BIN, next to ringd, the install bindir, "
                 "the build tree when ringd runs from one, PATH)")
      ->group(ops);
  app.add_option("--transport", o.transport, "Transport plugin for workers and daemons")
      ->capture_default_str()
      ->group(ops);
  app.add_option("--worker-threads", o.worker_threads,
                 "Kernel threads per worker (default resources.cpus_per_worker)")
      ->check(integer_in(0, 4096))
      ->group(ops);
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "Seconds of worker silence counted as a hang")
      ->check(seconds())
      ->capture_default_str()
      ->group(ops);
  app.add_option("--startup-timeout", o.startup_timeout_s, "Seconds from spawn to first contact")
      ->check(seconds())
      ->capture_default_str()
      ->group(ops);
  app.add_option("--stop-grace", o.stop_grace_s,
                 "Seconds from SIGUSR2 to SIGKILL when stopping workers")
      ->check(seconds())
      ->capture_default_str()
      ->group(ops);
  app.add_flag("--hash-weights", o.hash_weights,
               "Steps carry weights_xxh, a hash of the weights the workers read (shard full: "
               "this node's range)")
      ->group(ops);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    out.exit_code = app.exit(e);
    return out;
  } catch (const CLI::CallForVersion& e) {
    out.exit_code = app.exit(e);
    return out;
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  if (const std::vector<std::string> extra = app.remaining(); !extra.empty()) {
    const std::string& word = extra.front();
    if (word.size() > 1 && word[0] == '-') {
      const std::string flag = word.substr(0, word.find('='));
      const std::string c = closest_flag(flag, app);
      return usage_error("unknown flag '" + flag + "'" +
                         (c.empty() ? "" : "; did you mean '" + c + "'?"));
    }
    return usage_error("unexpected argument '" + word + "' (ringd takes flags only)");
  }
  if (steps_opt->count() > 0) o.steps = steps;
  o.job = job;
  if (o.spec.empty()) return usage_error("--spec FILE is required");
  const bool node_given = node_rank->count() > 0, nodes_given = nodes->count() > 0;
  if (node_given != nodes_given) return usage_error("--node-rank and --nodes go together");
  if (!node_given) {
    const char* id = env("SLURM_NODEID");
    const char* nn = env("SLURM_NNODES");
    if (id && nn && *id && *nn) {
      try {
        o.node_rank = static_cast<int>(flags::parse_int("SLURM_NODEID", id, 0, 65535));
        o.nodes = static_cast<int>(flags::parse_int("SLURM_NNODES", nn, 1, 65536));
      } catch (const flags::FlagError& e) {
        return usage_error(e.what());
      }
    }
  }
  if (o.node_rank >= o.nodes)
    return usage_error("--node-rank " + std::to_string(o.node_rank) + " is not below --nodes " +
                       std::to_string(o.nodes));
  if (o.coord.empty() != o.job.empty()) return usage_error("--coord and --job go together");
  return out;
}

}  // namespace ring::ringd
