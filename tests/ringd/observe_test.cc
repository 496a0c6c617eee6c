// Observability on real ringd and ring-worker processes (one node, 4 workers,
// tests/ringd/tiny4.yaml):
//
//   TimelineTraceHasEveryRankNestedAndEveryHop: after a run, <job dir>/timeline/node-0.jsonl
//     turned into a Chrome trace (cli/trace_export.h) has every rank; on each rank's phase track
//     the phases nest (data, forward/backward per layer, handovers, collectives inside the step;
//     every ring wait inside the forward or backward of its layer) and are ordered; every layer's
//     forward and backward has the ring receives of hops 0..P-2 on every rank; ringd's optimizer
//     is there; the step report's per-rank summary (steps.jsonl is node 0's, so the summary is
//     checked through the trace and the --json events) adds up.
//   InjectedDelayNamesTheStraggler: RING_DEBUG_DELAY makes rank 2 sleep 250 ms per step: ringd
//     names rank 2 (event `straggler`) within 5 steps and never another rank.
//   SigstoppedWorkerIsNamedAsHung: a SIGSTOPped worker (its heartbeat thread stops too, but the
//     heartbeat timeout is long here): past observability.step_deadline_s ringd reports `hang`
//     naming it missing and the others waiting with where, fails it, and exits 1.
//   BlockedMainThreadIsNamedAsHung: RING_DEBUG_BLOCK blocks rank 3's main thread in step 3 while
//     its heartbeat thread runs: the same `hang` finding names rank 3.
//   HangAcrossTwoNodesIsNamedByTheStuckRanksNode: 2 nodes x 2 workers, rank 3 (node 1)
//     SIGSTOPped: node 1 reports it missing with rank 2 waiting and fails it; node 0 (when its
//     check comes first) reports its ranks waiting and none of its own missing; both ringd exit
//     1 (max_restarts 0).
//   StatusAndTraceThroughTheCoordinator: with a ring-coord, the straggler reaches its events table
//     (kind straggler, data with rank, node, step, steps, behind_s, message), `ringctl status
//     JOB --json` shows it as "straggler" (and "hang": null), the text status names it, and
//     `ringctl trace JOB -o FILE` writes a trace of the 4 ranks from the recorded job directory.
//   CrossNodeStragglerIsNamedByTheCoordinator: 2 nodes x 1 worker under a ring-coord, rank 0
//     (node 0) delayed 250 ms per step: its only victim, its ring successor rank 1, is on node 1,
//     so neither ringd can name it (each sees one rank); ring-coord's pass over both nodes' rows
//     names rank 0 on node 0 within 5 steps (source coordinator), never another rank, once, and
//     `ringctl status` shows it (text and --json).
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/trace_export.h"
#include "coordinator/client.h"
#include "coordinator/store.h"
#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"
#include "tests/ringd/ringd_test_util.h"

