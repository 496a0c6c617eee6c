#include "coordinator/prometheus.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

#include "common/version.h"

namespace ring::coord {

void Exposition::family(const std::string& name, const std::string& type, const std::string& help) {
  if (!valid_name(name)) throw std::invalid_argument("invalid metric name '" + name + "'");
  for (size_t i = 0; i < families_.size(); ++i)
    if (families_[i].name == name) {
      current_ = i;
      return;
    }
  families_.push_back({name, type, help, {}});
  current_ = families_.size() - 1;
}

void Exposition::sample(const Labels& labels, double value, const std::string& suffix) {
  if (families_.empty()) throw std::logic_error("sample before family");
  Family& f = families_[current_];
  std::string line = f.name + suffix;
  if (!labels.empty()) {
    line += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) line += ',';
      line += labels[i].first + "=\"" + escape_label(labels[i].second) + '"';
    }
    line += '}';
  }
  line += ' ';
  line += format_value(value);
  f.lines.push_back(std::move(line));
}

std::string Exposition::text() const {
  std::string out;
  for (const auto& f : families_) {
    out += "# HELP " + f.name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    for (const auto& l : f.lines) out += l + "\n";
  }
  return out;
}

std::string Exposition::escape_label(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\')
      o += "\\\\";
    else if (c == '"')
      o += "\\\"";
    else if (c == '\n')
      o += "\\n";
    else
      o += c;
  }
  return o;
}

std::string Exposition::escape_help(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\')
      o += "\\\\";
    else if (c == '\n')
      o += "\\n";
    else
      o += c;
  }
  return o;
}

std::string Exposition::format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  return std::string(buf, r.ptr);
}

