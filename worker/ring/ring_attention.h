// Ring attention: the AttentionExecutor of context parallelism. Each of the P ranks of a ring
// holds a share of one sequence (worker/data/split.h); its queries must attend to the keys of
// every rank. K/V blocks travel around the ring, each with its global positions and document ids,
// so any block can be masked exactly where it is used.
//
// Forward (P steps): at step s rank position i holds the block of position i-s (mod P). It posts
// irecv(next block from prev) and isend(this block to next) first, then computes its queries
// against the held block (attention_forward into a partial (o, lse)) while a ProgressEngine
// thread moves the transfer, and merges the partial into the running (out, lse) exactly in fp32
// (attention_merge). Blocks with no allowed (query, key) pair are skipped before any kernel call
// (an exact check from the sorted positions and document ids: some document must have a key no
// later than one of its queries); tiles inside computed blocks are skipped by the kernel.
//
// Backward (FlashAttention-2, recomputed from the final (out, lse) of the forward): dQ accumulates
// locally; K/V blocks travel the ring again (prefetched one step ahead, as in the forward) and
// each block's dK/dV accumulator follows it one hop behind: at step s a rank computes its partial
// dK/dV of the held block into zeroed scratch while the accumulator of that block is in flight
// from prev, then adds the two and sends the sum on. After P hops every accumulator is back at its
// owner, which adds its own partial (kept at home, not sent) - the sum over all ranks' queries.
// An accumulator carries only the key rows some rank has attended to so far (a row range; a
// 0-byte message while there are none): with short documents most foreign keys are never
// attended, and their dK/dV cost no bandwidth.
//
// Ring order is an input (RingTopology: a permutation of ranks); neighbours come from it. An
// optional stagger delays this rank's sends by position x stagger_us: the send is posted at the
// first poll point after that delay (never a sleep: the compute goes on meanwhile).
//
// Memory per rank: two packed K/V receive buffers, two dK/dV accumulators and one partial, sized
// for the largest rank share; allocated on first use and reused across layers and steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include "common/spec/spec.h"
#include "kernels/backend.h"
#include "plugins/transport/loader.h"
#include "worker/model/attention.h"
#include "worker/model/buffer.h"
#include "worker/ring/progress.h"

