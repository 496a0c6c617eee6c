// ring-coord and Slurm: the slurm_job message records the Slurm job id, a refused
// sbatch fails the pending job, and a start after a requeue ends the killed attempt and begins the
// next one from the latest complete checkpoint; the new allocation's daemons join it.
#include <gtest/gtest.h>

#include "coord_test_util.h"
#include "coordinator/store.h"

using namespace ring::coord;
using namespace ring::coord::test;

namespace {

proto::SlurmJobRequest slurm(int64_t job, const std::string& event, const std::string& id,
                             int64_t restarts = 0, const std::string& nodes = "") {
  proto::SlurmJobRequest r;
  r.job = job;
  r.event = event;
  r.slurm_job_id = id;
  r.restarts = restarts;
  r.nodes = nodes;
  return r;
}

bool has_kind(const std::vector<proto::EventRecord>& ev, const std::string& k) {
  for (const auto& e : ev)
    if (e.kind == k) return true;
  return false;
}

}  // namespace

TEST(CoordSlurm, MessageRoundTripAndValidation) {
  auto r = slurm(3, "started", "1234_5", 2, "node[1-2]");
  auto m = proto::parse(proto::encode(r));
  auto* back = std::get_if<proto::SlurmJobRequest>(&m);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->slurm_job_id, "1234_5");
  EXPECT_EQ(back->restarts, 2);
  EXPECT_EQ(back->nodes, "node[1-2]");
  try {
    proto::parse(R"({"v":1,"type":"slurm_job","id":1,"job":3,"event":"started","slurm_job_id":"12;rm"})");
    ADD_FAILURE() << "accepted a bad Slurm job id";
  } catch (const proto::ProtocolError& e) {
    EXPECT_EQ(e.field(), "slurm_job.slurm_job_id");
    EXPECT_NE(std::string(e.what()).find("is not a Slurm job id"), std::string::npos) << e.what();
  }
  EXPECT_THROW(proto::parse(R"({"v":1,"type":"slurm_job","id":1,"job":3,"event":"exploded","slurm_job_id":"1"})"),
               proto::ProtocolError);
}

TEST(CoordSlurm, RequeuedStartBeginsTheNextAttemptFromTheLatestCheckpoint) {
  InProcessCoordinator coord;
  auto client = coord.client();
  int64_t job = client.submit(test_spec(2, 3, 1, 8)).job;
  auto ok = client.slurm_job(slurm(job, "submitted", "501"));
  EXPECT_EQ(ok.state, "pending");
  EXPECT_EQ(client.status(job).slurm_job_id, "501");
  // The batch script starts (first time): nothing changes until the daemons join.
  client.slurm_job(slurm(job, "started", "501", 0, "node[1-2]"));
  EXPECT_EQ(client.status(job).state, "pending");

  SimDaemon a(coord.endpoint(), "node1"), b(coord.endpoint(), "node2");
  EXPECT_EQ(a.register_jobs({{job, 0, 0}}).jobs.at(0).attempt, 1);
  EXPECT_EQ(b.register_jobs({{job, 0, 0}}).jobs.at(0).attempt, 1);
  for (int s = 1; s <= 4; ++s) a.step(job, 1, s);
  a.checkpoint(job, 1, 2);
  b.checkpoint(job, 1, 2);
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "running"; }));
  ASSERT_TRUE(wait_for([&] { return client.status(job).last_checkpoint_step == 2; }));

  // Slurm requeued the job (node failure, preemption, `ringctl restart`); it starts on node1 and
  // node3.
  ok = client.slurm_job(slurm(job, "started", "501", 1, "node[1,3]"));
  EXPECT_EQ(ok.state, "starting");
  EXPECT_EQ(ok.message, "attempt 2 from step 2");
  auto st = client.status(job);
  EXPECT_EQ(st.attempt, 2);
  EXPECT_NE(st.state_reason.find("Slurm requeue 1 of job 501 on node[1,3]"), std::string::npos)
      << st.state_reason;
  {
    Store db(coord.dir() + "/state/coord.db", {false, 0});
    auto at = db.attempts(job);
    ASSERT_EQ(at.size(), 2u);
    EXPECT_EQ(at[0].exit_status, "Slurm requeue 1 of job 501 on node[1,3]");
    EXPECT_EQ(at[1].number, 2);
    EXPECT_EQ(at[1].resume_step, 2);
  }
  // The new allocation's daemons join attempt 2 and resume at step 2.
  SimDaemon a2(coord.endpoint(), "node1"), c(coord.endpoint(), "node3");
  auto ra = a2.register_jobs({{job, 0, 0}});
  auto rc = c.register_jobs({{job, 0, 0}});
  EXPECT_EQ(ra.jobs.at(0).attempt, 2);
  EXPECT_EQ(rc.jobs.at(0).attempt, 2);
  EXPECT_EQ(rc.jobs.at(0).resume_step, 2);
  a2.step(job, 2, 3);
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "running"; }));
  auto ev = client.events(job, 0, 1000);
  EXPECT_TRUE(has_kind(ev, "slurm_submitted"));
  EXPECT_TRUE(has_kind(ev, "slurm_started"));
  // submit_failed is only for a pending job.
  try {
    client.slurm_job(slurm(job, "submit_failed", "", 0));
    ADD_FAILURE() << "a running job failed to submit";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "invalid_state");
  }
}

