// The parts of ring-coord, each alone and without sockets (coordinator/engine.h): client requests
// (ownership, replies), daemon messages (register joins a job, steps are batched, a connection
// speaks for one node), timers (a silent node is lost and its attempt fails; batched steps are
// written) and authentication (ZAP decisions).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zmq.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>

#include "coord_test_util.h"
#include "coordinator/auth.h"
#include "coordinator/client_requests.h"
#include "coordinator/daemon_messages.h"
#include "coordinator/engine.h"
#include "coordinator/timers.h"

using namespace ring::coord;
using namespace ring::coord::test;

namespace {

// One Engine over a fresh Store; what the parts send is parsed back into `sent`.
struct Parts {
  std::string dir = make_temp_dir("parts");
  CoordinatorOptions opts;
  std::unique_ptr<Store> store;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<DaemonMessages> daemons;
  std::unique_ptr<ClientRequests> requests;
  std::unique_ptr<Timers> timers;
  std::vector<std::pair<std::string, proto::Message>> sent;

  explicit Parts(double heartbeat_timeout_s = 10) {
    opts.heartbeat_interval_s = 0.05;
    opts.heartbeat_timeout_s = heartbeat_timeout_s;
    opts.synchronous_full = false;
    store = std::make_unique<Store>(dir + "/coord.db", Store::Options{false, 0});
    engine = std::make_unique<Engine>(opts, *store);
    engine->send = [this](const std::string& peer, const std::string& payload) {
      sent.emplace_back(peer, proto::parse(payload));
    };
    daemons = std::make_unique<DaemonMessages>(*engine);
    requests = std::make_unique<ClientRequests>(*engine);
    timers = std::make_unique<Timers>(*engine);
  }
  ~Parts() { std::filesystem::remove_all(dir); }

  // One message as the coordinator handles it: in a transaction, sent after the commit.
  template <typename Part, typename M>
  void handle(Part& part, const std::string& peer, uint32_t uid, const M& m) {
    engine->outbox.clear();
    Txn t(store->db());
    part.on(peer, uid, m);
    t.commit();
    engine->flush_outbox();
  }
  template <typename T>
  T last() {
    EXPECT_FALSE(sent.empty());
    auto* m = std::get_if<T>(&sent.back().second);
    EXPECT_NE(m, nullptr) << proto::type_name(sent.back().second);
    return m ? *m : T{};
  }
  int64_t submit(uint32_t uid, int max_restarts = 0) {
    handle(*requests, "client", uid,
           proto::SubmitRequest{1, test_spec(1, max_restarts, 1, 1), "", dir + "/job", 3});
    return last<proto::SubmitReply>().job;
  }
  proto::Registered register_node(const std::string& peer, uint32_t uid, const std::string& node,
                                  int64_t job) {
    auto r = SimDaemon::make_reg(node);
    r.jobs = {{job, 0, 0}};
    handle(*daemons, peer, uid, r);
    return last<proto::Registered>();
  }
};

}  // namespace

TEST(CoordParts, ClientRequestsSubmitAndOnlyTheOwnerCancels) {
  Parts p;
  int64_t job = p.submit(1000);
  EXPECT_EQ(job, 1);
  EXPECT_EQ(p.last<proto::SubmitReply>().state, "pending");
  EXPECT_EQ(p.store->job(job)->owner_uid, 1000);
  try {
    p.handle(*p.requests, "client", 1001, proto::CancelRequest{2, job});
    FAIL() << "another user cancelled the job";
  } catch (const Refused& e) {
    EXPECT_EQ(e.code, proto::code::kPermissionDenied);
    EXPECT_NE(std::string(e.what()).find("may not cancel it"), std::string::npos) << e.what();
  }
  EXPECT_EQ(to_string(p.store->job(job)->state), std::string("pending"));
  p.handle(*p.requests, "client", 1000, proto::CancelRequest{3, job});
  EXPECT_EQ(p.last<proto::OkReply>().state, "cancelled");
  EXPECT_EQ(p.last<proto::OkReply>().id, 3);
  // Reads through coordinator/queries.h: the job as recorded.
  p.handle(*p.requests, "client", 1001, proto::StatusRequest{4, job});
  EXPECT_EQ(p.last<proto::StatusReply>().jobs.at(0).state, "cancelled");
  EXPECT_THROW(p.handle(*p.requests, "client", 1000, proto::EventsRequest{5, 99, 0, 10}), Refused);
}

