// common/install/locate.h from a test binary in the build tree: the build tree is recognised by
// its marker, plugins and programs are found there, a variable replaces the search, a deprecated
// name still works with a warning, and nothing executable gives "" with every place tried.
#include "common/install/locate.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;
using ring::install::build_root;
using ring::install::find_program;
using ring::install::plugin_dirs;

namespace {

std::string canonical(const std::string& p) { return fs::weakly_canonical(p).string(); }

struct EnvGuard {
  explicit EnvGuard(std::vector<std::string> names) : names_(std::move(names)) {
    for (const auto& n : names_) unsetenv(n.c_str());
  }
  ~EnvGuard() {
    for (const auto& n : names_) unsetenv(n.c_str());
  }
  std::vector<std::string> names_;
};

}  // namespace

TEST(Locate, TheBuildTreeIsFoundFromItsMarker) {
  ASSERT_FALSE(build_root().empty());
  EXPECT_EQ(canonical(build_root().string()), canonical(RING_BINARY_DIR));
}

TEST(Locate, PluginDirsOfTheBuildTreeExistAndComeLast) {
  std::vector<std::string> dirs = plugin_dirs("plugins");
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(canonical(dirs.back()), canonical(std::string(RING_BINARY_DIR) + "/plugins"));
  for (const auto& d : dirs) EXPECT_TRUE(fs::is_directory(d)) << d;
  for (const auto& d : plugin_dirs("no-such-subdir"))  // directories that do not exist are left out
    EXPECT_EQ(d.find("no-such-subdir"), std::string::npos) << d;
}

TEST(Locate, ProgramsOfTheBuildTree) {
  EnvGuard env({"RING_TEST_LOCATE_BIN"});
  std::vector<std::string> tried;
  EXPECT_EQ(find_program("ringd", {"RING_TEST_LOCATE_BIN"}, "daemon/ringd", &tried),
            canonical(std::string(RING_BINARY_DIR) + "/daemon/ringd/ringd"));
  EXPECT_EQ(find_program("ring-worker", {}, "worker", nullptr),
            canonical(std::string(RING_BINARY_DIR) + "/worker/ring-worker"));
}

TEST(Locate, AVariableReplacesTheSearch) {
  EnvGuard env({"RING_TEST_LOCATE_BIN", "RING_TEST_LOCATE_OLD"});
  setenv("RING_TEST_LOCATE_BIN", "/bin/true", 1);
  setenv("RING_TEST_LOCATE_OLD", "/bin/false", 1);
  testing::internal::CaptureStderr();
  EXPECT_EQ(find_program("ringd", {"RING_TEST_LOCATE_BIN", "RING_TEST_LOCATE_OLD"}, "daemon/ringd",
                         nullptr),
            "/bin/true");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  // Set but not executable here (a path on the compute nodes): still the answer.
  setenv("RING_TEST_LOCATE_BIN", "/nonexistent/ringd", 1);
  EXPECT_EQ(find_program("ringd", {"RING_TEST_LOCATE_BIN"}, "daemon/ringd", nullptr),
            "/nonexistent/ringd");
}

TEST(Locate, ADeprecatedNameWorksWithAWarning) {
  EnvGuard env({"RING_TEST_LOCATE_BIN", "RING_TEST_LOCATE_OLD"});
  setenv("RING_TEST_LOCATE_OLD", "/bin/false", 1);
  testing::internal::CaptureStderr();
  std::vector<std::string> tried;
  EXPECT_EQ(find_program("ringd", {"RING_TEST_LOCATE_BIN", "RING_TEST_LOCATE_OLD"}, "daemon/ringd",
                         &tried),
            "/bin/false");
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("$RING_TEST_LOCATE_OLD is deprecated; use $RING_TEST_LOCATE_BIN"),
            std::string::npos)
      << err;
  EXPECT_EQ(tried, std::vector<std::string>{"$RING_TEST_LOCATE_OLD=/bin/false"});
}

TEST(Locate, NothingFoundListsEveryPlaceTried) {
  EnvGuard env({"RING_TEST_LOCATE_BIN"});
  std::vector<std::string> tried;
  EXPECT_EQ(find_program("no-such-ring-program", {"RING_TEST_LOCATE_BIN"}, "worker", &tried), "");
  ASSERT_GE(tried.size(), 3u);
  EXPECT_EQ(fs::path(tried[0]).filename(), "no-such-ring-program");
  EXPECT_NE(std::find(tried.begin(), tried.end(),
                      (build_root() / "worker" / "no-such-ring-program").string()),
            tried.end());
}