TEST(CoordSlurm, RefusedSbatchFailsThePendingJob) {
  InProcessCoordinator coord;
  auto client = coord.client();
  int64_t job = client.submit(test_spec(1, 3, 1, 8)).job;
  auto r = slurm(job, "submit_failed", "");
  r.message = "sbatch: error: invalid partition specified: nope";
  EXPECT_EQ(client.slurm_job(r).state, "failed");
  auto st = client.status(job);
  EXPECT_EQ(st.state, "failed");
  EXPECT_NE(st.state_reason.find("invalid partition specified: nope"), std::string::npos);
  try {
    client.slurm_job(slurm(job + 100, "submitted", "7"));
    ADD_FAILURE() << "unknown job accepted";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "not_found");
  }
}

// `ringctl restart` of a Slurm job tells ring-coord before it runs scontrol requeue: the attempt
// ends at once, so a worker that dies on a peer Slurm stopped a moment earlier (its own ringd's
// SIGTERM not yet arrived) is not a failure, even with no restarts left (a generate job has
// none); the timers wait for Slurm's next start, which begins the next attempt.
TEST(CoordSlurm, RequeueRequestEndsTheAttemptBeforeSlurmStopsIt) {
  InProcessCoordinator coord;
  auto client = coord.client();
  int64_t job = client.submit(test_spec(2, /*max_restarts=*/0, 0.1, 0.1)).job;
  // Only a job Slurm runs can be requeued.
  try {
    client.requeue(job);
    ADD_FAILURE() << "requeue of a job without a Slurm id";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "bad_field");
    EXPECT_NE(std::string(e.what()).find("was not submitted to Slurm"), std::string::npos)
        << e.what();
  }
  client.slurm_job(slurm(job, "submitted", "601"));
  client.slurm_job(slurm(job, "started", "601", 0, "node[1-2]"));
  SimDaemon a(coord.endpoint(), "node1"), b(coord.endpoint(), "node2");
  a.register_jobs({{job, 0, 0}});
  b.register_jobs({{job, 0, 0}});
  for (int s = 1; s <= 3; ++s) a.step(job, 1, s);
  a.checkpoint(job, 1, 2);
  b.checkpoint(job, 1, 2);
  ASSERT_TRUE(wait_for([&] { return client.status(job).last_checkpoint_step == 2; }));
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "running"; }));

  auto ok = client.requeue(job);
  EXPECT_EQ(ok.state, "restarting");
  EXPECT_NE(ok.message.find("requeue requested by"), std::string::npos) << ok.message;
  // node2's worker fails on its stopped peer before node2's ringd hears of the requeue.
  proto::Event died;
  died.kind = proto::EventKind::kWorkerDied;
  died.job = job;
  died.attempt = 1;
  died.rank = 1;
  died.exit_code = 1;
  b.event(died);
  ASSERT_TRUE(wait_for([&] {
    for (const auto& e : client.events(job, 0, 1000))
      if (e.kind == "worker_died") return true;
    return false;
  }));
  // Still waiting for Slurm, not failed and not restarted in place. The witness that the timers
  // have run past the backoff since: a local job failed after this point (same backoff) is
  // restarted, and the timers start every due restart in one pass.
  int64_t witness = client.submit(test_spec(1, /*max_restarts=*/1, 0.1, 0.1)).job;
  SimDaemon w(coord.endpoint(), "node9");
  w.register_jobs({{witness, 0, 0}});
  proto::Event wdied = died;
  wdied.job = witness;
  wdied.rank = 0;
  w.event(wdied);
  ASSERT_TRUE(wait_for([&] { return client.status(witness).attempt == 2; }, 30s));
  auto st = client.status(job);
  EXPECT_EQ(st.state, "restarting") << st.state_reason;
  EXPECT_EQ(st.attempt, 1);
  // Slurm starts the job again: attempt 2 from the checkpoint.
  ok = client.slurm_job(slurm(job, "started", "601", 1, "node[1-2]"));
  EXPECT_EQ(ok.state, "starting");
  EXPECT_EQ(ok.message, "attempt 2 from step 2");
  {
    Store db(coord.dir() + "/state/coord.db", {false, 0});
    auto at = db.attempts(job);
    ASSERT_EQ(at.size(), 2u);
    EXPECT_NE(at[0].exit_status.find("requeue requested by"), std::string::npos)
        << at[0].exit_status;
  }
  // A requeue resumes from the latest checkpoint: a step is refused.
  try {
    client.call(proto::RestartRequest{0, job, 1, true});
    ADD_FAILURE() << "requeue with from_step accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("from_step"), std::string::npos) << e.what();
  }
}
