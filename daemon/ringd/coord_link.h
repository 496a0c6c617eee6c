// ringd's link to ring-coord (`ringd --coord ENDPOINT --job ID`): a thread that owns the
// coordinator's DaemonLink (coordinator/daemon_link.h), so heartbeats never wait for training.
//
// In: ringd's reports (steps, events) through the thread-safe send()/report(), its progress
// (attempt, last step) through set_progress(). Out: what the coordinator says (registered with
// the job's assignment, commands) handed to a callback on the link thread; ringd posts it into its
// own event loop. The DaemonLink queues while the coordinator is away and reconnects by itself;
// on `not_registered` (the coordinator restarted) it registers again.
//
// sync() sends a registration and the coordinator's answer (`registered`, carrying the job's
// state) comes back after every earlier message of this connection was handled: ringd uses it as
// a barrier before it exits (its last events are recorded) and to learn the job's state after a
// stop command (cancelled, failed, or restarting: wait for roll_back).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/protocol/protocol.h"
#include "daemon/placement/cpu_topology.h"
#include "daemon/placement/gpu_topology.h"

namespace ring::coord {
class DaemonLink;
}

namespace ring::ringd {

struct CoordLinkOptions {
  std::string endpoint;  // ipc://PATH or tcp://HOST:PORT (tcp: RING_COORD_SERVER_KEY and
                         // RING_COORD_CLIENT_KEY name the key files, as for ringctl)
  int64_t job = 0;
  protocol::Register registration;  // node, gpus, topology, version (jobs are filled in)
};

class CoordLink {
 public:
  // on_message runs on the link thread for every coordinator message (registered, command,
  // error); it must not block.
  CoordLink(CoordLinkOptions opts, std::function<void(const protocol::Message&)> on_message);
  ~CoordLink();
  CoordLink(const CoordLink&) = delete;
  CoordLink& operator=(const CoordLink&) = delete;

  const std::string& node() const { return opts_.registration.node; }
  int64_t job() const { return opts_.job; }

  // The job's assignment from the first `registered`, waiting up to `timeout` (nullopt: no
  // answer, or the coordinator did not list the job).
  std::optional<protocol::Assignment> wait_registered(std::chrono::milliseconds timeout);
  // Sends a registration now; the answer arrives through on_message (and sync_done()).
  void sync();
  // Sends a registration and waits up to `timeout` for its answer; false on timeout.
  bool sync_and_wait(std::chrono::milliseconds timeout);

  // What heartbeats and registrations say about the job.
  void set_progress(int64_t attempt, int64_t step);
  // Queues a daemon message (step, event, command_ack) for the link thread.
  void send(protocol::Message m);
  // ringd's event (daemon/INTERFACE.md names) as a protocol event, when it maps to one.
  void report(const std::string& name, const nlohmann::json& fields);
  void ack(int64_t command_id, bool ok, const std::string& error = "");

  double heartbeat_interval_s() const { return interval_s_.load(); }

 private:
  void loop(coord::DaemonLink& link);

  CoordLinkOptions opts_;
  std::function<void(const protocol::Message&)> on_message_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<protocol::Message> out_;
  int64_t sync_requests_ = 0;  // registrations asked for by sync()
  int64_t registered_ = 0;     // `registered` answers received
  std::optional<protocol::Assignment> first_;
  bool stop_ = false;
  std::atomic<int64_t> attempt_{0}, step_{0};
  std::atomic<double> interval_s_{1.0};
  std::thread thread_;
};

// The node name ringd registers with: "<host>-j<job>-n<node rank>", where <host> is
// $SLURMD_NODENAME under Slurm (the name Slurm and the cluster topology use), else the short
// host name. Unique per job and node rank, so several ringd on one host (two jobs, or two steps
// of one job) never share a name; ring-coord maps the name back to <host> for the cluster
// topology (coordinator.cc, host_of_node).
std::string coord_node_name(int64_t job, int node_rank);

// What ringd found on its node at start-up (placement discovery runs once per ringd: placement
// and the registration read the same facts). Absent: that discovery failed (said in its log).
struct NodeFacts {
  std::optional<placement::GpuTopology> gpus;
  std::optional<placement::CpuTopology> cpu;
};

// ringd's registration for `job`: its node name, GPUs and topology (what discovery found;
// defaults where it failed), the job.
protocol::Register make_registration(int64_t job, int node_rank, int workers_per_node,
                                     const NodeFacts& facts);

}  // namespace ring::ringd
