#include "coordinator/store.h"

#include <sodium.h>

#include <chrono>

namespace ring::coord {

using nlohmann::json;

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string sha256_hex(std::string_view data) {
  unsigned char out[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(out, reinterpret_cast<const unsigned char*>(data.data()), data.size());
  static const char* hex = "0123456789abcdef";
  std::string s = "sha256:";
  for (unsigned char c : out) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

namespace {

struct Migration {
  int version;
  const char* description;
  const char* sql;
  // The migration rebuilds a table others reference (SQLite cannot change a CHECK constraint in
  // place): it runs with foreign keys off, then every reference is checked before the commit
  // (sqlite.org/lang_altertable.html, "other kinds of table schema changes").
  bool rebuilds = false;
};

// Append-only: never edit a migration that has shipped; add the next version instead.
const Migration kMigrations[] = {
    {1,
     "initial schema: jobs, attempts, nodes, job_nodes, workers, events, checkpoints, "
     "step_metrics",
     R"sql(
CREATE TABLE jobs (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  name          TEXT NOT NULL,
  owner_uid     INTEGER NOT NULL,
  owner_user    TEXT NOT NULL,
  spec          TEXT NOT NULL,
  spec_hash     TEXT NOT NULL,
  state         TEXT NOT NULL CHECK (state IN ('pending','starting','running','restarting',
                  'completing','completed','failed','cancelling','cancelled')),
  state_reason  TEXT NOT NULL DEFAULT '',
  created_at    REAL NOT NULL,
  updated_at    REAL NOT NULL,
  slurm_job_id  TEXT NOT NULL DEFAULT '',
  ring_order    TEXT NOT NULL DEFAULT '',
  nodes         INTEGER NOT NULL CHECK (nodes >= 1),
  total_steps   INTEGER NOT NULL,
  attempt       INTEGER NOT NULL DEFAULT 0,
  restarts      INTEGER NOT NULL DEFAULT 0,
  max_restarts  INTEGER NOT NULL,
  backoff_s     REAL NOT NULL,
  backoff_max_s REAL NOT NULL,
  last_step     INTEGER NOT NULL DEFAULT 0,
  last_loss     REAL,
  last_tokens_per_s REAL
);
CREATE INDEX jobs_state ON jobs(state);
CREATE TABLE attempts (
  job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  number      INTEGER NOT NULL CHECK (number >= 1),
  reason      TEXT NOT NULL,
  resume_step INTEGER NOT NULL,
  started_at  REAL NOT NULL,
  ended_at    REAL,
  exit_status TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (job_id, number)
);
CREATE TABLE nodes (
  name           TEXT PRIMARY KEY,
  uid            INTEGER NOT NULL,
  state          TEXT NOT NULL CHECK (state IN ('up','lost')),
  last_heartbeat REAL NOT NULL,
  registered_at  REAL NOT NULL,
  gpus           TEXT NOT NULL,
  topology       TEXT NOT NULL,
  ringd_version  TEXT NOT NULL
);
CREATE TABLE job_nodes (
  job_id  INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  node    TEXT NOT NULL REFERENCES nodes(name),
  attempt INTEGER NOT NULL,
  state   TEXT NOT NULL CHECK (state IN ('active','done','stopped','lost')),
  PRIMARY KEY (job_id, node)
);
CREATE INDEX job_nodes_node ON job_nodes(node);
CREATE TABLE workers (
  job_id     INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  attempt    INTEGER NOT NULL,
  node       TEXT NOT NULL,
  rank       INTEGER NOT NULL,
  pid        INTEGER,
  state      TEXT NOT NULL,
  exit_code  INTEGER,
  signal     INTEGER,
  updated_at REAL NOT NULL,
  PRIMARY KEY (job_id, attempt, rank)
);
CREATE TABLE events (
  id      INTEGER PRIMARY KEY AUTOINCREMENT,
  time    REAL NOT NULL,
  job_id  INTEGER REFERENCES jobs(id) ON DELETE CASCADE,
  attempt INTEGER NOT NULL DEFAULT 0,
  node    TEXT NOT NULL DEFAULT '',
  kind    TEXT NOT NULL,
  data    TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE checkpoints (
  job_id     INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  step       INTEGER NOT NULL,
  node       TEXT NOT NULL,
  path       TEXT NOT NULL,
  bytes      INTEGER NOT NULL,
  complete   INTEGER NOT NULL CHECK (complete IN (0,1)),
  created_at REAL NOT NULL,
  PRIMARY KEY (job_id, step, node)
);
CREATE TABLE step_metrics (
  job_id       INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  attempt      INTEGER NOT NULL,
  step         INTEGER NOT NULL,
  node         TEXT NOT NULL,
  loss         REAL NOT NULL,
  tokens_per_s REAL NOT NULL,
  step_time_s  REAL NOT NULL,
  comm_time_s  REAL NOT NULL,
  time         REAL NOT NULL,
  PRIMARY KEY (job_id, attempt, step, node)
);
)sql"},
    {2, "restart schedule survives coordinator restarts; event lookups by job",
     R"sql(
ALTER TABLE jobs ADD COLUMN restart_at REAL;
ALTER TABLE jobs ADD COLUMN restart_step INTEGER;
CREATE INDEX events_job ON events(job_id, id);
)sql"},
    {3, "the job's directory (logs, steps.jsonl) and checkpoint directory, for ringctl",
     R"sql(
ALTER TABLE jobs ADD COLUMN job_dir TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN checkpoint_dir TEXT NOT NULL DEFAULT '';
)sql"},
    // A node is (uid, name): two users' daemons may use the same name without taking over each
    // other's node, and a job's member records which uid's node it is.
    {4, "node identity is (uid, name); job members record their node's uid",
     R"sql(
CREATE TABLE nodes_v4 (
  name           TEXT NOT NULL,
  uid            INTEGER NOT NULL,
  state          TEXT NOT NULL CHECK (state IN ('up','lost')),
  last_heartbeat REAL NOT NULL,
  registered_at  REAL NOT NULL,
  gpus           TEXT NOT NULL,
  topology       TEXT NOT NULL,
  ringd_version  TEXT NOT NULL,
  PRIMARY KEY (uid, name)
);
INSERT INTO nodes_v4(name, uid, state, last_heartbeat, registered_at, gpus, topology,
                     ringd_version)
  SELECT name, uid, state, last_heartbeat, registered_at, gpus, topology, ringd_version FROM nodes;
CREATE TABLE job_nodes_v4 (
  job_id   INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  node     TEXT NOT NULL,
  node_uid INTEGER NOT NULL,
  attempt  INTEGER NOT NULL,
  state    TEXT NOT NULL CHECK (state IN ('active','done','stopped','lost')),
  PRIMARY KEY (job_id, node),
  FOREIGN KEY (node_uid, node) REFERENCES nodes_v4(uid, name)
);
INSERT INTO job_nodes_v4(job_id, node, node_uid, attempt, state)
  SELECT jn.job_id, jn.node, n.uid, jn.attempt, jn.state
  FROM job_nodes jn JOIN nodes n ON n.name = jn.node;
DROP TABLE job_nodes;
DROP TABLE nodes;
ALTER TABLE nodes_v4 RENAME TO nodes;
ALTER TABLE job_nodes_v4 RENAME TO job_nodes;
CREATE INDEX job_nodes_node ON job_nodes(node_uid, node);
)sql"},
    {5, "per-rank step timings (each node's workers), for straggler attribution and dashboards",
     R"sql(
CREATE TABLE rank_steps (
  job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  attempt     INTEGER NOT NULL,
  step        INTEGER NOT NULL,
  rank        INTEGER NOT NULL,
  node        TEXT NOT NULL,
  step_time_s REAL NOT NULL,
  data_s      REAL NOT NULL,
  compute_s   REAL NOT NULL,
  wait_s      REAL NOT NULL,
  comm_s      REAL NOT NULL,
  hop_bytes   INTEGER NOT NULL,
  time        REAL NOT NULL,
  PRIMARY KEY (job_id, attempt, step, rank)
);
)sql"},
    {6, "checkpoint write seconds per node shard (NULL: not reported, an older ringd)",
     R"sql(
ALTER TABLE checkpoints ADD COLUMN seconds REAL;
)sql"},
    {7, "checkpoint lineage: steps superseded by `restart --from`, steps retention removed",
     R"sql(
ALTER TABLE checkpoints ADD COLUMN superseded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;
)sql"},
    {8, "job state 'stopped': every node stopped on its own stop signal, resumable",
     R"sql(
CREATE TABLE jobs_v8 (
  id            INTEGER PRIMARY KEY AUTOINCREMENT,
  name          TEXT NOT NULL,
  owner_uid     INTEGER NOT NULL,
  owner_user    TEXT NOT NULL,
  spec          TEXT NOT NULL,
  spec_hash     TEXT NOT NULL,
  state         TEXT NOT NULL CHECK (state IN ('pending','starting','running','restarting',
                  'completing','completed','failed','cancelling','cancelled','stopped')),
  state_reason  TEXT NOT NULL DEFAULT '',
  created_at    REAL NOT NULL,
  updated_at    REAL NOT NULL,
  slurm_job_id  TEXT NOT NULL DEFAULT '',
  ring_order    TEXT NOT NULL DEFAULT '',
  nodes         INTEGER NOT NULL CHECK (nodes >= 1),
  total_steps   INTEGER NOT NULL,
  attempt       INTEGER NOT NULL DEFAULT 0,
  restarts      INTEGER NOT NULL DEFAULT 0,
  max_restarts  INTEGER NOT NULL,
  backoff_s     REAL NOT NULL,
  backoff_max_s REAL NOT NULL,
  last_step     INTEGER NOT NULL DEFAULT 0,
  last_loss     REAL,
  last_tokens_per_s REAL,
  restart_at    REAL,
  restart_step  INTEGER,
  job_dir       TEXT NOT NULL DEFAULT '',
  checkpoint_dir TEXT NOT NULL DEFAULT ''
);
INSERT INTO jobs_v8(id, name, owner_uid, owner_user, spec, spec_hash, state, state_reason,
                    created_at, updated_at, slurm_job_id, ring_order, nodes, total_steps, attempt,
                    restarts, max_restarts, backoff_s, backoff_max_s, last_step, last_loss,
                    last_tokens_per_s, restart_at, restart_step, job_dir, checkpoint_dir)
  SELECT id, name, owner_uid, owner_user, spec, spec_hash, state, state_reason, created_at,
         updated_at, slurm_job_id, ring_order, nodes, total_steps, attempt, restarts,
         max_restarts, backoff_s, backoff_max_s, last_step, last_loss, last_tokens_per_s,
         restart_at, restart_step, job_dir, checkpoint_dir FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v8 RENAME TO jobs;
CREATE INDEX jobs_state ON jobs(state);
)sql",
     true},
    {9, "nodes a Slurm job must not be allocated again (a node failure requeued it)",
     R"sql(
CREATE TABLE excluded_nodes (
  job_id   INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
  node     TEXT NOT NULL,
  attempt  INTEGER NOT NULL,
  reason   TEXT NOT NULL,
  at       REAL NOT NULL,
  PRIMARY KEY (job_id, node)
);
)sql"},
};

constexpr const char* kJobCols =
    "id, name, owner_uid, owner_user, spec, spec_hash, state, state_reason, created_at, "
    "updated_at, slurm_job_id, ring_order, nodes, total_steps, attempt, restarts, max_restarts, "
    "backoff_s, backoff_max_s, last_step, last_loss, last_tokens_per_s, restart_at, restart_step, "
    "job_dir, checkpoint_dir";

JobRow read_job(const Stmt& s) {
  JobRow j;
  int c = 0;
  j.id = s.i64(c++);
  j.name = s.text(c++);
  j.owner_uid = s.i64(c++);
  j.owner_user = s.text(c++);
  j.spec = s.text(c++);
  j.spec_hash = s.text(c++);
  std::string st = s.text(c++);
  auto parsed = job_state_from_string(st);
  if (!parsed) throw DbError("job " + std::to_string(j.id) + ": unknown state '" + st + "'");
  j.state = *parsed;
  j.state_reason = s.text(c++);
  j.created_at = s.f64(c++);
  j.updated_at = s.f64(c++);
  j.slurm_job_id = s.text(c++);
  j.ring_order = s.text(c++);
  j.nodes = s.i64(c++);
  j.total_steps = s.i64(c++);
  j.attempt = s.i64(c++);
  j.restarts = s.i64(c++);
  j.max_restarts = s.i64(c++);
  j.backoff_s = s.f64(c++);
  j.backoff_max_s = s.f64(c++);
  j.last_step = s.i64(c++);
  j.last_loss = s.opt_f64(c++);
  j.last_tokens_per_s = s.opt_f64(c++);
  j.restart_at = s.opt_f64(c++);
  j.restart_step = s.opt_i64(c++);
  j.job_dir = s.text(c++);
  j.checkpoint_dir = s.text(c++);
  return j;
}

}  // namespace

int Store::latest_schema_version() {
  return kMigrations[std::size(kMigrations) - 1].version;
}

Store::Store(const std::string& path, Options opts)
    : db_(path, Db::Options{opts.synchronous_full, 5000, opts.read_only}) {
  if (sodium_init() < 0) throw DbError("libsodium failed to initialise");
  if (opts.read_only) {
    int v = schema_version();
    if (v != latest_schema_version())
      throw DbError("database " + path + " has schema version " + std::to_string(v) +
                    "; this build reads version " + std::to_string(latest_schema_version()));
    return;
  }
  migrate(opts.target_version ? opts.target_version : latest_schema_version());
}

int Store::schema_version() {
  Stmt& s = db_.prepare(
      "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema_version'");
  s.step();
  bool has = s.i64(0) > 0;
  s.reset();
  if (!has) return 0;
  Stmt& v = db_.prepare("SELECT coalesce(max(version), 0) FROM schema_version");
  v.step();
  int out = static_cast<int>(v.i64(0));
  v.reset();
  return out;
}

void Store::migrate(int target) {
  if (target > latest_schema_version())
    throw DbError("schema version " + std::to_string(target) + " requested; this build knows " +
                  std::to_string(latest_schema_version()));
  {
    Txn t(db_);
    db_.exec(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, "
        "applied_at REAL NOT NULL, description TEXT NOT NULL)");
    t.commit();
  }
  int current = schema_version();
  if (current > latest_schema_version())
    throw DbError("database schema version " + std::to_string(current) +
                  " is newer than this ring-coord (" + std::to_string(latest_schema_version()) +
                  "); use a newer ring-coord");
  for (const auto& m : kMigrations) {
    if (m.version <= current || m.version > target) continue;
    // (PRAGMA foreign_keys is a no-op inside a transaction: set around it.)
    if (m.rebuilds) db_.exec("PRAGMA foreign_keys=OFF");
    try {
      Txn t(db_);
      db_.exec(m.sql);
      if (m.rebuilds) {
        Stmt& fk = db_.prepare("PRAGMA foreign_key_check");
        const bool broken = fk.step();
        fk.reset();
        if (broken)
          throw DbError("schema migration " + std::to_string(m.version) +
                        " would break a reference between tables; the database is unchanged");
      }
      db_.prepare("INSERT INTO schema_version(version, applied_at, description) VALUES (?,?,?)")
          .args(int64_t{m.version}, now_unix(), m.description)
          .run();
      t.commit();
    } catch (...) {
      if (m.rebuilds) db_.exec("PRAGMA foreign_keys=ON");
      throw;
    }
    if (m.rebuilds) db_.exec("PRAGMA foreign_keys=ON");
  }
}

// ---- jobs -----------------------------------------------------------------------------------

int64_t Store::insert_job(const JobRow& j) {
  double t = now_unix();
  db_.prepare(
         "INSERT INTO jobs(name, owner_uid, owner_user, spec, spec_hash, state, state_reason, "
         "created_at, updated_at, slurm_job_id, ring_order, nodes, total_steps, max_restarts, "
         "backoff_s, backoff_max_s) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
      .args(j.name, j.owner_uid, j.owner_user, j.spec, j.spec_hash, to_string(j.state),
            j.state_reason, t, t, j.slurm_job_id, j.ring_order, j.nodes, j.total_steps,
            j.max_restarts, j.backoff_s, j.backoff_max_s)
      .run();
  int64_t id = db_.last_insert_id();
  // Schema v3 columns, only when set (a store opened at an older version has no such columns).
  if (!j.job_dir.empty() || !j.checkpoint_dir.empty())
    db_.prepare("UPDATE jobs SET job_dir=?, checkpoint_dir=? WHERE id=?")
        .args(j.job_dir, j.checkpoint_dir, id)
        .run();
  add_event(id, 0, "", "submitted",
            {{"name", j.name}, {"owner_uid", j.owner_uid}, {"spec_hash", j.spec_hash}});
  return id;
}

std::optional<JobRow> Store::job(int64_t id) {
  Stmt& s = db_.prepare(std::string("SELECT ") + kJobCols + " FROM jobs WHERE id=?");
  s.args(id);
  if (!s.step()) return std::nullopt;
  JobRow j = read_job(s);
  s.reset();
  return j;
}

std::vector<JobRow> Store::jobs() {
  std::vector<JobRow> out;
  Stmt& s = db_.prepare(std::string("SELECT ") + kJobCols + " FROM jobs ORDER BY id");
  while (s.step()) out.push_back(read_job(s));
  return out;
}

std::vector<JobRow> Store::jobs_in_state(JobState st) {
  std::vector<JobRow> out;
  Stmt& s = db_.prepare(std::string("SELECT ") + kJobCols + " FROM jobs WHERE state=? ORDER BY id");
  s.args(to_string(st));
  while (s.step()) out.push_back(read_job(s));
  return out;
}

void Store::set_state(int64_t id, JobState to, const std::string& reason) {
  auto j = job(id);
  if (!j) throw DbError("job " + std::to_string(id) + " does not exist");
  check_transition(j->state, to, "job " + std::to_string(id));
  db_.prepare("UPDATE jobs SET state=?, state_reason=?, updated_at=? WHERE id=?")
      .args(to_string(to), reason, now_unix(), id)
      .run();
  add_event(id, j->attempt, "", "state",
            {{"from", to_string(j->state)}, {"to", to_string(to)}, {"reason", reason}});
}

void Store::set_attempt(int64_t job, int64_t attempt, int64_t restarts) {
  db_.prepare("UPDATE jobs SET attempt=?, restarts=?, updated_at=? WHERE id=?")
      .args(attempt, restarts, now_unix(), job)
      .run();
}

void Store::set_restart(int64_t job, std::optional<double> at, std::optional<int64_t> step) {
  db_.prepare("UPDATE jobs SET restart_at=?, restart_step=? WHERE id=?").args(at, step, job).run();
}

void Store::set_progress(int64_t job, int64_t step, double loss, double tps, double at) {
  db_.prepare(
         "UPDATE jobs SET last_step=?, last_loss=?, last_tokens_per_s=?, "
         "updated_at=MAX(updated_at, ?) WHERE id=?")
      .args(step, loss, tps, at, job)
      .run();
}

void Store::set_ring_order(int64_t job, const std::string& order) {
  db_.prepare("UPDATE jobs SET ring_order=?, updated_at=? WHERE id=?")
      .args(order, now_unix(), job)
      .run();
}

void Store::set_slurm_job_id(int64_t job, const std::string& id) {
  db_.prepare("UPDATE jobs SET slurm_job_id=?, updated_at=? WHERE id=?")
      .args(id, now_unix(), job)
      .run();
}

// ---- attempts -------------------------------------------------------------------------------

void Store::begin_attempt(int64_t job, int64_t number, const std::string& reason,
                          int64_t resume_step) {
  db_.prepare(
         "INSERT INTO attempts(job_id, number, reason, resume_step, started_at) "
         "VALUES (?,?,?,?,?)")
      .args(job, number, reason, resume_step, now_unix())
      .run();
}

void Store::end_attempt(int64_t job, int64_t number, const std::string& exit_status) {
  db_.prepare(
         "UPDATE attempts SET ended_at=?, exit_status=? "
         "WHERE job_id=? AND number=? AND ended_at IS NULL")
      .args(now_unix(), exit_status, job, number)
      .run();
}

std::vector<AttemptRow> Store::attempts(int64_t job) {
  std::vector<AttemptRow> out;
  Stmt& s = db_.prepare(
      "SELECT job_id, number, reason, resume_step, started_at, ended_at, exit_status "
      "FROM attempts WHERE job_id=? ORDER BY number");
  s.args(job);
  while (s.step())
    out.push_back({s.i64(0), s.i64(1), s.text(2), s.i64(3), s.f64(4), s.opt_f64(5), s.text(6)});
  return out;
}

// ---- nodes ----------------------------------------------------------------------------------

void Store::upsert_node(const NodeRow& n) {
  db_.prepare(
         "INSERT INTO nodes(name, uid, state, last_heartbeat, registered_at, gpus, topology, "
         "ringd_version) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(uid, name) DO UPDATE SET "
         "state=excluded.state, last_heartbeat=excluded.last_heartbeat, "
         "registered_at=excluded.registered_at, gpus=excluded.gpus, topology=excluded.topology, "
         "ringd_version=excluded.ringd_version")
      .args(n.name, n.uid, n.state, n.last_heartbeat, n.registered_at, n.gpus, n.topology,
            n.ringd_version)
      .run();
}

namespace {
NodeRow read_node(const Stmt& s) {
  return {s.text(0), s.i64(1), s.text(2), s.f64(3), s.f64(4), s.text(5), s.text(6), s.text(7)};
}
constexpr const char* kNodeCols =
    "name, uid, state, last_heartbeat, registered_at, gpus, topology, ringd_version";
}  // namespace

int64_t Store::count_nodes(int64_t uid) {
  Stmt& s = db_.prepare("SELECT count(*) FROM nodes WHERE uid=?");
  s.args(uid);
  int64_t n = s.step() ? s.i64(0) : 0;
  s.reset();
  return n;
}

std::optional<NodeRow> Store::node(int64_t uid, const std::string& name) {
  Stmt& s = db_.prepare(std::string("SELECT ") + kNodeCols + " FROM nodes WHERE uid=? AND name=?");
  s.args(uid, name);
  if (!s.step()) return std::nullopt;
  NodeRow n = read_node(s);
  s.reset();
  return n;
}

std::vector<NodeRow> Store::nodes() {
  std::vector<NodeRow> out;
  Stmt& s = db_.prepare(std::string("SELECT ") + kNodeCols + " FROM nodes ORDER BY name, uid");
  while (s.step()) out.push_back(read_node(s));
  return out;
}

void Store::set_node_state(int64_t uid, const std::string& name, const std::string& state) {
  db_.prepare("UPDATE nodes SET state=? WHERE uid=? AND name=?").args(state, uid, name).run();
}

void Store::touch_node(int64_t uid, const std::string& name, double t) {
  db_.prepare("UPDATE nodes SET last_heartbeat=? WHERE uid=? AND name=?").args(t, uid, name).run();
}

// ---- membership -----------------------------------------------------------------------------

void Store::add_job_node(int64_t job, const std::string& node, int64_t node_uid, int64_t attempt) {
  db_.prepare(
         "INSERT INTO job_nodes(job_id, node, node_uid, attempt, state) VALUES (?,?,?,?,'active') "
         "ON CONFLICT(job_id, node) DO UPDATE SET node_uid=excluded.node_uid, "
         "attempt=excluded.attempt, state='active'")
      .args(job, node, node_uid, attempt)
      .run();
}

void Store::set_job_node_state(int64_t job, const std::string& node, const std::string& state) {
  db_.prepare("UPDATE job_nodes SET state=? WHERE job_id=? AND node=?")
      .args(state, job, node)
      .run();
}

void Store::set_job_nodes_attempt(int64_t job, int64_t attempt) {
  db_.prepare("UPDATE job_nodes SET attempt=? WHERE job_id=?").args(attempt, job).run();
}

std::vector<JobNodeRow> Store::job_nodes(int64_t job) {
  std::vector<JobNodeRow> out;
  Stmt& s = db_.prepare(
      "SELECT job_id, node, attempt, state, node_uid FROM job_nodes WHERE job_id=? ORDER BY node");
  s.args(job);
  while (s.step()) out.push_back({s.i64(0), s.text(1), s.i64(2), s.text(3), s.i64(4)});
  return out;
}

bool Store::add_excluded_node(int64_t job, const std::string& node, int64_t attempt,
                              const std::string& reason) {
  Stmt& s = db_.prepare(
      "INSERT OR IGNORE INTO excluded_nodes(job_id, node, attempt, reason, at) VALUES (?,?,?,?,?)");
  s.args(job, node, attempt, reason, now_unix());
  s.step();
  return db_.changes() > 0;
}

std::vector<ExcludedNodeRow> Store::excluded_nodes(int64_t job) {
  std::vector<ExcludedNodeRow> out;
  Stmt& s = db_.prepare(
      "SELECT node, attempt, reason, at FROM excluded_nodes WHERE job_id=? ORDER BY at, node");
  s.args(job);
  while (s.step()) out.push_back({s.text(0), s.i64(1), s.text(2), s.f64(3)});
  return out;
}

std::optional<JobNodeRow> Store::job_node(int64_t job, const std::string& node) {
  Stmt& s = db_.prepare(
      "SELECT job_id, node, attempt, state, node_uid FROM job_nodes WHERE job_id=? AND node=?");
  s.args(job, node);
  if (!s.step()) return std::nullopt;
  JobNodeRow r{s.i64(0), s.text(1), s.i64(2), s.text(3), s.i64(4)};
  s.reset();
  return r;
}

std::optional<Store::JobBrief> Store::job_brief(int64_t job) {
  Stmt& s = db_.prepare("SELECT state, attempt FROM jobs WHERE id=?");
  s.args(job);
  if (!s.step()) return std::nullopt;
  auto st = job_state_from_string(s.text(0));
  JobBrief b{st.value_or(JobState::kFailed), s.i64(1)};
  s.reset();
  return b;
}

std::vector<int64_t> Store::jobs_of_node(int64_t uid, const std::string& node) {
  std::vector<int64_t> out;
  Stmt& s = db_.prepare("SELECT job_id FROM job_nodes WHERE node_uid=? AND node=? ORDER BY job_id");
  s.args(uid, node);
  while (s.step()) out.push_back(s.i64(0));
  return out;
}

// ---- workers, events, checkpoints, metrics --------------------------------------------------

void Store::upsert_worker(int64_t job, int64_t attempt, const std::string& node, int64_t rank,
                          std::optional<int64_t> pid, const std::string& state,
                          std::optional<int64_t> exit_code, std::optional<int64_t> signal) {
  db_.prepare(
         "INSERT INTO workers(job_id, attempt, node, rank, pid, state, exit_code, signal, "
         "updated_at) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(job_id, attempt, rank) DO UPDATE "
         "SET node=excluded.node, pid=coalesce(excluded.pid, workers.pid), "
         "state=excluded.state, exit_code=excluded.exit_code, signal=excluded.signal, "
         "updated_at=excluded.updated_at")
      .args(job, attempt, node, rank, pid, state, exit_code, signal, now_unix())
      .run();
}

int64_t Store::add_event(std::optional<int64_t> job, int64_t attempt, const std::string& node,
                         const std::string& kind, const json& data) {
  db_.prepare("INSERT INTO events(time, job_id, attempt, node, kind, data) VALUES (?,?,?,?,?,?)")
      .args(now_unix(), job, attempt, node, kind,
            data.dump(-1, ' ', false, json::error_handler_t::replace))
      .run();
  return db_.last_insert_id();
}

protocol::EventRecord Store::read_event(const Stmt& s) {
  protocol::EventRecord e;
  e.id = s.i64(0);
  e.time = s.f64(1);
  e.job = s.opt_i64(2);
  e.attempt = s.i64(3);
  e.node = s.text(4);
  e.kind = s.text(5);
  e.data = json::parse(s.text(6), nullptr, false);
  if (!e.data.is_object()) e.data = json::object();
  return e;
}

std::vector<protocol::EventRecord> Store::events(int64_t job, int64_t after, int64_t limit) {
  std::vector<protocol::EventRecord> out;
  Stmt& s = db_.prepare(
      "SELECT id, time, job_id, attempt, node, kind, data FROM events "
      "WHERE job_id=? AND id>? ORDER BY id LIMIT ?");
  s.args(job, after, limit);
  while (s.step()) out.push_back(read_event(s));
  return out;
}

std::optional<protocol::EventRecord> Store::last_event(int64_t job, const std::string& kind) {
  Stmt& s = db_.prepare(
      "SELECT id, time, job_id, attempt, node, kind, data FROM events "
      "WHERE job_id=? AND kind=? ORDER BY id DESC LIMIT 1");
  s.args(job, kind);
  if (!s.step()) return std::nullopt;
  auto e = read_event(s);
  s.reset();
  return e;
}

void Store::upsert_checkpoint(int64_t job, int64_t step, const std::string& node,
                              const std::string& path, int64_t bytes, bool complete,
                              std::optional<double> seconds, bool superseded) {
  // Written (again): on disk, and of the current lineage unless the caller says it is not,
  // whatever an earlier copy of the step was.
  db_.prepare(
         "INSERT INTO checkpoints(job_id, step, node, path, bytes, complete, created_at, seconds, "
         "superseded) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(job_id, step, node) DO UPDATE SET "
         "path=excluded.path, bytes=excluded.bytes, complete=excluded.complete, "
         "seconds=coalesce(excluded.seconds, seconds), superseded=excluded.superseded, deleted=0")
      .args(job, step, node, path, bytes, int64_t{complete ? 1 : 0}, now_unix(), seconds,
            int64_t{superseded ? 1 : 0})
      .run();
}

std::optional<int64_t> Store::latest_complete_checkpoint(int64_t job, int64_t nodes) {
  Stmt& s = db_.prepare(
      "SELECT step FROM checkpoints WHERE job_id=? AND superseded=0 AND deleted=0 GROUP BY step "
      "HAVING sum(complete)=count(*) AND count(*)>=? ORDER BY step DESC LIMIT 1");
  s.args(job, nodes);
  if (!s.step()) return std::nullopt;
  int64_t v = s.i64(0);
  s.reset();
  return v;
}

Store::CheckpointStep Store::checkpoint_step(int64_t job, int64_t step, int64_t nodes) {
  Stmt& s = db_.prepare(
      "SELECT count(*), coalesce(sum(complete),0), coalesce(max(superseded),0), "
      "coalesce(max(deleted),0) FROM checkpoints WHERE job_id=? AND step=?");
  s.args(job, step);
  CheckpointStep c;
  if (s.step()) {
    const int64_t n = s.i64(0), complete = s.i64(1);
    c.recorded = n > 0;
    c.complete = n > 0 && complete == n && n >= nodes;
    c.superseded = s.i64(2) != 0;
    c.deleted = s.i64(3) != 0;
  }
  s.reset();
  return c;
}

std::vector<int64_t> Store::resumable_steps(int64_t job, int64_t nodes) {
  Stmt& s = db_.prepare(
      "SELECT step FROM checkpoints WHERE job_id=? AND superseded=0 AND deleted=0 GROUP BY step "
      "HAVING sum(complete)=count(*) AND count(*)>=? ORDER BY step");
  s.args(job, nodes);
  std::vector<int64_t> out;
  while (s.step()) out.push_back(s.i64(0));
  return out;
}

void Store::supersede_checkpoints_after(int64_t job, int64_t step) {
  db_.prepare("UPDATE checkpoints SET superseded=1 WHERE job_id=? AND step>?").args(job, step).run();
}

void Store::mark_checkpoints_deleted(int64_t job, const std::vector<int64_t>& steps) {
  for (int64_t st : steps)
    db_.prepare("UPDATE checkpoints SET deleted=1 WHERE job_id=? AND step=?").args(job, st).run();
}

void Store::add_step(const protocol::StepReport& r, double t) {
  db_.prepare(
         "INSERT OR REPLACE INTO step_metrics(job_id, attempt, step, node, loss, tokens_per_s, "
         "step_time_s, comm_time_s, time) VALUES (?,?,?,?,?,?,?,?,?)")
      .args(r.job, r.attempt, r.step, r.node, r.loss, r.tokens_per_s, r.step_time_s, r.comm_time_s,
            t)
      .run();
  for (const auto& k : r.ranks)
    db_.prepare(
           "INSERT OR REPLACE INTO rank_steps(job_id, attempt, step, rank, node, step_time_s, "
           "data_s, compute_s, wait_s, comm_s, hop_bytes, time) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)")
        .args(r.job, r.attempt, r.step, k.rank, r.node, k.step_time_s, k.data_s, k.compute_s,
              k.wait_s, k.comm_s, k.hop_bytes, t)
        .run();
}

const char* const Store::kRankStepColumns =
    "attempt, step, node, rank, step_time_s, data_s, compute_s, wait_s, comm_s, hop_bytes, time";

protocol::RankStepRecord Store::read_rank_step(const Stmt& s) {
  protocol::RankStepRecord r;
  r.attempt = s.i64(0);
  r.step = s.i64(1);
  r.node = s.text(2);
  r.rank.rank = s.i64(3);
  r.rank.step_time_s = s.f64(4);
  r.rank.data_s = s.f64(5);
  r.rank.compute_s = s.f64(6);
  r.rank.wait_s = s.f64(7);
  r.rank.comm_s = s.f64(8);
  r.rank.hop_bytes = s.i64(9);
  r.time = s.f64(10);
  return r;
}

std::vector<protocol::RankStepRecord> Store::rank_steps(int64_t job, int64_t from_step,
                                                        int64_t to_step, int64_t limit) {
  Stmt& s = db_.prepare(std::string("SELECT ") + kRankStepColumns +
                        " FROM rank_steps WHERE job_id=? AND step>=? AND step<=? "
                        "ORDER BY step, attempt, rank LIMIT ?");
  s.args(job, from_step, to_step, limit);
  std::vector<protocol::RankStepRecord> out;
  while (s.step()) out.push_back(read_rank_step(s));
  return out;
}

std::vector<protocol::StepRecord> Store::steps(int64_t job, int64_t after, int64_t limit) {
  Stmt& s = db_.prepare(
      "SELECT attempt, step, node, loss, tokens_per_s, step_time_s, comm_time_s, time "
      "FROM step_metrics WHERE job_id=? AND step>? ORDER BY step, attempt, node LIMIT ?");
  s.args(job, after, limit);
  std::vector<protocol::StepRecord> out;
  while (s.step())
    out.push_back(
        {s.i64(0), s.i64(1), s.text(2), s.f64(3), s.f64(4), s.f64(5), s.f64(6), s.f64(7)});
  return out;
}

int64_t Store::count(const std::string& table) {
  Stmt& s = db_.prepare("SELECT count(*) FROM " + table);
  s.step();
  int64_t n = s.i64(0);
  s.reset();
  return n;
}

}  // namespace ring::coord
