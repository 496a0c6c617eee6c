#include "coordinator/engine.h"

#include <algorithm>
#include <cmath>

#include "common/topology/global_order.h"
#include "common/topology/hostlist.h"
#include "coordinator/observe.h"
#include "coordinator/security.h"

namespace ring::coord {

using nlohmann::json;

Engine::Engine(const CoordinatorOptions& o, Store& s) : opts(o), store(&s) {
  if (opts.slurm_requeue_excluding)
    slurm_actions = std::make_unique<SlurmActions>([f = opts.slurm_requeue_excluding](
                                                       const SlurmActions::Action& a) {
      return f(a.slurm_job_id, a.exclude);
    });
  // Every node gets a full heartbeat timeout from our start: the time we were down is not
  // theirs.
  auto now = Clock::now();
  for (const auto& n : store->nodes()) {
    NodeLive nl;
    nl.uid = static_cast<uint32_t>(n.uid);
    nl.last = now;
    nl.last_unix = n.last_heartbeat;
    nl.up = n.state == "up";
    nodes[{static_cast<uint32_t>(n.uid), n.name}] = nl;
  }
}

void Engine::queue(const std::string& peer, const proto::Message& m) {
  outbox.emplace_back(peer, m);
}

void Engine::flush_outbox() {
  for (auto& [peer, m] : outbox) send(peer, proto::encode(m));
  outbox.clear();
}

// Sends a command to a node if it is connected; returns whether it was sent.
bool Engine::command(const NodeId& node, proto::CommandKind kind, int64_t job, int64_t attempt,
                     int64_t step, const std::string& reason) {
  auto it = nodes.find(node);
  if (it == nodes.end() || it->second.peer.empty() || !it->second.up) return false;
  int64_t id = next_cmd++;
  commands[id] = {job, kind, node};
  if (commands.size() > 100000) commands.erase(commands.begin());
  queue(it->second.peer, proto::Command{id, kind, job, attempt, step, reason});
  last_reconcile[{job, node.name}] = Clock::now();
  logger()->info("job {}: {} -> {} (attempt {}, step {}): {}", job, proto::to_string(kind),
                 node.name, attempt, step, reason);
  return true;
}

// Nodes of a job that are connected and not lost or done.
std::vector<NodeId> Engine::live_members(int64_t job) {
  std::vector<NodeId> out;
  for (const auto& jn : store->job_nodes(job)) {
    if (jn.state == "lost" || jn.state == "done") continue;
    auto it = nodes.find(member_id(jn));
    if (it != nodes.end() && it->second.up) out.push_back(member_id(jn));
  }
  return out;
}

// The node a daemon message speaks for: (the connection's uid, the message's node name). The
// peer must be bound to it, or (after our restart) the node must be known; otherwise the daemon
// must register. There is no way to speak for another uid's node, root included (root's
// daemons are nodes of uid 0).
NodeId Engine::bind_node(const std::string& peer, uint32_t uid, const std::string& name) {
  NodeId id{uid, name};
  auto pn = peer_node.find(peer);
  if (pn != peer_node.end()) {
    if (pn->second != id)
      throw Refused(proto::code::kWrongPeer,
                    "this connection registered as node " + pn->second.name + ", not " + name,
                    "node");
    return id;
  }
  if (!nodes.count(id))
    throw Refused(proto::code::kNotRegistered, "node " + name + " (uid " + std::to_string(uid) +
                                                   ") is not registered; send register first");
  rebind(peer, id);
  logger()->info("node {} reconnected (uid {})", name, uid);
  return id;
}

void Engine::rebind(const std::string& peer, const NodeId& node) {
  auto& nl = nodes[node];
  if (!nl.peer.empty() && nl.peer != peer) peer_node.erase(nl.peer);
  nl.peer = peer;
  nl.uid = node.uid;
  peer_node[peer] = node;
  mark_alive(node);
}

void Engine::mark_alive(const NodeId& node) {
  auto& nl = nodes[node];
  nl.last = Clock::now();
  nl.last_unix = now_unix();
  nl.dirty = true;
  if (!nl.up) {
    nl.up = true;
    store->set_node_state(node.uid, node.name, "up");
    store->add_event(std::nullopt, 0, node.name, "node_up", {{"uid", node.uid}});
    logger()->info("node {} (uid {}) is back", node.name, node.uid);
  }
}

bool Engine::is_admin(uint32_t uid) const {
  return uid == 0 ||
         std::find(opts.admin_uids.begin(), opts.admin_uids.end(), uid) != opts.admin_uids.end();
}

JobRow Engine::owned_job(int64_t id, uint32_t uid, const char* action) {
  auto j = store->job(id);
  if (!j)
    throw Refused(proto::code::kNotFound, "job " + std::to_string(id) + " does not exist", "job");
  if (static_cast<uint32_t>(j->owner_uid) != uid && !is_admin(uid))
    throw Refused(proto::code::kPermissionDenied,
                  "job " + std::to_string(id) + " belongs to " + j->owner_user + " (uid " +
                      std::to_string(j->owner_uid) + "); " + user_name(uid) + " (uid " +
                      std::to_string(uid) + ") may not " + action +
                      " it (only its owner or an admin may)");
  return *j;
}

// A daemon may serve a job of its own uid; root's daemons may serve any job (docs/security.md).
// --admin-uid is for client requests only: an admin may cancel a job, not speak for its nodes.
bool Engine::may_serve(uint32_t uid, const JobRow& j) {
  return uid == 0 || static_cast<uint32_t>(j.owner_uid) == uid;
}

// The job's global ring order over its current member nodes (common/topology), recorded in the
// job (jobs.ring_order) and as a `ring_order` event when it changes. The topology is the
// cluster file given with --topology, else a switch tree built from the leaf switches the
// daemons registered with (nodes under one leaf adjacent); nodes it does not know go last in
// natural name order.
void Engine::update_ring_order(int64_t job_id) {
  auto j = store->job(job_id);
  if (!j) return;
  std::vector<std::string> members;
  std::map<std::string, uint32_t> member_uid;
  for (const auto& jn : store->job_nodes(job_id))
    if (jn.state != "lost") {
      members.push_back(jn.node);
      member_uid[jn.node] = static_cast<uint32_t>(jn.node_uid);
    }
  std::sort(members.begin(), members.end(), topology::natural_less);
  if (members.empty()) return;
  topology::GlobalOrder g;
  try {
    if (cluster) {
      // The topology knows hosts: order by host, then name the job's nodes again.
      std::vector<std::string> hosts;
      std::map<std::string, std::string> node_of;
      for (const auto& n : members) {
        std::string h = topology::host_of_daemon_node(n);
        if (node_of.count(h)) h = n;  // two of the job's daemons on one host
        node_of[h] = n;
        hosts.push_back(h);
      }
      g = topology::global_ring_order(*cluster, hosts);
      for (auto& n : g.nodes) n = node_of[n];
      for (auto& n : g.unknown) n = node_of[n];
    } else {
      std::vector<topology::Switch> sw{{"(cluster)", -1, {}, {}, 0, 0}};
      std::map<std::string, int> leaf;
      for (const auto& n : members) {
        auto row = store->node(member_uid[n], n);
        if (!row) continue;
        json t = json::parse(row->topology, nullptr, false);
        std::string l = t.is_object() ? t.value("leaf_switch", "") : "";
        if (l.empty()) continue;
        auto it = leaf.find(l);
        if (it == leaf.end()) {
          it = leaf.emplace(l, static_cast<int>(sw.size())).first;
          sw.push_back({l, 0, {}, {}, 0, 0});
        }
        sw[it->second].nodes.push_back(n);
      }
      if (leaf.empty()) {
        g.nodes = members;
        g.method = "natural";
      } else {
        g = topology::global_ring_order(topology::ClusterTopology::tree(std::move(sw)), members);
      }
    }
  } catch (const std::exception& e) {
    logger()->warn("job {}: no ring order: {}", job_id, e.what());
    return;
  }
  std::string order = json(g.nodes).dump();
  if (order == j->ring_order) return;
  store->set_ring_order(job_id, order);
  store->add_event(job_id, j->attempt, "", "ring_order",
                   {{"nodes", g.nodes},
                    {"method", g.method},
                    {"hops", g.hops},
                    {"node_list_hops", g.node_list_hops},
                    {"unknown", g.unknown}});
}

int64_t Engine::resume_step_of(const JobRow& j) {
  for (const auto& a : store->attempts(j.id))
    if (a.number == j.attempt) return a.resume_step;
  return 0;
}

// The current attempt failed (worker death, node loss): roll back per the restart policy, or
// fail the job. Runs inside the caller's transaction.
void Engine::fail_attempt(JobRow j, const std::string& reason) {
  store->end_attempt(j.id, j.attempt, reason);
  auto members = live_members(j.id);
  if (j.restarts < j.max_restarts) {
    double delay =
        std::min(j.backoff_s * std::pow(2.0, static_cast<double>(j.restarts)), j.backoff_max_s);
    store->set_attempt(j.id, j.attempt, j.restarts + 1);
    store->set_restart(j.id, now_unix() + delay, std::nullopt);
    store->set_state(j.id, JobState::kRestarting, reason);
    store->add_event(j.id, j.attempt, "", "restart_scheduled",
                     {{"restart", j.restarts + 1},
                      {"max_restarts", j.max_restarts},
                      {"delay_s", delay},
                      {"reason", reason}});
    for (const auto& n : members)
      command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, "rolling back: " + reason);
  } else {
    store->set_state(j.id, JobState::kFailed,
                     reason + "; restarts exhausted (" + std::to_string(j.restarts) + " of " +
                         std::to_string(j.max_restarts) + ")");
    for (const auto& n : members)
      command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, "job failed: " + reason);
  }
}

