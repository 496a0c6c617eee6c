// The pieces transport plugins share: liveness of a local peer, the C ABI exception guard, the
// config struct_size rule and the communicator base.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "plugins/transport/common/rendezvous.h"

// The test's own comm type: the guard writes last_error of the comm it is given.
struct ring_transport_comm {
  std::string last_error;
};

#include "plugins/transport/common/no_throw.h"
#include "plugins/transport/common/plugin_base.h"

namespace ring::transport {
namespace {

// A child that reports its identity and then waits for a byte on `release` before exiting.
struct Child {
  pid_t pid = -1;
  int release = -1;
  PeerIdentity id;
};

Child start_child() {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) throw std::runtime_error("pipe failed");
  Child c;
  c.pid = fork();
  if (c.pid == 0) {
    PeerIdentity me = self_identity(1, 2);
    ssize_t w = write(up[1], &me.start_time, sizeof(me.start_time));
    char b;
    ssize_t r = read(down[0], &b, 1);
    _exit(w == sizeof(me.start_time) && r >= 0 ? 0 : 1);
  }
  close(up[1]);
  close(down[0]);
  c.id = self_identity(0, 2);
  c.id.rank = 1;
  c.id.pid = c.pid;
  if (read(up[0], &c.id.start_time, sizeof(c.id.start_time)) != sizeof(c.id.start_time))
    throw std::runtime_error("child did not report its start time");
  close(up[0]);
  c.release = down[1];
  return c;
}

TEST(PeerLiveness, RunningExitedAndReusedPids) {
  const PeerIdentity self = self_identity(0, 2);
  Child c = start_child();
  EXPECT_TRUE(local_peer_alive(self, c.id));
  PeerIdentity reused = c.id;
  reused.start_time += 1;  // the same pid started at another time: a different process
  EXPECT_FALSE(local_peer_alive(self, reused));
  ASSERT_EQ(write(c.release, "x", 1), 1);
  close(c.release);
  // Exited but not reaped: a zombie is not alive.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, c.pid, &info, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(local_peer_alive(self, c.id));
  int status = 0;
  ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
  EXPECT_FALSE(local_peer_alive(self, c.id));
  // Another host's peer cannot be checked here: assumed alive.
  PeerIdentity remote = c.id;
  remote.host = "elsewhere";
  EXPECT_TRUE(local_peer_alive(self, remote));
}

// Checking a peer while it exits and is reaped must answer, never throw: reading /proc/<pid>/stat
// of a process reaped after the open fails with ESRCH (once seen in CI as an exception from the
// plugin: "basic_filebuf::underflow error reading the file: No such process").
TEST(PeerLiveness, CheckingAPeerWhileItIsReapedNeverThrows) {
  const PeerIdentity self = self_identity(0, 2);
  for (int i = 0; i < 100; ++i) {
    Child c = start_child();
    std::atomic<bool> stop{false};
    std::atomic<long> checks{0};
    std::string error;
    std::thread checker([&] {
      try {
        while (!stop.load()) {
          if (!local_peer_alive(self, c.id)) break;
          checks.fetch_add(1);
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    ASSERT_EQ(write(c.release, "x", 1), 1);
    close(c.release);
    int status = 0;
    ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
    // Gone now, so the checker must see it as dead.
    checker.join();
    ASSERT_EQ(error, "") << "child " << i;
    EXPECT_FALSE(local_peer_alive(self, c.id));
  }
}

std::string g_thread_error;
void set_error(std::string m) { g_thread_error = std::move(m); }

ring_transport_status_t throws_runtime(ring_transport_comm_t* c, int) {
  if (c) throw std::runtime_error("boom");
  throw 42;
}
ring_transport_status_t returns_timeout(ring_transport_comm_t*, int) {
  return RING_TRANSPORT_ERR_TIMEOUT;
}
ring_transport_status_t probe_throws(char*, size_t) { throw std::bad_alloc(); }

TEST(NoThrowGuard, ExceptionsBecomeInternalErrorsWithTheirText) {
  ring_transport_comm comm;
  auto f = &NoThrow<set_error, throws_runtime>::call;
  static_assert(noexcept(f(nullptr, 0)));
  EXPECT_EQ(f(&comm, 1), RING_TRANSPORT_ERR_INTERNAL);
  EXPECT_NE(comm.last_error.find("boom"), std::string::npos) << comm.last_error;
  EXPECT_NE(comm.last_error.find("exception inside the plugin"), std::string::npos);

  g_thread_error.clear();
  EXPECT_EQ(f(nullptr, 1), RING_TRANSPORT_ERR_INTERNAL);  // no comm: the thread's error
  EXPECT_NE(g_thread_error.find("unknown exception"), std::string::npos) << g_thread_error;

  g_thread_error.clear();
  char reason[8];
  EXPECT_EQ((NoThrow<set_error, probe_throws>::call(reason, sizeof reason)),
            RING_TRANSPORT_ERR_INTERNAL);
  EXPECT_NE(g_thread_error.find("bad_alloc"), std::string::npos) << g_thread_error;

  comm.last_error.clear();
  EXPECT_EQ((NoThrow<set_error, returns_timeout>::call(&comm, 0)), RING_TRANSPORT_ERR_TIMEOUT);
  EXPECT_EQ(comm.last_error, "");  // a status passes through untouched
}

ring_transport_config_t config_of(int rank, int world_size) {
  ring_transport_config_t c{};
  c.rank = rank;
  c.world_size = world_size;
  return c;
}

// struct_size 0 is the first layout; a caller's size below it is refused by name; a newer
// caller's larger struct is read up to what the plugin knows.
TEST(PluginConfig, StructSizeRule) {
  ring_transport_config_t out;
  ring_transport_config_t zero = config_of(1, 2);
  zero.op_timeout_ms = 7;
  ASSERT_TRUE(read_config("x", &zero, 4, &out).ok());
  EXPECT_EQ(out.rank, 1);
  EXPECT_EQ(out.op_timeout_ms, 7);
  EXPECT_EQ(out.struct_size, sizeof(ring_transport_config_t));

  struct {
    ring_transport_config_t known;
    int later_member;
  } newer{};
  newer.known = zero;
  newer.known.struct_size = sizeof(newer);
  newer.later_member = 99;
  ASSERT_TRUE(read_config("x", &newer.known, 4, &out).ok());
  EXPECT_EQ(out.op_timeout_ms, 7);

  ring_transport_config_t small = zero;
  small.struct_size = 8;
  Result r = read_config("x", &small, 4, &out);
  EXPECT_EQ(r.status, RING_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.message.find("x init: config struct_size 8 is smaller than the first layout"),
            std::string::npos)
      << r.message;

  r = read_config("x", nullptr, 4, &out);
  EXPECT_EQ(r.message, "x init: config is NULL");
  zero.world_size = 5;
  r = read_config("x", &zero, 4, &out);
  EXPECT_EQ(r.status, RING_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.message.find("rank 1 of world size 5 is out of range (world size 1..4)"),
            std::string::npos)
      << r.message;
}

TEST(PluginComm, ConnectListAndTimeouts) {
  CommBase c;
  ring_transport_config_t cfg = config_of(2, 4);
  cfg.bootstrap_timeout_ms = 5;
  c.configure("x", cfg);
  EXPECT_EQ(c.who(), "x rank 2");
  EXPECT_EQ(c.bootstrap_timeout_ms, 5);
  EXPECT_EQ(c.op_timeout_ms, kDefaultTimeoutMs);
  EXPECT_EQ(c.timeout(0), kDefaultTimeoutMs);
  EXPECT_EQ(c.timeout(3), 3);

  std::vector<int> list;
  ASSERT_TRUE(c.connect_list(nullptr, 0, &list).ok());
  EXPECT_EQ(list, (std::vector<int>{0, 1, 2, 3}));
  const int peers[] = {3, 1, 3};
  ASSERT_TRUE(c.connect_list(peers, 3, &list).ok());
  EXPECT_EQ(list, (std::vector<int>{1, 3}));
  const int bad[] = {1, 4};
  Result r = c.connect_list(bad, 2, &list);
  EXPECT_EQ(r.status, RING_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(r.message, "x rank 2: connect to rank 4 of 4");
  EXPECT_EQ(c.connect_list(nullptr, 2, &list).status, RING_TRANSPORT_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace ring::transport
