#include "sim/simulate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "common/cp/ring_messages.h"
#include "common/plan/plan.h"
#include "common/topology/global_order.h"
#include "common/topology/tsp.h"
#include "common/trace/chrome_trace.h"
#include "fmt/format.h"
#include "sim/engine.h"

namespace ring::sim {

namespace {

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
  kPhaseCount
};

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
                                "shard full: gradient reduce-scatter"};
  return names[p];
}

bool close_rel(double a, double b) {
  return std::fabs(a - b) <= 1e-12 * std::max(std::fabs(a), std::fabs(b));
}

// Per-step record of the representative rank, for the hidden-communication account.
struct StepRec {
  int start = -1;   // join: the step begins
  int compute = -1; // the block's compute
  std::vector<int> flows;  // flows in and out of this step
};
struct PassRec {
  int begin = -1, end = -1;  // joins / tasks bounding the ring part
  std::vector<StepRec> steps;
};

}  // namespace

double ring_allreduce_time(int64_t n, double bytes, double alpha, double bw) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * (alpha + bytes / static_cast<double>(n) / bw);
}
double ring_allgather_time(int64_t n, double per, double alpha, double bw) {
  if (n <= 1) return 0;
  return (n - 1) * (alpha + per / bw);
}
double ring_reduce_scatter_time(int64_t n, double bytes, double alpha, double bw) {
  if (n <= 1) return 0;
  return (n - 1) * (alpha + bytes / static_cast<double>(n) / bw);
}

int add_ring_collective(Engine& e, const std::vector<int>& routes, int64_t steps, double chunk,
                        int after, int phase, int track_base) {
  const int n = static_cast<int>(routes.size());
  const int done = e.join(track_base, phase);
  if (n <= 1 || steps <= 0) {
    e.depend(done, after);
    return done;
  }
  std::vector<int> ready(n, -1), flows(n, -1);
  for (int k = 0; k < n; ++k) {
    ready[k] = e.join(track_base + k, phase);
    e.depend(ready[k], after);
  }
  for (int64_t j = 0; j < steps; ++j) {
    for (int k = 0; k < n; ++k) {
      flows[k] = e.flow(routes[k], chunk, track_base + k, phase, -1, static_cast<int>(j));
      e.depend(flows[k], ready[k]);
    }
    for (int k = 0; k < n; ++k) {
      const int r = e.join(track_base + k, phase);
      e.depend(r, flows[k]);                  // own send
      e.depend(r, flows[(k + n - 1) % n]);    // receive from the previous participant
      ready[k] = r;
    }
  }
  for (int k = 0; k < n; ++k) e.depend(done, ready[k]);
  return done;
}

