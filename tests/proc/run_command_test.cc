#include "common/proc/run_command.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/slurm/slurm_cli.h"
#include "daemon/placement/discovery.h"
#include "daemon/placement/errors.h"

namespace fs = std::filesystem;
using ring::proc::CommandResult;
using ring::proc::RunError;
using ring::proc::RunOptions;

namespace {

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ring-proc-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

template <typename E, typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception";
  return "";
}

}  // namespace

TEST(ProcRunCommand, CapturesBothStreamsAndTheExitCode) {
  CommandResult r = ring::proc::run_command({"/bin/sh", "-c", "echo out; echo err >&2; exit 7"});
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_FALSE(r.out_truncated);
  EXPECT_EQ(ring::proc::describe({"/bin/sh", "-c", "x"}, r), "`/bin/sh -c x` exited 7: err");
}

TEST(ProcRunCommand, DeadlineKillsTheChild) {
  const std::vector<std::string> argv{"/bin/sh", "-c", "echo started; exec sleep 30"};
  const auto t0 = std::chrono::steady_clock::now();
  RunOptions o;
  o.timeout_ms = 3000;  // (sh must start and echo first, even on a loaded machine)
  CommandResult r = ring::proc::run_command(argv, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.out, "started\n");  // what it printed before the deadline is kept
  EXPECT_LT(s, 25.0) << "the child was not killed";  // 30 s sleep: far from any scheduling noise
  EXPECT_EQ(ring::proc::describe(argv, r),
            "`/bin/sh -c echo started; exec sleep 30` timed out: started");
}

TEST(ProcRunCommand, OutputBeyondTheCapIsReadAndDropped) {
  // 1 MB on stdout (more than a pipe holds) and 3000 bytes on stderr: the child must not block
  // on a full pipe, each stream keeps exactly its cap.
  const std::vector<std::string> argv{
      "/bin/sh", "-c", "head -c 1000000 /dev/zero; head -c 3000 /dev/zero | tr '\\0' e >&2; exit 3"};
  RunOptions o;
  o.timeout_ms = 20000;
  o.out_cap = 4096;
  o.err_cap = 1000;
  CommandResult r = ring::proc::run_command(argv, o);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);  // ran to its end
  EXPECT_EQ(r.out.size(), 4096u);
  EXPECT_TRUE(r.out_truncated);
  EXPECT_EQ(r.err, std::string(1000, 'e'));
  EXPECT_TRUE(r.err_truncated);
  // The message quotes stderr, cut at 800 characters.
  EXPECT_EQ(ring::proc::describe({"gen"}, r), "`gen` exited 3: " + std::string(800, 'e') + "...");
}

TEST(ProcRunCommand, AProgramThatCannotStartIsARunError) {
  RunError::Stage stage{};
  std::string msg = error_of<RunError>([&] {
    try {
      ring::proc::run_command({"/nonexistent/ring-proc-test"});
    } catch (const RunError& e) {
      stage = e.stage();
      throw;
    }
  });
  EXPECT_EQ(msg, "cannot run /nonexistent/ring-proc-test: No such file or directory");
  EXPECT_EQ(stage, RunError::Stage::kSpawn);

  TempDir dir;
  const fs::path file = dir.path / "not-executable";
  std::ofstream(file) << "#!/bin/sh\necho hi\n";
  chmod(file.c_str(), 0644);
  // Even root may not execute a file without any x bit (execve: EACCES).
  EXPECT_EQ(error_of<RunError>([&] { ring::proc::run_command({file.string()}); }),
            "cannot run " + file.string() + ": Permission denied");
  EXPECT_EQ(error_of<RunError>([] { ring::proc::run_command({}); }),
            "run_command: empty command");
}

TEST(ProcRunCommand, ExecutableOverridesArgvZero) {
  RunOptions o;
  o.executable = "/bin/sh";
  CommandResult r = ring::proc::run_command({"my-name", "-c", "echo $0"}, o);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "my-name\n");
}

TEST(ProcFindExecutable, LooksUpPathAndSkipsDirectoriesAndPlainFiles) {
  TempDir dir;
  fs::create_directories(dir.path / "a" / "tool");  // a directory named like the tool
  fs::create_directories(dir.path / "b");
  std::ofstream(dir.path / "b" / "tool") << "data\n";  // not executable
  fs::create_directories(dir.path / "c");
  std::ofstream(dir.path / "c" / "tool") << "#!/bin/sh\n";
  chmod((dir.path / "c" / "tool").c_str(), 0755);
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  const std::string path = (dir.path / "a").string() + ":" + (dir.path / "b").string() + ":" +
                           (dir.path / "c").string();
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(ring::proc::find_executable("tool"), (dir.path / "c" / "tool").string());
  EXPECT_EQ(ring::proc::find_executable("no-such-ring-tool"), "");
  setenv("PATH", saved.c_str(), 1);
  EXPECT_EQ(ring::proc::find_executable("/bin/sh"), "/bin/sh");
  EXPECT_EQ(ring::proc::find_executable((dir.path / "b" / "tool").string()), "");
}

// The callers keep their own error types and messages.
TEST(ProcWrappers, SlurmAndPlacementMessages) {
  EXPECT_EQ(error_of<ring::slurm::SlurmError>(
                [] { ring::slurm::run_command({"no-such-ring-tool", "--help"}); }),
            "no-such-ring-tool: not found in PATH; is Slurm's client installed (slurm-client) "
            "and PATH set?");
  EXPECT_EQ(error_of<ring::slurm::SlurmError>([] { ring::slurm::run_command({}); }),
            "run_command: empty command");
  auto r = ring::slurm::run_command({"sh", "-c", "echo via-path"}, 10000);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "via-path\n");

  EXPECT_EQ(error_of<ring::placement::PlacementError>(
                [] { ring::placement::run_command({"/nonexistent/nvidia-smi"}, 1000); }),
            "cannot run /nonexistent/nvidia-smi: No such file or directory");
  auto t = ring::placement::run_command({"/bin/sh", "-c", "exec sleep 30"}, 200);
  EXPECT_TRUE(t.timed_out);
  EXPECT_EQ(t.exit_code, -1);
}

// A helper program inherits no descriptor of ours above 2, even one opened without O_CLOEXEC
// (a library's socket): before, sbatch and nvidia-smi got every such descriptor.
TEST(ProcRunCommand, ChildInheritsNoDescriptorAbove2) {
  int fd = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC on purpose
  ASSERT_GE(fd, 0);
  const int high = ::dup2(fd, 777);
  ::close(fd);
  ASSERT_EQ(high, 777);
  CommandResult r = ring::proc::run_command({"/bin/ls", "/proc/self/fd"});
  ::close(high);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> fds;
  for (size_t a = 0, b; a < r.out.size(); a = b + 1) {
    b = r.out.find('\n', a);
    if (b == std::string::npos) b = r.out.size();
    if (b > a) fds.push_back(r.out.substr(a, b - a));
  }
  // 0, 1, 2 and the descriptor ls opened for /proc/self/fd itself.
  EXPECT_EQ(std::count(fds.begin(), fds.end(), "777"), 0) << r.out;
  EXPECT_LE(fds.size(), 4u) << r.out;
}
