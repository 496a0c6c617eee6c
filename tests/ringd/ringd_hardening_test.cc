// ringd hardening: real ringd processes and ring-worker ranks.
//
//   RendezvousDirOfTheUserIsKept: `--rendezvous DIR` with the user's files in DIR (a file, an
//     unmarked attempt-7 directory, a symlink attempt-9 to another directory): all kept; only
//     the attempt directory ringd made and marked goes.
//   KilledRingdControlDirIsRemovedByTheNext: the control socket directory lives in the per-user
//     runtime dir ($XDG_RUNTIME_DIR/ringmaster/ringd/ringd-<pid>, 0700); after kill -9 of a ringd
//     the next ringd removes it; an unmarked directory there is left alone.
//   SighupWithStdoutGoneStopsWithACheckpoint: stdout and stderr into a pipe whose reader is
//     closed, then SIGHUP: no death by SIGPIPE, the stop checkpoint is committed, exit 75.
//   EveryStepsZeroCheckpointsOnStopInARelativeDir: checkpoint.every_steps 0 with dir
//     "ondemand-ckpt": no periodic checkpoint, SIGTERM writes one into <job-dir>/ondemand-ckpt;
//     files 0600 and directories 0700.
//   FailedFinalCheckpointIsAFailure: a 2 MiB tmpfs holds one checkpoint (step 2) but not the
//     final one (step 3): exit 1, stderr names the failed checkpoint, ENOSPC and step 2.
//   InheritedDescriptorIsNotPassedToWorkers: fd 5000 open without CLOEXEC in ringd is closed in
//     its workers.
//   SymlinkedWorkerLogIsRefused: logs/worker-0.log -> a victim file: ringd refuses at once (exit
//     1, stderr says why, no restart), the victim is untouched.
//   UnwritableWorkerLogFailsAtOnce: logs/worker-0.log cannot be opened (a directory there): exit
//     1 within seconds with the cause on stderr, no restart.
//   MalformedControlMessagesDoNotEndRingd: a hello with a string where a number belongs, a line
//     over the 1 MiB limit, garbage: each connection is closed with a message, ringd trains on.
//   WorkerWithATypeErrorFailsAlone: a fake worker that says hello properly and then sends a bucket
//     whose step is a string: that worker fails with "protocol error" naming the field; ringd
//     exits 1 (max_restarts 0) through its normal failure path, not an escaped exception.
//   LazyUpdateOverTwoToThe32ParametersIsRefused: update lazy with 6.4e9 parameters: exit 2 before
//     allocating (the shm index is 32-bit).
//   UnusableCheckpointDirFailsAtStart: checkpoint.dir below a regular file: exit 1 at start.
//   JobDirTheUserCannotWriteFailsAtOnceWithTheCause: ringd as nobody on a root-owned job dir:
//     exit 1 at once, "cannot open .../logs/ringd-0.log: Permission denied" on stderr.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/proc/spawn.h"
#include "tests/common/test_json.h"
#include "tests/common/test_proc.h"
#include "tests/ringd/ringd_test_util.h"
#include "tests/ringd/socket_util.h"

