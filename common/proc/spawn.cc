#include "common/proc/spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/proc/close_fds.h"

extern char** environ;

namespace ring::proc {
namespace {

// The steps of the child between fork and exec; a failing one is sent to the parent with errno.
enum Step : int {
  kSetpgid,
  kDeathSignal,
  kChdir,
  kAffinity,
  kStdin,
  kStdout,
  kStderr,
  kExec,
};

struct Report {
  int step;
  int err;
};

// The child's environment: env (or ours), less env_unset and the names env_set sets, plus
// env_set.
std::vector<std::string> child_environment(const SpawnOptions& o) {
  std::vector<std::string> env;
  if (o.env) {
    env = *o.env;
  } else {
    for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  }
  auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  std::erase_if(env, [&](const std::string& entry) {
    const std::string name = name_of(entry);
    return std::find(o.env_unset.begin(), o.env_unset.end(), name) != o.env_unset.end() ||
           std::any_of(o.env_set.begin(), o.env_set.end(),
                       [&](const auto& kv) { return kv.first == name; });
  });
  for (const auto& [k, v] : o.env_set) env.push_back(k + "=" + v);
  return env;
}

std::string env_value(const std::vector<std::string>& env, const std::string& name) {
  for (const std::string& e : env)
    if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=')
      return e.substr(name.size() + 1);
  return {};
}

// The first PATH entry holding an executable regular file `name`, "" when none does.
std::string search_in_path(const std::string& name, const std::string& path) {
  size_t begin = 0;
  for (;;) {
    const size_t end = path.find(':', begin);
    const size_t len = (end == std::string::npos ? path.size() : end) - begin;
    // An empty entry is the working directory, as for execvp.
    const std::string candidate = (len == 0 ? std::string(".") : path.substr(begin, len)) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == std::string::npos) return {};
    begin = end + 1;
  }
}

std::string step_name(int step, const SpawnOptions& o, const std::string& path) {
  switch (step) {
    case kSetpgid: return "setpgid";
    case kDeathSignal: return "prctl(PR_SET_PDEATHSIG)";
    case kChdir: return "chdir " + o.cwd;
    case kAffinity: return "sched_setaffinity";
    case kStdin: return "stdin";
    case kStdout: return "stdout";
    case kStderr: return "stderr";
    case kExec: return path == o.argv[0] ? "exec" : "exec " + path;
  }
  return "step " + std::to_string(step);
}

Spawned failed(std::string error) { return Spawned{-1, std::move(error)}; }

// Async-signal-safe from here to the end of the child: no allocation, no locks, no stdio.
[[noreturn]] void child_fail(int report_fd, int step) {
  const Report r{step, errno};
  [[maybe_unused]] ssize_t n = ::write(report_fd, &r, sizeof(r));
  _exit(127);
}

}  // namespace

