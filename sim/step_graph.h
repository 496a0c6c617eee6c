// The task graph of one training step (internal to ring_sim; sim/simulate.cc builds it from the
// stages of sim/step_plan.h and sim/step_summary.h reads it):
//
//   StepGraph g(spec, w, rates, cluster, placement.slot, what_ifs, traffic, simulated, net,
//               &res.notes);
//   g.build();                        // every micro-batch's passes, then ringd's pipeline
//   const double end = g.engine().run();
//   summarize(g, ..., &res);          // sim/step_summary.h, from g.records()
//
// Per simulated position and layer the projections, P attention blocks with the ring's K/V
// hops between them, the backward's K/V hops and dK/dV accumulators one hop behind; with
// parallel.shard full the block all-gathers and gradient reduce-scatters of
// worker/ring/full_shard.h; the LM head; then per gradient bucket ringd's node exchange, AdamW,
// and the checkpoint amortised.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/plan/plan.h"
#include "common/spec/spec.h"
#include "sim/cluster.h"
#include "sim/engine.h"
#include "sim/rates.h"
#include "sim/step_plan.h"
#include "sim/workload.h"

namespace ring::sim::detail {

// The phase of a task (Task::phase): what the critical path and the trace name it.
enum Phase : int {
  kSync = 0,
  kProjFwd,
  kAttnFwd,
  kHopFwd,
  kHead,
  kProjBwd,
  kAttnBwd,
  kHopBwdKv,
  kHopDkv,
  kExchange,
  kOptimizer,
  kCheckpoint,
  kProjRecompute,
  kAttnRecompute,
  kHopRecompute,
  kGather,
  kScatter,
  kHeadA2a,
  kPhaseCount
};
const char* phase_name(int p);

// What the summary reads: task ids of the representative rank (simulated position 0) and of
// ringd, and the figures the graph's construction already knows.
struct StepRecords {
  // Last micro-batch, per layer: the first and last task of the forward and the backward.
  std::vector<int> layer_fwd_begin, layer_fwd_end, layer_bwd_begin, layer_bwd_end;
  int fwd_end0 = -1, head_task0 = -1;
  int backward_done = -1;  // ringd has every bucket
  // Every ring transfer position 0 takes part in, sent or received (K/V hops of every pass,
  // dK/dV accumulators), with the task at whose end position 0 posted it: (posted, flow). The
  // summary's ring communication (their union) and what of it is hidden.
  std::vector<std::pair<int, int>> ring_ops0;
  // head_ranks > 1: position 0's all-to-alls inside its group, (posted, done: its sends and
  // receives in), and the bytes it sent in them.
  std::vector<std::pair<int, int>> a2a_ops0;
  double a2a_bytes0 = 0;
  // K/V and dK/dV sends and the joins at which their senders posted them (the step's start),
  // for the hop time as the worker's timeline records it (posted to completed).
  std::vector<std::pair<int, int>> posted_fwd, posted_bwd, posted_dkv;
  std::vector<int> bucket_ready;  // per bucket: ringd may start its exchange
  std::vector<int> x_tasks;       // per bucket: its exchange done
  double opt_total = 0;           // AdamW seconds (the largest node's with shard full)
  int last_opt = -1;              // the optimizer done
  double ckpt = 0;                // checkpoint seconds, amortised
  // Shard full, position 0: (post, done, arrived) per gather, (start, xfer, enter) per scatter;
  // bytes it received in the gathers and sent in the reduce-scatters (full simulation).
  std::vector<std::array<int, 3>> gather_rec, scatter_rec;
  double shard_gathered0 = 0, shard_scattered0 = 0;
  int64_t world_rank0 = 0;        // position 0's world rank (shard index)
};

class StepGraph {
 public:
  // Every argument must outlive the graph. Adds a note to *notes when the nodes share a host.
  StepGraph(const spec::JobSpec& spec, const Workload& w, const Rates& rt, const Cluster& cl,
            const std::vector<std::pair<int, int>>& slot, const WhatIfs& what_ifs,
            const RingTraffic& traffic, const Simulated& sim, const EngineNetwork& net,
            std::vector<std::string>* notes);
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Every micro-batch's passes, then ringd's exchange, optimizer and checkpoint. Once.
  void build();

  Engine& engine() { return e_; }
  const Engine& engine() const { return e_; }
  const StepRecords& records() const { return rec_; }
  // Tracks from this one on are ringd's (its exchange flows on the ones after).
  int track_ringd() const { return track_ringd_; }

 private:
  // A reduce-scatter in flight.
  struct Scatter {
    std::vector<int> enter, xfer, fin;  // per position: entered finish, its transfers done, both
    int all = -1;                       // every owner's receives done
  };
  // One owner worker's receives of a reduce-scatter, in world-rank order.
  struct ScatterChain {
    int64_t q = 0;            // the owner's world rank
    double bytes = 0;         // of one part
    int orep = -1;            // the simulated position that stands for the owner
    int chain = -1;           // join: every receive done
    int d1 = -1, d2 = -1;     // the last two receives (the window)
    int64_t posted = 0;       // senders received so far
    const std::vector<int>* start = nullptr;  // per position: its grads are done
    int start_all = -1;       // every position's grads are done
    int layer = -1;
    Scatter* sc = nullptr;
  };

