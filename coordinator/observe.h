// What the web endpoint (coordinator/web.h) and step-metric retention read and prune in the
// Store, beyond the requests of coordinator/queries.h: jobs worth exporting, a recent window of
// per-rank timings and its summaries, checkpoints, the latest straggler and hang findings, nodes
// with their heartbeat age, and the bounded deletion of old step metrics.
//
//   auto jobs = exported_jobs(store, {.recent_s = 3600, .max_jobs = 100}, now_unix());
//   auto win = rank_window(store, job.id, 20);          // last 20 steps of rank_steps
//   auto sums = summarize_ranks(win, 64);               // ranks >= 64 folded into "other"
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/protocol/protocol.h"
#include "coordinator/store.h"

namespace ring::coord {

// Which jobs the metrics and the dashboard list: every job that is not finished, and finished
// ones updated within recent_s; at most max_jobs, the most recently updated first.
struct ExportLimits {
  double recent_s = 3600;
  size_t max_jobs = 100;
  int64_t window_steps = 20;  // the recent window of rank_steps summaries cover
  size_t max_ranks = 64;      // ranks per job shown one by one; the rest are folded together
  size_t max_nodes = 1000;    // nodes in the metrics: up, or seen within recent_s
};
std::vector<JobRow> exported_jobs(Store& store, const ExportLimits& lim, double now);

// rank_steps rows of the job's latest attempt's last `steps` steps (by step, rank). Reads only
// the rows it returns (primary-key ranges), however large the table.
std::vector<protocol::RankStepRecord> rank_window(Store& store, int64_t job, int64_t steps);
// rank_steps rows with from_step <= step <= to_step of every attempt (by step, attempt, rank), at
// most `limit`; one primary-key range per attempt.
std::vector<protocol::RankStepRecord> rank_rows(Store& store, int64_t job, int64_t from_step,
                                                int64_t to_step, int64_t limit);
// The slowest node's step time of the job's latest recorded step (step_metrics).
std::optional<double> latest_step_seconds(Store& store, int64_t job);
// One point per step from from_step on (the latest attempt's report of each step, its first
// node's), by step.
struct StepPoint {
  int64_t step = 0;
  double loss = 0, tokens_per_s = 0, step_time_s = 0;
};
std::vector<StepPoint> step_points(Store& store, int64_t job, int64_t from_step);

// One rank's numbers over a window. rank < 0: the ranks past the cap, folded together.
struct RankSummary {
  int64_t rank = 0;
  std::string node;  // "" for the folded ranks
  size_t count = 0;  // rank-steps in the window
  double sum_step_s = 0;
  double p50 = 0, p90 = 0, p99 = 0;  // step time quantiles (nearest rank)
  double mean_data_s = 0, mean_compute_s = 0, mean_wait_s = 0, mean_comm_s = 0;
  int64_t hop_bytes = 0;
  double comm_s = 0;  // sum: hop bandwidth = hop_bytes / comm_s
  size_t folded_ranks = 0;
};
// Ranks below max_ranks one by one (by rank), then at most one folded entry (rank -1).
std::vector<RankSummary> summarize_ranks(const std::vector<protocol::RankStepRecord>& rows,
                                         size_t max_ranks);

// Nearest-rank quantile of sorted values (q in [0, 1]); 0 for none.
double quantile_sorted(const std::vector<double>& sorted, double q);

struct CheckpointInfo {
  int64_t step = 0;
  int64_t shards = 0;
  int64_t complete_shards = 0;
  int64_t bytes = 0;
  double created_at = 0;  // the first shard's
  // The slowest node's shard write in seconds (none: no node reported it, an older ringd).
  std::optional<double> seconds;
};
// A job's checkpoints, newest first, at most `limit`.
std::vector<CheckpointInfo> checkpoints(Store& store, int64_t job, int64_t limit);

// A job's latest events of the given kinds, newest first, at most `limit`.
std::vector<protocol::EventRecord> latest_events(Store& store, int64_t job,
                                                 const std::vector<std::string>& kinds,
                                                 int64_t limit);
// A job's last `limit` events of any kind, newest first.
std::vector<protocol::EventRecord> recent_events(Store& store, int64_t job, int64_t limit);

// A rank named a straggler and not cleared since (events `straggler` / `straggler_cleared`).
// ringd (source "node", its own ranks) and ring-coord's pass over every node's ranks (source
// "coordinator") name stragglers; each source's findings are followed separately and a rank
// named by both is one finding (the newest event).
struct StragglerFinding {
  int64_t rank = -1;
  std::string node;
  std::string source;           // "node" | "coordinator"
  protocol::EventRecord event;  // the straggler event
};
std::vector<StragglerFinding> current_stragglers(Store& store, int64_t job);

// Count of events of one kind for a job.
int64_t count_events(Store& store, int64_t job, const std::string& kind);

// Nodes that are up, or whose last heartbeat is within recent_s; the most recent first, at most
// max_nodes.
std::vector<NodeRow> exported_nodes(Store& store, const ExportLimits& lim, double now);

// Retention of step metrics: each job keeps the step_metrics and rank_steps rows of its last
// keep_steps steps (step > the job's last step - keep_steps); older rows are deleted, at most
// max_rows per call (run it in the caller's transaction, again on the next tick while it returns
// max_rows). Each deletion is a range of the tables' primary keys (job, attempt, step), so a call
// costs O(max_rows + jobs' attempts), never a scan of the tables.
class MetricsRetention {
 public:
  explicit MetricsRetention(int64_t keep_steps) : keep_steps_(keep_steps) {}
  // Returns the rows deleted (both tables).
  int64_t prune(Store& store, int64_t max_rows);

 private:
  int64_t keep_steps_;
  std::map<int64_t, int64_t> pruned_through_;  // job -> steps <= this are gone
};

}  // namespace ring::coord
