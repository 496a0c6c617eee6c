// One rank of a ring with the optimizer in-process (ring_programs.h run_rank).

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "worker/ring/rank_setup.h"
#include "worker/ring/head_attention.h"
#include "worker/ring/ring_attention.h"
#include "worker/ring/ring_programs.h"
#include "worker/ring/ring_rank.h"
#include "worker/train/trainer.h"

namespace ring::cp {
namespace {
using Args = worker::Flags;
}  // namespace

int run_rank(const Args& args, const spec::JobSpec& spec) {
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
  // model.dtype bf16: K and V are bf16 values, and travel so (docs/precision.md).
  if (spec.model.dtype == spec::DType::kBf16) ao.wire = kernels::DType::kBF16;
  // One ring, or head groups inside a node with the ring over them (parallel.head_ranks).
  const std::unique_ptr<ContextAttention> attention_owner = make_context_attention(
      backend.get(), &rr.progress(), rr.ring(), static_cast<int>(spec.parallel.head_ranks), ao);
  ContextAttention& attention = *attention_owner;
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

}  // namespace ring::cp