TEST(CoordParts, DaemonMessagesJoinBatchAndBindOneNodePerConnection) {
  Parts p;
  int64_t job = p.submit(1000);
  auto reg = p.register_node("peer-a", 1000, "n0", job);
  ASSERT_EQ(reg.jobs.size(), 1u);
  EXPECT_EQ(reg.jobs[0].attempt, 1);
  EXPECT_EQ(reg.jobs[0].state, "starting");
  EXPECT_EQ(p.sent.back().first, "peer-a");

  p.handle(*p.daemons, "peer-a", 1000, proto::StepReport{"n0", job, 1, 1, 2.5, 100, 0.1, 0.01, {}});
  EXPECT_EQ(to_string(p.store->job(job)->state), std::string("running"));
  EXPECT_EQ(p.engine->step_buf.size(), 1u);  // batched, not yet written
  EXPECT_TRUE(p.store->steps(job, 0, 10).empty());
  p.timers->flush_metrics();
  auto rows = p.store->steps(job, 0, 10);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].loss, 2.5);

  // The connection registered as n0 cannot speak for n1; an unknown node must register first.
  try {
    p.handle(*p.daemons, "peer-a", 1000, proto::Heartbeat{"n1", 1, {}});
    FAIL();
  } catch (const Refused& e) {
    EXPECT_EQ(e.code, proto::code::kWrongPeer);
  }
  try {
    p.handle(*p.daemons, "peer-b", 1001, proto::Heartbeat{"n0", 1, {}});
    FAIL();
  } catch (const Refused& e) {
    EXPECT_EQ(e.code, proto::code::kNotRegistered);
  }
  // Another uid's daemon may not serve the job.
  auto other = p.register_node("peer-c", 1001, "n9", job);
  EXPECT_TRUE(other.jobs.empty());
}

TEST(CoordParts, TimersLoseASilentNodeAndFailItsAttempt) {
  Parts p(/*heartbeat_timeout_s=*/0.2);
  int64_t job = p.submit(1000, /*max_restarts=*/0);
  p.register_node("peer-a", 1000, "n0", job);
  EXPECT_TRUE(wait_for(
      [&] {
        p.timers->tick();
        auto n = p.store->node(1000, "n0");
        return n && n->state == "lost";
      },
      30s));
  auto j = p.store->job(job);
  EXPECT_EQ(to_string(j->state), std::string("failed"));
  EXPECT_NE(j->state_reason.find("node n0 lost"), std::string::npos) << j->state_reason;
  bool lost_event = false;
  for (const auto& e : p.store->events(job, 0, 100)) lost_event |= e.kind == "node_lost";
  EXPECT_TRUE(lost_event);
}

