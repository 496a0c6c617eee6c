// Reading a whole file the one way (common/files/read_file.h): a regular file whole, and every
// other kind refused at once with a message naming the path and the rule.
#include "common/files/read_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/test_proc.h"

using ring::files::read_regular_file;
using ring::files::ReadError;
using ring::test::TempDir;

namespace {

std::string error_of(const std::string& path, size_t max = ring::files::kDefaultMaxRead,
                     bool* missing = nullptr) {
  try {
    read_regular_file(path, max);
  } catch (const ReadError& e) {
    if (missing) *missing = e.missing();
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ReadFile, ARegularFileWholeAndEveryOtherKindRefused) {
  TempDir t("read-file");
  const std::string f = t.path + "/a.txt";
  std::string text(100000, 'x');
  text[5] = '\0';  // bytes, not a C string
  std::ofstream(f, std::ios::binary) << text;
  EXPECT_EQ(read_regular_file(f), text);
  std::ofstream(t.path + "/empty");
  EXPECT_EQ(read_regular_file(t.path + "/empty"), "");
  // Through a symbolic link: the file it names.
  std::filesystem::create_symlink(f, t.path + "/link");
  EXPECT_EQ(read_regular_file(t.path + "/link").size(), text.size());

  bool missing = false;
  EXPECT_EQ(error_of(t.path + "/nope", ring::files::kDefaultMaxRead, &missing),
            t.path + "/nope: missing");
  EXPECT_TRUE(missing);
  EXPECT_EQ(error_of(f, 1000), f + ": 100000 bytes, over the limit of 1000");
  EXPECT_EQ(error_of(t.path), t.path + ": not a regular file (a directory)");
  // A FIFO without a writer: refused at once, never waited on.
  const std::string fifo = t.path + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of(fifo), fifo + ": not a regular file (a FIFO)");
  EXPECT_EQ(error_of("/dev/zero"), "/dev/zero: not a regular file (a device)");
  if (::geteuid() != 0) {  // root reads anything
    ::chmod(f.c_str(), 0);
    EXPECT_EQ(error_of(f), f + ": cannot open: Permission denied");
  }
}