bool Exposition::valid_name(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

namespace {

Labels job_labels(const JobRow& j) {
  return {{"job_id", std::to_string(j.id)}, {"slurm_job_id", j.slurm_job_id}};
}

Labels with(Labels l, std::initializer_list<std::pair<std::string, std::string>> more) {
  for (const auto& kv : more) l.push_back(kv);
  return l;
}

std::string rank_label(const RankSummary& s) {
  return s.rank < 0 ? "other" : std::to_string(s.rank);
}

}  // namespace

namespace {

// A per-job family: one sample per exported job that has a value.
template <class Value>
void per_job(Exposition& x, const std::vector<JobRow>& jobs, const std::string& name,
             const std::string& type, const std::string& help, Value value) {
  x.family(name, type, help);
  for (const auto& j : jobs)
    if (auto v = value(j)) x.sample(job_labels(j), *v);
}

using OptD = std::optional<double>;

// ring_jobs: every job in the database by state, every state listed (0 included).
void job_state_families(Exposition& x, Store& store) {
  std::map<std::string, int64_t> by_state;
  for (JobState s : kAllJobStates)
    by_state[to_string(s)] = 0;
  {
    Stmt& s = store.db().prepare("SELECT state, count(*) FROM jobs GROUP BY state");
    while (s.step()) by_state[s.text(0)] = s.i64(1);
  }
  x.family("ring_jobs", "gauge", "Jobs in the coordinator's database by state");
  for (const auto& [state, n] : by_state) x.sample({{"state", state}}, static_cast<double>(n));
}

// ring_job_*: the exported jobs (not finished, or finished within the recent window).
void job_families(Exposition& x, Store& store, const std::vector<JobRow>& jobs) {
  x.family("ring_job_info", "gauge",
           "One series per exported job (value 1): its name, owner and state");
  for (const auto& j : jobs)
    x.sample(with(job_labels(j),
                  {{"name", j.name}, {"owner", j.owner_user}, {"state", to_string(j.state)}}),
             1);
  per_job(x, jobs, "ring_job_step", "gauge", "The job's latest step reported",
          [](const JobRow& j) -> OptD { return static_cast<double>(j.last_step); });
  per_job(x, jobs, "ring_job_total_steps", "gauge", "The job's training.steps",
          [](const JobRow& j) -> OptD { return static_cast<double>(j.total_steps); });
  per_job(x, jobs, "ring_job_loss", "gauge", "The loss of the job's latest step (NaN: diverged)",
          [](const JobRow& j) -> OptD { return j.last_loss; });
  per_job(x, jobs, "ring_job_tokens_per_second", "gauge", "Training tokens per second at the latest step",
          [](const JobRow& j) -> OptD { return j.last_tokens_per_s; });
  per_job(x, jobs, "ring_job_attempt", "gauge", "The job's current attempt number",
          [](const JobRow& j) -> OptD { return static_cast<double>(j.attempt); });
  per_job(x, jobs, "ring_job_restarts_total", "counter", "Automatic restarts of the job",
          [](const JobRow& j) -> OptD { return static_cast<double>(j.restarts); });
  per_job(x, jobs, "ring_job_hangs_total", "counter", "Hang findings recorded for the job (events `hang`)",
          [&](const JobRow& j) -> OptD {
            return static_cast<double>(count_events(store, j.id, "hang"));
          });

  // Latest step time: the slowest node's report of the latest step in step_metrics.
  per_job(x, jobs, "ring_job_step_seconds", "gauge",
          "Step time of the job's latest recorded step (the slowest node's report)",
          [&](const JobRow& j) -> OptD { return latest_step_seconds(store, j.id); });
}

// ring_job_checkpoint_*: each exported job's latest complete checkpoint.
void checkpoint_families(Exposition& x, Store& store, const std::vector<JobRow>& jobs) {
  // Checkpoints: the latest complete one.
  std::map<int64_t, CheckpointInfo> latest_ckpt;
  for (const auto& j : jobs)
    for (const auto& c : checkpoints(store, j.id, 20))
      if (c.complete_shards == c.shards && c.shards >= j.nodes) {
        latest_ckpt[j.id] = c;
        break;
      }
  per_job(x, jobs, "ring_job_checkpoint_step", "gauge", "Step of the job's latest complete checkpoint",
          [&](const JobRow& j) -> OptD {
            auto it = latest_ckpt.find(j.id);
            if (it == latest_ckpt.end()) return std::nullopt;
            return static_cast<double>(it->second.step);
          });
  per_job(x, jobs, "ring_job_checkpoint_bytes", "gauge",
          "Bytes of the job's latest complete checkpoint (all node shards)",
          [&](const JobRow& j) -> OptD {
            auto it = latest_ckpt.find(j.id);
            if (it == latest_ckpt.end()) return std::nullopt;
            return static_cast<double>(it->second.bytes);
          });
  per_job(x, jobs, "ring_job_checkpoint_seconds", "gauge",
          "Seconds the job's latest complete checkpoint took to write (the slowest node's shard, "
          "start to durable)",
          [&](const JobRow& j) -> OptD {
            auto it = latest_ckpt.find(j.id);
            if (it == latest_ckpt.end()) return std::nullopt;
            return it->second.seconds;
          });
}

// ring_rank_*: per rank over the last window_steps steps of rank_steps, and the folded ranks.
void rank_families(Exposition& x, Store& store, const std::vector<JobRow>& jobs,
                   const ExportLimits& lim) {
  // Per rank, over the last window_steps steps of rank_steps.
  std::vector<std::pair<const JobRow*, std::vector<RankSummary>>> ranks;
  for (const auto& j : jobs) {
    auto sums = summarize_ranks(rank_window(store, j.id, lim.window_steps), lim.max_ranks);
    if (!sums.empty()) ranks.emplace_back(&j, std::move(sums));
  }
  auto rank_labels = [](const JobRow& j, const RankSummary& s) {
    return with(job_labels(j), {{"node", s.rank < 0 ? "other" : s.node}, {"rank", rank_label(s)}});
  };
  x.family("ring_rank_step_seconds", "summary",
           "Step time per rank over the job's last recorded steps (window: --metrics-window "
           "steps); ranks past the cap are folded into rank=\"other\"");
  for (const auto& [j, sums] : ranks)
    for (const auto& s : sums) {
      auto l = rank_labels(*j, s);
      for (auto [q, v] : {std::pair{"0.5", s.p50}, {"0.9", s.p90}, {"0.99", s.p99}})
        x.sample(with(l, {{"quantile", q}}), v);
      x.sample(l, s.sum_step_s, "_sum");
      x.sample(l, static_cast<double>(s.count), "_count");
    }
  x.family("ring_rank_phase_seconds", "gauge",
           "Mean seconds per step a rank spent in each phase (data, compute, wait, comm) over the "
           "window");
  for (const auto& [j, sums] : ranks)
    for (const auto& s : sums) {
      auto l = rank_labels(*j, s);
      x.sample(with(l, {{"phase", "data"}}), s.mean_data_s);
      x.sample(with(l, {{"phase", "compute"}}), s.mean_compute_s);
      x.sample(with(l, {{"phase", "wait"}}), s.mean_wait_s);
      x.sample(with(l, {{"phase", "comm"}}), s.mean_comm_s);
    }
  x.family("ring_rank_hop_bandwidth_bytes_per_second", "gauge",
           "Ring hop bandwidth per rank over the window: bytes sent on hops / seconds in "
           "communication");
  for (const auto& [j, sums] : ranks)
    for (const auto& s : sums)
      if (s.comm_s > 0) x.sample(rank_labels(*j, s), static_cast<double>(s.hop_bytes) / s.comm_s);
  x.family("ring_job_folded_ranks", "gauge",
           "Ranks of the job folded into rank=\"other\" (past the per-job cap)");
  for (const auto& [j, sums] : ranks) {
    double folded = 0;
    for (const auto& s : sums) folded += static_cast<double>(s.folded_ranks);
    x.sample(job_labels(*j), folded);
  }
}

// ring_rank_straggler: the findings not cleared since.
void straggler_family(Exposition& x, Store& store, const std::vector<JobRow>& jobs,
                      const ExportLimits& lim) {
  // Findings: ranks named stragglers and not cleared since.
  x.family("ring_rank_straggler", "gauge",
           "1 for each rank currently named a straggler (events `straggler` not followed by "
           "`straggler_cleared`; source: node = its ringd over the node's ranks, coordinator = "
           "ring-coord over every node's ranks)");
  for (const auto& j : jobs) {
    size_t n = 0;
    for (const auto& f : current_stragglers(store, j.id)) {
      if (++n > lim.max_ranks) break;
      x.sample(with(job_labels(j),
                    {{"node", f.node}, {"rank", std::to_string(f.rank)}, {"source", f.source}}),
               1);
    }
  }
}

// ring_node_*: the exported nodes.
void node_families(Exposition& x, Store& store, const ExportLimits& lim, double now) {
  // Nodes.
  const auto nodes = exported_nodes(store, lim, now);
  x.family("ring_node_up", "gauge", "1 when the node's daemon is up, 0 when it was lost");
  // A node is (uid, name): two users' daemons may use one name.
  for (const auto& n : nodes)
    x.sample({{"node", n.name}, {"uid", std::to_string(n.uid)}}, n.state == "up" ? 1 : 0);
  x.family("ring_node_heartbeat_age_seconds", "gauge",
           "Seconds since the node's last heartbeat as written to the database (heartbeat times "
           "are written in batches, every 2 s)");
  for (const auto& n : nodes)
    x.sample({{"node", n.name}, {"uid", std::to_string(n.uid)}},
             std::max(0.0, now - n.last_heartbeat));
}

}  // namespace

std::string render_metrics(Store& store, const ExportLimits& lim, double now) {
  Exposition x;
  x.family("ring_coordinator_info", "gauge", "ring-coord's version (the value is always 1)");
  x.sample({{"version", kVersion}}, 1);
  job_state_families(x, store);
  const auto jobs = exported_jobs(store, lim, now);
  job_families(x, store, jobs);
  checkpoint_families(x, store, jobs);
  rank_families(x, store, jobs, lim);
  straggler_family(x, store, jobs, lim);
  node_families(x, store, lim, now);
  return x.text();
}

}  // namespace ring::coord
