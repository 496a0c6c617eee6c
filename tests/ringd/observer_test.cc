// ringd's observability logic alone (daemon/ringd/observer.h): straggler attribution on
// synthetic rings (the slow rank named, the ranks that waited never), its clearing, the hang
// classification (stopped, stuck outside a wait, waiting with where), and the node timeline file
// read back by ringctl's trace export (cli/trace_export.h).
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli/trace_export.h"
#include "daemon/ringd/observer.h"
#include "tests/common/test_proc.h"

namespace {

using namespace ring::ringd;
namespace tl = ring::contract::timeline;

// One step of a ring of n ranks (natural order: rank r receives from r-1) where `slow` (or -1)
// arrived `late_s` late: every other rank waited about late_s (its successor directly, the rest
// through the forwarded blocks and the collectives), the slow one not at all.
std::vector<RankSample> ring_step(int n, int slow, double late_s, double base_wait = 0.002) {
  std::vector<RankSample> v;
  for (int r = 0; r < n; ++r)
    v.push_back({r, (r + n - 1) % n, 0.05 + late_s, r == slow ? base_wait : base_wait + late_s});
  return v;
}

TEST(Straggler, SlowRankNamedWithinThreeStepsOthersNever) {
  StragglerTracker t;
  std::optional<StragglerTracker::Finding> named;
  for (int s = 1; s <= 10; ++s) {
    auto c = t.add(s, ring_step(4, 2, 0.25));
    EXPECT_FALSE(c.cleared);
    if (c.named) {
      EXPECT_FALSE(named) << "named twice";
      named = c.named;
    }
  }
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 2);
  EXPECT_EQ(named->step, 3);
  EXPECT_EQ(named->steps, 3);
  EXPECT_NEAR(named->behind_s, 0.25, 1e-9);
  ASSERT_TRUE(t.current());
  EXPECT_EQ(t.current()->steps, 8);  // the whole window
}

TEST(Straggler, OnlyTheSuccessorWaitedStillBlamesTheSender) {
  // Rank 1 is late and only rank 2 (which receives from it) waited: rank 1 is charged, rank 2
  // (the one that waited) is not.
  std::vector<RankSample> v = ring_step(4, -1, 0);
  v[2].wait_s = 0.3;
  auto [rank, behind] = StragglerTracker::last_of(v, 0.005, 0.05);
  EXPECT_EQ(rank, 1);
  EXPECT_NEAR(behind, 0.298, 1e-9);
}

TEST(Straggler, BalancedStepsNameNobodyAndNoiseIsIgnored) {
  StragglerTracker t;
  for (int s = 1; s <= 20; ++s) {
    // Jitter of 1 ms on a 50 ms step: under the threshold.
    std::vector<RankSample> v = ring_step(4, -1, 0);
    v[s % 4].wait_s += 0.001;
    auto c = t.add(s, v);
    EXPECT_FALSE(c.named) << "step " << s;
  }
  EXPECT_FALSE(t.current());
}

TEST(Straggler, ClearedWhenTheDelayStopsAndAnotherRankReplacesIt) {
  StragglerTracker t;
  int64_t s = 0;
  for (int i = 0; i < 5; ++i) t.add(++s, ring_step(4, 1, 0.2));
  ASSERT_TRUE(t.current());
  EXPECT_EQ(t.current()->rank, 1);
  std::optional<StragglerTracker::Finding> cleared;
  for (int i = 0; i < 8 && !cleared; ++i) cleared = t.add(++s, ring_step(4, -1, 0)).cleared;
  ASSERT_TRUE(cleared);
  EXPECT_EQ(cleared->rank, 1);
  EXPECT_FALSE(t.current());
  // Now rank 3.
  std::optional<StragglerTracker::Finding> named;
  for (int i = 0; i < 5 && !named; ++i) named = t.add(++s, ring_step(4, 3, 0.2)).named;
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 3);
  const nlohmann::json d = straggler_data(*named, "host-j1-n0", false);
  for (const char* k : {"rank", "node", "step", "steps", "behind_s", "message"})
    EXPECT_TRUE(d.contains(k)) << k;
}

