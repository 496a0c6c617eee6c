// ringd's generate mode (generate_job.h): spawn the generate ranks, watch them, report; the
// lifecycle's decisions are generate_lifecycle.h's.
#include "daemon/ringd/generate_job.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/contract/timeline.h"
#include "daemon/ringd/coord_link.h"
#include "daemon/ringd/generate_lifecycle.h"
#include "daemon/ringd/job_files.h"
#include "daemon/ringd/observer.h"
#include "daemon/ringd/owned_paths.h"
#include "daemon/ringd/startup.h"
#include "daemon/ringd/supervisor.h"

namespace ring::ringd {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Each worker's time limit for one exchange and for the ranks to meet (ring-worker --timeout-ms):
// a rank whose peer died is stopped by ringd long before.
constexpr int kRankTimeoutMs = 600000;

// The hang deadline is at least this many times the slowest prefill layer or decode step seen.
constexpr double kHangFactor = 10.0;

namespace tl = contract::timeline;

}  // namespace

// The new lines a worker appends to its log (from the size it had when followed).
class LogTail {
 public:
  explicit LogTail(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    const auto n = fs::file_size(path_, ec);
    offset_ = ec ? 0 : static_cast<std::streamoff>(n);
  }
  template <typename F>
  void poll(F on_line) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return;
    in.seekg(offset_);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset_ += static_cast<std::streamoff>(chunk.size());
    buf_ += chunk;
    size_t pos;
    while ((pos = buf_.find('\n')) != std::string::npos) {
      on_line(buf_.substr(0, pos));
      buf_.erase(0, pos + 1);
    }
    if (buf_.size() > (1 << 20)) buf_.clear();  // a line that never ends is not progress
  }

 private:
  std::string path_;
  std::streamoff offset_ = 0;
  std::string buf_;
};

std::optional<int> GenerateMode::prepare() {
  const spec::JobSpec& s = p_.spec;
  const Options& o = p_.o;
  wpn_ = static_cast<int>(s.resources.workers_per_node);
  world_ = wpn_ * o.nodes;
  config_.workers = wpn_;
  // The output: generate.output, a relative one from the job directory; by default in it.
  const std::string& out = s.generate.output;
  output_ = out.empty()     ? p_.job_dir + (s.generate.json ? "/generate.json" : "/generate.out")
            : out[0] == '/' ? out
                            : p_.job_dir + "/" + out;
  // A relative output's directories in the job directory are made (0700); an absolute one's
  // directory must be there (the worker's error names it).
  if (!out.empty() && out[0] != '/' && o.node_rank == 0) {
    std::error_code ec;
    const fs::path parent = fs::path(output_).parent_path();
    if (!fs::is_directory(parent, ec)) {
      fs::create_directories(parent, ec);
      if (!ec) fs::permissions(parent, fs::perms::owner_all, ec);
      if (ec) {
        p_.error(fmt::format("generate.output {}: cannot create {}: {}", out, parent.string(),
                             ec.message()));
        return kExitFailed;
      }
    }
  }
  // The ranks' rendezvous: one node makes a fresh marked directory of its own (removed at the
  // end); several nodes (one Slurm job) share `generate` under the run's rendezvous root.
  if (world_ > 1) {
    const std::string root = rendezvous_root(o, p_.job_dir);
    std::error_code ec;
    fs::create_directories(root, ec);
    try {
      if (o.nodes == 1) {
        rdv_ = fmt::format("{}/generate-{}", root, ::getpid());
        // A dead ringd of the same pid left it: removed only when it carries ringd's marker;
        // anything else of that name is not ours to delete.
        std::string why;
        if (fs::exists(fs::symlink_status(rdv_, ec)) && !remove_own_dir(rdv_, &why))
          throw std::runtime_error(rdv_ + " exists and is not a rendezvous ringd made (" + why +
                                   "); remove it or give --rendezvous");
        if (::mkdir(rdv_.c_str(), 0700) != 0)
          throw std::runtime_error(fmt::format("mkdir {}: {}", rdv_, std::strerror(errno)));
        mark_own_dir(rdv_, "generate");
        own_rdv_ = true;
      } else {
        rdv_ = root + "/generate";
        if (::mkdir(rdv_.c_str(), 0700) != 0 && errno != EEXIST)
          throw std::runtime_error(fmt::format("mkdir {}: {}", rdv_, std::strerror(errno)));
      }
    } catch (const std::exception& e) {
      p_.error(std::string("rendezvous: ") + e.what());
      return kExitFailed;
    }
  }
  return std::nullopt;
}