namespace {

using json = nlohmann::json;
using namespace ring::test;

const std::string kSpec4 = std::string(RING_SOURCE_DIR) + "/tests/ringd/tiny4.yaml";
constexpr int kRanks = 4;
constexpr int kLayers = 2;

struct Proc : ring::test::Proc {
  Proc(std::vector<std::string> args, const std::string& out, const std::string& err,
       std::vector<std::pair<std::string, std::string>> env = {})
      : ring::test::Proc(std::move(args), out, err, options(std::move(env))) {}
  static ProcOptions options(std::vector<std::pair<std::string, std::string>> env) {
    ProcOptions o = ucx_loopback();
    for (auto& e : env) o.set_env.push_back(std::move(e));
    return o;
  }
};

// tiny4.yaml with extra lines appended (a section of its own).
std::string spec_with(const TempDir& t, const std::string& extra) {
  const std::string path = t.path + "/spec.yaml";
  std::ofstream(path) << slurp(kSpec4) << extra;
  return path;
}

std::string diag(const TempDir& t) {
  return "\n--- ringd.err\n" + slurp(t.path + "/ringd.err") + "\n--- ringd-0.log\n" +
         slurp(t.path + "/job/logs/ringd-0.log");
}

std::vector<json> events_named(const std::string& out, const std::string& name) {
  std::vector<json> v;
  for (const json& j : json_lines(out))
    if (j.value("event", "") == name) v.push_back(j);
  return v;
}

TEST(Observe, TimelineTraceHasEveryRankNestedAndEveryHop) {
  TempDir t("ringd-observe");
  const std::string jd = t.path + "/job";
  Proc d(ringd_args(kSpec4, jd, {"--steps", "4"}), t.path + "/ringd.out", t.path + "/ringd.err");
  ASSERT_EQ(d.wait(180), 0) << diag(t);

  const std::vector<std::string> files = ring::cli::timeline_files(jd);
  ASSERT_EQ(files.size(), 1u) << diag(t);
  const json trace = ring::cli::build_trace({{files[0], slurp(files[0])}}, {});
  // The trace is valid JSON of the trace-event format: write and parse it back.
  const json parsed = json::parse(trace.dump());
  ASSERT_TRUE(parsed.contains("traceEvents"));

  struct Ev {
    std::string cat;
    double ts, end;
    int64_t step, layer, hop;
  };
  std::map<int64_t, std::vector<Ev>> main_track, recv_track;  // by rank
  bool optimizer = false;
  for (const json& e : parsed["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ASSERT_GE(e["dur"].get<double>(), 0.0);
    const int64_t tid = e["tid"];
    const json& a = e["args"];
    Ev ev{e["cat"],
          e["ts"],
          e["ts"].get<double>() + e["dur"].get<double>(),
          a.value("step", 0),
          a.value("layer", -1),
          a.value("hop", -1)};
    if (tid == 0) {
      optimizer = optimizer || ev.cat == "optimizer";
      continue;
    }
    const int64_t rank = (tid - 1) / 10;
    if (tid % 10 == 1) main_track[rank].push_back(ev);
    if (tid % 10 == 2) recv_track[rank].push_back(ev);
  }
  EXPECT_TRUE(optimizer) << "no ringd optimizer phase";
  ASSERT_EQ(main_track.size(), static_cast<size_t>(kRanks));
  const double eps = 0.002;  // µs: rounding of ns to fractional µs
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& evs = main_track[r];
    std::map<int64_t, Ev> steps;
    for (const Ev& e : evs)
      if (e.cat == "step") steps[e.step] = e;
    ASSERT_GE(steps.size(), 3u);
    // Steps in order and disjoint.
    double prev_end = -1;
    for (const auto& [s, e] : steps) {
      EXPECT_GE(e.ts + eps, prev_end) << "step " << s;
      prev_end = e.end;
    }
    std::map<int64_t, std::set<std::string>> seen;  // step -> phases
    for (const Ev& e : evs) {
      if (e.cat == "step" || e.cat == "params_wait" || !steps.count(e.step)) continue;
      const Ev& st = steps[e.step];
      EXPECT_GE(e.ts + eps, st.ts) << e.cat << " of step " << e.step << " starts before it";
      EXPECT_LE(e.end, st.end + eps) << e.cat << " of step " << e.step << " ends after it";
      seen[e.step].insert(e.cat);
      if (e.cat == "ring_wait") {
        // Inside the forward or backward of its layer.
        bool inside = false;
        for (const Ev& l : evs)
          if ((l.cat == "forward" || l.cat == "backward") && l.step == e.step &&
              l.layer == e.layer && l.ts <= e.ts + eps && e.end <= l.end + eps)
            inside = true;
        EXPECT_TRUE(inside) << "ring wait of layer " << e.layer << " hop " << e.hop;
      }
    }
    for (const auto& [s, phases] : seen)
      for (const char* p : {"data", "forward", "backward", "handover", "collective"})
        EXPECT_TRUE(phases.count(p)) << p << " missing in step " << s;
    // Forward and backward of each layer ordered: forwards 0..L-1, then backwards L-1..0.
    for (const auto& [s, st] : steps) {
      std::vector<std::pair<double, std::string>> order;
      for (const Ev& e : evs)
        if (e.step == s && (e.cat == "forward" || e.cat == "backward"))
          order.emplace_back(e.ts, e.cat + std::to_string(e.layer));
      std::sort(order.begin(), order.end());
      std::vector<std::string> names;
      for (auto& o : order) names.push_back(o.second);
      EXPECT_EQ(names, (std::vector<std::string>{"forward0", "forward1", "backward1", "backward0"}))
          << "step " << s;
      // Every layer has the ring receives of hops 0..P-2 in its forward and its backward.
      for (int layer = 0; layer < kLayers; ++layer) {
        std::set<int64_t> fwd_hops, bwd_hops;
        for (const Ev& e : recv_track[r]) {
          if (e.step != s || e.layer != layer) continue;
          for (const Ev& l : evs)
            if (l.step == s && l.layer == layer && l.ts <= e.ts + eps && e.end <= l.end + eps)
              (l.cat == "forward" ? fwd_hops : bwd_hops).insert(e.hop);
        }
        for (int h = 0; h + 1 < kRanks; ++h) {
          EXPECT_TRUE(fwd_hops.count(h))
              << "step " << s << " layer " << layer << " forward hop " << h;
          EXPECT_TRUE(bwd_hops.count(h))
              << "step " << s << " layer " << layer << " backward hop " << h;
        }
      }
    }
  }
  // --step keeps one step.
  const json one = ring::cli::build_trace({{files[0], slurp(files[0])}}, {.step = 2});
  for (const json& e : one["traceEvents"])
    if (e["ph"] == "X") EXPECT_EQ(e["args"]["step"], 2);
}

TEST(Observe, InjectedDelayNamesTheStraggler) {
  TempDir t("ringd-observe");
  const std::string jd = t.path + "/job";
  Proc d(ringd_args(kSpec4, jd, {"--steps", "8"}), t.path + "/ringd.out", t.path + "/ringd.err",
         {{"RING_DEBUG_DELAY", "rank=2,ms=250"}});
  ASSERT_EQ(d.wait(240), 0) << diag(t);
  const std::vector<json> named = events_named(t.path + "/ringd.out", "straggler");
  ASSERT_FALSE(named.empty()) << "no straggler event" << diag(t);
  EXPECT_EQ(named[0].value("rank", -1), 2) << named[0].dump();
  EXPECT_LE(named[0].value("step", 99), 5) << named[0].dump();
  EXPECT_GT(named[0].value("behind_s", 0.0), 0.1) << named[0].dump();
  for (const json& j : named) EXPECT_EQ(j.value("rank", -1), 2) << "blamed another rank: " << j;
  EXPECT_TRUE(events_named(t.path + "/ringd.out", "straggler_cleared").empty());
}

// Two levels (parallel.head_ranks 2: groups {0, 1} and {2, 3}, the rings 0-2 and 1-3): the slow
// rank's ring successor (0) waits on its receive and its group member (3) in the all-to-all;
// the ring of its own head slot names it, and nobody else.
TEST(Observe, InjectedDelayNamesTheStragglerWithHeadGroups) {
  TempDir t("ringd-observe");
  std::string spec = slurp(kSpec4);
  const std::string order = "  ring_order: natural\n";
  ASSERT_NE(spec.find(order), std::string::npos);
  spec.replace(spec.find(order), order.size(), "  head_ranks: 2\n" + order);
  std::ofstream(t.path + "/spec.yaml") << spec;
  Proc d(ringd_args(t.path + "/spec.yaml", t.path + "/job", {"--steps", "8"}),
         t.path + "/ringd.out", t.path + "/ringd.err", {{"RING_DEBUG_DELAY", "rank=2,ms=250"}});
  ASSERT_EQ(d.wait(240), 0) << diag(t);
  const std::vector<json> named = events_named(t.path + "/ringd.out", "straggler");
  ASSERT_FALSE(named.empty()) << "no straggler event" << diag(t);
  EXPECT_EQ(named[0].value("rank", -1), 2) << named[0].dump();
  for (const json& j : named) EXPECT_EQ(j.value("rank", -1), 2) << "blamed another rank: " << j;
}

// A hang finding in ringd's --json output: the rank named missing, every other rank waiting.
void expect_hang(const TempDir& t, Proc& d, int64_t missing, double max_s) {
  const json h = wait_line(
      t.path + "/ringd.out", [](const json& j) { return j.value("event", "") == "hang"; }, max_s,
      std::chrono::milliseconds(50));
  ASSERT_FALSE(h.is_null()) << "no hang event" << diag(t);
  EXPECT_EQ(h["missing"], json::array({missing})) << h.dump();
  std::set<int64_t> waiting;
  for (const json& w : h["waiting"]) {
    waiting.insert(w["rank"].get<int64_t>());
    EXPECT_FALSE(w["where"].get<std::string>().empty());
  }
  std::set<int64_t> others;
  for (int r = 0; r < kRanks; ++r)
    if (r != missing) others.insert(r);
  EXPECT_EQ(waiting, others) << h.dump();
  // Someone waits on the stuck rank itself (a ring receive from it or a send to it, or the
  // step's end it holds up), or on the step's collective.
  bool names_it = false;
  const std::regex r("rank " + std::to_string(missing) + "(\\D|$)");
  for (const json& w : h["waiting"])
    names_it = names_it || std::regex_search(w["where"].get<std::string>(), r) ||
               w["where"].get<std::string>().find("collective") != std::string::npos;
  EXPECT_TRUE(names_it) << h.dump();
  // Then the attempt fails (max_restarts 0): the stuck worker is killed, ringd exits 1.
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t);
  EXPECT_EQ(WEXITSTATUS(st), 1) << diag(t);
  bool failed = false;
  for (const json& j : events_named(t.path + "/ringd.out", "worker_failed"))
    failed = failed || (j.value("rank", -1) == missing &&
                        j.value("error", "").find("hung") != std::string::npos);
  EXPECT_TRUE(failed) << diag(t);
  // The flight recorder reached the job directory.
  EXPECT_EQ(ring::cli::timeline_files(t.path + "/job").size(), 1u);
}

