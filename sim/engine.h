// A discrete-event engine of tasks with dependencies.
//
// Three kinds of task:
// - compute: `duration` seconds on a device; a device runs one compute task at a time, in the
//   order they became ready (ties: lower task id first), like a GPU stream.
// - flow: `bytes` over a route of the network; it starts when ready (+ `delay`, a send held
//   back on purpose), shares every link of its route with the other active flows by max-min
//   fairness (rates recomputed whenever a flow starts or finishes transmitting), and completes
//   the route's latency after its last byte left: a flow alone takes delay + bytes / bw + latency.
// - join: zero time; completes when its dependencies have (a point to depend on).
// A task is ready when every task it depends on has completed.
//
// run() reuses its buffers (active flows, per-link flow lists, the component and rate
// workspaces, the event heap): once they have grown to the job's size, events allocate nothing.
// A flow's progress is kept lazily (remaining bytes at its last rate change, a drain event that
// a later change supersedes), and a start or drain recomputes rates only for the flows connected
// to it through shared links, so an event costs O(log events + its component), not O(flows).
#pragma once

#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "sim/network.h"

namespace ring::sim {

enum class TaskKind : uint8_t { kCompute, kFlow, kJoin };

struct Task {
  TaskKind kind = TaskKind::kJoin;
  int device = -1;  // compute
  int route = -1;   // flow: index into the engine's routes
  double duration = 0;
  double bytes = 0;
  double delay = 0;
  double extra_latency = 0;  // flow: added to the route's latency (a chain of steps folded in one)
  double weight = 1;         // flow: stands for this many alike flows (max-min shares; bytes are
                             // theirs together)
  // What it is, for reports and traces: a track (rank / node), a phase, a layer and a step.
  int track = 0;
  int phase = 0;
  int layer = -1;
  int step = -1;
  // Filled by run().
  double ready = -1, start = -1, end = -1;
};

class Engine {
 public:
  // capacity: bytes/s per link of `net`, usually net.link(i).bandwidth (a what-if can slow one).
  Engine(const Network* net, std::vector<double> capacity);
  explicit Engine(const Network* net);

  int add_route(std::vector<int> links);
  // Devices that share one host's cores (ranks and daemons of several "nodes" on one machine):
  // while n compute tasks of the host's devices run at once, each progresses at speed[n - 1] x
  // its own rate (processor sharing; beyond the table, speed.back() x speed.size() / n).
  // speed[0] is 1 for a table measured relative to one task alone. Returns the host's id.
  // `poll`: a device marked `polls` that runs no compute still loads the host as poll x one
  // process (a rank waiting for a transfer polls for it); fractional loads interpolate speed.
  int add_host(std::vector<double> speed, double poll = 0);
  void set_device_host(int device, int host, bool polls = false);
  // A route through shaped links of a shared host (bench/link_probe.py's link model): each flow
  // on it passes its first `credit_bytes` without taking time (a token bucket's burst), and
  // while it transmits at r bytes/s it loads `host` as cpu_s_per_byte x r processes (the
  // transport's CPU time: the host's compute tasks slow down as with that many more processes).
  // `latency`: seconds added to every flow's completion (a per-message cost).
  void set_route_model(int route, double credit_bytes, double latency, int host = -1,
                       double cpu_s_per_byte = 0);
  int compute(int device, double seconds, int track, int phase, int layer = -1, int step = -1);
  int flow(int route, double bytes, int track, int phase, int layer = -1, int step = -1,
           double delay = 0);
  int join(int track = 0, int phase = 0);
  // `task` starts only after `on` completed. on < 0 is ignored (no such task).
  void depend(int task, int on);
  // A flow's ready time is at least t (an absolute start, e.g. the step's beginning).
  void not_before(int task, double t) { release_[task] = t; }
  void add_latency(int task, double seconds) { tasks_[task].extra_latency += seconds; }
  // A flow that stands for w alike flows on its route (w > 0): it gets w max-min shares, so
  // with w times one flow's bytes it ends when each of them would.
  void set_weight(int task, double w) { tasks_[task].weight = w > 0 ? w : 1; }

