#include "sim/step_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "common/topology/global_order.h"
#include "common/topology/tsp.h"
#include "fmt/format.h"
#include "sim/network.h"

namespace ring::sim::detail {

namespace {

bool close_rel(double a, double b) {
  return std::fabs(a - b) <= 1e-12 * std::max(std::fabs(a), std::fabs(b));
}

// A graph file: the graph's own hop counts between the job's nodes; the same tour solvers as
// the coordinator's global order, and its alternating local paths.
std::vector<std::pair<int, int>> graph_tour(const Cluster& cl, int64_t N, int64_t W, int64_t wpn) {
  topology::CostTable<int64_t> cost(N, std::vector<int64_t>(N, 0));
  for (int64_t a = 0; a < N; ++a)
    for (int64_t b = 0; b < N; ++b)
      if (a != b) cost[a][b] = static_cast<int64_t>(cl.route(a, 0, b, 0).size());
  std::vector<int> tour;
  if (N <= topology::kExactMaxNodes) {
    tour = topology::held_karp_cycle(cost).cycle;
  } else {
    tour.resize(N);
    std::iota(tour.begin(), tour.end(), 0);
    topology::two_opt(cost, tour);
  }
  std::vector<std::pair<int, int>> slot(W);
  for (int64_t g = 0; g < W; ++g) {
    const int64_t k = g / wpn, l = g % wpn;
    slot[g] = {tour[k], static_cast<int>(k % 2 ? wpn - 1 - l : l)};
  }
  return slot;
}

// The ring picked to simulate: the one with the slowest hop, or the one a straggler sits in.
int64_t slowest_ring(const Workload& w, const SimOptions& o, const RingTraffic& t) {
  const int64_t P = w.P, D = w.D;
  auto hop_time = [&](int64_t g) {
    return P > 1 ? t.hop_lat[g] + w.kv_block_bytes / t.rate_fwd[g] : 0;
  };
  int64_t ring = 0;
  double worst = -1;
  for (int64_t d = 0; d < D; ++d) {
    double m = 0;
    for (int64_t c = 0; c < P; ++c) m = std::max(m, hop_time(d * P + c));
    if (m > worst * (1 + 1e-12)) worst = m, ring = d;
  }
  for (const Straggler& s : o.stragglers) ring = s.rank / P;
  return ring;
}

// The period with which the ring's hop times, compute and sends repeat (P: none).
int64_t ring_period(const Workload& w, const WhatIfs& wi, const RingTraffic& t, int64_t ring) {
  const int64_t P = w.P, wpn = w.workers_per_node, U = w.head_ranks;
  // With head_ranks U the U head-slot rings of the ring's replica are simulated together
  // (choose_simulated): the period must hold for each of them.
  const int64_t first = ring / U * U;
  bool symmetric = w.compute_rotation_invariant() && wi.stagger_us == 0;
  for (int64_t c = 0; c < U * P && symmetric; ++c) symmetric = wi.factor[first * P + c] == 1.0;
  if (!symmetric) return P;
  for (int64_t g = 1; g <= P; ++g) {
    if (P % g) continue;
    bool ok = true;
    for (int64_t c = 0; c < U * P && ok; ++c) {
      const int64_t base = (first + c / P) * P, a = base + c % P, b = base + (c % P + g) % P;
      ok = close_rel(t.rate_fwd[a], t.rate_fwd[b]) && close_rel(t.rate_bwd[a], t.rate_bwd[b]) &&
           close_rel(t.rate_joint[a], t.rate_joint[b]) && close_rel(t.hop_lat[a], t.hop_lat[b]);
    }
    // Whole nodes only: a simulated node's ringd stands for the others (with head_ranks U a
    // position is a group of U ranks).
    const int64_t ranks = g * w.head_ranks;
    if (ok && (ranks % wpn == 0 || wpn % ranks == 0 || g == P)) return g;
  }
  return P;
}

// parallel.head_ranks U > 1: group r of replica d is the U consecutive positions d P + r U ..
// of the order; slot a's ring (simulated ring d U + a, workload.h) runs over the groups' slot-a
// members. Throws std::invalid_argument when a group spans two nodes (the all-to-all stays
// inside one, as validation requires).
void to_head_rings(const Workload& w, Placement* p) {
  const int64_t U = w.head_ranks, R = w.P, P = R * U;
  std::vector<std::pair<int, int>> ring(p->slot.size());
  for (int64_t d = 0; d < w.replicas; ++d)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t a = 0; a < U; ++a) {
        const auto& at = p->slot[d * P + r * U + a];
        if (at.first != p->slot[d * P + r * U].first)
          throw std::invalid_argument(fmt::format(
              "simulate: parallel.head_ranks {}: the head group of positions {}..{} of the ring "
              "order spans nodes {} and {}; a group must sit inside one node",
              U, d * P + r * U, d * P + r * U + U - 1, p->slot[d * P + r * U].first, at.first));
        ring[(d * U + a) * R + r] = at;
      }
  p->slot = std::move(ring);
}

}  // namespace

