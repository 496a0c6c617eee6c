#include "coordinator/observe.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

namespace ring::coord {

namespace proto = ring::protocol;
using nlohmann::json;

std::vector<JobRow> exported_jobs(Store& store, const ExportLimits& lim, double now) {
  // Ids first (no spec text is read), then the chosen rows.
  std::string terminal;
  for (JobState st : kAllJobStates)
    if (is_terminal(st))
      terminal += std::string(terminal.empty() ? "'" : ",'") + to_string(st) + "'";
  Stmt& s = store.db().prepare("SELECT id FROM jobs WHERE state NOT IN (" + terminal +
                               ") OR updated_at >= ? ORDER BY updated_at DESC, id DESC LIMIT ?");
  s.args(now - lim.recent_s, static_cast<int64_t>(lim.max_jobs));
  std::vector<int64_t> ids;
  while (s.step()) ids.push_back(s.i64(0));
  std::vector<JobRow> out;
  for (int64_t id : ids)
    if (auto j = store.job(id)) out.push_back(std::move(*j));
  return out;
}

namespace {

// The latest (attempt, step) of a job in a table keyed (job_id, attempt, step, ...): one
// descent of the primary key, whatever the table's size.
std::optional<std::pair<int64_t, int64_t>> latest_key(Store& store, const char* table,
                                                      int64_t job) {
  Stmt& s = store.db().prepare(std::string("SELECT attempt, step FROM ") + table +
                               " WHERE job_id=? ORDER BY attempt DESC, step DESC LIMIT 1");
  s.args(job);
  std::optional<std::pair<int64_t, int64_t>> out;
  if (s.step()) out = std::pair{s.i64(0), s.i64(1)};
  s.reset();
  return out;
}

}  // namespace

std::vector<proto::RankStepRecord> rank_rows(Store& store, int64_t job, int64_t from_step,
                                             int64_t to_step, int64_t limit) {
  // Each attempt is a range of the primary key (job_id, attempt, step, rank).
  std::vector<proto::RankStepRecord> out;
  auto last = latest_key(store, "rank_steps", job);
  if (!last) return out;
  Stmt& s =
      store.db().prepare(std::string("SELECT ") + Store::kRankStepColumns +
                         " FROM rank_steps WHERE job_id=? AND attempt=? AND step>=? AND step<=? "
                         "ORDER BY step, rank LIMIT ?");
  for (int64_t a = 1; a <= last->first && static_cast<int64_t>(out.size()) < limit; ++a) {
    s.args(job, a, from_step, to_step, limit - static_cast<int64_t>(out.size()));
    while (s.step()) {
      out.push_back(Store::read_rank_step(s));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.step, a.attempt, a.rank.rank) < std::tie(b.step, b.attempt, b.rank.rank);
  });
  return out;
}

std::vector<proto::RankStepRecord> rank_window(Store& store, int64_t job, int64_t steps) {
  // The latest attempt's last `steps` steps (a restarted job's earlier attempts are history).
  auto last = latest_key(store, "rank_steps", job);
  if (!last) return {};
  auto [attempt, step] = *last;
  Stmt& s =
      store.db().prepare(std::string("SELECT ") + Store::kRankStepColumns +
                         " FROM rank_steps WHERE job_id=? AND attempt=? AND step>? AND step<=? "
                         "ORDER BY step, rank");
  s.args(job, attempt, step - steps, step);
  std::vector<proto::RankStepRecord> out;
  while (s.step()) {
    out.push_back(Store::read_rank_step(s));
  }
  return out;
}

std::optional<double> latest_step_seconds(Store& store, int64_t job) {
  auto last = latest_key(store, "step_metrics", job);
  if (!last) return std::nullopt;
  Stmt& s = store.db().prepare(
      "SELECT max(step_time_s) FROM step_metrics WHERE job_id=? AND attempt=? AND step=?");
  s.args(job, last->first, last->second);
  std::optional<double> v;
  if (s.step()) v = s.opt_f64(0);
  s.reset();
  return v;
}

