// The coordinator's ROUTER with simulated daemons and clients over real ZeroMQ sockets.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include <zmq.hpp>

#include "coord_test_util.h"
#include "coordinator/store.h"

using namespace ring::coord;
using namespace ring::coord::test;

namespace {

// Heartbeats `alive` daemons every 50 ms until pred() holds, collecting their messages.
bool pump_until(std::vector<SimDaemon*> alive, int64_t job, const std::function<bool()>& pred,
                std::chrono::milliseconds timeout = 8s) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    for (auto* d : alive) {
      d->link().heartbeat({{job, 0, 0}});
      while (auto m = d->link().recv(1ms)) d->inbox.push_back(*m);
    }
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

std::vector<std::string> kinds(const std::vector<proto::EventRecord>& ev) {
  std::vector<std::string> out;
  for (const auto& e : ev) out.push_back(e.kind);
  return out;
}

bool has_kind(const std::vector<proto::EventRecord>& ev, const std::string& k) {
  for (const auto& e : ev)
    if (e.kind == k) return true;
  return false;
}

}  // namespace

TEST(CoordServer, SubmitRegisterStepsStatus) {
  InProcessCoordinator coord;
  auto client = coord.client();
  auto sub = client.submit(test_spec(1, 3, 1, 8));
  EXPECT_EQ(sub.state, "pending");
  EXPECT_EQ(sub.name, "tiny");
  EXPECT_EQ(sub.spec_hash.rfind("sha256:", 0), 0u);
  EXPECT_EQ(client.status(sub.job).state, "pending");
  EXPECT_EQ(client.status(sub.job).owner_uid, static_cast<int64_t>(geteuid()));

  SimDaemon d(coord.endpoint(), "node-a");
  auto reg = d.register_jobs({{sub.job, 0, 0}});
  EXPECT_EQ(reg.node, "node-a");
  EXPECT_DOUBLE_EQ(reg.heartbeat_interval_s, 0.1);
  ASSERT_EQ(reg.jobs.size(), 1u);
  EXPECT_EQ(reg.jobs[0].attempt, 1);
  EXPECT_EQ(reg.jobs[0].state, "starting");
  EXPECT_EQ(reg.jobs[0].resume_step, 0);
  EXPECT_EQ(client.status(sub.job).state, "starting");

  for (int s = 1; s <= 5; ++s) d.step(sub.job, 1, s, 3.0 - 0.1 * s);
  ASSERT_TRUE(wait_for([&] { return client.status(sub.job).step == 5; }));
  auto st = client.status(sub.job);
  EXPECT_EQ(st.state, "running");
  EXPECT_NEAR(*st.loss, 2.5, 1e-9);
  EXPECT_EQ(st.nodes, std::vector<std::string>{"node-a"});
  EXPECT_EQ(client.status().size(), 1u);

  auto nodes = client.nodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].name, "node-a");
  EXPECT_EQ(nodes[0].state, "up");
  EXPECT_EQ(nodes[0].gpus, 1);
  EXPECT_EQ(nodes[0].jobs, std::vector<int64_t>{sub.job});

  // Steps are stored (batched) and the job's events tell its story. The status read before the
  // batch is written (usually: it is written every 0.2 s) and after it is the same, updated_at
  // included (it once moved at the flush, which `ringctl status` comparisons tripped over).
  const auto before = client.status(sub.job);
  ASSERT_TRUE(wait_for([&] {
    Store st(coord.dir() + "/state/coord.db", {false, 0});
    return st.count("step_metrics") == 5;
  }));
  const auto after = client.status(sub.job);
  EXPECT_EQ(after.step, before.step);
  EXPECT_EQ(after.loss, before.loss);
  EXPECT_DOUBLE_EQ(after.updated_at, before.updated_at);
  auto ev = client.events(sub.job);
  EXPECT_EQ(kinds(ev), (std::vector<std::string>{"submitted", "state", "ring_order", "state"}));
  EXPECT_EQ(ev[1].data["to"], "starting");
  EXPECT_EQ(ev[2].data["nodes"], nlohmann::json::array({"node-a"}));
  EXPECT_EQ(ev[3].data["to"], "running");
  // events --follow: only newer events.
  EXPECT_TRUE(client.events(sub.job, ev.back().id).empty());

  // Stale step reports (an older attempt) are ignored. The connection keeps order: once step 6
  // of the current attempt, sent after it, is stored, the stale one was handled.
  d.step(sub.job, 7, 99);
  d.step(sub.job, 1, 6, 2.4);
  ASSERT_TRUE(wait_for([&] {
    auto rows = client.steps(sub.job);
    return !rows.empty() && rows.back().step == 6;
  }));
  EXPECT_EQ(client.status(sub.job).step, 6);
  for (const auto& r : client.steps(sub.job)) EXPECT_NE(r.step, 99);
}