namespace {

using json = nlohmann::json;
using namespace ring::test;
namespace fs = std::filesystem;

const std::string kSrc = RING_SOURCE_DIR;
const std::string kSpec4 = kSrc + "/tests/ringd/tiny4.yaml";
const std::string kOnDemand = kSrc + "/tests/ringd/ondemand.yaml";
const std::string kRestart = kSrc + "/tests/ringd/restart.yaml";

ProcOptions opts(const std::string& xdg) {
  ProcOptions o = ucx_loopback();
  o.set_env.push_back({"XDG_RUNTIME_DIR", xdg});
  return o;
}

// A private runtime dir per test, so control directories of parallel tests never meet.
std::string make_xdg(const TempDir& t) {
  const std::string x = t.path + "/xdg";
  fs::create_directories(x);
  ::chmod(x.c_str(), 0700);
  return x;
}

bool has_event(const std::string& out, const std::string& name) {
  for (const json& j : json_lines(out))
    if (j.value("event", "") == name) return true;
  return false;
}

std::string diag(const TempDir& t) {
  return "\n--- ringd.err\n" + slurp(t.path + "/ringd.err") + "\n--- ringd-0.log\n" +
         slurp(t.path + "/job/logs/ringd-0.log");
}

mode_t mode_of(const std::string& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return 07777;
  return st.st_mode & 07777;
}

// The control socket a worker was given (--ringd PATH in its command line).
std::string ringd_socket_of(pid_t worker) {
  const std::string cmd = slurp("/proc/" + std::to_string(worker) + "/cmdline");
  std::vector<std::string> args;
  size_t from = 0;
  for (size_t i = 0; i < cmd.size(); ++i)
    if (cmd[i] == '\0') {
      args.push_back(cmd.substr(from, i - from));
      from = i + 1;
    }
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--ringd") return args[i + 1];
  return "";
}

// True when ringd closed the connection (EOF or reset) within `seconds`.
bool closed_by_peer(int fd, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  char buf[4096];
  while (Clock::now() < end) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

int64_t last_step(const std::string& out) {
  int64_t s = 0;
  for (const json& j : json_lines(out))
    if (j.contains("step") && !j.contains("event")) s = std::max<int64_t>(s, j["step"]);
  return s;
}

TEST(RingdHardening, RendezvousDirOfTheUserIsKept) {
  TempDir t("ringd-hard");
  const std::string u = t.path + "/work";  // "the user's ~/work"
  fs::create_directories(u + "/attempt-7");
  fs::create_directories(t.path + "/elsewhere");
  std::ofstream(u + "/thesis.tex") << "precious\n";
  std::ofstream(u + "/attempt-7/notes") << "mine\n";
  std::ofstream(t.path + "/elsewhere/data") << "also mine\n";
  fs::create_directory_symlink(t.path + "/elsewhere", u + "/attempt-9");
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", "2", "--rendezvous", u}),
         t.path + "/ringd.out", t.path + "/ringd.err", opts(make_xdg(t)));
  const int st = d.wait(120);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t);
  EXPECT_EQ(WEXITSTATUS(st), 0) << diag(t);
  EXPECT_EQ(slurp(u + "/thesis.tex"), "precious\n");
  EXPECT_EQ(slurp(u + "/attempt-7/notes"), "mine\n");
  EXPECT_TRUE(fs::is_symlink(u + "/attempt-9"));
  EXPECT_EQ(slurp(t.path + "/elsewhere/data"), "also mine\n");
  // What ringd made (attempt-1, marked) is gone again.
  EXPECT_FALSE(fs::exists(u + "/attempt-1")) << diag(t);
  // A second run on the same directory: its start-up cleanup leaves the user's files too.
  Proc d2(ringd_args(kSpec4, t.path + "/job", {"--steps", "1", "--rendezvous", u}),
          t.path + "/ringd2.out", t.path + "/ringd2.err", opts(make_xdg(t)));
  ASSERT_EQ(exit_code(d2.wait(120)), 0) << slurp(t.path + "/ringd2.err");
  EXPECT_EQ(slurp(u + "/thesis.tex"), "precious\n");
  EXPECT_EQ(slurp(u + "/attempt-7/notes"), "mine\n");
  EXPECT_EQ(slurp(t.path + "/elsewhere/data"), "also mine\n");
}

TEST(RingdHardening, KilledRingdControlDirIsRemovedByTheNext) {
  TempDir t("ringd-hard");
  const std::string xdg = make_xdg(t);
  const std::string ctl = xdg + "/ringmaster/ringd";
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", "100000"}), out,
         t.path + "/ringd.err", opts(xdg));
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 1; }, 60).is_null())
      << diag(t);
  const std::string mine = ctl + "/ringd-" + std::to_string(d.pid);
  ASSERT_TRUE(fs::is_directory(mine)) << diag(t);
  EXPECT_EQ(mode_of(mine), 0700u);
  EXPECT_EQ(mode_of(ctl), 0700u);
  const std::vector<pid_t> pids = worker_pids(out);
  ASSERT_FALSE(pids.empty());
  EXPECT_EQ(ringd_socket_of(pids[0]), mine + "/ctl.sock");
  // Not ringd's (no marker): never removed.
  fs::create_directories(ctl + "/ringd-999999999");
  std::ofstream(ctl + "/ringd-999999999/keep") << "x";
  ASSERT_EQ(kill(d.pid, SIGKILL), 0);
  d.wait(10);
  EXPECT_TRUE(wait_for_no_processes(t.path, 10));
  EXPECT_TRUE(fs::exists(mine));  // kill -9 leaves it; the next ringd cleans up
  Proc d2(ringd_args(kSpec4, t.path + "/job2", {"--steps", "1"}), t.path + "/ringd2.out",
          t.path + "/ringd2.err", opts(xdg));
  ASSERT_EQ(exit_code(d2.wait(120)), 0) << slurp(t.path + "/ringd2.err");
  EXPECT_FALSE(fs::exists(mine)) << slurp(t.path + "/job2/logs/ringd-0.log");
  EXPECT_TRUE(fs::exists(ctl + "/ringd-999999999/keep"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(ctl)) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"ringd-999999999"});
}

