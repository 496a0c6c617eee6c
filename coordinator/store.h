// The coordinator's system of record: one SQLite file (WAL, foreign keys, busy timeout) with a
// versioned schema. Migrations are applied in order, each in its own transaction, and recorded in
// schema_version. Callers group the operations of one request in a Txn (coordinator/db.h); every
// job state change goes through set_state(), which checks the transition table
// (coordinator/job_state.h) and records a `state` event.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/protocol/protocol.h"
#include "coordinator/db.h"
#include "coordinator/job_state.h"

namespace ring::coord {

// Unix seconds (wall clock), the time unit of every *_at column.
double now_unix();

struct JobRow {
  int64_t id = 0;
  std::string name;
  int64_t owner_uid = 0;
  std::string owner_user;
  std::string spec;       // the submitted YAML text, verbatim
  std::string spec_hash;  // "sha256:<hex>" of spec
  JobState state = JobState::kPending;
  std::string state_reason;
  double created_at = 0;
  double updated_at = 0;
  std::string slurm_job_id;
  std::string ring_order;  // JSON array of node names; empty until computed
  int64_t nodes = 1;       // resources.nodes of the spec
  int64_t total_steps = 0;
  int64_t attempt = 0;   // current attempt number (0: none yet)
  int64_t restarts = 0;  // automatic restarts used
  int64_t max_restarts = 0;
  double backoff_s = 0;
  double backoff_max_s = 0;
  int64_t last_step = 0;
  std::optional<double> last_loss;
  std::optional<double> last_tokens_per_s;
  // Schema v2: when a restarting job starts its next attempt, and from which step.
  std::optional<double> restart_at;
  std::optional<int64_t> restart_step;
  // Schema v3: where the job's files are (daemon/INTERFACE.md), both absolute.
  std::string job_dir;
  std::string checkpoint_dir;
};

struct AttemptRow {
  int64_t job = 0;
  int64_t number = 0;
  std::string reason;
  int64_t resume_step = 0;
  double started_at = 0;
  std::optional<double> ended_at;
  std::string exit_status;
};

// A node is (uid, name) (schema v4): the same name under two uids is two nodes, so one user's
// daemon can neither take over nor block another user's node.
struct NodeRow {
  std::string name;
  int64_t uid = 0;
  std::string state = "up";  // up | lost
  double last_heartbeat = 0;
  double registered_at = 0;
  std::string gpus;      // JSON array
  std::string topology;  // JSON object
  std::string ringd_version;
};

// A node's part in a job: state active | done | stopped | lost.
struct JobNodeRow {
  int64_t job = 0;
  std::string node;
  int64_t attempt = 0;
  std::string state;
  int64_t node_uid = 0;  // the member is node (node_uid, node)
};

// A node a Slurm job must not be allocated again: Slurm requeued the job with the node down,
// drained or not responding, and the node's ringd never stopped on its own (a node failure).
// Kept for the life of the job.
struct ExcludedNodeRow {
  std::string node;
  int64_t attempt = 0;  // the attempt that failed with it
  std::string reason;
  double at = 0;  // Unix seconds
};

class Store {
 public:
  struct Options {
    bool synchronous_full = true;
    // Stop migrating at this version (tests of migrations); 0: the latest.
    int target_version = 0;
    // Read an existing database without writing (Db::Options::read_only); its schema must be
    // the latest this build knows (a newer or older one is a DbError naming both versions).
    bool read_only = false;
  };
  Store(const std::string& path, Options opts);

  static int latest_schema_version();
  int schema_version();
  Db& db() { return db_; }

  // ---- jobs
  int64_t insert_job(const JobRow& j);
  std::optional<JobRow> job(int64_t id);
  std::vector<JobRow> jobs();
  std::vector<JobRow> jobs_in_state(JobState s);
  // THE way to change a job's state: checks the transition table, records a `state` event.
  // Throws InvalidTransition.
  void set_state(int64_t job, JobState to, const std::string& reason);
  void set_attempt(int64_t job, int64_t attempt, int64_t restarts);
  void set_restart(int64_t job, std::optional<double> at, std::optional<int64_t> step);
  // Progress as of `at` (unix seconds, when it arrived); updated_at never moves back.
  void set_progress(int64_t job, int64_t step, double loss, double tokens_per_s, double at);
  void set_ring_order(int64_t job, const std::string& json_array);
  void set_slurm_job_id(int64_t job, const std::string& id);

  // ---- attempts
  void begin_attempt(int64_t job, int64_t number, const std::string& reason, int64_t resume_step);
  void end_attempt(int64_t job, int64_t number, const std::string& exit_status);
  std::vector<AttemptRow> attempts(int64_t job);