namespace {

// One simulation at the spec's depth. With fold_budget > 0 and a task graph larger than it,
// returns early with *per_layer_tasks set and res.tasks = -1.
// The rank placement does not depend on the depth: folding reuses the first one computed
// (the global order of 2,048 torus nodes takes a noticeable share of a run).
struct Placement {
  std::vector<std::pair<int, int>> slot;
  std::string ring_order;
};

SimResult simulate_once(const spec::JobSpec& spec, const SimOptions& o, int64_t fold_budget,
                        double* per_layer_tasks_out, Placement* cache) {
  SimResult res;
  const Workload w = make_workload(spec);
  const int64_t P = w.P, D = w.D, N = w.nodes, wpn = w.workers_per_node, W = P * D;
  const int64_t L = w.layers, M = w.micro_batches;
  if (W != N * wpn)
    throw std::invalid_argument(fmt::format(
        "simulate: context_ranks {} x data_replicas {} = {} ranks but {} node(s) x {} workers",
        P, D, W, N, wpn));
  const Rates& rt = o.rates;

  // ---- the cluster
  ClusterOptions co = o.cluster;
  co.gpus_per_node = static_cast<int>(wpn);
  co.nodes = static_cast<int>(std::max<int64_t>(co.nodes, N));
  co.nvlink_bw = rt.intra_node_bw;
  co.nvlink_latency = rt.intra_node_latency;
  auto cl = Cluster::build(co);
  if (cl->nodes() < N)
    throw std::invalid_argument(fmt::format("simulate: the topology has {} nodes, the job needs {}",
                                            cl->nodes(), N));
  if (cl->gpus_per_node() != wpn)
    throw std::invalid_argument(fmt::format(
        "simulate: the topology has {} GPUs per node, the spec {} workers per node",
        cl->gpus_per_node(), wpn));
  res.cluster = cl->describe();
  res.rates_source = rt.name + ": " + rt.source;
  res.ranks = W;
  res.ring_size = P;
  res.rings = D;
  res.nodes = N;

  // ---- placement: global rank -> (node, local GPU)
  RingOrderChoice ord = o.ring_order;
  bool listed = false;  // the spec's parallel.ring_order_list
  if (ord == RingOrderChoice::kSpec) {
    listed = spec.parallel.ring_order == spec::RingOrder::kList &&
             static_cast<int64_t>(spec.parallel.ring_order_list.size()) == P;
    ord = (spec.parallel.ring_order == spec::RingOrder::kTopology ||
           spec.parallel.ring_order == spec::RingOrder::kSlurm)
              ? RingOrderChoice::kTopology
              : RingOrderChoice::kNatural;
  }
  std::vector<std::string> job_nodes(cl->node_names().begin(), cl->node_names().begin() + N);
  std::vector<std::pair<int, int>> slot(W);
  if (cache && !cache->slot.empty()) {
    slot = cache->slot;
    res.ring_order = cache->ring_order;
  } else if (listed) {
    // Ring d's position c is rank d P + list[c] (the ring's ranks in the listed order).
    for (int64_t g = 0; g < W; ++g) {
      const int64_t r = (g / P) * P + spec.parallel.ring_order_list[g % P];
      slot[g] = {static_cast<int>(r / wpn), static_cast<int>(r % wpn)};
    }
    res.ring_order = "list (parallel.ring_order_list)";
  } else if (ord == RingOrderChoice::kNatural) {
    for (int64_t g = 0; g < W; ++g) slot[g] = {static_cast<int>(g / wpn), static_cast<int>(g % wpn)};
    res.ring_order = "natural";
  } else if (cl->shape() == Shape::kGraphFile) {
    // The graph's own hop counts between the job's nodes; the same tour solvers as the
    // coordinator's global order, and its alternating local paths.
    topology::CostTable<int64_t> cost(N, std::vector<int64_t>(N, 0));
    for (int64_t a = 0; a < N; ++a)
      for (int64_t b = 0; b < N; ++b)
        if (a != b) cost[a][b] = static_cast<int64_t>(cl->route(a, 0, b, 0).size());
    std::vector<int> tour;
    if (N <= topology::kExactMaxNodes) {
      tour = topology::held_karp_cycle(cost).cycle;
    } else {
      tour.resize(N);
      std::iota(tour.begin(), tour.end(), 0);
      topology::two_opt(cost, tour);
    }
    for (int64_t g = 0; g < W; ++g) {
      const int64_t k = g / wpn, l = g % wpn;
      slot[g] = {tour[k], static_cast<int>(k % 2 ? wpn - 1 - l : l)};
    }
    res.ring_order = "topology (graph hops)";
  } else {
    const topology::GlobalOrder go =
        topology::global_ring_order(cl->topology(), job_nodes, {}, static_cast<int>(wpn));
    for (int64_t g = 0; g < W; ++g)
      slot[g] = {cl->node_index(go.nodes[go.ranks[g].node]), go.ranks[g].local};
    res.ring_order = fmt::format("topology ({})", go.method);
  }
  if (cache && cache->slot.empty()) cache->slot = slot, cache->ring_order = res.ring_order;
  if (D == 1 && wpn == 1)
    for (int64_t c = 0; c < P; ++c) res.ring_nodes.push_back(slot[c].first);

  // ---- what-ifs on the network
  const Network& net = cl->net();
  std::vector<double> cap(net.link_count());
  for (int i = 0; i < net.link_count(); ++i) cap[i] = net.link(i).bandwidth;
  for (const SlowLink& s : o.slow_links) {
    if (s.node < 0 || s.node >= N)
      throw std::invalid_argument(fmt::format("slow link: node {} is not one of the job's 0..{}", s.node, N - 1));
    for (int id : cl->nic_links(static_cast<int>(s.node))) cap[id] /= s.factor;
    res.notes.push_back(fmt::format("node {} ({}): NIC bandwidth / {:g}", s.node, job_nodes[s.node], s.factor));
  }
  // The transport on the network's links (a calibration's link model, bench/link_probe.py):
  // TCP delivers a share of each link's rate, and each message costs a fixed time (negative:
  // a token bucket's burst). On a shared host the figures measured with compute beside the
  // transfer apply (the ranks compute while their hops move), else the idle ones.
  const bool link_model = rt.has_link_model;
  const bool host_shared = cl->host_cores() > 0;
  const double link_share = !link_model ? 1.0 : host_shared ? rt.link_rate_share_loaded : rt.link_rate_share;
  const double link_msg = !link_model ? 0.0 : host_shared ? rt.link_message_s_loaded : rt.link_message_s;
  auto network_link = [&](int l) { return net.link(l).kind != "nvlink"; };
  if (link_model) {
    for (int i = 0; i < net.link_count(); ++i)
      if (network_link(i)) cap[i] *= link_share;
    res.notes.push_back(fmt::format(
        "link model ({}): {:.1f} % of each network link's rate, {:+.2f} ms per message{}, "
        "{:.2f} ns of CPU per byte on the host",
        host_shared ? fmt::format("measured with {:g} processes computing beside", rt.link_loaded_processes)
                    : std::string("measured idle"),
        100 * link_share, 1e3 * link_msg, link_msg < 0 ? " (the token bucket's burst)" : "",
        1e9 * rt.link_cpu_s_per_byte));
  }
  std::vector<double> factor(W, 1.0);
  for (const Straggler& s : o.stragglers) {
    if (s.rank < 0 || s.rank >= W)
      throw std::invalid_argument(fmt::format("straggler: rank {} is not one of the job's 0..{}", s.rank, W - 1));
    factor[s.rank] *= s.factor;
    res.notes.push_back(fmt::format("rank {}: compute x {:g}", s.rank, s.factor));
  }
  const int64_t stagger_us = o.stagger_us ? *o.stagger_us : w.stagger_us;

  // ---- one max-min solve of the whole job's ring traffic
  std::vector<std::vector<int>> hop_route(W);
  std::vector<double> hop_lat(W, 0), rate_fwd(W, 0), rate_bwd(W, 0);
  MaxMinSolver solver;
  if (P > 1) {
    for (int64_t g = 0; g < W; ++g) {
      const int64_t d = g / P, c = g % P, ng = d * P + (c + 1) % P;
      hop_route[g] = cl->route(slot[g].first, slot[g].second, slot[ng].first, slot[ng].second);
      hop_lat[g] = net.route_latency(hop_route[g]);
    }
    std::vector<const std::vector<int>*> rr;
    for (int64_t g = 0; g < W; ++g) rr.push_back(&hop_route[g]);
    std::vector<double> rates;
    solver.solve(cap, rr, &rates);
    rate_fwd = rates;
    std::vector<const std::vector<int>*> rr2;
    for (int64_t g = 0; g < W; ++g) rr2.push_back(&hop_route[g]), rr2.push_back(&hop_route[g]);
    solver.solve(cap, rr2, &rates);
    for (int64_t g = 0; g < W; ++g) rate_bwd[g] = 2 * rates[2 * g];
  }
  // Node ring of the gradient exchange (ringd's traffic leaves through the node's first NIC).
  // Shard full has none: the workers' reduce-scatter already summed each node's range.
  const bool fullshard = w.shard == spec::ShardMode::kFull;
  const bool node_exchange = N > 1 && !fullshard;
  std::vector<std::vector<int>> x_route(N);
  if (node_exchange)
    for (int64_t k = 0; k < N; ++k)
      x_route[k] = cl->route(static_cast<int>(k), 0, static_cast<int>((k + 1) % N), 0);
  // Ring hops while every node's exchange runs too: which ranks share links with ringd's
  // traffic (part of the symmetry test below).
  std::vector<double> rate_joint(W, 0);
  if (P > 1 && node_exchange) {
    std::vector<const std::vector<int>*> rr;
    for (int64_t g = 0; g < W; ++g) rr.push_back(&hop_route[g]);
    for (int64_t k = 0; k < N; ++k) rr.push_back(&x_route[k]);
    std::vector<double> rates;
    solver.solve(cap, rr, &rates);
    for (int64_t g = 0; g < W; ++g) rate_joint[g] = rates[g];
  }

  // ---- which ranks to simulate
  auto hop_time = [&](int64_t g) { return P > 1 ? hop_lat[g] + w.kv_block_bytes / rate_fwd[g] : 0; };
  int64_t ring = 0;
  {
    double worst = -1;
    for (int64_t d = 0; d < D; ++d) {
      double m = 0;
      for (int64_t c = 0; c < P; ++c) m = std::max(m, hop_time(d * P + c));
      if (m > worst * (1 + 1e-12)) worst = m, ring = d;
    }
    for (const Straggler& s : o.stragglers) ring = s.rank / P;
  }
  bool symmetric = w.compute_rotation_invariant() && stagger_us == 0;
  for (int64_t c = 0; c < P && symmetric; ++c) symmetric = factor[ring * P + c] == 1.0;
  int64_t period = P;
  if (symmetric) {
    for (int64_t g = 1; g <= P; ++g) {
      if (P % g) continue;
      bool ok = true;
      for (int64_t c = 0; c < P && ok; ++c) {
        const int64_t a = ring * P + c, b = ring * P + (c + g) % P;
        ok = close_rel(rate_fwd[a], rate_fwd[b]) && close_rel(rate_bwd[a], rate_bwd[b]) &&
             close_rel(rate_joint[a], rate_joint[b]) && close_rel(hop_lat[a], hop_lat[b]);
      }
      // Whole nodes only: a simulated node's ringd stands for the others.
      if (ok && (g % wpn == 0 || wpn % g == 0 || g == P)) {
        period = g;
        break;
      }
    }
  }
  // Shard full adds per position and layer about two gathers' and a reduce-scatter's flows from
  // (or to) each of the owner node's workers, and the reduce-scatter's posts.
  const double per_layer_tasks = static_cast<double>(P) * (8 + (w.recompute ? 4 : 0)) +
                                 (fullshard ? 5.0 * static_cast<double>(wpn) + 12 : 0.0);
  const double full_tasks = static_cast<double>(W) * per_layer_tasks * L * M;
  // Nodes on one shared host: every rank and daemon competes for its cores, so all of them are
  // simulated.
  const bool shared_host = cl->host_cores() > 0;
  bool full = o.expand == Expand::kFull || shared_host ||
              (o.expand == Expand::kAuto && full_tasks <= static_cast<double>(o.full_task_limit));
  const int64_t S = full ? W : period;
  res.simulated_positions = S;
  {
    const double per_layer = static_cast<double>(S) * per_layer_tasks * static_cast<double>(M);
    if (per_layer_tasks_out) *per_layer_tasks_out = per_layer;
    if (o.keep_trace && per_layer * static_cast<double>(L) > 3e6)
      throw std::invalid_argument(fmt::format(
          "--trace: the step has about {:.3g} M tasks, too many for a readable trace (at most 3 M); "
          "trace fewer layers or nodes (--set model.layers=N, --nodes N)",
          per_layer * static_cast<double>(L) / 1e6));
    if (fold_budget > 0 && per_layer * static_cast<double>(L) > static_cast<double>(fold_budget)) {
      res.tasks = -1;
      return res;
    }
  }
  res.mode = full ? fmt::format("full: all {} ranks, flows on the real links", W)
                  : fmt::format("reduced: {} of ring {}'s {} positions stand for all {} ranks "
                                "(symmetry found by one max-min solve of the whole job's traffic)",
                                S, ring, P, W);

  // Global rank, ring position, next and previous of each simulated position.
  std::vector<int64_t> grank(S), pos(S);
  std::vector<int> nxt(S), prv(S);
  for (int64_t i = 0; i < S; ++i) {
    if (full) {
      grank[i] = i;
      pos[i] = i % P;
      const int64_t d = i / P;
      nxt[i] = static_cast<int>(d * P + (pos[i] + 1) % P);
      prv[i] = static_cast<int>(d * P + (pos[i] + P - 1) % P);
    } else {
      grank[i] = ring * P + i;
      pos[i] = i;
      nxt[i] = static_cast<int>((i + 1) % S);
      prv[i] = static_cast<int>((i + S - 1) % S);
    }
  }

  // ---- the engine's network: the real links. Reduced, the simulated ranks stand for all:
  // every link keeps the share of its capacity that their flows have in the whole job's pattern
  // (ring hops of every rank, exchange of every node), so their flows meet as many competitors,
  // in proportion, as the whole job's would.
  std::vector<int64_t> x_nodes;  // nodes whose ringd exchange is simulated
  if (full) {
    for (int64_t k = 0; k < N; ++k) x_nodes.push_back(k);
  } else {
    // The nodes of the simulated ranks, and every node whose exchange enters or leaves through
    // a NIC link their hops use (its traffic meets theirs there, not a copy of it).
    std::vector<char> seen(N, 0), used(net.link_count(), 0);
    for (int64_t i = 0; i < S; ++i) {
      const int k = slot[grank[i]].first;
      if (k < N) seen[k] = 1;
      for (int l : hop_route[grank[i]]) used[l] = 1;
    }
    for (int64_t k = 0; k < N; ++k) {
      if (!seen[k] && !x_route[k].empty() && (used[x_route[k].front()] || used[x_route[k].back()]))
        seen[k] = 1;
      if (seen[k]) x_nodes.push_back(k);
    }
  }
  std::vector<double> ecap = cap;
  if (!full) {
    std::vector<double> total(net.link_count(), 0), mine(net.link_count(), 0);
    for (int64_t g = 0; g < W; ++g)
      for (int l : hop_route[g]) total[l] += 1;
    for (int64_t k = 0; k < N; ++k)
      for (int l : x_route[k]) total[l] += 1;
    for (int64_t i = 0; i < S; ++i)
      for (int l : hop_route[grank[i]]) mine[l] += 1;
    for (int64_t k : x_nodes)
      for (int l : x_route[k]) mine[l] += 1;
    for (int l = 0; l < net.link_count(); ++l)
      if (total[l] > 0 && mine[l] > 0) ecap[l] = cap[l] * mine[l] / total[l];
  }
  Engine e(&net, ecap);
  std::vector<int> route_fwd(S, -1), route_bwd(S, -1);
  if (P > 1)
    for (int64_t i = 0; i < S; ++i) route_fwd[i] = route_bwd[i] = e.add_route(hop_route[grank[i]]);
  const int dev_opt = static_cast<int>(S);
  const int track_ringd = static_cast<int>(S);
  // Shared host: the ranks' devices and every node's ringd (devices S .. S+N-1) divide the
  // host's cores: measured speeds per number of concurrent processes (calibration host_speed),
  // else host_cores ideal cores (min(1, cores / n)).
  const int64_t opt_devices = shared_host ? N : 1;
  int host_id = -1;
  if (shared_host) {
    std::vector<double> speed = rt.host_speed;
    if (speed.empty())
      for (int n = 1; n <= 1024; ++n) speed.push_back(std::min(1.0, cl->host_cores() / n));
    // Ranks poll while they wait for a transfer (worker/ring/progress.cc): each idle rank
    // device loads the host as host_poll_load processes.
    const int h = e.add_host(speed, rt.host_poll_load);
    host_id = h;
    for (int64_t i = 0; i < S + opt_devices; ++i) e.set_device_host(static_cast<int>(i), h, i < S);
    res.notes.push_back(
        rt.host_speed.empty()
            ? fmt::format("all nodes share one host of {:g} cores: concurrent compute divides them",
                          cl->host_cores())
            : fmt::format("all nodes share one host: concurrent compute runs at the calibrated "
                          "host_speed (measured for 1..{} processes at once), a waiting rank "
                          "loading it as {:.3g} process",
                          rt.host_speed.size(), rt.host_poll_load));
  }

  const double heads_hd = static_cast<double>(w.heads * w.head_dim);
  auto attn_fwd_s = [&](int64_t i, int64_t s) {
    const int64_t origin = (pos[i] - s % P + P) % P;
    return w.pairs(pos[i], origin) * 4 * heads_hd / rt.attention_fwd_flops * factor[grank[i]];
  };
  auto attn_bwd_s = [&](int64_t i, int64_t s) {
    const int64_t origin = (pos[i] - s % P + P) % P;
    return w.pairs(pos[i], origin) * 10 * heads_hd / rt.attention_bwd_flops * factor[grank[i]];
  };
  auto gemm_s = [&](int64_t i, double flops) { return flops / rt.gemm_flops * factor[grank[i]]; };
  const double gemm_bwd_rate = rt.gemm_bwd_flops > 0 ? rt.gemm_bwd_flops : rt.gemm_flops;
  auto gemm_bwd_s = [&](int64_t i, double flops) { return flops / gemm_bwd_rate * factor[grank[i]]; };

  std::vector<int> prev_end(S, -1);
  std::vector<int> layer_fwd_begin(L, -1), layer_fwd_end(L, -1), layer_bwd_begin(L, -1),
      layer_bwd_end(L, -1);
  std::vector<PassRec> passes;
  std::vector<int> cur(S), nstart(S), blk(S), kv(S), dsend(S, -1), dsend1(S, -1), dsend2(S, -1),
      djoin(S);

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
  const plan::FullShardLayout& fs = w.full_shard;
  // Reduced, every bucket's parts are placed on the first simulated position's node: while a
  // block is gathered its owner node's NICs carry its flows to every rank, and the ring through
  // that node slows with them; as the gathers hold all ranks in step, the ring that holds the
  // owner paces each layer, and the simulated ring stands for it.
  const int64_t place_node = slot[grank[0]].first;
  constexpr int64_t kShardExplicitFlows = 512;  // per gather, reduced: senders x receivers
  std::vector<int64_t> wr_of_sim(S, 0);  // the world rank (shard index) of each simulated position
  std::vector<int> sim_of_wr;            // and back; -1 when not simulated
  std::vector<int> rep_local(std::max<int64_t>(wpn, 1), 0);  // a simulated position per local GPU
  std::vector<std::pair<int64_t, int>> sim_sorted;  // (world rank, simulated position), ascending
  std::unordered_map<int64_t, int> pair_route;      // src world rank x W + dst world rank
  std::unordered_map<int64_t, int> fold_route;      // src world rank x 2 + (1: own node)
  std::vector<int> shard_routes;
  if (fullshard) {
    sim_of_wr.assign(W, -1);
    std::vector<char> have(wpn, 0);
    for (int64_t i = S - 1; i >= 0; --i) {
      const auto [k, l] = slot[grank[i]];
      wr_of_sim[i] = static_cast<int64_t>(k) * wpn + l;
      sim_of_wr[wr_of_sim[i]] = static_cast<int>(i);
      rep_local[l] = static_cast<int>(i);
      have[l] = 1;
    }
    for (int64_t l = 0; l < wpn; ++l)
      if (!have[l]) rep_local[l] = static_cast<int>(l % S);
    for (int64_t i = 0; i < S; ++i) sim_sorted.emplace_back(wr_of_sim[i], static_cast<int>(i));
    std::sort(sim_sorted.begin(), sim_sorted.end());
  }
  auto route_between = [&](int64_t a, int64_t b) {  // world ranks
    const int64_t key = a * W + b;
    auto it = pair_route.find(key);
    if (it != pair_route.end()) return it->second;
    const int r = e.add_route(cl->route(static_cast<int>(a / wpn), static_cast<int>(a % wpn),
                                        static_cast<int>(b / wpn), static_cast<int>(b % wpn)));
    shard_routes.push_back(r);
    pair_route.emplace(key, r);
    return r;
  };
  auto route_fold = [&](int64_t q, bool own_node) {  // the first link of q's sends
    const int64_t key = q * 2 + (own_node ? 1 : 0);
    auto it = fold_route.find(key);
    if (it != fold_route.end()) return it->second;
    const int k = static_cast<int>(q / wpn), l = static_cast<int>(q % wpn);
    const std::vector<int> full_route =
        own_node ? cl->route(k, l, k, static_cast<int>((l + 1) % wpn))
                 : cl->route(k, l, static_cast<int>((k + 1) % N), l);
    const int r = e.add_route(full_route.empty() ? std::vector<int>{} : std::vector<int>{full_route.front()});
    shard_routes.push_back(r);
    fold_route.emplace(key, r);
    return r;
  };
  auto route_into = [&](int64_t a, int64_t q) {  // the last link of a's route to q
    const int64_t key = -(a * W + q) - 1;
    auto it = pair_route.find(key);
    if (it != pair_route.end()) return it->second;
    const std::vector<int> whole = cl->route(static_cast<int>(a / wpn), static_cast<int>(a % wpn),
                                             static_cast<int>(q / wpn), static_cast<int>(q % wpn));
    const int r = e.add_route(whole.empty() ? std::vector<int>{} : std::vector<int>{whole.back()});
    shard_routes.push_back(r);
    pair_route.emplace(key, r);
    return r;
  };
  double shard_gathered0 = 0, shard_scattered0 = 0;  // simulated position 0, whole step
  // Gather of bucket b: post[i] is when position i posts it (its receives and sends); returns
  // per position the join of its transfers (acquire returns then).
  auto shard_gather = [&](size_t b, const std::vector<int>& post, int layer) {
    std::vector<int> done(S);
    for (int64_t i = 0; i < S; ++i) {
      done[i] = e.join(static_cast<int>(i), kSync);
      e.depend(done[i], post[i]);
    }
    const int64_t kr = fs.owner[b], k = full ? kr : place_node;
    int64_t senders = 0;
    for (int64_t l = 0; l < wpn; ++l) senders += fs.part(b, kr * wpn + l) > 0;
    // Many simulated receivers (reduced): every one of them is folded too, its gather done when
    // its sender's folded flow is (a gather's flows are paced by the senders' links, each
    // sending to all W - 1 ranks), which keeps the max-min components small.
    const bool fold_all = !full && S * senders > kShardExplicitFlows;
    for (int64_t l = 0; l < wpn; ++l) {
      const int64_t q = k * wpn + l;
      const int64_t part = fs.part(b, kr * wpn + l);
      if (part == 0) continue;
      const double bytes = 4.0 * static_cast<double>(part);
      const int si = sim_of_wr[q];
      const int src_post = post[si >= 0 ? si : rep_local[l]];
      int64_t sim_remote = 0, sim_local = 0;
      // One weighted flow standing for `count` alike receivers of the part that are not
      // simulated, off the owner's node (own false) or on it; -1 when there are none.
      auto fold = [&](int64_t count, bool own) {
        if (count <= 0) return -1;
        const int f = e.flow(route_fold(q, own), bytes * static_cast<double>(count),
                             si >= 0 ? si : rep_local[l], kGather, layer);
        e.set_weight(f, static_cast<double>(count));
        e.depend(f, src_post);
        if (si >= 0) e.depend(done[si], f);
        return f;
      };
      if (fold_all) {
        const int fr = fold(W - wpn, false);
        const int fl = fold(wpn - 1, true);
        for (int64_t i = 0; i < S; ++i) {
          if (wr_of_sim[i] == q) continue;
          const int f = wr_of_sim[i] / wpn == k ? fl : fr;
          e.depend(done[i], f);
          if (i == 0) shard_gathered0 += bytes;
        }
        continue;
      }
      for (int64_t i = 0; i < S; ++i) {
        if (wr_of_sim[i] == q) continue;
        const int f = e.flow(route_between(q, wr_of_sim[i]), bytes, static_cast<int>(i), kGather, layer);
        e.depend(f, post[i]);
        e.depend(f, src_post);
        e.depend(done[i], f);
        if (si >= 0) e.depend(done[si], f);
        if (i == 0) shard_gathered0 += bytes;
        (wr_of_sim[i] / wpn == k ? sim_local : sim_remote) += 1;
      }
      fold((W - wpn) - sim_remote, false);
      fold((wpn - 1) - sim_local, true);
    }
    return done;
  };
  // Reduce-scatter of bucket b, started at start[i] (grads_done). Each owner worker receives
  // the parts in world-rank order through a window of two receives; a receive after the first
  // two is posted once the one two places before it is in and the owner's main thread is in
  // finish_scatter (enter: the store's next grads / grads_done / end_pass, to depend on later).
  struct Scatter {
    std::vector<int> enter, xfer, fin;  // per position: entered finish, its transfers done, both
    int all = -1;                       // every owner's receives done
  };
  auto shard_scatter = [&](size_t b, const std::vector<int>& start, int layer) {
    Scatter sc;
    sc.enter.resize(S);
    sc.xfer.resize(S);
    sc.fin.resize(S);
    const int start_all = e.join(track_ringd, kSync);
    for (int64_t i = 0; i < S; ++i) {
      sc.enter[i] = e.join(static_cast<int>(i), kSync);
      sc.xfer[i] = e.join(static_cast<int>(i), kSync);
      e.depend(sc.xfer[i], start[i]);
      sc.fin[i] = e.join(static_cast<int>(i), kSync);
      e.depend(sc.fin[i], sc.xfer[i]);
      e.depend(sc.fin[i], sc.enter[i]);
      e.depend(start_all, start[i]);
    }
    sc.all = e.join(track_ringd, kScatter);
    const int64_t kr = fs.owner[b], k = full ? kr : place_node;
    for (int64_t l = 0; l < wpn; ++l) {
      const int64_t q = k * wpn + l;
      const int64_t part = fs.part(b, kr * wpn + l);
      if (part == 0) continue;
      const double bytes = 4.0 * static_cast<double>(part);
      const int oi = sim_of_wr[q];
      const int orep = oi >= 0 ? oi : rep_local[l];
      const int chain = e.join(orep, kSync);
      int d1 = -1, d2 = -1;
      int64_t posted = 0;
      // One receive from simulated `sender` (world rank `first`), or a run of `count` senders
      // folded into one flow of two shares on the last link into the owner: it takes both
      // places of the window. This paces a chain by its owner's link; in a full simulation the
      // owners, receiving in the same order, partly share senders' links and take up to 1.8x
      // as long (docs/simulation.md, "Symmetry").
      auto item = [&](int64_t first, int sender, int64_t count) {
        const int64_t width = std::min<int64_t>(count, 2);
        const int post = e.join(orep, kSync);
        if (posted < 2) {
          e.depend(post, start[orep]);
        } else {
          e.depend(post, d2);
          if (width == 2) e.depend(post, d1);
          e.depend(post, sc.enter[orep]);
        }
        const int f = e.flow(sender >= 0 ? route_between(first, q) : route_into(first, q),
                             bytes * static_cast<double>(count), sender >= 0 ? sender : orep,
                             kScatter, layer);
        if (count > 1) e.set_weight(f, static_cast<double>(width));
        e.depend(f, post);
        e.depend(f, sender >= 0 ? start[sender] : start_all);
        e.depend(chain, f);
        if (sender >= 0) {
          e.depend(sc.xfer[sender], f);
          if (sender == 0) shard_scattered0 += bytes;
        }
        if (width == 2) d2 = d1 = f;
        else d2 = d1, d1 = f;
        posted += count;
      };
      int64_t prev = -1;
      auto run = [&](int64_t lo, int64_t hi) {  // not simulated world ranks [lo, hi), q left out
        int64_t count = hi - lo - ((q >= lo && q < hi) ? 1 : 0);
        if (count <= 0) return;
        // Into the owner on the last link of the route from the run's first sender on another
        // node (the owner's NIC; its first sender when all are on the owner's node).
        int64_t a = lo == q ? lo + 1 : lo;
        for (int64_t x = lo; x < hi; ++x)
          if (x != q && x / wpn != q / wpn) {
            a = x;
            break;
          }
        item(a, -1, count);
      };
      for (const auto& [wr, i] : sim_sorted) {
        run(prev + 1, wr);
        if (wr != q) item(wr, i, 1);
        prev = wr;
      }
      run(prev + 1, W);
      if (oi >= 0) e.depend(sc.xfer[oi], chain);
      e.depend(sc.all, chain);
    }
    // Reduced: a simulated rank stands for the ranks of its class all along the receive order,
    // the last of which is done only when the owners' receives are; the rings couple them (a
    // ring step needs both neighbours), so each waits for all of them.
    if (!full)
      for (int64_t i = 0; i < S; ++i) e.depend(sc.xfer[i], sc.all);
    return sc;
  };
  // Position 0's records: (post, done, arrived) per gather, (start, xfer, enter) per scatter.
  std::vector<std::array<int, 3>> gather_rec, scatter_rec;
  std::vector<int> pending;  // the gather in flight (prefetched), per position
  std::optional<Scatter> rs_open;
  auto acquire = [&](size_t next, int layer) {
    // Acquire the block whose gather is `pending`: the rank waits for it, then posts `next`'s.
    std::vector<int> a(S);
    for (int64_t i = 0; i < S; ++i) {
      a[i] = e.join(static_cast<int>(i), kSync);
      e.depend(a[i], prev_end[i]);
      e.depend(a[i], pending[i]);
    }
    gather_rec.back()[2] = prev_end[0];
    for (int64_t i = 0; i < S; ++i) prev_end[i] = a[i];
    if (next != SIZE_MAX) {
      pending = shard_gather(next, a, layer);
      gather_rec.push_back({a[0], pending[0], -1});
    }
  };
  auto finish_scatter = [&]() {  // the store's next grads / grads_done / end_pass
    if (!rs_open) return;
    for (int64_t i = 0; i < S; ++i) {
      e.depend(rs_open->enter[i], prev_end[i]);
      prev_end[i] = rs_open->fin[i];
    }
    scatter_rec.back()[2] = rs_open->enter[0];
    rs_open.reset();
  };
  std::vector<int> rs_all(w.bucket_floats.size(), -1);  // the last micro-batch's
  auto start_scatter = [&](size_t b, int layer, bool last_micro) {
    rs_open = shard_scatter(b, prev_end, layer);
    scatter_rec.push_back({prev_end[0], rs_open->xfer[0], -1});
    if (last_micro) rs_all[b] = rs_open->all;
  };
  auto layer_bucket = [&](int64_t l) { return static_cast<size_t>(1 + (L - 1 - l)); };
  const size_t head_bucket = 0, embedding_bucket = static_cast<size_t>(L + 1);

  // K/V sends and the joins at which their senders posted them (the step's start), for the
  // hop time as the worker's timeline records it (posted to completed).
  std::vector<std::pair<int, int>> posted_fwd, posted_bwd, posted_dkv;
  // One forward pass of a layer (the forward, or its recompute in the backward).
  auto forward_layer = [&](int64_t l, bool recompute, bool last_micro) {
    const int pp = recompute ? kProjRecompute : kProjFwd;
    const int pa = recompute ? kAttnRecompute : kAttnFwd;
    const int ph = recompute ? kHopRecompute : kHopFwd;
    // Shard full: the layer's block was prefetched; the next one's gather starts as it is in.
    if (fullshard && !recompute) acquire(l + 1 < L ? layer_bucket(l + 1) : head_bucket, static_cast<int>(l));
    PassRec rec;
    for (int64_t i = 0; i < S; ++i) {
      const int t = e.compute(static_cast<int>(i), gemm_s(i, w.pre_fwd_flops), static_cast<int>(i), pp, static_cast<int>(l));
      e.depend(t, prev_end[i]);
      if (i == 0 && !recompute && last_micro) layer_fwd_begin[l] = t;
      cur[i] = e.join(static_cast<int>(i), kSync);
      e.depend(cur[i], t);
    }
    rec.begin = cur[0];
    for (int64_t s = 0; s < P; ++s) {
      for (int64_t i = 0; i < S; ++i) {
        blk[i] = e.compute(static_cast<int>(i), attn_fwd_s(i, s), static_cast<int>(i), pa, static_cast<int>(l), static_cast<int>(s));
        e.depend(blk[i], cur[i]);
        kv[i] = -1;
        if (s + 1 < P) {
          kv[i] = e.flow(route_fwd[i], w.kv_block_bytes, static_cast<int>(i), ph, static_cast<int>(l), static_cast<int>(s),
                         1e-6 * static_cast<double>(stagger_us * pos[i]));
          e.depend(kv[i], cur[i]);
          if (!recompute) posted_fwd.emplace_back(kv[i], cur[i]);
          e.depend(kv[i], cur[nxt[i]]);  // the receive is posted when the next rank's step begins
        }
      }
      for (int64_t i = 0; i < S; ++i) {
        nstart[i] = e.join(static_cast<int>(i), kSync);
        e.depend(nstart[i], blk[i]);
        if (s + 1 < P) {
          e.depend(nstart[i], kv[i]);
          e.depend(nstart[i], kv[prv[i]]);
        }
      }
      StepRec sr{cur[0], blk[0], {}};
      if (s + 1 < P) sr.flows = {kv[0], kv[prv[0]]};
      rec.steps.push_back(sr);
      cur.swap(nstart);
    }
    rec.end = cur[0];
    passes.push_back(std::move(rec));
    for (int64_t i = 0; i < S; ++i) {
      const int t = e.compute(static_cast<int>(i), gemm_s(i, w.post_fwd_flops), static_cast<int>(i), pp, static_cast<int>(l));
      e.depend(t, cur[i]);
      prev_end[i] = t;
      if (i == 0 && !recompute && last_micro) layer_fwd_end[l] = t;
    }
  };

  auto backward_layer = [&](int64_t l, bool last_micro) {
    // Shard full: the block is gathered again (prefetched while the layer above computed), the
    // one below's gather starts; the last block gradient's reduce-scatter is finished once the
    // recompute is done (the store's grads() of this block, before its backward).
    if (fullshard) acquire(l > 0 ? layer_bucket(l - 1) : SIZE_MAX, static_cast<int>(l));
    // The model replays every layer's forward but the last one's, whose activations are the
    // ones still held (worker/model/model.cc).
    if (w.recompute && l != L - 1) forward_layer(l, true, last_micro);
    if (fullshard) finish_scatter();
    PassRec rec;
    for (int64_t i = 0; i < S; ++i) {
      const int t = e.compute(static_cast<int>(i), gemm_bwd_s(i, 2 * w.post_fwd_flops), static_cast<int>(i), kProjBwd, static_cast<int>(l));
      e.depend(t, prev_end[i]);
      if (i == 0 && last_micro) layer_bwd_begin[l] = t;
      cur[i] = e.join(static_cast<int>(i), kSync);
      e.depend(cur[i], t);
      dsend1[i] = dsend2[i] = -1;
    }
    rec.begin = cur[0];
    for (int64_t s = 0; s < P; ++s) {
      for (int64_t i = 0; i < S; ++i) {
        blk[i] = e.compute(static_cast<int>(i), attn_bwd_s(i, s), static_cast<int>(i), kAttnBwd, static_cast<int>(l), static_cast<int>(s));
        e.depend(blk[i], cur[i]);
        kv[i] = -1;
        if (s + 1 < P) {
          kv[i] = e.flow(route_bwd[i], w.kv_block_bytes, static_cast<int>(i), kHopBwdKv, static_cast<int>(l), static_cast<int>(s),
                         1e-6 * static_cast<double>(stagger_us * pos[i]));
          e.depend(kv[i], cur[i]);
          posted_bwd.emplace_back(kv[i], cur[i]);
          e.depend(kv[i], cur[nxt[i]]);
        }
      }
      for (int64_t i = 0; i < S; ++i) {
        // The accumulator goes out once the block's partial is computed, the incoming
        // accumulator (sent by prev at step s-1) is in, and this buffer's send of step s-2 left.
        djoin[i] = e.join(static_cast<int>(i), kSync);
        e.depend(djoin[i], blk[i]);
        if (P > 1) {
          e.depend(djoin[i], dsend1[prv[i]]);
          e.depend(djoin[i], dsend2[i]);
        }
      }
      for (int64_t i = 0; i < S; ++i) {
        nstart[i] = e.join(static_cast<int>(i), kSync);
        e.depend(nstart[i], djoin[i]);
        if (s + 1 < P) {
          e.depend(nstart[i], kv[i]);
          e.depend(nstart[i], kv[prv[i]]);
        }
      }
      for (int64_t i = 0; i < S; ++i) {
        dsend[i] = -1;
        if (P > 1) {
          const int64_t origin = (pos[i] - s + P) % P;
          const double bytes = s == 0 ? 0.0
                                      : static_cast<double>(cp::dkv_message_bytes(
                                            w.dkv_rows(origin, s), w.kvd));
          dsend[i] = e.flow(route_bwd[i], bytes, static_cast<int>(i), kHopDkv, static_cast<int>(l), static_cast<int>(s));
          e.depend(dsend[i], djoin[i]);
          e.depend(dsend[i], nstart[nxt[i]]);  // next posts this receive as its step s+1 begins
          if (s > 0) posted_dkv.emplace_back(dsend[i], djoin[i]);  // posted once its rows are in
        }
      }
      StepRec sr{cur[0], blk[0], {}};
      if (s + 1 < P) sr.flows = {kv[0], kv[prv[0]]};
      if (P > 1) sr.flows.push_back(dsend[0]);
      rec.steps.push_back(sr);
      cur.swap(nstart);
      dsend2.swap(dsend1);
      dsend1.swap(dsend);
    }
    rec.end = cur[0];
    passes.push_back(std::move(rec));
    for (int64_t i = 0; i < S; ++i) {
      // The own block's accumulator comes home; every send has left.
      const int home = e.join(static_cast<int>(i), kSync);
      e.depend(home, cur[i]);
      if (P > 1) {
        e.depend(home, dsend1[prv[i]]);
        e.depend(home, dsend1[i]);
        e.depend(home, dsend2[i]);
      }
      const int t = e.compute(static_cast<int>(i), gemm_bwd_s(i, 2 * w.pre_fwd_flops), static_cast<int>(i), kProjBwd, static_cast<int>(l));
      e.depend(t, home);
      prev_end[i] = t;
      if (i == 0 && last_micro) layer_bwd_end[l] = t;
    }
    if (fullshard) start_scatter(layer_bucket(l), static_cast<int>(l), last_micro);
  };

  // Buckets: head, layers L-1..0, embedding. ready[b]: every simulated rank is done with it.
  std::vector<int> bucket_ready(w.bucket_floats.size(), -1);
  int fwd_end0 = -1, head_task0 = -1;
  for (int64_t m = 0; m < M; ++m) {
    const bool last = m + 1 == M;
    if (fullshard) {
      // The embedding's gather starts with the pass (nothing prefetched it).
      std::vector<int> post(S);
      for (int64_t i = 0; i < S; ++i) {
        post[i] = e.join(static_cast<int>(i), kSync);
        e.depend(post[i], prev_end[i]);
      }
      pending = shard_gather(embedding_bucket, post, -1);
      gather_rec.push_back({post[0], pending[0], -1});
      acquire(L > 0 ? layer_bucket(0) : head_bucket, -1);
    }
    for (int64_t l = 0; l < L; ++l) forward_layer(l, false, last);
    if (fullshard) {
      // The head (and with tied embeddings the embedding again) before the LM head.
      if (spec.model.tie_embeddings) acquire(embedding_bucket, -1);
      acquire(layer_bucket(L - 1), -1);
    }
    if (last) fwd_end0 = prev_end[0];
    // LM head forward, loss and head backward.
    const int head_join = e.join(track_ringd, kSync);
    for (int64_t i = 0; i < S; ++i) {
      const int t = e.compute(static_cast<int>(i), gemm_s(i, w.head_fwd_flops) + gemm_bwd_s(i, 2 * w.head_fwd_flops), static_cast<int>(i), kHead);
      e.depend(t, prev_end[i]);
      prev_end[i] = t;
      e.depend(head_join, t);
      if (i == 0) head_task0 = t;
    }
    if (last) bucket_ready[0] = head_join;
    if (fullshard) start_scatter(head_bucket, -1, last);
    for (int64_t l = L - 1; l >= 0; --l) {
      backward_layer(l, last);
      if (last) {
        const int j = e.join(track_ringd, kSync);
        for (int64_t i = 0; i < S; ++i) e.depend(j, prev_end[i]);
        bucket_ready[1 + (L - 1 - l)] = j;
      }
    }
    if (fullshard) {
      // The embedding's gradient: the last layer's reduce-scatter finishes, the embedding's
      // starts and finishes at the end of the pass.
      finish_scatter();
      start_scatter(embedding_bucket, -1, last);
      finish_scatter();
    }
    if (last) {
      const int j = e.join(track_ringd, kSync);
      for (int64_t i = 0; i < S; ++i) e.depend(j, prev_end[i]);
      bucket_ready.back() = j;
    }
  }
  // Shard full: a bucket is ringd's once its reduce-scatter is summed at its owners.
  if (fullshard)
    for (size_t b = 0; b < bucket_ready.size(); ++b) bucket_ready[b] = rs_all[b];
  const int backward_done = bucket_ready.back();

  // ---- gradient exchange and optimizer, bucket by bucket on ringd's pipeline
  const bool topk = w.compression == spec::Compression::kTopk;
  const bool sharded = w.shard != spec::ShardMode::kNone;
  std::vector<int> xroutes;
  if (node_exchange)
    for (int64_t k : x_nodes) xroutes.push_back(e.add_route(x_route[k]));
  // The link model on every route through the network: the per-message cost as latency or,
  // negative, as a credit of the bytes that pass at the burst (at the route's slowest link's
  // effective rate); on a shared host the transfer's CPU loads it.
  if (link_model) {
    auto model = [&](int r) {
      if (r < 0) return;
      const std::vector<int>& links = e.route(r);
      double bw = std::numeric_limits<double>::infinity();
      bool netw = false;
      for (int l : links)
        if (network_link(l)) netw = true, bw = std::min(bw, ecap[l]);
      if (!netw) return;
      e.set_route_model(r, link_msg < 0 ? -link_msg * bw : 0.0, std::max(0.0, link_msg),
                        host_id, host_id >= 0 ? rt.link_cpu_s_per_byte : 0.0);
    };
    for (int r : route_fwd) model(r);  // route_bwd is the same route
    for (int r : xroutes) model(r);
    for (int r : shard_routes) model(r);
  }
  // Reduced: each simulated node's collective step waits for its own send of the previous step
  // (its predecessor in the node ring, being alike, sends at the same time), so the steps fold
  // into one flow of steps x chunk bytes and steps x the route's latency.
  auto collective = [&](int64_t steps, double chunk, int after) {
    if (full) return add_ring_collective(e, xroutes, steps, chunk, after, kExchange, track_ringd + 1);
    const int done = e.join(track_ringd, kExchange);
    for (size_t k = 0; k < xroutes.size(); ++k) {
      const int f = e.flow(xroutes[k], chunk * static_cast<double>(steps),
                           track_ringd + 1 + static_cast<int>(k), kExchange);
      e.add_latency(f, static_cast<double>(steps - 1) * net.route_latency(e.route(xroutes[k])));
      e.depend(f, after);
      e.depend(done, f);
    }
    return done;
  };
  int prev_x = -1, last_opt = -1;
  double x_total = 0, opt_total = 0;
  std::vector<int> x_tasks;
  std::vector<double> node_opt(fullshard ? N : 0, 0.0);  // shard full: AdamW seconds per node
  const int opt_join = fullshard ? e.join(track_ringd, kSync) : -1;
  for (size_t b = 0; b < w.bucket_floats.size(); ++b) {
    const double payload = w.bucket_payload(b);
    const double floats = static_cast<double>(w.bucket_floats[b]);
    int x = -1;
    const int after = e.join(track_ringd, kSync);
    e.depend(after, bucket_ready[b]);
    e.depend(after, prev_x);
    if (node_exchange) {
      if (!topk) {
        x = collective(2 * (N - 1), payload / N, after);  // dense all-reduce
      } else if (w.topk_at_owner) {
        // The nodes' dense gradients reduced to the owners (a reduce-scatter's bytes), then the
        // owner's new weights published (sharded) or its sparse set all-gathered (shard none).
        x = collective(N - 1, 4 * floats / N, after);
        x = sharded ? collective(N - 1, 4 * floats / N, x) : collective(N - 1, payload / N, x);
      } else {
        x = collective(N - 1, payload, after);  // every node's own set, all-gathered
        if (sharded) x = collective(N - 1, 4 * floats / N, x);
      }
    } else {
      x = after;
    }
    x_tasks.push_back(x);
    prev_x = x;
    if (fullshard) {
      // The bucket's owner node updates all of it (a range is whole buckets); its top-k, if
      // any, selects there from the summed gradient: nothing crosses the network.
      const int64_t k = fs.owner[b];
      const double ot = floats / rt.adamw_params_per_s;
      node_opt[k] += ot;
      if (w.grad_clip == 0) {
        const int t = e.compute(dev_opt + static_cast<int>(k), ot, track_ringd, kOptimizer);
        e.depend(t, x);
        e.depend(opt_join, t);
      }
      continue;
    }
    const double owned = sharded ? floats / static_cast<double>(N) : floats;
    const double ot = owned / rt.adamw_params_per_s;
    opt_total += ot;
    if (w.grad_clip == 0) {
      // Every node's ringd updates the bucket (one device for all unless they share a host).
      const int j = e.join(track_ringd, kSync);
      for (int64_t k = 0; k < opt_devices; ++k) {
        const int t = e.compute(dev_opt + static_cast<int>(k), ot, track_ringd, kOptimizer);
        e.depend(t, x);
        e.depend(j, t);
        if (k == 0) last_opt = t;
      }
      if (opt_devices > 1) last_opt = j;
    }
  }
  if (fullshard) {
    // Each node's ringd updates its range: per bucket as it comes, or all after the norm.
    for (int64_t k = 0; k < N; ++k) {
      opt_total = std::max(opt_total, node_opt[k]);
      if (w.grad_clip != 0 && node_opt[k] > 0) {
        const int t = e.compute(dev_opt + static_cast<int>(k), node_opt[k], track_ringd, kOptimizer);
        e.depend(t, prev_x);
        e.depend(opt_join, t);
      }
    }
    e.depend(opt_join, prev_x);
    last_opt = opt_join;
  } else if (w.grad_clip != 0) {
    // The update needs the global norm: every bucket's AdamW after the last exchange.
    const int j = e.join(track_ringd, kSync);
    for (int64_t k = 0; k < opt_devices; ++k) {
      const int t = e.compute(dev_opt + static_cast<int>(k), opt_total, track_ringd, kOptimizer);
      e.depend(t, prev_x);
      e.depend(j, t);
      if (k == 0) last_opt = t;
    }
    if (opt_devices > 1) last_opt = j;
  }
  // Checkpoint amortised: master weights and both moments (fp32) of what the node owns.
  double ckpt = 0;
  if (w.checkpoint_every > 0) {
    double bytes = 12.0 * static_cast<double>(w.params) / (sharded ? static_cast<double>(N) : 1.0);
    if (fullshard) {  // the largest node's range
      const auto ranges = plan::shard_range_sizes(w.bucket_floats, N);
      bytes = 12.0 * static_cast<double>(*std::max_element(ranges.begin(), ranges.end()));
    }
    ckpt = bytes / rt.checkpoint_bytes_per_s / static_cast<double>(w.checkpoint_every);
  }
  int ck = -1;
  if (ckpt > 0 && !w.checkpoint_async) {
    ck = e.compute(dev_opt, ckpt, track_ringd, kCheckpoint);
    e.depend(ck, last_opt);
  }

  // ---- run
  const double end = e.run();
  res.tasks = e.task_count();
  res.events = e.events();
  res.step_s = end;
  res.tokens_per_s = static_cast<double>(w.seq_len * D * M) / end;

  // Per-layer times of the representative rank.
  for (int64_t l = 0; l < L; ++l) {
    res.layer_forward_s.push_back(e.task(layer_fwd_end[l]).end - e.task(layer_fwd_begin[l]).start);
    res.layer_backward_s.push_back(e.task(layer_bwd_end[l]).end - e.task(layer_bwd_begin[l]).start);
  }
  res.forward_s = e.task(fwd_end0).end - e.task(layer_fwd_begin[0]).start;
  res.head_s = e.task(head_task0).end - e.task(head_task0).start;
  res.backward_s = e.task(backward_done).end - e.task(head_task0).end;

  // Hops, compute, exchange.
  struct Acc {
    int64_t n = 0;
    double sum = 0, mn = std::numeric_limits<double>::infinity(), mx = 0, bytes = 0;
  } acc[kPhaseCount];
  double attn0 = 0, proj0 = 0, ring_bytes0 = 0;
  for (int id = 0; id < e.task_count(); ++id) {
    const Task& t = e.task(id);
    const double dur = t.end - t.start;
    if (t.kind == TaskKind::kFlow) {
      Acc& a = acc[t.phase];
      ++a.n;
      a.sum += dur;
      a.mn = std::min(a.mn, dur);
      a.mx = std::max(a.mx, dur);
      a.bytes = std::max(a.bytes, t.bytes);
      if (t.track == 0 && (t.phase == kHopFwd || t.phase == kHopBwdKv || t.phase == kHopDkv || t.phase == kHopRecompute))
        ring_bytes0 += t.bytes;
      if (t.track == 0 && t.phase == kHopFwd && t.layer == 0 && layer_fwd_begin[0] >= 0 &&
          t.start >= e.task(layer_fwd_begin[0]).start)
        res.hop_layer0_forward_s.push_back(dur);
    } else if (t.kind == TaskKind::kCompute && t.track == 0 && t.device == 0) {
      if (t.phase == kAttnFwd || t.phase == kAttnBwd || t.phase == kAttnRecompute) attn0 += dur;
      if (t.phase == kProjFwd || t.phase == kProjBwd || t.phase == kProjRecompute || t.phase == kHead) proj0 += dur;
    }
  }
  auto hop = [&](int ph) {
    HopStats h;
    const Acc& a = acc[ph];
    h.count = a.n;
    h.bytes = a.bytes;
    if (a.n) h.mean_s = a.sum / a.n, h.min_s = a.mn, h.max_s = a.mx;
    return h;
  };
  res.hop_forward = hop(kHopFwd);
  res.hop_backward_kv = hop(kHopBwdKv);
  auto posted = [&](const std::vector<std::pair<int, int>>& v, HopStats* h) {
    if (v.empty()) return;
    std::vector<double> d;
    d.reserve(v.size());
    for (const auto& [f, p] : v) d.push_back(e.task(f).end - e.task(p).end);
    double sum = 0;
    for (double x : d) sum += x;
    h->posted_mean_s = sum / static_cast<double>(d.size());
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    h->posted_median_s = d[d.size() / 2];
  };
  posted(posted_fwd, &res.hop_forward);
  posted(posted_bwd, &res.hop_backward_kv);
  res.hop_dkv = hop(kHopDkv);
  posted(posted_dkv, &res.hop_dkv);
  res.attention_compute_s = attn0;
  res.projection_compute_s = proj0;
  res.ring_bytes_per_rank = ring_bytes0 / static_cast<double>(M);
  if (res.hop_forward.mean_s > 0) res.effective_ring_bw = w.kv_block_bytes / res.hop_forward.mean_s;
  if (res.hop_forward.max_s > 0) res.bottleneck_ring_bw = w.kv_block_bytes / res.hop_forward.max_s;

  // Ring communication hidden behind compute (representative rank): per ring step, the
  // communication time is the span from the step's start to its last flow's end; the exposed part
  // is the time the step outlasts its block's compute.
  for (const PassRec& pr : passes) {
    for (size_t k = 0; k < pr.steps.size(); ++k) {
      const StepRec& s = pr.steps[k];
      const double st = e.task(s.start).end;
      const double next = k + 1 < pr.steps.size() ? e.task(pr.steps[k + 1].start).end : e.task(pr.end).end;
      double comm_end = st;
      for (int f : s.flows)
        if (f >= 0) comm_end = std::max(comm_end, e.task(f).end);
      res.ring_comm_s += comm_end - st;
      res.ring_exposed_s += std::max(0.0, next - std::max(st, e.task(s.compute).end));
    }
  }
  res.ring_comm_s /= static_cast<double>(M);
  res.ring_exposed_s /= static_cast<double>(M);
  res.hidden_share = res.ring_comm_s > 0 ? std::clamp(1.0 - res.ring_exposed_s / res.ring_comm_s, 0.0, 1.0) : 1.0;

  double x_first = std::numeric_limits<double>::infinity(), x_last = 0;
  for (size_t b = 0; b < x_tasks.size(); ++b) {
    x_first = std::min(x_first, e.task(bucket_ready[b]).end);
    x_last = std::max(x_last, e.task(x_tasks[b]).end);
  }
  const double bwd_end = e.task(backward_done).end;
  x_total = 0;
  for (size_t b = 0; b < x_tasks.size(); ++b) x_total += e.task(x_tasks[b]).end - std::max(e.task(bucket_ready[b]).end, b ? e.task(x_tasks[b - 1]).end : 0.0);
  res.exchange_s = x_total;
  res.exchange_exposed_s = std::max(0.0, x_last - bwd_end);
  res.optimizer_s = opt_total;
  res.optimizer_exposed_s = std::max(0.0, e.task(last_opt).end - std::max(x_last, bwd_end));
  res.checkpoint_amortised_s = ckpt;
  res.checkpoint_hidden = w.checkpoint_async;

  // Shard full at position 0, the whole step.
  std::vector<std::array<double, 2>> gather_waits, scatter_waits;  // (from, to) for the trace
  if (fullshard) {
    res.shard_full = true;
    res.shard_gathers = static_cast<int64_t>(gather_rec.size());
    res.shard_scatters = static_cast<int64_t>(scatter_rec.size());
    // Position 0's world rank (reduced, the flows place every bucket on its node instead).
    double g0 = 0, s0 = 0;
    for (size_t b = 0; b < fs.gathers.size(); ++b) {
      const double other = static_cast<double>(fs.size(b) - fs.part(b, wr_of_sim[0]));
      g0 += fs.gathers[b] * 4.0 * other;
      s0 += 4.0 * other;
    }
    res.shard_gathered_bytes = full ? shard_gathered0 : g0 * static_cast<double>(M);
    res.shard_scattered_bytes = full ? shard_scattered0 : s0 * static_cast<double>(M);
    for (const auto& [post, done, arrived] : gather_rec) {
      const double t_done = e.task(done).end, t_in = arrived >= 0 ? e.task(arrived).end : 0.0;
      res.shard_gather_s += t_done - e.task(post).end;
      if (t_done > t_in) res.shard_gather_exposed_s += t_done - t_in, gather_waits.push_back({t_in, t_done});
    }
    for (const auto& [start, xfer, enter] : scatter_rec) {
      const double t_done = e.task(xfer).end, t_in = e.task(enter).end;
      res.shard_scatter_s += t_done - e.task(start).end;
      if (t_done > t_in) res.shard_scatter_exposed_s += t_done - t_in, scatter_waits.push_back({t_in, t_done});
    }
    const double total = res.shard_gather_s + res.shard_scatter_s;
    res.shard_hidden_share =
        total > 0 ? std::clamp(1.0 - (res.shard_gather_exposed_s + res.shard_scatter_exposed_s) / total, 0.0, 1.0) : 1.0;
  }

  // Critical path: from the last task back through what let each task start.
  int last_task = 0;
  for (int id = 0; id < e.task_count(); ++id)
    if (e.task(id).end > e.task(last_task).end) last_task = id;
  std::vector<double> cp(kPhaseCount, 0);
  for (int t : e.critical_path(last_task)) {
    const int c = e.cause(t);
    cp[e.task(t).phase] += e.task(t).end - (c >= 0 ? e.task(c).end : 0.0);
  }
  for (int p = 0; p < kPhaseCount; ++p)
    if (cp[p] > 0) res.critical_path.push_back({phase_name(p), cp[p]});
  std::sort(res.critical_path.begin(), res.critical_path.end(),
            [](const PhaseTime& a, const PhaseTime& b) { return a.seconds > b.seconds; });

  if (topk && w.warmup_steps > 0)
    res.notes.push_back(fmt::format("top-k step (after optimizer.warmup_steps {} dense steps)", w.warmup_steps));
  if (w.doc_len < w.seq_len)
    res.notes.push_back(fmt::format("packed documents taken as {} tokens each (data.max_doc_len)", w.doc_len));

  if (o.keep_trace) {
    for (int id = 0; id < e.task_count(); ++id) {
      const Task& t = e.task(id);
      if (t.kind == TaskKind::kJoin) continue;
      SimResult::TraceEvent ev;
      ev.name = phase_name(t.phase);
      const bool ringd = t.track >= track_ringd;
      ev.pid = ringd ? 2 : 1;
      ev.tid = ringd ? t.track - track_ringd : static_cast<int>(grank[t.track]);
      if (t.kind == TaskKind::kFlow && !ringd) ev.pid = 3;  // network lane per sending rank
      ev.start = t.start;
      ev.end = t.end;
      ev.bytes = t.bytes;
      ev.layer = t.layer;
      ev.step = t.step;
      res.trace.push_back(ev);
    }
    // Shard full: where position 0 waited for a gather or blocked finishing a reduce-scatter.
    for (const auto& [list, name] : {std::pair{&gather_waits, "shard full: waiting for a block gather"},
                                     std::pair{&scatter_waits, "shard full: finishing a reduce-scatter"}})
      for (const auto& [a, b] : *list) {
        SimResult::TraceEvent ev;
        ev.name = name;
        ev.pid = 1;
        ev.tid = static_cast<int>(grank[0]);
        ev.start = a;
        ev.end = b;
        res.trace.push_back(ev);
      }
  }
  return res;
}

}  // namespace

