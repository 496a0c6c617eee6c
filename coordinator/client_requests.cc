#include "coordinator/client_requests.h"

#include <algorithm>
#include <set>

#include "common/cli/job_dir.h"
#include "common/topology/hostlist.h"
#include "common/spec/parse.h"
#include "coordinator/security.h"

namespace ring::coord {

using nlohmann::json;

void ClientRequests::on(const std::string& peer, uint32_t uid, const proto::SubmitRequest& m) {
  auto r = ring::spec::load_spec_string(m.spec, "submitted spec");
  if (!r.ok()) {
    std::string msg = std::to_string(r.error_count()) + " error(s) in the spec:";
    int shown = 0;
    for (const auto& d : r.diagnostics) {
      if (d.severity != ring::spec::Diagnostic::Severity::kError) continue;
      if (++shown > 10) {
        msg += "\n  ...";
        break;
      }
      msg += "\n  " + d.str();
    }
    throw Refused(proto::code::kInvalidSpec, msg, "spec");
  }
  const auto& s = *r.spec;
  JobRow j;
  j.name = m.name.empty() ? s.job.name : m.name;
  if (j.name.empty()) j.name = "job";
  j.owner_uid = uid;
  j.owner_user = user_name(uid);
  j.spec = m.spec;
  j.spec_hash = sha256_hex(m.spec);
  j.nodes = s.resources.nodes;
  j.total_steps = m.steps.value_or(s.train.steps);
  // A generate job is not resumable mid-way: a failure fails it (restart.* is for training).
  j.max_restarts = s.job.kind == ring::spec::JobKind::kGenerate ? 0 : s.restart.max_restarts;
  j.backoff_s = s.restart.backoff_s;
  j.backoff_max_s = std::max(s.restart.backoff_max_s, 0.0);
  // daemon/INTERFACE.md: the job dir defaults to the owner's (common/cli/job_dir.h);
  // checkpoints go to checkpoint.dir, a relative one under the job dir; none when it is empty.
  j.job_dir = m.job_dir.empty() ? jobdir::default_job_dir(s.job.name, uid) : m.job_dir;
  while (j.job_dir.size() > 1 && j.job_dir.back() == '/') j.job_dir.pop_back();
  j.checkpoint_dir = s.checkpoint.dir.empty() || s.checkpoint.dir[0] == '/'
                         ? s.checkpoint.dir
                         : j.job_dir + "/" + s.checkpoint.dir;
  int64_t id = e_.store->insert_job(j);
  e_.queue(peer, proto::SubmitReply{m.id, id, j.name, j.spec_hash, "pending"});
}

void ClientRequests::on(const std::string& peer, uint32_t, const proto::StatusRequest& m) {
  e_.queue(peer, answer(*e_.store, m, e_.live_view()));
}

void ClientRequests::on(const std::string& peer, uint32_t, const proto::EventsRequest& m) {
  e_.queue(peer, answer(*e_.store, m));
}

void ClientRequests::on(const std::string& peer, uint32_t, const proto::StepsRequest& m) {
  e_.queue(peer, answer(*e_.store, m, e_.live_view()));
}

void ClientRequests::on(const std::string& peer, uint32_t uid, const proto::CancelRequest& m) {
  JobRow j = e_.owned_job(m.job, uid, "cancel");
  std::string who = "cancelled by " + user_name(uid);
  if (j.state == JobState::kCancelling) {
    e_.queue(peer, proto::OkReply{m.id, j.id, "cancelling", "already cancelling", {}});
    return;
  }
  if (j.state == JobState::kPending) {
    e_.store->set_state(j.id, JobState::kCancelled, who);
  } else {
    e_.store->set_state(j.id, JobState::kCancelling, who);  // refuses terminal states
    for (const auto& n : e_.live_members(j.id))
      e_.command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, who);
    e_.maybe_cancelled(j.id);
  }
  e_.queue(peer, proto::OkReply{m.id, j.id, to_string(e_.store->job(j.id)->state), who, {}});
}