void Engine::start_next_attempt(JobRow j) {
  int64_t n = j.attempt + 1;
  int64_t resume = j.restart_step ? *j.restart_step
                                  : store->latest_complete_checkpoint(j.id, j.nodes).value_or(0);
  std::string why = j.state_reason.empty() ? "restart" : j.state_reason;
  store->begin_attempt(j.id, n, why, resume);
  store->set_attempt(j.id, n, j.restarts);
  store->set_restart(j.id, std::nullopt, std::nullopt);
  store->set_state(j.id, JobState::kStarting,
                   "attempt " + std::to_string(n) + " from step " + std::to_string(resume));
  store->set_job_nodes_attempt(j.id, n);
  for (const auto& jn : store->job_nodes(j.id)) {
    if (jn.state == "lost") continue;
    auto it = nodes.find(member_id(jn));
    if (it == nodes.end() || !it->second.up) continue;
    store->set_job_node_state(j.id, jn.node, "active");
    command(member_id(jn), proto::CommandKind::kRollBack, j.id, n, resume, why);
  }
}

// Finishes cancelling once no member is left running.
void Engine::maybe_cancelled(int64_t job_id) {
  auto j = store->job(job_id);
  if (!j || j->state != JobState::kCancelling) return;
  for (const auto& jn : store->job_nodes(job_id)) {
    if (jn.state != "active") continue;
    auto it = nodes.find(member_id(jn));
    if (it != nodes.end() && it->second.up) return;  // still waiting for this one
  }
  store->end_attempt(job_id, j->attempt, "cancelled");
  store->set_state(job_id, JobState::kCancelled, "every node stopped");
}

