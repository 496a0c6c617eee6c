// Transport conformance: every transport plugin in the build, several real processes (the
// transport_helper binary, one per rank), every behaviour ring attention and the gradient path
// rely on. A transport that cannot run here (NCCL without a GPU) skips with its probe's reason.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/proc/read_file.h"
#include "plugins/transport/loader.h"
#include "tests/common/test_proc.h"

namespace ring::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using ring::test::slurp;
using ring::test::TempDir;

// P helper processes, stderr to <dir>/log-<rank> (stdout stays the test's); on destruction any
// still running is killed and reaped, so a failing test leaves no orphans.
class Ranks {
 public:
  Ranks(const std::string& transport, int world, const std::string& dir,
        const std::string& scenario) {
    for (int r = 0; r < world; ++r)
      procs_.start({RING_TRANSPORT_HELPER, transport, std::to_string(r), std::to_string(world),
                    dir, scenario},
                   "", dir + "/log-" + std::to_string(r));
  }
  // Reaps every rank or gives up at the bound; false when some rank was still running.
  bool wait_all(std::chrono::milliseconds bound) { return procs_.wait_all(bound); }
  void kill_rank(int r) { kill(procs_.pid(r), SIGKILL); }
  pid_t pid(int r) const { return procs_.pid(r); }
  int status(int r) const { return procs_.status(r); }
  std::string log(int r) const { return procs_.log(r); }
  std::string logs() const { return procs_.logs("rank"); }

 private:
  ring::test::ProcGroup procs_;
};

// Processes whose command line mentions dir (the unique rendezvous of one test).
int processes_using(const std::string& dir) {
  return static_cast<int>(ring::test::processes_mentioning(dir).size());
}

std::vector<std::string> transports() {
  std::vector<std::string> t = available_transports();
  return t.empty() ? std::vector<std::string>{"none-built"} : t;
}

// Skips with the plugin's reason when it cannot run on this machine.
#define SKIP_UNLESS_RUNNABLE(which)                                           \
  do {                                                                        \
    TransportPlugin plugin_ = TransportPlugin::load(which);                   \
    char reason_[512];                                                        \
    if (plugin_->probe(reason_, sizeof(reason_)) != RING_TRANSPORT_OK)        \
      GTEST_SKIP() << plugin_.name() << " cannot run here: " << reason_;      \
  } while (0)

class Conformance : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string transport() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }

  // Runs the scenario on every rank; all must exit 0 within the bound and agree on the result.
  void run(const std::string& scenario, std::chrono::seconds bound = 120s) {
    SKIP_UNLESS_RUNNABLE(transport());
    TempDir dir("ring-transport");
    {
      Ranks ranks(transport(), world(), dir.path, scenario);
      bool finished = ranks.wait_all(bound);
      ASSERT_TRUE(finished) << scenario << " did not finish in " << bound.count() << " s\n"
                            << ranks.logs();
      for (int r = 0; r < world(); ++r)
        EXPECT_EQ(ranks.status(r), 0) << "rank " << r << "\n" << ranks.logs();
    }
    std::string first = slurp(dir.path + "/result-0");
    EXPECT_FALSE(first.empty());
    for (int r = 1; r < world(); ++r)
      EXPECT_EQ(slurp(dir.path + "/result-" + std::to_string(r)), first)
          << "rank " << r << " computed different bits than rank 0";
    EXPECT_EQ(processes_using(dir.path), 0);
  }
};

TEST_P(Conformance, OrderingBetweenPairs) { run("ordering"); }
TEST_P(Conformance, ZeroLengthSelfTruncationAndTimeouts) { run("edge"); }
TEST_P(Conformance, ManyMessagesInFlight) { run("many"); }
TEST_P(Conformance, RingNeighbourExchange) { run("ring"); }
TEST_P(Conformance, CollectivesMatchReferenceBitForBit) { run("collectives"); }
TEST_P(Conformance, ArmedWakeupFiresForEveryProtocol) { run("wakeup"); }
TEST_P(Conformance, GroupAllToAllDeliversEveryBlock) { run("all_to_all"); }
TEST_P(Conformance, Large256MiBMessage) {
  if (world() != 2) GTEST_SKIP() << "256 MiB messages run with 2 ranks (memory of a shared host)";
  run("large", 180s);
}