TEST(RingdHardening, SighupWithStdoutGoneStopsWithACheckpoint) {
  TempDir t("ringd-hard");
  const std::string xdg = make_xdg(t);
  const std::string job = t.path + "/job";
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ring::proc::SpawnOptions so;
  so.argv = ringd_args(kOnDemand, job, {"--steps", "100000"});
  so.env_set = opts(xdg).set_env;
  so.death_signal = SIGKILL;
  so.stdout_fd = so.stderr_fd = p[1];
  const ring::proc::Spawned child = ring::proc::spawn(so);
  ASSERT_TRUE(child) << child.error;
  const pid_t pid = child.pid;
  ::close(p[1]);
  // Read until a step line has come, as `ringctl run` would, then die like it.
  std::string got;
  const auto end = Clock::now() + std::chrono::seconds(90);
  while (got.find("\"step\":2") == std::string::npos && Clock::now() < end) {
    pollfd pf{p[0], POLLIN, 0};
    if (::poll(&pf, 1, 1000) <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(p[0], buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(p[0]);
  ASSERT_NE(got.find("\"step\":2"), std::string::npos) << got;
  // A few more steps write into the closed pipe (EPIPE) before the hang-up (or kill ringd with
  // SIGPIPE, which is the bug).
  const std::string log = job + "/logs/ringd-0.log";
  int st = -1;
  bool reaped = false;
  EXPECT_TRUE(wait_for(
      [&] {
        reaped = reaped || waitpid(pid, &st, WNOHANG) == pid;
        return reaped || slurp(log).find("stdout is closed") != std::string::npos;
      },
      60))
      << slurp(log);
  if (!reaped) {
    ASSERT_EQ(kill(pid, SIGHUP), 0);
  }
  const auto end2 = Clock::now() + std::chrono::seconds(60);
  while (!reaped && Clock::now() < end2) {
    reaped = waitpid(pid, &st, WNOHANG) == pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!reaped) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
  }
  ASSERT_TRUE(WIFEXITED(st)) << "ringd " << (WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "hung")
                             << "\n" << slurp(log);
  EXPECT_EQ(WEXITSTATUS(st), 75) << slurp(log);
  const std::string latest = slurp(job + "/ondemand-ckpt/latest");
  ASSERT_FALSE(latest.empty()) << slurp(log);
  EXPECT_TRUE(fs::exists(job + "/ondemand-ckpt/" + latest.substr(0, latest.size() - 1) +
                         "/checkpoint.json"));
  EXPECT_TRUE(wait_for_no_processes(t.path, 10));
}

TEST(RingdHardening, EveryStepsZeroCheckpointsOnStopInARelativeDir) {
  TempDir t("ringd-hard");
  const std::string out = t.path + "/ringd.out";
  const std::string job = t.path + "/job";
  Proc d(ringd_args(kOnDemand, job, {"--steps", "100000"}), out, t.path + "/ringd.err",
         opts(make_xdg(t)));
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 3; }, 60).is_null())
      << diag(t);
  EXPECT_FALSE(has_event(out, "checkpoint_saved"));  // every_steps 0: none periodic
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  ASSERT_EQ(exit_code(d.wait(60)), 75) << diag(t);
  json saved = wait_line(out, [](const json& j) { return j.value("event", "") == "checkpoint_saved"; }, 1);
  ASSERT_FALSE(saved.is_null()) << diag(t);
  const std::string dir = saved.value("path", "");
  EXPECT_EQ(fs::path(dir).parent_path(), fs::path(job + "/ondemand-ckpt"));
  EXPECT_EQ(slurp(job + "/ondemand-ckpt/latest"), fs::path(dir).filename().string() + "\n");
  // Private files: 0600 files, 0700 directories.
  EXPECT_EQ(mode_of(job), 0700u);
  EXPECT_EQ(mode_of(job + "/logs"), 0700u);
  EXPECT_EQ(mode_of(job + "/ondemand-ckpt"), 0700u);
  EXPECT_EQ(mode_of(dir), 0700u);
  for (const char* f : {"node-00000.bin", "node-00000.json", "checkpoint.json"})
    EXPECT_EQ(mode_of(dir + "/" + f), 0600u) << f;
  EXPECT_EQ(mode_of(job + "/ondemand-ckpt/latest"), 0600u);
  EXPECT_EQ(mode_of(job + "/steps.jsonl"), 0600u);
  EXPECT_EQ(mode_of(job + "/logs/ringd-0.log"), 0600u);
  EXPECT_EQ(mode_of(job + "/logs/worker-0.log"), 0600u);
}