std::vector<StepPoint> step_points(Store& store, int64_t job, int64_t from_step) {
  auto last = latest_key(store, "step_metrics", job);
  std::map<int64_t, StepPoint> by_step;
  if (!last) return {};
  // Attempt by attempt (primary-key ranges); a later attempt's report of a step replaces an
  // earlier one's (a restart re-runs steps after its checkpoint).
  Stmt& s = store.db().prepare(
      "SELECT step, loss, tokens_per_s, step_time_s FROM step_metrics WHERE job_id=? AND "
      "attempt=? AND step>=? ORDER BY step, node");
  for (int64_t a = 1; a <= last->first; ++a) {
    s.args(job, a, from_step);
    std::map<int64_t, bool> seen;  // the first node's report of each step
    while (s.step()) {
      int64_t st = s.i64(0);
      if (seen[st]) continue;
      seen[st] = true;
      by_step[st] = StepPoint{st, s.f64(1), s.f64(2), s.f64(3)};
    }
  }
  std::vector<StepPoint> out;
  for (auto& [st, p] : by_step) out.push_back(p);
  return out;
}

double quantile_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  // Nearest rank: the smallest value with at least q of the values at or below it.
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  if (k > 0) --k;
  return v[std::min(k, v.size() - 1)];
}

std::vector<RankSummary> summarize_ranks(const std::vector<proto::RankStepRecord>& rows,
                                         size_t max_ranks) {
  struct Acc {
    std::vector<double> times;
    RankSummary s;
    std::set<int64_t> ranks;
  };
  std::map<int64_t, Acc> by;  // rank (-1: folded) -> accumulated
  for (const auto& r : rows) {
    int64_t key =
        r.rank.rank >= 0 && static_cast<size_t>(r.rank.rank) < max_ranks ? r.rank.rank : -1;
    Acc& a = by[key];
    a.s.rank = key;
    if (key >= 0) a.s.node = r.node;  // the latest row's node (a rank may move on restart)
    a.ranks.insert(r.rank.rank);
    a.times.push_back(r.rank.step_time_s);
    a.s.sum_step_s += r.rank.step_time_s;
    a.s.mean_data_s += r.rank.data_s;
    a.s.mean_compute_s += r.rank.compute_s;
    a.s.mean_wait_s += r.rank.wait_s;
    a.s.mean_comm_s += r.rank.comm_s;
    a.s.hop_bytes += r.rank.hop_bytes;
    a.s.comm_s += r.rank.comm_s;
  }
  std::vector<RankSummary> out;
  for (auto& [key, a] : by) {
    std::sort(a.times.begin(), a.times.end());
    RankSummary s = a.s;
    s.count = a.times.size();
    double n = static_cast<double>(s.count);
    s.mean_data_s /= n;
    s.mean_compute_s /= n;
    s.mean_wait_s /= n;
    s.mean_comm_s /= n;
    s.p50 = quantile_sorted(a.times, 0.5);
    s.p90 = quantile_sorted(a.times, 0.9);
    s.p99 = quantile_sorted(a.times, 0.99);
    s.folded_ranks = key < 0 ? a.ranks.size() : 0;
    out.push_back(std::move(s));
  }
  // The map puts -1 first; the folded entry goes last.
  if (!out.empty() && out.front().rank < 0) std::rotate(out.begin(), out.begin() + 1, out.end());
  return out;
}

std::vector<CheckpointInfo> checkpoints(Store& store, int64_t job, int64_t limit) {
  Stmt& s = store.db().prepare(
      "SELECT step, count(*), sum(complete), sum(bytes), min(created_at), max(seconds) FROM "
      "checkpoints WHERE job_id=? AND deleted=0 AND superseded=0 GROUP BY step ORDER BY step DESC "
      "LIMIT ?");
  s.args(job, limit);
  std::vector<CheckpointInfo> out;
  while (s.step()) out.push_back({s.i64(0), s.i64(1), s.i64(2), s.i64(3), s.f64(4), s.opt_f64(5)});
  return out;
}

std::vector<proto::EventRecord> latest_events(Store& store, int64_t job,
                                              const std::vector<std::string>& kinds,
                                              int64_t limit) {
  // events_job is (job_id, id): newest first, filtered by kind.
  std::string in;
  for (size_t i = 0; i < kinds.size(); ++i) in += i ? ",?" : "?";
  Stmt& s = store.db().prepare(
      "SELECT id, time, job_id, attempt, node, kind, data FROM events WHERE job_id=? AND kind IN "
      "(" +
      in + ") ORDER BY id DESC LIMIT ?");
  int i = 1;
  s.bind(i++, job);
  for (const auto& k : kinds) s.bind(i++, k);
  s.bind(i, limit);
  std::vector<proto::EventRecord> out;
  while (s.step()) out.push_back(Store::read_event(s));
  return out;
}