std::unique_ptr<Cluster> build_cluster(const Workload& w, const SimOptions& o, SimResult* res) {
  const int64_t N = w.nodes, wpn = w.workers_per_node;
  const Rates& rt = o.rates;
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
  res->cluster = cl->describe();
  res->rates_source = rt.name + ": " + rt.source;
  res->ranks = w.P * w.D;
  res->ring_size = w.P;
  res->rings = w.D;
  res->head_ranks = w.head_ranks;
  res->nodes = N;
  return cl;
}

Placement place_ranks(const spec::JobSpec& spec, const SimOptions& o, const Workload& w,
                      const Cluster& cl) {
  // The order of the context ranks (with head_ranks U, groups of U consecutive positions).
  const int64_t U = w.head_ranks, P = w.P * U, N = w.nodes, wpn = w.workers_per_node, W = P * w.replicas;
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
  Placement p;
  p.slot.resize(W);
  if (listed) {
    // Ring d's position c is rank d P + list[c] (the ring's ranks in the listed order).
    for (int64_t g = 0; g < W; ++g) {
      const int64_t r = (g / P) * P + spec.parallel.ring_order_list[g % P];
      p.slot[g] = {static_cast<int>(r / wpn), static_cast<int>(r % wpn)};
    }
    p.ring_order = "list (parallel.ring_order_list)";
  } else if (ord == RingOrderChoice::kNatural) {
    for (int64_t g = 0; g < W; ++g)
      p.slot[g] = {static_cast<int>(g / wpn), static_cast<int>(g % wpn)};
    p.ring_order = "natural";
  } else if (cl.shape() == Shape::kGraphFile) {
    p.slot = graph_tour(cl, N, W, wpn);
    p.ring_order = "topology (graph hops)";
  } else {
    const std::vector<std::string> job_nodes(cl.node_names().begin(),
                                             cl.node_names().begin() + N);
    const topology::GlobalOrder go =
        topology::global_ring_order(cl.topology(), job_nodes, {}, static_cast<int>(wpn));
    for (int64_t g = 0; g < W; ++g)
      p.slot[g] = {cl.node_index(go.nodes[go.ranks[g].node]), go.ranks[g].local};
    p.ring_order = fmt::format("topology ({})", go.method);
  }
  if (U > 1) to_head_rings(w, &p);
  return p;
}

bool network_link(const Network& net, int l) { return net.link(l).kind != "nvlink"; }

WhatIfs apply_what_ifs(const SimOptions& o, const Workload& w, const Cluster& cl, SimResult* res) {
  const int64_t N = w.nodes, W = w.P * w.D;
  const Rates& rt = o.rates;
  const Network& net = cl.net();
  WhatIfs wi;
  wi.cap.resize(net.link_count());
  for (int i = 0; i < net.link_count(); ++i) wi.cap[i] = net.link(i).bandwidth;
  for (const SlowLink& s : o.slow_links) {
    if (s.node < 0 || s.node >= N)
      throw std::invalid_argument(fmt::format("slow link: node {} is not one of the job's 0..{}", s.node, N - 1));
    for (int id : cl.nic_links(static_cast<int>(s.node))) wi.cap[id] /= s.factor;
    res->notes.push_back(fmt::format("node {} ({}): NIC bandwidth / {:g}", s.node, cl.node_names()[s.node], s.factor));
  }
  // The transport on the network's links (a calibration's link model, bench/link_probe.py):
  // TCP delivers a share of each link's rate, and each message costs a fixed time (negative:
  // a token bucket's burst). On a shared host the figures measured with compute beside the
  // transfer apply (the ranks compute while their hops move), else the idle ones.
  wi.link_model = rt.has_link_model;
  wi.host_shared = cl.host_cores() > 0;
  wi.link_share = !wi.link_model ? 1.0 : wi.host_shared ? rt.link_rate_share_loaded : rt.link_rate_share;
  wi.link_msg = !wi.link_model ? 0.0 : wi.host_shared ? rt.link_message_s_loaded : rt.link_message_s;
  if (wi.link_model) {
    for (int i = 0; i < net.link_count(); ++i)
      if (network_link(net, i)) wi.cap[i] *= wi.link_share;
    res->notes.push_back(fmt::format(
        "link model ({}): {:.1f} % of each network link's rate, {:+.2f} ms per message{}, "
        "{:.2f} ns of CPU per byte on the host",
        wi.host_shared ? fmt::format("measured with {:g} processes computing beside", rt.link_loaded_processes)
                       : std::string("measured idle"),
        100 * wi.link_share, 1e3 * wi.link_msg, wi.link_msg < 0 ? " (the token bucket's burst)" : "",
        1e9 * rt.link_cpu_s_per_byte));
  }
  wi.factor.assign(W, 1.0);
  for (const Straggler& s : o.stragglers) {
    if (s.rank < 0 || s.rank >= W)
      throw std::invalid_argument(fmt::format("straggler: rank {} is not one of the job's 0..{}", s.rank, W - 1));
    wi.factor[s.rank] *= s.factor;
    res->notes.push_back(fmt::format("rank {}: compute x {:g}", s.rank, s.factor));
  }
  wi.stagger_us = o.stagger_us ? *o.stagger_us : w.stagger_us;
  return wi;
}