// Issue 31, point 16: after a node failure, a Slurm job's next allocations never hold that node
// again. At the requeued start, the previous allocation's nodes Slurm holds unfit whose ringd
// never stopped on its own are recorded (node_excluded) and shown in status; a later start that
// lands on one begins no attempt, the reply tells the batch script to start no ringd, and
// ring-coord asks Slurm to requeue the job with the node in its ExcNodeList. A node that stopped
// on its own (a preemption, a drain) is not excluded.
TEST(CoordParts, ASlurmJobIsRequeuedWithoutTheNodeThatFailedIt) {
  Parts p;
  std::mutex mu;
  std::vector<std::pair<std::string, std::vector<std::string>>> asked;
  p.engine->slurm_actions = std::make_unique<SlurmActions>([&](const SlurmActions::Action& a) {
    std::lock_guard lk(mu);
    asked.emplace_back(a.slurm_job_id, a.exclude);
    return std::string("node2");
  });
  p.handle(*p.requests, "client", 1000,
           proto::SubmitRequest{1, test_spec(2, /*max_restarts=*/3, 1, 1), "", p.dir + "/job", 3});
  int64_t job = p.last<proto::SubmitReply>().job;
  auto slurm = [&](int64_t restarts, const std::string& nodes,
                   std::vector<std::string> unhealthy = {}) {
    proto::SlurmJobRequest r;
    r.id = 9;
    r.job = job;
    r.event = restarts < 0 ? "submitted" : "started";
    r.slurm_job_id = "501";
    r.restarts = std::max<int64_t>(restarts, 0);
    r.nodes = nodes;
    r.unhealthy_nodes = std::move(unhealthy);
    p.handle(*p.requests, "client", 1000, r);
    return p.last<proto::OkReply>();
  };
  auto stopped = [&](const std::string& peer, const std::string& node, int64_t attempt) {
    proto::Event e;
    e.node = node;
    e.kind = proto::EventKind::kJobStopped;
    e.job = job;
    e.attempt = attempt;
    p.handle(*p.daemons, peer, 1000, e);
  };
  slurm(-1, "");
  EXPECT_TRUE(slurm(0, "node[1-2]").requeue_without.empty());
  const std::string n1 = "node1-j" + std::to_string(job) + "-n0";
  const std::string n2 = "node2-j" + std::to_string(job) + "-n1";
  const std::string n3 = "node3-j" + std::to_string(job) + "-n1";
  EXPECT_EQ(p.register_node("peer-1", 1000, n1, job).jobs.size(), 1u);
  EXPECT_EQ(p.register_node("peer-2", 1000, n2, job).jobs.size(), 1u);
  ASSERT_EQ(p.store->job(job)->attempt, 1);

  // node2 dies; Slurm marks it down and requeues the job; node1's ringd stops on Slurm's SIGTERM.
  // The next start is on node[1,3]; Slurm holds node2 (and an unrelated node9) unfit.
  stopped("peer-1", n1, 1);
  auto ok = slurm(1, "node[1,3]", {"node2", "node9"});
  EXPECT_TRUE(ok.requeue_without.empty());
  EXPECT_EQ(ok.state, "starting");
  EXPECT_EQ(p.store->job(job)->attempt, 2);
  auto ex = p.store->excluded_nodes(job);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].node, "node2");
  EXPECT_EQ(ex[0].attempt, 1);
  EXPECT_NE(ex[0].reason.find("Slurm requeue 1 of job 501 with node node2 down"),
            std::string::npos)
      << ex[0].reason;
  bool excluded_event = false;
  for (const auto& e : p.store->events(job, 0, 100))
    if (e.kind == "node_excluded") excluded_event = e.data.value("host", "") == "node2";
  EXPECT_TRUE(excluded_event);
  p.handle(*p.requests, "client", 1000, proto::StatusRequest{1, job});
  EXPECT_EQ(p.last<proto::StatusReply>().jobs.at(0).excluded_nodes,
            std::vector<std::string>{"node2"});

  // node2 is back; a later requeue (a preemption) places the job on node[1-2]: no attempt begins,
  // the batch script is told to start no ringd, and ring-coord asks for a requeue without it.
  ok = slurm(2, "node[1-2]");
  EXPECT_EQ(ok.requeue_without, std::vector<std::string>{"node2"});
  EXPECT_EQ(ok.state, "restarting");
  EXPECT_NE(ok.message.find("excluded node2"), std::string::npos) << ok.message;
  EXPECT_EQ(p.store->job(job)->attempt, 2);
  ASSERT_TRUE(wait_for([&] {
    p.timers->tick();
    for (const auto& e : p.store->events(job, 0, 100))
      if (e.kind == "slurm_requeued_excluding") return e.data.value("exclude", "") == "node2";
    return false;
  }));
  {
    std::lock_guard lk(mu);
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_EQ(asked[0].first, "501");
    EXPECT_EQ(asked[0].second, std::vector<std::string>{"node2"});
  }
  // The start Slurm makes without it begins attempt 3.
  ok = slurm(3, "node[1,3]");
  EXPECT_TRUE(ok.requeue_without.empty());
  EXPECT_EQ(ok.state, "starting");
  EXPECT_EQ(p.store->job(job)->attempt, 3);

  // A preemption while node3 is being drained: both ringd stop on their own; nothing is excluded.
  p.register_node("peer-1", 1000, n1, job);
  p.register_node("peer-3", 1000, n3, job);
  stopped("peer-1", n1, 3);
  stopped("peer-3", n3, 3);
  ok = slurm(4, "node[1,4]", {"node3"});
  EXPECT_TRUE(ok.requeue_without.empty());
  ASSERT_EQ(p.store->excluded_nodes(job).size(), 1u);
  // A malformed node list is refused, naming the field.
  try {
    slurm(5, "node[1-");
    FAIL() << "a malformed hostlist was accepted";
  } catch (const Refused& e) {
    EXPECT_EQ(e.field, "nodes");
  }
}

