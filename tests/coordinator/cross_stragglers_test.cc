// ring-coord's straggler pass over every node's ranks (coordinator/cross_stragglers.h), fed
// step reports by hand: 2 nodes x 2 ranks on the ring 0 -> 1 -> 2 -> 3 -> 0 (prev of r is r-1).
//
//   NamesARankWhoseVictimIsOnAnotherNode: rank 1 (node a) is slow; its successor rank 2 (node b)
//     waits, and the waits propagate; rank 1 is named within 5 steps, with its node and how far
//     behind, never another rank.
//   JudgesOnlyCompleteSteps: a step one node never reported is dropped (not judged on half its
//     ranks) once a later step is complete; pending steps are bounded.
//   LeavesARankItsRingdNamesAlone: when a ringd already names the rank, the pass reports nothing;
//     once the ringd's finding is gone and the rank still straggles, the pass names it.
//   ClearsWhenItRecovers / NewAttemptClears / OneNodeJobsAreLeftToRingd / OlderAttemptIgnored.
#include "coordinator/cross_stragglers.h"

#include <gtest/gtest.h>

namespace {

using ring::coord::CrossNodeStragglers;
using ring::protocol::RankStep;
using ring::protocol::StepReport;

// Node a holds ranks 0, 1; node b ranks 2, 3. `slow`: the rank that arrives `late_s` late: its
// successor waits late_s, the others a little less (the wait propagates), the slow rank nothing.
std::vector<StepReport> step(int64_t s, int64_t slow, double late_s, int64_t attempt = 1) {
  StepReport a{"node-a", 7, attempt, s, 1.0, 1000, 1.0, 0.1, {}};
  StepReport b{"node-b", 7, attempt, s, 1.0, 1000, 1.0, 0.1, {}};
  for (int64_t r = 0; r < 4; ++r) {
    RankStep x;
    x.rank = r;
    x.prev = (r + 3) % 4;
    x.step_time_s = 1.0 + late_s;
    x.data_s = r == slow ? late_s : 0.0;
    x.compute_s = 0.5;
    const int64_t behind = slow < 0 ? 0 : (r - slow + 4) % 4;  // 1: the successor
    x.wait_s = slow < 0 || behind == 0 ? 0.01 : late_s * (1.0 - 0.1 * (behind - 1));
    (r < 2 ? a : b).ranks.push_back(x);
  }
  return {a, b};
}

auto never = [](int64_t, int64_t, int64_t) { return false; };

TEST(CrossNodeStragglers, NamesARankWhoseVictimIsOnAnotherNode) {
  CrossNodeStragglers c;
  std::vector<CrossNodeStragglers::Emit> all;
  int64_t named_at = 0;
  for (int64_t s = 1; s <= 10; ++s)
    for (const auto& r : step(s, 1, 0.25))
      for (auto& e : c.add(r, 2, never)) {
        if (e.kind == "straggler" && !named_at) named_at = s;
        all.push_back(e);
      }
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, "straggler");
  EXPECT_EQ(all[0].rank, 1);
  EXPECT_EQ(all[0].node, "node-a");
  EXPECT_EQ(all[0].job, 7);
  EXPECT_EQ(all[0].attempt, 1);
  EXPECT_LE(named_at, 5);
  EXPECT_EQ(all[0].data["source"], "coordinator");
  EXPECT_EQ(all[0].data["node"], "node-a");
  EXPECT_NEAR(all[0].data["behind_s"].get<double>(), 0.24, 1e-9);
  EXPECT_GE(all[0].data["steps"].get<int>(), 3);
  EXPECT_EQ(c.current(7), 1);
  EXPECT_EQ(c.judged(), 10u);
}

