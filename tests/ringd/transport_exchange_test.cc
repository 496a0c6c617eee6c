// ringd's TransportExchange (daemon/ringd/transport_exchange.h) over UCX on loopback, one forked
// process per node: the shard collectives of parallel.shard optimizer with 3 nodes.
//
//   ShardCollectivesWithThreeNodes: reduce_sum to every root gives the root the left fold in
//     node order (bit for bit, values whose sum depends on the order), whole and in windows
//     (the same bits), gather to a root with
//     per-node sizes (one of them 0), allgather_spans with an empty span, interleaved with the
//     ring collectives (allreduce_sum, allgather) in one communicator.
//   ReduceTimesOutNamingTheMissingNode: node 1 never sends: the root fails within the bound,
//     naming node 1, and every later call on it fails at once.
#include "daemon/ringd/transport_exchange.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/test_proc.h"

namespace {

using ring::ringd::TransportExchange;
using Clock = std::chrono::steady_clock;

// Node k's values for a reduce of n floats: magnitudes spread over 1e-3..1e3 so that the
// order of the sum shows in its bits.
std::vector<float> values(int node, int64_t n, int salt) {
  std::mt19937 rng(static_cast<unsigned>(1000 * salt + node));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = u(rng) * std::pow(10.f, static_cast<float>(i % 7) - 3.f);
  return v;
}

// Runs body(node) in `nodes` forked processes; returns each one's error ("" = passed).
std::vector<std::string> run_nodes(int nodes, const std::string& dir,
                                   const std::function<void(int)>& body) {
  std::vector<pid_t> pids;
  for (int node = 0; node < nodes; ++node) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::string error;
      try {
        body(node);
      } catch (const std::exception& e) {
        error = e.what();
      }
      {
        std::ofstream f(dir + "/error-" + std::to_string(node) + ".tmp");
        f << error;
      }
      std::rename((dir + "/error-" + std::to_string(node) + ".tmp").c_str(),
                  (dir + "/error-" + std::to_string(node)).c_str());
      // Stay until every node is done: a node that exits at once can take its last messages
      // with it before a slower peer has received them (the transport then reports that peer
      // failed). Bounded: a node that never finishes fails the test on its own.
      const auto until = Clock::now() + std::chrono::seconds(60);
      for (int k = 0; k < nodes && Clock::now() < until; ++k)
        while (access((dir + "/error-" + std::to_string(k)).c_str(), F_OK) != 0 &&
               Clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::fflush(nullptr);
      _exit(error.empty() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> errors;
  for (int node = 0; node < nodes; ++node) {
    int status = 0;
    waitpid(pids[node], &status, 0);
    std::string e = ring::test::slurp(dir + "/error-" + std::to_string(node));
    if (e.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) e = "child failed";
    errors.push_back(e);
  }
  return errors;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

class TransportExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", "self,posix", 1);
    setenv("UCX_NET_DEVICES", "lo", 1);
  }
};

TEST_F(TransportExchangeTest, ShardCollectivesWithThreeNodes) {
  ring::test::TempDir t("transport-exchange-test");
  const int nodes = 3;
  const int64_t n = 10007;
  const auto errors = run_nodes(nodes, t.path, [&](int node) {
    TransportExchange ex("ucx", node, nodes, t.path + "/rdv", 30000, 10000);
    for (int root = 0; root < nodes; ++root) {
      std::vector<float> x = values(node, n, root);
      ex.reduce_sum(x.data(), n, root);
      if (node == root) {
        std::vector<float> want = values(0, n, root);
        for (int k = 1; k < nodes; ++k) {
          const std::vector<float> y = values(k, n, root);
          for (int64_t i = 0; i < n; ++i) want[i] += y[i];
        }
        require(std::memcmp(x.data(), want.data(), sizeof(float) * n) == 0,
                "reduce to root " + std::to_string(root) + ": not the left fold in node order");
      }
      // The same reduce in windows of 1000 floats (10 full, one of 7), two in flight: the same
      // bits, the root's own x folded at its turn.
      std::vector<float> xw = values(node, n, root);
      ex.set_reduce_window_floats(1000);
      ex.reduce_sum(xw.data(), n, root);
      ex.set_reduce_window_floats(n);  // one window: as before
      if (node == root)
        require(std::memcmp(xw.data(), x.data(), sizeof(float) * n) == 0,
                "windowed reduce to root " + std::to_string(root) + ": not the same bits");
      // A ring collective between the point-to-point ones.
      double d = node + 0.5;
      ex.allreduce_sum(&d, 1);
      require(d == 0.5 + 1.5 + 2.5, "allreduce_sum(double)");
    }
    // Gather to node 2: node k sends k * 100 bytes (node 0 none).
    std::vector<uint8_t> mine(static_cast<size_t>(node) * 100, static_cast<uint8_t>(node + 1));
    auto got = ex.gather(mine.data(), static_cast<int64_t>(mine.size()), 2);
    if (node == 2) {
      require(got.size() == 3u, "gather: 3 contributions at the root");
      for (int k = 0; k < nodes; ++k)
        require(got[k] ==
                    std::vector<uint8_t>(static_cast<size_t>(k) * 100, static_cast<uint8_t>(k + 1)),
                "gather: node " + std::to_string(k) + "'s bytes");
    } else {
      require(got.empty(), "gather: nothing at a non-root");
    }
    // Spans: node 0 owns [0, 40), node 1 nothing, node 2 [40, 100); x[100..] untouched.
    const std::vector<int64_t> offsets = {0, 40, 40, 100};
    std::vector<float> w(110, -1.f);
    for (int64_t i = offsets[node]; i < offsets[node + 1]; ++i) w[i] = static_cast<float>(i);
    ex.allgather_spans(w.data(), offsets);
    for (int64_t i = 0; i < 110; ++i)
      require(w[i] == (i < 100 ? static_cast<float>(i) : -1.f),
              "allgather_spans: x[" + std::to_string(i) + "]");
    auto all = ex.allgather(&node, sizeof node);
    require(all.size() == 3u, "allgather after the point-to-point collectives");
  });
  for (int node = 0; node < nodes; ++node) EXPECT_EQ(errors[node], "") << "node " << node;
}

TEST_F(TransportExchangeTest, ReduceTimesOutNamingTheMissingNode) {
  ring::test::TempDir t("transport-exchange-test");
  const auto errors = run_nodes(2, t.path, [&](int node) {
    TransportExchange ex("ucx", node, 2, t.path + "/rdv", 30000, 1000);
    std::vector<float> x(64, 1.f);
    if (node == 1) {
      // Stays silent until the root has given up, then leaves.
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return;
    }
    const auto t0 = Clock::now();
    std::string msg;
    try {
      ex.reduce_sum(x.data(), 64, 0);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    require(msg.find("receiving from node 1") != std::string::npos, "message: " + msg);
    require(s < 2.0, "the reduce waited " + std::to_string(s) + " s with a 1 s bound");
    std::string later;
    try {
      ex.reduce_sum(x.data(), 64, 0);
    } catch (const std::exception& e) {
      later = e.what();
    }
    require(later.find("failed earlier") != std::string::npos, "later call: " + later);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