TEST(CoordServer, CommandsRoundTrip) {
  InProcessCoordinator coord;
  auto client = coord.client();
  int64_t job = client.submit(test_spec(2, 3, 1, 8)).job;
  SimDaemon a(coord.endpoint(), "a"), b(coord.endpoint(), "b");
  a.register_jobs({{job, 0, 0}});
  b.register_jobs({{job, 0, 0}});
  a.step(job, 1, 1);
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "running"; }));

  auto ok = client.checkpoint(job);
  EXPECT_EQ(ok.message, "checkpoint_now sent to 2 node(s)");
  for (auto* d : {&a, &b}) {
    auto c = d->expect_command(proto::CommandKind::kCheckpointNow, job);
    EXPECT_EQ(c.attempt, 1);
    d->link().send(proto::CommandAck{d->node(), c.id, true, ""});
  }
  a.checkpoint(job, 1, 10);
  b.checkpoint(job, 1, 10);
  ASSERT_TRUE(wait_for([&] { return client.status(job).last_checkpoint_step == 10; }));
  auto ev = client.events(job);
  int acks = 0;
  for (const auto& e : ev)
    if (e.kind == "command_ack") {
      EXPECT_EQ(e.data["command"], "checkpoint_now");
      ++acks;
    }
  EXPECT_EQ(acks, 2);

  // A user restart from a given step: stop, then roll back both nodes to that step.
  client.restart(job, 10);
  a.expect_command(proto::CommandKind::kStop, job);
  auto rb = a.expect_command(proto::CommandKind::kRollBack, job);
  EXPECT_EQ(rb.attempt, 2);
  EXPECT_EQ(rb.step, 10);
  EXPECT_EQ(b.expect_command(proto::CommandKind::kRollBack, job).step, 10);
  auto st = client.status(job);
  EXPECT_EQ(st.state, "starting");
  EXPECT_EQ(st.attempt, 2);
  EXPECT_EQ(st.restarts, 0);  // user restarts do not use the automatic budget

  // Cancel: stop commands, then cancelled once both daemons confirm.
  EXPECT_EQ(client.cancel(job).state, "cancelling");
  for (auto* d : {&a, &b}) {
    d->expect_command(proto::CommandKind::kStop, job);
    d->simple(proto::EventKind::kJobStopped, job, 2);
  }
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "cancelled"; }));
  // Cancelling again is refused with the transition rule.
  try {
    client.cancel(job);
    FAIL();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "invalid_state");
    EXPECT_NE(std::string(e.what()).find("cannot go from cancelled to cancelling"),
              std::string::npos)
        << e.what();
  }
}

