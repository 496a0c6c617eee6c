#include "tests/common/test_proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
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

Proc::Proc(std::vector<std::string> args, const std::string& out, const std::string& err,
           ProcOptions opts)
    : kill_on_timeout_(opts.kill_on_timeout) {
  if (args.empty()) throw std::invalid_argument("Proc: empty argv");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls
  // and exec (the test process may have threads).
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t p = fork();
  if (p < 0) throw std::runtime_error(std::string("Proc: fork: ") + std::strerror(errno));
  if (p == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (const auto& [k, v] : opts.set_env) setenv(k.c_str(), v.c_str(), 1);
    for (const std::string& k : opts.unset_env) unsetenv(k.c_str());
    if (!out.empty() && out == err) {
      if (!std::freopen(err.c_str(), "w", stderr)) _exit(126);
      dup2(fileno(stderr), 1);
    } else {
      if (!out.empty() && !std::freopen(out.c_str(), "w", stdout)) _exit(126);
      if (!err.empty() && !std::freopen(err.c_str(), "w", stderr)) _exit(126);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  pid = p;
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
