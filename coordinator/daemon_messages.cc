#include "coordinator/daemon_messages.h"

#include <algorithm>

#include "common/spec/parse.h"
#include "coordinator/security.h"

namespace ring::coord {

using nlohmann::json;

void DaemonMessages::on(const std::string& peer, uint32_t uid, const proto::Register& m) {
  // The node is (uid, name): registering never touches another uid's node of the same name.
  NodeId id{uid, m.node};
  if (auto pn = e_.peer_node.find(peer); pn != e_.peer_node.end() && pn->second != id)
    throw Refused(proto::code::kWrongPeer,
                  "this connection registered as node " + pn->second.name + ", not " + m.node,
                  "node");
  json gpus = json::array();
  for (const auto& g : m.gpus)
    gpus.push_back({{"index", g.index}, {"model", g.model}, {"memory_mib", g.memory_mib}});
  json topo = {{"numa_nodes", m.topology.numa_nodes},
               {"cpus", m.topology.cpus},
               {"host_memory_mib", m.topology.host_memory_mib},
               {"leaf_switch", m.topology.leaf_switch},
               {"summary", m.topology.summary}};
  double t = now_unix();
  if (!e_.store->node(uid, m.node) && e_.store->count_nodes(uid) >= Engine::kMaxNodesPerUid)
    throw Refused(proto::code::kInvalidState,
                  "uid " + std::to_string(uid) + " has " + std::to_string(Engine::kMaxNodesPerUid) +
                      " nodes registered already; a new node name is refused",
                  "node");
  e_.store->upsert_node({m.node, uid, "up", t, t, gpus.dump(), topo.dump(), m.ringd_version});
  bool was_lost = e_.nodes.count(id) && !e_.nodes[id].up;
  e_.nodes[id].up = true;
  e_.rebind(peer, id);
  e_.store->add_event(std::nullopt, 0, m.node, was_lost ? "node_up" : "node_registered",
                      {{"uid", uid}, {"gpus", m.gpus.size()}, {"ringd_version", m.ringd_version}});
  proto::Registered r{m.node, e_.opts.heartbeat_interval_s, e_.opts.heartbeat_timeout_s, {}};
  for (const auto& jp : m.jobs)
    if (auto a = e_.join_job(id, jp)) r.jobs.push_back(*a);
  e_.queue(peer, r);
}

void DaemonMessages::on(const std::string& peer, uint32_t uid, const proto::Heartbeat& m) {
  ++e_.n_heartbeats;
  NodeId id = e_.bind_node(peer, uid, m.node);
  e_.mark_alive(id);
  for (const auto& jp : m.jobs) {
    // The hot path (1000s per second): two indexed single-row reads.
    auto j = e_.store->job_brief(jp.job);
    if (!j) continue;
    auto me = e_.store->job_node(jp.job, m.node);
    if (!me || me->state == "lost" || member_id(*me) != id) {
      e_.join_job(id, jp);
      continue;
    }
    // Reconcile: commands are idempotent and re-sent (at most every 2 s) until the daemon's
    // heartbeat shows it complied.
    auto key = std::make_pair(jp.job, m.node);
    auto lr = e_.last_reconcile.find(key);
    bool due = lr == e_.last_reconcile.end() ||
               seconds_since(lr->second) > std::max(2.0, 2 * e_.opts.heartbeat_interval_s);
    if (!due || jp.attempt == 0) continue;
    if ((j->state == JobState::kCancelling && me->state == "active") ||
        (is_terminal(j->state) && me->state == "active")) {
      e_.command(id, proto::CommandKind::kStop, jp.job, j->attempt, 0,
                 std::string("job is ") + to_string(j->state));
    } else if ((j->state == JobState::kStarting || j->state == JobState::kRunning) &&
               jp.attempt < j->attempt) {
      e_.command(id, proto::CommandKind::kRollBack, jp.job, j->attempt,
                 e_.resume_step_of(*e_.store->job(jp.job)),
                 "node is on attempt " + std::to_string(jp.attempt));
    }
  }
}

// A job message (step, event) from a node: the node must be a member of the job, as this
// uid's node, and the uid must be allowed to serve the job (its owner, or root).
JobRow DaemonMessages::member_job(const NodeId& node, int64_t job_id) {
  auto j = e_.store->job(job_id);
  if (!j)
    throw Refused(proto::code::kNotFound, "job " + std::to_string(job_id) + " does not exist",
                  "job");
  if (!e_.may_serve(node.uid, *j))
    throw Refused(proto::code::kPermissionDenied,
                  "job " + std::to_string(job_id) + " belongs to uid " +
                      std::to_string(j->owner_uid) + "; a daemon of uid " +
                      std::to_string(node.uid) + " may not report for it",
                  "job");
  for (const auto& jn : e_.store->job_nodes(job_id))
    if (member_id(jn) == node) return *j;
  throw Refused(proto::code::kPermissionDenied,
                "node " + node.name + " (uid " + std::to_string(node.uid) +
                    ") is not part of job " + std::to_string(job_id) +
                    " (list the job in register or heartbeat first)",
                "job");
}

void DaemonMessages::on(const std::string& peer, uint32_t uid, const proto::StepReport& m) {
  ++e_.n_steps;
  NodeId id = e_.bind_node(peer, uid, m.node);
  e_.mark_alive(id);
  JobRow j = member_job(id, m.job);
  if (m.attempt != j.attempt || is_terminal(j.state)) return;  // stale: an older attempt
  if (j.state == JobState::kStarting)
    e_.store->set_state(j.id, JobState::kRunning,
                        "first step of attempt " + std::to_string(j.attempt));
  e_.step_buf.push_back(m);
  // Straggler attribution over every node's ranks, once all nodes reported this step.
  for (const auto& f :
       e_.cross_stragglers.add(m, j.nodes, [&](int64_t job, int64_t attempt, int64_t rank) {
         return e_.named_by_node(job, attempt, rank);
       })) {
    logger()->info("job {}: {}", f.job, f.data.value("message", std::string()));
    e_.store->add_event(f.job, f.attempt, f.node, f.kind, f.data);
  }
  auto& p = e_.progress_buf[j.id];
  if (m.step >= p.step) p = {m.step, m.loss, m.tokens_per_s, now_unix()};
}

void DaemonMessages::on(const std::string& peer, uint32_t uid, const proto::Event& m) {
  NodeId id = e_.bind_node(peer, uid, m.node);
  e_.mark_alive(id);
  JobRow j = member_job(id, m.job);
  json data = json::object();
  if (m.rank) data["rank"] = *m.rank;
  if (m.pid) data["pid"] = *m.pid;
  if (m.exit_code) data["exit_code"] = *m.exit_code;
  if (m.signal) data["signal"] = *m.signal;
  if (m.step) data["step"] = *m.step;
  if (m.bytes) data["bytes"] = *m.bytes;
  if (!m.path.empty()) data["path"] = m.path;
  if (m.complete) data["complete"] = *m.complete;
  if (!m.last_log.empty()) data["last_log"] = m.last_log;
  if (!m.message.empty()) data["message"] = m.message;
  if (m.steps) data["steps"] = *m.steps;
  if (m.behind_s) data["behind_s"] = *m.behind_s;
  if (m.deadline_s) data["deadline_s"] = *m.deadline_s;
  if (!m.deleted.empty()) data["deleted"] = m.deleted;  // checkpoint steps retention removed
  if (m.resumable) data["resumable"] = *m.resumable;
  if (m.kind == proto::EventKind::kHang) {
    data["missing"] = m.missing;
    json waiting = json::array();
    for (const auto& w : m.waiting) waiting.push_back({{"rank", w.rank}, {"where", w.where}});
    data["waiting"] = waiting;
  }
  // The straggler's node (the agreed data of straggler events: docs/observability.md).
  if (m.kind == proto::EventKind::kStraggler || m.kind == proto::EventKind::kStragglerCleared) {
    data["node"] = m.node;
    data["source"] = "node";  // the reporting ringd judged its own ranks
    if (m.attempt == j.attempt && m.rank)
      e_.node_straggler_event(j.id, m.attempt, *m.rank, m.kind == proto::EventKind::kStraggler);
  }
  if (m.seconds) data["seconds"] = *m.seconds;
  bool current = m.attempt == j.attempt;
  if (!current) data["stale"] = true;
  e_.store->add_event(j.id, m.attempt, m.node, proto::to_string(m.kind), data);
  switch (m.kind) {
    case proto::EventKind::kWorkerStarted:
      e_.store->upsert_worker(j.id, m.attempt, m.node, *m.rank, m.pid, "running", std::nullopt,
                              std::nullopt);
      // A generate job reports no steps: it runs once its workers do. (The spec is parsed only
      // when it can be one: a training job's many worker_started events cost nothing.)
      if (current && j.state == JobState::kStarting &&
          j.spec.find("generate") != std::string::npos) {
        const spec::LoadResult r = spec::load_spec_string(j.spec, "job spec");
        if (r.ok() && r.spec->job.kind == spec::JobKind::kGenerate)
          e_.store->set_state(j.id, JobState::kRunning, "generating");
      }
      break;
    case proto::EventKind::kWorkerExited:
      e_.store->upsert_worker(j.id, m.attempt, m.node, *m.rank, m.pid, "exited", m.exit_code,
                              std::nullopt);
      break;
    case proto::EventKind::kWorkerDied: {
      e_.store->upsert_worker(j.id, m.attempt, m.node, *m.rank, m.pid, "died", m.exit_code,
                              m.signal);
      if (current && is_active(j.state)) {
        std::string how = m.signal ? "signal " + std::to_string(*m.signal)
                                   : "exit code " + std::to_string(*m.exit_code);
        // A worker ringd killed says why (worker_failed: "hung in step 12 ...").
        e_.fail_attempt(j, "worker rank " + std::to_string(*m.rank) + " on " + m.node + " died (" +
                               how + ")" + (m.message.empty() ? "" : ": " + m.message));
      }
      break;
    }
    case proto::EventKind::kCheckpointSaved:
      // A late report (the stop checkpoint of an attempt a `restart --from` ended, or of one that
      // failed) of a step after the point the next attempt resumes from: that branch is
      // abandoned, never resumed (ringd moves the directory's `latest` back the same way).
      e_.store->upsert_checkpoint(
          j.id, *m.step, m.node, m.path, *m.bytes, *m.complete, m.seconds,
          (j.restart_step && *m.step > *j.restart_step && m.attempt <= j.attempt) ||
              (m.attempt < j.attempt && *m.step > e_.resume_step_of(j)));
      if (!m.deleted.empty()) e_.store->mark_checkpoints_deleted(j.id, m.deleted);
      break;
    case proto::EventKind::kCheckpointFailed:
      break;
    case proto::EventKind::kJobCompleted: {
      if (!current) break;
      e_.store->set_job_node_state(j.id, m.node, "done");
      if (j.state == JobState::kStarting || j.state == JobState::kRunning) {
        e_.store->set_state(j.id, JobState::kCompleting, "node " + m.node + " finished");
        j.state = JobState::kCompleting;
      }
      if (j.state == JobState::kCompleting) {
        bool all_done = true;
        for (const auto& jn : e_.store->job_nodes(j.id))
          if (jn.state == "active") all_done = false;
        if (all_done) {
          e_.store->end_attempt(j.id, j.attempt, "completed");
          e_.store->set_state(j.id, JobState::kCompleted,
                              "every node finished step " + std::to_string(*m.step));
        }
      }
      break;
    }
    case proto::EventKind::kJobStopped:
      e_.store->set_job_node_state(j.id, m.node, "stopped");
      e_.maybe_cancelled(j.id);
      // A stop signal of the node's own (Ctrl-C of `ringctl run`, SIGTERM), after its
      // checkpoint: once no member is left running, the job is stopped, resumable. Not a Slurm
      // job: its stop is a preemption, time limit or scancel, and what follows (a requeue that
      // resumes it, or the end) is Slurm's to say (SlurmJobRequest).
      if (current && m.resumable.value_or(false) && is_active(j.state) &&
          j.slurm_job_id.empty()) {
        bool running = false;
        for (const auto& jn : e_.store->job_nodes(j.id))
          if (jn.state == "active") running = true;
        if (!running) {
          const std::string why =
              "stopped by a stop signal at step " + std::to_string(m.step.value_or(0)) +
              " (resumable from its latest checkpoint)";
          e_.store->end_attempt(j.id, j.attempt, why);
          e_.store->set_state(j.id, JobState::kStopped, why);
        }
      }
      break;
    case proto::EventKind::kJobFailed:
      // ringd failed the run for good: no restart would do better.
      if (current && (is_active(j.state) || j.state == JobState::kRestarting)) {
        const std::string why = "ringd on " + m.node + ": " + m.message;
        e_.store->end_attempt(j.id, j.attempt, why);
        e_.store->set_state(j.id, JobState::kFailed, why);
        for (const auto& n : e_.live_members(j.id))
          if (n.name != m.node)
            e_.command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, "job failed: " + why);
      }
      break;
    case proto::EventKind::kStraggler:
    case proto::EventKind::kStragglerCleared:
    case proto::EventKind::kHang:
      // Findings only: a hang fails the attempt through the worker_died that ringd reports
      // for the stuck rank it kills.
      break;
  }
}

void DaemonMessages::on(const std::string& peer, uint32_t uid, const proto::CommandAck& m) {
  NodeId id = e_.bind_node(peer, uid, m.node);
  e_.mark_alive(id);
  auto it = e_.commands.find(m.id);
  if (it == e_.commands.end()) {
    logger()->debug("ack of unknown command {} from {}", m.id, m.node);
    return;
  }
  // Only the node the command was sent to may acknowledge it (ids are small and guessable).
  if (it->second.node != id)
    throw Refused(proto::code::kPermissionDenied,
                  "command " + std::to_string(m.id) + " was not sent to node " + m.node + " (uid " +
                      std::to_string(uid) + ")",
                  "cmd");
  json data = {{"cmd", m.id}, {"command", proto::to_string(it->second.kind)}, {"ok", m.ok}};
  if (!m.error.empty()) data["error"] = m.error;
  if (e_.store->job(it->second.job))
    e_.store->add_event(it->second.job, 0, m.node, "command_ack", data);
  e_.commands.erase(it);
}

}  // namespace ring::coord