RingTraffic solve_ring_traffic(const Workload& w, const Cluster& cl,
                               const std::vector<std::pair<int, int>>& slot,
                               const std::vector<double>& cap) {
  const int64_t P = w.P, N = w.nodes, W = P * w.D;
  const Network& net = cl.net();
  RingTraffic t;
  t.hop_route.resize(W);
  t.hop_lat.assign(W, 0);
  t.rate_fwd.assign(W, 0);
  t.rate_bwd.assign(W, 0);
  MaxMinSolver solver;
  if (P > 1) {
    for (int64_t g = 0; g < W; ++g) {
      const int64_t d = g / P, c = g % P, ng = d * P + (c + 1) % P;
      t.hop_route[g] = cl.route(slot[g].first, slot[g].second, slot[ng].first, slot[ng].second);
      t.hop_lat[g] = net.route_latency(t.hop_route[g]);
    }
    std::vector<const std::vector<int>*> rr;
    for (int64_t g = 0; g < W; ++g) rr.push_back(&t.hop_route[g]);
    std::vector<double> rates;
    solver.solve(cap, rr, &rates);
    t.rate_fwd = rates;
    std::vector<const std::vector<int>*> rr2;
    for (int64_t g = 0; g < W; ++g) rr2.push_back(&t.hop_route[g]), rr2.push_back(&t.hop_route[g]);
    solver.solve(cap, rr2, &rates);
    for (int64_t g = 0; g < W; ++g) t.rate_bwd[g] = 2 * rates[2 * g];
  }
  // Node ring of the gradient exchange (ringd's traffic leaves through the node's first NIC).
  // Shard full has none: the workers' reduce-scatter already summed each node's range.
  t.fullshard = w.shard == spec::ShardMode::kFull;
  t.node_exchange = N > 1 && !t.fullshard;
  t.x_route.resize(N);
  if (t.node_exchange)
    for (int64_t k = 0; k < N; ++k)
      t.x_route[k] = cl.route(static_cast<int>(k), 0, static_cast<int>((k + 1) % N), 0);
  // Ring hops while every node's exchange runs too: which ranks share links with ringd's
  // traffic (part of the symmetry test of ring_period).
  t.rate_joint.assign(W, 0);
  if (P > 1 && t.node_exchange) {
    std::vector<const std::vector<int>*> rr;
    for (int64_t g = 0; g < W; ++g) rr.push_back(&t.hop_route[g]);
    for (int64_t k = 0; k < N; ++k) rr.push_back(&t.x_route[k]);
    std::vector<double> rates;
    solver.solve(cap, rr, &rates);
    for (int64_t g = 0; g < W; ++g) t.rate_joint[g] = rates[g];
  }
  return t;
}