  // ---- nodes
  void upsert_node(const NodeRow& n);
  std::optional<NodeRow> node(int64_t uid, const std::string& name);
  int64_t count_nodes(int64_t uid);  // node rows of that uid
  std::vector<NodeRow> nodes();
  void set_node_state(int64_t uid, const std::string& name, const std::string& state);
  void touch_node(int64_t uid, const std::string& name, double t);

  // ---- job <-> node membership
  // A job's member names are unique within the job; node_uid says whose node it is.
  void add_job_node(int64_t job, const std::string& node, int64_t node_uid, int64_t attempt);
  void set_job_node_state(int64_t job, const std::string& node, const std::string& state);
  void set_job_nodes_attempt(int64_t job, int64_t attempt);
  std::vector<JobNodeRow> job_nodes(int64_t job);
  std::optional<JobNodeRow> job_node(int64_t job, const std::string& node);
  // Records node as excluded from the job's allocations; false if it already was.
  bool add_excluded_node(int64_t job, const std::string& node, int64_t attempt,
                         const std::string& reason);
  std::vector<ExcludedNodeRow> excluded_nodes(int64_t job);
  // State and attempt only (the hot path of heartbeats; no spec text).
  struct JobBrief {
    JobState state;
    int64_t attempt;
  };
  std::optional<JobBrief> job_brief(int64_t job);
  std::vector<int64_t> jobs_of_node(int64_t uid, const std::string& node);

  // ---- workers
  void upsert_worker(int64_t job, int64_t attempt, const std::string& node, int64_t rank,
                     std::optional<int64_t> pid, const std::string& state,
                     std::optional<int64_t> exit_code, std::optional<int64_t> signal);

  // ---- events
  int64_t add_event(std::optional<int64_t> job, int64_t attempt, const std::string& node,
                    const std::string& kind, const nlohmann::json& data);
  std::vector<protocol::EventRecord> events(int64_t job, int64_t after, int64_t limit);
  // The job's newest event of this kind.
  std::optional<protocol::EventRecord> last_event(int64_t job, const std::string& kind);

  // ---- checkpoints (one row per node shard; `seconds`: how long the node's shard took to write,
  // when its ringd reported it, schema v6)
  void upsert_checkpoint(int64_t job, int64_t step, const std::string& node,
                         const std::string& path, int64_t bytes, bool complete,
                         std::optional<double> seconds = std::nullopt, bool superseded = false);
  // Largest step of the current lineage (not superseded, not deleted) whose shards are all
  // complete and come from at least `nodes` nodes.
  std::optional<int64_t> latest_complete_checkpoint(int64_t job, int64_t nodes);
  // What is recorded of one step's checkpoint (schema v7).
  struct CheckpointStep {
    bool recorded = false;    // some node reported a shard of it
    bool complete = false;    // every shard complete, from at least `nodes` nodes
    bool superseded = false;  // abandoned by a `restart --from` an older step
    bool deleted = false;     // retention removed it
  };
  CheckpointStep checkpoint_step(int64_t job, int64_t step, int64_t nodes);
  // The steps a restart may resume from (complete, current lineage, not deleted), ascending.
  std::vector<int64_t> resumable_steps(int64_t job, int64_t nodes);
  // `restart --from step`: every checkpoint after it leaves the lineage.
  void supersede_checkpoints_after(int64_t job, int64_t step);
  // node 0's retention removed these steps' checkpoints.
  void mark_checkpoints_deleted(int64_t job, const std::vector<int64_t>& steps);

  // ---- step metrics
  void add_step(const protocol::StepReport& s, double t);
  // A job's step reports with step > after, by step then node, at most `limit`.
  std::vector<protocol::StepRecord> steps(int64_t job, int64_t after, int64_t limit);
  // A job's per-rank timings (add_step writes a report's `ranks`) with from_step <= step <=
  // to_step, by step, attempt, rank; at most `limit`.
  std::vector<protocol::RankStepRecord> rank_steps(int64_t job, int64_t from_step, int64_t to_step,
                                                   int64_t limit);
  // The columns of a rank_steps row in the order read_rank_step reads them, and the reader.
  static const char* const kRankStepColumns;
  static protocol::RankStepRecord read_rank_step(const Stmt& s);
  // An events row read as SELECT id, time, job_id, attempt, node, kind, data.
  static protocol::EventRecord read_event(const Stmt& s);
  int64_t count(const std::string& table);

 private:
  void migrate(int target);
  Db db_;
};

// sha256 of a string as "sha256:<64 hex digits>".
std::string sha256_hex(std::string_view data);

}  // namespace ring::coord
