// Multi-user safety and hardening of ring-coord against the real binary in shared
// mode with daemons run as root and as another Unix user (nobody, in a forked child that drops
// to uid 65534): a node is (uid, name), so another user can neither take over a lost node nor
// block the owner's daemon by registering its name first; user strings cannot forge log lines;
// bad options are usage errors; a job whose `ringctl run` was killed does not stay starting.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <zmq.hpp>

#include "../common/run.h"
#include "../common/test_proc.h"
#include "coord_test_util.h"
#include "coordinator/security.h"

using namespace ring::coord;
using namespace ring::coord::test;
using ring::test::as_uid;

namespace {

const std::string kCoordBin = std::string(RING_BINARY_DIR) + "/coordinator/ring-coord";
const std::string kRingctlBin = std::string(RING_BINARY_DIR) + "/cli/ringctl";
constexpr uid_t kNobody = 65534;
// A second unprivileged uid without a passwd entry: the kernel needs none, and the coordinator
// takes the uid from the connection (SO_PEERCRED).
constexpr uid_t kOther = 65533;

// A per-test directory nobody can traverse (the socket directory inside is made 0711 by a
// shared-mode coordinator); removed at the end.
struct SharedDir {
  std::string path = make_temp_dir("coordsec");
  SharedDir() { chmod(path.c_str(), 0711); }
  ~SharedDir() { std::filesystem::remove_all(path); }
};

// ring-coord as a child process, shared mode, its output in <dir>/coord.log.
struct CoordBin {
  std::string dir, ep, log;
  std::unique_ptr<ring::test::Proc> proc;
  CoordBin(const std::string& d, std::vector<std::string> extra) : dir(d) {
    ep = "ipc://" + dir + "/sock/coord.sock";
    log = dir + "/coord.log";
    std::vector<std::string> args{kCoordBin,       "--state-dir", dir + "/state", "--endpoint", ep,
                                  "--socket-mode", "shared",      "--sync",       "normal"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc = std::make_unique<ring::test::Proc>(args, log, log);
    EXPECT_TRUE(wait_for([&] { return read_text(log).find("state in") != std::string::npos; }, 30s))
        << read_text(log);
  }
  Client client() { return Client(ClientOptions{ep, 10000ms, "", "", ""}); }
};

std::string as_nobody(const std::function<std::string()>& fn) {
  return as_uid(kNobody, fn);
}

// The code of the error the coordinator answers `m` with, or "accepted" when none comes within
// 15 s (daemon messages are not acknowledged; a refusal is answered at once, even under load).
std::string error_for(SimDaemon& d, const proto::Message& m) {
  d.link().send(m);
  try {
    return d.expect<proto::ErrorReply>(15s).code;
  } catch (const std::exception&) {
    return "accepted";
  }
}

proto::Event event_of(proto::EventKind k, int64_t job, int64_t attempt) {
  proto::Event e;
  e.kind = k;
  e.job = job;
  e.attempt = attempt;
  return e;
}

// What a squatting daemon of another uid tries against `job` under node name `node`: every
// message about the job. Returns the answers, one per line.
std::string forge_everything(const std::string& ep, const std::string& node, int64_t job,
                             int64_t attempt) {
  SimDaemon d(ep, node);
  std::ostringstream out;
  auto reg = d.register_jobs({{job, attempt, 0}});
  out << "registered jobs=" << reg.jobs.size() << "\n";
  auto ckpt = event_of(proto::EventKind::kCheckpointSaved, job, attempt);
  ckpt.node = node;
  ckpt.step = 50;
  ckpt.path = "/forged/step-50";
  ckpt.bytes = 1;
  ckpt.complete = true;
  out << "checkpoint_saved " << error_for(d, ckpt) << "\n";
  out << "step " << error_for(d, proto::StepReport{node, job, attempt, 99, 0.001, 1.0, 1.0, 0.0, {}})
      << "\n";
  auto died = event_of(proto::EventKind::kWorkerDied, job, attempt);
  died.node = node;
  died.rank = 0;
  died.signal = 9;
  out << "worker_died " << error_for(d, died) << "\n";
  auto stopped = event_of(proto::EventKind::kJobStopped, job, attempt);
  stopped.node = node;
  out << "job_stopped " << error_for(d, stopped) << "\n";
  auto done = event_of(proto::EventKind::kJobCompleted, job, attempt);
  done.node = node;
  done.step = 100;
  out << "job_completed " << error_for(d, done) << "\n";
  return out.str();
}

const char* kAllRefused =
    "registered jobs=0\n"
    "checkpoint_saved permission_denied\n"
    "step permission_denied\n"
    "worker_died permission_denied\n"
    "job_stopped permission_denied\n"
    "job_completed permission_denied\n";

}  // namespace

// The owner's daemon is gone (node lost, the job restarted and waits for it): another user
// registers that node name and reports for the job. Before: the job became "completed" with a
// forged checkpoint. Now the name is the squatter's own node and every message is refused.
TEST(CoordSecurity, AnotherUserCannotTakeOverALostNode) {
  SharedDir dir;
  CoordBin coord(dir.path, {"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1"});
  auto client = coord.client();
  int64_t job = client.submit(test_spec(1, 1, 0.2, 0.2)).job;
  {
    SimDaemon victim(coord.ep, "victim-n0");
    ASSERT_EQ(victim.register_jobs({{job, 0, 0}}).jobs.size(), 1u);
    victim.step(job, 1, 1);
    victim.checkpoint(job, 1, 1);
    ASSERT_TRUE(wait_for([&] { return client.status(job).last_checkpoint_step == 1; }, 30s));
  }  // the victim's daemon is gone: lost, attempt 1 fails, attempt 2 starts without it
  ASSERT_TRUE(wait_for([&] { return client.status(job).attempt == 2; }, 60s))
      << client.status(job).state << ": " << client.status(job).state_reason;

  std::string answers = as_nobody([&] { return forge_everything(coord.ep, "victim-n0", job, 2); });
  EXPECT_EQ(answers, kAllRefused);

  auto st = client.status(job);
  EXPECT_NE(st.state, "completed") << st.state_reason;
  EXPECT_EQ(st.last_checkpoint_step, 1);
  for (const auto& e : client.events(job, 0, 1000))
    EXPECT_EQ(e.data.dump().find("/forged"), std::string::npos) << e.kind << " " << e.data.dump();
  // Two nodes of one name: root's (lost) and nobody's.
  int roots = 0, nobodys = 0;
  for (const auto& n : client.nodes()) {
    if (n.name != "victim-n0") continue;
    if (n.uid == 0) {
      ++roots;
      EXPECT_EQ(n.state, "lost");
    }
    if (n.uid == static_cast<int64_t>(kNobody)) {
      ++nobodys;
      EXPECT_TRUE(n.jobs.empty());
    }
  }
  EXPECT_EQ(roots, 1);
  EXPECT_EQ(nobodys, 1);
}

// Another user registers first the (predictable) name the owner's ringd will use and keeps it
// up. Before: the owner's daemon was refused ("registered by uid 65533 and is up") and its job
// ran unsupervised. Now the owner's daemon registers and serves its job; the squatter's messages
// about the job are refused, and its repeated claims leave one join_refused event. Owner (nobody)
// and squatter (uid 65533) are both unprivileged.
TEST(CoordSecurity, ASquatterCannotBlockOrHijackTheOwnersDaemon) {
  SharedDir dir;
  CoordBin coord(dir.path, {"--heartbeat-interval", "0.2", "--heartbeat-timeout", "60"});
  auto client = coord.client();
  const std::string spec = test_spec(1, 0, 1, 1);
  std::string submitted = as_nobody([&] {
    Client c(ClientOptions{coord.ep, 10000ms, "", "", ""});
    return std::to_string(c.submit(spec).job);
  });
  ASSERT_EQ(submitted.find_first_not_of("0123456789"), std::string::npos) << submitted;
  int64_t job = std::stoll(submitted);
  ASSERT_EQ(client.status(job).owner_uid, static_cast<int64_t>(kNobody));
  const std::string name = "host-j" + std::to_string(job) + "-n0";

  std::string first = as_uid(kOther, [&] {
    SimDaemon squatter(coord.ep, name);
    auto reg = squatter.register_jobs({{job, 0, 0}});
    for (int i = 0; i < 3; ++i) squatter.link().heartbeat({{job, 0, 0}});
    // Registering again is answered after the heartbeats were handled (one connection).
    squatter.register_jobs({{job, 0, 0}});
    return "jobs=" + std::to_string(reg.jobs.size());
  });
  EXPECT_EQ(first, "jobs=0");
  EXPECT_EQ(client.status(job).state, "pending");

  // The owner's daemon registers under the same name while the squatter's node is up.
  std::string owner = as_nobody([&] {
    SimDaemon d(coord.ep, name);
    d.link().registration().jobs = {{job, 0, 0}};
    d.link().register_now();
    for (;;) {
      auto m = d.link().recv(10s);
      if (!m) return std::string("no reply");
      if (auto* r = std::get_if<proto::Registered>(&*m)) {
        if (r->jobs.size() != 1)
          return "registered with " + std::to_string(r->jobs.size()) + " jobs";
        d.step(job, 1, 1);
        // Answered after the step was handled.
        d.register_jobs({{job, 1, 1}});
        return "registered " + r->jobs[0].state;
      }
      if (auto* e = std::get_if<proto::ErrorReply>(&*m)) return "refused: " + e->message;
    }
  });
  ASSERT_EQ(owner, "registered starting");
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "running"; }, 30s));

  std::string answers = as_uid(kOther, [&] { return forge_everything(coord.ep, name, job, 1); });
  EXPECT_EQ(answers, kAllRefused);
  EXPECT_EQ(client.status(job).state, "running");

  std::string done = as_nobody([&] {
    SimDaemon d(coord.ep, name);
    d.register_jobs({{job, 1, 1}});
    d.checkpoint(job, 1, 4);
    d.simple(proto::EventKind::kJobCompleted, job, 1, 4);
    d.register_jobs({{job, 1, 4}});
    return std::string("ok");
  });
  EXPECT_EQ(done, "ok");
  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "completed"; }, 30s))
      << client.status(job).state_reason;
  auto st = client.status(job);
  EXPECT_EQ(st.last_checkpoint_step, 4);
  EXPECT_EQ(st.nodes, std::vector<std::string>{name});
  int refused = 0;
  for (const auto& e : client.events(job, 0, 1000)) {
    if (e.kind == "join_refused") {
      ++refused;
      EXPECT_EQ(e.data["uid"], kOther);
    }
    EXPECT_EQ(e.data.dump().find("/forged"), std::string::npos) << e.kind;
  }
  EXPECT_EQ(refused, 1);
  // Two nodes of one name, one per uid.
  std::set<int64_t> uids;
  for (const auto& n : client.nodes())
    if (n.name == name) uids.insert(n.uid);
  EXPECT_EQ(uids, (std::set<int64_t>{kOther, kNobody}));
}

