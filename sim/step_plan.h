// The stages of one simulation before its task graph (sim/simulate.cc runs them in this order;
// internal to ring_sim):
//
//   cluster    = build_cluster(w, o, &res);            // the topology, checked against the job
//   placement  = place_ranks(spec, o, w, *cluster);    // global rank -> (node, local GPU)
//   what_ifs   = apply_what_ifs(o, w, *cluster, &res); // slow links, link model, stragglers
//   traffic    = solve_ring_traffic(w, *cluster, placement.slot, what_ifs.cap);
//   simulated  = choose_simulated(w, o, *cluster, what_ifs, traffic);  // which ranks, how many
//   index_positions(w, &simulated);
//   net        = engine_network(w, *cluster, placement.slot, traffic, simulated, what_ifs.cap);
//
// then the step graph (sim/step_graph.h) and its summary (sim/step_summary.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/spec.h"
#include "sim/cluster.h"
#include "sim/simulate.h"
#include "sim/workload.h"

namespace ring::sim::detail {

// The rank placement does not depend on the depth: folding reuses the first one computed
// (the global order of 2,048 torus nodes takes a noticeable share of a run).
struct Placement {
  std::vector<std::pair<int, int>> slot;  // global rank -> (node, local GPU)
  std::string ring_order;                 // SimResult::ring_order
};

// The cluster of the options, sized and rated for the job. Throws std::invalid_argument when
// it has too few nodes or another GPU count per node. Fills res's cluster, rates and job shape.
std::unique_ptr<Cluster> build_cluster(const Workload& w, const SimOptions& o, SimResult* res);

// The ring order of the options (or the spec's): its list, natural, the graph's hop tour or the
// coordinator's global order (common/topology).
Placement place_ranks(const spec::JobSpec& spec, const SimOptions& o, const Workload& w,
                      const Cluster& cl);

// Whether link l is a network link (the link model applies), not NVLink.
bool network_link(const Network& net, int l);

// The what-ifs on the network and the ranks, and the transport's link model.
struct WhatIfs {
  std::vector<double> cap;     // per link: bandwidth after slow links and the link model
  std::vector<double> factor;  // per global rank: compute time factor (stragglers)
  bool link_model = false;     // the calibration's link model applies
  bool host_shared = false;    // the nodes share one host (a graph file's host_cores)
  double link_share = 1;       // of each network link's rate
  double link_msg = 0;         // seconds per message (negative: a token bucket's burst)
  int64_t stagger_us = 0;      // per ring position
};
// Throws std::invalid_argument for a slow link or straggler the job does not have. Adds a note
// per what-if to res.
WhatIfs apply_what_ifs(const SimOptions& o, const Workload& w, const Cluster& cl, SimResult* res);

// One max-min solve of the whole job's ring traffic (all rings at once), and the node ring of
// the gradient exchange.
struct RingTraffic {
  std::vector<std::vector<int>> hop_route;  // per global rank: links to its ring successor
  std::vector<double> hop_lat;              // per global rank: the hop's latency, s
  std::vector<double> rate_fwd, rate_bwd;   // per global rank: K/V hop rate (backward: K/V
                                            // and dK/dV at once), bytes/s
  std::vector<double> rate_joint;           // K/V hops while every node's exchange runs too
  std::vector<std::vector<int>> x_route;    // per node: to the next node (ringd's first NIC)
  bool fullshard = false;                   // parallel.shard full
  bool node_exchange = false;               // a gradient exchange between nodes
};
RingTraffic solve_ring_traffic(const Workload& w, const Cluster& cl,
                               const std::vector<std::pair<int, int>>& slot,
                               const std::vector<double>& cap);

// Which ranks the step graph holds: all (full) or one period of one ring (reduced); with
// head_ranks U, reduced, one period of each of the U head-slot rings of the ring's replica
// (whole head groups).
struct Simulated {
  int64_t ring = 0;              // the ring simulated (reduced; its slot's ring comes first)
  int64_t period = 0;            // of the ring's hop times, compute and sends
  int64_t slots = 1;             // head-slot rings simulated (reduced: U; full: 1, all rings)
  bool full = false;
  int64_t S = 0;                 // simulated positions (reduced: period x slots)
  double per_layer_tasks = 0;    // tasks per position and layer
  double per_layer = 0;          // tasks per layer, all positions and micro-batches
  // Per simulated position (index_positions): global rank, ring position, next and previous.
  std::vector<int64_t> grank, pos;
  std::vector<int> nxt, prv;
};
Simulated choose_simulated(const Workload& w, const SimOptions& o, const Cluster& cl,
                           const WhatIfs& what_ifs, const RingTraffic& traffic);
void index_positions(const Workload& w, Simulated* sim);

// The engine's network: the real links. Reduced, the simulated ranks stand for all: every link
// keeps the share of its capacity that their flows have in the whole job's pattern.
struct EngineNetwork {
  std::vector<int64_t> x_nodes;  // nodes whose ringd exchange is simulated
  std::vector<double> ecap;      // per link: the engine's capacity
};
EngineNetwork engine_network(const Workload& w, const Cluster& cl,
                             const std::vector<std::pair<int, int>>& slot,
                             const RingTraffic& traffic, const Simulated& sim,
                             const std::vector<double>& cap);

}  // namespace ring::sim::detail
