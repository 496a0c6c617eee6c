// One rank under ringd (ring_programs.h run_offloaded_rank).
//
// The optimizer lives in ringd: per step the rank takes the weights ringd put in shared memory,
// runs forward and backward and hands each gradient bucket to ringd's shm slot the moment the
// backward finishes it (ringd sums the node's slots and updates that bucket while this backward
// goes on). Only the loss and the valid-label count still cross ranks (all_gather over every
// rank of every replica), so rank 0 reports the global loss. No gradient all-reduce between
// workers: ringd sums its workers' slots (every replica's), the nodes sum their node gradients.
// With micro-batches the gradients accumulate over the M forward/backward passes and only the
// last backward hands buckets to ringd.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/contract/timeline.h"
#include "worker/offload/ringd_client.h"
#include "worker/ring/debug_inject.h"
#include "worker/ring/full_shard.h"
#include "worker/ring/rank_setup.h"
#include "worker/ring/head_attention.h"
#include "worker/ring/ring_attention.h"
#include "worker/ring/ring_programs.h"
#include "worker/ring/ring_rank.h"

namespace ring::cp {
namespace {

using Args = worker::Flags;

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
  // A bf16 model's gathers carry bf16 (the model rounds its blocks to it anyway).
  const kernels::DType gather =
      spec.model.dtype == spec::DType::kBf16 ? kernels::DType::kBF16 : kernels::DType::kF32;
  return std::make_unique<FullShardStore>(layout, contract::worker_shards(layout, nodes, per_node),
                                          rank, per_node, &rr.world_progress(), args.timeout_ms,
                                          device, gather);
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
  } else if (model.config().dtype == spec::DType::kBf16) {
    // fp32, unrounded: the master ringd keeps (the bf16 model holds only their rounding and
    // takes its weights from the segment every step).
    client.send_init(model.initial_params(static_cast<uint64_t>(spec.train.seed)).data());
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

}  // namespace

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
  // model.dtype bf16: K and V are bf16 values, and travel so (docs/precision.md).
  if (spec.model.dtype == spec::DType::kBf16) ao.wire = kernels::DType::kBF16;
  ao.rank_offset = rr.replica() * rr.ring().world;
  // One ring, or head groups inside a node with the ring over them (parallel.head_ranks).
  const std::unique_ptr<ContextAttention> attention_owner = make_context_attention(
      backend.get(), &rr.progress(), rr.ring(), static_cast<int>(spec.parallel.head_ranks), ao);
  ContextAttention& attention = *attention_owner;
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
  // The rank this one's ring receives from: the replica's ring, or with head_ranks the ring of
  // this rank's head slot over the groups.
  const int64_t prev_rank =
      attention.ring_prev() >= 0 ? attention.ring_prev() + ao.rank_offset : -1;

  offload::ClientOptions co;
  co.rank = rank;
  co.local = args.local_rank;
  co.n = n;
  offload::RingdClient client(args.ringd, co);
  const offload::Welcome& w = client.welcome();
  if (!w.cursor.is_null()) source->seek(w.cursor.get<data::Cursor>());
  if (w.need_init) send_initial_params(client, model, spec, full);
  // The CPU backend's fp32 weights are host memory: ringd's new weights (or the changed
  // coordinates) are copied into them. A device backend copies the shm's weights to the device
  // as a whole and each finished gradient bucket from the device straight into its shm slot: no
  // host copy of the model in the worker. A bf16 model rounds the shm's fp32 weights into its
  // bf16 ones each step (set_params; it holds no fp32 copy). Shard full: only this rank's shard
  // is copied from the segment.
  const bool bf16 = model.config().dtype == spec::DType::kBf16;
  float* weights = host_backend && !full && !bf16 ? model.params() : client.shm().params();

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
        store->set_shard_weights(client.shm().params() + (sh.begin - client.shm().params_begin()));
      } else if (!host_backend || bf16) {
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
      // Blocked on peers: ring receives, collectives, and the head group's all-to-alls.
      const double wait_ms =
          ((r1.recv_wait_s - r0.recv_wait_s) + collective_s + (r1.a2a_s - r0.a2a_s)) * 1e3;
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

}  // namespace ring::cp