void ClientRequests::on(const std::string& peer, uint32_t uid, const proto::RestartRequest& m) {
  JobRow j = e_.owned_job(m.job, uid, "restart");
  std::string who = "restart requested by " + user_name(uid);
  if (m.from_step) who += " from step " + std::to_string(*m.from_step);
  if (m.requeue.value_or(false)) {
    if (j.slurm_job_id.empty())
      throw Refused(proto::code::kBadField,
                    "job " + std::to_string(j.id) +
                        " was not submitted to Slurm; requeue is for jobs that were",
                    "requeue");
    if (m.from_step)
      throw Refused(proto::code::kBadField,
                    "a requeue resumes from the latest complete checkpoint; from_step is for "
                    "jobs without Slurm",
                    "from_step");
    who = "requeue requested by " + user_name(uid);
    if (j.state != JobState::kRestarting) {
      check_transition(j.state, JobState::kRestarting, "job " + std::to_string(j.id));
      if (is_active(j.state)) e_.store->end_attempt(j.id, j.attempt, who);
      e_.store->set_state(j.id, JobState::kRestarting, who);
    }
    // No restart time: the timers leave it to Slurm's next start (SlurmJobRequest below).
    e_.store->set_restart(j.id, std::nullopt, std::nullopt);
    e_.queue(peer, proto::OkReply{m.id, j.id, "restarting", who, {}});
    return;
  }
  if (m.from_step) check_from_step(j, *m.from_step);
  if (j.state == JobState::kRestarting) {
    e_.store->set_restart(j.id, now_unix(), m.from_step);
  } else {
    check_transition(j.state, JobState::kRestarting, "job " + std::to_string(j.id));
    if (is_active(j.state)) {
      e_.store->end_attempt(j.id, j.attempt, who);
      for (const auto& n : e_.live_members(j.id))
        e_.command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, who);
    }
    e_.store->set_restart(j.id, now_unix(), m.from_step);
    e_.store->set_state(j.id, JobState::kRestarting, who);
  }
  if (m.from_step) {
    // The newer checkpoints leave the lineage: no later restart resumes them (ringd, resuming,
    // moves the checkpoint directory's head back the same way).
    e_.store->supersede_checkpoints_after(j.id, *m.from_step);
    e_.store->add_event(j.id, j.attempt, "", "lineage_branched",
                        {{"step", *m.from_step}, {"by", user_name(uid)}});
  }
  e_.queue(peer, proto::OkReply{m.id, j.id, "restarting", who, {}});
}

// `restart --from N` names a checkpoint of the job's current lineage that is complete on every
// node and still on disk; anything else would train from other weights than asked.
void ClientRequests::check_from_step(const JobRow& j, int64_t step) {
  if (step == 0) return;  // from the start: fresh weights, asked for by name
  const Store::CheckpointStep c = e_.store->checkpoint_step(j.id, step, j.nodes);
  const std::string job = "job " + std::to_string(j.id), st = std::to_string(step);
  std::string why;
  if (!c.recorded)
    why = job + " has no checkpoint of step " + st;
  else if (c.deleted)
    why = job + " no longer has its checkpoint of step " + st +
          " (retention removed it: checkpoint.keep_last)";
  else if (c.superseded)
    why = job + "'s checkpoint of step " + st +
          " was superseded by an earlier `restart --from` an older step";
  else if (!c.complete)
    why = job + "'s checkpoint of step " + st + " is not complete on every node";
  if (why.empty()) return;
  std::string have;
  for (int64_t s : e_.store->resumable_steps(j.id, j.nodes))
    have += (have.empty() ? "" : ", ") + std::to_string(s);
  throw Refused(proto::code::kBadField,
                why + "; it can restart from " +
                    (have.empty() ? std::string("no checkpoint (none is complete)")
                                  : "step " + have),
                "from_step");
}

void ClientRequests::on(const std::string& peer, uint32_t uid, const proto::CheckpointRequest& m) {
  JobRow j = e_.owned_job(m.job, uid, "checkpoint");
  if (j.state != JobState::kRunning)
    throw Refused(proto::code::kInvalidState,
                  "job " + std::to_string(j.id) + " is " + to_string(j.state) +
                      "; only a running job can checkpoint",
                  "job");
  int sent = 0;
  for (const auto& n : e_.live_members(j.id))
    sent += e_.command(n, proto::CommandKind::kCheckpointNow, j.id, j.attempt, 0,
                       "requested by " + user_name(uid));
  e_.store->add_event(j.id, j.attempt, "", "checkpoint_requested",
                      {{"by", user_name(uid)}, {"nodes", sent}});
  e_.queue(peer, proto::OkReply{m.id, j.id, to_string(j.state),
                                "checkpoint_now sent to " + std::to_string(sent) + " node(s)", {}});
}