// Issue 31.17: workers sharing cores make every rank wait 0-90 ms now and then, at random, on a
// 1 s step. The old fixed threshold (5 % of the step) named a rank "last" in most steps and soon
// a straggler with no fault present. Judged against the others' measured spread nobody is named
// in 400 steps; a rank throttled by 0.3 s on top of the same noise is named within 3 steps, the
// finding saying how far outside the noise it is.
std::vector<RankSample> noisy_step(std::mt19937& rng, int n, int slow, double late_s) {
  std::uniform_real_distribution<double> jitter(0, 0.09);
  std::vector<RankSample> v;
  for (int r = 0; r < n; ++r) {
    const double w = 0.01 + jitter(rng);
    v.push_back({r, (r + n - 1) % n, 1.0 + late_s, w});
  }
  // The slow rank's successor and the rest wait for it; it waits only its own jitter.
  if (slow >= 0)
    for (auto& x : v)
      if (x.rank != slow) x.wait_s += late_s;
  return v;
}

TEST(Straggler, SharedCoresRaiseNoFalseAlarmAThrottledRankIsNamedFast) {
  std::mt19937 rng(31);
  StragglerTracker quiet;
  int last_by_fixed_rule = 0;
  for (int s = 1; s <= 400; ++s) {
    const auto v = noisy_step(rng, 4, -1, 0);
    if (StragglerTracker::last_of(v, 0.005, 0.05).first >= 0) ++last_by_fixed_rule;
    const auto c = quiet.add(s, v);
    EXPECT_FALSE(c.named) << "step " << s << ": rank " << c.named->rank << " "
                          << c.named->behind_s;
  }
  EXPECT_GT(last_by_fixed_rule, 100);  // the old rule's view of the same steps
  StragglerTracker t;
  std::optional<StragglerTracker::Finding> named;
  for (int s = 1; s <= 3 && !named; ++s) named = t.add(s, noisy_step(rng, 4, 2, 0.3)).named;
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 2);
  EXPECT_GT(named->sigmas, 4);
  EXPECT_GT(named->noise_s, 0);
  const nlohmann::json d = straggler_data(*named, "host-j1-n0", false);
  EXPECT_NE(d["message"].get<std::string>().find("times the other ranks' noise"),
            std::string::npos)
      << d["message"];
}

