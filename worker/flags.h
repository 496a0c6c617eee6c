// ring-worker's command line, every mode in one CLI11 table (so --help lists them all):
//
//   single process   ring-worker --spec F [--single-rank] [--steps N] ...
//   ring, launcher   ring-worker --spec F --launch-local [...]
//   ring, one rank   ring-worker --spec F --rank R --world P --rendezvous DIR [--ringd SOCK
//                    --local-rank L] [...]          (what the launcher and ringd start)
//   generation       ring-worker --generate --spec F [--rank R --world P --rendezvous DIR]
//                    [--output FILE]    (a job.kind generate spec; what ringd starts for it)
//
// --rank or --launch-local selects the ring; a flag of the other mode is refused, naming it.
// Numbers are strict (common/cli/flags.h rules); --help and --version exit 0, a usage error
// exits 2 naming the flag and the rule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/common.h>

#include "common/log/log.h"
#include "common/spec/parse.h"
#include "worker/data/passkey.h"
#include "worker/train/passkey_curriculum.h"

namespace ring::worker {

enum class Mode { kSingle, kLaunchLocal, kRank, kGenerate };

struct Flags {
  Mode mode = Mode::kSingle;
  // Every mode.
  std::string spec;
  std::optional<int64_t> steps;
  std::optional<int> threads;
  std::optional<std::string> backend;
  std::string log_json;
  int64_t max_corpus_mb = 256;
  log::Format log_format = log::Format::kText;
  spdlog::level::level_enum log_level = spdlog::level::info;
  // Single process.
  bool single_rank = false;
  data::PasskeyLabels passkey_labels = data::PasskeyLabels::kAll;
  int64_t eval_every = 0;
  int64_t eval_samples = 32;
  int64_t seqs_per_step = 1;
  std::vector<train::PasskeyStage> curriculum;
  std::string save_weights;  // a checkpoint directory for the trained weights ("" = none)
  // Ring.
  bool launch_local = false;
  int rank = -1;
  int world = -1;
  std::string rendezvous;
  std::string transport = "ucx";
  std::optional<int64_t> stagger_us;
  int timeout_ms = 60000;
  std::string ringd;
  int local_rank = -1;
  std::string timeline;  // with --ringd: the timeline file ringd created (contract/timeline.h)
  // Generation (--generate): a job.kind generate spec, alone or as a rank.
  bool generate = false;
  std::string output;  // replaces generate.output
};

// Parses argv; on --help/--version or a usage error prints and exits (0 or 2).
Flags parse_flags(int argc, char** argv);

// The spec of --spec, its diagnostics logged (errors and warnings); nullopt when it is invalid
// ("FILE: invalid spec (N error(s))" logged).
std::optional<spec::JobSpec> load_spec(const std::string& path);

}  // namespace ring::worker