void ClientRequests::on(const std::string& peer, uint32_t, const proto::NodesRequest& m) {
  e_.queue(peer, answer(*e_.store, m, e_.live_view()));
}

// A requeue after a node failure: the nodes of the previous allocation that Slurm now holds
// unfit (down, drained, failing, not responding) and whose ringd never stopped on its own (a
// preemption or `ringctl restart` stops every node first) failed the job. Its later allocations
// exclude them.
void ClientRequests::exclude_failed_nodes(const JobRow& j, const proto::SlurmJobRequest& m) {
  auto prev = e_.store->last_event(j.id, "slurm_started");
  if (!prev || !prev->data.contains("nodes") || !prev->data["nodes"].is_string()) return;
  std::vector<std::string> hosts;
  try {
    hosts = topology::expand_hostlist(prev->data["nodes"].get<std::string>());
  } catch (const std::exception&) {
    return;  // recorded before it was checked: nothing to go by
  }
  // Members still marked stopped or done are the ending allocation's (a requeued start marks
  // every member of the one before lost).
  std::set<std::string> stopped;
  for (const auto& jn : e_.store->job_nodes(j.id))
    if (jn.state == "stopped" || jn.state == "done")
      stopped.insert(topology::host_of_daemon_node(jn.node));
  for (const auto& h : hosts) {
    if (stopped.count(h) ||
        std::find(m.unhealthy_nodes.begin(), m.unhealthy_nodes.end(), h) == m.unhealthy_nodes.end())
      continue;
    std::string why = "Slurm requeue " + std::to_string(m.restarts) + " of job " +
                      m.slurm_job_id + " with node " + h +
                      " down, drained or not responding, its ringd never stopped on its own";
    if (e_.store->add_excluded_node(j.id, h, j.attempt, why)) {
      logger()->warn("job {}: excluding node {} from its allocations ({})", j.id, h, why);
      e_.store->add_event(j.id, j.attempt, "", "node_excluded", {{"host", h}, {"reason", why}});
    }
  }
}

// The nodes of a Slurm allocation (hostlist form) the job excludes.
std::vector<std::string> ClientRequests::excluded_in_allocation(int64_t job,
                                                                const std::string& nodes) {
  auto excluded = e_.store->excluded_nodes(job);
  if (excluded.empty() || nodes.empty()) return {};
  std::vector<std::string> hosts;
  try {
    hosts = topology::expand_hostlist(nodes);
  } catch (const std::exception& e) {
    throw Refused(proto::code::kBadField,
                  "nodes: '" + nodes.substr(0, 200) + "' is not a Slurm hostlist: " + e.what(),
                  "nodes");
  }
  std::vector<std::string> bad;
  for (const auto& x : excluded)
    if (std::find(hosts.begin(), hosts.end(), x.node) != hosts.end()) bad.push_back(x.node);
  return bad;
}