// Issue 31.10: another user's daemons claiming a job under ever new node names added one
// join_refused event each, without bound. Now at most 16 per job are recorded, then one
// join_refused_suppressed.
TEST(CoordSecurity, RefusedJoinsAreBoundedPerJob) {
  SharedDir dir;
  CoordBin coord(dir.path, {"--heartbeat-interval", "0.2", "--heartbeat-timeout", "60"});
  auto client = coord.client();
  // Read here: the child runs as nobody, who may not read the checkout (a 0700 home).
  const std::string spec = test_spec(1, 0, 1, 1);
  std::string submitted = as_nobody([&] {
    Client c(ClientOptions{coord.ep, 10000ms, "", "", ""});
    return std::to_string(c.submit(spec).job);
  });
  ASSERT_EQ(submitted.find_first_not_of("0123456789"), std::string::npos) << submitted;
  const int64_t job = std::stoll(submitted);
  std::string done = as_uid(kOther, [&] {
    for (int i = 0; i < 40; ++i) {
      SimDaemon d(coord.ep, "flood-" + std::to_string(i));
      d.register_jobs({{job, 0, 0}});
    }
    return std::string("ok");
  });
  ASSERT_EQ(done, "ok");
  int refused = 0, suppressed = 0;
  for (const auto& e : client.events(job, 0, 1000)) {
    refused += e.kind == "join_refused";
    suppressed += e.kind == "join_refused_suppressed";
  }
  EXPECT_EQ(refused, 16);
  EXPECT_EQ(suppressed, 1);
}