TEST(CrossNodeStragglers, JudgesOnlyCompleteSteps) {
  CrossNodeStragglers c;
  // Only node a reports steps 1..3 (node b's reports of them are lost): nothing is judged.
  for (int64_t s = 1; s <= 3; ++s) EXPECT_TRUE(c.add(step(s, 1, 0.25)[0], 2, never).empty());
  EXPECT_EQ(c.judged(), 0u);
  // Step 4 completes: steps 1..3 are dropped (a node reports in order: they never complete).
  for (const auto& r : step(4, 1, 0.25)) c.add(r, 2, never);
  EXPECT_EQ(c.judged(), 1u);
  EXPECT_EQ(c.dropped(), 3u);
  // A late report of a dropped step is ignored.
  EXPECT_TRUE(c.add(step(2, 1, 0.25)[1], 2, never).empty());
  EXPECT_EQ(c.judged(), 1u);
  // At most max_pending steps wait.
  for (int64_t s = 5; s <= 30; ++s) c.add(step(s, 1, 0.25)[0], 2, never);
  EXPECT_EQ(c.dropped(), 3u + 26u - CrossNodeStragglers::Options{}.max_pending);
}

TEST(CrossNodeStragglers, LeavesARankItsRingdNamesAlone) {
  CrossNodeStragglers c;
  bool ringd_names_it = true;
  auto by_ringd = [&](int64_t job, int64_t attempt, int64_t rank) {
    EXPECT_EQ(job, 7);
    EXPECT_EQ(attempt, 1);
    return ringd_names_it && rank == 1;
  };
  for (int64_t s = 1; s <= 8; ++s)
    for (const auto& r : step(s, 1, 0.25)) EXPECT_TRUE(c.add(r, 2, by_ringd).empty());
  EXPECT_FALSE(c.current(7));
  ringd_names_it = false;  // the ringd cleared it; ring-coord still sees rank 1 last
  std::vector<CrossNodeStragglers::Emit> all;
  for (const auto& r : step(9, 1, 0.25))
    for (auto& e : c.add(r, 2, by_ringd)) all.push_back(e);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].kind, "straggler");
  EXPECT_EQ(all[0].rank, 1);
}

TEST(CrossNodeStragglers, ClearsWhenItRecovers) {
  CrossNodeStragglers c;
  std::vector<CrossNodeStragglers::Emit> all;
  for (int64_t s = 1; s <= 6; ++s)
    for (const auto& r : step(s, 2, 0.25))
      for (auto& e : c.add(r, 2, never)) all.push_back(e);
  for (int64_t s = 7; s <= 20; ++s)
    for (const auto& r : step(s, -1, 0))
      for (auto& e : c.add(r, 2, never)) all.push_back(e);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].kind, "straggler");
  EXPECT_EQ(all[0].rank, 2);
  EXPECT_EQ(all[0].node, "node-b");
  EXPECT_EQ(all[1].kind, "straggler_cleared");
  EXPECT_EQ(all[1].rank, 2);
  EXPECT_FALSE(c.current(7));
}

TEST(CrossNodeStragglers, NewAttemptClears) {
  CrossNodeStragglers c;
  for (int64_t s = 1; s <= 6; ++s)
    for (const auto& r : step(s, 3, 0.25)) c.add(r, 2, never);
  ASSERT_EQ(c.current(7), 3);
  auto e = c.add(step(5, -1, 0, 2)[0], 2, never);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, "straggler_cleared");
  EXPECT_EQ(e[0].attempt, 1);
  EXPECT_NE(e[0].data["message"].get<std::string>().find("attempt 1 ended"), std::string::npos);
  EXPECT_FALSE(c.current(7));
  // The old attempt's late reports change nothing.
  for (const auto& r : step(7, 3, 0.25, 1)) EXPECT_TRUE(c.add(r, 2, never).empty());
}

TEST(CrossNodeStragglers, OneNodeJobsAreLeftToRingd) {
  CrossNodeStragglers c;
  for (int64_t s = 1; s <= 8; ++s) {
    auto rs = step(s, 1, 0.25);
    rs[0].ranks.insert(rs[0].ranks.end(), rs[1].ranks.begin(), rs[1].ranks.end());
    EXPECT_TRUE(c.add(rs[0], 1, never).empty());
  }
  EXPECT_EQ(c.judged(), 0u);
}

}  // namespace
