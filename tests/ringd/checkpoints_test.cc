// ringd's checkpoints (daemon/ringd/checkpoints.h) alone: a real Checkpointer writing into a temp
// dir, its results told as log lines and events and recorded, the newest complete checkpoint,
// the message of a failed final checkpoint, the wait for node 0's commit.
#include "daemon/ringd/checkpoints.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/contract/layout.h"
#include "common/contract/model_config.h"
#include "common/contract/shard.h"
#include "common/spec/parse.h"
#include "tests/common/test_proc.h"

namespace {

using namespace ring;
using ringd::Checkpoints;
namespace fs = std::filesystem;

struct Rig {
  test::TempDir t{"ringd-checkpoints"};
  std::vector<std::string> lines;
  std::vector<nlohmann::json> events;
  std::vector<ckpt::SaveResult> recorded;
  std::vector<float> master = std::vector<float>(4096, 1.5f);

  std::string dir() const { return t.path + "/ck"; }
  Checkpoints make(const std::string& dir, int node_rank = 0, int nodes = 1,
                   const std::string& spec_hash = "spec-hash") {
    ckpt::Options co;
    co.dir = dir;
    co.keep_last = 2;
    co.node_rank = node_rank;
    co.nodes = nodes;
    co.spec_hash = spec_hash;
    co.fsync = false;
    return Checkpoints(
        co, {[this](const std::string& l) { lines.push_back(l); },
             [this](const std::string& n, nlohmann::json f) {
               f["event"] = n;
               events.push_back(f);
             },
             [this](const ckpt::SaveResult& r) { recorded.push_back(r); }});
  }
  std::vector<optim::StateTensor> tensors() {
    optim::StateTensor t;
    t.name = "master/w";
    t.kind = "master";
    t.param = "w";
    t.shape = {static_cast<int64_t>(master.size())};
    t.data = master.data();
    t.size = static_cast<int64_t>(master.size());
    return {t};
  }
};

TEST(Checkpoints, OffWithoutADirectory) {
  Rig rig;
  Checkpoints c = rig.make("");
  c.open(1, rig.tensors());
  EXPECT_FALSE(c.active());
  c.start(3, {});
  EXPECT_EQ(c.last_started(), -1);
  EXPECT_FALSE(c.drain_before_update().has_value());
  c.poll();
  c.close(true, 3);
  EXPECT_TRUE(rig.lines.empty());
  EXPECT_TRUE(rig.recorded.empty());
}

TEST(Checkpoints, SavesReportsAndNamesTheNewestComplete) {
  Rig rig;
  Checkpoints c = rig.make(rig.dir());
  c.open(1, rig.tensors());
  ASSERT_TRUE(c.active());
  c.start(2, {{"attempt", 1}});
  EXPECT_EQ(c.last_started(), 2);
  c.wait(2);
  const std::string step_dir = rig.dir() + "/" + ckpt::step_dir_name(2);
  ASSERT_EQ(rig.recorded.size(), 1u);
  EXPECT_TRUE(rig.recorded[0].ok) << rig.recorded[0].error;
  ASSERT_EQ(rig.lines.size(), 1u);
  EXPECT_EQ(rig.lines[0].rfind("checkpoint step 2 saved: " + step_dir + " (", 0), 0u)
      << rig.lines[0];
  ASSERT_EQ(rig.events.size(), 1u);
  EXPECT_EQ(rig.events[0]["event"], "checkpoint_saved");
  EXPECT_EQ(rig.events[0]["step"], 2);
  EXPECT_EQ(rig.events[0]["path"], step_dir);
  EXPECT_TRUE(fs::is_directory(step_dir));
  EXPECT_EQ(c.newest_complete(), step_dir + " (step 2)");

  // One in the background, found by poll().
  c.start(4, {{"attempt", 1}});
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (rig.recorded.size() < 2 && std::chrono::steady_clock::now() < end) {
    c.poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(rig.recorded.size(), 2u);
  EXPECT_EQ(rig.recorded[1].step, 4);
  EXPECT_EQ(c.newest_complete(), rig.dir() + "/" + ckpt::step_dir_name(4) + " (step 4)");
  // Nothing in flight: nothing to wait for before the optimizer's update.
  EXPECT_FALSE(c.drain_before_update().has_value());
  c.close(false, 4);
  EXPECT_FALSE(c.active());
  EXPECT_EQ(rig.recorded.size(), 2u);  // nothing more was in flight
}

TEST(Checkpoints, AFailedCheckpointIsToldAndFailsTheRun) {
  Rig rig;
  Checkpoints c = rig.make(rig.dir());
  ckpt::SaveResult bad;
  bad.ok = false;
  bad.step = 7;
  bad.error = "no space left on device";
  EXPECT_FALSE(c.report(bad));
  ASSERT_EQ(rig.lines.size(), 1u);
  EXPECT_EQ(rig.lines[0], "checkpoint step 7 failed: no space left on device");
  ASSERT_EQ(rig.events.size(), 1u);
  EXPECT_EQ(rig.events[0]["event"], "checkpoint_failed");
  EXPECT_EQ(rig.events[0]["error"], "no space left on device");
  ASSERT_EQ(rig.recorded.size(), 1u);

  EXPECT_EQ(c.final_error(nullptr, false, 7), "");
  fs::create_directories(rig.dir());  // checkpoints on, none written yet
  const std::string error = "no space left on device";
  EXPECT_EQ(c.final_error(&error, true, 7),
            "the stop checkpoint (step 7) failed: no space left on device; the newest complete "
            "checkpoint is none (in " + rig.dir() + ")");
  // With a complete one on disk, it is named.
  c.open(2, rig.tensors());
  c.start(5, {});
  c.wait(5);
  EXPECT_EQ(c.final_error(&error, false, 7),
            "the final checkpoint (step 7) failed: no space left on device; the newest complete "
            "checkpoint is " + rig.dir() + "/" + ckpt::step_dir_name(5) + " (step 5)");
}

// Issue 31.2: a resume that was asked for and loads nothing fails, naming why; it never starts
// from fresh weights (the old behaviour: "starting from step 0").
TEST(Checkpoints, AResumeThatLoadsNothingFails) {
  Rig rig;
  optim::LocalExchange ex;
  int restores = 0;
  const auto count = [&](const ckpt::LoadResult&) { ++restores; };
  Checkpoints off = rig.make("");
  try {
    off.resume(rig.tensors(), INT64_MAX, false, ex, count);
    FAIL() << "no throw";
  } catch (const ringd::ResumeFailure& e) {
    EXPECT_EQ(std::string(e.what()),
              "a resume was asked for, but checkpoints are off (checkpoint.dir is empty)");
    EXPECT_FALSE(e.retry());
  }
  Checkpoints c = rig.make(rig.dir());
  fs::create_directories(rig.dir());
  try {
    c.resume(rig.tensors(), 10, true, ex, count);
    FAIL() << "no throw";
  } catch (const ringd::ResumeFailure& e) {
    EXPECT_EQ(std::string(e.what()), "cannot resume from step 10: no usable checkpoint in " + rig.dir());
    EXPECT_FALSE(e.retry());
  }
  // Step 2 on disk, but ring-coord named step 4 (retention or a user removed it): refused.
  c.open(1, rig.tensors());
  c.start(2, {});
  c.wait(2);
  c.close(false, 2);
  try {
    c.resume(rig.tensors(), 4, true, ex, count);
    FAIL() << "no throw";
  } catch (const ringd::ResumeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("cannot resume from step 4: the current lineage in " +
                                         rig.dir() + " has no complete checkpoint of that step"),
              std::string::npos)
        << e.what();
  }
  // Its only checkpoint damaged: a failure a later attempt may not see (retry).
  std::FILE* f = std::fopen((rig.dir() + "/step-00000002/node-00000.bin").c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fputc(0x55, f);
  std::fclose(f);
  try {
    c.resume(rig.tensors(), INT64_MAX, false, ex, count);
    FAIL() << "no throw";
  } catch (const ringd::ResumeFailure& e) {
    EXPECT_TRUE(e.retry()) << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  EXPECT_EQ(restores, 0);
}

TEST(Checkpoints, ResumesFromTheNewestCompleteOneAtOrBelowTheStep) {
  Rig rig;
  optim::LocalExchange ex;
  int restores = 0;
  const auto count = [&](const ckpt::LoadResult&) { ++restores; };
  Checkpoints c = rig.make(rig.dir());
  c.agree_run(ex);
  EXPECT_EQ(c.run().size(), 9u);  // "r" and 8 hex digits

  // Steps 2 (weights 1.5) and 4 (weights 9) on disk.
  c.open(1, rig.tensors());
  c.start(2, {{"cursor", {{"pos", 7}}}});
  c.wait(2);
  std::fill(rig.master.begin(), rig.master.end(), 9.f);
  c.start(4, {{"cursor", {{"pos", 9}}}});
  c.wait(4);
  c.close(false, 4);
  std::fill(rig.master.begin(), rig.master.end(), 0.f);
  rig.lines.clear();
  rig.events.clear();
  int64_t restored_step = -1;
  nlohmann::json cursor;
  const ckpt::LoadResult r =
      c.resume(rig.tensors(), 3, false, ex, [&](const ckpt::LoadResult& l) {
        // The state is loaded before the run's step is set from it.
        EXPECT_EQ(rig.master[0], 1.5f);
        restored_step = l.step;
        cursor = l.meta.value("cursor", nlohmann::json());
      });
  ASSERT_TRUE(r.loaded) << r.message;
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(r.tag, c.run() + "-1");
  EXPECT_EQ(restored_step, 2);
  EXPECT_EQ(cursor, (nlohmann::json{{"pos", 7}}));
  const std::string step2 = rig.dir() + "/" + ckpt::step_dir_name(2);
  ASSERT_EQ(rig.lines.size(), 2u);
  // Resuming below the head branches the lineage: step 4 is superseded, `latest` moves back.
  EXPECT_EQ(rig.lines[0],
            "resuming from step 2 branches the lineage: its checkpoints of steps 4 are superseded "
            "(never resumed; retention removes them once this branch's kept checkpoints are "
            "newer)");
  EXPECT_EQ(rig.lines[1], "resuming from " + step2 + " (step 2)");
  EXPECT_EQ(test::slurp(rig.dir() + "/latest"), "step-00000002\n");
  ASSERT_EQ(rig.events.size(), 2u);
  EXPECT_EQ(rig.events[0]["event"], "lineage_branched");
  EXPECT_EQ(rig.events[0]["superseded"], (nlohmann::json{4}));
  EXPECT_EQ(rig.events[1]["event"], "resumed");
  EXPECT_EQ(rig.events[1]["step"], 2);
  EXPECT_EQ(rig.events[1]["path"], step2);
  // The next attempt's checkpoints descend from step 2.
  c.open(2, rig.tensors());
  c.start(3, {});
  c.wait(3);
  c.close(false, 3);
  const auto top = nlohmann::json::parse(test::slurp(rig.dir() + "/step-00000003/checkpoint.json"));
  EXPECT_EQ(top["tag"], c.run() + "-2");
  EXPECT_EQ(top["parent"], (nlohmann::json{{"tag", c.run() + "-1"}, {"step", 2}}));

  // Written with another spec: loaded (the lineage's newest, step 3), and said.
  rig.lines.clear();
  Checkpoints other = rig.make(rig.dir(), 0, 1, "other-hash");
  EXPECT_EQ(other.resume(rig.tensors(), INT64_MAX, false, ex, count).step, 3);
  const std::string step3 = rig.dir() + "/" + ckpt::step_dir_name(3);
  ASSERT_EQ(rig.lines.size(), 2u);
  EXPECT_EQ(rig.lines[0], "note: checkpoint " + step3 +
                              " was written with another spec (hash spec-hash, now other-hash)");
  EXPECT_EQ(rig.lines[1], "resuming from " + step3 + " (step 3)");
  EXPECT_EQ(restores, 1);

  // A fresh start in the same directory: the lineage empties (`latest` "none"), said once.
  rig.lines.clear();
  Checkpoints fresh = rig.make(rig.dir());
  fresh.start_fresh();
  EXPECT_EQ(test::slurp(rig.dir() + "/latest"), "none\n");
  ASSERT_EQ(rig.lines.size(), 1u);
  EXPECT_NE(rig.lines[0].find("starting afresh: the 2 checkpoint(s) of an earlier run in " +
                              rig.dir() + " (up to step 3) are superseded"),
            std::string::npos)
      << rig.lines[0];
  EXPECT_THROW(fresh.resume(rig.tensors(), INT64_MAX, false, ex, count), ringd::ResumeFailure);
}

TEST(Checkpoints, WaitsForNodeZerosCommit) {
  Rig rig;
  Checkpoints c = rig.make(rig.dir(), 1, 2);
  // Committed meanwhile (node 0 renames the step's directory into place).
  std::thread commit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fs::create_directories(rig.dir() + "/" + ckpt::step_dir_name(3));
  });
  c.await_commit(3);
  commit.join();
  ASSERT_EQ(rig.lines.size(), 1u);
  EXPECT_EQ(rig.lines[0], "checkpoint step 3 committed by node 0");
  // Never committed: bounded.
  c.await_commit(9, std::chrono::seconds(1));
  ASSERT_EQ(rig.lines.size(), 2u);
  EXPECT_EQ(rig.lines[1],
            "checkpoint step 9: node 0 has not committed it within 1 s; exiting anyway");
}

}  // namespace