TEST(RingdHardening, FailedFinalCheckpointIsAFailure) {
  TempDir t("ringd-hard");
  const std::string mnt = t.path + "/small";
  fs::create_directories(mnt);
  // One checkpoint of this model is about 1.5 MB: 2 MiB holds step 2, not step 3 beside it.
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=2m,mode=0700") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs (" << std::strerror(errno)
                 << "); needs root or CAP_SYS_ADMIN";
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  std::string spec = slurp(kSpec4);
  const std::string key = "  every_steps: 0\n";
  spec.replace(spec.find(key), key.size(),
               "  every_steps: 2\n  keep_last: 1\n  dir: " + mnt + "\n");
  std::ofstream(t.path + "/spec.yaml") << spec;
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(t.path + "/spec.yaml", t.path + "/job", {"--steps", "3"}), out,
         t.path + "/ringd.err", opts(make_xdg(t)));
  const int st = d.wait(120);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t);
  EXPECT_EQ(WEXITSTATUS(st), 1) << diag(t);
  const std::string err = slurp(t.path + "/ringd.err");
  EXPECT_NE(err.find("final checkpoint (step 3) failed"), std::string::npos) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find("newest complete checkpoint is " + mnt + "/step-00000002 (step 2)"),
            std::string::npos)
      << err;
  EXPECT_FALSE(has_event(out, "completed"));
  json failed = wait_line(out, [](const json& j) {
    return j.value("event", "") == "checkpoint_failed" && j.value("final", false);
  }, 1);
  EXPECT_FALSE(failed.is_null()) << slurp(out);
}

TEST(RingdHardening, InheritedDescriptorIsNotPassedToWorkers) {
  TempDir t("ringd-hard");
  constexpr int kFd = 5000;
  rlimit rl{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max <= static_cast<rlim_t>(kFd))
    GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << rl.rlim_max << " is below " << kFd + 1;
  const rlimit old = rl;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur <= static_cast<rlim_t>(kFd)) {
    rl.rlim_cur = kFd + 1;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  const std::string out = t.path + "/ringd.out";
  // Started through bash, which opens it without close-on-exec as a library's socket may be
  // (the test's own children get no descriptor above 2).
  std::vector<std::string> args = {"/bin/bash", "-c", "exec " + std::to_string(kFd) +
                                                         "</dev/null; exec \"$0\" \"$@\""};
  for (std::string& a : ringd_args(kSpec4, t.path + "/job", {"--steps", "100000"}))
    args.push_back(std::move(a));
  Proc d(args, out, t.path + "/ringd.err", opts(make_xdg(t)));
  setrlimit(RLIMIT_NOFILE, &old);
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 1; }, 60).is_null())
      << diag(t);
  // The test's premise: ringd itself has it.
  EXPECT_TRUE(fs::exists("/proc/" + std::to_string(d.pid) + "/fd/" + std::to_string(kFd)));
  const std::vector<pid_t> pids = worker_pids(out);
  ASSERT_EQ(pids.size(), 4u);
  for (pid_t p : pids) {
    EXPECT_FALSE(fs::exists("/proc/" + std::to_string(p) + "/fd/" + std::to_string(kFd)))
        << "worker " << p << " inherited fd " << kFd;
  }
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  EXPECT_EQ(exit_code(d.wait(60)), 75) << diag(t);
}

