#include "sim/step_graph.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/cp/ring_messages.h"
#include "common/plan/plan.h"
#include "fmt/format.h"

namespace ring::sim::detail {

namespace {

// Buckets: head, layers L-1..0, embedding (StepGraph::layer_bucket).
constexpr size_t kHeadBucket = 0;
constexpr int64_t kShardExplicitFlows = 512;  // per gather, reduced: senders x receivers

}  // namespace

const char* phase_name(int p) {
  static const char* names[] = {"wait/sync",           "projections+MLP forward",
                                "attention forward",   "ring K/V hop (forward)",
                                "LM head",             "projections+MLP backward",
                                "attention backward",  "ring K/V hop (backward)",
                                "ring dK/dV hop",      "gradient exchange",
                                "optimizer (host AdamW)", "checkpoint (amortised)",
                                "projections+MLP recompute", "attention recompute",
                                "ring K/V hop (recompute)",
                                "shard full: block all-gather",
                                "shard full: gradient reduce-scatter",
                                "head all-to-all (inside the node)"};
  return names[p];
}

StepGraph::StepGraph(const spec::JobSpec& spec, const Workload& w, const Rates& rt,
                     const Cluster& cl, const std::vector<std::pair<int, int>>& slot,
                     const WhatIfs& what_ifs, const RingTraffic& traffic, const Simulated& sim,
                     const EngineNetwork& net, std::vector<std::string>* notes)
    : w_(w),
      rt_(rt),
      cl_(cl),
      slot_(slot),
      wi_(what_ifs),
      traffic_(traffic),
      sim_(sim),
      net_(net),
      tie_embeddings_(spec.model.tie_embeddings),
      P_(w.P),
      N_(w.nodes),
      wpn_(w.workers_per_node),
      W_(w.P * w.D),
      L_(w.layers),
      M_(w.micro_batches),
      S_(sim.S),
      full_(sim.full),
      fullshard_(traffic.fullshard),
      heads_hd_(static_cast<double>(w.heads * w.head_dim)),
      gemm_bwd_rate_(rt.gemm_bwd_flops > 0 ? rt.gemm_bwd_flops : rt.gemm_flops),
      dev_opt_(static_cast<int>(sim.S)),
      track_ringd_(static_cast<int>(sim.S)),
      opt_devices_(cl.host_cores() > 0 ? w.nodes : 1),
      fs_(w.full_shard),
      // Reduced, every bucket's parts are placed on the first simulated position's node: while
      // a block is gathered its owner node's NICs carry its flows to every rank, and the ring
      // through that node slows with them; as the gathers hold all ranks in step, the ring
      // that holds the owner paces each layer, and the simulated ring stands for it.
      place_node_(slot[sim.grank[0]].first),
      e_(&cl.net(), net.ecap) {
  route_fwd_.assign(S_, -1);
  route_bwd_.assign(S_, -1);
  if (P_ > 1)
    for (int64_t i = 0; i < S_; ++i)
      route_fwd_[i] = route_bwd_[i] = e_.add_route(traffic.hop_route[sim.grank[i]]);
  if (cl.host_cores() > 0) add_shared_host(notes);
  if (w.head_ranks > 1) index_head_groups();
  prev_end_.assign(S_, -1);
  rec_.layer_fwd_begin.assign(L_, -1);
  rec_.layer_fwd_end.assign(L_, -1);
  rec_.layer_bwd_begin.assign(L_, -1);
  rec_.layer_bwd_end.assign(L_, -1);
  for (std::vector<int>* v : {&cur_, &nstart_, &blk_, &kv_, &djoin_}) v->assign(S_, 0);
  for (std::vector<int>* v : {&dsend_, &dsend1_, &dsend2_}) v->assign(S_, -1);
  wr_of_sim_.assign(S_, 0);
  rep_local_.assign(std::max<int64_t>(wpn_, 1), 0);
  if (fullshard_) index_shard_ranks();
  rec_.world_rank0 = wr_of_sim_[0];
  rs_all_.assign(w.bucket_floats.size(), -1);
  rec_.bucket_ready.assign(w.bucket_floats.size(), -1);
  node_opt_.assign(fullshard_ ? N_ : 0, 0.0);
}

// Simulated global rank g = (replica U + slot) R + group (workload.h): the next member of its
// group has slot + 1 (mod U).
void StepGraph::index_head_groups() {
  const int64_t U = w_.head_ranks;
  a2a_route_.assign(S_, -1);
  a2a_from_.assign(S_, -1);
  auto member = [&](int64_t g, int64_t step) {
    const int64_t ring = g / P_, r = g % P_, d = ring / U, a = ring % U;
    return (d * U + (a + step + U) % U) * P_ + r;
  };
  // Reduced, every slot ring of the simulated groups is simulated too (choose_simulated).
  std::vector<int> of_rank(W_, -1);
  for (int64_t i = 0; i < S_; ++i) of_rank[sim_.grank[i]] = static_cast<int>(i);
  for (int64_t i = 0; i < S_; ++i) {
    const int64_t g = sim_.grank[i], to = member(g, 1);
    a2a_route_[i] = e_.add_route(cl_.route(slot_[g].first, slot_[g].second, slot_[to].first, slot_[to].second));
    a2a_from_[i] = of_rank[member(g, -1)];
  }
}

// The all-to-all blocks the rank (head_attention.cc waits for it): its flow starts when it and
// the member it sends to have posted; its end is when its flow and the one into it are done
// (every member of a simulated group is simulated, full or reduced).
void StepGraph::head_all_to_all(double bytes, int64_t l) {
  std::vector<int> f(S_), done(S_);
  for (int64_t i = 0; i < S_; ++i) {
    f[i] = e_.flow(a2a_route_[i], bytes, static_cast<int>(i), kHeadA2a, static_cast<int>(l));
    e_.depend(f[i], cur_[i]);
  }
  for (int64_t i = 0; i < S_; ++i)
    if (a2a_from_[i] >= 0) e_.depend(f[a2a_from_[i]], cur_[i]);  // the receive's post
  for (int64_t i = 0; i < S_; ++i) {
    done[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(done[i], f[i]);
    if (a2a_from_[i] >= 0) e_.depend(done[i], f[a2a_from_[i]]);
  }
  rec_.a2a_ops0.emplace_back(cur_[0], done[0]);
  rec_.a2a_bytes0 += bytes;
  cur_.swap(done);
}

// Shared host: the ranks' devices and every node's ringd (devices S .. S+N-1) divide the host's
// cores: measured speeds per number of concurrent processes (calibration host_speed), else
// host_cores ideal cores (min(1, cores / n)).
void StepGraph::add_shared_host(std::vector<std::string>* notes) {
  std::vector<double> speed = rt_.host_speed;
  if (speed.empty())
    for (int n = 1; n <= 1024; ++n) speed.push_back(std::min(1.0, cl_.host_cores() / n));
  // Ranks poll while they wait for a transfer (worker/ring/progress.cc): each idle rank
  // device loads the host as host_poll_load processes.
  const int h = e_.add_host(speed, rt_.host_poll_load);
  host_id_ = h;
  for (int64_t i = 0; i < S_ + opt_devices_; ++i) e_.set_device_host(static_cast<int>(i), h, i < S_);
  notes->push_back(
      rt_.host_speed.empty()
          ? fmt::format("all nodes share one host of {:g} cores: concurrent compute divides them",
                        cl_.host_cores())
          : fmt::format("all nodes share one host: concurrent compute runs at the calibrated "
                        "host_speed (measured for 1..{} processes at once), a waiting rank "
                        "loading it as {:.3g} process",
                        rt_.host_speed.size(), rt_.host_poll_load));
}

// ---- parallel.shard full (worker/ring/full_shard.h): block all-gathers and gradient
// reduce-scatters, point to point over all W ranks (rank q = node q / wpn, local q % wpn; its
// shard from common/plan full_shard_layout, the division contract::worker_shards makes). A
// node's range is whole buckets, so a bucket's parts are on its owner node's workers only.
// Reduced, the ranks not simulated are folded: a sender's flows to them are one flow on the
// first link of its route (its NIC, or its NVLink for its own node) that stands for all of
// them (weighted max-min: as many shares as flows); a run of senders between two simulated
// ones in a reduce-scatter's receive order is one flow into the owner (the last link of the
// route from the run's first sender) that takes the receive window's two places. They wait on
// the simulated ranks' posts (ranks are alike).
void StepGraph::index_shard_ranks() {
  sim_of_wr_.assign(W_, -1);
  std::vector<char> have(wpn_, 0);
  for (int64_t i = S_ - 1; i >= 0; --i) {
    const auto [k, l] = slot_[sim_.grank[i]];
    wr_of_sim_[i] = static_cast<int64_t>(k) * wpn_ + l;
    sim_of_wr_[wr_of_sim_[i]] = static_cast<int>(i);
    rep_local_[l] = static_cast<int>(i);
    have[l] = 1;
  }
  for (int64_t l = 0; l < wpn_; ++l)
    if (!have[l]) rep_local_[l] = static_cast<int>(l % S_);
  for (int64_t i = 0; i < S_; ++i) sim_sorted_.emplace_back(wr_of_sim_[i], static_cast<int>(i));
  std::sort(sim_sorted_.begin(), sim_sorted_.end());
}

double StepGraph::attn_fwd_s(int64_t i, int64_t s) const {
  const std::vector<int64_t>& pos = sim_.pos;
  const int64_t origin = (pos[i] - s % P_ + P_) % P_;
  return w_.pairs(pos[i], origin) * 4 * heads_hd_ / rt_.attention_fwd_flops * wi_.factor[sim_.grank[i]];
}
double StepGraph::attn_bwd_s(int64_t i, int64_t s) const {
  const std::vector<int64_t>& pos = sim_.pos;
  const int64_t origin = (pos[i] - s % P_ + P_) % P_;
  return w_.pairs(pos[i], origin) * 10 * heads_hd_ / rt_.attention_bwd_flops * wi_.factor[sim_.grank[i]];
}
double StepGraph::gemm_s(int64_t i, double flops) const {
  return flops / rt_.gemm_flops * wi_.factor[sim_.grank[i]];
}
double StepGraph::gemm_bwd_s(int64_t i, double flops) const {
  return flops / gemm_bwd_rate_ * wi_.factor[sim_.grank[i]];
}

int StepGraph::route_between(int64_t a, int64_t b) {  // world ranks
  const int64_t key = a * W_ + b;
  auto it = pair_route_.find(key);
  if (it != pair_route_.end()) return it->second;
  const int r = e_.add_route(cl_.route(static_cast<int>(a / wpn_), static_cast<int>(a % wpn_),
                                       static_cast<int>(b / wpn_), static_cast<int>(b % wpn_)));
  shard_routes_.push_back(r);
  pair_route_.emplace(key, r);
  return r;
}

int StepGraph::route_fold(int64_t q, bool own_node) {  // the first link of q's sends
  const int64_t key = q * 2 + (own_node ? 1 : 0);
  auto it = fold_route_.find(key);
  if (it != fold_route_.end()) return it->second;
  const int k = static_cast<int>(q / wpn_), l = static_cast<int>(q % wpn_);
  const std::vector<int> full_route =
      own_node ? cl_.route(k, l, k, static_cast<int>((l + 1) % wpn_))
               : cl_.route(k, l, static_cast<int>((k + 1) % N_), l);
  const int r = e_.add_route(full_route.empty() ? std::vector<int>{} : std::vector<int>{full_route.front()});
  shard_routes_.push_back(r);
  fold_route_.emplace(key, r);
  return r;
}

int StepGraph::route_into(int64_t a, int64_t q) {  // the last link of a's route to q
  const int64_t key = -(a * W_ + q) - 1;
  auto it = pair_route_.find(key);
  if (it != pair_route_.end()) return it->second;
  const std::vector<int> whole = cl_.route(static_cast<int>(a / wpn_), static_cast<int>(a % wpn_),
                                           static_cast<int>(q / wpn_), static_cast<int>(q % wpn_));
  const int r = e_.add_route(whole.empty() ? std::vector<int>{} : std::vector<int>{whole.back()});
  shard_routes_.push_back(r);
  pair_route_.emplace(key, r);
  return r;
}

// Gather of bucket b: post[i] is when position i posts it (its receives and sends); returns
// per position the join of its transfers (acquire returns then).
std::vector<int> StepGraph::shard_gather(size_t b, const std::vector<int>& post, int layer) {
  std::vector<int> done(S_);
  for (int64_t i = 0; i < S_; ++i) {
    done[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(done[i], post[i]);
  }
  const int64_t kr = fs_.owner[b], k = full_ ? kr : place_node_;
  int64_t senders = 0;
  for (int64_t l = 0; l < wpn_; ++l) senders += fs_.part(b, kr * wpn_ + l) > 0;
  // Many simulated receivers (reduced): every one of them is folded too, its gather done when
  // its sender's folded flow is (a gather's flows are paced by the senders' links, each
  // sending to all W - 1 ranks), which keeps the max-min components small.
  const bool fold_all = !full_ && S_ * senders > kShardExplicitFlows;
  for (int64_t l = 0; l < wpn_; ++l) {
    const int64_t q = k * wpn_ + l;
    const int64_t part = fs_.part(b, kr * wpn_ + l);
    if (part == 0) continue;
    const double bytes = fs_.gather_message_bytes(b, kr * wpn_ + l);  // the model's dtype
    const int si = sim_of_wr_[q];
    const int src_post = post[si >= 0 ? si : rep_local_[l]];
    int64_t sim_remote = 0, sim_local = 0;
    if (fold_all) {
      const int fr = fold_gather(q, l, false, W_ - wpn_, bytes, src_post, done, layer);
      const int fl = fold_gather(q, l, true, wpn_ - 1, bytes, src_post, done, layer);
      for (int64_t i = 0; i < S_; ++i) {
        if (wr_of_sim_[i] == q) continue;
        const int f = wr_of_sim_[i] / wpn_ == k ? fl : fr;
        e_.depend(done[i], f);
        if (i == 0) rec_.shard_gathered0 += bytes;
      }
      continue;
    }
    for (int64_t i = 0; i < S_; ++i) {
      if (wr_of_sim_[i] == q) continue;
      const int f = e_.flow(route_between(q, wr_of_sim_[i]), bytes, static_cast<int>(i), kGather, layer);
      e_.depend(f, post[i]);
      e_.depend(f, src_post);
      e_.depend(done[i], f);
      if (si >= 0) e_.depend(done[si], f);
      if (i == 0) rec_.shard_gathered0 += bytes;
      (wr_of_sim_[i] / wpn_ == k ? sim_local : sim_remote) += 1;
    }
    fold_gather(q, l, false, (W_ - wpn_) - sim_remote, bytes, src_post, done, layer);
    fold_gather(q, l, true, (wpn_ - 1) - sim_local, bytes, src_post, done, layer);
  }
  return done;
}

// One weighted flow of sender q (local GPU l) standing for `count` alike receivers of its part
// that are not simulated, off the owner's node (own false) or on it; -1 when there are none.
int StepGraph::fold_gather(int64_t q, int64_t l, bool own, int64_t count, double bytes,
                           int src_post, const std::vector<int>& done, int layer) {
  if (count <= 0) return -1;
  const int si = sim_of_wr_[q];
  const int f = e_.flow(route_fold(q, own), bytes * static_cast<double>(count),
                        si >= 0 ? si : rep_local_[l], kGather, layer);
  e_.set_weight(f, static_cast<double>(count));
  e_.depend(f, src_post);
  if (si >= 0) e_.depend(done[si], f);
  return f;
}

// Reduce-scatter of bucket b, started at start[i] (grads_done). Each owner worker receives
// the parts in world-rank order through a window of two receives; a receive after the first
// two is posted once the one two places before it is in and the owner's main thread is in
// finish_scatter (enter: the store's next grads / grads_done / end_pass, to depend on later).
StepGraph::Scatter StepGraph::shard_scatter(size_t b, const std::vector<int>& start, int layer) {
  Scatter sc;
  sc.enter.resize(S_);
  sc.xfer.resize(S_);
  sc.fin.resize(S_);
  const int start_all = e_.join(track_ringd_, kSync);
  for (int64_t i = 0; i < S_; ++i) {
    sc.enter[i] = e_.join(static_cast<int>(i), kSync);
    sc.xfer[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(sc.xfer[i], start[i]);
    sc.fin[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(sc.fin[i], sc.xfer[i]);
    e_.depend(sc.fin[i], sc.enter[i]);
    e_.depend(start_all, start[i]);
  }
  sc.all = e_.join(track_ringd_, kScatter);
  const int64_t kr = fs_.owner[b], k = full_ ? kr : place_node_;
  for (int64_t l = 0; l < wpn_; ++l) {
    const int64_t part = fs_.part(b, kr * wpn_ + l);
    if (part == 0) continue;
    ScatterChain c;
    c.q = k * wpn_ + l;
    c.bytes = fs_.scatter_message_bytes(b, kr * wpn_ + l);  // fp32
    const int oi = sim_of_wr_[c.q];
    c.orep = oi >= 0 ? oi : rep_local_[l];
    c.chain = e_.join(c.orep, kSync);
    c.start = &start;
    c.start_all = start_all;
    c.layer = layer;
    c.sc = &sc;
    int64_t prev = -1;
    for (const auto& [wr, i] : sim_sorted_) {
      scatter_run(&c, prev + 1, wr);
      if (wr != c.q) scatter_receive(&c, wr, i, 1);
      prev = wr;
    }
    scatter_run(&c, prev + 1, W_);
    if (oi >= 0) e_.depend(sc.xfer[oi], c.chain);
    e_.depend(sc.all, c.chain);
  }
  // Reduced: a simulated rank stands for the ranks of its class all along the receive order,
  // the last of which is done only when the owners' receives are; the rings couple them (a
  // ring step needs both neighbours), so each waits for all of them.
  if (!full_)
    for (int64_t i = 0; i < S_; ++i) e_.depend(sc.xfer[i], sc.all);
  return sc;
}

// One receive from simulated `sender` (world rank `first`), or a run of `count` senders folded
// into one flow of two shares on the last link into the owner: it takes both places of the
// window. This paces a chain by its owner's link; in a full simulation the owners, receiving in
// the same order, partly share senders' links and take up to 1.8x as long (docs/simulation.md,
// "Symmetry").
void StepGraph::scatter_receive(ScatterChain* c, int64_t first, int sender, int64_t count) {
  const std::vector<int>& start = *c->start;
  const int64_t width = std::min<int64_t>(count, 2);
  const int post = e_.join(c->orep, kSync);
  if (c->posted < 2) {
    e_.depend(post, start[c->orep]);
  } else {
    e_.depend(post, c->d2);
    if (width == 2) e_.depend(post, c->d1);
    e_.depend(post, c->sc->enter[c->orep]);
  }
  const int f = e_.flow(sender >= 0 ? route_between(first, c->q) : route_into(first, c->q),
                        c->bytes * static_cast<double>(count), sender >= 0 ? sender : c->orep,
                        kScatter, c->layer);
  if (count > 1) e_.set_weight(f, static_cast<double>(width));
  e_.depend(f, post);
  e_.depend(f, sender >= 0 ? start[sender] : c->start_all);
  e_.depend(c->chain, f);
  if (sender >= 0) {
    e_.depend(c->sc->xfer[sender], f);
    if (sender == 0) rec_.shard_scattered0 += c->bytes;
  }
  if (width == 2) c->d2 = c->d1 = f;
  else c->d2 = c->d1, c->d1 = f;
  c->posted += count;
}

// The world ranks [lo, hi), not simulated, the owner left out: one folded receive.
void StepGraph::scatter_run(ScatterChain* c, int64_t lo, int64_t hi) {
  const int64_t q = c->q;
  int64_t count = hi - lo - ((q >= lo && q < hi) ? 1 : 0);
  if (count <= 0) return;
  // Into the owner on the last link of the route from the run's first sender on another
  // node (the owner's NIC; its first sender when all are on the owner's node).
  int64_t a = lo == q ? lo + 1 : lo;
  for (int64_t x = lo; x < hi; ++x)
    if (x != q && x / wpn_ != q / wpn_) {
      a = x;
      break;
    }
  scatter_receive(c, a, -1, count);
}

// Acquire the block whose gather is pending_: the rank waits for it, then posts `next`'s.
void StepGraph::acquire(size_t next, int layer) {
  std::vector<int> a(S_);
  for (int64_t i = 0; i < S_; ++i) {
    a[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(a[i], prev_end_[i]);
    e_.depend(a[i], pending_[i]);
  }
  rec_.gather_rec.back()[2] = prev_end_[0];
  for (int64_t i = 0; i < S_; ++i) prev_end_[i] = a[i];
  if (next != SIZE_MAX) {
    pending_ = shard_gather(next, a, layer);
    rec_.gather_rec.push_back({a[0], pending_[0], -1});
  }
}

// The store's next grads / grads_done / end_pass: the open reduce-scatter is finished.
void StepGraph::finish_scatter() {
  if (!rs_open_) return;
  for (int64_t i = 0; i < S_; ++i) {
    e_.depend(rs_open_->enter[i], prev_end_[i]);
    prev_end_[i] = rs_open_->fin[i];
  }
  rec_.scatter_rec.back()[2] = rs_open_->enter[0];
  rs_open_.reset();
}

void StepGraph::start_scatter(size_t b, int layer, bool last_micro) {
  rs_open_ = shard_scatter(b, prev_end_, layer);
  rec_.scatter_rec.push_back({prev_end_[0], rs_open_->xfer[0], -1});
  if (last_micro) rs_all_[b] = rs_open_->all;
}

void StepGraph::build() {
  for (int64_t m = 0; m < M_; ++m) micro_batch(m);
  // Shard full: a bucket is ringd's once its reduce-scatter is summed at its owners.
  if (fullshard_)
    for (size_t b = 0; b < rec_.bucket_ready.size(); ++b) rec_.bucket_ready[b] = rs_all_[b];
  rec_.backward_done = rec_.bucket_ready.back();

  // Gradient exchange and optimizer, bucket by bucket on ringd's pipeline.
  if (traffic_.node_exchange)
    for (int64_t k : net_.x_nodes) xroutes_.push_back(e_.add_route(traffic_.x_route[k]));
  if (wi_.link_model) model_routes();
  opt_join_ = fullshard_ ? e_.join(track_ringd_, kSync) : -1;
  for (size_t b = 0; b < w_.bucket_floats.size(); ++b) {
    const int after = e_.join(track_ringd_, kSync);
    e_.depend(after, rec_.bucket_ready[b]);
    e_.depend(after, prev_x_);
    const int x = exchange_bucket(b, after);
    rec_.x_tasks.push_back(x);
    prev_x_ = x;
    optimize_bucket(b, x);
  }
  optimize_after_exchange();
  checkpoint();
}

// One micro-batch: forward, LM head, backward; ringd's buckets from the last one's backward.
void StepGraph::micro_batch(int64_t m) {
  const bool last = m + 1 == M_;
  if (fullshard_) begin_shard_pass();
  for (int64_t l = 0; l < L_; ++l) forward_layer(l, false, last);
  if (fullshard_) {
    // The head (and with tied embeddings the embedding again) before the LM head.
    if (tie_embeddings_) acquire(static_cast<size_t>(L_ + 1), -1);
    acquire(layer_bucket(L_ - 1), -1);
  }
  if (last) rec_.fwd_end0 = prev_end_[0];
  lm_head(last);
  if (fullshard_) start_scatter(kHeadBucket, -1, last);
  for (int64_t l = L_ - 1; l >= 0; --l) {
    backward_layer(l, last);
    if (last) rec_.bucket_ready[1 + (L_ - 1 - l)] = all_positions_join();
  }
  if (fullshard_) {
    // The embedding's gradient: the last layer's reduce-scatter finishes, the embedding's
    // starts and finishes at the end of the pass.
    finish_scatter();
    start_scatter(static_cast<size_t>(L_ + 1), -1, last);
    finish_scatter();
  }
  if (last) rec_.bucket_ready.back() = all_positions_join();
}

// Shard full: the embedding's gather starts with the pass (nothing prefetched it).
void StepGraph::begin_shard_pass() {
  std::vector<int> post(S_);
  for (int64_t i = 0; i < S_; ++i) {
    post[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(post[i], prev_end_[i]);
  }
  pending_ = shard_gather(static_cast<size_t>(L_ + 1), post, -1);
  rec_.gather_rec.push_back({post[0], pending_[0], -1});
  acquire(L_ > 0 ? layer_bucket(0) : kHeadBucket, -1);
}

// LM head forward, loss and head backward.
void StepGraph::lm_head(bool last) {
  const int head_join = e_.join(track_ringd_, kSync);
  for (int64_t i = 0; i < S_; ++i) {
    const int t = e_.compute(static_cast<int>(i), gemm_s(i, w_.head_fwd_flops) + gemm_bwd_s(i, 2 * w_.head_fwd_flops), static_cast<int>(i), kHead);
    e_.depend(t, prev_end_[i]);
    prev_end_[i] = t;
    e_.depend(head_join, t);
    if (i == 0) rec_.head_task0 = t;
  }
  if (last) rec_.bucket_ready[0] = head_join;
}

// A join on ringd's track: every simulated position is done with what it has so far.
int StepGraph::all_positions_join() {
  const int j = e_.join(track_ringd_, kSync);
  for (int64_t i = 0; i < S_; ++i) e_.depend(j, prev_end_[i]);
  return j;
}

// One forward pass of a layer (the forward, or its recompute in the backward).
void StepGraph::forward_layer(int64_t l, bool recompute, bool last_micro) {
  const int pp = recompute ? kProjRecompute : kProjFwd;
  // Shard full: the layer's block was prefetched; the next one's gather starts as it is in.
  if (fullshard_ && !recompute) acquire(l + 1 < L_ ? layer_bucket(l + 1) : kHeadBucket, static_cast<int>(l));
  for (int64_t i = 0; i < S_; ++i) {
    const int t = e_.compute(static_cast<int>(i), gemm_s(i, w_.pre_fwd_flops), static_cast<int>(i), pp, static_cast<int>(l));
    e_.depend(t, prev_end_[i]);
    if (i == 0 && !recompute && last_micro) rec_.layer_fwd_begin[l] = t;
    cur_[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(cur_[i], t);
  }
  if (w_.head_ranks > 1) head_all_to_all(w_.a2a_gather_fwd, l);
  for (int64_t s = 0; s < P_; ++s) forward_step(l, s, recompute);
  if (w_.head_ranks > 1) head_all_to_all(w_.a2a_return_fwd, l);
  for (int64_t i = 0; i < S_; ++i) {
    const int t = e_.compute(static_cast<int>(i), gemm_s(i, w_.post_fwd_flops), static_cast<int>(i), pp, static_cast<int>(l));
    e_.depend(t, cur_[i]);
    prev_end_[i] = t;
    if (i == 0 && !recompute && last_micro) rec_.layer_fwd_end[l] = t;
  }
}

void StepGraph::selective_recompute(int64_t l) {
  for (int64_t i = 0; i < S_; ++i) {
    const int t = e_.compute(static_cast<int>(i), gemm_s(i, w_.selective_flops), static_cast<int>(i),
                             kProjRecompute, static_cast<int>(l));
    e_.depend(t, prev_end_[i]);
    prev_end_[i] = t;
  }
}

// Ring step s of a forward pass: block s is computed while its K/V goes on to the next rank
// (double-buffered); step s+1 starts when the block, the incoming and the outgoing hop are done.
void StepGraph::forward_step(int64_t l, int64_t s, bool recompute) {
  const int pa = recompute ? kAttnRecompute : kAttnFwd;
  const int ph = recompute ? kHopRecompute : kHopFwd;
  const std::vector<int>& nxt = sim_.nxt;
  const std::vector<int>& prv = sim_.prv;
  for (int64_t i = 0; i < S_; ++i) {
    blk_[i] = e_.compute(static_cast<int>(i), attn_fwd_s(i, s), static_cast<int>(i), pa, static_cast<int>(l), static_cast<int>(s));
    e_.depend(blk_[i], cur_[i]);
    kv_[i] = -1;
    if (s + 1 < P_) {
      kv_[i] = e_.flow(route_fwd_[i], w_.kv_block_bytes, static_cast<int>(i), ph, static_cast<int>(l), static_cast<int>(s),
                       1e-6 * static_cast<double>(wi_.stagger_us * sim_.pos[i]));
      e_.depend(kv_[i], cur_[i]);
      if (!recompute) rec_.posted_fwd.emplace_back(kv_[i], cur_[i]);
      e_.depend(kv_[i], cur_[nxt[i]]);  // the receive is posted when the next rank's step begins
    }
  }
  for (int64_t i = 0; i < S_; ++i) {
    nstart_[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(nstart_[i], blk_[i]);
    if (s + 1 < P_) {
      e_.depend(nstart_[i], kv_[i]);
      e_.depend(nstart_[i], kv_[prv[i]]);
    }
  }
  if (s + 1 < P_) record_ring_ops0(kv_, cur_[0], cur_[0]);  // both posted as the step begins
  cur_.swap(nstart_);
}

void StepGraph::backward_layer(int64_t l, bool last_micro) {
  // Shard full: the block is gathered again (prefetched while the layer above computed), the
  // one below's gather starts; the last block gradient's reduce-scatter is finished once the
  // recompute is done (the store's grads() of this block, before its backward).
  if (fullshard_) acquire(l > 0 ? layer_bucket(l - 1) : SIZE_MAX, static_cast<int>(l));
  // The model replays every layer's forward but the last one's, whose activations are the
  // ones still held (worker/model/model.cc); selective only its projections+MLP GEMMs.
  if (w_.recompute && l != L_ - 1) {
    if (w_.selective)
      selective_recompute(l);
    else
      forward_layer(l, true, last_micro);
  }
  if (fullshard_) finish_scatter();
  for (int64_t i = 0; i < S_; ++i) {
    const int t = e_.compute(static_cast<int>(i), gemm_bwd_s(i, 2 * w_.post_fwd_flops), static_cast<int>(i), kProjBwd, static_cast<int>(l));
    e_.depend(t, prev_end_[i]);
    if (i == 0 && last_micro) rec_.layer_bwd_begin[l] = t;
    cur_[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(cur_[i], t);
    dsend1_[i] = dsend2_[i] = -1;
  }
  if (w_.head_ranks > 1) head_all_to_all(w_.a2a_gather_bwd, l);
  for (int64_t s = 0; s < P_; ++s) backward_step(l, s);
  backward_layer_end(l, last_micro);
}

// Ring step s of a backward pass: the block's K/V hop as in the forward, and its dK/dV
// accumulator one hop behind.
void StepGraph::backward_step(int64_t l, int64_t s) {
  const std::vector<int>& nxt = sim_.nxt;
  const std::vector<int>& prv = sim_.prv;
  for (int64_t i = 0; i < S_; ++i) {
    blk_[i] = e_.compute(static_cast<int>(i), attn_bwd_s(i, s), static_cast<int>(i), kAttnBwd, static_cast<int>(l), static_cast<int>(s));
    e_.depend(blk_[i], cur_[i]);
    kv_[i] = -1;
    if (s + 1 < P_) {
      kv_[i] = e_.flow(route_bwd_[i], w_.kv_block_bytes, static_cast<int>(i), kHopBwdKv, static_cast<int>(l), static_cast<int>(s),
                       1e-6 * static_cast<double>(wi_.stagger_us * sim_.pos[i]));
      e_.depend(kv_[i], cur_[i]);
      rec_.posted_bwd.emplace_back(kv_[i], cur_[i]);
      e_.depend(kv_[i], cur_[nxt[i]]);
    }
  }
  for (int64_t i = 0; i < S_; ++i) {
    // The accumulator goes out once the block's partial is computed, the incoming
    // accumulator (sent by prev at step s-1) is in, and this buffer's send of step s-2 left.
    djoin_[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(djoin_[i], blk_[i]);
    if (P_ > 1) {
      e_.depend(djoin_[i], dsend1_[prv[i]]);
      e_.depend(djoin_[i], dsend2_[i]);
    }
  }
  for (int64_t i = 0; i < S_; ++i) {
    nstart_[i] = e_.join(static_cast<int>(i), kSync);
    e_.depend(nstart_[i], djoin_[i]);
    if (s + 1 < P_) {
      e_.depend(nstart_[i], kv_[i]);
      e_.depend(nstart_[i], kv_[prv[i]]);
    }
  }
  for (int64_t i = 0; i < S_; ++i) {
    dsend_[i] = -1;
    if (P_ > 1) {
      const int64_t origin = (sim_.pos[i] - s + P_) % P_;
      const double bytes = s == 0 ? 0.0
                                  : static_cast<double>(cp::dkv_message_bytes(
                                        w_.dkv_rows(origin, s), w_.kvd));
      dsend_[i] = e_.flow(route_bwd_[i], bytes, static_cast<int>(i), kHopDkv, static_cast<int>(l), static_cast<int>(s));
      e_.depend(dsend_[i], djoin_[i]);
      e_.depend(dsend_[i], nstart_[nxt[i]]);  // next posts this receive as its step s+1 begins
      if (s > 0) rec_.posted_dkv.emplace_back(dsend_[i], djoin_[i]);  // posted once its rows are in
    }
  }
  if (s + 1 < P_) record_ring_ops0(kv_, cur_[0], cur_[0]);
  // The accumulator goes out once its rows are in and comes in from prev as step s+1 begins;
  // at s = P-1 that is the trip home, which backward_layer_end waits for after the last step.
  if (P_ > 1) record_ring_ops0(dsend_, djoin_[0], nstart_[0]);
  cur_.swap(nstart_);
  dsend2_.swap(dsend1_);
  dsend1_.swap(dsend_);
}

// Position 0's send of a ring step, posted at the end of task send_posted, and its
// predecessor's (the one position 0 receives), its receive posted at the end of recv_posted.
void StepGraph::record_ring_ops0(const std::vector<int>& sends, int send_posted, int recv_posted) {
  rec_.ring_ops0.emplace_back(send_posted, sends[0]);
  rec_.ring_ops0.emplace_back(recv_posted, sends[sim_.prv[0]]);
}

void StepGraph::backward_layer_end(int64_t l, bool last_micro) {
  const std::vector<int>& prv = sim_.prv;
  for (int64_t i = 0; i < S_; ++i) {
    // The own block's accumulator comes home; every send has left.
    const int home = e_.join(static_cast<int>(i), kSync);
    e_.depend(home, cur_[i]);
    if (P_ > 1) {
      e_.depend(home, dsend1_[prv[i]]);
      e_.depend(home, dsend1_[i]);
      e_.depend(home, dsend2_[i]);
    }
    cur_[i] = home;
  }
  // head_ranks > 1: dq, dk, dv go back to the tokens' owners before the QKV projections' backward.
  if (w_.head_ranks > 1) head_all_to_all(w_.a2a_return_bwd, l);
  for (int64_t i = 0; i < S_; ++i) {
    const int t = e_.compute(static_cast<int>(i), gemm_bwd_s(i, 2 * w_.pre_fwd_flops), static_cast<int>(i), kProjBwd, static_cast<int>(l));
    e_.depend(t, cur_[i]);
    prev_end_[i] = t;
    if (i == 0 && last_micro) rec_.layer_bwd_end[l] = t;
  }
  if (fullshard_) start_scatter(layer_bucket(l), static_cast<int>(l), last_micro);
}

// The link model on every route through the network: the per-message cost as latency or,
// negative, as a credit of the bytes that pass at the burst (at the route's slowest link's
// effective rate); on a shared host the transfer's CPU loads it.
void StepGraph::model_route(int r) {
  if (r < 0) return;
  const std::vector<int>& links = e_.route(r);
  double bw = std::numeric_limits<double>::infinity();
  bool netw = false;
  for (int l : links)
    if (network_link(cl_.net(), l)) netw = true, bw = std::min(bw, net_.ecap[l]);
  if (!netw) return;
  e_.set_route_model(r, wi_.link_msg < 0 ? -wi_.link_msg * bw : 0.0, std::max(0.0, wi_.link_msg),
                     host_id_, host_id_ >= 0 ? rt_.link_cpu_s_per_byte : 0.0);
}

void StepGraph::model_routes() {
  for (int r : route_fwd_) model_route(r);  // route_bwd_ is the same route
  for (int r : a2a_route_) model_route(r);
  for (int r : xroutes_) model_route(r);
  for (int r : shard_routes_) model_route(r);
}

// A ring collective of the simulated nodes' ringd. Reduced: each simulated node's collective
// step waits for its own send of the previous step (its predecessor in the node ring, being
// alike, sends at the same time), so the steps fold into one flow of steps x chunk bytes and
// steps x the route's latency.
int StepGraph::collective(int64_t steps, double chunk, int after) {
  if (full_) return add_ring_collective(e_, xroutes_, steps, chunk, after, kExchange, track_ringd_ + 1);
  const int done = e_.join(track_ringd_, kExchange);
  for (size_t k = 0; k < xroutes_.size(); ++k) {
    const int f = e_.flow(xroutes_[k], chunk * static_cast<double>(steps),
                          track_ringd_ + 1 + static_cast<int>(k), kExchange);
    e_.add_latency(f, static_cast<double>(steps - 1) * cl_.net().route_latency(e_.route(xroutes_[k])));
    e_.depend(f, after);
    e_.depend(done, f);
  }
  return done;
}

// Bucket b's exchange between the nodes, after `after`; returns its last task.
int StepGraph::exchange_bucket(size_t b, int after) {
  if (!traffic_.node_exchange) return after;
  const bool topk = w_.compression == spec::Compression::kTopk;
  const bool sharded = w_.shard != spec::ShardMode::kNone;
  const double payload = w_.bucket_payload(b);
  const double floats = static_cast<double>(w_.bucket_floats[b]);
  const int64_t N = N_;
  int x = -1;
  if (!topk) {
    x = collective(2 * (N - 1), payload / N, after);  // dense all-reduce
  } else if (w_.topk_at_owner) {
    // The nodes' dense gradients reduced to the owners (a reduce-scatter's bytes), then the
    // owner's new weights published (sharded) or its sparse set all-gathered (shard none).
    x = collective(N - 1, 4 * floats / N, after);
    x = sharded ? collective(N - 1, 4 * floats / N, x) : collective(N - 1, payload / N, x);
  } else {
    x = collective(N - 1, payload, after);  // every node's own set, all-gathered
    if (sharded) x = collective(N - 1, 4 * floats / N, x);
  }
  return x;
}

// Bucket b's AdamW once its exchange x is done (without gradient clipping; with it the update
// waits for the global norm, optimize_after_exchange).
void StepGraph::optimize_bucket(size_t b, int x) {
  const double floats = static_cast<double>(w_.bucket_floats[b]);
  if (fullshard_) {
    // The bucket's owner node updates all of it (a range is whole buckets); its top-k, if
    // any, selects there from the summed gradient: nothing crosses the network.
    const int64_t k = fs_.owner[b];
    const double ot = floats / rt_.adamw_params_per_s;
    node_opt_[k] += ot;
    if (w_.grad_clip == 0) {
      const int t = e_.compute(dev_opt_ + static_cast<int>(k), ot, track_ringd_, kOptimizer);
      e_.depend(t, x);
      e_.depend(opt_join_, t);
    }
    return;
  }
  const bool sharded = w_.shard != spec::ShardMode::kNone;
  const double owned = sharded ? floats / static_cast<double>(N_) : floats;
  const double ot = owned / rt_.adamw_params_per_s;
  rec_.opt_total += ot;
  if (w_.grad_clip == 0) {
    // Every node's ringd updates the bucket (one device for all unless they share a host).
    const int j = e_.join(track_ringd_, kSync);
    for (int64_t k = 0; k < opt_devices_; ++k) {
      const int t = e_.compute(dev_opt_ + static_cast<int>(k), ot, track_ringd_, kOptimizer);
      e_.depend(t, x);
      e_.depend(j, t);
      if (k == 0) rec_.last_opt = t;
    }
    if (opt_devices_ > 1) rec_.last_opt = j;
  }
}

void StepGraph::optimize_after_exchange() {
  if (fullshard_) {
    // Each node's ringd updates its range: per bucket as it comes, or all after the norm.
    for (int64_t k = 0; k < N_; ++k) {
      rec_.opt_total = std::max(rec_.opt_total, node_opt_[k]);
      if (w_.grad_clip != 0 && node_opt_[k] > 0) {
        const int t = e_.compute(dev_opt_ + static_cast<int>(k), node_opt_[k], track_ringd_, kOptimizer);
        e_.depend(t, prev_x_);
        e_.depend(opt_join_, t);
      }
    }
    e_.depend(opt_join_, prev_x_);
    rec_.last_opt = opt_join_;
  } else if (w_.grad_clip != 0) {
    // The update needs the global norm: every bucket's AdamW after the last exchange.
    const int j = e_.join(track_ringd_, kSync);
    for (int64_t k = 0; k < opt_devices_; ++k) {
      const int t = e_.compute(dev_opt_ + static_cast<int>(k), rec_.opt_total, track_ringd_, kOptimizer);
      e_.depend(t, prev_x_);
      e_.depend(j, t);
      if (k == 0) rec_.last_opt = t;
    }
    if (opt_devices_ > 1) rec_.last_opt = j;
  }
}

// Checkpoint amortised: master weights and both moments (fp32) of what the node owns.
void StepGraph::checkpoint() {
  const bool sharded = w_.shard != spec::ShardMode::kNone;
  double ckpt = 0;
  if (w_.checkpoint_every > 0) {
    double bytes = 12.0 * static_cast<double>(w_.params) / (sharded ? static_cast<double>(N_) : 1.0);
    if (fullshard_) {  // the largest node's range
      const auto ranges = plan::shard_range_sizes(w_.bucket_floats, N_);
      bytes = 12.0 * static_cast<double>(*std::max_element(ranges.begin(), ranges.end()));
    }
    ckpt = bytes / rt_.checkpoint_bytes_per_s / static_cast<double>(w_.checkpoint_every);
  }
  rec_.ckpt = ckpt;
  if (ckpt > 0 && !w_.checkpoint_async) {
    const int ck = e_.compute(dev_opt_, ckpt, track_ringd_, kCheckpoint);
    e_.depend(ck, rec_.last_opt);
  }
}

}  // namespace ring::sim::detail
