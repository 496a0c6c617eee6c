#include "common/proc/rank_group.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <utility>

#include <fmt/format.h>

#include "common/proc/reap.h"

namespace ring::proc {

RankGroup::RankGroup(RankGroup&& other) noexcept
    : o_(other.o_), pids_(std::move(other.pids_)), running_(std::move(other.running_)),
      kill_at_(other.kill_at_) {
  other.pids_.clear();
  other.running_.clear();
}

RankGroup& RankGroup::operator=(RankGroup&& other) noexcept {
  if (this == &other) return *this;
  kill_all_and_wait();
  o_ = other.o_;
  pids_ = std::move(other.pids_);
  running_ = std::move(other.running_);
  kill_at_ = other.kill_at_;
  other.pids_.clear();
  other.running_.clear();
  return *this;
}

Spawned RankGroup::start(int rank, SpawnOptions so) {
  if (rank < 0) return {-1, fmt::format("rank {}: not a rank", rank)};
  if (rank >= size()) {
    pids_.resize(static_cast<size_t>(rank) + 1, -1);
    running_.resize(static_cast<size_t>(rank) + 1, false);
  }
  if (running_[static_cast<size_t>(rank)])
    return {-1, fmt::format("rank {}: already running (pid {})", rank, pids_[rank])};
  if (o_.process_groups) so.new_process_group = true;
  if (so.death_signal == 0) so.death_signal = SIGKILL;
  Spawned s = spawn(so);
  if (s) {
    pids_[static_cast<size_t>(rank)] = s.pid;
    running_[static_cast<size_t>(rank)] = true;
  }
  return s;
}

void RankGroup::clear() {
  kill_all_and_wait();
  pids_.clear();
  running_.clear();
  kill_at_.reset();
}

pid_t RankGroup::pid(int rank) const {
  return rank >= 0 && rank < size() ? pids_[static_cast<size_t>(rank)] : -1;
}

bool RankGroup::running(int rank) const {
  return rank >= 0 && rank < size() && running_[static_cast<size_t>(rank)];
}

int RankGroup::running_count() const {
  return static_cast<int>(std::count(running_.begin(), running_.end(), true));
}

std::vector<pid_t> RankGroup::running_pids() const {
  std::vector<pid_t> out;
  for (int r = 0; r < size(); ++r)
    if (running_[static_cast<size_t>(r)]) out.push_back(pids_[static_cast<size_t>(r)]);
  return out;
}

void RankGroup::send(pid_t pid, int sig) const {
  if (pid > 0) ::kill(o_.process_groups ? -pid : pid, sig);
}

int RankGroup::signal_all(int sig) {
  int n = 0;
  for (int r = 0; r < size(); ++r)
    if (running_[static_cast<size_t>(r)]) {
      send(pids_[static_cast<size_t>(r)], sig);
      ++n;
    }
  return n;
}

void RankGroup::signal(int rank, int sig) {
  if (running(rank)) send(pids_[static_cast<size_t>(rank)], sig);
}

int RankGroup::stop(int sig, std::chrono::milliseconds grace) {
  const Clock::time_point at = Clock::now() + grace;
  if (!kill_at_ || at < *kill_at_) kill_at_ = at;
  return signal_all(sig);
}

bool RankGroup::kill_overdue(Clock::time_point now) {
  if (!kill_at_ || now < *kill_at_) return false;
  kill_at_.reset();
  return signal_all(SIGKILL) > 0;
}

void RankGroup::kill_all_and_wait() {
  signal_all(SIGKILL);
  for (int r = 0; r < size(); ++r) {
    if (!running_[static_cast<size_t>(r)]) continue;
    ::waitpid(pids_[static_cast<size_t>(r)], nullptr, 0);
    running_[static_cast<size_t>(r)] = false;
  }
}

std::vector<RankEnd> RankGroup::reap(const std::function<bool(int)>& is_cause,
                                     std::chrono::milliseconds grace) {
  std::vector<RankEnd> out;
  for (const auto& [got, st] : reap_ended(running_pids(), is_cause, grace)) {
    RankEnd e{-1, got, st};
    for (int r = 0; r < size(); ++r)
      if (running_[static_cast<size_t>(r)] && pids_[static_cast<size_t>(r)] == got) {
        e.rank = r;
        running_[static_cast<size_t>(r)] = false;
      }
    out.push_back(e);
  }
  return out;
}

namespace {

// The exit status that stands for a rank's end: its own, or 128 + the signal that killed it.
int exit_code_of(int st) {
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return 1;
}

// The signals run_group waits for, blocked while it runs.
struct BlockedSignals {
  sigset_t set, old;
  BlockedSignals() {
    sigemptyset(&set);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
    sigprocmask(SIG_BLOCK, &set, &old);
  }
  ~BlockedSignals() { sigprocmask(SIG_SETMASK, &old, nullptr); }
  // The next of them within 200 ms (0: none).
  int wait() {
    timespec ts{0, 200 * 1000 * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&set, &info, &ts);
    return sig > 0 ? sig : 0;
  }
};

}  // namespace

GroupResult run_group(const std::vector<SpawnOptions>& ranks, const GroupRun& how) {
  using Clock = RankGroup::Clock;
  GroupResult res;
  BlockedSignals blocked;
  RankGroup group;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Spawned s = group.start(static_cast<int>(r), ranks[r]);
    if (!s) {
      res.start_error = fmt::format("rank {}: {}", r, s.error);
      res.exit_code = 1;
      group.kill_all_and_wait();
      return res;
    }
  }
  if (how.on_started) {
    std::vector<pid_t> pids;
    for (int r = 0; r < group.size(); ++r) pids.push_back(group.pid(r));
    how.on_started(pids);
  }
  while (group.running_count() > 0) {
    const int sig = blocked.wait();
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (res.signal == 0) res.signal = sig;
      if (res.exit_code == 0) res.exit_code = 128 + sig;
      if (how.on_signal) how.on_signal(sig, group.running_count());
      group.stop(sig == SIGHUP ? SIGTERM : sig, how.signal_grace);
    }
    // Every rank that ended, the ones killed by a signal first (the cause to report). While
    // nothing has gone wrong yet, a killed rank still exiting is waited for a little.
    const bool quiet = res.exit_code == 0;
    for (const RankEnd& e : group.reap([](int st) { return WIFSIGNALED(st); },
                                       quiet ? std::chrono::milliseconds(1000)
                                             : std::chrono::milliseconds(0))) {
      if (e.rank < 0) continue;
      const bool ok = WIFEXITED(e.status) && WEXITSTATUS(e.status) == 0;
      // After a stop signal or a first failure the others' ends are the stop's, not causes.
      if (ok || res.exit_code != 0) continue;
      res.failure = e;
      res.exit_code = exit_code_of(e.status);
      if (how.on_failure) how.on_failure(e, group.running_count());
      group.stop(SIGTERM, how.failure_grace);
    }
    const int left = group.running_count();
    if (left > 0 && group.kill_overdue(Clock::now()) && how.on_kill) how.on_kill(left);
  }
  return res;
}

}  // namespace ring::proc