// What Slurm did with the job: recorded with the job; a start after a requeue (node
// failure, preemption, `ringctl restart`) ends the attempt Slurm killed and begins the next one
// from the latest complete checkpoint. The new allocation's daemons join it afresh (the old
// members are marked lost; the ones that come back re-join).
void ClientRequests::on(const std::string& peer, uint32_t uid, const proto::SlurmJobRequest& m) {
  JobRow j = e_.owned_job(m.job, uid, "record Slurm state of");
  json data = {{"slurm_job_id", m.slurm_job_id}};
  if (m.event == "submit_failed") {
    if (j.state != JobState::kPending)
      throw Refused(proto::code::kInvalidState,
                    "job " + std::to_string(j.id) + " is " + to_string(j.state) +
                        "; only a pending job can fail to submit",
                    "job");
    e_.store->add_event(j.id, 0, "", "slurm_submit_failed", {{"message", m.message}});
    e_.store->set_state(j.id, JobState::kFailed, "sbatch refused the job: " + m.message);
    e_.queue(peer, proto::OkReply{m.id, j.id, "failed", "recorded", {}});
    return;
  }
  if (m.slurm_job_id != j.slurm_job_id) e_.store->set_slurm_job_id(j.id, m.slurm_job_id);
  if (m.event == "submitted") {
    e_.store->add_event(j.id, j.attempt, "", "slurm_submitted", data);
    e_.queue(peer, proto::OkReply{m.id, j.id, to_string(j.state),
                                  "Slurm job " + m.slurm_job_id + " recorded", {}});
    return;
  }
  data["restarts"] = m.restarts;
  data["nodes"] = m.nodes;
  if (m.restarts > 0 && !m.unhealthy_nodes.empty()) exclude_failed_nodes(j, m);
  e_.store->add_event(j.id, j.attempt, "", "slurm_started", data);
  // An allocation that holds a node the job excludes (its loss failed an attempt): no attempt
  // begins on it; Slurm is asked to requeue the job without those nodes (SlurmActions).
  std::vector<std::string> bad = excluded_in_allocation(j.id, m.nodes);
  if (!bad.empty() && !is_terminal(j.state) && j.state != JobState::kCancelling) {
    std::string list;
    for (const auto& n : bad) list += (list.empty() ? "" : ",") + n;
    std::string why = "Slurm start " + std::to_string(m.restarts) + " of job " + m.slurm_job_id +
                      " landed on excluded " + (bad.size() == 1 ? "node " : "nodes ") + list +
                      "; requeueing without";
    if (is_active(j.state)) e_.store->end_attempt(j.id, j.attempt, why);
    for (const auto& jn : e_.store->job_nodes(j.id))
      if (jn.state != "lost") e_.store->set_job_node_state(j.id, jn.node, "lost");
    e_.store->set_restart(j.id, std::nullopt, std::nullopt);
    e_.store->set_state(j.id, JobState::kRestarting, why);
    std::vector<std::string> all;
    for (const auto& x : e_.store->excluded_nodes(j.id)) all.push_back(x.node);
    e_.store->add_event(j.id, j.attempt, "", "slurm_requeue_excluding",
                        {{"slurm_job_id", m.slurm_job_id}, {"nodes", m.nodes}, {"excluded", bad}});
    e_.slurm_actions->requeue_excluding(j.id, m.slurm_job_id, all);
    e_.queue(peer, proto::OkReply{m.id, j.id, to_string(JobState::kRestarting),
                                  "this allocation holds excluded " + list +
                                      "; ring-coord requeues the job without",
                                  bad});
    return;
  }
  std::string msg = "start recorded";
  if (m.restarts > 0 && j.attempt > 0 && !is_terminal(j.state) &&
      j.state != JobState::kCancelling) {
    std::string why = "Slurm requeue " + std::to_string(m.restarts) + " of job " + m.slurm_job_id +
                      " on " + m.nodes;
    if (is_active(j.state)) e_.store->end_attempt(j.id, j.attempt, why);
    if (j.state != JobState::kRestarting) e_.store->set_state(j.id, JobState::kRestarting, why);
    for (const auto& jn : e_.store->job_nodes(j.id))
      if (jn.state != "lost") e_.store->set_job_node_state(j.id, jn.node, "lost");
    int64_t n = j.attempt + 1;
    int64_t resume = e_.store->latest_complete_checkpoint(j.id, j.nodes).value_or(0);
    e_.store->begin_attempt(j.id, n, why, resume);
    e_.store->set_attempt(j.id, n, j.restarts);
    e_.store->set_restart(j.id, std::nullopt, std::nullopt);
    e_.store->set_state(
        j.id, JobState::kStarting,
        "attempt " + std::to_string(n) + " from step " + std::to_string(resume) + " (" + why + ")");
    msg = "attempt " + std::to_string(n) + " from step " + std::to_string(resume);
  }
  e_.queue(peer, proto::OkReply{m.id, j.id, to_string(e_.store->job(j.id)->state), msg, {}});
}

}  // namespace ring::coord
