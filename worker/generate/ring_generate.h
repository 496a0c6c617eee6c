// The ranks of a sharded generation (generator.h, ShardOptions): one process per rank, joined by
// the transport as a training ring is (worker/ring/ring_rank.h: bootstrap on a rendezvous
// directory, the ring's neighbours connected, a progress thread), with the ring's attention
// executor (RingAttention, or HeadParallelAttention with head_ranks > 1) for the prefill and the
// communicator's all_gather for the decode
// steps' partials.
//
//   GenerateRing ring(backend, {.rank = r, .ranks = P, .rendezvous = dir});
//   GeneratorOptions go; go.shard = ring.shard(spec::CausalBalance::kZigzag);
//   Generator g(config, params, backend, go);
//   ... the same prefill / step calls on every rank ...
//   ring.shutdown();   // every rank: returns once all have called it
//
// A transport error (a peer died) may leave transfers in flight into buffers the generator and
// the ring own: callers run the generation under cp::run_then_exit_on_error (ring_rank.h), which
// ends the process instead of unwinding.
#pragma once

#include <memory>
#include <string>

#include "common/spec/spec.h"
#include "kernels/backend.h"
#include "worker/generate/generator.h"

namespace ring::cp {
class RingRank;
class ContextAttention;
}  // namespace ring::cp

namespace ring::gen {

struct RingOptions {
  int rank = 0;
  int ranks = 1;
  std::string rendezvous;  // a directory every rank can reach (created if missing)
  std::string transport = "ucx";
  int bootstrap_timeout_ms = 60000;
  int timeout_ms = 60000;  // bound on every transfer and collective
  // How the prefill's ring sends K/V blocks (RingAttention::Options::wire): bf16 for a bf16 model
  // (its K/V are bf16 values: exact, half the bytes), fp32 otherwise.
  kernels::DType wire = kernels::DType::kF32;
  // The prefill's two levels (worker/ring/head_attention.h): groups of head_ranks ranks, the
  // ring over the groups; 1: one ring. The decode is sharded by tokens either way.
  int head_ranks = 1;
};

class GenerateRing {
 public:
  // Joins the ring (throws transport::TransportError when the transport cannot, GenerateError on
  // bad options). backend: the prefill's (RingAttention runs on it); it must outlive this object.
  GenerateRing(kernels::Backend* backend, const RingOptions& options);
  ~GenerateRing();
  GenerateRing(const GenerateRing&) = delete;
  GenerateRing& operator=(const GenerateRing&) = delete;

  int rank() const { return options_.rank; }
  int ranks() const { return options_.ranks; }
  // The generator's sharding over this ring (prompts cut with `balance`).
  ShardOptions shard(spec::CausalBalance balance);
  // Every rank's `bytes` at send into recv (ranks x bytes, rank order).
  void all_gather(const void* send, void* recv, size_t bytes);
  // The ring's attention executor (RingAttention): the training forward across the ranks.
  model::AttentionExecutor* attention();
  // Clean exit: returns once every rank has called it.
  void shutdown();

 private:
  RingOptions options_;
  std::unique_ptr<cp::RingRank> rank_;
  std::unique_ptr<cp::ContextAttention> attention_;
};

}  // namespace ring::gen
