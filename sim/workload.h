// One training step of a spec, as ringmaster runs it, reduced to what the simulator needs:
// per ring position the tokens it owns (common/cp/split.h), per (query position, K/V block)
// pair the attention work left after block and tile skipping, the rows of each dK/dV
// accumulator, the message sizes RingAttention sends (common/cp/ring_messages.h), the
// per-layer projection and MLP work, and the gradient buckets of the flat layout with their
// exchange sizes (common/plan: dense fp32, or top-k (index, value) pairs).
//
// Packed documents: the simulator cannot see the data, so with data.pack every document is
// taken to be max_doc_len tokens long (the longest the loader produces), packed back to back
// from position 0; without packing (or max_doc_len 0) the sequence is one causal document.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/plan/plan.h"
#include "common/spec/spec.h"
#include "common/cp/split.h"

namespace ring::sim {

struct Workload {
  // Ring and job shape.
  int64_t P = 1;               // ring size: context_ranks, or R = context_ranks / U groups
  int64_t D = 1;               // rings: data replicas, times U with head_ranks U
  // Two-level context parallelism (parallel.head_ranks U > 1, worker/ring/head_attention.h):
  // the simulator's rings are the U rings of each replica, one per head slot, between the same
  // slot of consecutive groups; ring d' = replica x U + slot, its position r = group r. A
  // position's tokens are its group's (U T), its heads, K/V heads and kvd the slot's (H / U,
  // cp::head_slot_kv_heads); projections and MLP stay per rank (T tokens, every head).
  int64_t head_ranks = 1;      // U
  int64_t replicas = 1;        // data replicas
  // Bytes one rank sends per all-to-all inside its group: (U - 1) messages of
  // cp::head_gather_bytes / head_return_bytes (forward, and backward).
  double a2a_gather_fwd = 0, a2a_return_fwd = 0, a2a_gather_bwd = 0, a2a_return_bwd = 0;
  int64_t nodes = 1, workers_per_node = 1;
  int64_t layers = 0, micro_batches = 1;
  int64_t seq_len = 0, doc_len = 0;
  spec::CausalBalance balance{};
  bool recompute = false;
  bool selective = false;      // recompute_policy selective: no attention, no ring hops re-run
  int64_t heads = 0, kv_heads = 0, head_dim = 0, d_model = 0, hidden = 0, vocab = 0;
  int64_t kvd = 0;             // kv_heads x head_dim
  std::vector<std::vector<cp::TokenRange>> ranges;  // [P] tokens of each ring position
  int64_t tokens = 0;          // per position (the largest)

  // FLOPs per rank and layer.
  double pre_fwd_flops = 0;    // QKV projections
  double post_fwd_flops = 0;   // output projection and MLP
  double selective_flops = 0;  // selective recompute: output projection and MLP gate/up
  double head_fwd_flops = 0;   // LM head (once per step)

  // Messages.
  double kv_block_bytes = 0;   // one packed K/V block (max tokens)

  // Gradient buckets (floats), layout order: head, layers L-1..0, embedding.
  std::vector<int64_t> bucket_floats;
  int64_t params = 0;          // floats in the flat buffer
  spec::Compression compression{};
  double density = 0;
  spec::ShardMode shard{};
  // parallel.shard full: every rank's shard and each bucket's gathers per micro-batch (common/plan
  // full_shard_layout, worker/ring/full_shard.h); empty otherwise.
  plan::FullShardLayout full_shard;
  bool topk_at_owner = true;   // optimizer.compress_at owner (sender: each node's own set)
  double grad_clip = 0;
  int64_t checkpoint_every = 0;
  bool checkpoint_async = false;
  int64_t stagger_us = 0;
  int64_t warmup_steps = 0;    // dense steps before top-k

  // Attention pairs allowed between the queries of position q and the keys of block `origin`
  // (causal, same document), and the rows [lo, hi) of the block some query of q attends to
  // (RingAttention::key_range: the hull; {0, 0} when none).
  double pairs(int64_t q, int64_t origin) const;
  std::pair<int64_t, int64_t> key_rows(int64_t q, int64_t origin) const;
  // Rows carried by block `origin`'s dK/dV accumulator after positions origin+1 .. origin+s
  // (mod P) added theirs: the union (hull) of their key_rows. s >= 1.
  int64_t dkv_rows(int64_t origin, int64_t s) const;
  // Bytes of the exchange of bucket b per node (dense fp32 or top-k pairs).
  double bucket_payload(size_t b) const;
  // True when every ring position has the same work at every step (zigzag or no causal
  // imbalance): the ring is then rotation-invariant for compute.
  bool compute_rotation_invariant() const { return rotation_invariant_; }

  void finish();  // computes the caches below; called by make_workload

 private:
  bool rotation_invariant_ = false;
  bool simple_causal_ = false;  // one document over the whole sequence
  mutable std::vector<std::vector<std::pair<int64_t, int64_t>>> hull_cache_;  // [origin][s]
};

// spec must be valid and resolved. Throws std::invalid_argument for a shape it cannot model.
Workload make_workload(const spec::JobSpec& s);

}  // namespace ring::sim