namespace {

// The layout record of a spec: shard mode, the node ranges of the model's flat layout, its size
// and the resolved model config.
TEST(Checkpoints, LayoutRecordOfASpec) {
  auto r = spec::load_spec_file(std::string(RING_SOURCE_DIR) + "/tests/checkpoint/resume.yaml");
  ASSERT_TRUE(r.ok());
  spec::JobSpec s = *r.spec;
  s.parallel.shard = spec::ShardMode::kOptimizer;
  const contract::ParamLayout layout(contract::ModelConfig::from_spec(s));
  const ckpt::Layout l = ringd::checkpoint_layout(s, 3);
  EXPECT_EQ(ckpt::describe_layout(l), "3 nodes, shard optimizer");
  EXPECT_EQ(l.total_floats, layout.total());
  const auto ranges = contract::shard_ranges(layout, 3);
  ASSERT_EQ(l.ranges.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(l.ranges[k].begin, ranges[k].begin);
    EXPECT_EQ(l.ranges[k].end, ranges[k].end);
    EXPECT_EQ(l.ranges[k].first_bucket, ranges[k].first_bucket);
    EXPECT_EQ(l.ranges[k].end_bucket, ranges[k].end_bucket);
  }
  EXPECT_EQ(l.model["d_model"], 64);
  EXPECT_EQ(l.model["heads"], 4);
  EXPECT_EQ(l.model["kv_heads"], 4);  // resolved: unset means heads
  EXPECT_EQ(l.model["head_dim"], 16);
  EXPECT_EQ(l.model["mlp"], "swiglu");
  EXPECT_TRUE(l.model.contains("mlp_hidden"));
  EXPECT_EQ(ckpt::parse_layout(ckpt::layout_json(l), "x"), l);
}

// A node writes only the tensors it saves (its range's and its own per-node ones), with the
// job's layout; resuming loads every tensor it holds, saved or not, from whichever shard has it.
TEST(Checkpoints, SavesOnlyItsOwnTensorsAndResumesThemAll) {
  Rig rig;
  std::vector<float> a(64, 1.f), b(32, 2.f), res(96, 3.f);
  auto tensor = [](const std::string& kind, const std::string& param, std::vector<float>& v,
                   int64_t offset, bool saved, bool per_node) {
    optim::StateTensor t;
    t.name = kind + "/" + param;
    t.kind = kind;
    t.param = param;
    t.shape = {static_cast<int64_t>(v.size())};
    t.offset = offset;
    t.data = v.data();
    t.size = static_cast<int64_t>(v.size());
    t.saved = saved;
    t.per_node = per_node;
    return t;
  };
  std::vector<optim::StateTensor> ts = {tensor("master", "a", a, 0, true, false),
                                        tensor("master", "b", b, 64, false, false),
                                        tensor("residual", "all", res, 0, true, true)};
  ckpt::Layout l;
  l.shard = "none";
  l.nodes = 1;
  l.total_floats = 96;
  l.ranges = {{0, 0, 96, 0, 2}};
  l.model = {{"d_model", 8}};
  ckpt::Options co;
  co.dir = rig.dir();
  co.fsync = false;
  co.layout = l;
  Checkpoints c(co, {[&](const std::string& s) { rig.lines.push_back(s); },
                     [](const std::string&, nlohmann::json) {}, [](const ckpt::SaveResult&) {}});
  c.open(1, ts);
  c.start(5, {});
  c.wait(5);
  c.close(false, 5);
  const auto sm = ckpt::parse_shard_manifest(
      test::slurp(rig.dir() + "/step-00000005/node-00000.json"), "node-00000.json");
  ASSERT_EQ(sm.tensors.size(), 2u);
  EXPECT_EQ(sm.tensors[0].name, "master/a");
  EXPECT_EQ(sm.tensors[1].name, "residual/all");
  ASSERT_TRUE(sm.layout.has_value());
  EXPECT_EQ(*sm.layout, l);
  // Resuming wants master/b too: no shard has it, and the message names it.
  optim::LocalExchange ex;
  std::fill(a.begin(), a.end(), 0.f);
  try {
    c.resume(ts, INT64_MAX, false, ex, [](const ckpt::LoadResult&) {});
    FAIL() << "no throw";
  } catch (const ckpt::CheckpointMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("no shard has tensor 'master/b'"), std::string::npos)
        << e.what();
  }
  // Without it, the rest loads.
  ts.erase(ts.begin() + 1);
  const ckpt::LoadResult r = c.resume(ts, INT64_MAX, false, ex, [](const ckpt::LoadResult&) {});
  ASSERT_TRUE(r.loaded) << r.message;
  EXPECT_EQ(a[0], 1.f);
}

}  // namespace