void Engine::refuse_join(const JobRow& j, const NodeId& node, const std::string& reason) {
  if (refused_joins.count({j.id, node})) return;
  int& per_job = refused_per_job[j.id];
  int& per_uid = refused_per_uid[node.uid];
  if (per_job >= kMaxRefusedPerJob || per_uid >= kMaxRefusedPerUid) {
    if (per_job == kMaxRefusedPerJob) {  // said once per job
      ++per_job;
      logger()->warn("job {}: further refused joins are not recorded (uid {} and others)", j.id,
                     node.uid);
      store->add_event(j.id, j.attempt, "", "join_refused_suppressed",
                       {{"uid", node.uid}, {"after", kMaxRefusedPerJob}});
    }
    return;
  }
  refused_joins.insert({j.id, node});
  ++per_job;
  ++per_uid;
  logger()->warn("node {} (uid {}) may not serve job {}: {}", node.name, node.uid, j.id, reason);
  store->add_event(j.id, j.attempt, node.name, "join_refused",
                   {{"uid", node.uid}, {"reason", reason}});
}

// A daemon says it serves this job (register/heartbeat). Returns its assignment.
std::optional<proto::Assignment> Engine::join_job(const NodeId& node,
                                                  const proto::JobProgress& jp) {
  auto j = store->job(jp.job);
  if (!j) {
    logger()->debug("node {} (uid {}) claims job {}, which does not exist", node.name, node.uid,
                    jp.job);
    return std::nullopt;
  }
  if (!may_serve(node.uid, *j)) {
    refuse_join(*j, node,
                "daemon uid " + std::to_string(node.uid) + " is not the job owner's (uid " +
                    std::to_string(j->owner_uid) + ")");
    return std::nullopt;
  }
  auto members = store->job_nodes(j->id);
  auto me = std::find_if(members.begin(), members.end(),
                         [&](const JobNodeRow& r) { return r.node == node.name; });
  bool member = me != members.end();
  if (member && member_id(*me) != node) {
    // The job already has a member of this name that is another uid's node (the owner's and
    // root's daemons both may serve it). It keeps its place while it is alive.
    auto other = nodes.find(member_id(*me));
    if (me->state != "lost" && other != nodes.end() && other->second.up) {
      refuse_join(
          *j, node,
          "the job already has node " + node.name + " of uid " + std::to_string(me->node_uid));
      return std::nullopt;
    }
    member = false;  // the other one is gone: this node takes the name's place in the job
  }
  if (is_terminal(j->state) || j->state == JobState::kCancelling) {
    if (member && me->state == "active" && j->state == JobState::kCancelling) {
      command(node, proto::CommandKind::kStop, j->id, j->attempt, 0, "job cancelled");
    } else if (jp.attempt > 0 && (!member || me->state == "active")) {
      command(node, proto::CommandKind::kStop, j->id, j->attempt, 0,
              std::string("job is ") + to_string(j->state));
    }
    return proto::Assignment{j->id, j->attempt, 0, to_string(j->state)};
  }
  if (j->state == JobState::kPending) {
    int64_t resume = store->latest_complete_checkpoint(j->id, j->nodes).value_or(0);
    store->begin_attempt(j->id, 1 + j->attempt, "first start", resume);
    store->set_attempt(j->id, 1 + j->attempt, j->restarts);
    store->add_job_node(j->id, node.name, node.uid, 1 + j->attempt);
    store->set_state(j->id, JobState::kStarting, "node " + node.name + " joined");
    update_ring_order(j->id);
    j = store->job(jp.job);
  } else if (!member || me->state == "lost") {
    store->add_job_node(j->id, node.name, node.uid, j->attempt);
    store->add_event(j->id, j->attempt, node.name, "node_joined", json::object());
    update_ring_order(j->id);
  }
  int64_t resume = resume_step_of(*j);
  if ((j->state == JobState::kStarting || j->state == JobState::kRunning) && jp.attempt > 0 &&
      jp.attempt < j->attempt)
    command(node, proto::CommandKind::kRollBack, j->id, j->attempt, resume,
            "node is on attempt " + std::to_string(jp.attempt));
  return proto::Assignment{j->id, j->attempt, resume, to_string(j->state)};
}

