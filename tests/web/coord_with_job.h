// A ring-coord process with the web endpoint (--http 127.0.0.1:0) in a temporary directory, and
// one finished `ringctl run` of the tiny spec (tests/cli/run_tiny.yaml, 6 steps, ringd and two
// CPU workers) on it. For the tests of tests/web that need a real job.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/run.h"
#include "tests/common/test_proc.h"

namespace ring::web_test {

using ring::test::Proc;
using ring::test::slurp;

inline const std::string kBin = RING_BINARY_DIR;
inline const std::string kSpec = std::string(RING_SOURCE_DIR) + "/tests/cli/run_tiny.yaml";

inline bool wait_until(double seconds, const std::function<bool()>& pred) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return pred();
}

// A port that was free a moment ago (the kernel's pick for port 0).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

inline std::string url_encode(const std::string& s) {
  std::string o;
  char b[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '_' || c == '.' || c == '-') {
      o += static_cast<char>(c);
    } else {
      std::snprintf(b, sizeof b, "%%%02X", c);
      o += b;
    }
  }
  return o;
}

// ring-coord with the web endpoint, and one finished run of the tiny spec on it.
struct CoordWithJob {
  ring::test::TempDir dir{"ring-web-it"};
  std::string state = dir.path + "/state";
  std::string endpoint = "ipc://" + dir.path + "/sock/coord.sock";
  std::unique_ptr<Proc> coord;
  std::string url;
  std::string run_output;
  int run_exit = -1;

  explicit CoordWithJob(const std::string& auth, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{kBin + "/coordinator/ring-coord",
                                  "--state-dir",
                                  state,
                                  "--endpoint",
                                  endpoint,
                                  "--http",
                                  "127.0.0.1:0",
                                  "--http-auth",
                                  auth};
    args.insert(args.end(), extra.begin(), extra.end());
    coord = std::make_unique<Proc>(args, dir.path + "/coord.log", dir.path + "/coord.log");
    // The URL it bound is written to <state>/http.
    if (!wait_until(60, [&] { return slurp(state + "/http").find("http://") == 0; })) return;
    url = slurp(state + "/http");
    url.erase(url.find('\n'));
    auto r =
        ring::test::run("env RING_COORD=" + endpoint + " RING_STATE_DIR=" + state +
                        " UCX_TLS=self,posix UCX_NET_DEVICES=lo " + kBin + "/cli/ringctl run " +
                        kSpec + " --steps 6 --job-dir " + dir.path + "/job");
    run_exit = r.exit_code;
    run_output = r.output;
  }
  std::string log() const { return slurp(dir.path + "/coord.log"); }
  // ringctl with this coordinator's endpoint and state directory.
  ring::test::RunResult ringctl(const std::string& args) const {
    return ring::test::run("env RING_COORD=" + endpoint + " RING_STATE_DIR=" + state + " " + kBin +
                           "/cli/ringctl " + args);
  }
};

}  // namespace ring::web_test