// Issue 31.1 and 31.2 at ring-coord: `restart --from N` names a checkpoint it has a complete
// record of, not deleted by retention, not superseded; the checkpoints after N leave the lineage,
// so a later failure rolls back to N (or to what the new branch saved), never to the abandoned
// branch's newer step (on the old coordinator: step 40).
TEST(CoordServer, RestartFromFollowsTheLineage) {
  InProcessCoordinator coord;
  auto client = coord.client();
  int64_t job = client.submit(test_spec(2, 3, 0.05, 0.05)).job;
  SimDaemon a(coord.endpoint(), "a"), b(coord.endpoint(), "b");
  a.register_jobs({{job, 0, 0}});
  b.register_jobs({{job, 0, 0}});
  a.step(job, 1, 1);
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "running"; }));
  for (int64_t s : {10, 20, 30}) {
    a.checkpoint(job, 1, s);
    b.checkpoint(job, 1, s);
  }
  // Node 0's commit of 40 removed 10 (keep_last 3).
  a.checkpoint(job, 1, 40, true, {10});
  b.checkpoint(job, 1, 40);
  ASSERT_TRUE(wait_for([&] { return client.status(job).last_checkpoint_step == 40; }));
  const auto refused = [&](int64_t from, const std::string& why) {
    try {
      client.restart(job, from);
      ADD_FAILURE() << "restart --from " << from << " accepted";
    } catch (const RemoteError& e) {
      EXPECT_EQ(e.code(), "bad_field");
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("it can restart from step 20, 30, 40"),
                std::string::npos)
          << e.what();
    }
  };
  refused(15, "job " + std::to_string(job) + " has no checkpoint of step 15");
  refused(10, "no longer has its checkpoint of step 10 (retention removed it");
  EXPECT_EQ(client.status(job).state, "running");

  client.restart(job, 20);
  // The stopped attempt's stop checkpoint, reported late: of the abandoned branch.
  a.checkpoint(job, 1, 45);
  b.checkpoint(job, 1, 45);
  a.expect_command(proto::CommandKind::kStop, job);
  EXPECT_EQ(a.expect_command(proto::CommandKind::kRollBack, job).step, 20);
  EXPECT_EQ(b.expect_command(proto::CommandKind::kRollBack, job).step, 20);
  EXPECT_EQ(client.status(job).last_checkpoint_step, 20);
  // A worker dies before the branch's first checkpoint: back to 20, not to the abandoned 40.
  a.step(job, 2, 21);
  proto::Event died;
  died.kind = proto::EventKind::kWorkerDied;
  died.job = job;
  died.attempt = 2;
  died.rank = 0;
  died.signal = 9;
  a.event(died);
  proto::Command rb;
  ASSERT_TRUE(pump_until({&a, &b}, job, [&] {
    for (const auto& m : a.inbox)
      if (auto* c = std::get_if<proto::Command>(&m);
          c && c->command == proto::CommandKind::kRollBack && c->attempt == 3) {
        rb = *c;
        return true;
      }
    return false;
  }));
  EXPECT_EQ(rb.step, 20);
  // The branch writes step 30 again: of the lineage once more.
  a.checkpoint(job, 3, 30);
  b.checkpoint(job, 3, 30);
  ASSERT_TRUE(wait_for([&] { return client.status(job).last_checkpoint_step == 30; }));
  try {
    client.restart(job, 40);
    ADD_FAILURE() << "restart --from 40 accepted";
  } catch (const RemoteError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint of step 40 was superseded"),
              std::string::npos)
        << e.what();
  }
  bool branched = false;
  for (const auto& e : client.events(job))
    if (e.kind == "lineage_branched" && e.data.value("step", -1) == 20) branched = true;
  EXPECT_TRUE(branched);
}

TEST(CoordServer, CompletesWhenEveryNodeFinishes) {
  InProcessCoordinator coord;
  auto client = coord.client();
  int64_t job = client.submit(test_spec(2, 3, 1, 8)).job;
  SimDaemon a(coord.endpoint(), "a"), b(coord.endpoint(), "b");
  a.register_jobs({{job, 0, 0}});
  b.register_jobs({{job, 0, 0}});
  a.step(job, 1, 200);
  a.simple(proto::EventKind::kJobCompleted, job, 1, 200);
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "completing"; }));
  b.simple(proto::EventKind::kJobCompleted, job, 1, 200);
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "completed"; }));
  Store st(coord.dir() + "/state/coord.db", {false, 0});
  auto at = st.attempts(job);
  ASSERT_EQ(at.size(), 1u);
  EXPECT_EQ(at[0].exit_status, "completed");
  EXPECT_TRUE(at[0].ended_at);
}