// What the read-only requests (coordinator/queries.h) add to the database: progress and step
// reports not yet flushed, and the nodes' liveness.
LiveView Engine::live_view() const {
  LiveView v;
  v.progress = [this](int64_t job) -> std::optional<LiveView::Progress> {
    auto it = progress_buf.find(job);
    if (it == progress_buf.end()) return std::nullopt;
    return LiveView::Progress{it->second.step, it->second.loss, it->second.tps, it->second.at};
  };
  v.node = [this](uint32_t uid, const std::string& name) -> std::optional<LiveView::Node> {
    auto it = nodes.find(NodeId{uid, name});
    if (it == nodes.end()) return std::nullopt;
    return LiveView::Node{it->second.up, it->second.last_unix};
  };
  v.unflushed_steps = &step_buf;
  return v;
}

// The ranks a job attempt's ringd name stragglers now: their `straggler` events not followed by
// `straggler_cleared` (the coordinator's own findings, source "coordinator", aside).
static std::set<int64_t>& node_named(Engine& e, int64_t job, int64_t attempt) {
  auto key = std::make_pair(job, attempt);
  auto it = e.node_stragglers.find(key);
  if (it != e.node_stragglers.end()) return it->second;
  std::set<int64_t> named, decided;
  // Newest first: a rank's newest event decides.
  for (const auto& ev : latest_events(*e.store, job, {"straggler", "straggler_cleared"}, 1000)) {
    if (ev.attempt != attempt || ev.data.value("source", std::string("node")) == "coordinator")
      continue;
    auto r = ev.data.find("rank");
    if (r == ev.data.end() || !r->is_number_integer()) continue;
    if (!decided.insert(r->get<int64_t>()).second) continue;
    if (ev.kind == "straggler") named.insert(r->get<int64_t>());
  }
  return e.node_stragglers.emplace(key, std::move(named)).first->second;
}

bool Engine::named_by_node(int64_t job, int64_t attempt, int64_t rank) {
  return node_named(*this, job, attempt).count(rank) > 0;
}

void Engine::node_straggler_event(int64_t job, int64_t attempt, int64_t rank, bool named) {
  auto& s = node_named(*this, job, attempt);
  if (named)
    s.insert(rank);
  else
    s.erase(rank);
}

}  // namespace ring::coord
