// ring-coord's engine: the ZeroMQ ROUTER endpoints, the ZAP handler and the job logic over the
// Store, in ONE thread.
//
// Threading model: run() owns every socket and the database connection. It blocks in zmq::poll
// on the listeners and the ZAP socket with a timeout of at most tick_s, handles every message to
// completion (one SQLite transaction per message; replies and commands are sent after commit),
// then runs the timers: missed heartbeats, due restarts, batched step metrics and heartbeat
// times. stop() may be called from any thread or a signal handler; run() returns within tick_s.
//
// Durability: job state, attempts, membership, events and checkpoints are committed before the
// reply (or the command they cause) is sent. Step metrics and heartbeat times are batched (at
// most metrics_flush_s and heartbeat_flush_s old) because they arrive at 1000s per second and
// are re-sent or superseded; nothing else is batched.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/security.h"

namespace ring::coord {

struct CoordinatorOptions {
  std::string state_dir;               // coord.db, coord.lock, curve/ (created 0700)
  std::vector<std::string> endpoints;  // ipc:// and/or tcp://; empty: default_endpoint()
  SocketMode socket_mode = SocketMode::kPrivate;
  double heartbeat_interval_s = 1.0;  // told to daemons in `registered`
  double heartbeat_timeout_s = 10.0;  // no heartbeat for this long: the node is lost
  std::vector<uint32_t> admin_uids;   // may cancel/restart any job (root always may)
  bool synchronous_full = true;       // PRAGMA synchronous=FULL (else NORMAL)
  double metrics_flush_s = 0.2;
  double heartbeat_flush_s = 2.0;
  double tick_s = 0.05;  // timer resolution
  // Slurm topology.conf or cluster YAML (common/topology) for the jobs' global ring order;
  // empty: built from the leaf switches the daemons register with. Throws TopologyError.
  std::string topology_file;
  // The web endpoint (coordinator/web.h: /metrics, dashboard, /api/): "HOST:PORT" with an IP
  // address (port 0: any free port; the URL is written to <state_dir>/http); empty: none.
  std::string http_listen;
  // Require <state_dir>/http.token (created 0600 on first use) on every request. false is
  // allowed only on a loopback address (every local user may then read the endpoint).
  bool http_token = true;
  double http_timeout_s = 10;
  size_t http_max_connections = 32;
  // The /metrics and dashboard limits: per-rank summaries over the last metrics_window_steps
  // steps; at most metrics_max_ranks ranks per job one by one (the rest folded together).
  int64_t metrics_window_steps = 20;
  size_t metrics_max_ranks = 64;
  // Keep step_metrics and rank_steps rows of each job's last N steps; 0: keep everything.
  int64_t metrics_retention_steps = 0;
  // Requeues a Slurm job with hosts added to its ExcNodeList (a start landed on a node the job
  // excludes; coordinator/slurm_actions.h); returns the ExcNodeList set, throws with what failed.
  // Empty: slurm::requeue_excluding (scontrol). Tests pass their own.
  std::function<std::string(const std::string& slurm_job_id,
                            const std::vector<std::string>& exclude)>
      slurm_requeue_excluding;
};

class Coordinator {
 public:
  // Opens (or creates and migrates) the database, takes the state directory lock and binds the
  // endpoints. Throws SecurityError, DbError or std::runtime_error with the reason.
  explicit Coordinator(CoordinatorOptions opts);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Serves until stop().
  void run();
  void stop() { stop_.store(true); }

  // The endpoints as bound (a tcp port of 0 or * resolved).
  std::vector<std::string> endpoints() const;
  // Empty when no tcp:// endpoint.
  std::string server_public_key() const;
  // "http://127.0.0.1:41234/" when the web endpoint is on; else empty.
  std::string http_url() const;

  struct Stats {
    uint64_t messages = 0;
    uint64_t rejected = 0;  // malformed, oversized, refused
    uint64_t heartbeats = 0;
    uint64_t steps = 0;
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> stop_{false};
};

}  // namespace ring::coord