TEST(CoordServer, HeartbeatLossRollsBackThenFails) {
  InProcessCoordinator coord([](CoordinatorOptions& o) { o.heartbeat_timeout_s = 2.0; });
  auto client = coord.client();
  int64_t job = client.submit(test_spec(2, 1, 0.3, 5)).job;  // one automatic restart
  SimDaemon a(coord.endpoint(), "a"), b(coord.endpoint(), "b");
  a.register_jobs({{job, 0, 0}});
  b.register_jobs({{job, 0, 0}});
  a.step(job, 1, 1);
  a.checkpoint(job, 1, 20);
  b.checkpoint(job, 1, 20);
  ASSERT_TRUE(pump_until({&a, &b}, job, [&] {
    return client.status(job).last_checkpoint_step == 20 && client.status(job).state == "running";
  }));

  // b stops heartbeating: node lost -> restarting (a is told to stop) -> after the backoff,
  // attempt 2 rolls a back to the checkpoint.
  ASSERT_TRUE(pump_until({&a}, job, [&] { return client.status(job).state == "restarting"; }));
  auto st = client.status(job);
  EXPECT_EQ(st.restarts, 1);
  EXPECT_NE(st.state_reason.find("node b lost"), std::string::npos) << st.state_reason;
  a.expect_command(proto::CommandKind::kStop, job);
  ASSERT_TRUE(pump_until({&a}, job, [&] { return client.status(job).state == "starting"; }));
  auto rb = a.expect_command(proto::CommandKind::kRollBack, job);
  EXPECT_EQ(rb.attempt, 2);
  EXPECT_EQ(rb.step, 20);
  auto nodes = client.nodes();
  EXPECT_EQ(nodes[1].name, "b");
  EXPECT_EQ(nodes[1].state, "lost");

  // A worker dies in attempt 2: the budget (1 restart) is spent, the job fails.
  a.step(job, 2, 21);
  proto::Event died;
  died.kind = proto::EventKind::kWorkerDied;
  died.job = job;
  died.attempt = 2;
  died.rank = 1;
  died.signal = 9;
  died.last_log = {"step 21", "Killed"};
  a.event(died);
  ASSERT_TRUE(pump_until({&a}, job, [&] { return client.status(job).state == "failed"; }));
  st = client.status(job);
  EXPECT_NE(st.state_reason.find("worker rank 1 on a died (signal 9)"), std::string::npos)
      << st.state_reason;
  EXPECT_NE(st.state_reason.find("restarts exhausted (1 of 1)"), std::string::npos);
  a.expect_command(proto::CommandKind::kStop, job);

  Store db(coord.dir() + "/state/coord.db", {false, 0});
  auto at = db.attempts(job);
  ASSERT_EQ(at.size(), 2u);
  EXPECT_NE(at[0].exit_status.find("node b lost"), std::string::npos);
  EXPECT_EQ(at[1].resume_step, 20);
  EXPECT_NE(at[1].exit_status.find("died"), std::string::npos);
  auto ev = client.events(job);
  EXPECT_TRUE(has_kind(ev, "node_lost"));
  EXPECT_TRUE(has_kind(ev, "restart_scheduled"));
  EXPECT_TRUE(has_kind(ev, "worker_died"));
  for (const auto& e : ev)
    if (e.kind == "worker_died") {
      EXPECT_EQ(e.data["last_log"][1], "Killed");
    }

  // Its owner may restart a failed job by hand.
  EXPECT_EQ(client.restart(job).state, "restarting");
  ASSERT_TRUE(pump_until({&a}, job, [&] { return client.status(job).attempt == 3; }));
}

TEST(CoordServer, BackoffDoublesUpToTheMaximum) {
  InProcessCoordinator coord;
  auto client = coord.client();
  int64_t job = client.submit(test_spec(1, 4, 0.1, 0.3)).job;
  SimDaemon a(coord.endpoint(), "a");
  a.register_jobs({{job, 0, 0}});
  for (int attempt = 1; attempt <= 5; ++attempt) {
    proto::Event died;
    died.kind = proto::EventKind::kWorkerDied;
    died.job = job;
    died.attempt = attempt;
    died.rank = 0;
    died.exit_code = 1;
    a.event(died);
    if (attempt == 5) break;
    ASSERT_TRUE(wait_for([&] { return client.status(job).attempt == attempt + 1; }))
        << "attempt " << attempt;
  }
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "failed"; }));
  std::vector<double> delays;
  for (const auto& e : client.events(job, 0, 1000))
    if (e.kind == "restart_scheduled") delays.push_back(e.data["delay_s"].get<double>());
  EXPECT_EQ(delays, (std::vector<double>{0.1, 0.2, 0.3, 0.3}));
}

