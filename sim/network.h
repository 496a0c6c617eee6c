// The simulated network: an explicit graph of directed links, each with a bandwidth (bytes/s)
// and a latency (s), and routes (sequences of link ids) between vertices.
//
// Flow-level model: a flow of B bytes on a route occupies every link of the route; flows that
// share a link share its bandwidth by max-min fairness (progressive filling: raise every unfrozen
// flow's rate together until some link is full, freeze the flows on it, repeat). A single flow
// alone on its route takes  latency(route) + B / min bandwidth(route)  seconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ring::sim {

struct Link {
  int from = 0;
  int to = 0;
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // s
  std::string kind;      // "nvlink", "nic", "uplink", "global", "torus", ... (for reports)
};

class Network {
 public:
  int add_vertex(std::string name);
  // One directed link; returns its id.
  int add_link(int from, int to, double bandwidth, double latency, std::string kind);
  // Both directions with the same parameters; returns the id of from->to (to->from is id + 1).
  int add_duplex(int a, int b, double bandwidth, double latency, std::string kind);

  const Link& link(int id) const { return links_[id]; }
  Link& link(int id) { return links_[id]; }
  int link_count() const { return static_cast<int>(links_.size()); }
  int vertex_count() const { return static_cast<int>(names_.size()); }
  const std::string& vertex_name(int v) const { return names_[v]; }
  // The link from -> to, or -1.
  int find_link(int from, int to) const;
  // Shortest route by hop count (BFS, ties broken by lowest link id); empty when from == to.
  // Throws std::runtime_error when `to` is unreachable.
  std::vector<int> shortest_route(int from, int to) const;
  const std::vector<int>& out_links(int v) const { return out_[v]; }

  double route_latency(const std::vector<int>& route) const;
  double route_bandwidth(const std::vector<int>& route) const;  // min over links; inf if empty

 private:
  std::vector<std::string> names_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_;
};

// Max-min fair rates of flows on links (progressive filling). `routes[f]` lists flow f's links;
// a flow with an empty route gets `unbounded` (intra-device copies). The workspace keeps its
// buffers between calls so that solving in a loop does not allocate.
class MaxMinSolver {
 public:
  // capacity: bytes/s of every link (indexed by link id). weights (optional, > 0): flow f stands
  // for weights[f] alike flows on its route and gets that many shares (its rate is theirs
  // together); without, every flow weighs 1.
  void solve(const std::vector<double>& capacity, const std::vector<const std::vector<int>*>& routes,
             std::vector<double>* rates, double unbounded = 1e30,
             const std::vector<double>* weights = nullptr);

 private:
  std::vector<double> remaining_;
  std::vector<int> unfrozen_count_;
  std::vector<double> unfrozen_weight_;
  std::vector<int> touched_;
  std::vector<char> frozen_;
  std::vector<char> link_seen_;
  std::vector<int> link_begin_, link_flows_, fill_;  // CSR: flows on each touched link
  std::vector<int> local_;                           // link id -> index into touched_
  std::vector<std::pair<double, int>> heap_;         // (share, touched index), lazy
};

}  // namespace ring::sim
