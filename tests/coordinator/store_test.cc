// The job state machine (exhaustively) and the SQLite schema with its migrations.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "coordinator/job_state.h"
#include "coordinator/store.h"

namespace coord = ring::coord;
using coord::JobState;

namespace {

std::string temp_dir() {
  char t[] = "/tmp/ring-store-test-XXXXXX";
  EXPECT_NE(mkdtemp(t), nullptr);
  return t;
}

// The transitions the design allows, written out independently of the table in job_state.cc.
const std::set<std::pair<std::string, std::string>> kExpected = {
    {"pending", "starting"},      {"pending", "cancelled"},     {"pending", "failed"},
    {"starting", "running"},      {"starting", "restarting"},   {"starting", "failed"},
    {"starting", "completing"},   {"starting", "cancelling"},   {"starting", "pending"},
    {"running", "completing"},    {"running", "restarting"},    {"running", "failed"},
    {"running", "cancelling"},    {"running", "pending"},       {"restarting", "starting"},
    {"restarting", "failed"},     {"restarting", "cancelling"}, {"restarting", "pending"},
    {"completing", "completed"},  {"completing", "restarting"}, {"completing", "failed"},
    {"completing", "cancelling"}, {"cancelling", "cancelled"},  {"failed", "restarting"},
    // Every node stopped on its own stop signal (resumable); its owner restarts it, or Slurm
    // requeues it.
    {"starting", "stopped"},      {"running", "stopped"},       {"restarting", "stopped"},
    {"completing", "stopped"},    {"stopped", "restarting"},    {"stopped", "pending"},
};

coord::JobRow sample_job() {
  coord::JobRow j;
  j.name = "tiny";
  j.owner_uid = 1000;
  j.owner_user = "alice";
  j.spec = "job:\n  name: tiny\n";
  j.spec_hash = coord::sha256_hex(j.spec);
  j.nodes = 2;
  j.total_steps = 100;
  j.max_restarts = 3;
  j.backoff_s = 1;
  j.backoff_max_s = 8;
  return j;
}

}  // namespace

TEST(JobStateMachine, EveryPairIsAllowedOrRefusedAsDesigned) {
  int allowed = 0, refused = 0;
  for (JobState from : coord::kAllJobStates) {
    for (JobState to : coord::kAllJobStates) {
      bool want = kExpected.count({coord::to_string(from), coord::to_string(to)}) > 0;
      EXPECT_EQ(coord::transition_allowed(from, to), want)
          << coord::to_string(from) << " -> " << coord::to_string(to);
      if (want) {
        EXPECT_NO_THROW(coord::check_transition(from, to));
        ++allowed;
      } else {
        try {
          coord::check_transition(from, to, "job 7");
          ADD_FAILURE() << "allowed " << coord::to_string(from) << " -> " << coord::to_string(to);
        } catch (const coord::InvalidTransition& e) {
          std::string msg = e.what();
          EXPECT_NE(msg.find(std::string("job 7: cannot go from ") + coord::to_string(from) +
                             " to " + coord::to_string(to)),
                    std::string::npos)
              << msg;
          EXPECT_EQ(e.from(), from);
          EXPECT_EQ(e.to(), to);
          ++refused;
        }
      }
    }
  }
  EXPECT_EQ(allowed, static_cast<int>(kExpected.size()));
  EXPECT_EQ(allowed + refused, 100);  // 10 states
}

TEST(JobStateMachine, TerminalStates) {
  EXPECT_TRUE(coord::is_terminal(JobState::kCompleted));
  EXPECT_TRUE(coord::is_terminal(JobState::kFailed));
  EXPECT_TRUE(coord::is_terminal(JobState::kCancelled));
  EXPECT_TRUE(coord::is_terminal(JobState::kStopped));
  EXPECT_FALSE(coord::is_active(JobState::kStopped));
  EXPECT_TRUE(coord::allowed_from(JobState::kCompleted).empty());
  EXPECT_TRUE(coord::allowed_from(JobState::kCancelled).empty());
  try {
    coord::check_transition(JobState::kCompleted, JobState::kRunning, "job 3");
  } catch (const coord::InvalidTransition& e) {
    EXPECT_STREQ(e.what(),
                 "job 3: cannot go from completed to running (allowed from completed: none, it "
                 "is final)");
  }
  for (JobState s : coord::kAllJobStates)
    EXPECT_EQ(coord::job_state_from_string(coord::to_string(s)), s);
  EXPECT_FALSE(coord::job_state_from_string("exploded"));
}