  // Runs every task to completion; returns the time of the last completion. Throws
  // std::runtime_error when tasks remain that can never run (a dependency cycle).
  double run();

  const Task& task(int id) const { return tasks_[id]; }
  // The task whose completion let `id` start (its last dependency, or the compute task before
  // it on its device when it had to queue); -1 for a task that was ready at 0.
  int cause(int id) const { return cause_[id]; }
  // The chain of causes back from `id` (the critical path when `id` ends last), last first.
  std::vector<int> critical_path(int id) const;
  int task_count() const { return static_cast<int>(tasks_.size()); }
  const std::vector<int>& route(int id) const { return routes_[id]; }
  int64_t events() const { return events_; }

 private:
  void make_ready(int id, double t);
  void start_flow(int id, double t);
  void complete(int id, double t);
  void update_components();
  void drain(int id, double t);
  void start_compute(int id, double t);
  void reshare(int host, double t);
  double host_speed(int host, double n) const;
  double flow_latency(const Task& k) const;  // route latency + extra + the route model's

  const Network* net_;
  std::vector<double> capacity_;
  std::vector<std::vector<int>> routes_;
  std::vector<Task> tasks_;
  std::vector<double> release_;
  std::vector<std::pair<int, int>> edges_;  // (on, task)
  // Built by run(): successors in CSR form and pending dependency counts.
  std::vector<int> succ_begin_, succ_;
  std::vector<int> pending_;
  std::vector<int> cause_;

  // Devices: ready compute tasks waiting, and whether each device is busy.
  struct DeviceState {
    std::vector<int> queue;  // FIFO (index head_)
    size_t head = 0;
    bool busy = false;
  };
  std::vector<DeviceState> devices_;
  std::vector<int> device_host_;  // per device: host id or -1 (a core of its own)
  std::vector<char> device_polls_;
  struct HostState {
    std::vector<double> speed;
    std::vector<int> active;  // compute tasks running on the host's devices
    double cur = 1;           // their speed now
    double poll = 0;
    int pollers = 0;          // devices marked polls
    double flow_load = 0;     // transmitting flows' CPU, in processes
  };
  struct RouteModel {
    double credit = 0;
    double latency = 0;
    int host = -1;
    double load = 0;
  };
  std::vector<RouteModel> route_model_;  // per route (empty: none); load: CPU s per byte
  std::vector<int> load_changed_;        // hosts whose flow load changed in update_components
  std::vector<HostState> hosts_;

  // Timed events: (time, seq, task, what).
  enum class Ev : uint8_t { kComputeDone, kFlowDone, kRelease, kDrain };
  struct Event {
    double t;
    int64_t seq;
    int task;
    Ev what;
    int64_t version = 0;  // kDrain: the flow's version when scheduled
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> heap_;
  int64_t seq_ = 0;

  // Active flows (transmitting). Progress is lazy: a flow's remaining bytes are exact at
  // t_upd_, and it drains at t_upd_ + remaining / rate unless its rate changes first (then its
  // version moves on and the old drain event is ignored). When a flow starts or drains, only the
  // flows connected to it through shared links get new rates (max-min fairness decomposes over
  // such components).
  std::vector<int> active_;        // task ids
  std::vector<int> active_pos_;    // per task: index in active_, -1 when not active
  std::vector<double> remaining_;  // per task
  std::vector<double> rate_;       // per task
  std::vector<double> t_upd_;      // per task
  std::vector<int64_t> version_;   // per task
  std::vector<std::vector<int>> on_link_;  // active flows per link
  std::vector<int> dirty_links_;
  std::vector<char> link_mark_, flow_mark_;
  std::vector<int> comp_flows_, comp_links_;
  std::vector<const std::vector<int>*> comp_routes_;
  std::vector<double> comp_rates_, comp_weights_;
  MaxMinSolver solver_;
  double now_ = 0;
  int64_t events_ = 0;
};

}  // namespace ring::sim
