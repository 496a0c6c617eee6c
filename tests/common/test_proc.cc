#include "tests/common/test_proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "common/proc/read_file.h"
#include "common/proc/spawn.h"

namespace ring::test {

// read(2), not an ifstream: /proc files of a process that exits while they are read fail with
// ESRCH, and a test helper must then see "" rather than an exception.
std::string slurp(const std::string& path) { return ring::proc::read_file(path); }

TempDir::TempDir(const std::string& prefix) {
  std::string t = std::filesystem::temp_directory_path().string() + "/" + prefix + "-XXXXXX";
  if (!mkdtemp(t.data()))
    throw std::runtime_error("TempDir: mkdtemp(" + t + "): " + std::strerror(errno));
  path = t;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

ProcOptions ucx_loopback() {
  ProcOptions o;
  o.set_env = {{"UCX_TLS", "self,posix"}, {"UCX_NET_DEVICES", "lo"}};
  return o;
}

namespace {

// An output file opened ("w", like freopen) for a child; throws naming it when it cannot be.
int open_output(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw std::runtime_error("Proc: cannot open " + path + ": " + std::strerror(errno));
  return fd;
}

// What every child of a test gets: the test's environment changed by opts, death with the test.
ring::proc::SpawnOptions child_options(std::vector<std::string> argv, const ProcOptions& opts) {
  ring::proc::SpawnOptions so;
  so.argv = std::move(argv);
  so.env_set = opts.set_env;
  so.env_unset = opts.unset_env;
  so.death_signal = SIGKILL;
  return so;
}

}  // namespace

Proc::Proc(std::vector<std::string> args, const std::string& out, const std::string& err,
           ProcOptions opts)
    : kill_on_timeout_(opts.kill_on_timeout) {
  if (args.empty()) throw std::invalid_argument("Proc: empty argv");
  ring::proc::SpawnOptions so = child_options(std::move(args), opts);
  const int out_fd = out.empty() ? -1 : open_output(out);
  int err_fd = -1;
  try {
    err_fd = err.empty() ? -1 : err == out ? out_fd : open_output(err);
  } catch (...) {
    if (out_fd >= 0) ::close(out_fd);
    throw;
  }
  so.stdout_fd = out_fd;
  so.stderr_fd = err_fd;
  const ring::proc::Spawned child = ring::proc::spawn(so);
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0 && err_fd != out_fd) ::close(err_fd);
  if (!child) throw std::runtime_error("Proc: " + child.error);
  pid = child.pid;
}

pid_t start_logged(const std::vector<std::string>& argv, const std::string& log,
                   const ProcOptions& opts) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot open " + log + ": " + std::strerror(errno));
  ring::proc::SpawnOptions so = child_options(argv, opts);
  so.stdout_fd = so.stderr_fd = fd;
  const ring::proc::Spawned child = ring::proc::spawn(so);
  ::close(fd);
  if (!child) throw std::runtime_error(child.error);
  return child.pid;
}

bool Proc::poll() {
  if (pid <= 0) return true;
  int st = 0;
  if (waitpid(pid, &st, WNOHANG) != pid) return false;
  status = st;
  pid = -1;
  return true;
}

int Proc::wait(double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (poll()) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (kill_on_timeout_) kill9();
  return -1;
}

void Proc::kill9() {
  if (pid > 0) {
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
}

int exit_code(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

ProcGroup::~ProcGroup() {
  // Kill all before reaping any: the survivors of a ring must not outlive a dead peer's wait.
  for (const auto& p : procs_)
    if (p->pid > 0) ::kill(p->pid, SIGKILL);
  procs_.clear();  // each destructor reaps
}

size_t ProcGroup::start(const std::vector<std::string>& args, const std::string& out,
                        const std::string& err, ProcOptions opts) {
  procs_.push_back(std::make_unique<Proc>(args, out, err, std::move(opts)));
  pids_.push_back(procs_.back()->pid);
  logs_.push_back(err.empty() ? out : err);
  return procs_.size() - 1;
}

bool ProcGroup::wait_all(std::chrono::milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  for (;;) {
    bool running = false;
    for (const auto& p : procs_)
      if (!p->poll()) running = true;
    if (!running) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int ProcGroup::status(size_t i) const {
  const Proc& p = *procs_[i];
  return p.pid > 0 || p.status < 0 ? -1 : exit_code(p.status);
}

std::string ProcGroup::logs(const std::string& label) const {
  std::string s;
  for (size_t i = 0; i < logs_.size(); ++i)
    s += "--- " + label + " " + std::to_string(i) + ":\n" + slurp(logs_[i]);
  return s;
}

std::vector<pid_t> processes_mentioning(const std::string& needle) {
  std::vector<pid_t> found;
  DIR* d = opendir("/proc");
  if (!d) throw std::runtime_error(std::string("opendir /proc: ") + std::strerror(errno));
  while (dirent* e = readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    const std::string dir = "/proc/" + std::string(e->d_name);
    std::string cmd = slurp(dir + "/cmdline");
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    if (cmd.find(needle) != std::string::npos && ring::proc::process_state(pid) != 'Z')
      found.push_back(pid);
  }
  closedir(d);
  return found;
}

bool wait_for_no_processes(const std::string& needle, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (processes_mentioning(needle).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool alive(pid_t pid, const std::string& cmdline_contains) {
  const char state = ring::proc::process_state(pid);
  if (state == 0 || state == 'Z') return false;
  return slurp("/proc/" + std::to_string(pid) + "/cmdline").find(cmdline_contains) !=
         std::string::npos;
}

std::string as_uid(uid_t uid, const std::function<std::string()>& fn) {
  int p[2];
  if (pipe(p) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    std::string out;
    if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) {
      out = "cannot become uid " + std::to_string(uid);
    } else {
      try {
        out = fn();
      } catch (const std::exception& e) {
        out = std::string("exception: ") + e.what();
      }
    }
    size_t off = 0;
    while (off < out.size()) {
      ssize_t n = write(p[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(p[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return out;
}


}  // namespace ring::test