  // Set-up.
  void add_shared_host(std::vector<std::string>* notes);
  void index_shard_ranks();
  // Compute seconds of simulated position i (its straggler factor included).
  double attn_fwd_s(int64_t i, int64_t s) const;
  double attn_bwd_s(int64_t i, int64_t s) const;
  double gemm_s(int64_t i, double flops) const;
  double gemm_bwd_s(int64_t i, double flops) const;

  // Shard full: routes between world ranks, cached.
  int route_between(int64_t a, int64_t b);
  int route_fold(int64_t q, bool own_node);
  int route_into(int64_t a, int64_t q);
  std::vector<int> shard_gather(size_t b, const std::vector<int>& post, int layer);
  int fold_gather(int64_t q, int64_t l, bool own, int64_t count, double bytes, int src_post,
                  const std::vector<int>& done, int layer);
  Scatter shard_scatter(size_t b, const std::vector<int>& start, int layer);
  void scatter_receive(ScatterChain* c, int64_t first, int sender, int64_t count);
  void scatter_run(ScatterChain* c, int64_t lo, int64_t hi);
  void acquire(size_t next, int layer);
  void finish_scatter();
  void start_scatter(size_t b, int layer, bool last_micro);
  size_t layer_bucket(int64_t l) const { return static_cast<size_t>(1 + (L_ - 1 - l)); }

  // The passes.
  void micro_batch(int64_t m);
  void begin_shard_pass();
  void lm_head(bool last);
  void forward_layer(int64_t l, bool recompute, bool last_micro);
  // Selective recompute of layer l: the output projection and MLP gate/up GEMMs only.
  void selective_recompute(int64_t l);
  void forward_step(int64_t l, int64_t s, bool recompute);
  void backward_layer(int64_t l, bool last_micro);
  void backward_step(int64_t l, int64_t s);
  void backward_layer_end(int64_t l, bool last_micro);
  void record_ring_ops0(const std::vector<int>& sends, int send_posted, int recv_posted);
  // head_ranks > 1: an all-to-all inside every simulated position's group of `bytes` per rank
  // (all its messages), after cur_; cur_ becomes its end (blocking).
  void head_all_to_all(double bytes, int64_t l);
  void index_head_groups();
  int all_positions_join();

  // ringd.
  void model_route(int r);
  void model_routes();
  int collective(int64_t steps, double chunk, int after);
  int exchange_bucket(size_t b, int after);
  void optimize_bucket(size_t b, int x);
  void optimize_after_exchange();
  void checkpoint();

  const Workload& w_;
  const Rates& rt_;
  const Cluster& cl_;
  const std::vector<std::pair<int, int>>& slot_;
  const WhatIfs& wi_;
  const RingTraffic& traffic_;
  const Simulated& sim_;
  const EngineNetwork& net_;
  const bool tie_embeddings_;
  const int64_t P_, N_, wpn_, W_, L_, M_, S_;
  const bool full_, fullshard_;
  const double heads_hd_, gemm_bwd_rate_;
  const int dev_opt_, track_ringd_;  // ringd's devices (S.. S + opt_devices_ - 1) and tracks
  const int64_t opt_devices_;        // shared host: every node's ringd; else one for all
  const plan::FullShardLayout& fs_;
  const int64_t place_node_;         // reduced, shard full: the node every bucket's parts are on

  Engine e_;
  StepRecords rec_;
  std::vector<int> route_fwd_, route_bwd_;  // per position: its K/V hop's engine route
  // head_ranks > 1, per position: the route to the next member of its group (its all-to-all
  // sends, one flow of all its messages: each member's links inside the node carry (U - 1)
  // messages out and in, as in the all-to-all) and the simulated position of the previous
  // member (whose flow brings its receives); -1 when not simulated.
  std::vector<int> a2a_route_, a2a_from_;
  int host_id_ = -1;

  // The passes: per position the task its next work waits for, and the ring step's state.
  std::vector<int> prev_end_;
  std::vector<int> cur_, nstart_, blk_, kv_, dsend_, dsend1_, dsend2_, djoin_;

  // Shard full (see shard_gather in step_graph.cc).
  std::vector<int64_t> wr_of_sim_;  // the world rank (shard index) of each simulated position
  std::vector<int> sim_of_wr_;      // and back; -1 when not simulated
  std::vector<int> rep_local_;      // a simulated position per local GPU
  std::vector<std::pair<int64_t, int>> sim_sorted_;  // (world rank, simulated position), ascending
  std::unordered_map<int64_t, int> pair_route_;      // src world rank x W + dst world rank
  std::unordered_map<int64_t, int> fold_route_;      // src world rank x 2 + (1: own node)
  std::vector<int> shard_routes_;
  std::vector<int> pending_;            // the gather in flight (prefetched), per position
  std::optional<Scatter> rs_open_;
  std::vector<int> rs_all_;             // per bucket: the last micro-batch's reduce-scatter

  // ringd.
  std::vector<int> xroutes_;  // the simulated nodes' exchange routes
  int prev_x_ = -1;
  std::vector<double> node_opt_;  // shard full: AdamW seconds per node
  int opt_join_ = -1;
};

}  // namespace ring::sim::detail