// A newline in a string a peer sends (here a node name, quoted by the parse error) cannot start
// a line of its own in ring-coord's log: it is escaped, and the whole message stays one line.
TEST(CoordSecurity, PeerStringsCannotForgeLogLines) {
  SharedDir dir;
  CoordBin coord(dir.path, {});
  const std::string forged = "2026-12-02 03:00:00.000] [coord] [error] forged by a peer";
  as_nobody([&] {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(coord.ep);
    nlohmann::json reg = {
        {"v", 1}, {"type", "register"}, {"node", "n0\n" + forged}, {"ringd_version", "x\r\x1b[2J"}};
    s.send(zmq::buffer(reg.dump()));
    zmq::message_t reply;
    s.set(zmq::sockopt::rcvtimeo, 10000);
    (void)s.recv(reply);
    return std::string();
  });
  std::string log;
  ASSERT_TRUE(wait_for(
      [&] {
        log = read_text(coord.log);
        return log.find("forged by a peer") != std::string::npos;
      },
      30s));
  std::istringstream lines(log);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    if (line.find("forged by a peer") == std::string::npos) continue;
    ++n;
    EXPECT_EQ(line.rfind("[20", 0), 0u) << "a line that is not ours: " << line;
    EXPECT_NE(line.find("rejected message from uid 65534"), std::string::npos) << line;
    EXPECT_NE(line.find("n0\\n2026-12-02"), std::string::npos) << line;
  }
  EXPECT_EQ(n, 1) << log;
  EXPECT_EQ(log.find('\x1b'), std::string::npos);
}

