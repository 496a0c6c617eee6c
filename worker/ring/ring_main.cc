#include "worker/ring/ring_main.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/timeline.h"
#include "common/log/log.h"
#include "common/proc/reap.h"
#include "common/proc/rank_group.h"
#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/data/cursor.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/data/split.h"
#include "worker/flags.h"
#include "worker/offload/ringd_client.h"
#include "worker/ring/debug_inject.h"
#include "worker/ring/full_shard.h"
#include "worker/ring/ring_attention.h"
#include "worker/ring/ring_rank.h"
#include "worker/train/trainer.h"

namespace ring::cp {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitRuntime = 1;

using Args = worker::Flags;

std::shared_ptr<spdlog::logger> logger() { return log::get("ring-worker"); }

std::optional<spec::JobSpec> load(const Args& a) { return worker::load_spec(a.spec); }

// One step's data: every rank reads the same D x M sequences j = 0 .. D*M-1 of the stream (so
// the loader's cursor after the step is the same on every rank) and keeps those of its replica d,
// j = d*M + m for micro-batch m, each cut to this rank's shard of the ring (rank c of C).
struct StepData {
  std::vector<data::SequenceShard> shards;  // [M]
  int64_t local_valid = 0;                  // valid labels of this rank's M shards
  int64_t tokens = 0;                       // tokens of all D x M sequences
};

StepData next_step_data(data::SequenceSource& source, const spec::JobSpec& spec,
                        const RingRank& rr) {
  const int64_t m_count = spec.train.micro_batches;
  StepData sd;
  for (int64_t j = 0; j < rr.replicas() * m_count; ++j) {
    data::Sequence seq = source.next_sequence();
    sd.tokens += seq.size();
    if (j / m_count != rr.replica()) continue;
    sd.shards.push_back(
        data::shard_sequence(seq, rr.ring().world, rr.ring().rank, spec.parallel.causal_balance));
    sd.local_valid += valid_labels(sd.shards.back());
  }
  return sd;
}

RankOptions rank_options(const Args& args, const spec::JobSpec& spec) {
  RankOptions ro;
  ro.rank = args.rank;
  ro.world = args.world;
  ro.replicas = static_cast<int>(spec.parallel.data_replicas);
  ro.rendezvous = args.rendezvous;
  ro.transport = args.transport;
  ro.op_timeout_ms = args.timeout_ms;
  return ro;
}

int run_offloaded_rank(const Args& args, const spec::JobSpec& spec);

// What both kinds of rank set up the same way: the threads and the kernel backend (nullptr,
// said, when it cannot be made), and the sequences (every rank builds the same ones from the same
// spec and seed, and keeps its shards).
int rank_threads(const Args& args, const spec::JobSpec& spec) {
  return args.threads.value_or(static_cast<int>(spec.resources.cpus_per_worker));
}
std::string rank_backend_name(const Args& args, const spec::JobSpec& spec) {
  return args.backend.value_or(spec::to_string(spec.resources.backend));
}
std::unique_ptr<kernels::Backend> make_rank_backend(const Args& args, const spec::JobSpec& spec) {
  const std::string name = rank_backend_name(args, spec);
  std::string err;
  auto backend = kernels::create_backend(name, rank_threads(args, spec), &err);
  if (!backend) logger()->error("backend '{}': {}", name, err);
  return backend;
}
std::unique_ptr<data::SequenceSource> make_rank_source(const Args& args,
                                                       const spec::JobSpec& spec) {
  data::CorpusOptions corpus;
  corpus.max_total_bytes = args.max_corpus_mb << 20;
  corpus.encode_threads = rank_threads(args, spec);
  std::unique_ptr<data::SequenceSource> source =
      data::make_source(spec.data, data::PasskeyLabels::kAll, corpus);
  data::check_vocab(*source, spec.model.vocab);
  return source;
}

// ---- one rank ---------------------------------------------------------------------------------

int run_rank(const Args& args) {
  std::optional<spec::JobSpec> loaded = load(args);
  if (!loaded) return kExitUsage;
  spec::JobSpec spec = *loaded;
  if (spec.parallel.context_ranks * spec.parallel.data_replicas != args.world) {
    logger()->error("--world {} but parallel.context_ranks {} x data_replicas {} = {}", args.world,
                    spec.parallel.context_ranks, spec.parallel.data_replicas,
                    spec.parallel.context_ranks * spec.parallel.data_replicas);
    return kExitUsage;
  }
  if (args.stagger_us) spec.parallel.stagger_us = *args.stagger_us;
  if (!args.ringd.empty()) return run_offloaded_rank(args, spec);
  const int rank = args.rank, world = args.world;
  const bool lead = rank == 0;
  const int64_t steps = args.steps.value_or(spec.train.steps);
  const int threads = rank_threads(args, spec);
  auto backend = make_rank_backend(args, spec);
  if (!backend) return kExitUsage;

  RingRank rr(spec, rank_options(args, spec));
  if (lead && !rr.note().empty()) logger()->info("note: {}", rr.note());
  const int ctx = rr.ring().world;  // C: ranks of this replica's ring
  std::unique_ptr<data::SequenceSource> source = make_rank_source(args, spec);

  RingAttention::Options ao;
  ao.stagger_us = spec.parallel.stagger_us;
  ao.timeout_ms = args.timeout_ms;
  RingAttention attention(backend.get(), &rr.progress(), rr.ring(), ao);
  train::Trainer trainer(spec, backend.get(), &attention, steps);
  trainer.set_grad_reduce(rr.grad_reducer());

  const auto& cfg = trainer.model().config();
  if (lead) {
    std::string order;
    for (int r : rr.ring().order) {
      if (!order.empty()) order += ',';
      order += std::to_string(r);
    }
    const std::string ranks =
        rr.replicas() == 1 ? std::to_string(world)
                           : fmt::format("{} ({} data replicas x {})", world, rr.replicas(), ctx);
    const std::string micro =
        spec.train.micro_batches == 1
            ? ""
            : fmt::format(", {} micro-batches per replica", spec.train.micro_batches);
    std::printf(
        "ring-worker: %s | %s ranks, ring order %s, %s split, stagger %lld us, %s transport | "
        "%s backend, %d threads per rank | %lld layers, d_model %lld, heads %lld/%lld, %lld "
        "parameters%s | seq_len %lld (%lld per rank)%s | %lld steps\n",
        spec.job.name.c_str(), ranks.c_str(), order.c_str(),
        spec::to_string(spec.parallel.causal_balance),
        static_cast<long long>(spec.parallel.stagger_us), args.transport.c_str(), backend->name(),
        threads, static_cast<long long>(cfg.layers), static_cast<long long>(cfg.d_model),
        static_cast<long long>(cfg.heads), static_cast<long long>(cfg.kv_heads),
        static_cast<long long>(trainer.model().layout().num_params()),
        cfg.recompute ? ", recompute" : "", static_cast<long long>(spec.data.seq_len),
        static_cast<long long>(spec.data.seq_len / ctx), micro.c_str(),
        static_cast<long long>(steps));
    std::fflush(stdout);
  }
  std::ofstream log_json;
  if (lead && !args.log_json.empty()) {
    log_json.open(args.log_json, std::ios::app);
    if (!log_json) {
      logger()->error("--log-json: cannot open {}", args.log_json);
      return kExitUsage;
    }
  }

  // From here on transfers may be in flight: an error exits at once, without unwinding.
  return run_then_exit_on_error("ring-worker: rank " + std::to_string(rank), kExitRuntime, [&] {
    for (int64_t s = 1; s <= steps; ++s) {
      const StepData sd = next_step_data(*source, spec, rr);
      std::vector<model::Batch> batches;
      for (const data::SequenceShard& shard : sd.shards) batches.push_back(shard_batch(shard));
      const RingStats r0 = attention.ring_stats();
      const double reduce0 = rr.reduce_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t global_valid = rr.global_count(sd.local_valid);
      train::StepStats st = trainer.train_step(batches, global_valid);
      const double step_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const RingStats& r1 = attention.ring_stats();
      const double ring_wait_ms = (r1.wait_s - r0.wait_s) * 1e3;
      const double reduce_ms = (rr.reduce_seconds() - reduce0) * 1e3;
      st.tokens = sd.tokens;  // every replica's whole sequences: the job's throughput
      st.step_ms = step_ms;
      st.tokens_per_s = step_ms > 0 ? st.tokens * 1000.0 / step_ms : 0;
      if (lead && (s % spec.train.log_every == 0 || s == steps || s == 1)) {
        std::printf(
            "%s | comm %.1f ms (ring wait %.1f, grad all-reduce %.1f) | blocks skipped "
            "%lld/%lld | %.1f MB sent\n",
            train::format_step(st).c_str(), ring_wait_ms + reduce_ms, ring_wait_ms, reduce_ms,
            static_cast<long long>(r1.blocks_skipped - r0.blocks_skipped),
            static_cast<long long>(r1.blocks_total - r0.blocks_total),
            (r1.bytes_sent - r0.bytes_sent) / 1e6);
        std::fflush(stdout);
        if (log_json.is_open()) {
          nlohmann::json j = nlohmann::json::parse(train::step_json(st));
          j["ranks"] = world;
          j["comm_ms"] = ring_wait_ms + reduce_ms;
          j["ring_wait_ms"] = ring_wait_ms;
          j["allreduce_ms"] = reduce_ms;
          j["blocks_skipped"] = r1.blocks_skipped - r0.blocks_skipped;
          j["blocks_total"] = r1.blocks_total - r0.blocks_total;
          j["bytes_sent_rank0"] = r1.bytes_sent - r0.bytes_sent;
          log_json << j.dump() << std::endl;
        }
      }
    }

    // Peak memory of every rank, printed by rank 0.
    std::vector<int64_t> peaks(world);
    int64_t mine = peak_rss_bytes();
    rr.all_gather(&mine, peaks.data(), sizeof(int64_t), 0, "all_gather of peak memory");
    if (lead) {
      std::printf("peak memory (VmHWM) per rank:");
      for (int r = 0; r < world; ++r) std::printf(" %d: %.1f MiB", r, peaks[r] / 1048576.0);
      const kernels::AttentionStats k = attention.stats();
      std::printf(" | rank 0 attention tiles: %lld of %lld skipped\n",
                  static_cast<long long>(k.tiles_skipped), static_cast<long long>(k.tiles_total));
      std::fflush(stdout);
    }
    // Everyone finishes together: a rank that exits early looks like a failed peer to the others.
    rr.shutdown();
    return 0;
  });
}

// ---- one rank under ringd ---------------------------------------------------------------------
//
// The optimizer lives in ringd: per step the rank takes the weights ringd put in shared memory,
// runs forward and backward and hands each gradient bucket to ringd's shm slot the moment the
// backward finishes it (ringd sums the node's slots and updates that bucket while this backward
// goes on). Only the loss and the valid-label count still cross ranks (all_gather over every
// rank of every replica), so rank 0 reports the global loss. No gradient all-reduce between
// workers: ringd sums its workers' slots (every replica's), the nodes sum their node gradients.
// With micro-batches the gradients accumulate over the M forward/backward passes and only the
// last backward hands buckets to ringd.

// The offloaded rank's parts (run_offloaded_rank below).

// parallel.shard full: this rank's shard of the weights and gradient, its blocks gathered over
// every rank; nullptr (said) when the transport or the rank count cannot carry it.
std::unique_ptr<FullShardStore> make_shard_store(const Args& args, const spec::JobSpec& spec,
                                                 RingRank& rr, kernels::Backend* device) {
  const int rank = args.rank;
  // The gathers and reduce-scatters travel in host buffers; a device backend's blocks are
  // staged through them (full_shard.h).
  if (!(rr.comm().api().caps & RING_TRANSPORT_CAP_HOST_MEMORY)) {
    logger()->error("rank {}: parallel.shard full needs a transport that takes host buffers "
                    "(ucx); '{}' takes device buffers only", rank, rr.comm().api().name);
    return nullptr;
  }
  const contract::ParamLayout layout(model::ModelConfig::from_spec(spec));
  // ringd's node count: --world / workers_per_node (the shards are its ranges, cut).
  const int per_node = static_cast<int>(spec.resources.workers_per_node);
  if (per_node < 1 || args.world % per_node != 0) {
    logger()->error("rank {}: shard full needs --world {} to be a multiple of "
                    "resources.workers_per_node {}", rank, args.world, per_node);
    return nullptr;
  }
  const int nodes = args.world / per_node;
  return std::make_unique<FullShardStore>(layout, contract::worker_shards(layout, nodes, per_node),
                                          rank, per_node, &rr.world_progress(), args.timeout_ms,
                                          device);
}

// ringd's phase timeline file for this rank (contract/timeline.h), when --timeline names one;
// RING_TIMELINE on, off or alternate (the benchmark's mode: records in even steps only).
int open_timeline(const Args& args, contract::timeline::TimelineWriter& timeline,
                  bool* alternate) {
  if (args.timeline.empty()) return kExitOk;
  if (const std::string e = timeline.open(args.timeline, args.rank, ::getpid()); !e.empty()) {
    logger()->error("rank {}: {}", args.rank, e);
    return kExitRuntime;
  }
  const char* mode = std::getenv("RING_TIMELINE");
  const std::string m = mode ? mode : "";
  if (!m.empty() && m != "on" && m != "off" && m != "alternate") {
    logger()->error("rank {}: RING_TIMELINE must be on, off or alternate, not '{}'", args.rank, m);
    return kExitUsage;
  }
  timeline.set_enabled(m != "off");
  *alternate = m == "alternate";
  contract::timeline::set_active(&timeline);
  return kExitOk;
}

// Per step (shard full): seconds the gathers and reduce-scatters were in flight, and waited on.
struct StepOverlap {
  int64_t step;
  double flight_s, wait_s;
};
// Per step: the forward and backward passes' wall and main-thread CPU time less the ring waits
// (the compute, and the CPU it got: its share of a core when ranks share cores).
struct StepCpu {
  int64_t step;
  double wall_s, cpu_s;
};

// The series at the end of the run, one log line each: compute_cpu (bench/sim_validate.py reads
// it: the CPU share an emulated node got) and shard_overlap (bench/shard_overlap.sh).
void log_rank_series(int rank, const std::vector<StepCpu>& step_cpu,
                     const std::vector<StepOverlap>& overlap) {
  if (!step_cpu.empty()) {
    nlohmann::json j = {{"event", "compute_cpu"}, {"rank", rank}};
    for (const auto& c : step_cpu) {
      j["step"].push_back(c.step);
      j["wall_s"].push_back(c.wall_s);
      j["cpu_s"].push_back(c.cpu_s);
    }
    logger()->info("compute cpu {}", j.dump());
  }
  if (!overlap.empty()) {
    nlohmann::json j = {{"event", "shard_overlap"}, {"rank", rank}};
    for (const auto& o : overlap) {
      j["step"].push_back(o.step);
      j["flight_s"].push_back(o.flight_s);
      j["wait_s"].push_back(o.wait_s);
    }
    logger()->info("shard full overlap {}", j.dump());
  }
}

// The step's global loss: (loss_sum, valid) of every rank (all replicas), summed in rank order;
// and whether any node's ringd has a stop request, so that every node stops after this step.
struct StepTotals {
  double loss_sum = 0;
  int64_t valid = 0;
  bool stop = false;
};
StepTotals gather_step_totals(RingRank& rr, const model::LossResult& loss, bool stop_requested,
                              int world, int timeout_ms) {
  struct Part {
    double loss_sum;
    int64_t valid;
    int64_t stop;
  };
  Part mine{loss.loss_sum, loss.valid, stop_requested ? 1 : 0};
  std::vector<Part> all(world);
  rr.all_gather(&mine, all.data(), sizeof(Part), timeout_ms, "all_gather of the loss");
  StepTotals t;
  for (const Part& p : all) {
    t.loss_sum += p.loss_sum;
    t.valid += p.valid;
    t.stop = t.stop || p.stop != 0;
  }
  return t;
}

// A fresh start: ringd has no weights yet; rank 0 of the node initialises them (seeded as the
// spec says). Shard full: the node's range only, straight into the segment.
void send_initial_params(offload::RingdClient& client, model::Model& model,
                         const spec::JobSpec& spec, bool full) {
  if (full) {
    contract::ShmRegion& shm = client.shm();
    model.initial_params(static_cast<uint64_t>(spec.train.seed), shm.params_begin(),
                         shm.params_begin() + shm.params_n(), shm.params());
    client.send_init_written();
  } else {
    model.init_params(static_cast<uint64_t>(spec.train.seed));
    client.send_init(model.params());
  }
}

// RING_DEBUG_BLOCK (a main thread that never returns, for ringd's hang detection) and
// RING_DEBUG_DELAY (a slow rank, for straggler detection): debug_inject.h.
void apply_debug_inject(const DebugInject& inject, int rank, int64_t step) {
  if (inject.block_step == step) {
    logger()->warn("rank {}: RING_DEBUG_BLOCK: blocking the main thread in step {}", rank, step);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (inject.delay_ms > 0 && step >= inject.delay_from)
    std::this_thread::sleep_for(std::chrono::milliseconds(inject.delay_ms));
}

// The passes' compute since (t0, cpu0, ring0): wall and main-thread CPU less the ring waits.
StepCpu step_cpu_since(int64_t step, std::chrono::steady_clock::time_point t0, double cpu0,
                       const RingStats& ring0, const RingStats& ring1) {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {step, wall - (ring1.wait_s - ring0.wait_s),
          thread_cpu_seconds() - cpu0 - (ring1.wait_cpu_s - ring0.wait_cpu_s)};
}

// Shard full's gathers and reduce-scatters between two snapshots: in flight, and waited on.
StepOverlap shard_overlap_since(int64_t step, const ShardStats& s0, const ShardStats& s1) {
  return {step,
          (s1.gather_flight_s - s0.gather_flight_s) + (s1.scatter_flight_s - s0.scatter_flight_s),
          (s1.gather_wait_s - s0.gather_wait_s) + (s1.scatter_wait_s - s0.scatter_wait_s)};
}

int run_offloaded_rank(const Args& args, const spec::JobSpec& spec) {
  const int rank = args.rank, world = args.world;  // ringd decides the number of steps
  const std::string backend_name = rank_backend_name(args, spec);
  auto backend = make_rank_backend(args, spec);
  if (!backend) return kExitUsage;
  RingRank rr(spec, rank_options(args, spec));
  std::unique_ptr<data::SequenceSource> source = make_rank_source(args, spec);

  RingAttention::Options ao;
  ao.stagger_us = spec.parallel.stagger_us;
  ao.timeout_ms = args.timeout_ms;
  ao.rank_offset = rr.replica() * rr.ring().world;
  RingAttention attention(backend.get(), &rr.progress(), rr.ring(), ao);
  // parallel.shard full: this rank keeps only its shard of the weights and gradient; the model
  // takes every block from the store (gathered over all W ranks just before use).
  const bool full = spec.parallel.shard == spec::ShardMode::kFull;
  const bool host_backend = backend_name == "cpu";
  std::unique_ptr<FullShardStore> store;
  if (full) {
    store = make_shard_store(args, spec, rr, host_backend ? nullptr : backend.get());
    if (!store) return kExitUsage;
  }
  model::Model model(model::ModelConfig::from_spec(spec), backend.get(), &attention, store.get());
  const int64_t n = model.layout().total();

  // The phase timeline (ringd's file, contract/timeline.h) and the debug aids (debug_inject.h).
  DebugInject inject;
  if (const std::string e = parse_debug_inject(std::getenv("RING_DEBUG_DELAY"),
                                               std::getenv("RING_DEBUG_BLOCK"), rank, &inject);
      !e.empty()) {
    logger()->error("rank {}: {}", rank, e);
    return kExitUsage;
  }
  namespace tl = contract::timeline;
  tl::TimelineWriter timeline;
  bool timeline_alternate = false;  // the benchmark's mode: records in even steps only
  if (const int rc = open_timeline(args, timeline, &timeline_alternate); rc != kExitOk) return rc;
  // A collective over every rank, recorded as a wait on all of them (peer -1).
  double collective_s = 0;
  auto collective = [&](int64_t step, auto&& body) {
    timeline.wait_begin(tl::Phase::kCollective, step, -1, -1, -1);
    const int64_t c0 = tl::now_ns();
    body();
    const int64_t c1 = tl::now_ns();
    timeline.wait_end();
    timeline.record({.kind = tl::Phase::kCollective, .step = step, .begin_ns = c0, .end_ns = c1});
    collective_s += (c1 - c0) * 1e-9;
  };
  const int64_t prev_rank = rr.ring().world > 1 ? rr.ring().prev + ao.rank_offset : -1;

  offload::ClientOptions co;
  co.rank = rank;
  co.local = args.local_rank;
  co.n = n;
  offload::RingdClient client(args.ringd, co);
  const offload::Welcome& w = client.welcome();
  if (!w.cursor.is_null()) source->seek(w.cursor.get<data::Cursor>());
  if (w.need_init) send_initial_params(client, model, spec, full);
  // The CPU backend's weights are host memory: ringd's new weights (or the changed coordinates)
  // are copied into them. A device backend copies the shm's weights to the device as a whole and
  // each finished gradient bucket from the device straight into its shm slot: no host copy of
  // the model in the worker. Shard full: only this rank's shard is copied from the segment.
  float* weights = host_backend && !full ? model.params() : client.shm().params();

  std::vector<StepOverlap> overlap;  // shard full, per step
  std::vector<StepCpu> step_cpu;

  // From here on transfers may be in flight: an error exits at once, without unwinding.
  return run_then_exit_on_error("ring-worker: rank " + std::to_string(rank), kExitRuntime, [&] {
    for (;;) {
      timeline.wait_begin(tl::Phase::kParamsWait, timeline.step() + 1, -1, -1, -1);
      const int64_t p0 = tl::now_ns();
      offload::Command cmd = client.next(weights);
      timeline.wait_end();
      if (cmd.stop) break;
      timeline.set_step(cmd.step);
      if (timeline_alternate) timeline.set_enabled(cmd.step % 2 == 0);
      const int64_t s0 = tl::now_ns();
      timeline.record({.kind = tl::Phase::kParamsWait, .step = cmd.step, .begin_ns = p0,
                       .end_ns = s0});
      if (full) {
        const contract::WorkerShard& sh = store->shard();
        std::memcpy(store->shard_weights(),
                    client.shm().params() + (sh.begin - client.shm().params_begin()),
                    static_cast<size_t>(sh.size()) * sizeof(float));
      } else if (!host_backend) {
        model.set_params(client.shm().params(), n);
      }
      apply_debug_inject(inject, rank, cmd.step);
      const StepData sd = next_step_data(*source, spec, rr);
      const int64_t d1 = tl::now_ns();
      timeline.record({.kind = tl::Phase::kData, .step = cmd.step, .begin_ns = s0, .end_ns = d1});
      const RingStats r0 = attention.ring_stats();
      collective_s = 0;
      double handover_s = 0;
      const auto t0 = std::chrono::steady_clock::now();
      int64_t global_count = 0;
      collective(cmd.step, [&] { global_count = rr.global_count(sd.local_valid); });
      const int64_t global_valid = std::max<int64_t>(global_count, 1);
      // Micro-batches accumulate into the gradient buffer; a bucket is complete only in the last
      // one's backward, so only that backward hands buckets to ringd.
      model.zero_grads();
      const model::BucketReadyFn to_ringd = [&](const model::GradBucket& b) {
        const int64_t h0 = tl::now_ns();
        if (host_backend) {
          client.bucket(cmd.step, b, model.grads());
        } else {
          model.copy_grads_to_host(b.begin, b.end, client.slot() + b.begin);
          client.bucket_written(cmd.step, b);
        }
        const int64_t h1 = tl::now_ns();
        timeline.record({.kind = tl::Phase::kHandover, .step = cmd.step,
                         .layer = static_cast<int32_t>(b.index), .begin_ns = h0, .end_ns = h1,
                         .bytes = (b.end - b.begin) * static_cast<int64_t>(sizeof(float))});
        handover_s += (h1 - h0) * 1e-9;
      };
      // Shard full: the store hands each bucket's part of this rank's shard over once its
      // reduce-scatter is summed (the rest of the slot stays zero, so ringd's sum of the node's
      // slots is the job's gradient of the node's range).
      const FullShardStore::DeliverFn shard_to_ringd = [&](int b, int64_t lo, int64_t hi,
                                                           const float* g) {
        const int64_t h0 = tl::now_ns();
        if (hi > lo)
          std::memcpy(client.slot() + (lo - store->shard().begin), g,
                      static_cast<size_t>(hi - lo) * sizeof(float));
        const model::GradBucket& bk = model.layout().buckets()[b];
        client.bucket_written(cmd.step, bk);
        const int64_t h1 = tl::now_ns();
        timeline.record({.kind = tl::Phase::kHandover, .step = cmd.step,
                         .layer = static_cast<int32_t>(b), .begin_ns = h0, .end_ns = h1,
                         .bytes = (hi - lo) * static_cast<int64_t>(sizeof(float))});
        handover_s += (h1 - h0) * 1e-9;
      };
      const ShardStats shard0 = store ? store->stats() : ShardStats{};
      const RingStats rc0 = attention.ring_stats();
      const auto fb0 = std::chrono::steady_clock::now();
      const double fbc0 = thread_cpu_seconds();
      model::LossResult loss;
      for (size_t m = 0; m < sd.shards.size(); ++m) {
        const bool last = m + 1 == sd.shards.size();
        if (full) store->begin_batch(m == 0, last, shard_to_ringd);
        const model::LossResult r = model.forward_backward(
            shard_batch(sd.shards[m]), global_valid,
            last && !full ? to_ringd : model::BucketReadyFn{});
        loss.loss_sum += r.loss_sum;
        loss.valid += r.valid;
      }
      step_cpu.push_back(step_cpu_since(cmd.step, fb0, fbc0, rc0, attention.ring_stats()));
      if (store) {  // the waits on block gathers and gradient reduce-scatters
        overlap.push_back(shard_overlap_since(cmd.step, shard0, store->stats()));
        collective_s += overlap.back().wait_s;
      }
      // The step's global loss: (loss_sum, valid) of every rank (all replicas), summed in rank
      // order; and whether any node's ringd has a stop request, so that every node stops after
      // this step.
      StepTotals totals;
      collective(cmd.step, [&] {
        totals = gather_step_totals(rr, loss, cmd.stop_requested, world, args.timeout_ms);
      });
      const double step_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const RingStats& r1 = attention.ring_stats();
      // The step's summary: waits on peers (ring receives, collectives), sends and handovers,
      // and the rest as compute.
      const double data_ms = (d1 - s0) * 1e-6;
      const double wait_ms = ((r1.recv_wait_s - r0.recv_wait_s) + collective_s) * 1e3;
      const double comm_ms = ((r1.send_wait_s - r0.send_wait_s) + handover_s) * 1e3;
      const int64_t s1 = tl::now_ns();
      timeline.record({.kind = tl::Phase::kStep, .step = cmd.step, .begin_ns = s0, .end_ns = s1});
      client.done(contract::control::Done{.step = cmd.step,
                                          .loss_sum = totals.loss_sum,
                                          .valid = totals.valid,
                                          .tokens = sd.tokens,
                                          .step_ms = step_ms,
                                          .ring_wait_ms = (r1.wait_s - r0.wait_s) * 1e3,
                                          .bytes_sent = r1.bytes_sent - r0.bytes_sent,
                                          .cursor = source->cursor(),
                                          .stop = totals.stop,
                                          .data_ms = data_ms,
                                          .compute_ms = std::max(0.0, step_ms - wait_ms - comm_ms),
                                          .wait_ms = wait_ms,
                                          .comm_ms = comm_ms,
                                          .prev = prev_rank});
    }
    log_rank_series(rank, step_cpu, overlap);
    rr.shutdown();
    return 0;
  });
}

// ---- launcher ---------------------------------------------------------------------------------

using proc::describe_status;

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
    std::string pid_list;
    for (pid_t p : pids) pid_list += " " + std::to_string(p);
    log::event(*logger(), spdlog::level::info,
               fmt::format("launched {} ranks (pids{}), rendezvous {}", world, pid_list, dir),
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

}  // namespace

int ring_main(const worker::Flags& args, int argc, char** argv) {
  if (args.launch_local) return launch_local(argc, argv, args);
  try {
    return run_rank(args);
  } catch (const offload::RingdGone& e) {
    logger()->error("rank {}: {}", args.rank, e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(kExitRuntime);
  } catch (const transport::TransportError& e) {
    // Thrown while setting up (bootstrap, connect): nothing is in flight yet. Errors during the
    // steps never get here: run_then_exit_on_error exits before anything is unwound.
    logger()->error("rank {}: {}", args.rank, e.what());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(kExitRuntime);
  } catch (const data::DataError& e) {
    logger()->error("rank {}: data: {}", args.rank, e.what());
  } catch (const model::ModelError& e) {
    logger()->error("rank {}: model: {}", args.rank, e.what());
  } catch (const std::exception& e) {
    logger()->error("rank {}: {}", args.rank, e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(kExitRuntime);
}

}  // namespace ring::cp