namespace ring::cp {

// Where this rank sits in the ring.
struct RingTopology {
  int rank = 0;            // this process's rank in the communicator
  int world = 1;           // P: positions of the ring
  std::vector<int> order;  // [P] ranks in ring order; K/V blocks pass order[i] -> order[i+1]
  int position = 0;        // index of rank in order
  int prev = 0;            // rank we receive from (order[position-1])
  int next = 0;            // rank we send to (order[position+1])
  // Ranks of the communicator: P, or more when the ring is one of several on it (head-parallel
  // attention runs one ring per head slot, over the groups' ranks of that slot). Every rank of
  // the communicator takes part in the token-count exchange of layer 0.
  int comm_world = 1;
};

// Builds the topology from an explicit order (a permutation of 0..world-1; throws
// std::invalid_argument naming the problem otherwise).
RingTopology make_ring(int rank, int world, const std::vector<int>& order);

// A ring over some of a communicator's comm_world ranks: order lists distinct ranks of
// 0..comm_world-1, rank among them (std::invalid_argument naming the problem otherwise).
RingTopology make_sub_ring(int rank, int comm_world, const std::vector<int>& order);

// The order the spec asks for: natural (0..P-1) or list (parallel.ring_order_list). topology and
// slurm orders come from ringd and the coordinator (common/topology): they are given as natural here and
// *note says so (empty otherwise).
std::vector<int> ring_order_from_spec(const spec::ParallelSection& p, int world,
                                      std::string* note);

// Communication and compute accounting of one RingAttention, since construction.
struct RingStats {
  int64_t hops = 0;            // messages sent (K/V blocks and dK/dV accumulators)
  int64_t bytes_sent = 0;
  int64_t blocks_total = 0;    // (query block, K/V block) pairs met, forward and backward
  int64_t blocks_skipped = 0;  // pairs with no allowed (q, k) pair: no kernel call
  double compute_s = 0;        // time in kernels (attention, merge, adds)
  double wait_s = 0;           // time blocked in wait() after the compute ran out
  double recv_wait_s = 0;      // of wait_s: blocked on a receive (the sender is late)
  double send_wait_s = 0;      // of wait_s: blocked on a send
  double stagger_s = 0;        // of wait_s: time spent holding back a staggered send
  double wait_cpu_s = 0;       // the waiting thread's CPU time in wait_s (its polling)
  // Head-parallel attention (parallel.head_ranks > 1) only: the all-to-alls inside the group.
  int64_t a2a_calls = 0;
  int64_t a2a_bytes_sent = 0;  // to the other members of the group (inside the node)
  double a2a_s = 0;            // time in the all-to-alls (blocking: not hidden)
};

// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), seconds: what the scheduler gave it,
// against wall time the share of a core it got (ranks that share cores).
double thread_cpu_seconds();

// A K/V block from another rank for the compute-only (no communication) measurement mode.
struct BlockView {
  int64_t tokens = 0;
  const float* k = nullptr;            // [tokens, kv_heads, head_dim]
  const float* v = nullptr;            // [tokens, kv_heads, head_dim]
  const int64_t* positions = nullptr;  // [tokens]
  const int32_t* doc_ids = nullptr;    // [tokens] or nullptr
};

// The attention of context parallelism as a rank's step sees it: the model's executor plus the
// ring's counters. One ring (RingAttention) or head groups with a ring over them
// (HeadParallelAttention, worker/ring/head_attention.h).
class ContextAttention : public model::AttentionExecutor {
 public:
  virtual RingStats ring_stats() const = 0;
  virtual void reset_stats() = 0;
  // The communicator rank this rank's ring receives from (-1: no ring), for straggler
  // attribution (a slow rank makes its ring successor wait).
  virtual int ring_prev() const = 0;
};

class RingAttention final : public ContextAttention {
 public:
  struct Options {
    int64_t stagger_us = 0;  // per ring position: position x stagger_us
    int timeout_ms = 60000;  // bound on each wait for a transfer
    int rank_offset = 0;     // global rank of ring rank 0 (the timeline names global ranks)
    // How K and V travel: kF32, or kBF16 (half the bytes) for a model whose K/V values are
    // bf16 already (model.dtype bf16 rounds them after RoPE): the conversion is then exact both
    // ways and the ring's results are bit-identical to an fp32 wire. Received blocks are
    // widened to fp32 before the kernels read them. dK/dV always travel fp32.
    kernels::DType wire = kernels::DType::kF32;
    // How the dK/dV accumulators travel: kF32 (the default, chosen: docs/precision.md "dK/dV on
    // the ring"), or kBF16 - each receiver widens the incoming rows, adds its fp32 partial and
    // rounds the sum once to send it on (fp32 accumulation, one rounding per hop).
    kernels::DType dkv_wire = kernels::DType::kF32;
  };

  // progress (and its comm, a host-memory transport) and backend must outlive this object.
  RingAttention(kernels::Backend* backend, ProgressEngine* progress, RingTopology ring,
                Options options);

  void forward(const model::AttentionCall& call, float* out, float* lse) override;
  void backward(const model::AttentionCall& call, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv) override;
  kernels::AttentionStats stats() const override { return kstats_; }

  RingStats ring_stats() const override { return rstats_; }
  int ring_prev() const override { return ring_.world > 1 ? ring_.prev : -1; }
  const RingTopology& ring() const { return ring_; }
  void reset_stats() override {
    rstats_ = {};
    kstats_ = {};
  }

  // Benchmark mode: no communication at all. At ring step s the block of ring position
  // (position - s) mod P is taken from source(layer, origin_position) instead of the network;
  // the same kernels run on the same blocks (dK/dV of foreign blocks are computed and dropped,
  // so the gradients are not the ring's). Token counts must be set with set_token_counts.
  using BlockSource = std::function<BlockView(int layer, int origin_position)>;
  void set_compute_only(BlockSource source, std::vector<int64_t> tokens_by_position);