TEST(RingdHardening, SymlinkedWorkerLogIsRefused) {
  TempDir t("ringd-hard");
  const std::string job = t.path + "/job";
  fs::create_directories(job + "/logs");
  std::ofstream(t.path + "/victim") << "victim's data\n";
  ::chmod((t.path + "/victim").c_str(), 0644);
  fs::create_symlink(t.path + "/victim", job + "/logs/worker-0.log");
  const std::string out = t.path + "/ringd.out";
  const auto t0 = Clock::now();
  Proc d(ringd_args(kRestart, job), out, t.path + "/ringd.err", opts(make_xdg(t)));
  const int st = d.wait(60);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t);
  EXPECT_EQ(WEXITSTATUS(st), 1) << diag(t);
  EXPECT_LT(took, 30.0);
  const std::string err = slurp(t.path + "/ringd.err");
  EXPECT_NE(err.find(job + "/logs/worker-0.log is a symbolic link"), std::string::npos) << err;
  EXPECT_EQ(slurp(t.path + "/victim"), "victim's data\n");
  EXPECT_EQ(mode_of(t.path + "/victim"), 0644u);
  EXPECT_FALSE(has_event(out, "restarting")) << slurp(out);
  EXPECT_TRUE(wait_for_no_processes(t.path, 10));
}

TEST(RingdHardening, UnwritableWorkerLogFailsAtOnce) {
  TempDir t("ringd-hard");
  const std::string job = t.path + "/job";
  fs::create_directories(job + "/logs/worker-2.log");  // cannot be opened for writing
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(kRestart, job), out, t.path + "/ringd.err", opts(make_xdg(t)));
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t);
  EXPECT_EQ(WEXITSTATUS(st), 1) << diag(t);
  const std::string err = slurp(t.path + "/ringd.err");
  EXPECT_NE(err.find("cannot open " + job + "/logs/worker-2.log: Is a directory"),
            std::string::npos)
      << err;
  EXPECT_FALSE(has_event(out, "restarting")) << slurp(out);
  json failed = wait_line(out, [](const json& j) { return j.value("event", "") == "failed"; }, 1);
  ASSERT_FALSE(failed.is_null()) << slurp(out);
  EXPECT_NE(failed.value("error", "").find("worker-2.log"), std::string::npos);
  EXPECT_TRUE(wait_for_no_processes(t.path, 10));
}

TEST(RingdHardening, MalformedControlMessagesDoNotEndRingd) {
  TempDir t("ringd-hard");
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(kSpec4, t.path + "/job", {"--steps", "100000"}), out,
         t.path + "/ringd.err", opts(make_xdg(t)));
  ASSERT_FALSE(wait_line(out, [](const json& j) { return j.value("step", 0) >= 1; }, 60).is_null())
      << diag(t);
  const std::vector<pid_t> pids = worker_pids(out);
  ASSERT_FALSE(pids.empty());
  const std::string sock = ringd_socket_of(pids[0]);
  ASSERT_FALSE(sock.empty());
  const std::string log = t.path + "/job/logs/ringd-0.log";
  {  // A string where a number belongs.
    int fd = connect_unix(sock);
    ASSERT_GE(fd, 0) << sock;
    send_all(fd, "{\"t\":\"hello\",\"local\":\"zero\",\"rank\":0,\"pid\":1,\"n\":1}\n");
    EXPECT_TRUE(closed_by_peer(fd, 30)) << slurp(log);
    ::close(fd);
  }
  {  // Over the line limit, no newline.
    int fd = connect_unix(sock);
    ASSERT_GE(fd, 0);
    send_all(fd, std::string((1 << 20) + 4096, 'x'));
    EXPECT_TRUE(closed_by_peer(fd, 30)) << slurp(log);
    ::close(fd);
  }
  {  // Not JSON at all, and a message before hello.
    int fd = connect_unix(sock);
    ASSERT_GE(fd, 0);
    send_all(fd, "\x01\x02 not json\n");
    EXPECT_TRUE(closed_by_peer(fd, 30));
    ::close(fd);
    fd = connect_unix(sock);
    send_all(fd, "{\"t\":\"done\",\"step\":1}\n");
    EXPECT_TRUE(closed_by_peer(fd, 30));
    ::close(fd);
  }
  const std::string l = slurp(log);
  EXPECT_NE(l.find("local: must be an integer"), std::string::npos) << l;
  EXPECT_NE(l.find("longer than the 1048576 byte limit"), std::string::npos) << l;
  EXPECT_NE(l.find("not a JSON object"), std::string::npos) << l;
  EXPECT_NE(l.find("'done' before hello"), std::string::npos) << l;
  // ringd lives and trains on.
  const int64_t now = last_step(out);
  EXPECT_FALSE(
      wait_line(out, [&](const json& j) { return j.value("step", int64_t{0}) >= now + 2; }, 60)
          .is_null())
      << diag(t);
  ASSERT_EQ(kill(d.pid, SIGTERM), 0);
  EXPECT_EQ(exit_code(d.wait(60)), 75) << diag(t);
  EXPECT_FALSE(has_event(out, "worker_failed")) << slurp(out);
}

