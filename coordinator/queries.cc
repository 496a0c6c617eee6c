#include "coordinator/queries.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace ring::coord {

namespace proto = ring::protocol;
using nlohmann::json;

namespace {

JobRow existing_job(Store& store, int64_t id) {
  auto j = store.job(id);
  if (!j)
    throw Refused(proto::code::kNotFound, "job " + std::to_string(id) + " does not exist", "job");
  return *j;
}

}  // namespace

proto::JobInfo job_info(Store& store, const JobRow& j, const LiveView& live) {
  proto::JobInfo i;
  i.job = j.id;
  i.name = j.name;
  i.owner_uid = j.owner_uid;
  i.owner = j.owner_user;
  i.state = to_string(j.state);
  i.state_reason = j.state_reason;
  i.spec_hash = j.spec_hash;
  i.attempt = j.attempt;
  i.restarts = j.restarts;
  i.max_restarts = j.max_restarts;
  i.step = j.last_step;
  i.total_steps = j.total_steps;
  i.loss = j.last_loss;
  i.tokens_per_s = j.last_tokens_per_s;
  auto pb = live.progress ? live.progress(j.id) : std::nullopt;
  if (pb) {
    i.step = pb->step;
    i.loss = pb->loss;
    i.tokens_per_s = pb->tokens_per_s;
  }
  i.last_checkpoint_step = store.latest_complete_checkpoint(j.id, j.nodes);
  i.slurm_job_id = j.slurm_job_id;
  for (const auto& jn : store.job_nodes(j.id)) i.nodes.push_back(jn.node);
  if (!j.ring_order.empty()) {
    json o = json::parse(j.ring_order, nullptr, false);
    if (o.is_array())
      for (const auto& n : o)
        if (n.is_string()) i.ring_order.push_back(n.get<std::string>());
  }
  for (const auto& x : store.excluded_nodes(j.id)) i.excluded_nodes.push_back(x.node);
  i.job_dir = j.job_dir;
  i.checkpoint_dir = j.checkpoint_dir;
  i.created_at = j.created_at;
  i.updated_at = j.updated_at;
  // Progress not yet flushed counts as written: the same answer before and after the flush.
  if (pb) i.updated_at = std::max(i.updated_at, pb->at);
  return i;
}

proto::StatusReply answer(Store& store, const proto::StatusRequest& m, const LiveView& live) {
  proto::StatusReply r{m.id, {}};
  if (m.job) {
    r.jobs.push_back(job_info(store, existing_job(store, *m.job), live));
  } else {
    for (const auto& j : store.jobs()) r.jobs.push_back(job_info(store, j, live));
  }
  return r;
}

proto::EventsReply answer(Store& store, const proto::EventsRequest& m) {
  existing_job(store, m.job);
  return proto::EventsReply{m.id, store.events(m.job, m.after, m.limit)};
}

// The per-rank rows of steps > after (StepsRequest.ranks), the unflushed reports' included.
static proto::StepsReply answer_ranks(Store& store, const proto::StepsRequest& m,
                                      const LiveView& live) {
  auto rows = store.rank_steps(m.job, m.after + 1, std::numeric_limits<int64_t>::max(), m.limit);
  if (live.unflushed_steps) {
    const double now = now_unix();
    for (const auto& s : *live.unflushed_steps) {
      if (s.job != m.job || s.step <= m.after) continue;
      for (const auto& r : s.ranks) {
        proto::RankStepRecord rec{s.attempt, s.step, s.node, r, now};
        auto same = std::find_if(rows.begin(), rows.end(), [&](const proto::RankStepRecord& x) {
          return x.attempt == s.attempt && x.step == s.step && x.rank.rank == r.rank;
        });
        if (same != rows.end())
          *same = rec;
        else
          rows.push_back(rec);
      }
    }
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return std::tie(a.step, a.attempt, a.rank.rank) < std::tie(b.step, b.attempt, b.rank.rank);
    });
    if (rows.size() > static_cast<size_t>(m.limit)) rows.resize(static_cast<size_t>(m.limit));
  }
  for (auto& r : rows) r.rank.prev.reset();  // not recorded: the same answer before the flush
  proto::StepsReply out{m.id, m.job, {}, std::move(rows)};
  return out;
}

proto::StepsReply answer(Store& store, const proto::StepsRequest& m, const LiveView& live) {
  existing_job(store, m.job);
  if (m.ranks.value_or(false)) return answer_ranks(store, m, live);
  auto rows = store.steps(m.job, m.after, m.limit);
  if (live.unflushed_steps) {
    // Reports not yet written replace a recorded one of the same (attempt, step, node), as the
    // flush will (INSERT OR REPLACE).
    double now = now_unix();
    for (const auto& s : *live.unflushed_steps) {
      if (s.job != m.job || s.step <= m.after) continue;
      proto::StepRecord rec{s.attempt,      s.step,        s.node,        s.loss,
                            s.tokens_per_s, s.step_time_s, s.comm_time_s, now};
      auto same = std::find_if(rows.begin(), rows.end(), [&](const proto::StepRecord& r) {
        return r.attempt == s.attempt && r.step == s.step && r.node == s.node;
      });
      if (same != rows.end())
        *same = rec;
      else
        rows.push_back(rec);
    }
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return std::tie(a.step, a.attempt, a.node) < std::tie(b.step, b.attempt, b.node);
    });
    if (rows.size() > static_cast<size_t>(m.limit)) rows.resize(static_cast<size_t>(m.limit));
  }
  return proto::StepsReply{m.id, m.job, std::move(rows), {}};
}

proto::NodesReply answer(Store& store, const proto::NodesRequest& m, const LiveView& live) {
  proto::NodesReply r{m.id, {}};
  for (const auto& n : store.nodes()) {
    proto::NodeInfo i;
    i.name = n.name;
    auto ln = live.node ? live.node(static_cast<uint32_t>(n.uid), n.name) : std::nullopt;
    i.state = ln ? (ln->up ? "up" : "lost") : n.state;
    i.uid = n.uid;
    i.last_heartbeat = ln ? std::max(ln->last_unix, n.last_heartbeat) : n.last_heartbeat;
    json g = json::parse(n.gpus, nullptr, false);
    i.gpus = g.is_array() ? static_cast<int64_t>(g.size()) : 0;
    i.ringd_version = n.ringd_version;
    for (int64_t jid : store.jobs_of_node(n.uid, n.name)) i.jobs.push_back(jid);
    // No heartbeat, and every job it served has ended (a `ringctl run` that finished, an
    // allocation Slurm released): not a failure to look into.
    if (i.state == "lost" && std::all_of(i.jobs.begin(), i.jobs.end(), [&](int64_t jid) {
          auto j = store.job_brief(jid);
          return !j || is_terminal(j->state);
        }))
      i.state = "retired";
    r.nodes.push_back(std::move(i));
  }
  return r;
}

std::optional<proto::Message> answer_read_only(Store& store, const proto::Message& request,
                                               const LiveView& live) {
  if (auto* m = std::get_if<proto::StatusRequest>(&request)) return answer(store, *m, live);
  if (auto* m = std::get_if<proto::EventsRequest>(&request)) return answer(store, *m);
  if (auto* m = std::get_if<proto::StepsRequest>(&request)) return answer(store, *m, live);
  if (auto* m = std::get_if<proto::NodesRequest>(&request)) return answer(store, *m, live);
  return std::nullopt;
}

}  // namespace ring::coord