TEST(Observe, SigstoppedWorkerIsNamedAsHung) {
  TempDir t("ringd-observe");
  const std::string spec = spec_with(t, "observability:\n  step_deadline_s: 8\n");
  Proc d(ringd_args(spec, t.path + "/job",
                    {"--steps", "100000", "--heartbeat-timeout", "60", "--stop-grace", "1"}),
         t.path + "/ringd.out", t.path + "/ringd.err");
  const json s2 = wait_line(
      t.path + "/ringd.out",
      [](const json& j) { return j.value("step", 0) >= 2 && !j.contains("event"); }, 180,
      std::chrono::milliseconds(50));
  ASSERT_FALSE(s2.is_null()) << diag(t);
  pid_t victim = -1;
  for (const json& j : events_named(t.path + "/ringd.out", "worker_started"))
    if (j.value("rank", -1) == 1) victim = j.at("pid").get<pid_t>();
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  expect_hang(t, d, 1, 60);
}

TEST(Observe, BlockedMainThreadIsNamedAsHung) {
  TempDir t("ringd-observe");
  const std::string spec = spec_with(t, "observability:\n  step_deadline_s: 8\n");
  Proc d(ringd_args(spec, t.path + "/job",
                    {"--steps", "100000", "--heartbeat-timeout", "60", "--stop-grace", "1"}),
         t.path + "/ringd.out", t.path + "/ringd.err", {{"RING_DEBUG_BLOCK", "rank=3,step=3"}});
  expect_hang(t, d, 3, 180);
}

