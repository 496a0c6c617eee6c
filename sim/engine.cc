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

int Engine::add_host(std::vector<double> speed, double poll) {
  if (speed.empty()) speed = {1.0};
  for (double& x : speed) x = std::max(x, 1e-9);
  hosts_.push_back({std::move(speed), {}, 1.0, std::max(0.0, poll), 0});
  return static_cast<int>(hosts_.size()) - 1;
}

void Engine::set_device_host(int device, int host, bool polls) {
  if (device >= static_cast<int>(devices_.size())) devices_.resize(device + 1);
  if (device >= static_cast<int>(device_host_.size())) {
    device_host_.resize(device + 1, -1);
    device_polls_.resize(device + 1, 0);
  }
  device_host_[device] = host;
  device_polls_[device] = polls;
  if (polls) ++hosts_[host].pollers;
}

void Engine::set_route_model(int route, double credit_bytes, double latency, int host,
                             double cpu_s_per_byte) {
  if (route_model_.size() < routes_.size()) route_model_.resize(routes_.size());
  route_model_[route] = {std::max(0.0, credit_bytes), std::max(0.0, latency), host,
                         std::max(0.0, cpu_s_per_byte)};
}

double Engine::flow_latency(const Task& k) const {
  double l = net_->route_latency(routes_[k.route]) + k.extra_latency;
  if (k.route < static_cast<int>(route_model_.size())) l += route_model_[k.route].latency;
  return l;
}

// speed[n-1] for a load of n processes; between whole numbers linear; below one process 1;
// beyond the table speed.back() x size / n.
double Engine::host_speed(int host, double n) const {
  const auto& sp = hosts_[host].speed;
  if (n <= 1) return sp[0];
  const double m = static_cast<double>(sp.size());
  if (n >= m) return sp.back() * m / n;
  const size_t i = static_cast<size_t>(n);  // 1 <= i < size
  const double f = n - static_cast<double>(i);
  return sp[i - 1] + f * (sp[i] - sp[i - 1]);
}

// A compute task takes its device: alone on its core it ends after its duration; on a shared
// host it joins the host's running tasks, and every one of them gets the host's new speed.
void Engine::start_compute(int id, double t) {
  Task& k = tasks_[id];
  k.start = t;
  const int h = k.device < static_cast<int>(device_host_.size()) ? device_host_[k.device] : -1;
  if (h < 0) {
    heap_.push({t + k.duration, seq_++, id, Ev::kComputeDone});
    return;
  }
  remaining_[id] = k.duration;
  t_upd_[id] = t;
  rate_[id] = 0;
  hosts_[h].active.push_back(id);
  reshare(h, t);
}

// Progress of the host's running tasks up to t at the old speed, then the speed for their new
// number and new completion events (older ones are superseded by the version).
void Engine::reshare(int h, double t) {
  HostState& hs = hosts_[h];
  for (int f : hs.active) {
    remaining_[f] = std::max(0.0, remaining_[f] - rate_[f] * (t - t_upd_[f]));
    t_upd_[f] = t;
  }
  int polling_busy = 0;
  for (int f : hs.active) polling_busy += device_polls_[tasks_[f].device];
  hs.cur = host_speed(h, static_cast<double>(hs.active.size()) +
                             hs.poll * static_cast<double>(hs.pollers - polling_busy) +
                             std::max(0.0, hs.flow_load));
  for (int f : hs.active) {
    rate_[f] = hs.cur;
    ++version_[f];
    heap_.push({t + remaining_[f] / hs.cur, seq_++, f, Ev::kComputeDone, version_[f]});
  }
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
        start_compute(id, t);
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
  const RouteModel* rm =
      k.route < static_cast<int>(route_model_.size()) ? &route_model_[k.route] : nullptr;
  const double bytes = rm ? std::max(0.0, k.bytes - rm->credit) : k.bytes;
  if (bytes <= 0 || routes_[k.route].empty()) {
    heap_.push({t + flow_latency(k), seq_++, id, Ev::kFlowDone});
    return;
  }
  remaining_[id] = bytes;
  rate_[id] = 0;
  t_upd_[id] = t;
  active_pos_[id] = static_cast<int>(active_.size());
  active_.push_back(id);
  for (int l : routes_[k.route]) {
    on_link_[l].push_back(id);
    dirty_links_.push_back(l);
  }
}

// The flow's last byte has left: it leaves its links (their other flows get new rates) and
// completes after the route's latency.
void Engine::drain(int id, double t) {
  const Task& k = tasks_[id];
  remaining_[id] = 0;
  const int pos = active_pos_[id];
  active_[pos] = active_.back();
  active_pos_[active_[pos]] = pos;
  active_.pop_back();
  active_pos_[id] = -1;
  ++version_[id];
  for (int l : routes_[k.route]) {
    auto& v = on_link_[l];
    v.erase(std::find(v.begin(), v.end(), id));
    dirty_links_.push_back(l);
  }
  if (k.route < static_cast<int>(route_model_.size())) {
    const RouteModel& rm = route_model_[k.route];
    if (rm.host >= 0 && rm.load > 0) {
      hosts_[rm.host].flow_load = std::max(0.0, hosts_[rm.host].flow_load - rm.load * rate_[id]);
      reshare(rm.host, t);
    }
  }
  heap_.push({t + flow_latency(k), seq_++, id, Ev::kFlowDone});
}

