#include "sim/engine.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "fmt/format.h"

namespace ring::sim {

Engine::Engine(const Network* net, std::vector<double> capacity)
    : net_(net), capacity_(std::move(capacity)) {}

Engine::Engine(const Network* net) : net_(net) {
  capacity_.resize(net->link_count());
  for (int i = 0; i < net->link_count(); ++i) capacity_[i] = net->link(i).bandwidth;
}

int Engine::add_route(std::vector<int> links) {
  routes_.push_back(std::move(links));
  return static_cast<int>(routes_.size()) - 1;
}

int Engine::compute(int device, double seconds, int track, int phase, int layer, int step) {
  Task t;
  t.kind = TaskKind::kCompute;
  t.device = device;
  t.duration = std::max(0.0, seconds);
  t.track = track;
  t.phase = phase;
  t.layer = layer;
  t.step = step;
  tasks_.push_back(t);
  release_.push_back(0);
  if (device >= static_cast<int>(devices_.size())) devices_.resize(device + 1);
  return static_cast<int>(tasks_.size()) - 1;
}

int Engine::flow(int route, double bytes, int track, int phase, int layer, int step,
                 double delay) {
  Task t;
  t.kind = TaskKind::kFlow;
  t.route = route;
  t.bytes = std::max(0.0, bytes);
  t.delay = std::max(0.0, delay);
  t.track = track;
  t.phase = phase;
  t.layer = layer;
  t.step = step;
  tasks_.push_back(t);
  release_.push_back(0);
  return static_cast<int>(tasks_.size()) - 1;
}

int Engine::join(int track, int phase) {
  Task t;
  t.kind = TaskKind::kJoin;
  t.track = track;
  t.phase = phase;
  tasks_.push_back(t);
  release_.push_back(0);
  return static_cast<int>(tasks_.size()) - 1;
}

void Engine::depend(int task, int on) {
  if (on >= 0) edges_.emplace_back(on, task);
}

void Engine::make_ready(int id, double t) {
  Task& k = tasks_[id];
  k.ready = t;
  switch (k.kind) {
    case TaskKind::kJoin:
      k.start = t;
      complete(id, t);
      break;
    case TaskKind::kCompute: {
      DeviceState& d = devices_[k.device];
      if (!d.busy) {
        d.busy = true;
        k.start = t;
        heap_.push({t + k.duration, seq_++, id, Ev::kComputeDone});
      } else {
        d.queue.push_back(id);
      }
      break;
    }
    case TaskKind::kFlow: {
      const double at = std::max(t + k.delay, release_[id]);
      if (at > t)
        heap_.push({at, seq_++, id, Ev::kRelease});
      else
        start_flow(id, t);
      break;
    }
  }
}

void Engine::start_flow(int id, double t) {
  Task& k = tasks_[id];
  k.start = t;
  if (k.bytes <= 0 || routes_[k.route].empty()) {
    heap_.push({t + net_->route_latency(routes_[k.route]) + k.extra_latency, seq_++, id, Ev::kFlowDone});
    return;
  }
  remaining_[id] = k.bytes;
  active_.push_back(id);
  rates_dirty_ = true;
}

void Engine::complete(int id, double t) {
  Task& k = tasks_[id];
  k.end = t;
  if (k.kind == TaskKind::kCompute) {
    DeviceState& d = devices_[k.device];
    d.busy = false;
    if (d.head < d.queue.size()) {
      const int next = d.queue[d.head++];
      d.busy = true;
      cause_[next] = id;
      tasks_[next].start = t;
      heap_.push({t + tasks_[next].duration, seq_++, next, Ev::kComputeDone});
    }
  }
  for (int i = succ_begin_[id]; i < succ_begin_[id + 1]; ++i) {
    const int s = succ_[i];
    if (--pending_[s] == 0) {
      cause_[s] = id;
      make_ready(s, t);
    }
  }
}

void Engine::recompute_rates() {
  active_routes_.clear();
  for (int id : active_) active_routes_.push_back(&routes_[tasks_[id].route]);
  solver_.solve(capacity_, active_routes_, &rate_);
  rates_dirty_ = false;
}

double Engine::run() {
  const int n = task_count();
  // CSR of successors.
  succ_begin_.assign(n + 1, 0);
  pending_.assign(n, 0);
  for (const auto& [on, t] : edges_) {
    ++succ_begin_[on + 1];
    ++pending_[t];
  }
  for (int i = 0; i < n; ++i) succ_begin_[i + 1] += succ_begin_[i];
  succ_.assign(edges_.size(), 0);
  {
    std::vector<int> fill(succ_begin_.begin(), succ_begin_.end() - 1);
    for (const auto& [on, t] : edges_) succ_[fill[on]++] = t;
  }
  remaining_.assign(n, 0);
  cause_.assign(n, -1);
  active_.reserve(1024);
  rate_.reserve(1024);
  active_routes_.reserve(1024);
  now_ = 0;
  // The tasks ready at 0, collected first: completing one makes others ready on the way.
  std::vector<int> initial;
  for (int i = 0; i < n; ++i)
    if (pending_[i] == 0) initial.push_back(i);
  for (int i : initial) make_ready(i, 0.0);
  if (rates_dirty_) recompute_rates();

  double last = 0;
  while (!heap_.empty() || !active_.empty()) {
    ++events_;
    if (rates_dirty_) recompute_rates();
    // The next flow to drain.
    double dt_flow = std::numeric_limits<double>::infinity();
    for (size_t a = 0; a < active_.size(); ++a)
      dt_flow = std::min(dt_flow, remaining_[active_[a]] / rate_[a]);
    const double t_flow = now_ + dt_flow;
    const double t_ev = heap_.empty() ? std::numeric_limits<double>::infinity() : heap_.top().t;
    if (t_flow <= t_ev) {
      // Advance every active flow; those that drained leave (their latency still to come).
      size_t w = 0;
      for (size_t a = 0; a < active_.size(); ++a) {
        const int id = active_[a];
        const double left = remaining_[id] - rate_[a] * dt_flow;
        if (left <= 1e-12 * tasks_[id].bytes || remaining_[id] / rate_[a] <= dt_flow) {
          remaining_[id] = 0;
          heap_.push({t_flow + net_->route_latency(routes_[tasks_[id].route]) +
                          tasks_[id].extra_latency,
                      seq_++, id, Ev::kFlowDone});
        } else {
          remaining_[id] = left;
          rate_[w] = rate_[a];
          active_[w++] = id;
        }
      }
      active_.resize(w);
      rate_.resize(w);
      rates_dirty_ = true;
      now_ = t_flow;
      continue;
    }
    // A timed event first: advance the active flows to it.
    const Event e = heap_.top();
    heap_.pop();
    const double dt = e.t - now_;
    if (dt > 0)
      for (size_t a = 0; a < active_.size(); ++a) remaining_[active_[a]] -= rate_[a] * dt;
    now_ = e.t;
    last = std::max(last, now_);
    auto handle = [&](const Event& ev) {
      switch (ev.what) {
        case Ev::kRelease:
          start_flow(ev.task, now_);
          break;
        case Ev::kComputeDone:
        case Ev::kFlowDone:
          complete(ev.task, now_);
          break;
      }
    };
    handle(e);
    // Every event of the same instant before the rates are recomputed once (ranks in lockstep
    // start their hops together).
    while (!heap_.empty() && heap_.top().t == now_) {
      const Event same = heap_.top();
      heap_.pop();
      handle(same);
    }
  }
  for (int i = 0; i < n; ++i)
    if (tasks_[i].end < 0)
      throw std::runtime_error(fmt::format(
          "simulation: task {} (track {}, phase {}) never ran: its dependencies form a cycle", i,
          tasks_[i].track, tasks_[i].phase));
  for (const Task& t : tasks_) last = std::max(last, t.end);
  return last;
}

std::vector<int> Engine::critical_path(int id) const {
  std::vector<int> path;
  for (int t = id; t >= 0; t = cause_[t]) path.push_back(t);
  return path;
}

}  // namespace ring::sim