void GenerateMode::announce() const {
  const spec::JobSpec& s = p_.spec;
  log(fmt::format("job {} (generate) | node {} of {} | {} workers per node, {} ranks | {} "
                  "prompt(s), {} new tokens | checkpoint {} | output {} | job dir {}",
                  s.job.name, p_.o.node_rank, p_.o.nodes, wpn_, world_, s.generate.prompts.size(),
                  s.generate.max_new_tokens, s.generate.checkpoint, output_, p_.job_dir));
  for (const std::string& n : p_.placement.notes) log("placement: " + n);
}

void GenerateMode::start(int attempt) {
  if (attempt > 1) {
    // Generation is not resumable: a later attempt (a Slurm requeue) starts from the start.
    log(fmt::format("ring-coord assigns attempt {}: generating from the start", attempt));
  }
  if (CoordLink* coord = p_.coord()) coord->set_progress(attempt, 0);
  if (state_.phase != genlife::Phase::kIdle) return;  // a stop came first
  if (spawn_all()) {
    dispatch(event_of(genlife::EventKind::kStarted));
  } else {
    genlife::Event e = event_of(genlife::EventKind::kSpawnFailed);
    e.text = state_.failure;
    dispatch(e);
  }
}

bool GenerateMode::spawn_all() {
  Supervisor& sup = p_.supervisor;
  const Options& o = p_.o;
  sup.reset(wpn_, o.node_rank * wpn_,
            [this](int rank) { return fmt::format("{}/logs/worker-{}.log", p_.job_dir, rank); });
  if (o.node_rank == 0) progress_ = std::make_unique<LogTail>(p_.job_dir + "/logs/worker-0.log");
  const std::string spec = fs::absolute(o.spec).string();
  // Each rank's flight recorder: its progress (prefill layers, decode steps) and the wait it is
  // blocked in, read by check_hang.
  std::vector<int64_t> ranks;
  for (const Worker& w : sup.workers()) ranks.push_back(w.rank);
  tl_paths_ =
      create_timelines(ranks, p_.job_dir, &tl_maps_, [this](const std::string& m) { log(m); });
  spawned_ns_ = tl::now_ns();
  for (Worker& w : sup.workers()) {
    const placement::WorkerPlacement& pl = p_.placement.workers[w.local];
    Supervisor::Launch launch;
    launch.argv = {p_.worker_bin, "--generate",  "--spec",     spec,           "--output",
                   output_,       "--transport", o.transport, "--timeout-ms", std::to_string(kRankTimeoutMs)};
    if (o.worker_threads >= 0)
      launch.argv.insert(launch.argv.end(), {"--threads", std::to_string(o.worker_threads)});
    if (world_ > 1)
      launch.argv.insert(launch.argv.end(), {"--rank", std::to_string(w.rank), "--world",
                                             std::to_string(world_), "--rendezvous", rdv_});
    if (const std::string& t = tl_paths_[static_cast<size_t>(w.local)]; !t.empty())
      launch.argv.insert(launch.argv.end(), {"--timeline", t});
    launch.cpus = pl.cpus;
    launch.cuda_visible_devices = pl.cuda_visible_devices;
    launch.banner = "=== generate ===\n";
    std::string fatal, failed;
    sup.spawn(w, launch, &fatal, &failed);
    if (!fatal.empty()) {
      state_.failure = fatal;
      log("fatal: " + fatal);
      return false;
    }
    if (!w.running) {
      state_.failure = fmt::format("worker rank {} could not be started: {}", w.rank, failed);
      log(state_.failure);
      return false;
    }
    std::string cpus;
    for (int c : pl.cpus) {
      if (!cpus.empty()) cpus += ',';
      cpus += std::to_string(c);
    }
    log(fmt::format("worker rank {} (local {}) pid {} | cpus {}{} | generate", w.rank, w.local,
                    w.pid, cpus.empty() ? "any" : cpus,
                    pl.cuda_visible_devices.empty()
                        ? ""
                        : " | CUDA_VISIBLE_DEVICES=" + pl.cuda_visible_devices));
    event("worker_started", {{"rank", w.rank}, {"pid", w.pid}, {"cpus", pl.cpus}});
  }
  event("generate_started", {{"ranks", world_},
                             {"prompts", p_.spec.generate.prompts.size()},
                             {"max_new_tokens", p_.spec.generate.max_new_tokens},
                             {"output", output_}});
  return true;
}