TEST(CoordServer, MalformedAndOversizedMessagesAreRejected) {
  InProcessCoordinator coord;
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::rcvtimeo, 3000);
  s.set(zmq::sockopt::linger, 0);
  s.connect(coord.endpoint());
  auto send_recv = [&](const std::string& wire) -> proto::ErrorReply {
    s.send(zmq::buffer(wire));
    zmq::message_t m;
    EXPECT_TRUE(s.recv(m));
    auto msg = proto::parse(m.to_string_view());
    auto* e = std::get_if<proto::ErrorReply>(&msg);
    EXPECT_NE(e, nullptr);
    return e ? *e : proto::ErrorReply{};
  };
  EXPECT_EQ(send_recv("hello").code, "bad_json");
  EXPECT_EQ(send_recv(std::string(70000, '{')).code, "too_large");
  EXPECT_EQ(send_recv(R"({"v":9,"type":"status","id":3})").code, "unsupported_version");
  auto e = send_recv(R"({"v":1,"type":"cancel","id":12,"job":"seven"})");
  EXPECT_EQ(e.code, "bad_field");
  EXPECT_EQ(e.field, "cancel.job");
  EXPECT_EQ(e.id, 12);  // matched to the request
  EXPECT_EQ(send_recv(R"({"v":1,"type":"heartbeat","node":"ghost","seq":1})").code,
            "not_registered");
  EXPECT_EQ(send_recv(R"({"v":1,"type":"registered","node":"x","heartbeat_interval_s":1,)"
                      R"("heartbeat_timeout_s":2})")
                .code,
            "unknown_type");
  EXPECT_EQ(send_recv(R"({"v":1,"type":"status","id":1,"job":99})").code, "not_found");
  // Two frames in one message.
  s.send(zmq::str_buffer("a"), zmq::send_flags::sndmore);
  s.send(zmq::str_buffer("b"));
  zmq::message_t m;
  ASSERT_TRUE(s.recv(m));
  EXPECT_NE(m.to_string().find("exactly one frame"), std::string::npos);
  // A step for a job that does not exist, from a registered node.
  SimDaemon d(coord.endpoint(), "n1");
  d.register_jobs({});
  d.step(424242, 1, 1);
  auto err = d.expect<proto::ErrorReply>();
  EXPECT_EQ(err.code, "not_found");
  // Over libzmq's 1 MiB limit the connection is dropped (no reply possible); the coordinator
  // lives on.
  {
    zmq::socket_t big(ctx, zmq::socket_type::dealer);
    big.set(zmq::sockopt::linger, 0);
    big.connect(coord.endpoint());
    big.send(zmq::buffer(std::string(2 << 20, 'x')));
    std::this_thread::sleep_for(200ms);
  }
  // Garbage of every shape: the coordinator answers each with an error and keeps serving.
  uint64_t x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::string g = proto::encode(proto::StatusRequest{1, 1});
    g[x % g.size()] = static_cast<char>(x >> 33);
    g.insert((x >> 20) % g.size(), std::string((x >> 40) % 5, '"'));
    s.send(zmq::buffer(g));
    ASSERT_TRUE(s.recv(m)) << "no reply to garbage " << i;
  }
  auto client = coord.client();
  EXPECT_TRUE(client.status().empty());
  EXPECT_GE(coord.coordinator().stats().rejected, 300u);
}

TEST(CoordServer, ClientErrorsAreTyped) {
  InProcessCoordinator coord;
  auto client = coord.client();
  try {
    client.submit("job:\n  name: x\nmodel:\n  layers: -3\n");
    FAIL();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "invalid_spec");
    EXPECT_NE(std::string(e.what()).find("model.layers"), std::string::npos) << e.what();
  }
  try {
    client.cancel(77);
    FAIL();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "not_found");
    EXPECT_STREQ(e.what(), "job 77 does not exist");
  }
  int64_t job = client.submit(test_spec(1, 0, 1, 1)).job;
  try {
    client.checkpoint(job);
    FAIL();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "invalid_state");
  }
  try {
    client.restart(job);  // pending -> restarting is not in the table
    FAIL();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.code(), "invalid_state");
    EXPECT_NE(std::string(e.what()).find("cannot go from pending to restarting"),
              std::string::npos);
  }
  EXPECT_EQ(client.cancel(job).state, "cancelled");  // pending: no daemon to stop
  EXPECT_THROW(Client(ClientOptions{"ipc:///nonexistent/dir/coord.sock", 500ms, "", "", ""}),
               ConnectError);
  EXPECT_THROW(Client(ClientOptions{"inproc://x", 500ms, "", "", ""}), ConnectError);
  // A coordinator that is not there: stop ours and ask again.
  coord.stop();
  std::string path = coord.endpoint().substr(6);
  // The socket file is gone with the coordinator: a clear connect error.
  EXPECT_THROW(coord.client(300ms), ConnectError);
}

TEST(CoordServer, RefusesSecondCoordinatorAndBadDirs) {
  InProcessCoordinator coord;
  CoordinatorOptions o;
  o.state_dir = coord.dir() + "/state";
  o.endpoints = {"ipc://" + coord.dir() + "/other/coord.sock"};
  try {
    Coordinator second(o);
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("another ring-coord"), std::string::npos) << e.what();
  }
  o.state_dir = coord.dir() + "/state2";
  o.endpoints = {coord.endpoint()};
  try {
    Coordinator second(o);
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  // A group-readable socket directory is refused in private mode.
  std::string loose = coord.dir() + "/loose";
  mkdir(loose.c_str(), 0755);
  chmod(loose.c_str(), 0755);
  o.state_dir = coord.dir() + "/state3";
  o.endpoints = {"ipc://" + loose + "/coord.sock"};
  try {
    Coordinator c(o);
    FAIL();
  } catch (const SecurityError& e) {
    EXPECT_NE(std::string(e.what()).find("mode 0755"), std::string::npos) << e.what();
  }
  // ... but allowed (not writable by others) in shared mode.
  o.socket_mode = SocketMode::kShared;
  EXPECT_NO_THROW(Coordinator c(o));
  // A directory owned by someone else is refused.
  std::string theirs = coord.dir() + "/theirs";
  mkdir(theirs.c_str(), 0700);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  o.state_dir = coord.dir() + "/state4";
  o.endpoints = {"ipc://" + theirs + "/coord.sock"};
  try {
    Coordinator c(o);
    FAIL();
  } catch (const SecurityError& e) {
    EXPECT_NE(std::string(e.what()).find("owned by uid 65534"), std::string::npos) << e.what();
  }
}

