// Helpers for tests that run the project's binaries as real child processes: start one with its
// output in files, wait for it with a deadline, kill and reap it when the test ends (no orphan
// even when an assertion fails), temporary directories, and scans of /proc for processes a test
// left behind. Library ring_test_common (tests/common/CMakeLists.txt).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ring::test {

using Clock = std::chrono::steady_clock;

// The whole file, "" when it cannot be read (a log not written yet).
std::string slurp(const std::string& path);

// A fresh directory $TMPDIR/<prefix>-XXXXXX, removed with its contents on destruction.
// Throws std::runtime_error naming the template when it cannot be made.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "ring-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// What a child gets besides its argv and output files.
struct ProcOptions {
  std::vector<std::pair<std::string, std::string>> set_env;  // set in the child's environment
  std::vector<std::string> unset_env;                         // removed from it
  // wait() that runs out of time kills (SIGKILL) and reaps the process before returning -1;
  // otherwise it stays running until kill9() or the destructor.
  bool kill_on_timeout = false;
};

// UCX on this host only (shared memory and loopback): what transport runs use in tests.
ProcOptions ucx_loopback();

// One child process (common/proc/spawn.h): argv[0] is the binary's path (no PATH search). stdout
// goes to `out` and stderr to `err` (truncated); "" leaves that stream to the test's own, and
// out == err puts both in one file. The child dies with the test (death signal SIGKILL) and gets
// no descriptor of the test above 2. An output file that cannot be opened or a failed exec throw
// std::runtime_error naming the file or the program. Killed (SIGKILL) and reaped on destruction.
class Proc {
 public:
  Proc(std::vector<std::string> args, const std::string& out, const std::string& err,
       ProcOptions opts = {});
  ~Proc() { kill9(); }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  // Exit status in waitpid form, or -1 when still running after `seconds` (see kill_on_timeout).
  int wait(double seconds);
  // Reaps the process if it has ended (never blocks); true once it has been reaped.
  bool poll();
  // SIGKILL and reap, if still running.
  void kill9();

  pid_t pid = -1;   // -1 once reaped
  int status = -1;  // waitpid status once reaped

 private:
  bool kill_on_timeout_;
};

// Starts argv (argv[0]: the binary's path) with stdout and stderr appended to `log` (created
// 0600), dying with the test; returns its pid, which the caller waits for. Throws
// std::runtime_error naming the log or the program when it cannot start.
pid_t start_logged(const std::vector<std::string>& argv, const std::string& log,
                   const ProcOptions& opts = {});

// A waitpid status as a shell reports it: the exit code, or 128 + the signal.
int exit_code(int wait_status);

// Several children started one after another (the ranks of a ring); on destruction every one
// still running is killed first, then all are reaped.
class ProcGroup {
 public:
  ProcGroup() = default;
  ~ProcGroup();
  ProcGroup(const ProcGroup&) = delete;
  ProcGroup& operator=(const ProcGroup&) = delete;

  // Starts one more; returns its index. The log logs() shows is `err`, or `out` when err is "".
  size_t start(const std::vector<std::string>& args, const std::string& out,
               const std::string& err, ProcOptions opts = {});
  // Reaps every child or gives up at the bound; false when some child was still running.
  bool wait_all(std::chrono::milliseconds bound);
  size_t size() const { return procs_.size(); }
  pid_t pid(size_t i) const { return pids_[i]; }  // as started (also after it was reaped)
  // The exit code (exit_code form), -1 while running.
  int status(size_t i) const;
  std::string log(size_t i) const { return slurp(logs_[i]); }
  // Every child's log, each under a line "--- <label> <i>:".
  std::string logs(const std::string& label = "process") const;

 private:
  std::vector<std::unique_ptr<Proc>> procs_;
  std::vector<pid_t> pids_;
  std::vector<std::string> logs_;
};

// Live (not zombie) processes other than this one whose command line contains `needle` (a test's
// unique directory). A zombie has no command line left, so it never counts.
std::vector<pid_t> processes_mentioning(const std::string& needle);

// Polls processes_mentioning(needle) until it is empty; false when it is not within `seconds`.
bool wait_for_no_processes(const std::string& needle, double seconds);

// Whether `pid` is a live, non-zombie process whose command line contains `cmdline_contains`
// ("" = any). Pids get reused quickly on a busy machine with a small pid_max: pass the binary's
// name so that an unrelated process that got the number is not taken for a survivor.
bool alive(pid_t pid, const std::string& cmdline_contains = "");

// Runs `fn` in a forked child that has become uid/gid `uid` (no supplementary groups) and returns
// what it returned, "exception: <what>" if it threw, or "cannot become uid N". For tests that act
// as a second Unix user; the child must use only objects it creates itself (fork copies one
// thread) and leaves with _exit. Needs root.
std::string as_uid(uid_t uid, const std::function<std::string()>& fn);

}  // namespace ring::test
