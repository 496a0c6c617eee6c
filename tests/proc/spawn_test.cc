// ring::proc::spawn: what the child gets (environment, working directory, process group, death
// signal, CPUs, descriptors, stdio, signals) and how a failure comes back to the parent.
#include "common/proc/spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/common/test_proc.h"

namespace ring::proc {
namespace {

using namespace std::chrono_literals;
using ring::test::slurp;
using ring::test::TempDir;

// Waits for the child (bounded: a hang fails the test instead of the suite); the waitpid status,
// or -1 after killing it when it did not end in time.
int wait_for(pid_t pid, std::chrono::seconds bound = 60s) {
  const auto end = std::chrono::steady_clock::now() + bound;
  int st = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    std::this_thread::sleep_for(5ms);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Runs `script` with /bin/sh, stdout into a file; the output (after the child exited 0).
std::string sh_output(const TempDir& dir, const std::string& script, SpawnOptions o = {}) {
  const std::string out = dir.path + "/out";
  const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  o.argv = {"/bin/sh", "-c", script};
  o.stdout_fd = fd;
  const Spawned s = spawn(o);
  close(fd);
  EXPECT_TRUE(s) << s.error;
  if (!s) return "<spawn failed>";
  const int st = wait_for(s.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  return slurp(out);
}

TEST(Spawn, InheritsSetsAndUnsetsEnvironment) {
  TempDir dir("spawn-env");
  setenv("RING_SPAWN_KEEP", "kept", 1);
  setenv("RING_SPAWN_DROP", "dropped", 1);
  setenv("RING_SPAWN_OVER", "old", 1);
  SpawnOptions o;
  o.env_set = {{"RING_SPAWN_OVER", "new"}, {"RING_SPAWN_ADD", "added"}};
  o.env_unset = {"RING_SPAWN_DROP"};
  EXPECT_EQ(sh_output(dir,
                      "echo \"$RING_SPAWN_KEEP|${RING_SPAWN_DROP-unset}|$RING_SPAWN_OVER|"
                      "$RING_SPAWN_ADD\"",
                      o),
            "kept|unset|new|added\n");
  // Our own environment is untouched.
  EXPECT_STREQ(getenv("RING_SPAWN_DROP"), "dropped");
  EXPECT_STREQ(getenv("RING_SPAWN_OVER"), "old");
  unsetenv("RING_SPAWN_KEEP");
  unsetenv("RING_SPAWN_DROP");
  unsetenv("RING_SPAWN_OVER");
}

TEST(Spawn, FullEnvironmentReplacesOurs) {
  TempDir dir("spawn-envfull");
  setenv("RING_SPAWN_KEEP", "kept", 1);
  SpawnOptions o;
  o.env = std::vector<std::string>{"ONLY=this", "TWICE=1"};
  o.env_set = {{"TWICE", "2"}};
  const std::string out = dir.path + "/out";
  const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  o.argv = {"env"};
  o.search_path = true;  // no PATH in the child's environment: ours is searched
  o.stdout_fd = fd;
  const Spawned s = spawn(o);
  close(fd);
  ASSERT_TRUE(s) << s.error;
  ASSERT_EQ(wait_for(s.pid), 0);
  EXPECT_EQ(slurp(out), "ONLY=this\nTWICE=2\n");
  unsetenv("RING_SPAWN_KEEP");
}

TEST(Spawn, RunsInTheGivenDirectory) {
  TempDir dir("spawn-cwd");
  const std::string sub = dir.path + "/work dir";
  std::filesystem::create_directory(sub);
  SpawnOptions o;
  o.cwd = sub;
  EXPECT_EQ(sh_output(dir, "pwd -P", o), std::filesystem::canonical(sub).string() + "\n");

  o.argv = {"/bin/true"};
  o.cwd = dir.path + "/missing";
  const Spawned s = spawn(o);
  EXPECT_FALSE(s);
  EXPECT_NE(s.error.find("/bin/true"), std::string::npos) << s.error;
  EXPECT_NE(s.error.find("chdir " + o.cwd), std::string::npos) << s.error;
  EXPECT_NE(s.error.find("No such file or directory"), std::string::npos) << s.error;
}

TEST(Spawn, NewProcessGroup) {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  o.new_process_group = true;
  Spawned s = spawn(o);
  ASSERT_TRUE(s) << s.error;
  EXPECT_EQ(getpgid(s.pid), s.pid);
  kill(-s.pid, SIGKILL);  // the group as a whole
  const int st = wait_for(s.pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

  o.new_process_group = false;
  s = spawn(o);
  ASSERT_TRUE(s) << s.error;
  EXPECT_EQ(getpgid(s.pid), getpgrp());
  kill(s.pid, SIGKILL);
  wait_for(s.pid);
}

// The spawning process dies; the child gets the death signal. This process becomes the
// subreaper, so the orphaned child is reparented here and its end can be observed.
TEST(Spawn, DeathSignalWhenTheParentDies) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int pids[2];
  ASSERT_EQ(pipe(pids), 0);
  const pid_t middle = fork();
  if (middle == 0) {
    SpawnOptions o;
    o.argv = {"/bin/sleep", "60"};
    o.death_signal = SIGUSR1;
    const Spawned s = spawn(o);
    const pid_t child = s.pid;
    if (write(pids[1], &child, sizeof(child)) != sizeof(child)) _exit(2);
    _exit(0);  // the parent dies; the child must follow with SIGUSR1
  }
  close(pids[1]);
  pid_t child = -1;
  ASSERT_EQ(read(pids[0], &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  close(pids[0]);
  ASSERT_GT(child, 0) << "spawn failed in the middle process";
  ASSERT_EQ(wait_for(middle), 0);
  const int st = wait_for(child);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGUSR1) << "status " << st;
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST(Spawn, PinsToTheGivenCpus) {
  cpu_set_t ours;
  ASSERT_EQ(sched_getaffinity(0, sizeof(ours), &ours), 0);
  int last = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &ours)) last = c;
  ASSERT_GE(last, 0);
  TempDir dir("spawn-cpus");
  SpawnOptions o;
  o.cpus = {last};
  EXPECT_EQ(sh_output(dir, "grep '^Cpus_allowed_list:' /proc/self/status | cut -f2", o),
            std::to_string(last) + "\n");

  o.argv = {"/bin/true"};
  o.cpus = {CPU_SETSIZE};
  const Spawned s = spawn(o);
  EXPECT_FALSE(s);
  EXPECT_NE(s.error.find("cpu " + std::to_string(CPU_SETSIZE)), std::string::npos) << s.error;
}

TEST(Spawn, ClosesEveryDescriptorAboveTwo) {
  // Not close-on-exec, as a library's socket may be.
  const int leaked = open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 3);
  const int high = fcntl(leaked, F_DUPFD, 700);
  ASSERT_GE(high, 700);
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  const Spawned s = spawn(o);
  close(leaked);
  close(high);
  ASSERT_TRUE(s) << s.error;
  // spawn returns after the exec, so /proc/<pid>/fd is the program's own table now; but the
  // dynamic loader of the new program briefly opens its libraries (fd 3) while it starts, so
  // the table is read until it holds nothing above 2 (an inherited descriptor never goes) or
  // 10 s pass.
  std::vector<int> fds;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    fds.clear();
    for (const auto& e :
         std::filesystem::directory_iterator("/proc/" + std::to_string(s.pid) + "/fd"))
      fds.push_back(std::stoi(e.path().filename().string()));
    const bool clean = std::all_of(fds.begin(), fds.end(), [](int fd) { return fd <= 2; });
    if (clean || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(s.pid, SIGKILL);
  wait_for(s.pid);
  ASSERT_FALSE(fds.empty());
  for (int fd : fds) EXPECT_LE(fd, 2) << "descriptor " << fd << " reached the child";
}

TEST(Spawn, RedirectsStdio) {
  TempDir dir("spawn-stdio");
  const std::string in = dir.path + "/in", out = dir.path + "/out", err = dir.path + "/err";
  std::ofstream(in) << "input line\n";
  const int in_fd = open(in.c_str(), O_RDONLY | O_CLOEXEC);
  const int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_TRUE(in_fd >= 0 && out_fd >= 0 && err_fd >= 0);
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "cat; echo to-err >&2"};
  o.stdin_fd = in_fd;
  o.stdout_fd = out_fd;
  o.stderr_fd = err_fd;
  Spawned s = spawn(o);
  ASSERT_TRUE(s) << s.error;
  EXPECT_EQ(wait_for(s.pid), 0);
  EXPECT_EQ(slurp(out), "input line\n");
  EXPECT_EQ(slurp(err), "to-err\n");

  // One file for both streams, stdin from /dev/null (cat ends at once).
  ASSERT_EQ(ftruncate(out_fd, 0), 0);
  ASSERT_EQ(lseek(out_fd, 0, SEEK_SET), 0);
  o.stdin_fd = kDevNull;
  o.stderr_fd = out_fd;
  s = spawn(o);
  ASSERT_TRUE(s) << s.error;
  EXPECT_EQ(wait_for(s.pid), 0);
  EXPECT_EQ(slurp(out), "to-err\n");
  close(in_fd);
  close(out_fd);
  close(err_fd);
}

// Sources that are themselves 0, 1 or 2: stdout and stderr swapped.
TEST(Spawn, SwapsStandardStreams) {
  TempDir dir("spawn-swap");
  const std::string out = dir.path + "/out", err = dir.path + "/err";
  const pid_t middle = fork();
  if (middle == 0) {
    const int o1 = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e1 = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (dup2(o1, 1) < 0 || dup2(e1, 2) < 0) _exit(3);
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c", "echo to-out; echo to-err >&2"};
    o.stdout_fd = 2;
    o.stderr_fd = 1;
    const Spawned s = spawn(o);
    if (!s) _exit(4);
    int st = 0;
    waitpid(s.pid, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 5);
  }
  ASSERT_EQ(wait_for(middle), 0);
  EXPECT_EQ(slurp(err), "to-out\n");
  EXPECT_EQ(slurp(out), "to-err\n");
}

TEST(Spawn, ReportsExecFailureWithThePath) {
  TempDir dir("spawn-exec");
  SpawnOptions o;
  o.argv = {dir.path + "/no-such-program", "x"};
  Spawned s = spawn(o);
  EXPECT_FALSE(s);
  EXPECT_EQ(s.pid, -1);
  EXPECT_NE(s.error.find(dir.path + "/no-such-program: exec: No such file or directory"),
            std::string::npos)
      << s.error;

  const std::string not_exec = dir.path + "/not-executable";
  std::ofstream(not_exec) << "#!/bin/sh\nexit 0\n";
  chmod(not_exec.c_str(), 0644);
  o.argv = {not_exec};
  s = spawn(o);
  EXPECT_FALSE(s);
  EXPECT_NE(s.error.find(not_exec + ": exec: Permission denied"), std::string::npos) << s.error;
  // The failed child was reaped: no child of ours is left.
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);

  o.argv = {};
  s = spawn(o);
  EXPECT_FALSE(s);
  EXPECT_NE(s.error.find("empty argv"), std::string::npos) << s.error;
}

TEST(Spawn, SearchesPath) {
  TempDir dir("spawn-path");
  const std::string bin = dir.path + "/bin";
  std::filesystem::create_directory(bin);
  const std::string probe = bin + "/ring-spawn-probe";
  std::ofstream(probe) << "#!/bin/sh\nexit 7\n";
  chmod(probe.c_str(), 0755);
  // Not executable, earlier in PATH: skipped, as execvp does.
  std::filesystem::create_directory(dir.path + "/first");
  std::ofstream(dir.path + "/first/ring-spawn-probe") << "#!/bin/sh\nexit 1\n";
  SpawnOptions o;
  o.argv = {"ring-spawn-probe"};
  o.search_path = true;
  o.env_set = {{"PATH", dir.path + "/first:" + bin + ":/usr/bin:/bin"}};
  Spawned s = spawn(o);
  ASSERT_TRUE(s) << s.error;
  int st = wait_for(s.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7) << st;

  o.search_path = false;  // a bare name is then a path relative to the working directory
  s = spawn(o);
  EXPECT_FALSE(s);
  EXPECT_NE(s.error.find("ring-spawn-probe: exec: No such file or directory"), std::string::npos)
      << s.error;

  o.search_path = true;
  o.env_set = {{"PATH", dir.path + "/first"}};
  s = spawn(o);
  EXPECT_FALSE(s);
  EXPECT_NE(s.error.find("ring-spawn-probe: not found in PATH (" + dir.path + "/first)"),
            std::string::npos)
      << s.error;
}

// Bit `sig` of a /proc/<pid>/status signal mask line ("SigIgn:\t0000000000001000").
bool mask_has(const std::string& status, const std::string& field, int sig) {
  const size_t at = status.find(field + ":\t");
  if (at == std::string::npos) return false;
  const unsigned long long mask =
      std::stoull(status.substr(at + field.size() + 2, 16), nullptr, 16);
  return (mask >> (sig - 1)) & 1;
}

TEST(Spawn, ClearsTheSignalMaskAndResetsSignals) {
  TempDir dir("spawn-signals");
  struct sigaction ign {
  }, old_pipe{}, old_hup{};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old_pipe);
  sigaction(SIGHUP, &ign, &old_hup);
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &block, &old_mask);

  const std::string out = dir.path + "/status";
  const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  SpawnOptions o;
  o.argv = {"/bin/cat", "/proc/self/status"};  // cat installs no handlers of its own
  o.stdout_fd = fd;
  o.reset_signals = {SIGPIPE};
  o.ignore_signals = {SIGTERM};
  const Spawned s = spawn(o);
  close(fd);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  ASSERT_TRUE(s) << s.error;
  ASSERT_EQ(wait_for(s.pid), 0);
  const std::string status = slurp(out);
  EXPECT_FALSE(mask_has(status, "SigBlk", SIGUSR1)) << status;
  EXPECT_FALSE(mask_has(status, "SigIgn", SIGPIPE)) << status;  // reset_signals
  EXPECT_TRUE(mask_has(status, "SigIgn", SIGHUP)) << status;    // ignored stays ignored
  EXPECT_TRUE(mask_has(status, "SigIgn", SIGTERM)) << status;   // ignore_signals
}

}  // namespace
}  // namespace ring::proc