// kill -9 of one rank mid-exchange: every other rank reports a peer failure well before the
// operation timeout (30 s in the helper), and nothing is left running.
TEST_P(Conformance, KilledPeerIsReportedNotHung) {
  SKIP_UNLESS_RUNNABLE(transport());
  TempDir dir("ring-transport");
  const int victim = 1;
  {
    Ranks ranks(transport(), world(), dir.path, "kill");
    auto deadline = Clock::now() + 60s;
    for (int r = 0; r < world(); ++r)
      while (!std::filesystem::exists(dir.path + "/ready-" + std::to_string(r))) {
        ASSERT_LT(Clock::now(), deadline) << "ranks never got going\n" << ranks.logs();
        std::this_thread::sleep_for(5ms);
      }
    ranks.kill_rank(victim);
    auto t0 = Clock::now();
    bool finished = ranks.wait_all(20s);
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_TRUE(finished) << "survivors still running 20 s after the kill\n" << ranks.logs();
    EXPECT_LT(secs, 10.0) << "detection took longer than the bound\n" << ranks.logs();
    EXPECT_EQ(ranks.status(victim), 128 + SIGKILL);
    for (int r = 0; r < world(); ++r) {
      if (r == victim) continue;
      EXPECT_EQ(ranks.status(r), 3) << "rank " << r << " should report a peer failure\n"
                                    << ranks.logs();
      EXPECT_NE(ranks.log(r).find("peer failed"), std::string::npos) << ranks.log(r);
    }
    std::printf("[ detection ] %s P=%d: survivors done %.3f s after kill -9\n",
                transport().c_str(), world(), secs);
  }
  EXPECT_EQ(processes_using(dir.path), 0) << "orphan processes";
}

