// `ringctl metrics` and step-metric retention with a real job: the CSV and JSON exports carry
// every step report the coordinator recorded (compared with its database), and with --ranks every
// per-rank row; the checkpoint write seconds in /metrics; --from-step, the
// export after the coordinator stopped (its state read-only), and ring-coord
// --metrics-retention-steps pruning step_metrics and rank_steps to the last N steps. The web
// endpoint's options, and stalled or busy HTTP clients not delaying the ZeroMQ side.
#include <algorithm>
#include <gtest/gtest.h>
#include <signal.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include <atomic>

#include "coord_with_job.h"
#include "coordinator/store.h"
#include "web_util.h"

using namespace ring::web_test;
using nlohmann::json;

namespace {

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST(MetricsExport, CsvAndJsonCarryTheRecordedSteps) {
  CoordWithJob c("none");
  ASSERT_EQ(c.run_exit, 0) << c.run_output << c.log();
  std::vector<ring::protocol::StepRecord> want;
  ASSERT_TRUE(wait_until(30, [&] {
    ring::coord::Store st(c.state + "/coord.db", {true, 0, true});
    want = st.steps(1, 0, 1000);
    return st.job(1) && st.job(1)->last_step == 6 && !want.empty() && want.back().step == 6;
  }));

  auto csv = c.ringctl("metrics 1");
  ASSERT_EQ(csv.exit_code, 0) << csv.output;
  auto ls = lines(csv.output);
  ASSERT_EQ(ls.size(), want.size() + 1) << csv.output;
  EXPECT_EQ(ls[0], "step,attempt,node,loss,tokens_per_s,step_time_s,comm_time_s,time");
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<std::string> f;
    std::istringstream row(ls[i + 1]);
    for (std::string x; std::getline(row, x, ',');) f.push_back(x);
    ASSERT_EQ(f.size(), 8u) << ls[i + 1];
    EXPECT_EQ(std::stoll(f[0]), want[i].step);
    EXPECT_EQ(f[2], want[i].node);
    EXPECT_EQ(std::stod(f[3]), want[i].loss);  // full precision: the same double
    EXPECT_EQ(std::stod(f[4]), want[i].tokens_per_s);
  }

  auto js = c.ringctl("metrics 1 --json --from-step 4");
  ASSERT_EQ(js.exit_code, 0) << js.output;
  json arr = json::parse(js.output);
  ASSERT_TRUE(arr.is_array());
  size_t from4 = 0;
  for (const auto& w : want) from4 += w.step >= 4;
  ASSERT_EQ(arr.size(), from4);
  EXPECT_EQ(arr[0]["step"], 4);
  EXPECT_EQ(arr.back()["loss"].get<double>(), want.back().loss);

  // --ranks: the per-rank series (rank_steps), every row the coordinator recorded.
  std::vector<ring::protocol::RankStepRecord> rwant;
  ASSERT_TRUE(wait_until(30, [&] {
    ring::coord::Store st(c.state + "/coord.db", {true, 0, true});
    rwant = st.rank_steps(1, 1, 1000, 100000);
    return !rwant.empty() && rwant.back().step == 6;
  }));
  auto rcsv = c.ringctl("metrics 1 --ranks");
  ASSERT_EQ(rcsv.exit_code, 0) << rcsv.output;
  auto rls = lines(rcsv.output);
  ASSERT_EQ(rls.size(), rwant.size() + 1) << rcsv.output;
  EXPECT_EQ(rls[0],
            "step,attempt,node,rank,step_time_s,data_s,compute_s,wait_s,comm_s,hop_bytes,time");
  for (size_t i = 0; i < rwant.size(); ++i) {
    std::vector<std::string> f;
    std::istringstream row(rls[i + 1]);
    for (std::string x; std::getline(row, x, ',');) f.push_back(x);
    ASSERT_EQ(f.size(), 11u) << rls[i + 1];
    EXPECT_EQ(std::stoll(f[0]), rwant[i].step);
    EXPECT_EQ(f[2], rwant[i].node);
    EXPECT_EQ(std::stoll(f[3]), rwant[i].rank.rank);
    EXPECT_EQ(std::stod(f[4]), rwant[i].rank.step_time_s);  // full precision
    EXPECT_EQ(std::stod(f[7]), rwant[i].rank.wait_s);
    EXPECT_EQ(std::stoll(f[9]), rwant[i].rank.hop_bytes);
  }
  auto rjs = c.ringctl("metrics 1 --ranks --json --from-step 5");
  ASSERT_EQ(rjs.exit_code, 0) << rjs.output;
  json rarr = json::parse(rjs.output);
  size_t rfrom5 = 0;
  for (const auto& w : rwant) rfrom5 += w.step >= 5;
  ASSERT_EQ(rarr.size(), rfrom5);
  EXPECT_EQ(rarr[0]["step"], 5);
  EXPECT_EQ(rarr.back()["rank"], rwant.back().rank.rank);
  EXPECT_EQ(rarr.back()["compute_s"].get<double>(), rwant.back().rank.compute_s);

  // The run checkpointed every 2 steps: ringd reported each shard's write seconds, and /metrics
  // exports the latest complete checkpoint's bytes and seconds.
  Parsed m;
  ASSERT_TRUE(wait_until(30, [&] {
    auto r = http(port_of(c.url), "GET", "/metrics");
    if (r.status != 200) return false;
    m = parse_exposition(r.body);
    return !m.find("ring_job_checkpoint_seconds", {{"job_id", "1"}}).empty();
  })) << c.log();
  EXPECT_EQ(m.find("ring_job_checkpoint_step", {{"job_id", "1"}})[0].value, 6);
  EXPECT_GT(m.find("ring_job_checkpoint_bytes", {{"job_id", "1"}})[0].value, 0);
  const double ck_s = m.find("ring_job_checkpoint_seconds", {{"job_id", "1"}})[0].value;
  EXPECT_GT(ck_s, 0);
  EXPECT_LT(ck_s, 600);

