// Two-level context parallelism (parallel.head_ranks U > 1): heads split over the U ranks of a
// group inside one node, the ring over the R = C / U groups (DeepSpeed-Ulysses inside, ring
// attention across, as USP and LoongTrain's 2D attention do).
//
// The C ranks of a sequence form R groups of U consecutive ranks (group r = ranks rU .. rU+U-1
// of the replica's communicator; head slot u = rank % U). Each rank holds its share of the
// tokens (worker/data/split.h, unchanged) with every head. A layer's attention:
//   1. all-to-all inside the group (transport.h all_to_all): rank a sends member b its tokens'
//      positions, document ids, and the query heads of slot b (heads / U of them) and their K/V
//      heads; afterwards each rank holds ALL of the group's tokens for its slot's heads. The
//      group's tokens are put in position order (a permutation: with zigzag a group's tokens are
//      two runs of consecutive chunks), so block skipping stays exact for packed documents.
//   2. ring attention (RingAttention, unchanged) over the R groups among the ranks of the same
//      slot: the ring of slot u is ranks u, U+u, 2U+u, ... in group order, with the exact fp32
//      log-sum-exp merge, zigzag balance and document masks as for a single ring. One hop per
//      group instead of one per rank: the inter-node ring carries U times fewer, U times larger
//      blocks of heads / U heads each.
//   3. all-to-all back: the slot's output (o, lse) rows return to the tokens' owners.
// The backward sends q, k, v, the forward's (o, lse) and dout the same way, runs the ring's
// backward, and returns dq, dk and dv. K/V heads: with U dividing kv_heads each slot owns
// kv_heads / U of them; with U a multiple of kv_heads each slot gets the one K/V head its query
// heads read (replicated on U / kv_heads slots), and the owner sums the slots' dK/dV for a
// replicated head in slot order (deterministic).
//
// q, k and v travel at the ring's wire dtype (bf16 for a bf16 model, whose q/k/v are bf16 values:
// exact); (o, lse), dout and the gradients travel fp32. Messages are host buffers, as the ring's
// are. Every rank of the communicator calls forward and backward for every layer (the groups'
// all-to-alls and the rings run side by side on one communicator, on disjoint pairs of ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/ring/ring_attention.h"

namespace ring::cp {

// Where this rank sits in the two levels.
struct HeadLayout {
  int head_ranks = 1;       // U
  int slot = 0;             // u: this rank's index in its group
  std::vector<int> group;   // [U] communicator ranks of this rank's group, slot order
  RingTopology ring;        // the ring of this slot over the groups (comm ranks)
};

// The layout of rank `rank` of a communicator of `world` ranks (C) with head_ranks U, the groups
// in the order their ranks first appear in `order` (a permutation of 0..C-1: the ring order the
// spec or the coordinator chose; natural order puts groups in rank order). Throws
// std::invalid_argument when U does not divide C or order is not a permutation.
HeadLayout make_head_layout(int rank, int world, int head_ranks, const std::vector<int>& order);

class HeadParallelAttention final : public ContextAttention {
 public:
  // progress (and its comm) and backend must outlive this object. The transport must have
  // all_to_all (transport.h); a plugin without it is refused here (std::invalid_argument naming
  // the plugin and parallel.head_ranks).
  HeadParallelAttention(kernels::Backend* backend, ProgressEngine* progress, HeadLayout layout,
                        RingAttention::Options options);

  void forward(const model::AttentionCall& call, float* out, float* lse) override;
  void backward(const model::AttentionCall& call, const float* out, const float* lse,
                const float* dout, float* dq, float* dk, float* dv) override;
  kernels::AttentionStats stats() const override { return ring_.stats(); }
  // The ring's counters (bytes_sent: the ring's, between groups) with the all-to-all's time and
  // bytes (a2a_s, a2a_bytes_sent: inside the group) added.
  RingStats ring_stats() const override;
  void reset_stats() override {
    ring_.reset_stats();
    a2a_s_ = 0;
    a2a_bytes_ = 0;
    a2a_calls_ = 0;
  }
  int ring_prev() const override { return layout_.ring.world > 1 ? layout_.ring.prev : -1; }
  const HeadLayout& layout() const { return layout_; }

 private:
  // Head geometry of a call: query heads per slot, K/V heads per slot, first K/V head of a slot.
  struct Heads {
    int64_t hq = 0, hkv = 0, hd = 0;
    int64_t kv0(int slot) const;
    int64_t heads = 0, kv_heads = 0;
    int u = 1;
  };
  Heads heads_of(const model::AttentionCall& call) const;
  // Layer 0 of every forward: every member's token count (an all-to-all of one count each).
  void exchange_counts(int64_t tokens, int layer);
  // One all-to-all inside the group; sizes in bytes per member.
  void all_to_all(const char* what, int layer, const std::vector<size_t>& send_bytes,
                  const std::vector<size_t>& recv_bytes);
  // Packs, for every member b, this rank's tokens' q/k/v heads of slot b (and positions, doc
  // ids; with `backward` also o, lse and dout of slot b); exchanges; assembles the group's
  // call in position order into g_*.
  model::AttentionCall gather(const model::AttentionCall& call, const Heads& h, bool backward,
                              const float* out, const float* lse, const float* dout);
  // Sends the rows of the group's tensors (parts of `widths` floats per token each, in
  // position order) back to their owners; `place` receives member b's part k as [T, width].
  void scatter(int layer, const std::vector<const float*>& parts,
               const std::vector<int64_t>& widths,
               const std::function<void(int slot, int part, const float* rows)>& place);

  kernels::Backend* backend_;
  ProgressEngine* progress_;
  HeadLayout layout_;
  RingAttention::Options options_;
  RingAttention ring_;

  std::vector<int64_t> tokens_of_;  // [U] token count of each member (this step)
  std::vector<int64_t> offset_of_;  // [U+1] prefix sums: member a's tokens are [off[a], off[a+1])
  std::vector<int64_t> perm_;       // [Tg] position order: group row i is concat row perm_[i]

  model::DeviceArray<char> send_, recv_;
  std::vector<size_t> send_off_, recv_off_;
  model::DeviceArray<float> stage_;  // concat-order fp32 rows before the permutation
  model::DeviceArray<int64_t> g_pos_;
  model::DeviceArray<int32_t> g_doc_;
  model::DeviceArray<float> g_q_, g_k_, g_v_, g_out_, g_lse_, g_dout_, g_dq_, g_dk_, g_dv_;

  double a2a_s_ = 0;
  int64_t a2a_bytes_ = 0, a2a_calls_ = 0;
};

// The context-parallel attention of a rank: one ring over the replica's ranks (head_ranks 1), or
// head groups and a ring over them. spec gives parallel.head_ranks; the ring order is the one
// ring (RingRank::ring()) already chose.
std::unique_ptr<ContextAttention> make_context_attention(kernels::Backend* backend,
                                                         ProgressEngine* progress,
                                                         const RingTopology& ring,
                                                         int head_ranks,
                                                         RingAttention::Options options);

}  // namespace ring::cp
