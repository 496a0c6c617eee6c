// write_file_atomic: content and exact mode, replacement seen whole by a concurrent reader, a
// link at the path replaced rather than followed, failures named and leaving nothing behind.
#include "common/files/atomic_write.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/test_proc.h"

namespace ring::files {
namespace {

using ring::test::slurp;
using ring::test::TempDir;

mode_t mode_of(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// The directory's entries other than `keep` (a temporary left behind would show here).
std::vector<std::string> others(const std::string& dir, const std::string& keep) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename() != keep) out.push_back(e.path().filename().string());
  return out;
}

TEST(AtomicWrite, WritesTheTextWithExactlyTheMode) {
  TempDir d("atomic");
  const mode_t old_umask = ::umask(077);
  write_file_atomic(d.path + "/script", "#!/bin/sh\n", 0755);
  write_file_atomic(d.path + "/key", "secret\n", 0600);
  ::umask(old_umask);
  EXPECT_EQ(slurp(d.path + "/script"), "#!/bin/sh\n");
  EXPECT_EQ(mode_of(d.path + "/script"), 0755u) << "the umask does not apply";
  EXPECT_EQ(mode_of(d.path + "/key"), 0600u);
  write_file_atomic(d.path + "/empty", "", 0644, /*fsync=*/false);
  EXPECT_TRUE(std::filesystem::exists(d.path + "/empty"));
  EXPECT_EQ(slurp(d.path + "/empty"), "");
}

TEST(AtomicWrite, ReplacesAndLeavesNoTemporary) {
  TempDir d("atomic");
  const std::string p = d.path + "/spec.yaml";
  write_file_atomic(p, "old\n");
  write_file_atomic(p, "new and longer\n", 0640);
  EXPECT_EQ(slurp(p), "new and longer\n");
  EXPECT_EQ(mode_of(p), 0640u);
  EXPECT_EQ(others(d.path, "spec.yaml"), std::vector<std::string>{});
}

// A reader sees one version or the other, whole, while the file is replaced again and again.
TEST(AtomicWrite, AConcurrentReaderNeverSeesAPart) {
  TempDir d("atomic");
  const std::string p = d.path + "/state";
  const std::string a(256 * 1024, 'a'), b(128 * 1024, 'b');
  write_file_atomic(p, a, 0600, false);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, reads{0};
  std::thread reader([&] {
    while (!stop) {
      const std::string s = slurp(p);
      if (s != a && s != b) ++bad;
      ++reads;
    }
  });
  for (int i = 0; i < 200; ++i) write_file_atomic(p, i % 2 ? a : b, 0600, false);
  while (reads < 10) std::this_thread::yield();
  stop = true;
  reader.join();
  EXPECT_EQ(bad, 0);
}

TEST(AtomicWrite, ALinkAtThePathIsReplacedNotFollowed) {
  TempDir d("atomic");
  const std::string victim = d.path + "/victim", link = d.path + "/out";
  std::ofstream(victim) << "keep me\n";
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  write_file_atomic(link, "mine\n");
  EXPECT_EQ(slurp(victim), "keep me\n");
  EXPECT_FALSE(std::filesystem::is_symlink(link));
  EXPECT_EQ(slurp(link), "mine\n");
}

TEST(AtomicWrite, FailuresNameThePathAndTheStep) {
  TempDir d("atomic");
  const std::string missing = d.path + "/no/such/dir/file";
  try {
    write_file_atomic(missing, "x");
    FAIL() << "no error";
  } catch (const AtomicWriteError& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind("cannot write " + missing + ": create " + missing + ".tmp-", 0),
        0u)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos);
  }
  // A directory in the way: the rename fails, the temporary is removed, the directory stays.
  const std::string dir = d.path + "/taken";
  std::filesystem::create_directory(dir);
  std::ofstream(dir + "/inside") << "x";
  try {
    write_file_atomic(dir, "x");
    FAIL() << "no error";
  } catch (const AtomicWriteError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write " + dir + ": rename " + dir + ".tmp-"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/inside"));
  EXPECT_EQ(others(d.path, "taken"), std::vector<std::string>{});
}

}  // namespace
}  // namespace ring::files
