// What the parts of ring-coord share (coordinator/coordinator.h runs them in one thread): the
// options, the Store, the live view of nodes, batched step metrics, commands in flight, the
// outbox of the message being handled, and the job logic every part needs (join a daemon to a
// job, fail an attempt, start the next one, finish a cancel, order the ring).
//
//   Engine e(opts, store);                        // no sockets: e.send delivers the outbox
//   DaemonMessages daemons(e);  ClientRequests requests(e);  Timers timers(e);
//   { Txn t(store.db()); requests.on(peer, uid, msg); t.commit(); }  e.flush_outbox();
//
// Every job message is handled inside the caller's transaction; replies and commands go to the
// outbox and are sent (flush_outbox) only after it commits.
#pragma once

#include <atomic>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/protocol/protocol.h"
#include "common/topology/cluster.h"
#include "coordinator/coordinator.h"
#include "coordinator/cross_stragglers.h"
#include "coordinator/log.h"
#include "coordinator/queries.h"
#include "coordinator/slurm_actions.h"
#include "coordinator/store.h"

namespace ring::coord {

namespace proto = ring::protocol;

// A node is (uid, name): the uid its daemon connected with and the name it registered. Two
// users' daemons may use one name; neither can speak for the other's node.
struct NodeId {
  uint32_t uid = 0;
  std::string name;
  auto operator<=>(const NodeId&) const = default;
};

inline NodeId member_id(const JobNodeRow& jn) {
  return {static_cast<uint32_t>(jn.node_uid), jn.node};
}

struct Engine {
  Engine(const CoordinatorOptions& o, Store& s);

  const CoordinatorOptions& opts;
  Store* store;
  // The cluster topology of --topology (empty: built from the leaf switches daemons report).
  std::optional<topology::ClusterTopology> cluster;
  // Delivers one encoded message to a peer (the coordinator's ROUTER; a test's capture).
  std::function<void(const std::string& peer, const std::string& payload)> send;

  // Live view of nodes (the DB keeps the durable part).
  struct NodeLive {
    std::string peer;  // current peer key; empty when not connected since our start
    uint32_t uid = 0;
    Clock::time_point last;
    double last_unix = 0;
    bool up = true;
    bool dirty = false;  // last_unix not yet written
  };
  std::map<NodeId, NodeLive> nodes;
  std::map<std::string, NodeId> peer_node;  // peer key -> node

  // Batched step metrics and per-job progress (Timers flushes them).
  std::vector<proto::StepReport> step_buf;
  struct Progress {
    int64_t step;
    double loss, tps;
    double at;  // when it arrived: the job's updated_at, before and after the flush
  };
  std::map<int64_t, Progress> progress_buf;

  // Straggler attribution over every node's ranks (cross_stragglers.h), and the ranks each
  // job attempt's ringd currently name stragglers themselves (from their events; loaded from the
  // store on first use, so a restarted coordinator knows them too).
  CrossNodeStragglers cross_stragglers;
  std::map<std::pair<int64_t, int64_t>, std::set<int64_t>> node_stragglers;  // (job, attempt)
  bool named_by_node(int64_t job, int64_t attempt, int64_t rank);
  void node_straggler_event(int64_t job, int64_t attempt, int64_t rank, bool named);

  // Commands in flight, for the ack's event.
  struct CmdInfo {
    int64_t job;
    proto::CommandKind kind;
    NodeId node;  // only this node may acknowledge it
  };
  std::map<int64_t, CmdInfo> commands;
  int64_t next_cmd = 1;
  std::map<std::pair<int64_t, std::string>, Clock::time_point> last_reconcile;

  // Refused joins are recorded (event, warning) once per node and job, and at most
  // kMaxRefusedPerJob per job and kMaxRefusedPerUid per refused uid (then one
  // join_refused_suppressed event per job): a daemon listing another user's job in every
  // heartbeat, under ever new node names, cannot flood that job's events or our log.
  static constexpr int kMaxRefusedPerJob = 16;
  static constexpr int kMaxRefusedPerUid = 64;
  std::set<std::pair<int64_t, NodeId>> refused_joins;
  std::map<int64_t, int> refused_per_job;
  std::map<uint32_t, int> refused_per_uid;
  // Node rows one uid may register (distinct names): a user cannot fill the database with nodes.
  static constexpr int64_t kMaxNodesPerUid = 4096;

  // Requeues of Slurm jobs without their excluded nodes (scontrol, off this thread); Timers
  // records the outcomes. A test may replace it with one of its own runner.
  std::unique_ptr<SlurmActions> slurm_actions = std::make_unique<SlurmActions>();

  // Replies and commands of the message being handled, sent after its transaction commits.
  std::vector<std::pair<std::string, proto::Message>> outbox;

  std::atomic<uint64_t> n_messages{0}, n_rejected{0}, n_heartbeats{0}, n_steps{0};

  // ---- sending
  void queue(const std::string& peer, const proto::Message& m);
  void flush_outbox();
  // Sends a command to a node if it is connected; returns whether it was sent.
  bool command(const NodeId& node, proto::CommandKind kind, int64_t job, int64_t attempt,
               int64_t step, const std::string& reason);

  // ---- nodes
  // Nodes of a job that are connected and not lost or done.
  std::vector<NodeId> live_members(int64_t job);
  NodeId bind_node(const std::string& peer, uint32_t uid, const std::string& name);
  void rebind(const std::string& peer, const NodeId& node);
  void mark_alive(const NodeId& node);

  // ---- authorisation
  bool is_admin(uint32_t uid) const;
  JobRow owned_job(int64_t id, uint32_t uid, const char* action);
  static bool may_serve(uint32_t uid, const JobRow& j);

  // ---- job logic
  void update_ring_order(int64_t job_id);
  int64_t resume_step_of(const JobRow& j);
  void fail_attempt(JobRow j, const std::string& reason);
  void start_next_attempt(JobRow j);
  void maybe_cancelled(int64_t job_id);
  void refuse_join(const JobRow& j, const NodeId& node, const std::string& reason);
  std::optional<proto::Assignment> join_job(const NodeId& node, const proto::JobProgress& jp);

  // What the read-only requests (coordinator/queries.h) add to the database.
  LiveView live_view() const;
};

}  // namespace ring::coord