Spawned spawn(const SpawnOptions& o) {
  if (o.argv.empty() || o.argv[0].empty()) return failed("spawn: no program given (empty argv)");
  const std::string& prog = o.argv[0];
  for (int c : o.cpus)
    if (c < 0 || c >= CPU_SETSIZE)
      return failed(prog + ": cpu " + std::to_string(c) + " is outside [0, " +
                    std::to_string(CPU_SETSIZE) + ")");
  auto bad_signal = [](int s) { return s <= 0 || s >= NSIG || s == SIGKILL || s == SIGSTOP; };
  if (o.death_signal != 0 && (o.death_signal < 0 || o.death_signal >= NSIG))
    return failed(prog + ": death_signal " + std::to_string(o.death_signal) + " is not a signal");
  for (const auto* list : {&o.reset_signals, &o.ignore_signals})
    for (int s : *list)
      if (bad_signal(s))
        return failed(prog + ": signal " + std::to_string(s) + " cannot be reset or ignored");

  // Everything the child uses is built here, before fork.
  std::vector<std::string> env = child_environment(o);
  std::string path = prog;
  if (o.search_path && prog.find('/') == std::string::npos) {
    std::string search = env_value(env, "PATH");
    if (search.empty() && getenv("PATH")) search = getenv("PATH");
    if (search.empty()) search = "/usr/local/bin:/usr/bin:/bin";
    path = search_in_path(prog, search);
    if (path.empty()) return failed(prog + ": not found in PATH (" + search + ")");
  }
  std::vector<std::string> args = o.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : o.cpus) CPU_SET(c, &cpus);

  const int want[3] = {o.stdin_fd, o.stdout_fd, o.stderr_fd};
  int devnull = -1;
  if (std::find(std::begin(want), std::end(want), kDevNull) != std::end(want)) {
    devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) return failed(prog + ": open /dev/null: " + std::strerror(errno));
  }
  int src[3];
  for (int i = 0; i < 3; ++i) src[i] = want[i] == kDevNull ? devnull : want[i];

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const int e = errno;
    if (devnull >= 0) ::close(devnull);
    return failed(prog + ": pipe: " + std::strerror(e));
  }
  const int max_fd = descriptor_limit();
  const pid_t parent = ::getpid();

  // All signals blocked across fork: a handler of ours must not run in the child before the
  // child has reset it.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int rfd = report[1];
    ::close(report[0]);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    for (int s = 1; s < NSIG; ++s) {
      struct sigaction cur {};
      if (s == SIGKILL || s == SIGSTOP || sigaction(s, nullptr, &cur) != 0) continue;
      if (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN) sigaction(s, &dfl, nullptr);
    }
    for (int s : o.reset_signals) sigaction(s, &dfl, nullptr);
    for (int s : o.ignore_signals) sigaction(s, &ign, nullptr);
    if (o.new_process_group && ::setpgid(0, 0) != 0) child_fail(rfd, kSetpgid);
    if (o.death_signal != 0) {
      if (::prctl(PR_SET_PDEATHSIG, o.death_signal) != 0) child_fail(rfd, kDeathSignal);
      if (::getppid() != parent) _exit(127);  // died before the prctl: nobody to report to
    }
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) child_fail(rfd, kChdir);
    if (!o.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0)
      child_fail(rfd, kAffinity);
    // Copies above 2 first, so that a source that is itself 0, 1 or 2 is not overwritten by an
    // earlier dup2 (stdout_fd = 2, stderr_fd = 1).
    int tmp[3] = {-1, -1, -1};
    for (int i = 0; i < 3; ++i) {
      if (src[i] < 0) continue;
      if (src[i] == i) {
        if (::fcntl(i, F_SETFD, 0) != 0) child_fail(rfd, kStdin + i);
        continue;
      }
      tmp[i] = ::fcntl(src[i], F_DUPFD_CLOEXEC, 3);
      if (tmp[i] < 0) child_fail(rfd, kStdin + i);
    }
    for (int i = 0; i < 3; ++i)
      if (tmp[i] >= 0 && ::dup2(tmp[i], i) < 0) child_fail(rfd, kStdin + i);
    close_descriptors_except(3, rfd, max_fd);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(path.c_str(), argv.data(), envp.data());
    child_fail(rfd, kExec);
  }
  const int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::close(report[1]);
  if (devnull >= 0) ::close(devnull);
  if (pid < 0) {
    ::close(report[0]);
    return failed(prog + ": fork: " + std::strerror(fork_errno));
  }
  if (o.new_process_group) ::setpgid(pid, pid);  // harmless if the child did it (or exec'd) first

  // Until exec the child holds the write end; exec closes it (end of file), a failure writes.
  Report r{};
  ssize_t n;
  do n = ::read(report[0], &r, sizeof(r));
  while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n <= 0) return Spawned{pid, {}};
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof(r)))
    return failed(prog + ": the child failed before exec (short report)");
  return failed(prog + ": " + step_name(r.step, o, path) + ": " + std::strerror(r.err));
}

}  // namespace ring::proc
