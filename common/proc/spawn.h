// Starting a child program: the one fork+exec of the project (ringd's workers, `ringctl run`'s
// ring-coord and ringd, the local launcher's ranks, the tests' processes).
//
//   ring::proc::SpawnOptions o;
//   o.argv = {worker_bin, "--rank", "0"};
//   o.env_set = {{"CUDA_VISIBLE_DEVICES", "1"}};
//   o.new_process_group = true;
//   o.death_signal = SIGKILL;
//   o.stdout_fd = o.stderr_fd = log_fd;
//   o.stdin_fd = ring::proc::kDevNull;
//   ring::proc::Spawned s = ring::proc::spawn(o);
//   if (!s) fail(s.error);   // "/opt/ring/bin/ring-worker: exec: No such file or directory"
//
// Why one spawner: the parent has threads (zmq, the optimizer pipeline, a checkpoint writer), so
// between fork and exec only async-signal-safe calls are allowed: everything (argv and envp
// arrays, the PATH lookup, /dev/null) is prepared before fork. The child gets no descriptor above
// 2 (sockets, shared-memory handles and pipes stay the parent's), a clear signal mask and default
// handlers, and a failure of any step up to exec (chdir, affinity, the exec itself) comes back to
// the parent through a close-on-exec pipe as an error naming the program and the step, instead of
// a child that exits 127 with a message somewhere in its log.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ring::proc {

// stdin_fd/stdout_fd/stderr_fd value: the stream reads from or writes to /dev/null.
inline constexpr int kDevNull = -2;

struct SpawnOptions {
  // argv[0]: a path (absolute, or relative to the parent's working directory when cwd is empty)
  // or, with search_path, a name without '/' looked up in PATH (the child's PATH when env or
  // env_set set one, else ours, else /usr/local/bin:/usr/bin:/bin). The program gets argv as is.
  std::vector<std::string> argv;
  bool search_path = false;
  // The full environment ("K=V" entries); nullopt: a copy of ours (environ).
  std::optional<std::vector<std::string>> env;
  // Applied on top of env: names in env_unset are removed, then env_set entries replace or add
  // (a name in both is set).
  std::vector<std::pair<std::string, std::string>> env_set;
  std::vector<std::string> env_unset;
  // The child's working directory; empty: ours.
  std::string cwd;
  // setpgid(0, 0): the child leads a new process group (stopped with kill(-pid, ...)).
  bool new_process_group = false;
  // PR_SET_PDEATHSIG (0: none): the signal the child gets when the thread that called spawn ends
  // (its process dying included). A child whose parent already died before this took effect
  // exits at once.
  int death_signal = 0;
  // sched_setaffinity to these CPUs (each in [0, CPU_SETSIZE)); empty: ours.
  std::vector<int> cpus;
  // dup2'd onto 0, 1, 2; -1: inherited; kDevNull: /dev/null. The same descriptor may be given
  // for several streams (stdout_fd = stderr_fd = log). The caller keeps and closes its own.
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;
  // Signals set to SIG_DFL even when we ignore them (SIGPIPE, ...). Handled signals are reset to
  // SIG_DFL anyway and the child's signal mask is empty; ignored ones stay ignored otherwise.
  std::vector<int> reset_signals;
  // Signals the child starts with ignored (SIG_IGN survives exec): e.g. ringd's workers ignore
  // SIGTERM/SIGINT, which stopping the job is ringd's business.
  std::vector<int> ignore_signals;
};

struct Spawned {
  pid_t pid = -1;
  std::string error;
  explicit operator bool() const { return pid > 0; }
};

// Starts the child and returns once it has exec'd (or failed). On failure (bad options, fork,
// PATH lookup, /dev/null, cwd, affinity, dup2, exec: ENOENT, EACCES, ...) pid is -1 and error
// names argv[0] and the step that failed ("PROG: chdir /x: No such file or directory"); a child
// that got as far as fork has then been reaped. On success the caller owns the child (waitpid).
// Thread-safe.
Spawned spawn(const SpawnOptions& options);

}  // namespace ring::proc