SimResult simulate(const spec::JobSpec& spec, const SimOptions& o) {
  double per_layer = 0;
  Placement placement;
  SimResult r = simulate_once(spec, o, o.fold_task_budget, &per_layer, &placement);
  if (r.tasks >= 0) return r;
  // Too deep to build at once: every layer is the same, so simulate two depths L1 < L2 that
  // fit and extend linearly in the layer count (the step's increment per layer).
  const int64_t L = spec.model.layers;
  const int64_t l2 = std::clamp<int64_t>(
      static_cast<int64_t>(static_cast<double>(o.fold_task_budget) / std::max(1.0, per_layer)), 2, L);
  const int64_t l1 = l2 - 1;
  if (o.keep_trace && l2 < L) throw std::invalid_argument(fmt::format(
      "simulate: --trace needs the whole task graph, {:.0f} tasks for {} layers, more than the "
      "budget of {}: trace a spec with fewer layers (--set model.layers=N)", per_layer * L, L, o.fold_task_budget));
  auto at = [&](int64_t layers) {
    spec::JobSpec s = spec;
    s.model.layers = layers;
    return simulate_once(s, o, 0, nullptr, &placement);
  };
  SimResult a = at(l1), b = at(l2);
  const double k = static_cast<double>(L - l2);
  auto ext = [&](double va, double vb) { return vb + k * (vb - va); };
  SimResult out = b;
  out.step_s = ext(a.step_s, b.step_s);
  out.forward_s = ext(a.forward_s, b.forward_s);
  out.backward_s = ext(a.backward_s, b.backward_s);
  out.attention_compute_s = ext(a.attention_compute_s, b.attention_compute_s);
  out.projection_compute_s = ext(a.projection_compute_s, b.projection_compute_s);
  out.ring_bytes_per_rank = ext(a.ring_bytes_per_rank, b.ring_bytes_per_rank);
  out.ring_comm_s = ext(a.ring_comm_s, b.ring_comm_s);
  out.ring_exposed_s = ext(a.ring_exposed_s, b.ring_exposed_s);
  out.hidden_share = out.ring_comm_s > 0 ? std::clamp(1.0 - out.ring_exposed_s / out.ring_comm_s, 0.0, 1.0) : 1.0;
  out.exchange_s = ext(a.exchange_s, b.exchange_s);
  out.exchange_exposed_s = ext(a.exchange_exposed_s, b.exchange_exposed_s);
  out.optimizer_s = ext(a.optimizer_s, b.optimizer_s);
  out.optimizer_exposed_s = ext(a.optimizer_exposed_s, b.optimizer_exposed_s);
  out.checkpoint_amortised_s = ext(a.checkpoint_amortised_s, b.checkpoint_amortised_s);
  out.shard_gathered_bytes = ext(a.shard_gathered_bytes, b.shard_gathered_bytes);
  out.shard_scattered_bytes = ext(a.shard_scattered_bytes, b.shard_scattered_bytes);
  out.shard_gather_s = ext(a.shard_gather_s, b.shard_gather_s);
  out.shard_gather_exposed_s = ext(a.shard_gather_exposed_s, b.shard_gather_exposed_s);
  out.shard_scatter_s = ext(a.shard_scatter_s, b.shard_scatter_s);
  out.shard_scatter_exposed_s = ext(a.shard_scatter_exposed_s, b.shard_scatter_exposed_s);
  out.shard_gathers = static_cast<int64_t>(std::llround(ext(static_cast<double>(a.shard_gathers), static_cast<double>(b.shard_gathers))));
  out.shard_scatters = static_cast<int64_t>(std::llround(ext(static_cast<double>(a.shard_scatters), static_cast<double>(b.shard_scatters))));
  {
    const double total = out.shard_gather_s + out.shard_scatter_s;
    out.shard_hidden_share = total > 0 ? std::clamp(1.0 - (out.shard_gather_exposed_s + out.shard_scatter_exposed_s) / total, 0.0, 1.0) : 1.0;
  }
  for (HopStats* h : {&out.hop_forward, &out.hop_backward_kv, &out.hop_dkv}) {
    const HopStats& ha = h == &out.hop_forward ? a.hop_forward : h == &out.hop_backward_kv ? a.hop_backward_kv : a.hop_dkv;
    h->count = static_cast<int64_t>(std::llround(ext(static_cast<double>(ha.count), static_cast<double>(h->count))));
  }
  for (auto& p : out.critical_path) {
    double va = 0;
    for (const auto& q : a.critical_path)
      if (q.name == p.name) va = q.seconds;
    p.seconds = std::max(0.0, ext(va, p.seconds));
  }
  std::sort(out.critical_path.begin(), out.critical_path.end(),
            [](const PhaseTime& x, const PhaseTime& y) { return x.seconds > y.seconds; });
  // Layers beyond the simulated depth take the inner layers' times.
  const double f_mid = b.layer_forward_s[l2 / 2], b_mid = b.layer_backward_s[l2 / 2];
  out.layer_forward_s.assign(L, f_mid);
  out.layer_backward_s.assign(L, b_mid);
  out.layer_forward_s.front() = b.layer_forward_s.front();
  out.layer_backward_s.front() = b.layer_backward_s.front();
  out.layer_forward_s.back() = b.layer_forward_s.back();
  out.layer_backward_s.back() = b.layer_backward_s.back();
  out.tokens_per_s = b.tokens_per_s * b.step_s / out.step_s;
  out.tasks = a.tasks + b.tasks;
  out.events = a.events + b.events;
  out.mode += fmt::format("; layers folded: {} and {} of {} layers simulated, the step extended "
                          "linearly ({:.4g} s per layer)", l1, l2, L, b.step_s - a.step_s);
  return out;
}