// Every allowed transition through the Store, which records it as an event; every refused one
// leaves the row untouched.
TEST(Store, SetStateGoesThroughTheTable) {
  std::string dir = temp_dir();
  coord::Store st(dir + "/coord.db", {});
  for (JobState from : coord::kAllJobStates) {
    for (JobState to : coord::kAllJobStates) {
      coord::JobRow j = sample_job();
      j.state = from;
      int64_t id = st.insert_job(j);
      if (coord::transition_allowed(from, to)) {
        st.set_state(id, to, "test");
        EXPECT_EQ(st.job(id)->state, to);
        auto ev = st.events(id, 0, 10);
        ASSERT_EQ(ev.size(), 2u);  // submitted, state
        EXPECT_EQ(ev[1].kind, "state");
        EXPECT_EQ(ev[1].data["from"], coord::to_string(from));
        EXPECT_EQ(ev[1].data["to"], coord::to_string(to));
      } else {
        EXPECT_THROW(st.set_state(id, to, "test"), coord::InvalidTransition);
        EXPECT_EQ(st.job(id)->state, from);
      }
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Store, PragmasAndSchema) {
  std::string dir = temp_dir();
  coord::Store st(dir + "/coord.db", {});
  EXPECT_EQ(st.schema_version(), coord::Store::latest_schema_version());
  auto& s = st.db().prepare("PRAGMA journal_mode");
  ASSERT_TRUE(s.step());
  EXPECT_EQ(s.text(0), "wal");
  s.reset();
  auto& fk = st.db().prepare("PRAGMA foreign_keys");
  ASSERT_TRUE(fk.step());
  EXPECT_EQ(fk.i64(0), 1);
  fk.reset();
  // Foreign keys are enforced.
  EXPECT_THROW(st.begin_attempt(12345, 1, "x", 0), coord::DbError);
  // The state CHECK constraint holds even for raw SQL.
  EXPECT_THROW(st.db().exec("INSERT INTO jobs(name, owner_uid, owner_user, spec, spec_hash, "
                            "state, created_at, updated_at, nodes, total_steps, max_restarts, "
                            "backoff_s, backoff_max_s) VALUES ('x',0,'r','s','h','exploded',0,0,"
                            "1,1,0,0,0)"),
               coord::DbError);
  std::filesystem::remove_all(dir);
}

TEST(Store, MigratesV1ToLatestKeepingData) {
  std::string dir = temp_dir();
  std::string path = dir + "/coord.db";
  int64_t id;
  {
    coord::Store v1(path, {true, 1});
    EXPECT_EQ(v1.schema_version(), 1);
    id = v1.insert_job(sample_job());
    v1.begin_attempt(id, 1, "first start", 0);
    // A v1 node (keyed by name alone) and its membership: v4 keys nodes by (uid, name).
    v1.db().exec(
        "INSERT INTO nodes VALUES ('n0', 1000, 'up', 1, 1, '[]', '{}', 'x');"
        "INSERT INTO job_nodes VALUES (" +
        std::to_string(id) + ", 'n0', 1, 'active');");
    // v2's columns do not exist yet.
    EXPECT_THROW(v1.db().exec("SELECT restart_at FROM jobs"), coord::DbError);
  }
  {
    coord::Store latest(path, {});
    EXPECT_EQ(latest.schema_version(), coord::Store::latest_schema_version());
    auto j = latest.job(id);
    ASSERT_TRUE(j);
    EXPECT_EQ(j->name, "tiny");
    EXPECT_FALSE(j->restart_at);
    latest.set_restart(id, 123.0, 40);
    EXPECT_EQ(*latest.job(id)->restart_at, 123.0);
    EXPECT_EQ(*latest.job(id)->restart_step, 40);
    EXPECT_EQ(latest.attempts(id).size(), 1u);
    auto& s =
        latest.db().prepare("SELECT version, description FROM schema_version ORDER BY version");
    std::vector<int64_t> versions;
    while (s.step()) versions.push_back(s.i64(0));
    EXPECT_EQ(versions, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
    // v9: excluded nodes, one row per node, the first record kept.
    EXPECT_TRUE(latest.excluded_nodes(id).empty());
    EXPECT_TRUE(latest.add_excluded_node(id, "node2", 1, "down"));
    EXPECT_FALSE(latest.add_excluded_node(id, "node2", 2, "down again"));
    ASSERT_EQ(latest.excluded_nodes(id).size(), 1u);
    EXPECT_EQ(latest.excluded_nodes(id)[0].attempt, 1);
    // v8: the jobs table rebuilt for the state 'stopped', its rows and references kept.
    latest.set_state(id, coord::JobState::kStarting, "node n0 joined");
    latest.set_state(id, coord::JobState::kStopped, "stopped by a stop signal at step 3");
    EXPECT_EQ(latest.job(id)->state, coord::JobState::kStopped);
    EXPECT_EQ(latest.attempts(id).size(), 1u);
    EXPECT_EQ(latest.job(id)->job_dir, "");  // v3 column, default for old rows
    // v4: the node kept its row under (uid, name), the member knows its node's uid, and the
    // same name under another uid is another node.
    ASSERT_TRUE(latest.node(1000, "n0"));
    EXPECT_FALSE(latest.node(65534, "n0"));
    auto jn = latest.job_nodes(id);
    ASSERT_EQ(jn.size(), 1u);
    EXPECT_EQ(jn[0].node_uid, 1000);
    EXPECT_EQ(jn[0].state, "active");
    EXPECT_EQ(latest.jobs_of_node(1000, "n0"), std::vector<int64_t>{id});
    EXPECT_TRUE(latest.jobs_of_node(65534, "n0").empty());
    latest.upsert_node({"n0", 65534, "up", 2, 2, "[]", "{}", "y"});
    EXPECT_EQ(latest.nodes().size(), 2u);
    EXPECT_EQ(latest.node(1000, "n0")->ringd_version, "x");
    // A member must name an existing (uid, name).
    EXPECT_THROW(latest.add_job_node(id, "n1", 1000, 1), coord::DbError);
  }
  // Reopening does not re-apply anything.
  {
    coord::Store again(path, {});
    EXPECT_EQ(again.schema_version(), coord::Store::latest_schema_version());
  }
  std::filesystem::remove_all(dir);
}

TEST(Store, RefusesANewerSchema) {
  std::string dir = temp_dir();
  std::string path = dir + "/coord.db";
  {
    coord::Store st(path, {});
    st.db().exec("INSERT INTO schema_version VALUES (99, 0, 'from the future')");
  }
  try {
    coord::Store st(path, {});
    FAIL() << "opened a newer schema";
  } catch (const coord::DbError& e) {
    EXPECT_NE(std::string(e.what()).find("newer than this ring-coord"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(Store, CheckpointsCompleteOnlyWhenEveryNodeIs) {
  std::string dir = temp_dir();
  coord::Store st(dir + "/coord.db", {});
  int64_t id = st.insert_job(sample_job());
  st.upsert_node({"n0", 0, "up", 0, 0, "[]", "{}", "x"});
  st.upsert_checkpoint(id, 10, "n0", "/c/10", 100, true);
  EXPECT_FALSE(st.latest_complete_checkpoint(id, 2));  // one of two nodes
  st.upsert_checkpoint(id, 10, "n1", "/c/10", 100, true);
  EXPECT_EQ(st.latest_complete_checkpoint(id, 2), 10);
  st.upsert_checkpoint(id, 20, "n0", "/c/20", 100, true);
  st.upsert_checkpoint(id, 20, "n1", "/c/20", 100, false);
  EXPECT_EQ(st.latest_complete_checkpoint(id, 2), 10);
  st.upsert_checkpoint(id, 20, "n1", "/c/20", 100, true);
  EXPECT_EQ(st.latest_complete_checkpoint(id, 2), 20);
  std::filesystem::remove_all(dir);
}

TEST(Store, Sha256) {
  EXPECT_EQ(coord::sha256_hex("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// ringctl reads a stopped coordinator's database read-only (cli/local_state.h): nothing is
// created or written, steps come back as recorded, and a schema other than this build's is
// refused naming both versions.
TEST(Store, ReadOnlyReadsAndNeverWrites) {
  std::string dir = temp_dir();
  std::string path = dir + "/coord.db";
  EXPECT_THROW(coord::Store(path, {.read_only = true}), coord::DbError);  // not created
  EXPECT_FALSE(std::filesystem::exists(path));
  int64_t id = 0;
  {
    coord::Store st(path, {});
    id = st.insert_job(sample_job());
    ring::protocol::StepReport r{"n0", id, 1, 2, 0.30000000000000004, 10, 0.5, 0.1, {}};
    r.ranks = {{3, 0.5, 0.01, 0.3, 0.15, 0.04, 4096}, {2, 0.49, 0.02, 0.2, 0.25, 0.02, 1024}};
    st.add_step(r, 100);
    r.step = 1;
    r.ranks.clear();
    st.add_step(r, 99);
  }
  coord::Store ro(path, {.read_only = true});
  ASSERT_TRUE(ro.job(id));
  auto steps = ro.steps(id, 0, 10);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 1);  // by step
  EXPECT_EQ(steps[1].loss, 0.30000000000000004);
  EXPECT_EQ(ro.steps(id, 1, 10).size(), 1u);
  // Each rank's share of step 2, by rank; step 1's report had none.
  auto ranks = ro.rank_steps(id, 0, 10, 100);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0].rank.rank, 2);
  EXPECT_EQ(ranks[0].step, 2);
  EXPECT_EQ(ranks[0].node, "n0");
  EXPECT_EQ(ranks[0].rank.wait_s, 0.25);
  EXPECT_EQ(ranks[1].rank.hop_bytes, 4096);
  EXPECT_EQ(ranks[1].rank.compute_s, 0.3);
  EXPECT_TRUE(ro.rank_steps(id, 3, 10, 100).empty());
  EXPECT_EQ(ro.rank_steps(id, 0, 10, 1).size(), 1u);
  EXPECT_THROW(ro.insert_job(sample_job()), coord::DbError);
  EXPECT_EQ(ro.jobs().size(), 1u);
  { coord::Store old(dir + "/old.db", {.target_version = 1}); }
  try {
    coord::Store st(dir + "/old.db", {.read_only = true});
    FAIL() << "read a schema of another version";
  } catch (const coord::DbError& e) {
    EXPECT_NE(std::string(e.what()).find("has schema version 1; this build reads version"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}