// The events a ringd logged (the `event {json}` lines of logs/ringd-<node>.log).
std::vector<json> logged_events(const std::string& log, const std::string& name) {
  std::vector<json> v;
  std::istringstream in(slurp(log));
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("event {");
    if (at == std::string::npos) continue;
    const json j = json::parse(line.substr(at + 6), nullptr, false);
    if (j.is_object() && j.value("event", "") == name) v.push_back(j);
  }
  return v;
}

TEST(Observe, HangAcrossTwoNodesIsNamedByTheStuckRanksNode) {
  TempDir t("ringd-observe");
  const std::string spec = t.path + "/spec.yaml";
  std::ofstream(spec) << slurp(std::string(RING_SOURCE_DIR) + "/tests/ringd/two_nodes.yaml")
                      << "observability:\n  step_deadline_s: 8\n";
  const std::string jd = t.path + "/job";
  auto args = [&](int node) {
    return ringd_args(
        spec, jd,
        {"--nodes", "2", "--node-rank", std::to_string(node), "--rendezvous", t.path + "/rdv",
         "--steps", "100000", "--heartbeat-timeout", "60", "--stop-grace", "1"});
  };
  Proc d0(args(0), t.path + "/d0.out", t.path + "/d0.err");
  Proc d1(args(1), t.path + "/d1.out", t.path + "/d1.err");
  ASSERT_FALSE(wait_line(
                   t.path + "/d0.out",
                   [](const json& j) { return j.value("step", 0) >= 2 && !j.contains("event"); },
                   180, std::chrono::milliseconds(50))
                   .is_null())
      << slurp(jd + "/logs/ringd-0.log");
  pid_t victim = -1;
  for (const json& j : logged_events(jd + "/logs/ringd-1.log", "worker_started"))
    if (j.value("rank", -1) == 3) victim = j.at("pid").get<pid_t>();
  ASSERT_GT(victim, 0) << slurp(jd + "/logs/ringd-1.log");
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);
  for (Proc* d : {&d1, &d0}) {
    const int st = d->wait(90);
    ASSERT_TRUE(WIFEXITED(st)) << st << slurp(jd + "/logs/ringd-0.log")
                               << slurp(jd + "/logs/ringd-1.log");
    EXPECT_EQ(WEXITSTATUS(st), 1);
  }
  const std::vector<json> h1 = logged_events(jd + "/logs/ringd-1.log", "hang");
  ASSERT_EQ(h1.size(), 1u) << slurp(jd + "/logs/ringd-1.log");
  EXPECT_EQ(h1[0]["missing"], json::array({3})) << h1[0];
  ASSERT_EQ(h1[0]["waiting"].size(), 1u) << h1[0];
  EXPECT_EQ(h1[0]["waiting"][0]["rank"], 2) << h1[0];
  // Node 0 reports only where its ranks wait, never a rank of its own as missing; when node 1
  // failed the stuck rank a moment before node 0's own deadline check, node 0's ranks ended on
  // the lost peer first and node 0 has nothing to report.
  const std::vector<json> h0 = logged_events(jd + "/logs/ringd-0.log", "hang");
  ASSERT_LE(h0.size(), 1u) << slurp(jd + "/logs/ringd-0.log");
  for (const json& h : h0) {
    EXPECT_TRUE(h["missing"].empty()) << h;
    EXPECT_NE(h["message"].get<std::string>().find("other nodes"), std::string::npos) << h;
  }
  bool failed = false;
  for (const json& j : logged_events(jd + "/logs/ringd-1.log", "worker_failed"))
    failed = failed || j.value("rank", -1) == 3;
  EXPECT_TRUE(failed);
  EXPECT_EQ(ring::cli::timeline_files(jd).size(), 2u);
}