nlohmann::json to_json(const SimResult& r) {
  auto hop = [](const HopStats& h) {
    return nlohmann::json{{"count", h.count}, {"bytes", h.bytes}, {"mean_s", h.mean_s},
                          {"min_s", h.min_s}, {"max_s", h.max_s},
                          {"posted_mean_s", h.posted_mean_s}, {"posted_median_s", h.posted_median_s}};
  };
  nlohmann::json cp = nlohmann::json::array();
  for (const auto& p : r.critical_path) cp.push_back({{"phase", p.name}, {"seconds", p.seconds}});
  return {
      {"cluster", r.cluster},
      {"rates", r.rates_source},
      {"mode", r.mode},
      {"ring_order", r.ring_order},
      {"ring_nodes", r.ring_nodes},
      {"ranks", r.ranks},
      {"ring_size", r.ring_size},
      {"rings", r.rings},
      {"nodes", r.nodes},
      {"simulated_positions", r.simulated_positions},
      {"tasks", r.tasks},
      {"events", r.events},
      {"step_s", r.step_s},
      {"tokens_per_s", r.tokens_per_s},
      {"forward_s", r.forward_s},
      {"head_s", r.head_s},
      {"backward_s", r.backward_s},
      {"layer_forward_s", r.layer_forward_s},
      {"layer_backward_s", r.layer_backward_s},
      {"attention_compute_s", r.attention_compute_s},
      {"projection_compute_s", r.projection_compute_s},
      {"hops", {{"forward", hop(r.hop_forward)}, {"backward_kv", hop(r.hop_backward_kv)}, {"dkv", hop(r.hop_dkv)}}},
      {"hop_layer0_forward_s", r.hop_layer0_forward_s},
      {"ring_bytes_per_rank", r.ring_bytes_per_rank},
      {"effective_ring_bw_bytes_per_s", r.effective_ring_bw},
      {"bottleneck_ring_bw_bytes_per_s", r.bottleneck_ring_bw},
      {"ring_comm_s", r.ring_comm_s},
      {"ring_exposed_s", r.ring_exposed_s},
      {"hidden_share", r.hidden_share},
      {"exchange_s", r.exchange_s},
      {"exchange_exposed_s", r.exchange_exposed_s},
      {"optimizer_s", r.optimizer_s},
      {"optimizer_exposed_s", r.optimizer_exposed_s},
      {"checkpoint_amortised_s", r.checkpoint_amortised_s},
      {"checkpoint_hidden", r.checkpoint_hidden},
      {"shard_full", r.shard_full ? nlohmann::json{
           {"gathers", r.shard_gathers}, {"reduce_scatters", r.shard_scatters},
           {"gathered_bytes_per_rank", r.shard_gathered_bytes},
           {"scattered_bytes_per_rank", r.shard_scattered_bytes},
           {"gather_s", r.shard_gather_s}, {"gather_exposed_s", r.shard_gather_exposed_s},
           {"reduce_scatter_s", r.shard_scatter_s},
           {"reduce_scatter_exposed_s", r.shard_scatter_exposed_s},
           {"hidden_share", r.shard_hidden_share}} : nlohmann::json(nullptr)},
      {"critical_path", cp},
      {"notes", r.notes},
  };
}