// New max-min rates for the flows connected (through shared links) to the links that changed.
void Engine::update_components() {
  comp_flows_.clear();
  comp_links_.clear();
  for (int l : dirty_links_)
    if (!link_mark_[l]) link_mark_[l] = 1, comp_links_.push_back(l);
  dirty_links_.clear();
  for (size_t i = 0; i < comp_links_.size(); ++i) {
    for (int f : on_link_[comp_links_[i]]) {
      if (flow_mark_[f]) continue;
      flow_mark_[f] = 1;
      comp_flows_.push_back(f);
      for (int m : routes_[tasks_[f].route])
        if (!link_mark_[m]) link_mark_[m] = 1, comp_links_.push_back(m);
    }
  }
  comp_routes_.clear();
  comp_weights_.clear();
  bool weighted = false;
  for (int f : comp_flows_) {
    comp_weights_.push_back(tasks_[f].weight);
    weighted = weighted || tasks_[f].weight != 1;
    // Bring the flow's progress up to now at its old rate.
    remaining_[f] = std::max(0.0, remaining_[f] - rate_[f] * (now_ - t_upd_[f]));
    t_upd_[f] = now_;
    comp_routes_.push_back(&routes_[tasks_[f].route]);
  }
  solver_.solve(capacity_, comp_routes_, &comp_rates_, 1e30, weighted ? &comp_weights_ : nullptr);
  for (size_t i = 0; i < comp_flows_.size(); ++i) {
    const int f = comp_flows_[i];
    const double r = std::max(comp_rates_[i], 1e-300);
    if (tasks_[f].route < static_cast<int>(route_model_.size())) {
      const RouteModel& rm = route_model_[tasks_[f].route];
      if (rm.host >= 0 && rm.load > 0) {
        hosts_[rm.host].flow_load += rm.load * (r - rate_[f]);
        if (std::find(load_changed_.begin(), load_changed_.end(), rm.host) == load_changed_.end())
          load_changed_.push_back(rm.host);
      }
    }
    flow_mark_[f] = 0;
    // The same rate: its drain event stands (progress is exact at now at either rate), which
    // spares the heap a push for every flow of a large component that a small change leaves be.
    if (r == rate_[f]) continue;
    rate_[f] = r;
    ++version_[f];
    heap_.push({now_ + remaining_[f] / rate_[f], seq_++, f, Ev::kDrain, version_[f]});
  }
  for (int l : comp_links_) link_mark_[l] = 0;
  for (int h : load_changed_) reshare(h, now_);
  load_changed_.clear();
}

void Engine::complete(int id, double t) {
  Task& k = tasks_[id];
  k.end = t;
  if (k.kind == TaskKind::kCompute) {
    DeviceState& d = devices_[k.device];
    d.busy = false;
    const int h = k.device < static_cast<int>(device_host_.size()) ? device_host_[k.device] : -1;
    if (h >= 0) {
      auto& act = hosts_[h].active;
      act.erase(std::find(act.begin(), act.end(), id));
      reshare(h, t);
    }
    if (d.head < d.queue.size()) {
      const int next = d.queue[d.head++];
      d.busy = true;
      cause_[next] = id;
      start_compute(next, t);
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
  rate_.assign(n, 0);
  t_upd_.assign(n, 0);
  version_.assign(n, 0);
  active_pos_.assign(n, -1);
  cause_.assign(n, -1);
  on_link_.assign(net_->link_count(), {});
  link_mark_.assign(net_->link_count(), 0);
  flow_mark_.assign(n, 0);
  now_ = 0;
  for (auto& h : hosts_) h.active.clear(), h.cur = 1, h.flow_load = 0;
  // The tasks ready at 0, collected first: completing one makes others ready on the way.
  std::vector<int> initial;
  for (int i = 0; i < n; ++i)
    if (pending_[i] == 0) initial.push_back(i);
  for (int i : initial) make_ready(i, 0.0);
  if (!dirty_links_.empty()) update_components();

  double last = 0;
  while (!heap_.empty()) {
    // Every event of one instant, then new rates once for what changed.
    now_ = heap_.top().t;
    last = std::max(last, now_);
    while (!heap_.empty() && heap_.top().t == now_) {
      const Event e = heap_.top();
      heap_.pop();
      ++events_;
      switch (e.what) {
        case Ev::kRelease:
          start_flow(e.task, now_);
          break;
        case Ev::kDrain:
          if (e.version == version_[e.task] && active_pos_[e.task] >= 0) drain(e.task, now_);
          break;
        case Ev::kComputeDone: {
          const Task& k = tasks_[e.task];
          const bool shared = k.device < static_cast<int>(device_host_.size()) &&
                              device_host_[k.device] >= 0;
          if (!shared || e.version == version_[e.task]) complete(e.task, now_);
          break;
        }
        case Ev::kFlowDone:
          complete(e.task, now_);
          break;
      }
    }
    if (!dirty_links_.empty()) update_components();
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