  auto both = c.ringctl("metrics 1 --csv --json");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("excludes"), std::string::npos) << both.output;
  auto missing = c.ringctl("metrics 99");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("99"), std::string::npos) << missing.output;

  // After the coordinator stopped: the same export, from the state it left.
  ::kill(c.coord->pid, SIGTERM);
  ASSERT_NE(c.coord->wait(60), -1);
  auto after = c.ringctl("metrics 1 --timeout 0.5");
  ASSERT_EQ(after.exit_code, 0) << after.output;
  EXPECT_NE(after.output.find(ls.back()), std::string::npos) << after.output;
}

TEST(MetricsRetention, RingCoordKeepsTheLastStepsOfEachJob) {
  CoordWithJob c("none");
  ASSERT_EQ(c.run_exit, 0) << c.run_output << c.log();
  ::kill(c.coord->pid, SIGTERM);
  ASSERT_NE(c.coord->wait(60), -1);
  // The nodes reported every rank's share of every step: those of the last 2 steps must stay.
  size_t kept_ranks = 0;
  {
    ring::coord::Store st(c.state + "/coord.db", {true, 0, true});
    ASSERT_EQ(st.steps(1, 0, 1000).front().step, 1);
    auto all = st.rank_steps(1, 0, 1000, 1000);
    for (int64_t s = 1; s <= 6; ++s)
      ASSERT_TRUE(std::any_of(all.begin(), all.end(), [&](const auto& r) { return r.step == s; }))
          << "no rank rows for step " << s;
    kept_ranks = st.rank_steps(1, 5, 6, 1000).size();
  }
  // The coordinator again, keeping 2 steps per job: steps <= 6 - 2 go within a few of its
  // once-a-second passes.
  Proc again({kBin + "/coordinator/ring-coord", "--state-dir", c.state, "--endpoint", c.endpoint,
              "--metrics-retention-steps", "2"},
             c.dir.path + "/coord2.log", c.dir.path + "/coord2.log");
  std::vector<ring::protocol::StepRecord> left;
  size_t ranks_left = 0;
  bool pruned = wait_until(60, [&] {
    ring::coord::Store st(c.state + "/coord.db", {true, 0, true});
    left = st.steps(1, 0, 1000);
    ranks_left = st.rank_steps(1, 0, 1000, 1000).size();
    return !left.empty() && left.front().step == 5 && ranks_left == kept_ranks;
  });
  ASSERT_TRUE(pruned) << left.size() << " step rows, " << ranks_left << " rank rows\n"
                      << slurp(c.dir.path + "/coord2.log");
  EXPECT_EQ(left.back().step, 6);
}

TEST(WebEndpoint, BusyHttpClientsDoNotDelayTheCoordinator) {
  CoordWithJob c("none");
  ASSERT_EQ(c.run_exit, 0) << c.run_output << c.log();
  const int port = port_of(c.url);
  // Fill the connection cap with clients that send half a request and stall, and keep another
  // thread asking for the heaviest page: the ZeroMQ side answers as usual meanwhile.
  std::vector<int> stalled;
  for (int i = 0; i < 40; ++i) {
    int fd = connect_to(port);
    if (fd < 0) continue;
    std::string half = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    (void)!::write(fd, half.data(), half.size());
    stalled.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread load([&] {
    while (!stop) http(port, "GET", "/jobs/1", {}, "", 5);
  });
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto st = c.ringctl("status 1 --timeout 10");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(st.exit_code, 0) << st.output;
    EXPECT_NE(st.output.find("completed"), std::string::npos) << st.output;
    EXPECT_LT(s, 10) << "ringctl status took " << s << " s";
  }
  stop = true;
  load.join();
  for (int fd : stalled) ::close(fd);
  // The stalled clients were dropped or are being served: the endpoint answers again.
  EXPECT_TRUE(wait_until(60, [&] { return http(port, "GET", "/metrics").status == 200; }));
}

TEST(WebEndpoint, OptionsAreChecked) {
  ring::test::TempDir d("ring-web-opt");
  auto coord = [&](const std::string& args) {
    return ring::test::run(kBin + "/coordinator/ring-coord --state-dir " + d.path +
                           "/state --endpoint ipc://" + d.path + "/sock/c.sock " + args);
  };
  auto name = coord("--http localhost:9464");
  EXPECT_EQ(name.exit_code, 2) << name.output;
  EXPECT_NE(name.output.find("not an IPv4 or IPv6 address"), std::string::npos) << name.output;
  auto port = coord("--http 127.0.0.1:70000");
  EXPECT_EQ(port.exit_code, 2) << port.output;
  EXPECT_NE(port.output.find("0..65535"), std::string::npos) << port.output;
  auto auth = coord("--http 127.0.0.1:0 --http-auth maybe");
  EXPECT_EQ(auth.exit_code, 2) << auth.output;
  // No token on a wider address: refused at start, naming the rule.
  auto wide = coord("--http 0.0.0.0:0 --http-auth none");
  EXPECT_EQ(wide.exit_code, 1) << wide.output;
  EXPECT_NE(wide.output.find("not a loopback address: it needs the token"), std::string::npos)
      << wide.output;
}
