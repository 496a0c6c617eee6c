#include "daemon/ringd/supervisor.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/proc/reap.h"
#include "daemon/ringd/job_files.h"

namespace ring::ringd {

void Supervisor::spawn(Worker& w, const Launch& launch, std::string* fatal, std::string* failed) {
  std::string why;
  const int fd = open_private_append(w.log, &why);
  if (fd < 0) {
    // No restart mends this (a job directory the user cannot write, a planted symlink).
    *fatal = fmt::format("worker rank {}: {}", w.rank, why);
    return;
  }
  if (::write(fd, launch.banner.data(), launch.banner.size()) < 0) {
    const int e = errno;
    ::close(fd);
    *fatal = fmt::format("worker rank {}: cannot write {}: {}", w.rank, w.log, std::strerror(e));
    return;
  }
  proc::SpawnOptions so;
  so.argv = launch.argv;
  // The child (rank_group.h): its own process group (ringd stops it with the group), dies with
  // ringd (SIGKILL).
  for (int c : launch.cpus)
    if (c >= 0 && c < CPU_SETSIZE) so.cpus.push_back(c);
  // The environment: ours, with CUDA_VISIBLE_DEVICES replaced when placement chose a GPU.
  if (!launch.cuda_visible_devices.empty())
    so.env_set.emplace_back("CUDA_VISIBLE_DEVICES", launch.cuda_visible_devices);
  so.stdin_fd = proc::kDevNull;
  so.stdout_fd = so.stderr_fd = fd;
  so.reset_signals = {SIGCHLD, SIGUSR1, SIGUSR2, SIGHUP, SIGPIPE, SIGXFSZ};
  // Stopping the job is ringd's business: Slurm (proctrack signals every process of the step)
  // and terminals send SIGTERM/SIGINT to the workers too, and a worker dying on it would look
  // like a failure before ringd has finished the step and written its checkpoint. ringd stops
  // workers with SIGUSR2, then SIGKILL; the death signal covers ringd's own death.
  so.ignore_signals = {SIGTERM, SIGINT};
  const proc::Spawned s = group_.start(w.local, std::move(so));
  if (!s) {
    const std::string line = "ringd: " + s.error + "\n";
    if (::write(fd, line.data(), line.size()) < 0) {
      // The log is the operator's copy only: the caller reports the failure anyway.
    }
    ::close(fd);
    *failed = s.error;
    return;
  }
  ::close(fd);
  w.pid = s.pid;
  w.running = true;
  w.connected = w.mapped = w.done = false;
  w.buckets = 0;
  w.spawned = w.last_seen = Clock::now();
}

int Supervisor::stop() {
  return group_.stop(std::chrono::milliseconds(static_cast<int64_t>(o_.stop_grace_s * 1e3)));
}

void Supervisor::kill(const Worker& w) {
  if (w.running) group_.signal(w.local, SIGKILL);
}

void Supervisor::kill_overdue(Clock::time_point now) { group_.kill_overdue(now); }

void Supervisor::kill_all_and_wait() {
  group_.kill_all_and_wait();
  for (Worker& w : workers_) w.running = false;
}

std::vector<std::pair<Worker*, int>> Supervisor::reap(bool expected) {
  // Every worker that has ended, those killed by a signal other than ours first: when one worker
  // is killed its peers fail within milliseconds, and a busy ringd reaps them all at once; the
  // killed one is the cause to report (rank_group.h waits briefly for a killed worker whose
  // threads are still exiting when only its peers' failures are in).
  std::vector<std::pair<Worker*, int>> out;
  for (const proc::RankEnd& e : group_.reap(
           [](int st) { return WIFSIGNALED(st) && WTERMSIG(st) != kWorkerStopSignal; },
           expected ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000))) {
    if (e.rank < 0 || e.rank >= static_cast<int>(workers_.size())) continue;
    Worker& w = workers_[static_cast<size_t>(e.rank)];
    if (w.running && w.pid == e.pid) out.emplace_back(&w, e.status);
  }
  return out;
}

std::optional<std::pair<Worker*, std::string>> Supervisor::overdue(
    Clock::time_point now, Clock::time_point unblocked_at) {
  for (Worker& w : workers_) {
    if (!w.running) continue;
    const double silent =
        std::chrono::duration<double>(now - std::max(w.last_seen, unblocked_at)).count();
    if (w.connected && silent > o_.heartbeat_timeout_s)
      return std::make_pair(&w, fmt::format("sent no heartbeat for {:.1f} s (hung)", silent));
    if (!w.connected && silent > o_.startup_timeout_s)
      return std::make_pair(&w,
                            fmt::format("did not connect within {:.0f} s", o_.startup_timeout_s));
  }
  return std::nullopt;
}

bool Supervisor::any_running() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
}

DeathReport death_report(const Worker& w, int st, const std::string& during) {
  const std::vector<std::string> lines = last_lines(w.log, 10);
  std::string text;
  for (const std::string& l : lines) text += "\n    | " + l;
  DeathReport r;
  r.line = fmt::format("worker rank {} (pid {}) {} {}; last log lines:{}", w.rank, w.pid,
                       describe_status(st), during, text);
  r.event = {{"rank", w.rank}, {"pid", w.pid}, {"last_lines", lines}};
  if (WIFSIGNALED(st)) {
    r.event["signal"] = WTERMSIG(st);
    r.event["signal_name"] = strsignal(WTERMSIG(st));
  } else if (WIFEXITED(st)) {
    r.event["exit_code"] = WEXITSTATUS(st);
  }
  return r;
}

std::vector<std::string> worker_argv(const WorkerCommand& c, const Worker& w) {
  std::vector<std::string> argv = {c.bin,
                                   "--spec",
                                   c.spec,
                                   "--rank",
                                   std::to_string(w.rank),
                                   "--world",
                                   std::to_string(c.world),
                                   "--rendezvous",
                                   c.rendezvous,
                                   "--ringd",
                                   c.ringd,
                                   "--local-rank",
                                   std::to_string(w.local),
                                   "--transport",
                                   c.transport};
  if (c.threads >= 0) {
    argv.push_back("--threads");
    argv.push_back(std::to_string(c.threads));
  }
  if (!w.timeline.empty()) {
    argv.push_back("--timeline");
    argv.push_back(w.timeline);
  }
  return argv;
}

std::string hello_refusal(const contract::control::Hello& h, const std::vector<Worker>& workers,
                          int64_t model_floats, bool have_cred, pid_t peer_pid, uid_t peer_uid,
                          uid_t euid) {
  const int local = static_cast<int>(h.local);
  if (!have_cred || peer_uid != euid)
    return have_cred ? fmt::format("uid {} is not ringd's", peer_uid) : "no peer credentials";
  if (local < 0 || local >= static_cast<int>(workers.size()) || !workers[local].running)
    return fmt::format("local rank {} is not a worker of this attempt", local);
  const Worker& w = workers[local];
  if (h.rank != w.rank) return fmt::format("rank {} should be {}", h.rank, w.rank);
  if (h.n != model_floats)
    return fmt::format("model of {} floats, ringd's has {} (same spec?)", h.n, model_floats);
  if (h.pid != w.pid || peer_pid != w.pid)
    return fmt::format("pid {} (connected from pid {}) is not the worker ringd spawned", h.pid,
                       peer_pid);
  if (w.connected) return fmt::format("local rank {} is connected already", local);
  return "";
}

}  // namespace ring::ringd