Simulated choose_simulated(const Workload& w, const SimOptions& o, const Cluster& cl,
                           const WhatIfs& what_ifs, const RingTraffic& traffic) {
  const int64_t P = w.P, W = P * w.D, wpn = w.workers_per_node;
  Simulated sim;
  sim.ring = slowest_ring(w, o, traffic);
  sim.period = ring_period(w, what_ifs, traffic, sim.ring);
  // Shard full adds per position and layer about two gathers' and a reduce-scatter's flows from
  // (or to) each of the owner node's workers, and the reduce-scatter's posts.
  const bool full_recompute = w.recompute && !w.selective;  // selective: one task, no ring
  sim.per_layer_tasks = static_cast<double>(P) * (8 + (full_recompute ? 4 : 0)) +
                        (w.selective ? 1.0 : 0.0) +
                        (traffic.fullshard ? 5.0 * static_cast<double>(wpn) + 12 : 0.0) +
                        (w.head_ranks > 1 ? 8.0 + (full_recompute ? 4.0 : 0.0) : 0.0);
  const double full_tasks = static_cast<double>(W) * sim.per_layer_tasks * w.layers * w.micro_batches;
  // Nodes on one shared host: every rank and daemon competes for its cores, so all of them are
  // simulated.
  const bool shared_host = cl.host_cores() > 0;
  sim.full = o.expand == Expand::kFull || shared_host ||
             (o.expand == Expand::kAuto && full_tasks <= static_cast<double>(o.full_task_limit));
  // Reduced with head_ranks U: the period's positions of all U head-slot rings of the ring's
  // replica, i.e. whole head groups, so a simulated node's ranks and NICs carry every slot's
  // hops (and the links' capacity share of engine_network stays the full job's).
  sim.slots = sim.full ? 1 : w.head_ranks;
  sim.S = sim.full ? W : sim.period * sim.slots;
  sim.per_layer = static_cast<double>(sim.S) * sim.per_layer_tasks * static_cast<double>(w.micro_batches);
  return sim;
}

void index_positions(const Workload& w, Simulated* sim) {
  const int64_t P = w.P, S = sim->S;
  sim->grank.resize(S);
  sim->pos.resize(S);
  sim->nxt.resize(S);
  sim->prv.resize(S);
  for (int64_t i = 0; i < S; ++i) {
    if (sim->full) {
      sim->grank[i] = i;
      sim->pos[i] = i % P;
      const int64_t d = i / P;
      sim->nxt[i] = static_cast<int>(d * P + (sim->pos[i] + 1) % P);
      sim->prv[i] = static_cast<int>(d * P + (sim->pos[i] + P - 1) % P);
    } else {
      // Slot ring b (the simulated ring's slot first, then the replica's others in turn):
      // positions b period .. b period + period - 1.
      const int64_t n = sim->period, U = sim->slots, b = i / n, j = i % n;
      const int64_t ring = sim->ring / U * U + (sim->ring % U + b) % U;
      sim->grank[i] = ring * P + j;
      sim->pos[i] = j;
      sim->nxt[i] = static_cast<int>(b * n + (j + 1) % n);
      sim->prv[i] = static_cast<int>(b * n + (j + n - 1) % n);
    }
  }
}

EngineNetwork engine_network(const Workload& w, const Cluster& cl,
                             const std::vector<std::pair<int, int>>& slot,
                             const RingTraffic& traffic, const Simulated& sim,
                             const std::vector<double>& cap) {
  const int64_t N = w.nodes, W = w.P * w.D, S = sim.S;
  const Network& net = cl.net();
  const auto& hop_route = traffic.hop_route;
  const auto& x_route = traffic.x_route;
  EngineNetwork en;
  if (sim.full) {
    for (int64_t k = 0; k < N; ++k) en.x_nodes.push_back(k);
  } else {
    // The nodes of the simulated ranks, and every node whose exchange enters or leaves through
    // a NIC link their hops use (its traffic meets theirs there, not a copy of it).
    std::vector<char> seen(N, 0), used(net.link_count(), 0);
    for (int64_t i = 0; i < S; ++i) {
      const int k = slot[sim.grank[i]].first;
      if (k < N) seen[k] = 1;
      for (int l : hop_route[sim.grank[i]]) used[l] = 1;
    }
    for (int64_t k = 0; k < N; ++k) {
      if (!seen[k] && !x_route[k].empty() && (used[x_route[k].front()] || used[x_route[k].back()]))
        seen[k] = 1;
      if (seen[k]) en.x_nodes.push_back(k);
    }
  }
  // Reduced: so their flows meet as many competitors, in proportion, as the whole job's would
  // (ring hops of every rank, exchange of every node).
  en.ecap = cap;
  if (!sim.full) {
    std::vector<double> total(net.link_count(), 0), mine(net.link_count(), 0);
    for (int64_t g = 0; g < W; ++g)
      for (int l : hop_route[g]) total[l] += 1;
    for (int64_t k = 0; k < N; ++k)
      for (int l : x_route[k]) total[l] += 1;
    for (int64_t i = 0; i < S; ++i)
      for (int l : hop_route[sim.grank[i]]) mine[l] += 1;
    for (int64_t k : en.x_nodes)
      for (int l : x_route[k]) mine[l] += 1;
    for (int l = 0; l < net.link_count(); ++l)
      if (total[l] > 0 && mine[l] > 0) en.ecap[l] = cap[l] * mine[l] / total[l];
  }
  return en;
}

}  // namespace ring::sim::detail
