// A log file whose line format is a contract (common/log/file_sink.h): the caller's pattern,
// control bytes escaped so no text forges a line, and a failed write said once.
#include "common/log/file_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/log/log.h"
#include "tests/common/test_proc.h"

namespace ring::log {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(FileSink, WritesThePatternAndEscapesControlBytes) {
  ring::test::TempDir t;
  auto file = std::make_shared<files::AppendFile>();
  std::string why;
  ASSERT_TRUE(file->open(t.path + "/x.log", &why)) << why;
  auto sink = std::make_shared<FileSink>(file, make_text_formatter("node[3] %l %v"), nullptr);
  spdlog::logger lg("file-sink-test", sink);
  lg.info("worker said: done\n2026-01-01 00:00:00 ringd[0] completed");
  lg.warn("tab\there \x1b[31mred");
  const std::string text = slurp(t.path + "/x.log");
  EXPECT_EQ(text,
            "node[3] info worker said: done\\x0a2026-01-01 00:00:00 ringd[0] completed\n"
            "node[3] warning tab\\x09here \\x1b[31mred\n");
}

TEST(FileSink, AFailedWriteIsSaidOnceAndNothingThrows) {
  // /dev/full takes the open and fails every write with ENOSPC; AppendFile wants a regular file,
  // so the sink gets a file whose descriptor is then pointed at /dev/full.
  ring::test::TempDir t;
  auto file = std::make_shared<files::AppendFile>();
  std::string why;
  ASSERT_TRUE(file->open(t.path + "/x.log", &why)) << why;
  const int full = ::open("/dev/full", O_WRONLY);
  if (full < 0) GTEST_SKIP() << "no /dev/full here";
  // The AppendFile's descriptor is the lowest free one opened after the temp dir: find it by path.
  int fd = -1;
  for (int i = 3; i < 1024 && fd < 0; ++i) {
    char buf[4096];
    const ssize_t n =
        ::readlink(("/proc/self/fd/" + std::to_string(i)).c_str(), buf, sizeof(buf) - 1);
    if (n > 0 && std::string(buf, static_cast<size_t>(n)) == t.path + "/x.log") fd = i;
  }
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::dup2(full, fd), fd);
  ::close(full);
  std::vector<std::string> said;
  auto sink = std::make_shared<FileSink>(file, make_text_formatter("%v"),
                                         [&](const std::string& w) { said.push_back(w); });
  spdlog::logger lg("file-sink-full", sink);
  for (int i = 0; i < 5; ++i) lg.info("line {}", i);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("cannot write " + t.path + "/x.log"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("No space left"), std::string::npos) << said[0];
}

}  // namespace
}  // namespace ring::log
