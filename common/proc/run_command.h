// Running a short-lived helper program (sbatch, scontrol, nvidia-smi) with a deadline.
//
//   ring::proc::RunOptions o{.timeout_ms = 30000, .out_cap = 16 << 20};
//   ring::proc::CommandResult r = ring::proc::run_command({"/usr/bin/scontrol", "show", "job"}, o);
//   if (r.exit_code != 0) throw MyError(ring::proc::describe(argv, r));
//
// No shell: argv[0] is executed as given (a path; look names up with find_executable). stdin is
// /dev/null; stdout and stderr are read through pipes, both at once (a child that fills one pipe
// never blocks on it), each kept up to its cap (the rest is read and dropped, so the child still
// runs to its end). At the deadline the child is killed with SIGKILL and reaped. A program that
// cannot be started is a RunError; one that starts and fails is a result, for the caller to judge.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace ring::proc {

// The child could not be started. stage() says where: a pipe, or the spawn itself (the program
// is missing, not executable, ...); error() is the errno. what(): "pipe: Too many open files",
// "cannot run /usr/bin/x: No such file or directory", "run_command: empty command".
class RunError : public std::runtime_error {
 public:
  enum class Stage { kArguments, kPipe, kSpawn };
  RunError(Stage stage, int error, const std::string& message)
      : std::runtime_error(message), stage_(stage), error_(error) {}
  Stage stage() const { return stage_; }
  int error() const { return error_; }

 private:
  Stage stage_;
  int error_;
};

struct RunOptions {
  int timeout_ms = 30000;              // from the spawn to SIGKILL
  size_t out_cap = size_t{16} << 20;   // bytes of stdout kept
  size_t err_cap = size_t{16} << 20;   // bytes of stderr kept
  // What to execute when it differs from argv[0] (argv[0] is then only the child's name), e.g.
  // the PATH match of argv[0]. Empty: argv[0].
  std::string executable;
};

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  bool timed_out = false;
  std::string out;  // stdout, at most out_cap bytes
  std::string err;  // stderr, at most err_cap bytes
  bool out_truncated = false, err_truncated = false;  // the child wrote more than the cap
};

// Runs argv with a deadline and returns its exit status and output. Throws RunError when it
// cannot be started. Never leaves a zombie or an open descriptor behind.
CommandResult run_command(const std::vector<std::string>& argv, const RunOptions& options = {});

// Full path of an executable regular file: `name` itself when it contains '/', else the first
// match on PATH (an empty entry is the current directory; no PATH: /usr/bin:/bin); empty when
// there is none.
std::string find_executable(const std::string& name);

// One line on a failed command: "`scancel 12` exited 1: scancel: error: Invalid job id",
// "`sleep 9` timed out", "`x` was killed" - then stderr (stdout when stderr is empty), trimmed
// and cut at 800 characters ("...").
std::string describe(const std::vector<std::string>& argv, const CommandResult& r);

}  // namespace ring::proc