TEST(Observe, StatusAndTraceThroughTheCoordinator) {
  TempDir t("ringd-observe");
  const std::string ep = "ipc://" + t.path + "/coord.sock";
  Proc coord({RING_COORD_BIN, "--state-dir", t.path + "/state", "--endpoint", ep,
              "--heartbeat-interval", "0.2", "--heartbeat-timeout", "10", "--sync", "normal"},
             t.path + "/coord.out", t.path + "/coord.log");
  ring::coord::ClientOptions co;
  co.endpoint = ep;
  co.timeout = std::chrono::milliseconds(10000);
  int64_t job = 0;
  const auto end = Clock::now() + std::chrono::seconds(30);
  while (job == 0 && Clock::now() < end) {
    try {
      job = ring::coord::Client(co).submit(slurp(kSpec4), "", t.path + "/job").job;
    } catch (const ring::coord::ClientError&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ASSERT_GT(job, 0) << slurp(t.path + "/coord.log");
  Proc d(ringd_args(kSpec4, t.path + "/job",
                    {"--steps", "8", "--coord", ep, "--job", std::to_string(job)}),
         t.path + "/ringd.out", t.path + "/ringd.err", {{"RING_DEBUG_DELAY", "rank=2,ms=250"}});
  ASSERT_EQ(d.wait(240), 0) << diag(t);
  bool found = false;
  for (const auto& e : ring::coord::Client(co).events(job, 0, 1000))
    if (e.kind == "straggler") {
      found = true;
      EXPECT_EQ(e.data.value("rank", -1), 2) << e.data.dump();
      EXPECT_FALSE(e.data.value("node", "").empty()) << e.data.dump();
      for (const char* k : {"step", "steps", "behind_s", "message"})
        EXPECT_TRUE(e.data.contains(k)) << k << " in " << e.data.dump();
    }
  EXPECT_TRUE(found) << "no straggler event in ring-coord";
  // Every step report carried the 4 ranks' summaries (ring-coord's rank_steps): the delayed
  // rank's data phase holds its 250 ms, the others waited for it.
  std::vector<ring::protocol::RankStepRecord> rows;
  const auto rows_end = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < rows_end) {
    ring::coord::Store::Options so;
    so.read_only = true;
    rows = ring::coord::Store(t.path + "/state/coord.db", so).rank_steps(job, 1, 100, 1000);
    if (rows.size() >= 32) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(rows.size(), 32u);  // 8 steps x 4 ranks
  for (const auto& r : rows) {
    SCOPED_TRACE("step " + std::to_string(r.step) + " rank " + std::to_string(r.rank.rank));
    EXPECT_GT(r.rank.step_time_s, 0);
    EXPECT_GT(r.rank.hop_bytes, 0);
    EXPECT_LE(r.rank.data_s + r.rank.wait_s + r.rank.comm_s, r.rank.step_time_s + 1e-6);
    if (r.rank.rank == 2) EXPECT_GE(r.rank.data_s, 0.25);
    if (r.rank.rank != 2 && r.step >= 2) EXPECT_GE(r.rank.wait_s, 0.1);
  }

  Proc st({RINGCTL_BIN, "status", std::to_string(job), "--json", "--coord", ep},
          t.path + "/status.json", t.path + "/status.err");
  ASSERT_EQ(st.wait(30), 0) << slurp(t.path + "/status.err");
  const json s = json::parse(slurp(t.path + "/status.json"));
  ASSERT_TRUE(s["straggler"].is_object()) << s.dump();
  EXPECT_EQ(s["straggler"]["rank"], 2);
  EXPECT_TRUE(s["hang"].is_null());
  Proc text({RINGCTL_BIN, "status", std::to_string(job), "--coord", ep}, t.path + "/status.txt",
            t.path + "/status.err");
  ASSERT_EQ(text.wait(30), 0) << slurp(t.path + "/status.err");
  EXPECT_NE(slurp(t.path + "/status.txt").find("straggler:    rank 2 on "), std::string::npos)
      << slurp(t.path + "/status.txt");

  Proc tr({RINGCTL_BIN, "trace", std::to_string(job), "-o", t.path + "/trace.json", "--coord", ep},
          t.path + "/trace.out", t.path + "/trace.err");
  ASSERT_EQ(tr.wait(30), 0) << slurp(t.path + "/trace.err");
  const json trace = json::parse(slurp(t.path + "/trace.json"));
  std::set<int64_t> ranks;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["tid"].get<int64_t>() % 10 == 1)
      ranks.insert(e["tid"].get<int64_t>() / 10);
  EXPECT_EQ(ranks, (std::set<int64_t>{0, 1, 2, 3}));
}

TEST(Observe, CrossNodeStragglerIsNamedByTheCoordinator) {
  TempDir t("ringd-observe");
  const std::string ep = "ipc://" + t.path + "/coord.sock";
  Proc coord({RING_COORD_BIN, "--state-dir", t.path + "/state", "--endpoint", ep,
              "--heartbeat-interval", "0.2", "--heartbeat-timeout", "20", "--sync", "normal"},
             t.path + "/coord.out", t.path + "/coord.log");
  // two_nodes.yaml with one worker per node: ranks 0 (node 0) and 1 (node 1).
  std::string text = slurp(std::string(RING_SOURCE_DIR) + "/tests/ringd/two_nodes.yaml");
  for (auto [from, to] :
       {std::pair<std::string, std::string>{"context_ranks: 4", "context_ranks: 2"},
        {"workers_per_node: 2", "workers_per_node: 1"}}) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  }
  const std::string spec = t.path + "/spec.yaml";
  std::ofstream(spec) << text;
  ring::coord::ClientOptions co;
  co.endpoint = ep;
  co.timeout = std::chrono::milliseconds(10000);
  int64_t job = 0;
  const auto end = Clock::now() + std::chrono::seconds(30);
  while (job == 0 && Clock::now() < end) {
    try {
      job = ring::coord::Client(co).submit(text, "", t.path + "/job").job;
    } catch (const ring::coord::ClientError&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ASSERT_GT(job, 0) << slurp(t.path + "/coord.log");
  const std::string jd = t.path + "/job";
  auto args = [&](int node) {
    return ringd_args(
        spec, jd,
        {"--nodes", "2", "--node-rank", std::to_string(node), "--rendezvous", t.path + "/rdv",
         "--steps", "8", "--coord", ep, "--job", std::to_string(job)});
  };
  const std::vector<std::pair<std::string, std::string>> delay = {
      {"RING_DEBUG_DELAY", "rank=0,ms=250"}};
  Proc d0(args(0), t.path + "/d0.out", t.path + "/d0.err", delay);
  Proc d1(args(1), t.path + "/d1.out", t.path + "/d1.err", delay);
  auto logs = [&] {
    return "\n--- ringd-0.log\n" + slurp(jd + "/logs/ringd-0.log") + "\n--- ringd-1.log\n" +
           slurp(jd + "/logs/ringd-1.log") + "\n--- coord.log\n" + slurp(t.path + "/coord.log");
  };
  ASSERT_EQ(d0.wait(240), 0) << logs();
  ASSERT_EQ(d1.wait(60), 0) << logs();
  // The finding is recorded when the step's last report arrives: poll until the job completed.
  std::vector<ring::protocol::EventRecord> named;
  const auto ev_end = Clock::now() + std::chrono::seconds(30);
  bool completed = false;
  while (Clock::now() < ev_end && !completed) {
    named.clear();
    for (const auto& e : ring::coord::Client(co).events(job, 0, 1000)) {
      if (e.kind == "straggler") named.push_back(e);
      if (e.kind == "state" && e.data.value("to", "") == "completed") completed = true;
    }
    if (!completed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(named.empty()) << "no straggler event" << logs();
  // Once, by ring-coord (each ringd sees one rank: it cannot name any).
  ASSERT_EQ(named.size(), 1u) << logs();
  const json& d = named[0].data;
  EXPECT_EQ(d.value("rank", -1), 0) << d.dump();
  EXPECT_EQ(d.value("source", ""), "coordinator") << d.dump();
  EXPECT_NE(d.value("node", "").find("-n0"), std::string::npos) << d.dump();
  EXPECT_EQ(named[0].node, d.value("node", "?"));
  EXPECT_LE(d.value("step", 99), 5) << d.dump();
  EXPECT_GT(d.value("behind_s", 0.0), 0.1) << d.dump();
  for (const auto& e : ring::coord::Client(co).events(job, 0, 1000))
    if (e.kind == "straggler_cleared") ADD_FAILURE() << "cleared: " << e.data.dump();
  for (const auto& node_log : {jd + "/logs/ringd-0.log", jd + "/logs/ringd-1.log"})
    EXPECT_TRUE(logged_events(node_log, "straggler").empty()) << slurp(node_log);

  Proc st({RINGCTL_BIN, "status", std::to_string(job), "--json", "--coord", ep},
          t.path + "/status.json", t.path + "/status.err");
  ASSERT_EQ(st.wait(30), 0) << slurp(t.path + "/status.err");
  const json s = json::parse(slurp(t.path + "/status.json"));
  ASSERT_TRUE(s["straggler"].is_object()) << s.dump();
  EXPECT_EQ(s["straggler"]["rank"], 0);
  EXPECT_EQ(s["straggler"]["source"], "coordinator");
  EXPECT_EQ(s["stragglers"].size(), 1u) << s.dump();
  Proc txt({RINGCTL_BIN, "status", std::to_string(job), "--coord", ep}, t.path + "/status.txt",
           t.path + "/status.err");
  ASSERT_EQ(txt.wait(30), 0) << slurp(t.path + "/status.err");
  const std::string out = slurp(t.path + "/status.txt");
  EXPECT_NE(out.find("straggler:    rank 0 on "), std::string::npos) << out;
  EXPECT_NE(out.find("named by ring-coord across nodes"), std::string::npos) << out;
}

}  // namespace