TEST(Hang, StoppedAndStuckRanksMissingOthersWaitingWithWhere) {
  const int64_t now = 100'000'000'000;
  std::vector<HangInput> in(4);
  for (int r = 0; r < 4; ++r) {
    in[r].rank = r;
    in[r].snap.ok = true;
    in[r].snap.progress_ns = now - 9'000'000'000;
    in[r].proc_state = 'S';
  }
  in[0].snap.current = {.kind = tl::Phase::kRingWait, .step = 5, .layer = 1, .hop = 0, .peer = 3};
  in[1].snap.current = {.kind = tl::Phase::kCollective, .step = 5};
  in[2].proc_state = 'T';  // SIGSTOPped inside a wait: still missing
  in[2].snap.current = {.kind = tl::Phase::kRingWait, .step = 5, .layer = 0, .hop = 1, .peer = 1};
  in[3].snap.events.push_back({.kind = tl::Phase::kData, .step = 4});  // stuck outside any wait
  const HangFinding f = analyse_hang(5, 9.5, 8, in, now);
  EXPECT_EQ(f.missing, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(f.waiting.size(), 2u);
  EXPECT_EQ(f.waiting[0].rank, 0);
  EXPECT_EQ(f.waiting[0].where, "ring recv from rank 3, layer 1 hop 0");
  EXPECT_EQ(describe_wait({.kind = tl::Phase::kRingSend, .layer = 0, .hop = 2, .peer = 1}),
            "ring send to rank 1, layer 0 hop 2");
  // Two-level attention: the wait names the level and the group (peer = its first rank, hop =
  // its size).
  EXPECT_EQ(describe_wait({.kind = tl::Phase::kHeadAllToAll, .layer = 3, .hop = 4, .peer = 8}),
            "head all-to-all inside the group of ranks 8..11 (two-level attention), layer 3");
  EXPECT_STREQ(tl::phase_name(tl::Phase::kHeadAllToAll), "head_all_to_all");
  EXPECT_EQ(f.waiting[1].rank, 1);
  EXPECT_NE(f.message.find("rank 2 is stopped"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("rank 3 made no progress"), std::string::npos) << f.message;
  const nlohmann::json d = hang_data(5, 8, f);
  EXPECT_EQ(d["missing"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(d["waiting"][0]["rank"], 0);
  // A rank that is ending (a zombie not reaped yet, after a failure on a lost peer) is neither.
  in[3].proc_state = 'Z';
  EXPECT_EQ(analyse_hang(5, 9.5, 8, in, now).missing, (std::vector<int64_t>{2}));
  in[3].proc_state = 'S';
  // Nor one whose main thread recorded progress a moment ago (between two waits).
  in[3].snap.progress_ns = now - 100'000'000;
  EXPECT_EQ(analyse_hang(5, 9.5, 8, in, now).missing, (std::vector<int64_t>{2}));
  in[3].snap.progress_ns = now - 9'000'000'000;
  // A rank that finished the step is not missing: it waits for the step's end, held up by the
  // missing ranks.
  in[3].done = true;
  const HangFinding g = analyse_hang(5, 9.5, 8, in, now);
  EXPECT_EQ(g.missing, (std::vector<int64_t>{2}));
  ASSERT_EQ(g.waiting.size(), 3u);  // by rank: 0, 1, 3
  EXPECT_EQ(g.waiting[2].rank, 3);
  EXPECT_EQ(g.waiting[2].where,
            "finished step 5: waits for the step's end (ringd's next weights), held up by rank 2");
  in[2].done = true;
  const HangFinding h = analyse_hang(5, 9.5, 8, in, now);
  EXPECT_TRUE(h.missing.empty());
  ASSERT_EQ(h.waiting.size(), 4u);
  EXPECT_NE(h.waiting[3].where.find("held up by ranks of other nodes"), std::string::npos);
}

TEST(Hang, ProcStateOfThisProcessIsRunning) {
  EXPECT_EQ(proc_state(::getpid()), 'R');
  EXPECT_EQ(proc_state(-1), '?');
}

TEST(NodeTimeline, WrittenAndReadBackAsATraceKeepingTheNewestSteps) {
  ring::test::TempDir t("observer-test");
  std::vector<tl::Snapshot> snaps(2);
  for (int r = 0; r < 2; ++r) {
    snaps[r].ok = true;
    snaps[r].rank = r;
    for (int s = 1; s <= 10; ++s)
      snaps[r].events.push_back(
          {.kind = tl::Phase::kStep, .step = s, .begin_ns = s * 1000, .end_ns = s * 1000 + 500});
  }
  DaemonTimeline d(4);
  for (int s = 1; s <= 6; ++s)
    d.record({.kind = tl::Phase::kOptimizer,
              .step = s,
              .begin_ns = s * 1000 + 600,
              .end_ns = s * 1000 + 700});
  EXPECT_EQ(d.events(0).size(), 4u);  // a fixed ring
  const std::string path = t.path + "/node-0.jsonl";
  ASSERT_EQ(write_node_timeline(path, 0, "n0", snaps, d.events(0), 32, 10), "");
  const nlohmann::json trace = ring::cli::build_trace({{path, ring::test::slurp(path)}}, {});
  int x = 0;
  int64_t min_step = 100;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") {
      ++x;
      min_step = std::min<int64_t>(min_step, e["args"]["step"]);
    }
  EXPECT_LE(x, 10);        // max_records
  EXPECT_EQ(min_step, 7);  // the newest steps kept whole: 7..10 (2 ranks) + ringd's 7..
  // A malformed file names itself and the line.
  try {
    ring::cli::build_trace(
        {{"f.jsonl", "{\"node_rank\":0,\"clock\":{\"mono_ns\":1,\"unix_ns\":2}}\n[1,2]\n"}}, {});
    FAIL() << "accepted a short record";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("f.jsonl:2"), std::string::npos) << e.what();
  }
}

}  // namespace
