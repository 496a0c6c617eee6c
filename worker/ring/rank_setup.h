// The set-up that ring-worker's multi-rank programs share (internal to worker/ring/): the spec,
// the threads, the kernel backend, the sequences and the ring's options of a rank, the step's
// data, the exit statuses and the logger. The programs themselves: ring_programs.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/spec/spec.h"
#include "kernels/backend.h"
#include "worker/data/loader.h"
#include "worker/data/split.h"
#include "worker/flags.h"
#include "worker/ring/ring_rank.h"

namespace ring::cp {

// The exit statuses of ring-worker's multi-rank mode (ring_main.h).
inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitRuntime = 1;

// ring-worker's named logger.
std::shared_ptr<spdlog::logger> logger();

// The job spec --spec names; nullopt (said) when it cannot be read or is invalid.
std::optional<spec::JobSpec> load(const worker::Flags& a);

// A rank's spec: load()'s, checked against --world (context_ranks x data_replicas ranks), with
// --stagger-us applied; nullopt (said) on any error.
std::optional<spec::JobSpec> load_rank_spec(const worker::Flags& args);

// One step's data: every rank reads the same D x M sequences j = 0 .. D*M-1 of the stream (so
// the loader's cursor after the step is the same on every rank) and keeps those of its replica d,
// j = d*M + m for micro-batch m, each cut to this rank's shard of the ring (rank c of C).
struct StepData {
  std::vector<data::SequenceShard> shards;  // [M]
  int64_t local_valid = 0;                  // valid labels of this rank's M shards
  int64_t tokens = 0;                       // tokens of all D x M sequences
};

// Reads the next step's D x M sequences from `source` and keeps this rank's shards of them.
StepData next_step_data(data::SequenceSource& source, const spec::JobSpec& spec,
                        const RingRank& rr);

// The RingRank's options: the rank's identity, rendezvous and transport from the flags, the
// replica count from the spec.
RankOptions rank_options(const worker::Flags& args, const spec::JobSpec& spec);

// What both kinds of rank set up the same way: the threads and the kernel backend (nullptr,
// said, when it cannot be made), and the sequences (every rank builds the same ones from the same
// spec and seed, and keeps its shards).
int rank_threads(const worker::Flags& args, const spec::JobSpec& spec);
std::string rank_backend_name(const worker::Flags& args, const spec::JobSpec& spec);
std::unique_ptr<kernels::Backend> make_rank_backend(const worker::Flags& args,
                                                    const spec::JobSpec& spec);
std::unique_ptr<data::SequenceSource> make_rank_source(const worker::Flags& args,
                                                       const spec::JobSpec& spec);

}  // namespace ring::cp
