// ringd for a job.kind generate spec (generate_job.h): spawn the generate ranks, watch them,
// report.
#include "daemon/ringd/generate_job.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/cli/job_dir.h"
#include "common/contract/timeline.h"
#include "daemon/placement/cpu_topology.h"
#include "daemon/placement/discovery.h"
#include "daemon/placement/placement.h"
#include "daemon/ringd/coord_link.h"
#include "daemon/ringd/job_files.h"
#include "daemon/ringd/observer.h"
#include "daemon/ringd/output.h"
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

class GenerateJob {
 public:
  GenerateJob(const Options& o, const spec::JobSpec& s)
      : o_(o), s_(s), sup_({o.heartbeat_timeout_s, o.startup_timeout_s, o.stop_grace_s}) {}

  int run();

 private:
  void log(const std::string& l) { out_.log(l); }
  void event(const std::string& name, json fields) {
    const json sent = out_.event(name, std::move(fields), attempt_);
    if (coord_) coord_->report(name, sent);
  }
  std::optional<int> start();
  bool spawn_all();
  void reap();
  void fail_on_death(const Worker& w, int status);
  void settle_death();
  void handle_coord();
  void stop(const std::string& why);
  void check_hang();
  int end();

  const Options& o_;
  const spec::JobSpec& s_;
  Output out_{o_};
  Supervisor sup_;
  std::string job_dir_, worker_bin_, rdv_, output_;
  bool own_rdv_ = false;
  int wpn_ = 1, world_ = 1;
  placement::Placement placement_;
  std::unique_ptr<CoordLink> coord_;
  std::mutex mu_;
  std::deque<protocol::Message> inbox_;  // the coordinator's messages (its link thread)
  std::optional<LogTail> progress_;      // rank 0's log on node 0
  // How the run goes: a worker failed (why), a stop was asked for (signal or coordinator).
  std::string failure_;
  bool stopping_ = false;
  int stop_signal_ = 0;
  std::optional<std::string> coord_stop_;
  int exited_clean_ = 0;
  // A rank that exited with an error while no stop was asked for: held for kStopGrace before it
  // fails the job, in case a stop is on its way. Slurm signals the nodes' ringd a few
  // milliseconds apart (preemption, requeue, scancel); a node whose ringd heard first stops its
  // ranks at once (generation is not resumable), and a rank on a node that has not heard yet
  // then fails on the lost peer. That is the stop, not a failure; a death by a signal is never
  // held.
  struct HeldDeath {
    const Worker* w;
    int status;
    Clock::time_point at;
  };
  std::optional<HeldDeath> held_;
  static constexpr std::chrono::milliseconds kStopGrace{2000};
  // Hang detection: each rank's flight recorder (contract/timeline.h, mapped here), the slowest
  // unit of work seen (a prefill layer or a decode step), and whether a hang was reported.
  std::vector<tl::Mapping> tl_maps_;
  std::vector<std::string> tl_paths_;
  int64_t spawned_ns_ = 0;
  int64_t seen_end_ns_ = 0;  // records that ended up to here are counted in slowest_s_
  double slowest_s_ = 0;
  Clock::time_point next_hang_check_{};
  bool hang_reported_ = false;
  // The attempt ring-coord assigns (a Slurm requeue starts the job again under a new one): the
  // events name it, or ring-coord would take them for an older attempt's.
  int64_t attempt_ = 1;
};

