#include "coordinator/timers.h"

#include <cmath>

#include <fmt/ranges.h>

namespace ring::coord {

using nlohmann::json;

namespace {

// Batched, re-sent or superseded data is written without waiting for fsync (NORMAL); every
// other transaction runs with the configured mode (FULL by default).
struct RelaxedSync {
  Engine& im;
  explicit RelaxedSync(Engine& i) : im(i) {
    if (im.opts.synchronous_full) im.store->db().exec("PRAGMA synchronous=NORMAL");
  }
  ~RelaxedSync() {
    if (im.opts.synchronous_full) {
      try {
        im.store->db().exec("PRAGMA synchronous=FULL");
      } catch (...) {
      }
    }
  }
};

}  // namespace

namespace {

// Runs `f` when `period_s` has passed since `last`; an error is logged (the loop goes on).
template <typename F>
void every(Clock::time_point& last, double period_s, const char* what, F&& f) {
  if (seconds_since(last) < period_s) return;
  last = Clock::now();
  try {
    f();
  } catch (const std::exception& e) {
    logger()->error("{}: {}", what, e.what());
  }
}

}  // namespace

void Timers::tick() {
  check_lost_nodes();
  start_due_restarts();
  record_slurm_actions();
  every(last_abandon_check_, 0.5, "checking for abandoned jobs", [&] { check_abandoned(); });
  every(last_metrics_flush_, e_.opts.metrics_flush_s, "writing step metrics",
        [&] { flush_metrics(); });
  every(last_hb_flush_, e_.opts.heartbeat_flush_s, "writing heartbeat times",
        [&] { flush_heartbeats(); });
  if (e_.opts.metrics_retention_steps > 0)
    every(last_prune_, prune_more_ ? 0.0 : 1.0, "pruning step metrics", [&] { prune_metrics(); });
}

void Timers::prune_metrics() {
  auto t0 = Clock::now();
  RelaxedSync relaxed(e_);
  Txn t(e_.store->db());
  int64_t n = retention_.prune(*e_.store, kPruneRows);
  t.commit();
  prune_more_ = n >= kPruneRows;
  if (n > 0) logger()->debug("retention: deleted {} step metric rows", n);
  if (seconds_since(t0) > kSlow)
    logger()->warn("slow: pruning {} step metric rows took {:.1f} ms", n, 1e3 * seconds_since(t0));
}

void Timers::flush() {
  flush_metrics();
  flush_heartbeats();
}

// Nodes silent for a heartbeat timeout are lost; their active jobs' attempts fail.
void Timers::check_lost_nodes() {
  for (auto& [id, nl] : e_.nodes) {
    if (!nl.up || seconds_since(nl.last) <= e_.opts.heartbeat_timeout_s) continue;
    const std::string& name = id.name;
    e_.outbox.clear();
    try {
      Txn t(e_.store->db());
      nl.up = false;
      std::string why = "node " + name + " lost (no heartbeat for " +
                        std::to_string(static_cast<int>(std::round(seconds_since(nl.last)))) +
                        " s)";
      logger()->warn("{} (uid {})", why, id.uid);
      e_.store->set_node_state(id.uid, name, "lost");
      e_.store->add_event(std::nullopt, 0, name, "node_lost", {{"reason", why}, {"uid", id.uid}});
      for (int64_t jid : e_.store->jobs_of_node(id.uid, name)) {
        auto me = e_.store->job_node(jid, name);
        if (!me || member_id(*me) != id || me->state == "done" || me->state == "lost") continue;
        bool was_active = me->state == "active";
        e_.store->set_job_node_state(jid, name, "lost");
        auto j = e_.store->job(jid);
        e_.store->add_event(jid, j->attempt, name, "node_lost", {{"reason", why}});
        if (was_active && is_active(j->state))
          e_.fail_attempt(*j, why);
        else if (j->state == JobState::kCancelling)
          e_.maybe_cancelled(jid);
      }
      t.commit();
      e_.flush_outbox();
    } catch (const std::exception& e) {
      logger()->error("marking node {} lost: {}", name, e.what());
      nl.up = true;  // retry on the next tick
    }
  }
}

void Timers::record_slurm_actions() {
  for (const auto& r : e_.slurm_actions->take_finished()) {
    try {
      Txn t(e_.store->db());
      auto j = e_.store->job(r.action.job);
      if (!j) continue;
      if (r.ok) {
        logger()->info("job {}: Slurm job {} requeued with ExcNodeList={}", j->id,
                       r.action.slurm_job_id, r.message);
        e_.store->add_event(j->id, j->attempt, "", "slurm_requeued_excluding",
                            {{"slurm_job_id", r.action.slurm_job_id}, {"exclude", r.message}});
      } else {
        logger()->warn("job {}: requeue of Slurm job {} without {} failed: {}", j->id,
                       r.action.slurm_job_id, fmt::join(r.action.exclude, ","), r.message);
        e_.store->add_event(j->id, j->attempt, "", "slurm_requeue_failed",
                            {{"slurm_job_id", r.action.slurm_job_id},
                             {"exclude", r.action.exclude},
                             {"message", r.message}});
      }
      t.commit();
    } catch (const std::exception& e) {
      logger()->error("recording the requeue of job {}: {}", r.action.job, e.what());
    }
  }
}

// Restarts whose backoff elapsed.
void Timers::start_due_restarts() {
  double now = now_unix();
  for (const auto& j : e_.store->jobs_in_state(JobState::kRestarting)) {
    // A Slurm job with no time: a requeue its owner asked of Slurm (`ringctl restart`); Slurm's
    // next start begins the attempt.
    if (!j.restart_at && !j.slurm_job_id.empty()) continue;
    if (j.restart_at && *j.restart_at > now) continue;
    e_.outbox.clear();
    try {
      Txn t(e_.store->db());
      e_.start_next_attempt(j);
      t.commit();
      e_.flush_outbox();
    } catch (const std::exception& e) {
      logger()->error("restarting job {}: {}", j.id, e.what());
    }
  }
}

// Jobs no daemon serves: the coordinator cannot start a daemon, so a job that is not
// Slurm's (a `ringctl run` killed with kill -9 takes its ringd along) and has had no member
// node that is up (active or stopped) for a heartbeat timeout fails as "abandoned" instead of
// staying starting or running forever; the time it spent restarting counts, so an attempt
// that starts with no daemon at all fails at once. A Slurm job waits: Slurm requeues it or
// reports its end. Its owner may `ringctl restart` it when a daemon is back.
void Timers::check_abandoned() {
  std::map<int64_t, Clock::time_point> still;
  for (JobState st :
       {JobState::kStarting, JobState::kRunning, JobState::kCompleting, JobState::kRestarting})
    for (const auto& j : e_.store->jobs_in_state(st)) {
      if (!j.slurm_job_id.empty()) continue;
      bool served = false;
      for (const auto& jn : e_.store->job_nodes(j.id)) {
        if (jn.state != "active" && jn.state != "stopped") continue;
        auto it = e_.nodes.find(member_id(jn));
        if (it != e_.nodes.end() && it->second.up) served = true;
      }
      if (served) continue;
      auto prev = unserved_since_.find(j.id);
      auto since = prev != unserved_since_.end() ? prev->second : Clock::now();
      still[j.id] = since;
      double idle = seconds_since(since);
      if (j.state == JobState::kRestarting || idle <= e_.opts.heartbeat_timeout_s) continue;
      e_.outbox.clear();
      try {
        Txn t(e_.store->db());
        std::string why = "abandoned: no daemon has served attempt " + std::to_string(j.attempt) +
                          " for " + std::to_string(static_cast<int>(std::round(idle))) +
                          " s (its ringd exited or was killed, e.g. with its `ringctl run`)";
        logger()->warn("job {}: {}", j.id, why);
        e_.store->end_attempt(j.id, j.attempt, why);
        e_.store->add_event(j.id, j.attempt, "", "abandoned", {{"reason", why}, {"idle_s", idle}});
        e_.store->set_state(j.id, JobState::kFailed, why);
        t.commit();
        e_.flush_outbox();
        still.erase(j.id);
      } catch (const std::exception& e) {
        logger()->error("failing abandoned job {}: {}", j.id, e.what());
      }
    }
  unserved_since_ = std::move(still);
}

void Timers::flush_metrics() {
  if (e_.step_buf.empty() && e_.progress_buf.empty()) return;
  auto t0 = Clock::now();
  RelaxedSync relaxed(e_);
  Txn t(e_.store->db());
  double now = now_unix();
  for (const auto& s : e_.step_buf) e_.store->add_step(s, now);
  for (const auto& [job, p] : e_.progress_buf)
    e_.store->set_progress(job, p.step, p.loss, p.tps, p.at);
  t.commit();
  if (seconds_since(t0) > kSlow)
    logger()->warn("slow: {} step reports took {:.1f} ms to write", e_.step_buf.size(),
                   1e3 * seconds_since(t0));
  e_.step_buf.clear();
  e_.progress_buf.clear();
}

void Timers::flush_heartbeats() {
  auto t0 = Clock::now();
  RelaxedSync relaxed(e_);
  Txn t(e_.store->db());
  for (auto& [id, nl] : e_.nodes)
    if (nl.dirty) {
      e_.store->touch_node(id.uid, id.name, nl.last_unix);
      nl.dirty = false;
    }
  t.commit();
  if (seconds_since(t0) > kSlow)
    logger()->warn("slow: heartbeat times took {:.1f} ms to write", 1e3 * seconds_since(t0));
}

}  // namespace ring::coord