std::vector<proto::EventRecord> recent_events(Store& store, int64_t job, int64_t limit) {
  Stmt& s = store.db().prepare(
      "SELECT id, time, job_id, attempt, node, kind, data FROM events WHERE job_id=? "
      "ORDER BY id DESC LIMIT ?");
  s.args(job, limit);
  std::vector<proto::EventRecord> out;
  while (s.step()) out.push_back(Store::read_event(s));
  return out;
}

std::vector<StragglerFinding> current_stragglers(Store& store, int64_t job) {
  // Newest first: a (rank, source)'s first event decides (a straggler_cleared after it clears it).
  std::map<std::pair<int64_t, std::string>, std::optional<proto::EventRecord>> seen;
  for (auto& e : latest_events(store, job, {"straggler", "straggler_cleared"}, 1000)) {
    auto r = e.data.find("rank");
    if (r == e.data.end() || !r->is_number_integer()) continue;
    const auto key = std::make_pair(r->get<int64_t>(), e.data.value("source", std::string("node")));
    if (seen.count(key)) continue;
    seen[key] = e.kind == "straggler" ? std::optional(std::move(e)) : std::nullopt;
  }
  // One finding per rank: the newest of its sources' current events.
  std::map<int64_t, StragglerFinding> by_rank;
  for (auto& [key, e] : seen) {
    if (!e) continue;
    auto it = by_rank.find(key.first);
    if (it != by_rank.end() && it->second.event.id > e->id) continue;
    std::string node = e->node;
    if (auto n = e->data.find("node"); n != e->data.end() && n->is_string())
      node = n->get<std::string>();
    by_rank[key.first] = {key.first, node, key.second, std::move(*e)};
  }
  std::vector<StragglerFinding> out;
  for (auto& [rank, f] : by_rank) out.push_back(std::move(f));
  return out;
}

int64_t count_events(Store& store, int64_t job, const std::string& kind) {
  Stmt& s = store.db().prepare("SELECT count(*) FROM events WHERE job_id=? AND kind=?");
  s.args(job, kind);
  s.step();
  int64_t n = s.i64(0);
  s.reset();
  return n;
}

std::vector<NodeRow> exported_nodes(Store& store, const ExportLimits& lim, double now) {
  std::vector<NodeRow> out;
  for (auto& n : store.nodes())
    if (n.state == "up" || n.last_heartbeat >= now - lim.recent_s) out.push_back(std::move(n));
  std::stable_sort(out.begin(), out.end(), [](const NodeRow& a, const NodeRow& b) {
    return a.last_heartbeat > b.last_heartbeat;
  });
  if (out.size() > lim.max_nodes) out.resize(lim.max_nodes);
  return out;
}

int64_t MetricsRetention::prune(Store& store, int64_t max_rows) {
  if (keep_steps_ <= 0 || max_rows <= 0) return 0;
  struct J {
    int64_t id, cutoff, attempts;
  };
  std::vector<J> due;
  {
    Stmt& s = store.db().prepare("SELECT id, last_step, attempt FROM jobs WHERE last_step > ?");
    s.args(keep_steps_);
    while (s.step()) {
      int64_t cutoff = s.i64(1) - keep_steps_;
      auto it = pruned_through_.find(s.i64(0));
      if (it != pruned_through_.end() && it->second >= cutoff) continue;
      due.push_back({s.i64(0), cutoff, s.i64(2)});
    }
  }
  int64_t deleted = 0;
  for (const auto& j : due) {
    bool done = true;
    for (const char* table : {"step_metrics", "rank_steps"}) {
      // Attempts are 1..attempt; each is a primary-key range (job_id, attempt, step <= cutoff).
      for (int64_t a = 1; a <= std::max<int64_t>(j.attempts, 1); ++a) {
        int64_t budget = max_rows - deleted;
        if (budget <= 0) return deleted;
        store.db()
            .prepare(std::string("DELETE FROM ") + table + " WHERE rowid IN (SELECT rowid FROM " +
                     table + " WHERE job_id=? AND attempt=? AND step<=? LIMIT ?)")
            .args(j.id, a, j.cutoff, budget)
            .run();
        int64_t n = store.db().changes();
        deleted += n;
        if (n == budget) done = false;  // maybe more
      }
    }
    if (done) pruned_through_[j.id] = j.cutoff;
  }
  return deleted;
}

}  // namespace ring::coord
