// ring-coord as a real process: another Unix user is refused, CURVE over tcp, and kill -9 with
// daemons that keep sending.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "../common/run.h"
#include "tests/common/test_proc.h"
#include "coord_test_util.h"
#include "coordinator/security.h"
#include "coordinator/store.h"

using namespace ring::coord;
using namespace ring::coord::test;

namespace {

const std::string kCoordBin = std::string(RING_BINARY_DIR) + "/coordinator/ring-coord";
const std::string kClientBin =
    std::string(RING_BINARY_DIR) + "/tests/coordinator/coord_test_client";
constexpr uid_t kNobody = 65534;

// A ring-coord child process; its output goes to <dir>/coord.log.
class CoordProcess {
 public:
  CoordProcess(std::string dir, std::vector<std::string> args)
      : dir_(std::move(dir)), args_(std::move(args)) {}
  ~CoordProcess() { kill_now(SIGKILL); }
  // Set in the child's environment (empty value: unset).
  void set_env(std::string name, std::string value) { env_.emplace_back(name, value); }
  void start() {
    log_ = dir_ + "/coord.log";
    std::vector<std::string> argv{kCoordBin};
    argv.insert(argv.end(), args_.begin(), args_.end());
    ring::test::ProcOptions po;
    for (const auto& [k, v] : env_) {
      if (v.empty())
        po.unset_env.push_back(k);
      else
        po.set_env.emplace_back(k, v);
    }
    pid_ = ring::test::start_logged(argv, log_, po);
  }
  // Waits for "listening on" lines; returns the log.
  std::string wait_ready(int listeners = 1) {
    std::string text;
    wait_for(
        [&] {
          text = read_text(log_);
          size_t n = 0, p = 0;
          while ((p = text.find("listening on", p)) != std::string::npos) ++n, ++p;
          return n >= static_cast<size_t>(listeners) && text.find("state in") != std::string::npos;
        },
        10s);
    return text;
  }
  void kill_now(int sig) {
    if (pid_ > 0) {
      ::kill(pid_, sig);
      int st;
      waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }
  int wait_exit() {
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  const std::string& log() const { return log_; }

 private:
  std::string dir_;
  std::vector<std::string> args_;
  std::vector<std::pair<std::string, std::string>> env_;
  std::string log_;
  pid_t pid_ = -1;
};

ring::test::RunResult client_as(uid_t uid, const std::string& endpoint, const std::string& cmd,
                                const std::string& arg) {
  return ring::test::run(kClientBin + " " + endpoint + " --as-uid " + std::to_string(uid) + " " +
                         cmd + " " + arg);
}

}  // namespace

TEST(CoordProcess, AnotherUserIsRefused) {
  std::string dir = make_temp_dir("owner");
  chmod(dir.c_str(), 0711);  // nobody must reach the (shared) socket directory
  std::string ep = "ipc://" + dir + "/sock/coord.sock";
  CoordProcess coord(dir, {"--state-dir", dir + "/state", "--endpoint", ep, "--socket-mode",
                           "shared", "--sync", "normal"});
  coord.start();
  coord.wait_ready();
  std::string spec_file = dir + "/spec.yaml";
  {
    std::ofstream(spec_file) << test_spec(1, 1, 1, 1);
    chmod(spec_file.c_str(), 0644);
  }
  Client root(ClientOptions{ep, 3000ms, "", "", ""});
  int64_t roots = root.submit(test_spec(1, 1, 1, 1)).job;

  // nobody submits its own job: owned by uid 65534, taken from the connection.
  auto sub = client_as(kNobody, ep, "submit", spec_file);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  int64_t theirs = root.status().back().job;
  EXPECT_NE(theirs, roots);
  EXPECT_EQ(root.status(theirs).owner_uid, kNobody);
  EXPECT_EQ(root.status(theirs).owner, "nobody");

  // nobody may not cancel or restart root's job...
  auto c = client_as(kNobody, ep, "cancel", std::to_string(roots));
  EXPECT_EQ(c.exit_code, 3) << c.output;
  EXPECT_NE(c.output.find("error permission_denied: job " + std::to_string(roots) +
                          " belongs to root (uid 0); nobody (uid 65534) may not cancel it"),
            std::string::npos)
      << c.output;
  auto r = client_as(kNobody, ep, "restart", std::to_string(roots));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("permission_denied"), std::string::npos);
  EXPECT_EQ(root.status(roots).state, "pending");
  // ... but may read status and cancel its own.
  EXPECT_EQ(client_as(kNobody, ep, "status", std::to_string(roots)).exit_code, 0);
  auto own = client_as(kNobody, ep, "cancel", std::to_string(theirs));
  EXPECT_EQ(own.exit_code, 0) << own.output;
  EXPECT_EQ(root.status(theirs).state, "cancelled");
  // root (admin) may cancel anyone's job.
  int64_t another = root.status().back().job;
  (void)another;
  auto sub2 = client_as(kNobody, ep, "submit", spec_file);
  ASSERT_EQ(sub2.exit_code, 0);
  int64_t theirs2 = root.status().back().job;
  EXPECT_EQ(root.cancel(theirs2).state, "cancelled");
  coord.kill_now(SIGTERM);
  std::filesystem::remove_all(dir);
}

// Without --endpoint, ring-coord listens where ringctl looks: $RING_COORD; --endpoint wins; a
// malformed $RING_COORD is a usage error naming the variable.
TEST(CoordProcess, EndpointFromRingCoordEnvironment) {
  std::string dir = make_temp_dir("envep");
  std::string ep = "ipc://" + dir + "/sock/env.sock";
  // Each ring-coord logs to its own <run>/coord.log.
  for (const char* run : {"/a", "/b", "/c"}) mkdir((dir + run).c_str(), 0700);
  {
    CoordProcess coord(dir + "/a", {"--state-dir", dir + "/state", "--sync", "normal"});
    coord.set_env("RING_COORD", ep);
    coord.start();
    std::string log = coord.wait_ready();
    EXPECT_NE(log.find("listening on " + ep), std::string::npos) << log;
    Client c(ClientOptions{ep, 3000ms, "", "", ""});
    EXPECT_TRUE(c.status().empty());
    coord.kill_now(SIGTERM);
  }
  {
    std::string flag_ep = "ipc://" + dir + "/sock/flag.sock";
    CoordProcess coord(dir + "/b",
                       {"--state-dir", dir + "/state", "--sync", "normal", "--endpoint", flag_ep});
    coord.set_env("RING_COORD", ep);
    coord.start();
    std::string log = coord.wait_ready();
    EXPECT_NE(log.find("listening on " + flag_ep), std::string::npos) << log;
    EXPECT_EQ(log.find("env.sock"), std::string::npos) << log;
    coord.kill_now(SIGTERM);
  }
  {
    CoordProcess coord(dir + "/c", {"--state-dir", dir + "/state"});
    coord.set_env("RING_COORD", "ipc://relative/coord.sock");
    coord.start();
    EXPECT_EQ(coord.wait_exit(), 2);
    std::string log = read_text(coord.log());
    EXPECT_NE(log.find("$RING_COORD 'ipc://relative/coord.sock'"), std::string::npos) << log;
  }
  {
    auto help = ring::test::run(kCoordBin + " --help");
    EXPECT_NE(help.output.find("$RING_COORD"), std::string::npos) << help.output;
  }
  std::filesystem::remove_all(dir);
}

TEST(CoordProcess, PrivateSocketRefusesOtherUsers) {
  std::string dir = make_temp_dir("private");
  chmod(dir.c_str(), 0711);
  std::string ep = "ipc://" + dir + "/sock/coord.sock";
  CoordProcess coord(dir, {"--state-dir", dir + "/state", "--endpoint", ep, "--sync", "normal"});
  coord.start();
  coord.wait_ready();
  struct stat st;
  ASSERT_EQ(stat((dir + "/sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto r = client_as(kNobody, ep, "status", "1");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("permission denied"), std::string::npos) << r.output;
  coord.kill_now(SIGTERM);
  std::filesystem::remove_all(dir);
}

// Issue 31.9: another user holding the HTTP port stopped ring-coord from starting at all, and
// its address file sent scrapers there. Now only the web part fails, the log names the holder,
// and the address file names no endpoint.
TEST(CoordProcess, AnotherUsersPortFailsOnlyTheWebPart) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a listener as nobody";
  std::string dir = make_temp_dir("port");
  chmod(dir.c_str(), 0711);
  const std::string port_file = dir + "/port";
  ring::test::ProcOptions po;
  const pid_t holder = ring::test::start_logged(
      {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
       "-c",
       "import socket,sys,time\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(1)\n"
       "print(s.getsockname()[1], flush=True)\ntime.sleep(120)"},
      port_file, po);
  std::string port;
  ASSERT_TRUE(wait_for([&] {
    port = read_text(port_file);
    return !port.empty() && port.back() == '\n';
  }, 30s)) << port;
  port.pop_back();
  std::string ep = "ipc://" + dir + "/sock/coord.sock";
  CoordProcess coord(dir, {"--state-dir", dir + "/state", "--endpoint", ep, "--sync", "normal",
                           "--http", "127.0.0.1:" + port});
  coord.start();
  const std::string log = coord.wait_ready();
  EXPECT_NE(log.find("web endpoint not started"), std::string::npos) << log;
  EXPECT_NE(log.find("port " + port + " is held by uid 65534 (nobody)"), std::string::npos) << log;
  auto r = ring::test::run(kClientBin + " " + ep + " status 1");
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;  // it answers
  EXPECT_EQ(read_text(dir + "/state/http"), "\n");
  coord.kill_now(SIGTERM);
  ::kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  std::filesystem::remove_all(dir);
}

TEST(CoordProcess, RefusesToStartOnAnUnsafeDirectory) {
  std::string dir = make_temp_dir("unsafe");
  mkdir((dir + "/sock").c_str(), 0777);
  chmod((dir + "/sock").c_str(), 0777);
  CoordProcess coord(
      dir, {"--state-dir", dir + "/state", "--endpoint", "ipc://" + dir + "/sock/coord.sock"});
  coord.start();
  EXPECT_EQ(coord.wait_exit(), 1);
  std::string log = read_text(coord.log());
  EXPECT_NE(log.find("has mode 0777"), std::string::npos) << log;
  std::filesystem::remove_all(dir);
}

TEST(CoordProcess, CurveOverTcp) {
  std::string dir = make_temp_dir("curve");
  chmod(dir.c_str(), 0711);
  CoordProcess coord(
      dir, {"--state-dir", dir + "/state", "--endpoint", "tcp://127.0.0.1:*", "--sync", "normal"});
  coord.start();
  std::string log = coord.wait_ready();
  const std::string tag = "ring-coord: listening on ";
  auto p = log.find(tag + "tcp://");
  ASSERT_NE(p, std::string::npos) << log;
  std::string ep = log.substr(p + tag.size(), log.find('\n', p) - p - tag.size());
  // The key pair: secret 0600, public readable; the public key is what clients need.
  struct stat st;
  ASSERT_EQ(stat((dir + "/state/curve/server.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string server_pub = read_public_key(dir + "/state/curve/server.pub");
  EXPECT_NE(log.find(server_pub), std::string::npos);

  // A client whose key is not authorized never gets through.
  auto keys = load_or_create_curve_keys(dir + "/client", "client");
  chmod((dir + "/client").c_str(), 0755);
  chown((dir + "/client/client.key").c_str(), kNobody, kNobody);
  // The state directory is private: hand the public key to the client as a readable copy.
  std::filesystem::copy_file(dir + "/state/curve/server.pub", dir + "/client/server.pub");
  std::string curve = " --curve " + dir + "/client/server.pub " + dir + "/client/client.key";
  auto spec_file = dir + "/spec.yaml";
  std::ofstream(spec_file) << test_spec(1, 1, 1, 1);
  chmod(spec_file.c_str(), 0644);
  auto r =
      ring::test::run(kClientBin + " " + ep + " --as-uid 65534" + curve + " submit " + spec_file);
  EXPECT_EQ(r.exit_code, 5) << r.output;
  // Authorized as uid 65534: the job belongs to that uid.
  std::ofstream(dir + "/state/curve/clients") << "# key uid\n" << keys.public_key << " 65534\n";
  r = ring::test::run(kClientBin + " " + ep + " --as-uid 65534" + curve + " submit " + spec_file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto st2 = ring::test::run(kClientBin + " " + ep + " --as-uid 65534" + curve + " status 1");
  EXPECT_NE(st2.output.find("\"owner_uid\":65534"), std::string::npos) << st2.output;
  // A client that does not know the server key cannot connect either.
  ClientOptions wrong{ep, 1000ms, keys.public_key, keys.public_key, keys.secret_key};
  Client c(wrong);
  EXPECT_THROW(c.status(), TimeoutError);
  coord.kill_now(SIGTERM);
  std::filesystem::remove_all(dir);
}

// kill -9 while daemons train and clients submit: nothing committed is lost, daemons keep
// sending through the outage and reconnect, the job's state is right afterwards.
TEST(CoordProcess, KillDashNineLosesNothingCommitted) {
  std::string dir = make_temp_dir("kill9");
  std::string ep = "ipc://" + dir + "/sock/coord.sock";
  std::vector<std::string> args{
      "--state-dir",          dir + "/state", "--endpoint",          ep,
      "--heartbeat-interval", "0.1",          "--heartbeat-timeout", "30"};
  auto coord = std::make_unique<CoordProcess>(dir, args);
  coord->start();
  coord->wait_ready();
  Client client(ClientOptions{ep, 3000ms, "", "", ""});
  int64_t job = client.submit(test_spec(2, 2, 0.5, 2)).job;
  SimDaemon a(ep, "a"), b(ep, "b");
  a.register_jobs({{job, 0, 0}});
  b.register_jobs({{job, 0, 0}});
  int64_t step = 0;
  auto train = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      ++step;
      for (auto* d : {&a, &b}) {
        d->step(job, 1, step, 5.0 / step);
        d->link().heartbeat({{job, 1, step}});
        while (auto m = d->link().recv(1ms)) d->inbox.push_back(*m);
      }
      if (step % 10 == 0) {
        a.checkpoint(job, 1, step);
        b.checkpoint(job, 1, step);
      }
      std::this_thread::sleep_for(20ms);
    }
  };
  train(30);
  ASSERT_TRUE(wait_for([&] { return client.status(job).last_checkpoint_step == 30; }));
  // Submissions acknowledged right before the kill.
  std::vector<int64_t> acked;
  for (int i = 0; i < 20; ++i) acked.push_back(client.submit(test_spec(1, 0, 1, 1)).job);
  auto before = client.events(job, 0, 1000);

  coord->kill_now(SIGKILL);
  train(20);  // the daemons keep training and sending while the coordinator is gone
  coord = std::make_unique<CoordProcess>(dir, args);
  coord->start();
  coord->wait_ready();
  train(20);
  Client again(ClientOptions{ep, 3000ms, "", "", ""});
  // Checkpoint 70 of both nodes is the last thing each daemon sent: once the coordinator has it,
  // it has processed every earlier message of theirs (one connection each, in order).
  ASSERT_TRUE(wait_for(
      [&] {
        auto s = again.status(job);
        return s.step >= 70 && s.last_checkpoint_step == 70;
      },
      10s))
      << again.status(job).step;
  auto st = again.status(job);
  EXPECT_EQ(st.state, "running");
  EXPECT_EQ(st.attempt, 1);
  EXPECT_EQ(st.restarts, 0);
  EXPECT_EQ(st.last_checkpoint_step, 70);
  EXPECT_EQ(st.nodes, (std::vector<std::string>{"a", "b"}));
  for (int64_t id : acked) EXPECT_EQ(again.status(id).state, "pending") << id;
  auto after = again.events(job, 0, 1000);
  ASSERT_GE(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(after[i].id, before[i].id);
  // Both nodes are up (they heartbeat through the restart) and the job was never rolled back.
  for (const auto& n : again.nodes()) EXPECT_EQ(n.state, "up") << n.name;
  for (const auto& e : after) EXPECT_NE(e.kind, "restart_scheduled");
  // A step report sent while the coordinator was down and queued by the daemon's socket
  // reaches the new coordinator.
  coord->kill_now(SIGTERM);
  Store db(dir + "/state/coord.db", {false, 0});
  EXPECT_GE(db.count("step_metrics"), 2 * 60);
  std::filesystem::remove_all(dir);
}
