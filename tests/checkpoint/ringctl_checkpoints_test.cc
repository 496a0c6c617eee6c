// `ringctl checkpoints DIR [--verify] [--json]`: the listing, statuses and exit codes, on
// checkpoints written by ring_checkpoint and then damaged.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/checkpoint/checkpoint.h"
#include "tests/common/run.h"
#include "tests/common/test_proc.h"

namespace fsys = std::filesystem;

namespace {

std::string ringctl() {
  const char* e = std::getenv("RINGCTL_BIN");  // to try another build
  return e ? e : RINGCTL_BIN;
}

struct Out {
  int code = -1;
  std::string text;
};

// ringctl ARGS, stdout and stderr together.
Out run(const std::string& args) {
  ring::test::RunResult r = ring::test::run(ringctl() + " " + args);
  return {r.exit_code, r.output};
}

struct TmpDir : ring::test::TempDir {
  TmpDir() : ring::test::TempDir("ckpt-ctl") {}
};

}  // namespace

TEST(RingctlCheckpoints, ListsVerifiesAndExitCodes) {
  TmpDir d;
  std::vector<float> w(50000, 1.5f), m(50000, 0.25f);
  {
    ring::ckpt::Options o;
    o.dir = d.path;
    o.keep_last = 5;
    o.fsync = false;
    ring::ckpt::Checkpointer c(o);
    c.add_tensor("master", ring::ckpt::DType::kF32, {50000}, w.data());
    c.add_tensor("adam_m", ring::ckpt::DType::kF32, {50000}, m.data());
    for (int s : {10, 20, 30}) {
      c.start(s, {});
      ASSERT_TRUE(c.wait().ok);
    }
  }
  fsys::create_directories(d.path + "/step-00000040.partial-3");

  Out ok = run("checkpoints " + d.path);
  EXPECT_EQ(ok.code, 0) << ok.text;
  EXPECT_NE(ok.text.find("STEP"), std::string::npos) << ok.text;
  EXPECT_NE(ok.text.find("complete  <- latest"), std::string::npos) << ok.text;
  EXPECT_NE(ok.text.find("incomplete (step-00000040.partial-3)"), std::string::npos) << ok.text;
  EXPECT_NE(ok.text.find("390.6 KiB"), std::string::npos) << ok.text;  // 2 x 200000 B
  EXPECT_NE(ok.text.find("3 complete (0 superseded), 0 corrupt, 1 incomplete"), std::string::npos) << ok.text;

  // A flipped byte: found only with --verify (exit 1, file and tensor named).
  {
    std::string p = d.path + "/step-00000020/node-00000.bin";
    int fd = ::open(p.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, 250000), 1);
    c ^= 1;
    ASSERT_EQ(::pwrite(fd, &c, 1, 250000), 1);
    ::close(fd);
  }
  EXPECT_EQ(run("checkpoints " + d.path).code, 0);
  Out v = run("checkpoints --verify " + d.path);
  EXPECT_EQ(v.code, 1) << v.text;
  EXPECT_NE(v.text.find("step-00000020/node-00000.bin: tensor 'adam_m' checksum mismatch"),
            std::string::npos)
      << v.text;
  EXPECT_NE(v.text.find("2 complete (0 superseded), 1 corrupt, 1 incomplete"), std::string::npos) << v.text;

  // A truncated manifest is found without --verify; --json is machine-readable.
  fsys::resize_file(d.path + "/step-00000030/node-00000.json", 40);
  Out j = run("checkpoints --json " + d.path);
  EXPECT_EQ(j.code, 1);
  auto arr = nlohmann::json::parse(j.text, nullptr, false);
  ASSERT_TRUE(arr.is_array()) << j.text;
  ASSERT_EQ(arr.size(), 4u);
  EXPECT_EQ(arr[2]["step"], 30);
  EXPECT_EQ(arr[2]["status"], "corrupt");
  EXPECT_EQ(arr[2]["latest"], true);
  EXPECT_NE(arr[2]["problems"][0].get<std::string>().find("node-00000.json"), std::string::npos);
  EXPECT_EQ(arr[3]["status"], "incomplete");

  Out missing = run("checkpoints " + d.path + "/nope");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.text.find("/nope: no such directory"), std::string::npos) << missing.text;
  EXPECT_EQ(run("checkpoints").code, 2);
  EXPECT_EQ(run("checkpoints --frobnicate " + d.path).code, 2);
}

// The writer's layout: nodes and shard mode in the table ("-" for a checkpoint without a layout
// record), the whole record, node ranges included, in --json.
TEST(RingctlCheckpoints, ShowsTheWritersLayout) {
  TmpDir d;
  std::vector<float> a(1000, 1.f), b(3000, 2.f);
  {
    ring::ckpt::Layout l;
    l.shard = "optimizer";
    l.nodes = 2;
    l.total_floats = 4000;
    l.ranges = {{0, 0, 1000, 0, 1}, {1, 1000, 4000, 1, 3}};
    l.residual = "owner";
    l.model = {{"layers", 2}, {"d_model", 64}};
    std::vector<std::unique_ptr<ring::ckpt::Checkpointer>> cs;
    for (int k = 0; k < 2; ++k) {
      ring::ckpt::Options o;
      o.dir = d.path;
      o.node_rank = k;
      o.nodes = 2;
      o.fsync = false;
      o.layout = l;
      cs.push_back(std::make_unique<ring::ckpt::Checkpointer>(o));
    }
    cs[0]->add_tensor("master/a", ring::ckpt::DType::kF32, {1000}, a.data());
    cs[1]->add_tensor("master/b", ring::ckpt::DType::kF32, {3000}, b.data());
    for (auto& c : cs) c->start(20, {});
    for (auto& c : cs) ASSERT_TRUE(c->wait().ok);
    // One without a layout record, of an older step.
    ring::ckpt::Options o;
    o.dir = d.path;
    o.fsync = false;
    o.keep_last = 5;
    ring::ckpt::Checkpointer c(o);
    c.add_tensor("master", ring::ckpt::DType::kF32, {1000}, a.data());
    c.start(10, {});
    ASSERT_TRUE(c.wait().ok);
  }
  Out t = run("checkpoints " + d.path);
  EXPECT_EQ(t.code, 0) << t.text;
  EXPECT_NE(t.text.find("NODES SHARD"), std::string::npos) << t.text;
  // (`latest` names step 10, written last by a run that started afresh: step 20 is not of its
  // lineage)
  EXPECT_NE(t.text.find("    1 -         -        current     complete  <- latest"),
            std::string::npos)
      << t.text;
  EXPECT_NE(t.text.find("    2 optimizer owner    superseded  complete\n"), std::string::npos)
      << t.text;
  Out j = run("checkpoints --json " + d.path);
  EXPECT_EQ(j.code, 0) << j.text;
  auto arr = nlohmann::json::parse(j.text, nullptr, false);
  ASSERT_TRUE(arr.is_array()) << j.text;
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_TRUE(arr[0]["layout"].is_null());
  EXPECT_EQ(arr[1]["format_version"], 2);
  EXPECT_EQ(arr[1]["layout"]["shard"], "optimizer");
  EXPECT_EQ(arr[1]["layout"]["residual"], "owner");
  EXPECT_EQ(arr[1]["layout"]["nodes"], 2);
  EXPECT_EQ(
      arr[1]["layout"]["ranges"][1],
      (nlohmann::json{
          {"node", 1}, {"begin", 1000}, {"end", 4000}, {"first_bucket", 1}, {"end_bucket", 3}}));
  EXPECT_EQ(arr[1]["layout"]["model"]["d_model"], 64);
}