// Option values that used to pass (NaN, ports above 65535, unknown log levels) are usage errors
// naming the flag and the rule.
TEST(CoordSecurity, BadOptionsAreUsageErrors) {
  SharedDir dir;
  // Bounded: a ring-coord that accepts a bad value starts serving instead of exiting.
  const std::string base = "timeout 10 " + kCoordBin + " --state-dir " + dir.path +
                           "/state --endpoint ipc://" + dir.path + "/sock/coord.sock ";
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      // The rule every program's seconds follow (common/cli/cli11_flags.h): decimal text only.
      {"--heartbeat-timeout nan", "--heartbeat-timeout: expected seconds in [0.05, 86400], got 'nan'"},
      {"--heartbeat-timeout inf", "expected seconds in [0.05, 86400], got 'inf'"},
      {"--heartbeat-timeout -1", "expected seconds in [0.05, 86400], got '-1'"},
      {"--heartbeat-timeout 0", "expected seconds in [0.05, 86400], got '0'"},
      {"--heartbeat-timeout 10x", "expected seconds in [0.05, 86400], got '10x'"},
      {"--heartbeat-timeout 0x10", "expected seconds in [0.05, 86400], got '0x10'"},
      {"--heartbeat-interval nan", "--heartbeat-interval: expected seconds in [0.01, 3600], got 'nan'"},
      {"--heartbeat-interval 5 --heartbeat-timeout 5",
       "--heartbeat-interval (5 s) must be less than --heartbeat-timeout (5 s)"},
      {"--endpoint tcp://127.0.0.1:99999", "port '99999' is not a TCP port (0..65535"},
      {"--endpoint tcp://127.0.0.1:-1", "port '-1' is not a TCP port"},
      {"--endpoint tcp://127.0.0.1", "needs HOST:PORT"},
      {"--endpoint tcp://:5555", "needs a host"},
      {"--endpoint ipc://relative/coord.sock", "needs an absolute path"},
      {"--endpoint udp://127.0.0.1:5", "expected ipc://PATH or tcp://HOST:PORT, got 'udp://127.0.0.1:5'"},
      {"--log-level bogus", "bogus"},
      {"--admin-uid -1", "'-1' is not a uid"},
      {"--admin-uid 4294967295", "is not a uid"},
      {"--sync sometimes", "sometimes"},
      {"--state-dir ''", "must not be empty"},
  };
  for (const auto& c : cases) {
    auto r = ring::test::run(base + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << ": " << r.output;
    std::string flag = c.args.substr(0, c.args.find(' '));
    EXPECT_NE(r.output.find(flag), std::string::npos) << c.args << ": " << r.output;
    EXPECT_EQ(r.output.find("listening on"), std::string::npos) << c.args << ": " << r.output;
  }
  auto r = ring::test::run(base + "--log-level bogus");
  EXPECT_NE(r.output.find("trace"), std::string::npos) << r.output;  // names the allowed values
}