genlife::Event GenerateMode::event_of(genlife::EventKind k) const {
  genlife::Event e;
  e.kind = k;
  e.now_s = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  return e;
}

void GenerateMode::dispatch(const genlife::Event& e) {
  const genlife::Transition t = genlife::next(config_, state_, e);
  if (!t.accepted) return;
  state_ = t.state;
  for (const genlife::Action& a : t.actions) execute(a);
}

Worker* GenerateMode::worker(int rank) {
  for (Worker& w : p_.supervisor.workers())
    if (w.rank == rank) return &w;
  return nullptr;
}

void GenerateMode::execute(const genlife::Action& a) {
  using genlife::ActionKind;
  Worker* w = worker(a.rank);
  const pid_t pid = w ? w->pid : -1;
  switch (a.kind) {
    case ActionKind::kExited:
      log(fmt::format("worker rank {} exited", a.rank));
      event("worker_exited", {{"rank", a.rank}, {"pid", pid}, {"exit_code", 0}});
      return;
    case ActionKind::kStopped: {
      const bool ours = WIFSIGNALED(a.status) && WTERMSIG(a.status) == kWorkerStopSignal;
      log(fmt::format("worker rank {} (pid {}) {}", a.rank, pid,
                      ours ? std::string("stopped") : describe_status(a.status)));
      return;
    }
    case ActionKind::kHold:
      log(fmt::format("worker rank {} (pid {}) {}; the job fails unless a stop arrives within "
                      "{:.0f} s (a peer's node may have been stopped first)",
                      a.rank, pid, describe_status(a.status), config_.stop_grace_s));
      return;
    case ActionKind::kEndedAlso:
      log(fmt::format("worker rank {} (pid {}) {}", a.rank, pid, describe_status(a.status)));
      return;
    case ActionKind::kHeldWasStop:
      log(fmt::format("worker rank {}'s exit came with the stop: not a failure", a.rank));
      return;
    case ActionKind::kDied:
      if (w) say_died(*w, a.status);
      return;
    case ActionKind::kKill:
      if (w && w->running) {
        log(fmt::format("worker rank {} (pid {}) hung: killing it", w->rank, w->pid));
        event("worker_failed", {{"rank", w->rank}, {"pid", w->pid}, {"error", "hung: " + a.text}});
        p_.supervisor.kill(*w);
      }
      return;
    case ActionKind::kStopWorkers: {
      const int n = p_.supervisor.stop();
      if (n > 0) log(fmt::format("stopping {} workers: {}", n, a.text));
      return;
    }
    case ActionKind::kExit:
      say_end(a);
      return;
  }
}

// The death that fails the run: its last log lines and the event.
void GenerateMode::say_died(const Worker& w, int st) const {
  const DeathReport d = death_report(w, st, "while generating");
  log(d.line);
  event("worker_died", d.event);
}

