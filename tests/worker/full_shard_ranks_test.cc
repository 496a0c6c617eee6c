// parallel.shard full over real processes and the UCX transport (full_shard_helper, one per
// rank; 2 nodes of 2 workers): a bf16 model's weight gathers carry bf16, the reduce-scatters
// fp32. Checked: the loss and every delivered gradient part are bit-identical to the same bf16
// model fed by fp32 gathers (the model rounds an fp32 block to the values the owner's one
// rounding sends); the gather bytes each rank sends are exactly half (no header: a message is
// the values), the reduce-scatter bytes unchanged; and `ringctl plan`'s shard-full sizes
// (common/plan FullShardLayout, common/cp/shard_messages.h) equal what the ranks sent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/plan/plan.h"
#include "tests/common/test_proc.h"
#include "tests/worker/full_shard_stage.h"

namespace ring::test {
namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 4, kPerNode = 2;

struct Stats {
  int64_t gathers = 0, scatters = 0, gather_bytes = 0, scatter_bytes = 0;
};

struct RanksRun {
  std::vector<std::string> results;  // [rank] result file
  std::vector<Stats> stats;          // [rank]
};

RanksRun run_ranks(const std::string& dtype, const std::string& gather) {
  TempDir dir("full-shard-ranks");
  ProcGroup procs;
  for (int r = 0; r < kWorld; ++r) {
    const std::string log = dir.path + "/log-" + std::to_string(r);
    procs.start({FULL_SHARD_HELPER, std::to_string(r), std::to_string(kWorld),
                 std::to_string(kPerNode), dir.path, dtype, gather},
                log, log);
  }
  RanksRun run;
  EXPECT_TRUE(procs.wait_all(120s)) << "ranks did not finish\n" << procs.logs();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(procs.status(r), 0) << procs.logs();
    run.results.push_back(slurp(dir.path + "/result-" + std::to_string(r)));
    std::istringstream s(slurp(dir.path + "/stats-" + std::to_string(r)));
    Stats st;
    s >> st.gathers >> st.scatters >> st.gather_bytes >> st.scatter_bytes;
    run.stats.push_back(st);
  }
  return run;
}

TEST(FullShardRanks, Bf16GathersHalveTheBytesAndKeepTheBits) {
  const RanksRun f32 = run_ranks("fp32", "fp32");
  const RanksRun mixed = run_ranks("bf16", "fp32");  // a bf16 model rounding fp32 blocks
  const RanksRun b16 = run_ranks("bf16", "bf16");
  if (::testing::Test::HasFailure()) return;
  const plan::FullShardLayout fs32 = plan::full_shard_layout(shard_ranks_spec(kWorld, kPerNode, false));
  const plan::FullShardLayout fs16 = plan::full_shard_layout(shard_ranks_spec(kWorld, kPerNode, true));
  ASSERT_EQ(fs32.ranks(), kWorld);
  double sent32 = 0, sent16 = 0, plan32 = 0, plan16 = 0, scattered = 0, plan_scattered = 0;
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_GT(b16.results[r].size(), 16u);
    EXPECT_EQ(b16.results[r], mixed.results[r])
        << "rank " << r << ": bf16 gathers changed the loss or a gradient bit";
    EXPECT_NE(b16.results[r], f32.results[r]) << "rank " << r << ": the bf16 model computed fp32";
    // The same gathers and reduce-scatters; the gathers half the bytes, exactly.
    EXPECT_EQ(b16.stats[r].gathers, mixed.stats[r].gathers);
    EXPECT_EQ(b16.stats[r].scatters, mixed.stats[r].scatters);
    EXPECT_GT(mixed.stats[r].gather_bytes, 0) << "rank " << r;
    EXPECT_EQ(mixed.stats[r].gather_bytes, f32.stats[r].gather_bytes);
    EXPECT_EQ(2 * b16.stats[r].gather_bytes, mixed.stats[r].gather_bytes) << "rank " << r;
    EXPECT_EQ(b16.stats[r].scatter_bytes, f32.stats[r].scatter_bytes) << "rank " << r;
    sent32 += static_cast<double>(f32.stats[r].gather_bytes);
    sent16 += static_cast<double>(b16.stats[r].gather_bytes);
    scattered += static_cast<double>(b16.stats[r].scatter_bytes);
    // The plan counts what a rank receives: summed over the ranks, what they all sent.
    plan32 += fs32.gathered_bytes(r);
    plan16 += fs16.gathered_bytes(r);
    plan_scattered += fs16.scattered_bytes(r);
  }
  EXPECT_EQ(sent16 / sent32, 0.5);
  EXPECT_EQ(plan32, sent32);
  EXPECT_EQ(plan16, sent16);
  EXPECT_EQ(plan_scattered, scattered);
  std::printf("gather bytes sent by all ranks: fp32 %.0f, bf16 %.0f (%.3f); reduce-scatter %.0f "
              "(fp32 both)\n",
              sent32, sent16, sent16 / sent32, scattered);
}

}  // namespace
}  // namespace ring::test
