#include "common/proc/run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

extern char** environ;

namespace ring::proc {

CommandResult run_command(const std::vector<std::string>& argv, const RunOptions& options) {
  if (argv.empty()) throw RunError(RunError::Stage::kArguments, 0, "run_command: empty command");
  const std::string& exe = options.executable.empty() ? argv[0] : options.executable;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    throw RunError(RunError::Stage::kPipe, e, "pipe: " + std::string(std::strerror(e)));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    close(out_pipe[0]);
    close(out_pipe[1]);
    throw RunError(RunError::Stage::kPipe, e, "pipe: " + std::string(std::strerror(e)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // The helper (sbatch, scontrol, nvidia-smi) inherits no descriptor of ours above 2: not every
  // library opens its sockets and files with O_CLOEXEC (glibc >= 2.34).
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    throw RunError(RunError::Stage::kSpawn, rc,
                   fmt::format("cannot run {}: {}", exe, std::strerror(rc)));
  }
  CommandResult r;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* bufs[2] = {&r.out, &r.err};
  bool* truncated[2] = {&r.out_truncated, &r.err_truncated};
  const size_t caps[2] = {options.out_cap, options.err_cap};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    int n = poll(fds, 2, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      size_t room = caps[i] - std::min(caps[i], bufs[i]->size());
      size_t keep = std::min(room, static_cast<size_t>(got));
      bufs[i]->append(buf, keep);
      if (keep < static_cast<size_t>(got)) *truncated[i] = true;
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = !r.timed_out && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string find_executable(const std::string& name) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return executable(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t b = 0; b <= dirs.size();) {
    size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    std::string dir = dirs.substr(b, e - b);
    if (dir.empty()) dir.push_back('.');  // an empty PATH entry is the current directory
    // Appended piecewise: GCC 12 warns falsely (-Wrestrict, PR105651) on a + "/" + b.
    std::string candidate = dir;
    candidate += '/';
    candidate += name;
    if (executable(candidate)) return candidate;
    b = e + 1;
  }
  return "";
}

std::string describe(const std::vector<std::string>& argv, const CommandResult& r) {
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  std::string why = r.timed_out        ? "timed out"
                    : r.exit_code < 0 ? "was killed"
                                      : fmt::format("exited {}", r.exit_code);
  const std::string& text = r.err.empty() ? r.out : r.err;
  const char* space = " \t\n\v\f\r";  // isspace() in the C locale
  const size_t first = text.find_first_not_of(space);
  std::string msg =
      first == std::string::npos ? "" : text.substr(first, text.find_last_not_of(space) - first + 1);
  if (msg.size() > 800) msg = msg.substr(0, 800) + "...";
  return fmt::format("`{}` {}{}{}", cmd, why, msg.empty() ? "" : ": ", msg);
}

}  // namespace ring::proc