// Every worker is gone: how the run ended.
void GenerateMode::say_end(const genlife::Action& a) const {
  using genlife::Outcome;
  switch (a.outcome) {
    case Outcome::kSpawnFailed:
      p_.supervisor.kill_all_and_wait();
      event("failed", {{"error", a.text}});
      return;
    case Outcome::kFailed:
      log("failed: " + a.text +
          "; a generate job is not restarted (it is not resumable mid-way): run it again");
      event("failed", {{"error", a.text}});
      return;
    case Outcome::kStoppedByCoord:
      log("stopped by ring-coord: " + *state_.coord_stop);
      event("stopped", {{"reason", *state_.coord_stop}});
      return;
    case Outcome::kStoppedBySignal: {
      const std::string why = fmt::format(
          "stopped on request ({}): generation is not resumable; run it again",
          strsignal(state_.stop_signal));
      log(why);
      event("stopped", {{"reason", why}});
      return;
    }
    case Outcome::kCompleted:
      // The coordinator's "every node finished step N": a generate job is one step.
      log(fmt::format("completed: {} ranks generated; output {}", world_, output_));
      event("completed", {{"step", 1}, {"output", output_}});
      return;
    case Outcome::kNone:
      return;
  }
}

void GenerateMode::on_signal(int sig) {
  if (sig == SIGCHLD) {
    reap();
    return;
  }
  genlife::Event e = event_of(genlife::EventKind::kStopSignal);
  e.sig = sig;
  e.text = strsignal(sig);
  dispatch(e);
}

void GenerateMode::reap() {
  const bool expected = state_.phase == genlife::Phase::kStopping;
  for (const auto& [wp, st] : p_.supervisor.reap(expected)) {
    wp->running = false;
    // Rank 0's progress lines before its end is said.
    if (wp->rank == 0) poll_progress(true);
    genlife::Event e = event_of(genlife::EventKind::kWorkerEnded);
    e.rank = wp->rank;
    e.status = st;
    dispatch(e);
  }
}

// Rank 0's progress lines ("generate: ...") as log lines (while it runs) and events.
void GenerateMode::poll_progress(bool log_lines) {
  if (!progress_) return;
  progress_->poll([this, log_lines](const std::string& l) {
    if (l.rfind("generate: ", 0) != 0) return;
    if (log_lines) log(l);
    event("generate_progress", {{"message", l.substr(10)}});
  });
}

void GenerateMode::on_tick() {
  poll_progress(true);
  check_hang();
  dispatch(event_of(genlife::EventKind::kTick));
  if (state_.phase == genlife::Phase::kStopping) p_.supervisor.kill_overdue(Clock::now());
}

