// Helpers for the coordinator tests: an in-process coordinator on a private ipc socket, a
// simulated daemon speaking the real protocol, and test specs.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include "coordinator/client.h"
#include "coordinator/coordinator.h"
#include "coordinator/daemon_link.h"

namespace ring::coord::test {

namespace proto = ring::protocol;
using namespace std::chrono_literals;

inline std::string make_temp_dir(const char* tag) {
  std::string t = std::string("/tmp/ring-") + tag + "-XXXXXX";
  char* p = mkdtemp(t.data());
  EXPECT_NE(p, nullptr);
  return t;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The tiny example spec with a given node count and restart policy.
inline std::string test_spec(int nodes, int max_restarts, double backoff_s, double backoff_max_s) {
  std::string s = read_text(std::string(RING_SOURCE_DIR) + "/configs/examples/tiny.yaml");
  auto pos = s.find("  nodes: 1");
  if (pos != std::string::npos) s.replace(pos, 10, "  nodes: " + std::to_string(nodes));
  // tiny.yaml: 4 ranks on 1 node x 4 workers; keep 4 ranks over `nodes` nodes.
  pos = s.find("  workers_per_node: 4");
  if (pos != std::string::npos)
    s.replace(pos, 21, "  workers_per_node: " + std::to_string(4 / nodes));
  std::ostringstream os;
  os << s << "\nrestart:\n  max_restarts: " << max_restarts << "\n  backoff_s: " << backoff_s
     << "\n  backoff_max_s: " << backoff_max_s << "\n";
  return os.str();
}

// Polls `pred` until true or the timeout.
inline bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5s) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

class InProcessCoordinator {
 public:
  explicit InProcessCoordinator(std::function<void(CoordinatorOptions&)> tweak = {}) {
    dir_ = make_temp_dir("coord");
    opts_.state_dir = dir_ + "/state";
    endpoint_ = "ipc://" + dir_ + "/sock/coord.sock";
    opts_.endpoints = {endpoint_};
    opts_.heartbeat_interval_s = 0.1;
    opts_.heartbeat_timeout_s = 5;
    opts_.synchronous_full = false;  // tests: crash safety, not power-loss safety
    if (tweak) tweak(opts_);
    start();
  }
  ~InProcessCoordinator() {
    stop();
    std::filesystem::remove_all(dir_);
  }
  void start() {
    coord_ = std::make_unique<Coordinator>(opts_);
    thread_ = std::thread([this] { coord_->run(); });
  }
  void stop() {
    if (!coord_) return;
    coord_->stop();
    thread_.join();
    coord_.reset();
  }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& dir() const { return dir_; }
  Coordinator& coordinator() { return *coord_; }
  Client client(std::chrono::milliseconds timeout = 3000ms) {
    return Client(ClientOptions{endpoint_, timeout, "", "", ""});
  }

 private:
  std::string dir_, endpoint_;
  CoordinatorOptions opts_;
  std::unique_ptr<Coordinator> coord_;
  std::thread thread_;
};

// A simulated ringd: real protocol, real ZeroMQ socket.
class SimDaemon {
 public:
  SimDaemon(const std::string& endpoint, const std::string& node)
      : link_(DaemonLinkOptions{endpoint, "", "", ""}, make_reg(node)) {}

  static proto::Register make_reg(const std::string& node) {
    proto::Register r;
    r.node = node;
    r.gpus = {{0, "sim", 1024}};
    r.topology = {1, 4, 8192, "leaf0", "simulated"};
    r.ringd_version = "sim-0.1";
    return r;
  }

  DaemonLink& link() { return link_; }
  const std::string& node() { return link_.registration().node; }

  // Registers serving `jobs` and returns the `registered` reply.
  proto::Registered register_jobs(std::vector<proto::JobProgress> jobs) {
    link_.registration().jobs = std::move(jobs);
    link_.register_now();
    return expect<proto::Registered>(30s);  // generous: CI load
  }

  // The next message of type T, keeping the others in `inbox`.
  template <typename T>
  T expect(std::chrono::milliseconds timeout = 5s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    for (auto it = inbox.begin(); it != inbox.end(); ++it)
      if (auto* t = std::get_if<T>(&*it)) {
        T out = *t;
        inbox.erase(it);
        return out;
      }
    while (std::chrono::steady_clock::now() < end) {
      auto m = link_.recv(50ms);
      if (!m) continue;
      if (auto* t = std::get_if<T>(&*m)) return *t;
      inbox.push_back(*m);
    }
    throw std::runtime_error(std::string("no ") + proto::type_name(proto::Message{T{}}) +
                             " within the timeout");
  }

  // The next command of this kind for this job.
  proto::Command expect_command(proto::CommandKind kind, int64_t job,
                                std::chrono::milliseconds timeout = 5s) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      proto::Command c = expect<proto::Command>(std::max(left, 1ms));
      if (c.command == kind && c.job == job) return c;
    }
    throw std::runtime_error(std::string("no ") + proto::to_string(kind) + " command");
  }

  void step(int64_t job, int64_t attempt, int64_t step, double loss = 2.0) {
    link_.send(proto::StepReport{node(), job, attempt, step, loss, 1000.0, 0.5, 0.1, {}});
  }
  void event(proto::Event e) {
    e.node = node();
    link_.send(e);
  }
  void checkpoint(int64_t job, int64_t attempt, int64_t step, bool complete = true,
                  std::vector<int64_t> deleted = {}) {
    proto::Event e;
    e.deleted = std::move(deleted);
    e.kind = proto::EventKind::kCheckpointSaved;
    e.job = job;
    e.attempt = attempt;
    e.step = step;
    e.path = "/ckpt/" + std::to_string(step);
    e.bytes = 1000;
    e.complete = complete;
    event(e);
  }
  void simple(proto::EventKind k, int64_t job, int64_t attempt, std::optional<int64_t> step = {}) {
    proto::Event e;
    e.kind = k;
    e.job = job;
    e.attempt = attempt;
    e.step = step;
    event(e);
  }

  std::vector<proto::Message> inbox;

 private:
  DaemonLink link_;
};

}  // namespace ring::coord::test