// A ring-worker stand-in (python3): says hello as the worker ringd spawned, learns the model
// size from ringd's refusal, then sends a bucket whose step is a string.
const char* kFakeWorker = R"PY(
import json, os, socket, sys
a = sys.argv
sock = a[a.index('--ringd') + 1]
rank = int(a[a.index('--rank') + 1]); local = int(a[a.index('--local-rank') + 1])
def talk(n):
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    s.sendall((json.dumps({'t': 'hello', 'rank': rank, 'local': local, 'pid': os.getpid(), 'n': n, 'proto': 1}) + '\n').encode())
    f = s.makefile('r'); return s, json.loads(f.readline())
s, m = talk(1)  # a wrong model size: the refusal names ringd's
n = int(m['reason'].split('ringd\'s has ')[1].split(' ')[0])
s, m = talk(n)
assert m['t'] == 'welcome', m
s.sendall(b'{"t":"mapped"}\n{"t":"bucket","step":"one","b":0}\n')
s.recv(1)
)PY";

TEST(RingdHardening, WorkerWithATypeErrorFailsAlone) {
  TempDir t("ringd-hard");
  if (system("python3 -c 'import json, socket' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 is not available for the fake worker";
  const std::string py = t.path + "/fake_worker.py";
  std::ofstream(py) << kFakeWorker;
  const std::string bin = t.path + "/fake-worker";
  std::ofstream(bin) << "#!/bin/sh\nexec python3 " << py << " \"$@\"\n";
  ::chmod(bin.c_str(), 0755);
  std::string spec = slurp(kSpec4);
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"  context_ranks: 4\n", "  context_ranks: 1\n"},
           {"  workers_per_node: 4\n", "  workers_per_node: 1\n"}})
    spec.replace(spec.find(from), from.size(), to);
  std::ofstream(t.path + "/spec.yaml") << spec;
  std::vector<std::string> args = ringd_args(t.path + "/spec.yaml", t.path + "/job");
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--worker-bin") args[i + 1] = bin;
  const std::string out = t.path + "/ringd.out";
  Proc d(args, out, t.path + "/ringd.err", opts(make_xdg(t)));
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t);
  EXPECT_EQ(WEXITSTATUS(st), 1) << diag(t);  // max_restarts 0
  json f = wait_line(out, [](const json& j) { return j.value("event", "") == "worker_failed"; }, 1);
  ASSERT_FALSE(f.is_null()) << diag(t) << slurp(t.path + "/job/logs/worker-0.log");
  const std::string e = f.value("error", "");
  EXPECT_NE(e.find("protocol error"), std::string::npos) << e;
  EXPECT_NE(e.find("step: must be an integer"), std::string::npos) << e;
  EXPECT_EQ(slurp(t.path + "/ringd.err").find("fatal"), std::string::npos) << diag(t);
}

// update: lazy keeps 32-bit coordinates in shared memory: a model of more than 2^32 parameters
// is refused before anything is allocated (exit 2, naming the key and the limit).
TEST(RingdHardening, LazyUpdateOverTwoToThe32ParametersIsRefused) {
  TempDir t("ringd-hard");
  std::string spec = slurp(kSpec4);
  for (auto [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"  layers: 2\n", "  layers: 8\n"},
           {"  d_model: 64\n", "  d_model: 8192\n"},
           {"  heads: 4\n", "  heads: 64\n"},
           {"  offload: cpu\n",
            "  offload: cpu\n  update: lazy\n  compression: topk\n  density: 0.001\n"}})
    spec.replace(spec.find(from), from.size(), to);
  std::ofstream(t.path + "/spec.yaml") << spec;
  Proc d(ringd_args(t.path + "/spec.yaml", t.path + "/job"), t.path + "/ringd.out",
         t.path + "/ringd.err", opts(make_xdg(t)));
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 2) << slurp(t.path + "/ringd.err");
  const std::string err = slurp(t.path + "/ringd.err");
  EXPECT_NE(err.find("optimizer.update"), std::string::npos) << err;
  EXPECT_NE(err.find("4294967296"), std::string::npos) << err;
}