// A rank that makes no progress: the newest progress of any local rank (a prefill layer, a
// decode step, the end of a wait on a peer; the spawn before any) older than the deadline, the
// larger of generate.hang_deadline_s and kHangFactor x the slowest prefill layer or decode step
// seen (before any, the larger of it and observability.step_deadline_s). The ranks are then
// classified as training's hang check does (observer.h analyse_hang: stopped or stuck outside a
// wait is missing, blocked on a peer is waiting), the finding goes out as event `hang`, and a
// missing rank of this node fails the job. When every local rank waits on ranks of other nodes,
// their ringd names the stuck one; this one only says where its ranks wait.
void GenerateMode::check_hang() {
  const double floor_s = p_.spec.generate.hang_deadline_s;
  if (floor_s <= 0 || state_.phase != genlife::Phase::kRunning || hang_reported_ ||
      tl_maps_.empty())
    return;
  const auto now = Clock::now();
  if (now < next_hang_check_) return;
  next_hang_check_ = now + std::chrono::milliseconds(250);
  std::vector<tl::Snapshot> snaps(p_.supervisor.workers().size());
  int64_t newest = spawned_ns_, step = 0, seen = seen_end_ns_;
  for (const Worker& w : p_.supervisor.workers()) {
    const tl::Mapping& m = tl_maps_[static_cast<size_t>(w.local)];
    if (!m.valid()) continue;
    tl::Snapshot& sn = snaps[static_cast<size_t>(w.local)];
    sn = tl::read_mapped(m.data());
    if (!sn.ok) continue;
    if (w.running) newest = std::max(newest, sn.progress_ns);
    step = std::max(step, sn.step);
    for (const tl::Event& e : sn.events) {
      if (e.end_ns <= seen_end_ns_) continue;
      seen = std::max(seen, e.end_ns);
      if (e.kind == tl::Phase::kForward || e.kind == tl::Phase::kDecode)
        slowest_s_ = std::max(slowest_s_, (e.end_ns - e.begin_ns) * 1e-9);
    }
  }
  seen_end_ns_ = seen;
  double deadline = std::max(floor_s, kHangFactor * slowest_s_);
  if (slowest_s_ == 0) {
    // Nothing timed yet (loading the checkpoint, joining the ranks, the first prefill layer).
    if (p_.spec.observability.step_deadline_s <= 0) return;
    deadline = std::max(floor_s, p_.spec.observability.step_deadline_s);
  }
  const int64_t now_ns = tl::now_ns();
  const double stalled_s = (now_ns - newest) * 1e-9;
  if (stalled_s <= deadline) return;
  std::vector<HangInput> in;
  for (const Worker& w : p_.supervisor.workers()) {
    HangInput h;
    h.rank = w.rank;
    h.pid = w.pid;
    h.running = w.running;
    h.proc_state = proc_state(w.pid);
    h.snap = std::move(snaps[static_cast<size_t>(w.local)]);
    in.push_back(std::move(h));
  }
  const std::string what = step > 0 ? fmt::format("decode step {}", step) : "the prefill";
  const HangFinding f = analyse_hang(step, stalled_s, deadline, in, now_ns, what);
  hang_reported_ = true;
  log("hang: " + f.message);
  json data = hang_data(step, deadline, f);
  data["phase"] = step > 0 ? "decode" : "prefill";
  event("hang", data);
  // The flight recorder of the hang, for `ringctl trace`.
  CoordLink* coord = p_.coord();
  const std::string node = coord ? coord->node() : fmt::format("node{}", p_.o.node_rank);
  const std::string e = dump_node_timeline(p_.job_dir, p_.o.node_rank, node, tl_maps_, {});
  if (!e.empty()) log("timeline: " + e);
  if (f.missing.empty()) return;
  // The first missing rank is failed as training fails a hung worker (worker_failed: killed,
  // which ring-coord records as its death with this reason), then every rank is stopped.
  genlife::Event ev = event_of(genlife::EventKind::kHang);
  ev.rank = static_cast<int>(f.missing.front());
  ev.text = f.message;
  dispatch(ev);
}

void GenerateMode::on_coord(const protocol::Message& m) {
  CoordLink* coord = p_.coord();
  if (!coord) return;
  if (const auto* c = std::get_if<protocol::Command>(&m)) {
    const char* kind = protocol::to_string(c->command);
    if (c->job != coord->job()) {
      coord->ack(c->id, false,
                 fmt::format("this ringd serves job {}, not {}", coord->job(), c->job));
      return;
    }
    log(fmt::format("ring-coord: {}: {}", kind, c->reason));
    event("command", {{"command", kind}, {"id", c->id}, {"reason", c->reason}});
    if (c->command == protocol::CommandKind::kStop) {
      coord->ack(c->id, true);
      genlife::Event e = event_of(genlife::EventKind::kCoordStop);
      e.text = c->reason;
      dispatch(e);
    } else {
      coord->ack(c->id, false,
                 fmt::format("a generate job has no checkpoints and is not rolled back ({} "
                             "refused)",
                             kind));
    }
  } else if (const auto* e = std::get_if<protocol::ErrorReply>(&m)) {
    log(fmt::format("ring-coord: {} ({})", e->message, e->code));
  }
}

void GenerateMode::shut_down() {
  p_.supervisor.kill_all_and_wait();
  if (own_rdv_) remove_own_dir(rdv_);
  for (const std::string& p : tl_paths_)
    if (!p.empty()) ::unlink(p.c_str());
  tl_paths_.clear();
}

GenerateMode::GenerateMode(DaemonParts parts) : p_(std::move(parts)) {}
GenerateMode::~GenerateMode() = default;

}  // namespace ring::ringd