 private:
  // A packed block, 64-byte aligned parts: [header][positions T x int64][doc ids T x int32]
  // [K T x kvd][V T x kvd] (Options::wire), T = tokens of the block, kvd = kv_heads * head_dim.
  struct Header {
    int64_t tokens;
    int64_t origin;  // ring position of the owner
    int64_t layer;
    int64_t has_docs;
  };
  struct Block {
    int64_t tokens = 0;
    int origin = 0;
    const int64_t* pos = nullptr;
    const int32_t* doc = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
  };
  struct Offsets {
    size_t pos, doc, k, v, total;
  };
  Offsets offsets(int64_t tokens) const;
  void prepare(const model::AttentionCall& call);
  Block local_block(const model::AttentionCall& call) const;
  void pack_local(const model::AttentionCall& call);
  Block unpack(const char* buf, const model::AttentionCall& call, int origin, int step,
               size_t received, int buf_index);
  Block block_at(int step, const model::AttentionCall& call, int buf_index, size_t received);
  bool any_allowed(const model::AttentionCall& call, const Block& b) const;
  // Rows [lo, hi) of the block's keys that some query of this rank may attend to (lo == hi:
  // none); exact for packed sequences, the whole block when the order is not monotonic.
  std::pair<int64_t, int64_t> key_range(const model::AttentionCall& call, const Block& b) const;
  kernels::AttentionArgs args(const model::AttentionCall& call, const Block& b) const;
  void exchange_token_counts(int64_t tokens);

  // Transfers of one step; handle -1 = none.
  int send_kv(int buf_index, size_t bytes, uint32_t tag);
  int recv_kv(int buf_index, uint32_t tag);
  // Waits for a transfer of ring step `step` (the hop) and records it in the process's timeline
  // (contract/timeline.h: the send or receive from post to completion, and for a receive the
  // blocked part as a wait on `peer`).
  size_t finish(int* handle, const char* what, int peer, int layer, int step, bool recv);
  void posted(int handle);  // remembers when a transfer was posted (the timeline's hop start)
  static constexpr int kMaxTracked = 64;
  int64_t posted_ns_[kMaxTracked] = {};

  kernels::Backend* backend_;
  ProgressEngine* progress_;
  RingTopology ring_;
  Options options_;
  BlockSource compute_only_;

  std::vector<int64_t> tokens_of_;  // [P] token count of each ring POSITION (this step)
  int64_t max_tokens_ = 0;
  int64_t kvd_ = 0;

  model::DeviceArray<char> kv_buf_[2];    // packed blocks, double buffered
  model::DeviceArray<float> kv_wide_[2];  // a bf16 wire's received K and V widened, [2, T, kvd]
  // dK/dV accumulator messages, received and sent (double buffered): 64-byte header {lo, hi},
  // then dK rows [lo, hi) and dV rows [lo, hi) of the block, [hi-lo, kvd] fp32 each; rows
  // outside are zero. No contribution yet: a 0-byte message.
  model::DeviceArray<char> dkv_in_[2], dkv_out_[2];
  model::DeviceArray<float> dkv_part_;    // [2 x T_max x kvd]: this rank's partial
  model::DeviceArray<float> dkv_wide_;    // a bf16 dK/dV wire: incoming rows widened
  model::DeviceArray<float> dkv_sum_;     // a bf16 dK/dV wire: the fp32 sum before rounding
  model::DeviceArray<float> dkv_own_;     // [2 x T x kvd]: this rank's partial of its own block
  model::DeviceArray<float> part_out_;    // [T, heads, head_dim]
  model::DeviceArray<float> part_lse_;    // [T, heads]
  model::DeviceArray<float> delta_;       // [T, heads]

  kernels::AttentionStats kstats_;
  RingStats rstats_;
};

}  // namespace ring::cp