std::string name_of(const ::testing::TestParamInfo<Conformance::ParamType>& info) {
  std::string n = std::get<0>(info.param) + "_P" + std::to_string(std::get<1>(info.param));
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(AllTransports, Conformance,
                         ::testing::Combine(::testing::ValuesIn(transports()),
                                            ::testing::Values(2, 3, 4)),
                         name_of);

// ---- single-process checks ------------------------------------------------------------------

class PerTransport : public ::testing::TestWithParam<std::string> {};

// A rank whose peers never come gets TIMEOUT within its bound, naming who is missing.
TEST_P(PerTransport, BootstrapTimesOutNamingMissingRanks) {
  SKIP_UNLESS_RUNNABLE(GetParam());
  TransportPlugin plugin = TransportPlugin::load(GetParam());
  TempDir dir("ring-transport");
  ring_transport_config_t cfg{};
  cfg.rank = 0;
  cfg.world_size = 3;
  cfg.rendezvous = dir.path.c_str();
  cfg.bootstrap_timeout_ms = 300;
  ring_transport_comm_t* comm = nullptr;
  auto t0 = Clock::now();
  EXPECT_EQ(plugin->init(&cfg, &comm), RING_TRANSPORT_ERR_TIMEOUT);
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(comm, nullptr);
  std::string msg = plugin->last_error(nullptr);
  EXPECT_NE(msg.find("2 rank(s): 1,2"), std::string::npos) << msg;
}

// A peer that died before anything was sent to it: the first send creates the endpoint to a
// process that is gone, and must report a peer failure (not an internal error, not a hang).
TEST_P(PerTransport, FirstSendToADeadPeerIsAPeerFailure) {
  SKIP_UNLESS_RUNNABLE(GetParam());
  TempDir dir("ring-transport");
  {
    Ranks ranks(GetParam(), 2, dir.path, "dead_before_first_send");
    const auto deadline = Clock::now() + 60s;
    // Dead means a zombie (our child, not reaped until wait_all, so its pid is not reused): the
    // kernel makes it one only after it closed its files. `alive()` turns false earlier, once
    // its memory is gone (its command line reads empty), while its shared-memory file is still
    // open: a send then attaches to it and completes into a FIFO nobody reads, which is a send
    // to a peer that died after it, not before it (the test failed so under load, 15 in 300).
    while (!std::filesystem::exists(dir.path + "/ready-1") ||
           ring::proc::process_state(ranks.pid(1)) != 'Z') {
      ASSERT_LT(Clock::now(), deadline) << "rank 1 never died\n" << ranks.logs();
      std::this_thread::sleep_for(5ms);
    }
    std::ofstream(dir.path + "/victim-gone") << "gone\n";
    ASSERT_TRUE(ranks.wait_all(20s)) << "rank 0 still running 20 s on\n" << ranks.logs();
    EXPECT_EQ(ranks.status(1), 128 + SIGKILL);
    EXPECT_EQ(ranks.status(0), 3) << "rank 0 should report a peer failure\n" << ranks.logs();
    EXPECT_NE(ranks.log(0).find("peer failed"), std::string::npos) << ranks.log(0);
  }
  EXPECT_EQ(processes_using(dir.path), 0) << "orphan processes";
}

TEST_P(PerTransport, BadConfigIsInvalidArgument) {
  TransportPlugin plugin = TransportPlugin::load(GetParam());
  ring_transport_config_t cfg{};
  cfg.rank = 3;
  cfg.world_size = 2;
  cfg.rendezvous = "/tmp";
  ring_transport_comm_t* comm = nullptr;
  ring_transport_status_t s = plugin->init(&cfg, &comm);
  // NCCL without a GPU may say UNSUPPORTED first; either way it must refuse with a message.
  EXPECT_TRUE(s == RING_TRANSPORT_ERR_INVALID_ARGUMENT || s == RING_TRANSPORT_ERR_UNSUPPORTED)
      << ring_transport_status_name(s);
  EXPECT_STRNE(plugin->last_error(nullptr), "");
}

TEST_P(PerTransport, LoadsAndDescribesItself) {
  TransportPlugin plugin = TransportPlugin::load(GetParam());
  EXPECT_EQ(plugin.name(), GetParam());
  EXPECT_TRUE(plugin->caps & (RING_TRANSPORT_CAP_HOST_MEMORY | RING_TRANSPORT_CAP_DEVICE_MEMORY));
  char reason[512] = "unset";
  ring_transport_status_t s = plugin->probe(reason, sizeof(reason));
  EXPECT_TRUE(s == RING_TRANSPORT_OK || (s == RING_TRANSPORT_ERR_UNSUPPORTED && reason[0]))
      << reason;
}

INSTANTIATE_TEST_SUITE_P(AllTransports, PerTransport, ::testing::ValuesIn(transports()));

// RING_UCX_WAKEUP takes 0 or 1; anything else is refused at init, naming the variable.
TEST(UcxTransport, BadWakeupSettingIsRefused) {
  const std::vector<std::string> have = available_transports();
  if (std::find(have.begin(), have.end(), "ucx") == have.end()) GTEST_SKIP() << "ucx not built";
  TransportPlugin plugin = TransportPlugin::load("ucx");
  TempDir dir("ring-wakeup-env");
  ring_transport_config_t cfg{};
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.rendezvous = dir.path.c_str();
  ring_transport_comm_t* comm = nullptr;
  ASSERT_EQ(setenv("RING_UCX_WAKEUP", "yes", 1), 0);
  ring_transport_status_t s = plugin->init(&cfg, &comm);
  unsetenv("RING_UCX_WAKEUP");
  EXPECT_EQ(s, RING_TRANSPORT_ERR_INVALID_ARGUMENT) << ring_transport_status_name(s);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(plugin->last_error(nullptr)).find("RING_UCX_WAKEUP=yes: must be 0"),
            std::string::npos)
      << plugin->last_error(nullptr);
}

TEST(TransportLoader, UnknownTransportNamesTheAvailableOnes) {
  try {
    TransportPlugin::load("carrier-pigeon");
    FAIL() << "loading a transport that does not exist succeeded";
  } catch (const TransportError& e) {
    EXPECT_EQ(e.status(), RING_TRANSPORT_ERR_UNSUPPORTED);
    std::string msg = e.what();
    EXPECT_NE(msg.find("'carrier-pigeon' is not available"), std::string::npos) << msg;
    for (const std::string& t : available_transports())
      EXPECT_NE(msg.find(t), std::string::npos) << msg;
  }
}

TEST(TransportLoader, EnvironmentOverridesTheSearchPath) {
  TempDir empty("ring-transport");
  setenv("RING_TRANSPORT_PATH", empty.path.c_str(), 1);
  EXPECT_TRUE(available_transports().empty());
  EXPECT_THROW(TransportPlugin::load("ucx"), TransportError);
  unsetenv("RING_TRANSPORT_PATH");
  EXPECT_FALSE(available_transports().empty());
}

TEST(TransportLoader, UcxIsTheDefaultWhenBuilt) {
  std::vector<std::string> t = available_transports();
  if (std::find(t.begin(), t.end(), "ucx") == t.end()) GTEST_SKIP() << "UCX not built";
  EXPECT_EQ(t.front(), "ucx");
}

}  // namespace
}  // namespace ring::transport