namespace {
std::string secs(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} us", s * 1e6);
}
}  // namespace

std::string to_text(const SimResult& r) {
  std::string o;
  auto line = [&](const std::string& k, const std::string& v) { o += fmt::format("  {:<34} {}\n", k, v); };
  o += fmt::format("cluster   {}\n", r.cluster);
  o += fmt::format("rates     {}\n", r.rates_source);
  o += fmt::format("job       {} ranks: {} ring(s) of {} on {} node(s), ring order {}\n", r.ranks,
                   r.rings, r.ring_size, r.nodes, r.ring_order);
  o += fmt::format("simulated {} ({} tasks, {} events)\n\n", r.mode, r.tasks, r.events);
  o += fmt::format("step      {}   ({:.0f} tokens/s)\n", secs(r.step_s), r.tokens_per_s);
  line("forward (all layers)", secs(r.forward_s));
  line("LM head fwd+bwd", secs(r.head_s));
  line("backward (all layers)", secs(r.backward_s));
  if (!r.layer_forward_s.empty()) {
    auto mm = [](const std::vector<double>& v) {
      auto [a, b] = std::minmax_element(v.begin(), v.end());
      return std::make_pair(*a, *b);
    };
    auto [f0, f1] = mm(r.layer_forward_s);
    auto [b0, b1] = mm(r.layer_backward_s);
    line("per layer forward", f0 == f1 ? secs(f0) : secs(f0) + " .. " + secs(f1));
    line("per layer backward", b0 == b1 ? secs(b0) : secs(b0) + " .. " + secs(b1));
  }
  line("attention compute (per rank)", secs(r.attention_compute_s));
  line("projections+MLP (per rank)", secs(r.projection_compute_s));
  auto hop = [&](const char* name, const HopStats& h) {
    if (h.count == 0) return;
    line(name, fmt::format("{} hops of up to {}, mean {} (min {}, max {})", h.count,
                           plan::human_bytes(h.bytes), secs(h.mean_s), secs(h.min_s), secs(h.max_s)));
  };
  hop("ring K/V hop (forward)", r.hop_forward);
  hop("ring K/V hop (backward)", r.hop_backward_kv);
  hop("ring dK/dV hop", r.hop_dkv);
  line("ring bytes sent per rank", plan::human_bytes(r.ring_bytes_per_rank));
  line("effective ring bandwidth", fmt::format("{:.2f} GB/s (mean hop; slowest hop {:.2f} GB/s)",
                                               r.effective_ring_bw / 1e9, r.bottleneck_ring_bw / 1e9));
  line("ring communication", fmt::format("{} ({} exposed, {:.1f} % hidden behind compute)",
                                         secs(r.ring_comm_s), secs(r.ring_exposed_s), 100 * r.hidden_share));
  if (r.shard_full) {
    line("shard full: block all-gathers", fmt::format("{} of {} received, {} in flight, {} exposed", r.shard_gathers,
                                                        plan::human_bytes(r.shard_gathered_bytes), secs(r.shard_gather_s),
                                                        secs(r.shard_gather_exposed_s)));
    line("shard full: reduce-scatters", fmt::format("{} of {} sent, {} in flight, {} exposed", r.shard_scatters,
                                                      plan::human_bytes(r.shard_scattered_bytes), secs(r.shard_scatter_s),
                                                      secs(r.shard_scatter_exposed_s)));
    line("shard full: hidden behind compute", fmt::format("{:.1f} %", 100 * r.shard_hidden_share));
  }
  line("gradient exchange", fmt::format("{} ({} after the backward){}", secs(r.exchange_s), secs(r.exchange_exposed_s),
                                        r.shard_full ? " (none between nodes with shard full)" : ""));
  line("optimizer (host AdamW)", fmt::format("{} ({} exposed)", secs(r.optimizer_s), secs(r.optimizer_exposed_s)));
  line("checkpoint (amortised)", fmt::format("{}{}", secs(r.checkpoint_amortised_s), r.checkpoint_hidden ? " (async: hidden)" : ""));
  o += "critical path\n";
  for (const auto& p : r.critical_path)
    line(p.name, fmt::format("{} ({:.1f} %)", secs(p.seconds), 100 * p.seconds / r.step_s));
  for (const auto& n : r.notes) o += fmt::format("note: {}\n", n);
  return o;
}

void write_trace(const SimResult& r, const std::string& path) {
  trace::ChromeTrace t;
  t.process(1, "ranks (compute)");
  t.process(3, "ring sends (by sender); shard full: gathers (by receiver), reduce-scatters (by sender)");
  t.process(2, "ringd (exchange, optimizer)");
  for (const auto& e : r.trace) {
    nlohmann::json args = nlohmann::json::object();
    if (e.layer >= 0) args["layer"] = e.layer;
    if (e.step >= 0) args["step"] = e.step;
    if (e.bytes > 0) args["bytes"] = e.bytes;
    t.complete(e.name, e.pid, e.tid, e.start * 1e6, (e.end - e.start) * 1e6, std::move(args));
  }
  try {
    t.write(path);  // a per-user file: 0600, replaced whole, never through a symbolic link
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("cannot write the trace: {}", e.what()));
  }
}

}  // namespace ring::sim