std::optional<int> GenerateJob::start() {
  job_dir_ = o_.job_dir.empty() ? jobdir::prepare_default_job_dir(s_.job.name) : o_.job_dir;
  if (auto f = prepare_job_dir(&job_dir_)) {
    std::cerr << "ringd: " << f->message << "\n";
    return f->code;
  }
  std::string why;
  if (!out_.open(job_dir_, &why)) {
    std::cerr << "ringd: " << why << "\n";
    return kExitFailed;
  }
  worker_bin_ = find_worker_bin(o_.worker_bin);
  if (worker_bin_.empty() || ::access(worker_bin_.c_str(), X_OK) != 0) {
    std::cerr << "ringd: no ring-worker executable found (tried '" << worker_bin_
              << "'); give --worker-bin PATH or RING_WORKER_BIN\n";
    return kExitUsage;
  }
  wpn_ = static_cast<int>(s_.resources.workers_per_node);
  world_ = wpn_ * o_.nodes;
  // The output: generate.output, a relative one from the job directory; by default in it.
  const std::string& out = s_.generate.output;
  output_ = out.empty()     ? job_dir_ + (s_.generate.json ? "/generate.json" : "/generate.out")
            : out[0] == '/' ? out
                            : job_dir_ + "/" + out;
  // A relative output's directories in the job directory are made (0700); an absolute one's
  // directory must be there (the worker's error names it).
  if (!out.empty() && out[0] != '/' && o_.node_rank == 0) {
    std::error_code ec;
    const fs::path parent = fs::path(output_).parent_path();
    if (!fs::is_directory(parent, ec)) {
      fs::create_directories(parent, ec);
      if (!ec) fs::permissions(parent, fs::perms::owner_all, ec);
      if (ec) {
        std::cerr << "ringd: generate.output " << out << ": cannot create " << parent.string()
                  << ": " << ec.message() << "\n";
        return kExitFailed;
      }
    }
  }
  // The ranks' rendezvous: one node makes a fresh marked directory of its own (removed at the
  // end); several nodes (one Slurm job) share `generate` under the run's rendezvous root.
  if (world_ > 1) {
    const std::string root = rendezvous_root(o_, job_dir_);
    std::error_code ec;
    fs::create_directories(root, ec);
    try {
      if (o_.nodes == 1) {
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
      std::cerr << "ringd: rendezvous: " << e.what() << "\n";
      return kExitFailed;
    }
  }
  // Cores for each local worker, and with resources.backend cuda its GPU (the rank's fast tier
  // and decode step; CUDA_VISIBLE_DEVICES as training's workers get it).
  NodeFacts facts;
  const bool cuda = s_.resources.backend == spec::Backend::kCuda;
  try {
    facts.gpus = placement::discover_gpus().topology;
  } catch (const std::exception& e) {
    if (cuda) {
      std::cerr << "ringd: placement: " << e.what() << "\n";
      return kExitFailed;
    }
    log(std::string("GPU discovery: ") + e.what());
  }
  try {
    facts.cpu = placement::discover_cpu_topology();
    placement::PlacementRequest req;
    req.workers = wpn_;
    req.cpus_per_worker = static_cast<int>(s_.resources.cpus_per_worker);
    req.device = cuda ? placement::Device::kGpu : placement::Device::kCpu;
    placement_ = placement::place_workers(cuda ? *facts.gpus : placement::GpuTopology{},
                                          *facts.cpu, req);
  } catch (const std::exception& e) {
    std::cerr << "ringd: placement: " << e.what() << "\n";
    return kExitFailed;
  }
  log(
      fmt::format("job {} (generate) | node {} of {} | {} workers per node, {} ranks | {} "
                  "prompt(s), {} new tokens | checkpoint {} | output {} | job dir {}",
                  s_.job.name, o_.node_rank, o_.nodes, wpn_, world_, s_.generate.prompts.size(),
                  s_.generate.max_new_tokens, s_.generate.checkpoint, output_, job_dir_));
  for (const std::string& n : placement_.notes) log("placement: " + n);
  if (!o_.coord.empty()) {
    const protocol::Register reg = make_registration(std::stoll(o_.job), o_.node_rank, wpn_, facts);
    try {
      coord_ = std::make_unique<CoordLink>(CoordLinkOptions{o_.coord, std::stoll(o_.job), reg},
                                           [this](const protocol::Message& m) {
                                             std::lock_guard<std::mutex> l(mu_);
                                             inbox_.push_back(m);
                                           });
    } catch (const std::exception& e) {
      std::cerr << "ringd: " << e.what() << "\n";
      return kExitUsage;
    }
    log(fmt::format("ring-coord {}: registering as node {} for job {}", o_.coord, reg.node,
                    o_.job));
    std::optional<protocol::Assignment> a = coord_->wait_registered(std::chrono::seconds(30));
    if (!a) {
      log("ring-coord did not answer within 30 s (or does not list the job): generating; the "
          "link keeps trying");
    } else {
      log(fmt::format("ring-coord: job {} is {}", a->job, a->state));
      if (a->state == "cancelled" || a->state == "cancelling" || a->state == "failed" ||
          a->state == "completed" || a->state == "completing" || a->state == "stopped") {
        log("nothing to run: the job is " + a->state);
        coord_.reset();
        return a->state.rfind("cancel", 0) == 0 ? kExitCancelled
               : a->state == "failed"           ? kExitFailed
               : a->state == "stopped"          ? kExitStopped
                                                : kExitOk;
      }
      attempt_ = std::max<int64_t>(1, a->attempt);
      if (attempt_ > 1) {
        // Generation is not resumable: a later attempt (a Slurm requeue) starts from the start.
        log(fmt::format("ring-coord assigns attempt {}: generating from the start", attempt_));
      }
    }
    coord_->set_progress(attempt_, 0);
    std::lock_guard<std::mutex> l(mu_);
    inbox_.clear();  // the first registration's answer, handled above
  }
  return std::nullopt;
}

bool GenerateJob::spawn_all() {
  sup_.reset(wpn_, o_.node_rank * wpn_,
             [this](int rank) { return fmt::format("{}/logs/worker-{}.log", job_dir_, rank); });
  if (o_.node_rank == 0) progress_.emplace(job_dir_ + "/logs/worker-0.log");
  const std::string spec = fs::absolute(o_.spec).string();
  // Each rank's flight recorder: its progress (prefill layers, decode steps) and the wait it is
  // blocked in, read by check_hang.
  std::vector<int64_t> ranks;
  for (const Worker& w : sup_.workers()) ranks.push_back(w.rank);
  tl_paths_ =
      create_timelines(ranks, job_dir_, &tl_maps_, [this](const std::string& m) { log(m); });
  spawned_ns_ = tl::now_ns();
  for (Worker& w : sup_.workers()) {
    const placement::WorkerPlacement& pl = placement_.workers[w.local];
    Supervisor::Launch launch;
    launch.argv = {
        worker_bin_, "--generate",  "--spec",     spec,           "--output",
        output_,     "--transport", o_.transport, "--timeout-ms", std::to_string(kRankTimeoutMs)};
    if (o_.worker_threads >= 0)
      launch.argv.insert(launch.argv.end(), {"--threads", std::to_string(o_.worker_threads)});
    if (world_ > 1)
      launch.argv.insert(launch.argv.end(), {"--rank", std::to_string(w.rank), "--world",
                                             std::to_string(world_), "--rendezvous", rdv_});
    if (const std::string& t = tl_paths_[static_cast<size_t>(w.local)]; !t.empty())
      launch.argv.insert(launch.argv.end(), {"--timeline", t});
    launch.cpus = pl.cpus;
    launch.cuda_visible_devices = pl.cuda_visible_devices;
    launch.banner = "=== generate ===\n";
    std::string fatal, failed;
    sup_.spawn(w, launch, &fatal, &failed);
    if (!fatal.empty()) {
      failure_ = fatal;
      log("fatal: " + fatal);
      return false;
    }
    if (!w.running) {
      failure_ = fmt::format("worker rank {} could not be started: {}", w.rank, failed);
      log(failure_);
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
                             {"prompts", s_.generate.prompts.size()},
                             {"max_new_tokens", s_.generate.max_new_tokens},
                             {"output", output_}});
  return true;
}

void GenerateJob::stop(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  const int n = sup_.stop();
  if (n > 0) log(fmt::format("stopping {} workers: {}", n, why));
}

void GenerateJob::reap() {
  for (const auto& [wp, st] : sup_.reap(stopping_)) {
    Worker& w = *wp;
    w.running = false;
    const bool clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (clean) {
      ++exited_clean_;
      log(fmt::format("worker rank {} exited", w.rank));
      event("worker_exited", {{"rank", w.rank}, {"pid", w.pid}, {"exit_code", 0}});
      continue;
    }
    if (stopping_) {
      const bool ours = WIFSIGNALED(st) && WTERMSIG(st) == kWorkerStopSignal;
      log(fmt::format("worker rank {} (pid {}) {}", w.rank, w.pid,
                      ours ? std::string("stopped") : describe_status(st)));
      continue;
    }
    // The first death fails the run: its cause, then the others are stopped. An exit with an
    // error waits kStopGrace for a stop first (HeldDeath); a later death by a signal is the
    // cause at once.
    if (WIFEXITED(st)) {
      if (!held_) {
        held_ = HeldDeath{&w, st, Clock::now()};
        log(fmt::format("worker rank {} (pid {}) {}; the job fails unless a stop arrives within "
                        "{:.0f} s (a peer's node may have been stopped first)",
                        w.rank, w.pid, describe_status(st), kStopGrace.count() / 1000.0));
      } else {
        log(fmt::format("worker rank {} (pid {}) {}", w.rank, w.pid, describe_status(st)));
      }
      continue;
    }
    held_.reset();
    fail_on_death(w, st);
  }
}

// The job fails with rank w's death as the cause; the other ranks are stopped.
void GenerateJob::fail_on_death(const Worker& w, int st) {
  {
    const std::vector<std::string> lines = last_lines(w.log, 10);
    std::string text;
    for (const std::string& l : lines) text += "\n    | " + l;
    log(fmt::format("worker rank {} (pid {}) {} while generating; last log lines:{}", w.rank, w.pid,
                    describe_status(st), text));
    json ev{{"rank", w.rank}, {"pid", w.pid}, {"last_lines", lines}};
    if (WIFSIGNALED(st)) {
      ev["signal"] = WTERMSIG(st);
      ev["signal_name"] = strsignal(WTERMSIG(st));
    } else if (WIFEXITED(st)) {
      ev["exit_code"] = WEXITSTATUS(st);
    }
    event("worker_died", ev);
    failure_ = fmt::format("worker rank {} {}", w.rank, describe_status(st));
    stop(failure_);
  }
}

// A held death: part of a stop that arrived meanwhile, or after kStopGrace the job's failure.
void GenerateJob::settle_death() {
  if (!held_) return;
  if (stopping_) {
    log(fmt::format("worker rank {}'s exit came with the stop: not a failure", held_->w->rank));
    held_.reset();
    return;
  }
  if (Clock::now() - held_->at < kStopGrace) return;
  const HeldDeath d = *held_;
  held_.reset();
  fail_on_death(*d.w, d.status);
}

// A rank that makes no progress: the newest progress of any local rank (a prefill layer, a
// decode step, the end of a wait on a peer; the spawn before any) older than the deadline, the
// larger of generate.hang_deadline_s and kHangFactor x the slowest prefill layer or decode step
// seen (before any, the larger of it and observability.step_deadline_s). The ranks are then
// classified as training's hang check does (observer.h analyse_hang: stopped or stuck outside a
// wait is missing, blocked on a peer is waiting), the finding goes out as event `hang`, and a
// missing rank of this node fails the job. When every local rank waits on ranks of other nodes,
// their ringd names the stuck one; this one only says where its ranks wait.
void GenerateJob::check_hang() {
  const double floor_s = s_.generate.hang_deadline_s;
  if (floor_s <= 0 || stopping_ || hang_reported_ || tl_maps_.empty()) return;
  const auto now = Clock::now();
  if (now < next_hang_check_) return;
  next_hang_check_ = now + std::chrono::milliseconds(250);
  std::vector<tl::Snapshot> snaps(sup_.workers().size());
  int64_t newest = spawned_ns_, step = 0, seen = seen_end_ns_;
  for (const Worker& w : sup_.workers()) {
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
    if (s_.observability.step_deadline_s <= 0) return;
    deadline = std::max(floor_s, s_.observability.step_deadline_s);
  }
  const int64_t now_ns = tl::now_ns();
  const double stalled_s = (now_ns - newest) * 1e-9;
  if (stalled_s <= deadline) return;
  std::vector<HangInput> in;
  for (const Worker& w : sup_.workers()) {
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
  const std::string node = coord_ ? coord_->node() : fmt::format("node{}", o_.node_rank);
  const std::string e = dump_node_timeline(job_dir_, o_.node_rank, node, tl_maps_, {});
  if (!e.empty()) log("timeline: " + e);
  if (f.missing.empty()) return;
  // The first missing rank is failed as training fails a hung worker (worker_failed: killed,
  // which ring-coord records as its death with this reason), then every rank is stopped.
  failure_ = fmt::format("worker rank {} hung: {}", f.missing.front(), f.message);
  for (const Worker& w : sup_.workers())
    if (w.rank == f.missing.front() && w.running) {
      log(fmt::format("worker rank {} (pid {}) hung: killing it", w.rank, w.pid));
      event("worker_failed", {{"rank", w.rank}, {"pid", w.pid}, {"error", "hung: " + f.message}});
      sup_.kill(w);
    }
  stop(failure_);
}

void GenerateJob::handle_coord() {
  std::deque<protocol::Message> in;
  {
    std::lock_guard<std::mutex> l(mu_);
    in.swap(inbox_);
  }
  for (const protocol::Message& m : in) {
    if (const auto* c = std::get_if<protocol::Command>(&m)) {
      const char* kind = protocol::to_string(c->command);
      if (c->job != coord_->job()) {
        coord_->ack(c->id, false,
                    fmt::format("this ringd serves job {}, not {}", coord_->job(), c->job));
        continue;
      }
      log(fmt::format("ring-coord: {}: {}", kind, c->reason));
      event("command", {{"command", kind}, {"id", c->id}, {"reason", c->reason}});
      if (c->command == protocol::CommandKind::kStop) {
        coord_->ack(c->id, true);
        if (!coord_stop_) coord_stop_ = c->reason;
        stop("ring-coord: " + c->reason);
      } else {
        coord_->ack(c->id, false,
                    fmt::format("a generate job has no checkpoints and is not rolled back ({} "
                                "refused)",
                                kind));
      }
    } else if (const auto* e = std::get_if<protocol::ErrorReply>(&m)) {
      log(fmt::format("ring-coord: {} ({})", e->message, e->code));
    }
  }
}

// Every worker is gone: say how the run ended, and its exit status.
int GenerateJob::end() {
  int code = kExitOk;
  if (!failure_.empty()) {
    log("failed: " + failure_ +
        "; a generate job is not restarted (it is not resumable mid-way): run it again");
    event("failed", {{"error", failure_}});
    code = kExitFailed;
  } else if (coord_stop_) {
    log("stopped by ring-coord: " + *coord_stop_);
    event("stopped", {{"reason", *coord_stop_}});
    code = coord_stop_->rfind("job failed", 0) == 0 ? kExitFailed : kExitCancelled;
  } else if (stop_signal_ != 0) {
    const std::string why = fmt::format(
        "stopped on request ({}): generation is not resumable; "
        "run it again",
        strsignal(stop_signal_));
    log(why);
    event("stopped", {{"reason", why}});
    code = kExitStopped;
  } else {
    // The coordinator's "every node finished step N": a generate job is one step.
    log(fmt::format("completed: {} ranks generated; output {}", world_, output_));
    event("completed", {{"step", 1}, {"output", output_}});
  }
  return code;
}

int GenerateJob::run() {
  // The signals wait for sigtimedwait below; threads started from here on (the coordinator
  // link) inherit the mask, so they are delivered to this thread.
  sigset_t handled;
  sigemptyset(&handled);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGUSR1, SIGHUP}) sigaddset(&handled, sig);
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  if (std::optional<int> e = start()) return *e;
  struct Cleanup {
    GenerateJob* g;
    ~Cleanup() {
      g->sup_.kill_all_and_wait();
      if (g->own_rdv_) remove_own_dir(g->rdv_);
      for (const std::string& p : g->tl_paths_)
        if (!p.empty()) ::unlink(p.c_str());
    }
  } cleanup{this};
  int code = kExitFailed;
  if (spawn_all()) {
    while (sup_.any_running() || held_) {
      timespec ts{0, 100 * 1000 * 1000};
      siginfo_t info;
      const int sig = sigtimedwait(&handled, &info, &ts);
      if (sig == SIGTERM || sig == SIGINT || sig == SIGUSR1 || sig == SIGHUP) {
        if (stop_signal_ == 0) stop_signal_ = sig;
        stop(fmt::format("{}", strsignal(sig)));
      }
      // Rank 0's progress before its exit.
      if (progress_)
        progress_->poll([this](const std::string& l) {
          if (l.rfind("generate: ", 0) != 0) return;
          log(l);
          event("generate_progress", {{"message", l.substr(10)}});
        });
      reap();
      settle_death();
      check_hang();
      if (coord_) handle_coord();
      if (stopping_) sup_.kill_overdue(Clock::now());
    }
    if (progress_)
      progress_->poll([this](const std::string& l) {
        if (l.rfind("generate: ", 0) == 0) event("generate_progress", {{"message", l.substr(10)}});
      });
    code = end();
  } else {
    stop(failure_);
    sup_.kill_all_and_wait();
    event("failed", {{"error", failure_}});
  }
  if (coord_) {
    // A barrier: the coordinator has every report of this run before ringd exits.
    if (!coord_->sync_and_wait(std::chrono::seconds(5)))
      log("ring-coord did not confirm the last reports within 5 s");
    coord_.reset();
  }
  return code;
}

}  // namespace

int run_generate_job(const Options& o, const spec::JobSpec& s) {
  ::signal(SIGPIPE, SIG_IGN);
  GenerateJob g(o, s);
  return g.run();
}

}  // namespace ring::ringd
