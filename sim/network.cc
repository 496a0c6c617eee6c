#include "sim/network.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>

#include "fmt/format.h"

namespace ring::sim {

int Network::add_vertex(std::string name) {
  names_.push_back(std::move(name));
  out_.emplace_back();
  return static_cast<int>(names_.size()) - 1;
}

int Network::add_link(int from, int to, double bandwidth, double latency, std::string kind) {
  if (from < 0 || to < 0 || from >= vertex_count() || to >= vertex_count() || from == to)
    throw std::invalid_argument(fmt::format("network: bad link {} -> {}", from, to));
  if (!(bandwidth > 0) || !(latency >= 0))
    throw std::invalid_argument(fmt::format(
        "network: link {} -> {} needs bandwidth > 0 and latency >= 0 (got {} B/s, {} s)",
        names_[from], names_[to], bandwidth, latency));
  links_.push_back({from, to, bandwidth, latency, std::move(kind)});
  const int id = static_cast<int>(links_.size()) - 1;
  out_[from].push_back(id);
  return id;
}

int Network::add_duplex(int a, int b, double bandwidth, double latency, std::string kind) {
  const int id = add_link(a, b, bandwidth, latency, kind);
  add_link(b, a, bandwidth, latency, std::move(kind));
  return id;
}

int Network::find_link(int from, int to) const {
  for (int id : out_[from])
    if (links_[id].to == to) return id;
  return -1;
}

std::vector<int> Network::shortest_route(int from, int to) const {
  if (from == to) return {};
  std::vector<int> via(names_.size(), -1);  // link that reached the vertex
  std::vector<char> seen(names_.size(), 0);
  std::deque<int> q{from};
  seen[from] = 1;
  while (!q.empty() && !seen[to]) {
    const int v = q.front();
    q.pop_front();
    for (int id : out_[v]) {
      const int w = links_[id].to;
      if (seen[w]) continue;
      seen[w] = 1;
      via[w] = id;
      q.push_back(w);
    }
  }
  if (!seen[to])
    throw std::runtime_error(
        fmt::format("network: no route from {} to {}", names_[from], names_[to]));
  std::vector<int> route;
  for (int v = to; v != from; v = links_[via[v]].from) route.push_back(via[v]);
  std::reverse(route.begin(), route.end());
  return route;
}

double Network::route_latency(const std::vector<int>& route) const {
  double s = 0;
  for (int id : route) s += links_[id].latency;
  return s;
}

double Network::route_bandwidth(const std::vector<int>& route) const {
  double b = std::numeric_limits<double>::infinity();
  for (int id : route) b = std::min(b, links_[id].bandwidth);
  return b;
}

void MaxMinSolver::solve(const std::vector<double>& capacity,
                         const std::vector<const std::vector<int>*>& routes,
                         std::vector<double>* rates, double unbounded,
                         const std::vector<double>* weights) {
  const size_t nf = routes.size();
  auto wt = [&](size_t f) { return weights ? (*weights)[f] : 1.0; };
  rates->assign(nf, 0.0);
  if (remaining_.size() < capacity.size()) {
    remaining_.resize(capacity.size());
    unfrozen_count_.resize(capacity.size());
    unfrozen_weight_.resize(capacity.size());
    link_seen_.resize(capacity.size());
  }
  frozen_.assign(nf, 0);
  touched_.clear();
  size_t left = 0;
  for (size_t f = 0; f < nf; ++f) {
    if (routes[f]->empty()) {
      (*rates)[f] = unbounded;
      frozen_[f] = 1;
      continue;
    }
    ++left;
    for (int l : *routes[f]) {
      if (!link_seen_[l]) {
        link_seen_[l] = 1;
        touched_.push_back(l);
        remaining_[l] = capacity[l];
        unfrozen_count_[l] = 0;
        unfrozen_weight_[l] = 0;
      }
      ++unfrozen_count_[l];
      unfrozen_weight_[l] += wt(f);
    }
  }
  // Bottleneck filling: the link with the least fair share x = remaining / unfrozen flows fixes
  // all its unfrozen flows at x; they leave every other link they use. Equivalent to raising all
  // rates together until a link saturates. A link's share never decreases as flows freeze
  // (x is the least share), so a lazy min-heap of shares finds the next bottleneck.
  if (local_.size() < capacity.size()) local_.resize(capacity.size());
  const size_t nt = touched_.size();
  for (size_t i = 0; i < nt; ++i) local_[touched_[i]] = static_cast<int>(i);
  link_begin_.assign(nt + 1, 0);
  for (size_t f = 0; f < nf; ++f)
    if (!frozen_[f])
      for (int l : *routes[f]) ++link_begin_[local_[l] + 1];
  for (size_t i = 0; i < nt; ++i) link_begin_[i + 1] += link_begin_[i];
  link_flows_.resize(link_begin_[nt]);
  fill_.assign(link_begin_.begin(), link_begin_.end() - 1);
  for (size_t f = 0; f < nf; ++f)
    if (!frozen_[f])
      for (int l : *routes[f]) link_flows_[fill_[local_[l]]++] = static_cast<int>(f);
  heap_.clear();
  // Per unit of weight: a flow of weight w stands for w flows and gets w shares.
  auto share_of = [&](int l) { return std::max(0.0, remaining_[l]) / unfrozen_weight_[l]; };
  for (size_t i = 0; i < nt; ++i) heap_.emplace_back(share_of(touched_[i]), static_cast<int>(i));
  auto cmp = [](const std::pair<double, int>& a, const std::pair<double, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  };
  std::make_heap(heap_.begin(), heap_.end(), cmp);
  while (left > 0 && !heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), cmp);
    const auto [x, li] = heap_.back();
    heap_.pop_back();
    const int l = touched_[li];
    if (unfrozen_count_[l] == 0) continue;
    const double share = share_of(l);
    if (share > x * (1 + 1e-15) + 1e-300) {  // stale: its flows changed since it was pushed
      heap_.emplace_back(share, li);
      std::push_heap(heap_.begin(), heap_.end(), cmp);
      continue;
    }
    for (int k = link_begin_[li]; k < link_begin_[li + 1]; ++k) {
      const int f = link_flows_[k];
      if (frozen_[f]) continue;
      frozen_[f] = 1;
      (*rates)[f] = share * wt(f);
      --left;
      for (int m : *routes[f]) {
        remaining_[m] -= share * wt(f);
        --unfrozen_count_[m];
        unfrozen_weight_[m] -= wt(f);
      }
    }
  }
  for (int l : touched_) link_seen_[l] = 0;
}

}  // namespace ring::sim