// A fresh account has no ~/.local/state: the state directory's missing parents are created, the
// state directory itself is private.
TEST(CoordServer, CreatesMissingParentsOfTheStateDirectory) {
  InProcessCoordinator coord;
  CoordinatorOptions o;
  o.state_dir = coord.dir() + "/home/.local/state/ringmaster";
  std::string sock = coord.dir() + "/fresh-sock";
  o.endpoints = {"ipc://" + sock + "/coord.sock"};
  {
    Coordinator c(o);
    struct stat st {};
    ASSERT_EQ(stat(o.state_dir.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(stat((o.state_dir + "/coord.db").c_str(), &st), 0);
  }
}

// The job's directories are recorded at submit; the global ring order is recorded when daemons
// join: nodes under one leaf switch adjacent (from the leaf switches they registered with).
TEST(CoordServer, RecordsJobDirsAndRingOrder) {
  InProcessCoordinator coord;
  auto client = coord.client();
  auto sub = client.submit(test_spec(4, 0, 1, 1), "", "/scratch/jobs/ring/");
  auto st = client.status(sub.job);
  EXPECT_EQ(st.job_dir, "/scratch/jobs/ring");
  EXPECT_EQ(st.checkpoint_dir, "/scratch/jobs/ring/checkpoints");  // tiny.yaml: relative dir
  EXPECT_TRUE(st.ring_order.empty());
  auto dflt = client.submit(test_spec(1, 0, 1, 1));
  EXPECT_EQ(client.status(dflt.job).job_dir,
            "/tmp/ringmaster-" + std::to_string(geteuid()) + "/jobs/tiny");  // the owner's

  // Join order n3, n1, n4, n2; leaves: n1 and n3 on leafA, n2 and n4 on leafB.
  std::vector<std::unique_ptr<SimDaemon>> ds;
  for (auto [name, leaf] : std::vector<std::pair<std::string, std::string>>{
           {"n3", "leafA"}, {"n1", "leafA"}, {"n4", "leafB"}, {"n2", "leafB"}}) {
    ds.push_back(std::make_unique<SimDaemon>(coord.endpoint(), name));
    ds.back()->link().registration().topology.leaf_switch = leaf;
    ds.back()->register_jobs({{sub.job, 0, 0}});
  }
  st = client.status(sub.job);
  EXPECT_EQ(st.ring_order, (std::vector<std::string>{"n1", "n3", "n2", "n4"}));
  auto ev = client.events(sub.job);
  ASSERT_TRUE(has_kind(ev, "ring_order"));
  const auto& last =
      *std::find_if(ev.rbegin(), ev.rend(), [](const auto& e) { return e.kind == "ring_order"; });
  // Same leaf: 2 hops; leaf to leaf through the root: 4. n1-n3-n2-n4-(n1): 2+4+2+4 = 12, against
  // 4 x 4 = 16 for the node list n1 n2 n3 n4.
  EXPECT_EQ(last.data["hops"], 12);
  EXPECT_EQ(last.data["node_list_hops"], 16);
}

// A signal that interrupts the client's wait (a caller that handles Ctrl-C, a timer) is not an
// error: the client waits out its deadline and says the coordinator did not answer. So is a
// signal on a daemon link's poll. (zmq::poll throws on EINTR.)
TEST(CoordClient, SignalsDuringAWaitAreNotErrors) {
  struct sigaction sa {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: the poll returns EINTR
  struct sigaction old {};
  ASSERT_EQ(sigaction(SIGUSR2, &sa, &old), 0);
  const pthread_t self = pthread_self();
  std::atomic<bool> done{false};
  std::thread pester([&] {
    while (!done) {
      pthread_kill(self, SIGUSR2);
      std::this_thread::sleep_for(20ms);
    }
  });
  const std::string dir = ::testing::TempDir() + "/coord-eintr-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  // A socket file nobody listens on (as a coordinator killed with -9 leaves).
  const std::string path = dir + "/nobody.sock", ep = "ipc://" + path;
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << path;
    ::close(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    Client c(ClientOptions{ep, 500ms, "", "", ""});
    c.status();
    ADD_FAILURE() << "status() answered without a coordinator";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach the coordinator"), std::string::npos)
        << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a timeout: " << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 450ms);  // the whole deadline was waited

  DaemonLink link(DaemonLinkOptions{ep, "", "", ""}, SimDaemon::make_reg("node-a"));
  const auto t1 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t1 < 300ms)
    EXPECT_NO_THROW(EXPECT_FALSE(link.recv(100ms).has_value()));
  done = true;
  pester.join();
  sigaction(SIGUSR2, &old, nullptr);
  std::filesystem::remove_all(dir);
}

namespace {

// The message of the SecurityError that constructing a coordinator with `o` throws ("" if none).
std::string start_error(const CoordinatorOptions& o) {
  try {
    Coordinator c(o);
  } catch (const SecurityError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a SecurityError: ") + e.what();
  }
  return "";
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return 01000;  // missing
  return st.st_mode & 07777;
}

}  // namespace

// The state directory holds every job's spec and the CURVE secret key. It is created 0700 and
// its files 0600 whatever the umask; an existing one that is group/other accessible, a symlink
// or someone else's is refused with the path and the rule, as ssh refuses ~/.ssh.
TEST(CoordServer, StateDirectoryAndFilesArePrivate) {
  std::string dir = make_temp_dir("private-state");
  CoordinatorOptions o;
  o.endpoints = {"ipc://" + dir + "/sock/coord.sock"};
  o.state_dir = dir + "/state";
  mode_t old_umask = umask(0);  // what a careless login shell might have
  {
    Coordinator c(o);
    std::thread t([&] { c.run(); });
    Client client(ClientOptions{o.endpoints[0], 3000ms, "", "", ""});
    client.submit(test_spec(1, 0, 1, 1));  // writes: the -wal and -shm files exist now
    EXPECT_EQ(mode_of(o.state_dir), 0700u);
    EXPECT_EQ(mode_of(o.state_dir + "/coord.db"), 0600u);
    EXPECT_EQ(mode_of(o.state_dir + "/coord.db-wal"), 0600u);
    EXPECT_EQ(mode_of(o.state_dir + "/coord.db-shm"), 0600u);
    EXPECT_EQ(mode_of(o.state_dir + "/coord.lock"), 0600u);
    c.stop();
    t.join();
  }
  umask(old_umask);

  // A database others may read is refused, naming it and the fix.
  chmod((o.state_dir + "/coord.db").c_str(), 0644);
  std::string e = start_error(o);
  EXPECT_NE(e.find("database " + o.state_dir +
                   "/coord.db has mode 0644; it must not be "
                   "accessible to group or others (chmod 0600 " +
                   o.state_dir + "/coord.db)"),
            std::string::npos)
      << e;
  chmod((o.state_dir + "/coord.db").c_str(), 0600);
  EXPECT_EQ(start_error(o), "");
  // A database that is a symlink (to a file an attacker chose) is refused.
  rename((o.state_dir + "/coord.db").c_str(), (dir + "/elsewhere.db").c_str());
  ASSERT_EQ(symlink((dir + "/elsewhere.db").c_str(), (o.state_dir + "/coord.db").c_str()), 0);
  e = start_error(o);
  EXPECT_NE(e.find(o.state_dir + "/coord.db is a symbolic link"), std::string::npos) << e;

  // A group-readable state directory.
  std::string loose = dir + "/loose";
  mkdir(loose.c_str(), 0750);
  chmod(loose.c_str(), 0750);
  o.state_dir = loose;
  e = start_error(o);
  EXPECT_NE(e.find("state directory " + loose +
                   " has mode 0750; it must not be accessible to "
                   "group or others (chmod 0700 " +
                   loose + ")"),
            std::string::npos)
      << e;
  EXPECT_EQ(mode_of(loose + "/coord.db"), 01000u) << "nothing is created in a refused directory";
  // A state directory that is a symlink to a private directory.
  std::string real = dir + "/real";
  mkdir(real.c_str(), 0700);
  ASSERT_EQ(symlink(real.c_str(), (dir + "/link").c_str()), 0);
  o.state_dir = dir + "/link";
  e = start_error(o);
  EXPECT_NE(e.find("state directory " + dir + "/link is a symbolic link"), std::string::npos) << e;
  // Someone else's.
  std::string theirs = dir + "/theirs";
  mkdir(theirs.c_str(), 0700);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  o.state_dir = theirs;
  e = start_error(o);
  EXPECT_NE(e.find("state directory " + theirs + " is owned by uid 65534"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

// tcp:// (CURVE): the secret key must be private, and the clients file (which maps keys to uids)
// must not be writable by group or others, nor a symlink, nor someone else's.
TEST(CoordServer, CurveKeyAndClientsFileAreChecked) {
  std::string dir = make_temp_dir("curve-files");
  CoordinatorOptions o;
  o.state_dir = dir + "/state";
  o.endpoints = {"tcp://127.0.0.1:0"};
  EXPECT_EQ(start_error(o), "");  // creates the key pair
  const std::string key = o.state_dir + "/curve/server.key";
  const std::string clients = o.state_dir + "/curve/clients";
  EXPECT_EQ(mode_of(key), 0600u);
  EXPECT_EQ(mode_of(o.state_dir + "/curve"), 0700u);

  chmod(key.c_str(), 0640);
  std::string e = start_error(o);
  EXPECT_NE(e.find(key +
                   " has mode 0640; it must not be accessible to group or others "
                   "(chmod 0600 " +
                   key + ")"),
            std::string::npos)
      << e;
  chmod(key.c_str(), 0600);

  std::ofstream(clients) << "# key uid\n";
  chmod(clients.c_str(), 0666);
  e = start_error(o);
  EXPECT_NE(e.find("CURVE clients file " + clients +
                   " has mode 0666; it must not be writable "
                   "by group or others (chmod 0600 " +
                   clients + ")"),
            std::string::npos)
      << e;
  chmod(clients.c_str(), 0644);  // readable is fine: it holds public keys
  EXPECT_EQ(start_error(o), "");
  ASSERT_EQ(chown(clients.c_str(), 65534, 65534), 0);
  e = start_error(o);
  EXPECT_NE(e.find("CURVE clients file " + clients + " is owned by uid 65534"), std::string::npos)
      << e;
  std::filesystem::remove(clients);
  std::ofstream(dir + "/planted") << "# key uid\n";
  ASSERT_EQ(symlink((dir + "/planted").c_str(), clients.c_str()), 0);
  e = start_error(o);
  EXPECT_NE(e.find("CURVE clients file " + clients + " is a symbolic link"), std::string::npos)
      << e;
  std::filesystem::remove_all(dir);
}

// A restarted job whose only daemon is gone, outside Slurm, fails as abandoned (it used to stay
// "starting" for ever); a Slurm job in the same situation waits for Slurm.
TEST(CoordServer, AJobNoDaemonServesFailsAsAbandoned) {
  InProcessCoordinator coord([](CoordinatorOptions& o) { o.heartbeat_timeout_s = 1.0; });
  auto client = coord.client();
  int64_t job = client.submit(test_spec(1, 3, 0.2, 0.2)).job;
  int64_t slurm = client.submit(test_spec(1, 3, 0.2, 0.2)).job;
  client.slurm_job(proto::SlurmJobRequest{0, slurm, "submitted", "4242", 0, "", ""});
  {
    SimDaemon a(coord.endpoint(), "a"), b(coord.endpoint(), "b");
    a.register_jobs({{job, 0, 0}});
    b.register_jobs({{slurm, 0, 0}});
    a.step(job, 1, 1);
    b.step(slurm, 1, 1);
    ASSERT_TRUE(wait_for(
        [&] {
          return client.status(job).state == "running" && client.status(slurm).state == "running";
        },
        30s));
  }  // both daemons are gone
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "failed"; }, 60s))
      << client.status(job).state << ": " << client.status(job).state_reason;
  auto st = client.status(job);
  EXPECT_EQ(st.state_reason.rfind("abandoned: no daemon has served attempt 2 for ", 0), 0u)
      << st.state_reason;
  EXPECT_TRUE(has_kind(client.events(job), "abandoned"));
  // The Slurm job went through the same loss at the same time and is still waiting.
  EXPECT_NE(client.status(slurm).state, "failed") << client.status(slurm).state_reason;
}

// What escape_for_log makes of control characters: one line, no terminal control, and the
// escapes themselves stay unambiguous (a literal backslash is doubled).
TEST(CoordServer, EscapeForLog) {
  EXPECT_EQ(escape_for_log("plain name-1.x"), "plain name-1.x");
  EXPECT_EQ(escape_for_log("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(escape_for_log(std::string("\x1b[2J\x7f\0z", 7)), "\\x1b[2J\\x7f\\x00z");
  EXPECT_EQ(escape_for_log("back\\n slash"), "back\\\\n slash");
  EXPECT_EQ(escape_for_log("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 is kept
}
