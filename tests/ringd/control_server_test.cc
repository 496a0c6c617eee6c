// ringd's control server (daemon/ringd/control_server.h) alone: a real Unix socket, a client in
// the test, no workers. Lines become parsed messages; broken lines (not JSON, a malformed field,
// a handler's refusal, an overlong line) close only their connection with the rule named; writes
// are queued and a peer that does not read fails past the limit.
#include "daemon/ringd/control_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/test_proc.h"
#include "tests/ringd/socket_util.h"

namespace {

namespace asio = boost::asio;
using ring::ringd::ConnPtr;
using ring::ringd::ControlServer;
namespace ctl = ring::contract::control;

struct Recorder {
  std::vector<ctl::WorkerMessage> messages;
  std::vector<std::string> errors;
  ConnPtr last;
};

// Runs the loop until `done` or 20 s.
template <typename F>
bool run_until(asio::io_context& io, F done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < end) {
    io.restart();
    io.run_for(std::chrono::milliseconds(20));
  }
  return done();
}

struct Fixture {
  ring::test::TempDir dir{"control-server"};
  asio::io_context io;
  Recorder rec;
  std::string path = dir.path + "/ctl.sock";
  ControlServer server;

  explicit Fixture(size_t max_line = ControlServer::kMaxLine,
                   size_t max_queued = ControlServer::kMaxQueued)
      : server(io,
               {[this](const ConnPtr& c, const ctl::WorkerMessage& m) {
                  rec.last = c;
                  if (std::holds_alternative<ctl::Init>(m))
                    throw ring::ringd::ProtocolError("init is refused here");
                  if (const auto* h = std::get_if<ctl::Hello>(&m)) c->local = static_cast<int>(h->local);
                  rec.messages.push_back(m);
                },
                [this](const ConnPtr&, const std::string& what) { rec.errors.push_back(what); }},
               max_line, max_queued) {
    server.listen(path);
  }
};

const std::string kHello = R"({"t":"hello","rank":0,"local":0,"pid":1,"n":10,"proto":)" +
                           std::to_string(ring::contract::control::kProtocolVersion) + "}";

TEST(ControlServer, LinesBecomeMessagesAndRepliesArrive) {
  Fixture f;
  const int fd = ring::test::connect_unix(f.path);
  ASSERT_GE(fd, 0);
  ring::test::send_all(fd, kHello + "\n" + R"({"t":"mapped"})" + "\n" + R"({"t":"hb"})" + "\n");
  ASSERT_TRUE(run_until(f.io, [&] { return f.rec.messages.size() == 3; }));
  EXPECT_TRUE(std::holds_alternative<ctl::Hello>(f.rec.messages[0]));
  EXPECT_TRUE(std::holds_alternative<ctl::Mapped>(f.rec.messages[1]));
  EXPECT_TRUE(std::holds_alternative<ctl::Heartbeat>(f.rec.messages[2]));
  EXPECT_TRUE(f.rec.errors.empty());
  pid_t pid = 0;
  uid_t uid = 0;
  ASSERT_TRUE(ControlServer::peer(f.rec.last, &pid, &uid));
  EXPECT_EQ(pid, getpid());
  EXPECT_EQ(uid, geteuid());
  // send() reaches the connection that said hello as local 0; local 5 is nobody.
  f.server.send(5, {{"t", "stop"}});
  f.server.send(0, {{"t", "stop"}, {"reason", "done"}});
  std::string got;
  ASSERT_TRUE(run_until(f.io, [&] {
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    return got.find('\n') != std::string::npos;
  }));
  EXPECT_EQ(got, "{\"reason\":\"done\",\"t\":\"stop\"}\n");
  ::close(fd);
}

TEST(ControlServer, BrokenLinesCloseOnlyTheirConnection) {
  Fixture f;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "sent a message that is not a JSON object: not json"},
      {"[1,2]", "sent a message that is not a JSON object"},
      {R"({"t":"hello","rank":"zero","local":0,"pid":1,"n":10,"proto":1})", "sent a malformed message: "},
      {R"({"t":"init"})", "sent a malformed 'init' message: init is refused here"},
  };
  const int good = ring::test::connect_unix(f.path);
  for (const auto& [line, want] : cases) {
    const size_t before = f.rec.errors.size();
    const int fd = ring::test::connect_unix(f.path);
    ASSERT_GE(fd, 0);
    ring::test::send_all(fd, line + "\n");
    ASSERT_TRUE(run_until(f.io, [&] { return f.rec.errors.size() == before + 1; })) << line;
    EXPECT_EQ(f.rec.errors.back().rfind(want, 0), 0u) << f.rec.errors.back();
    // The server closed it: the client reads end of file.
    char c;
    ASSERT_TRUE(run_until(f.io, [&] { return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0; })) << line;
    ::close(fd);
  }
  // The other connection goes on.
  ring::test::send_all(good, R"({"t":"hb"})" "\n");
  ASSERT_TRUE(run_until(f.io, [&] { return f.rec.messages.size() == 1; }));
  ::close(good);
}

TEST(ControlServer, OverlongLineIsAProtocolError) {
  Fixture f(/*max_line=*/4096);
  const int fd = ring::test::connect_unix(f.path);
  ring::test::send_all(fd, std::string(5000, 'x'));
  ASSERT_TRUE(run_until(f.io, [&] { return f.rec.errors.size() == 1; }));
  EXPECT_EQ(f.rec.errors[0], "sent a control message longer than the 4096 byte limit");
  ::close(fd);
}

TEST(ControlServer, PeerThatDoesNotReadFailsPastTheQueueLimit) {
  Fixture f(ControlServer::kMaxLine, /*max_queued=*/64 << 10);
  const int fd = ring::test::connect_unix(f.path);
  ring::test::send_all(fd, kHello + "\n");
  ASSERT_TRUE(run_until(f.io, [&] { return f.rec.messages.size() == 1; }));
  // The client never reads: the socket buffer fills, then the queue.
  const nlohmann::json big = {{"t", "params"}, {"pad", std::string(8192, 'p')}};
  for (int i = 0; i < 4096 && f.rec.errors.empty(); ++i) {
    f.server.send(0, big);
    f.io.restart();
    f.io.poll();
  }
  ASSERT_EQ(f.rec.errors.size(), 1u);
  EXPECT_EQ(f.rec.errors[0].rfind("does not read its control socket (", 0), 0u) << f.rec.errors[0];
  EXPECT_EQ(f.server.connections(), 0u);
  ::close(fd);
}

TEST(ControlServer, StopEndsAcceptingAndCloseAllDropsConnections) {
  Fixture f;
  const int fd = ring::test::connect_unix(f.path);
  ring::test::send_all(fd, kHello + "\n");
  ASSERT_TRUE(run_until(f.io, [&] { return f.server.connections() == 1; }));
  f.server.close_all();
  EXPECT_EQ(f.server.connections(), 0u);
  char c;
  ASSERT_TRUE(run_until(f.io, [&] { return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0; }));
  ::close(fd);
  f.server.stop();
  f.io.restart();
  f.io.poll();
  EXPECT_LT(ring::test::connect_unix(f.path), 0);
}

}  // namespace