// A checkpoint directory that cannot be made is an error at start (exit 1, named), not a failed
// checkpoint discovered at the end of the run or at a preemption.
TEST(RingdHardening, UnusableCheckpointDirFailsAtStart) {
  TempDir t("ringd-hard");
  std::ofstream(t.path + "/file") << "a file, not a directory\n";
  std::string spec = slurp(kOnDemand);
  const std::string key = "  dir: ondemand-ckpt";
  spec.replace(spec.find(key), key.size(), "  dir: " + t.path + "/file/ckpt");
  std::ofstream(t.path + "/spec.yaml") << spec;
  const std::string out = t.path + "/ringd.out";
  Proc d(ringd_args(t.path + "/spec.yaml", t.path + "/job", {"--steps", "3"}), out,
         t.path + "/ringd.err", opts(make_xdg(t)));
  const int st = d.wait(60);
  ASSERT_TRUE(WIFEXITED(st)) << st << diag(t);
  EXPECT_EQ(WEXITSTATUS(st), 1) << diag(t);
  const std::string err = slurp(t.path + "/ringd.err");
  EXPECT_NE(err.find("checkpoint.dir " + t.path + "/file/ckpt: Not a directory"),
            std::string::npos)
      << err;
  EXPECT_EQ(last_step(out), 0) << "trained without a usable checkpoint directory";
}

// The issue's case: `ringctl run` with a job directory the user cannot write. ringd (run as
// nobody, on a root-owned job dir) exits 1 at once with the cause on stderr, also with --json,
// instead of restarting and leaving the reason in a log file nobody can write anyway.
TEST(RingdHardening, JobDirTheUserCannotWriteFailsAtOnceWithTheCause) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run ringd as another user (nobody)";
  if (std::system("command -v setpriv >/dev/null 2>&1") != 0) GTEST_SKIP() << "no setpriv";
  TempDir t("ringd-hard");
  ::chmod(t.path.c_str(), 0755);
  // What nobody runs and reads, where nobody can reach it (the checkout may be in a 0700 home).
  fs::create_directories(t.path + "/bin");
  fs::copy_file(RINGD_BIN, t.path + "/bin/ringd");
  ::chmod((t.path + "/bin/ringd").c_str(), 0755);
  fs::copy_file(kSpec4, t.path + "/spec.yaml");
  ::chmod((t.path + "/spec.yaml").c_str(), 0644);
  const std::string job = t.path + "/job";
  fs::create_directories(job + "/logs");  // root's, 0755: nobody cannot write
  ::chmod(job.c_str(), 0755);
  ::chmod((job + "/logs").c_str(), 0755);
  const std::string xdg = t.path + "/xdg";
  fs::create_directories(xdg);
  ASSERT_EQ(::chown(xdg.c_str(), 65534, 65534), 0);
  ::chmod(xdg.c_str(), 0700);
  const auto t0 = Clock::now();
  Proc d({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
          t.path + "/bin/ringd", "--spec", t.path + "/spec.yaml", "--job-dir", job, "--json",
          "--worker-bin", RING_WORKER},
         t.path + "/ringd.out", t.path + "/ringd.err", opts(xdg));
  const int st = d.wait(60);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 1) << slurp(t.path + "/ringd.err");
  EXPECT_LT(took, 20.0);
  const std::string err = slurp(t.path + "/ringd.err");
  // The first file ringd makes there is the job directory's lock (one job per directory).
  EXPECT_NE(err.find("job directory: cannot open the lock file " + job +
                     "/.ringmaster.lock: Permission denied"),
            std::string::npos)
      << err;
  EXPECT_FALSE(has_event(t.path + "/ringd.out", "restarting"));
}

}  // namespace
