// The timeline file between ringd and a worker (common/contract/timeline.h): ringd creates it,
// the worker maps and writes, a reader sees the records in order, the ring keeps the newest
// kCapacity, the current wait and the progress counter are visible, and a wrong file (a symbolic
// link, another rank's, a short one) is refused with its path.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/contract/timeline.h"

namespace {

namespace tl = ring::contract::timeline;

struct Dir {
  std::string path;
  Dir() {
    std::string t = std::filesystem::temp_directory_path().string() + "/timeline-test-XXXXXX";
    path = ::mkdtemp(t.data());
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

TEST(Timeline, RecordsReadBackInOrderWithCurrentWaitAndProgress) {
  Dir d;
  const std::string f = d.path + "/timeline-3.bin";
  ASSERT_EQ(tl::create_file(f, 3), "");
  struct stat st {};
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<size_t>(st.st_size), tl::kFileBytes);

  tl::TimelineWriter w;
  ASSERT_EQ(w.open(f, 3, ::getpid()), "");
  w.set_step(7);
  for (int i = 0; i < 10; ++i)
    w.record({.kind = tl::Phase::kForward,
              .step = 7,
              .layer = i,
              .begin_ns = 100 + i,
              .end_ns = 200 + i});
  w.wait_begin(tl::Phase::kRingWait, 7, 4, 2, 1);

  tl::Snapshot s = tl::read_file(f);
  ASSERT_TRUE(s.ok) << s.error;
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.pid, ::getpid());
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.progress, 10u);
  ASSERT_EQ(s.events.size(), 10u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(s.events[i].layer, i);
    EXPECT_EQ(s.events[i].kind, tl::Phase::kForward);
    EXPECT_EQ(s.events[i].end_ns, 200 + i);
  }
  EXPECT_EQ(s.current.kind, tl::Phase::kRingWait);
  EXPECT_EQ(s.current.layer, 4);
  EXPECT_EQ(s.current.hop, 2);
  EXPECT_EQ(s.current.peer, 1);
  w.wait_end();
  s = tl::read_file(f);
  EXPECT_EQ(s.current.kind, tl::Phase::kNone);
  EXPECT_EQ(s.progress, 11u);
  // min_step filters.
  EXPECT_TRUE(tl::read_file(f, 8).events.empty());
  // Recording off (the benchmark's baseline): no records, progress goes on.
  w.set_enabled(false);
  w.record({.kind = tl::Phase::kData, .step = 8});
  s = tl::read_file(f);
  EXPECT_EQ(s.events.size(), 10u);
  EXPECT_EQ(s.progress, 12u);
  EXPECT_STREQ(tl::phase_name(tl::Phase::kRingRecv), "ring_recv");
  EXPECT_STREQ(tl::phase_name(uint16_t{999}), "?");
}

TEST(Timeline, TheRingKeepsTheNewestRecords) {
  Dir d;
  const std::string f = d.path + "/t.bin";
  ASSERT_EQ(tl::create_file(f, 0), "");
  tl::TimelineWriter w;
  ASSERT_EQ(w.open(f, 0, 1), "");
  const int64_t n = static_cast<int64_t>(tl::kCapacity) + 1000;
  for (int64_t i = 0; i < n; ++i)
    w.record({.kind = tl::Phase::kStep, .step = i, .begin_ns = i, .end_ns = i});
  const tl::Snapshot s = tl::read_file(f);
  ASSERT_EQ(s.events.size(), tl::kCapacity);
  EXPECT_EQ(s.events.front().step, 1000);
  EXPECT_EQ(s.events.back().step, n - 1);
  // A second create (the next attempt) starts empty.
  ASSERT_EQ(tl::create_file(f, 0), "");
  EXPECT_TRUE(tl::read_file(f).events.empty());
}

TEST(Timeline, WrongFilesAreRefusedNamingThePath) {
  Dir d;
  const std::string f = d.path + "/t.bin";
  ASSERT_EQ(tl::create_file(f, 2), "");
  tl::TimelineWriter w;
  EXPECT_NE(w.open(f, 5, 1).find("rank 2's, not rank 5's"), std::string::npos);
  // A symbolic link is refused by both sides.
  const std::string link = d.path + "/link.bin";
  ASSERT_EQ(::symlink(f.c_str(), link.c_str()), 0);
  EXPECT_NE(tl::create_file(link, 2).find(link), std::string::npos);
  EXPECT_NE(w.open(link, 2, 1).find(link), std::string::npos);
  // A file of another size or content.
  const std::string junk = d.path + "/junk.bin";
  std::ofstream(junk) << "not a timeline";
  EXPECT_NE(tl::read_file(junk).error.find("not a regular file of"), std::string::npos);
  EXPECT_FALSE(tl::read_file(d.path + "/missing.bin").ok);
}

}  // namespace