// `ringctl run` killed with kill -9 together with its ringd (what happened before ringd outlived
// its terminal; also a node crash): the job used to go restarting, then stay "starting" for ever
// with no daemon. Now it fails as abandoned within about a heartbeat timeout of its last daemon's
// loss (plus the restart delay).
TEST(CoordSecurity, AJobWhoseRingctlRunWasKilledDoesNotStayStarting) {
  SharedDir dir;
  CoordBin coord(dir.path, {"--heartbeat-interval", "0.5", "--heartbeat-timeout", "3"});
  std::string spec = read_text(std::string(RING_SOURCE_DIR) + "/tests/cli/run_tiny.yaml");
  spec.replace(spec.find("  steps: 4"), 10, "  steps: 100000");
  spec.replace(spec.find("  max_restarts: 0"), 17,
               "  max_restarts: 3\n  backoff_s: 0.5\n  backoff_max_s: 1");
  std::string spec_file = dir.path + "/spec.yaml";
  std::ofstream(spec_file) << spec;
  std::string job_dir = dir.path + "/job";
  ring::test::Proc run({kRingctlBin, "run", spec_file, "--coord", coord.ep, "--job-dir", job_dir},
                       dir.path + "/run.out", dir.path + "/run.out");
  auto client = coord.client();
  ASSERT_TRUE(wait_for(
      [&] {
        auto jobs = client.status();
        return !jobs.empty() && jobs.back().state == "running" && jobs.back().step >= 2;
      },
      120s))
      << read_text(dir.path + "/run.out");
  int64_t job = client.status().back().job;
  // ringctl and its ringd die at once (ringd has its own process group).
  std::vector<pid_t> ringds;
  for (pid_t p : ring::test::processes_mentioning(job_dir))
    if (ring::test::alive(p, "ringd")) ringds.push_back(p);
  ASSERT_FALSE(ringds.empty());
  run.kill9();
  for (pid_t p : ringds) kill(p, SIGKILL);

  ASSERT_TRUE(wait_for([&] { return client.status(job).state == "failed"; }, 90s))
      << client.status(job).state << ": " << client.status(job).state_reason;
  auto st = client.status(job);
  EXPECT_NE(st.state_reason.find("abandoned: no daemon has served attempt"), std::string::npos)
      << st.state_reason;
  bool event = false;
  for (const auto& e : client.events(job, 0, 1000)) event = event || e.kind == "abandoned";
  EXPECT_TRUE(event);
  // Leave nothing behind (workers die with their ringd; this only cleans up after a failure).
  if (!ring::test::wait_for_no_processes(job_dir, 30))
    for (pid_t p : ring::test::processes_mentioning(job_dir)) kill(p, SIGKILL);
}