// Issue 31, point 10: one uid may hold at most kMaxNodesPerUid node rows. At the cap a new name
// is refused naming the field; a known name registers again; another uid is not affected.
TEST(CoordParts, NodeRowsPerUidAreBounded) {
  Parts p;
  {
    Txn t(p.store->db());
    for (int64_t i = 0; i < Engine::kMaxNodesPerUid; ++i)
      p.store->upsert_node({"n" + std::to_string(i), 1000, "lost", 1, 1, "[]", "{}", "sim"});
    t.commit();
  }
  ASSERT_EQ(p.store->count_nodes(1000), Engine::kMaxNodesPerUid);
  try {
    p.handle(*p.daemons, "peer-x", 1000, SimDaemon::make_reg("one-more"));
    FAIL() << "a node over the cap was registered";
  } catch (const Refused& e) {
    EXPECT_EQ(e.code, proto::code::kInvalidState);
    EXPECT_EQ(e.field, "node");
    EXPECT_NE(std::string(e.what()).find("a new node name is refused"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(p.store->node(1000, "one-more"));
  p.handle(*p.daemons, "peer-y", 1000, SimDaemon::make_reg("n7"));
  EXPECT_EQ(p.last<proto::Registered>().node, "n7");
  EXPECT_EQ(p.store->node(1000, "n7")->state, "up");
  p.handle(*p.daemons, "peer-z", 1001, SimDaemon::make_reg("one-more"));
  EXPECT_EQ(p.last<proto::Registered>().node, "one-more");
  EXPECT_EQ(p.store->count_nodes(1000), Engine::kMaxNodesPerUid);
}

TEST(CoordParts, ZapAdmitsNullAndListedCurveKeysOnly) {
  std::string dir = make_temp_dir("zap");
  char pub[41], sec[41];
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  std::string clients = dir + "/clients";
  std::ofstream(clients) << pub << " 4242 test client\n";
  chmod(clients.c_str(), 0600);
  auto req = [](const std::string& mech, const std::string& cred) {
    std::vector<std::string> r{"1.0", "7", "ringmaster", "127.0.0.1", "", mech};
    if (!cred.empty()) r.push_back(cred);
    return r;
  };
  EXPECT_EQ(zap_decide(req("NULL", ""), clients).status, "200");
  EXPECT_EQ(zap_decide({"1.0", "7"}, clients).status, "500");
  EXPECT_EQ(zap_decide(req("PLAIN", "x"), clients).text, "mechanism not allowed");
  uint8_t key[32];
  ASSERT_NE(zmq_z85_decode(key, pub), nullptr);
  auto ok = zap_decide(req("CURVE", std::string(reinterpret_cast<char*>(key), 32)), clients);
  EXPECT_EQ(ok.status, "200");
  EXPECT_EQ(ok.user, "4242");
  key[0] ^= 1;
  auto bad = zap_decide(req("CURVE", std::string(reinterpret_cast<char*>(key), 32)), clients);
  EXPECT_EQ(bad.status, "400");
  EXPECT_EQ(bad.text, "unknown client key");
  // A clients file others may write admits no one.
  chmod(clients.c_str(), 0666);
  key[0] ^= 1;
  auto unsafe = zap_decide(req("CURVE", std::string(reinterpret_cast<char*>(key), 32)), clients);
  EXPECT_EQ(unsafe.status, "400");
  EXPECT_EQ(unsafe.text, "clients file refused");
  std::filesystem::remove_all(dir);
}
