// ringd: one Boost.Asio event loop (this thread) that spawns and watches the node's workers, talks
// to them over unix sockets, moves gradients and weights through shared memory and drives the
// NodeOptimizer (whose pipeline thread does the exchange between daemons and the AdamW update).
#include "daemon/ringd/ringd.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>  // before asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/cli/job_dir.h"
#include "common/files/dir_lock.h"
#include "common/install/locate.h"
#include "common/spec/parse.h"
#include "common/checkpoint/checkpoint.h"
#include "daemon/optim/node_optimizer.h"
#include "daemon/placement/affinity.h"
#include "daemon/placement/cpu_topology.h"
#include "daemon/placement/discovery.h"
#include "daemon/placement/placement.h"
#include "daemon/ringd/attempt.h"
#include "daemon/ringd/attempt_notes.h"
#include "daemon/ringd/attempt_resources.h"
#include "daemon/ringd/checkpoints.h"
#include "daemon/ringd/control_server.h"
#include "daemon/ringd/coord_commands.h"
#include "daemon/ringd/coord_link.h"
#include "daemon/ringd/generate_job.h"
#include "daemon/ringd/job_files.h"
#include "daemon/ringd/observer.h"
#include "daemon/ringd/output.h"
#include "daemon/ringd/owned_paths.h"
#include "daemon/ringd/startup.h"
#include "daemon/ringd/step_driver.h"
#include "daemon/ringd/supervisor.h"
#include "daemon/ringd/transport_exchange.h"
#include "common/contract/model_config.h"
#include "common/contract/layout.h"
#include "common/contract/control.h"
#include "common/contract/shm.h"
#include "common/contract/step_stats.h"
#include "common/contract/timeline.h"

namespace ring::ringd {
namespace {

namespace asio = boost::asio;
using json = nlohmann::json;
namespace fs = std::filesystem;

class Daemon {
 public:
  Daemon(const Options& o, spec::JobSpec spec, std::string spec_text)
      : o_(o), spec_(std::move(spec)), spec_text_(std::move(spec_text)), signals_(io_),
        tick_(io_),
        supervisor_({o.heartbeat_timeout_s, o.startup_timeout_s, o.stop_grace_s}),
        control_(io_, {[this](const ConnPtr& c, const contract::control::WorkerMessage& m) {
                         on_message(c, m);
                       },
                       [this](const ConnPtr& c, const std::string& what) {
                         protocol_error(c, what);
                       }}) {}

  int run();

 private:
  // ---- start-up, in run()'s order; each step gives an exit status when ringd must stop now
  using Exit = std::optional<int>;
  void catch_signals();
  Exit open_job_files();
  Exit prepare_directories();
  Exit find_worker();
  Exit lock_dir(const std::string& dir, const char* what);
  void make_parts();
  Exit place(NodeFacts* facts);
  Exit make_control_dir_or_fail();
  void announce();
  void arm_loop();
  Exit register_with_coord(const NodeFacts& facts, int* first_attempt);
  void run_attempts(int first_attempt);
  void shut_down();
  // job.kind generate: the same start-up and loop, the generate mode's lifecycle
  int run_generate();
  bool exiting() const {
    return gen_ ? gen_->ended() : state_.phase == attempt::Phase::kExiting;
  }
  // ---- logging and events
  void log(const std::string& line);
  void event(const std::string& name, json fields);
  // ---- the attempt state machine (attempt.h): events in, actions carried out here
  void dispatch(const attempt::Event& e);
  void execute(const attempt::State& before, const attempt::Action& a);
  void say(const attempt::Action& a);
  attempt::Event event_of(attempt::EventKind kind, std::string text = {}) const;
  bool ready() const;
  // ---- attempts
  void start_attempt();
  void spawn(Worker& w);
  void stop_workers(const std::string& why, bool already_stopping);
  void end_attempt();
  void finish(int code);
  void fatal(const std::string& why);
  void announce_fatal(const std::string& why);
  // ---- the workers' control messages (control_server.h does the socket)
  void on_message(const ConnPtr& c, const contract::control::WorkerMessage& msg);
  void send(int local, const json& m) { control_.send(local, m); }
  void protocol_error(const ConnPtr& c, const std::string& what);
  std::string peer_name(const ConnPtr& c) const;
  // ---- steps
  void maybe_begin();
  void begin_step();
  void stop_at_boundary(const attempt::Action& a);
  void on_bucket(Worker& w, int b);
  void maybe_finish_step();
  void checkpoint_now(int64_t step, bool wait);
  // ---- watching
  void on_signal(int sig);
  void reap();
  void on_tick();
  void worker_failed(Worker& w, const std::string& what);
  // ---- ring-coord (--coord): coord_link.h carries the messages, coord_commands.h reads them
  void on_coord(const protocol::Message& m);
  // ---- observability (observer.h): timelines, the step's per-rank summary, stragglers, hangs
  void open_timelines();
  void unlink_timelines();
  std::vector<protocol::RankStep> observe_step(int64_t step);
  bool check_hang(Clock::time_point now);
  bool report_hang(Clock::time_point now, double deadline, bool fail);
  void dump_timeline(bool force);
  std::string node_label() const;

  Options o_;
  spec::JobSpec spec_;
  std::string spec_text_, spec_hash_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::steady_timer tick_;
  std::function<void(const boost::system::error_code&, int)> on_sig_;  // re-arms itself
  Supervisor supervisor_;
  std::vector<Worker>& workers_ = supervisor_.workers();
  ControlServer control_;
  std::string sock_dir_, sock_path_;

  std::string job_dir_, rdv_root_, worker_bin_;
  Output out_{o_};  // the log file, stderr, stdout, steps.jsonl (output.h)
  int wpn_ = 1, world_ = 1;
  int64_t total_steps_ = 0;
  std::unique_ptr<contract::ParamLayout> layout_;
  placement::Placement placement_;

  // The attempt's lifecycle (phase, failure, stop requests, the coordinator's commands) and
  // the fixed facts its transitions depend on; the deadlines its actions arm are below.
  attempt::Config machine_;
  attempt::State state_;
  uint64_t dispatches_ = 0;
  int last_signal_ = 0;
  int64_t command_id_ = 0;  // the ring-coord command being handled (its ack)
  // The attempt's directories, shared memory, exchange and optimizer (attempt_resources.h).
  std::unique_ptr<AttemptResources> res_;
  std::unique_ptr<Checkpoints> ckpts_;  // the run's checkpoints (checkpoints.h)
  std::vector<files::DirLock> dir_locks_;  // the job (and checkpoint) directory, held for life
  std::unique_ptr<StepDriver> steps_;  // the step in flight, the checkpoint results (step_driver.h)

  // Stop signals (state_.stop_signals counts them; repeats within 1 s are one).
  Clock::time_point first_stop_signal_;
  // Time the event loop spent in blocking calls (checkpoint drains, the optimizer's step end):
  // a signal that arrived during one is handled late, so "within 1 s" discounts it.
  Clock::duration blocked_{};
  Clock::duration blocked_at_first_signal_{};
  struct Blocking {  // adds its lifetime to blocked_
    Daemon* d;
    Clock::time_point t0 = Clock::now();
    ~Blocking() {
      d->blocked_ += Clock::now() - t0;
      d->unblocked_at_ = Clock::now();
    }
  };
  // When the loop last came back from a blocking call (a checkpoint drain, the optimizer's step
  // end, the resume load): workers' heartbeats queued meanwhile have not been read yet, so
  // silence is counted from here at the earliest, or a long drain would look like hung workers.
  Clock::time_point unblocked_at_{};
  // Deadlines the attempt's actions arm and on_tick watches: the restart backoff, the workers'
  // stop at a step boundary (60 s), ring-coord's answer (await_deadline_).
  Clock::time_point restart_at_;
  Clock::time_point stop_deadline_{Clock::time_point::max()};

  // ring-coord (--coord). With a coordinator, restarts after a failure are its decision (the
  // spec's restart policy, applied by ring-coord: stop, then roll_back to a new attempt); ringd
  // falls back to its own policy only when the coordinator stays silent.
  std::unique_ptr<CoordLink> coord_;
  // The generate mode (job.kind generate, generate_job.h); null for a training job.
  std::unique_ptr<GenerateMode> gen_;
  std::optional<int64_t> resume_to_;  // resume from the newest complete checkpoint <= this step
  Clock::time_point await_deadline_;
  std::string fatal_error_;           // fatal(): the exit message

  // Observability (observer.h). Each worker's timeline file (on /dev/shm, else in the private
  // control directory) stays mapped here, so the flight recorder of a stopped, stuck or dead
  // worker can still be read; ringd's own phases go to daemon_tl_.
  std::vector<contract::timeline::Mapping> tl_maps_;  // [local rank]
  std::vector<std::string> tl_paths_;  // their names until unlinked
  DaemonTimeline daemon_tl_;
  StragglerTracker stragglers_;
  Clock::time_point step_began_{};
  int64_t hang_step_ = 0;        // the step a hang was reported for (once per step)
  Clock::time_point last_dump_{};
};

// ---------------------------------------------------------------------------------------------

void Daemon::log(const std::string& line) { out_.log(line); }

void Daemon::event(const std::string& name, json fields) {
  const json sent = out_.event(name, std::move(fields), state_.attempt);
  if (coord_) coord_->report(name, sent);
}

// Start-up in steps (each says on stderr why it stops ringd), the attempts on the event loop, and
// the way out that leaves no worker behind.
int Daemon::run() {
  catch_signals();
  if (Exit e = open_job_files()) return *e;
  if (spec_.job.kind == spec::JobKind::kGenerate) return run_generate();
  if (Exit e = prepare_directories()) return *e;
  if (Exit e = find_worker()) return *e;
  make_parts();
  NodeFacts facts;
  if (Exit e = place(&facts)) return *e;
  if (Exit e = make_control_dir_or_fail()) return *e;
  struct RemoveOnExit {  // every way out of run(), exceptions included
    const std::string& dir;
    ~RemoveOnExit() { remove_own_dir(dir); }
  } remove_sock_dir{sock_dir_};
  control_.listen(sock_path_);
  announce();
  arm_loop();
  int first_attempt = 0;
  if (Exit e = register_with_coord(facts, &first_attempt)) return *e;
  run_attempts(first_attempt);
  shut_down();
  return state_.exit_code;
}

// Stop signals from the start (placement and registration take seconds): they wait in the
// signal_set until the loop runs. SIGHUP (the terminal of `ringctl run` hung up) is a stop
// like SIGTERM: checkpoint, then exit 75.
void Daemon::catch_signals() {
  signals_.add(SIGCHLD);
  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.add(SIGUSR1);
  signals_.add(SIGHUP);
}

// Job directory and files.
Daemon::Exit Daemon::open_job_files() {
  job_dir_ = o_.job_dir.empty() ? jobdir::prepare_default_job_dir(spec_.job.name) : o_.job_dir;
  if (auto f = prepare_job_dir(&job_dir_)) {
    out_.error(f->message);
    return f->code;
  }
  // One job per job directory, for the life of this ringd (node 0's; the other nodes of the
  // same job share the directory): a second job with the same directory would mix logs,
  // steps.jsonl and checkpoints. Taken before anything is written there.
  if (auto f = lock_dir(job_dir_, "job directory")) return f;
  // The job's own files: a job directory the user cannot write is a fatal error now, named on
  // stderr, not a log line nobody sees followed by restarts.
  std::string why;
  if (!out_.open(job_dir_, &why)) {
    out_.error(why);
    return kExitFailed;
  }
  return std::nullopt;
}

// The rendezvous root (stale attempts of an earlier run removed) and the checkpoint directory.
Daemon::Exit Daemon::prepare_directories() {
  rdv_root_ = rendezvous_root(o_, job_dir_);
  const char* slurm_job = std::getenv("SLURM_JOB_ID");
  if ((!slurm_job || !*slurm_job || !o_.rendezvous.empty()) && o_.nodes == 1) {
    // One node: the attempt directories an earlier run left go. Only those: a real directory of
    // ours named attempt-<N> holding ringd's marker (owned_paths.h), never the directory the
    // user named (--rendezvous ~/work must not lose the user's files).
    remove_stale_attempts(rdv_root_, [this](const std::string& n) { log(n); });
  }
  std::string ckpt_dir;
  if (auto f = prepare_checkpoint_dir(spec_.checkpoint.dir, job_dir_, &ckpt_dir)) {
    out_.error(f->message);
    return f->code;
  }
  // A checkpoint directory outside the job directory may be another job's too.
  if (!ckpt_dir.empty() &&
      fs::path(ckpt_dir).lexically_relative(job_dir_).string().rfind("..", 0) == 0)
    if (auto f = lock_dir(ckpt_dir, "checkpoint.dir")) return f;
  spec_hash_ = ckpt::xxh3_hex(spec_text_.data(), spec_text_.size());
  ckpt::Options co;
  co.dir = ckpt_dir;
  co.keep_last = std::max<int64_t>(1, spec_.checkpoint.keep_last);
  co.node_rank = o_.node_rank;
  co.nodes = o_.nodes;
  co.spec_hash = spec_hash_;
  co.layout = checkpoint_layout(spec_, o_.nodes);  // recorded in every checkpoint
  ckpts_ = std::make_unique<Checkpoints>(
      co, Checkpoints::Hooks{[this](const std::string& l) { log(l); },
                             [this](const std::string& n, json f) { event(n, std::move(f)); },
                             [this](const ckpt::SaveResult& r) { steps_->record(r); }});
  return std::nullopt;
}

Daemon::Exit Daemon::lock_dir(const std::string& dir, const char* what) {
  if (o_.node_rank != 0) return std::nullopt;
  json record = {{"program", "ringd"}, {"name", spec_.job.name}, {"node", o_.node_rank}};
  if (!o_.job.empty()) record["job"] = o_.job;
  if (const char* sj = std::getenv("SLURM_JOB_ID"); sj && *sj) record["slurm_job"] = sj;
  try {
    dir_locks_.push_back(files::DirLock::acquire(dir, record));
  } catch (const files::DirBusy& e) {
    out_.error(fmt::format(
        "{} {}; two jobs must not share it (their logs, steps and checkpoints would mix): wait "
        "for that job to end, cancel it, or give this one another {}",
        what, e.what(), std::string(what) == "job directory" ? "--job-dir" : "checkpoint.dir"));
    return kExitFailed;
  } catch (const files::DirLockError& e) {
    out_.error(fmt::format("{}: {}", what, e.what()));
    return kExitFailed;
  }
  return std::nullopt;
}

Daemon::Exit Daemon::find_worker() {
  worker_bin_ = find_worker_bin(o_.worker_bin);
  if (worker_bin_.empty() || access(worker_bin_.c_str(), X_OK) != 0) {
    out_.error(fmt::format(
        "no ring-worker executable found (tried '{}'); give --worker-bin PATH or RING_WORKER_BIN",
        worker_bin_));
    return kExitUsage;
  }
  return std::nullopt;
}

// The run's sizes, the parameter layout, the step driver and the attempts' resources.
void Daemon::make_parts() {
  wpn_ = static_cast<int>(spec_.resources.workers_per_node);
  world_ = wpn_ * o_.nodes;
  total_steps_ = o_.steps.value_or(spec_.train.steps);
  layout_ = std::make_unique<contract::ParamLayout>(contract::ModelConfig::from_spec(spec_));
  if (spec_.parallel.shard == spec::ShardMode::kFull) {
    // The node gradient of this node's range only, from its workers' shards.
    const std::vector<contract::WorkerShard> all = contract::worker_shards(*layout_, o_.nodes, wpn_);
    steps_ = std::make_unique<StepDriver>(
        *layout_, contract::shard_ranges(*layout_, o_.nodes)[o_.node_rank],
        std::vector<contract::WorkerShard>(all.begin() + o_.node_rank * wpn_,
                                           all.begin() + (o_.node_rank + 1) * wpn_));
  } else {
    steps_ = std::make_unique<StepDriver>(*layout_);
  }
  res_ = std::make_unique<AttemptResources>(
      AttemptResources::Config{rdv_root_, o_.node_rank, o_.nodes, o_.transport, o_.threads,
                               total_steps_},
      spec_, *layout_, [this](const std::string& n) { log(n); });
}

// Discovery, once per ringd (nvidia-smi or NVML, sysfs): placement and the registration with
// ring-coord read the same facts. GPUs matter only to a CUDA job's placement: elsewhere a
// failed GPU discovery is logged and the node registers without GPUs.
Daemon::Exit Daemon::place(NodeFacts* facts) {
  const bool cuda = spec_.resources.backend == spec::Backend::kCuda;
  try {
    facts->gpus = placement::discover_gpus().topology;
  } catch (const std::exception& e) {
    if (cuda) {
      out_.error(std::string("placement: ") + e.what());
      return kExitFailed;
    }
    log(std::string("GPU discovery: ") + e.what());
  }
  // Placement: GPUs (CUDA backend) and cores for each local worker.
  try {
    facts->cpu = placement::discover_cpu_topology();
    placement::PlacementRequest req;
    req.workers = wpn_;
    req.cpus_per_worker = static_cast<int>(spec_.resources.cpus_per_worker);
    req.device = cuda ? placement::Device::kGpu : placement::Device::kCpu;
    placement_ = placement::place_workers(cuda ? *facts->gpus : placement::GpuTopology{},
                                          *facts->cpu, req);
  } catch (const std::exception& e) {
    out_.error(std::string("placement: ") + e.what());
    return kExitFailed;
  }
  return std::nullopt;
}

// Control socket: a short path (108-byte limit) in a private per-user directory, marked so
// that the next ringd removes it when this one is killed (owned_paths.h).
Daemon::Exit Daemon::make_control_dir_or_fail() {
  try {
    sock_dir_ = make_control_dir([this](const std::string& n) { log(n); });
  } catch (const std::exception& e) {
    out_.error(std::string("control socket directory: ") + e.what());
    return kExitFailed;
  }
  sock_path_ = sock_dir_ + "/ctl.sock";
  return std::nullopt;
}

void Daemon::announce() {
  log(fmt::format("job {} | node {} of {} | {} workers per node, world {} | {} steps | {} "
                  "parameters, {} buckets | optimizer {} {}{} | job dir {}",
                  spec_.job.name, o_.node_rank, o_.nodes, wpn_, world_, total_steps_,
                  layout_->num_params(), layout_->buckets().size(),
                  spec::to_string(spec_.optimizer.update),
                  spec::to_string(spec_.optimizer.compression),
                  spec_.optimizer.compression == spec::Compression::kTopk
                      ? fmt::format(" density {}", spec_.optimizer.density)
                      : "",
                  job_dir_));
  for (const std::string& n : placement_.notes) log("placement: " + n);
}

// The signals and the 100 ms tick, handled once the loop runs.
void Daemon::arm_loop() {
  on_sig_ = [this](const boost::system::error_code& e, int sig) {
    if (e) return;
    on_signal(sig);
    if (!exiting()) signals_.async_wait(on_sig_);
  };
  signals_.async_wait(on_sig_);
  tick_.expires_after(std::chrono::milliseconds(100));
  tick_.async_wait([this](const boost::system::error_code& e) {
    if (!e) on_tick();
  });
}

// With --coord: register (node, GPUs, topology, the job) and learn the attempt to run
// (*first_attempt; 0 without a coordinator: the state machine's first).
Daemon::Exit Daemon::register_with_coord(const NodeFacts& facts, int* first_attempt) {
  if (o_.coord.empty()) return std::nullopt;
  const protocol::Register reg = make_registration(std::stoll(o_.job), o_.node_rank, wpn_, facts);
  try {
    coord_ = std::make_unique<CoordLink>(
        CoordLinkOptions{o_.coord, std::stoll(o_.job), reg},
        [this](const protocol::Message& m) { asio::post(io_, [this, m] { on_coord(m); }); });
  } catch (const std::exception& e) {
    out_.error(e.what());
    return kExitUsage;
  }
  log(fmt::format("ring-coord {}: registering as node {} for job {}", o_.coord, reg.node, o_.job));
  std::optional<protocol::Assignment> a = coord_->wait_registered(std::chrono::seconds(30));
  if (!a) {
    *first_attempt = 1;
    log("ring-coord did not answer within 30 s (or does not list the job): starting attempt 1; "
        "the link keeps trying and the coordinator reconciles when it answers");
    return std::nullopt;
  }
  log(fmt::format("ring-coord: job {} is {}, attempt {}, resume step {}", a->job, a->state,
                  a->attempt, a->resume_step));
  if (const std::optional<int> code = attempt::exit_for_job_state(a->state)) {
    log("nothing to run: the job is " + a->state);
    coord_.reset();
    return *code;
  }
  *first_attempt = static_cast<int>(std::max<int64_t>(1, a->attempt));
  if (a->resume_step > 0) resume_to_ = a->resume_step;
  return std::nullopt;
}

// The attempt state machine's facts, its start, and the event loop until it exits.
void Daemon::run_attempts(int first_attempt) {
  machine_.nodes = o_.nodes;
  machine_.coordinated = coord_ != nullptr;
  machine_.max_restarts = spec_.restart.max_restarts;
  machine_.backoff_s = spec_.restart.backoff_s;
  machine_.backoff_max_s = spec_.restart.backoff_max_s;
  attempt::Event start = event_of(attempt::EventKind::kStart);
  start.attempt = first_attempt;
  dispatch(start);
  io_.run();
}

// A generate job (generate_job.h): the training start-up's job files, worker binary, placement
// and registration, then the generate mode's workers on the same loop until its lifecycle ends.
int Daemon::run_generate() {
  gen_ = std::make_unique<GenerateMode>(
      DaemonParts{o_, spec_, job_dir_, worker_bin_, placement_, supervisor_,
                  [this](const std::string& l) { log(l); },
                  [this](const std::string& l) { out_.error(l); },
                  [this](const std::string& n, json f) { event(n, std::move(f)); },
                  [this] { return coord_.get(); }});
  struct ShutDown {  // every way out of here, exceptions included
    Daemon* d;
    ~ShutDown() { d->gen_->shut_down(); }
  } shut_down_generate{this};
  if (Exit e = find_worker()) return *e;
  wpn_ = static_cast<int>(spec_.resources.workers_per_node);
  world_ = wpn_ * o_.nodes;
  if (Exit e = gen_->prepare()) return *e;
  NodeFacts facts;
  if (Exit e = place(&facts)) return *e;
  gen_->announce();
  arm_loop();
  int first_attempt = 1;
  if (Exit e = register_with_coord(facts, &first_attempt)) return *e;
  state_.attempt = std::max(1, first_attempt);  // the events name it
  gen_->start(state_.attempt);
  if (!gen_->ended()) io_.run();
  shut_down();
  return gen_->exit_code();
}

// Every exit path: no worker survives.
void Daemon::shut_down() {
  supervisor_.kill_all_and_wait();
  unlink_timelines();
  if (coord_) {
    // A barrier: the coordinator answers this registration after it handled every report before.
    if (!coord_->sync_and_wait(std::chrono::seconds(5)))
      log("ring-coord did not confirm the last reports within 5 s");
    coord_.reset();
  }
}

// ---- the attempt state machine -----------------------------------------------------------------

attempt::Event Daemon::event_of(attempt::EventKind kind, std::string text) const {
  attempt::Event e;
  e.kind = kind;
  e.text = std::move(text);
  e.ready = ready();
  e.more_steps = steps_->done_step() + 1 <= total_steps_;
  e.has_checkpointer = ckpts_->active();
  return e;
}

// Every worker mapped the shared memory and the master weights exist: steps can begin.
bool Daemon::ready() const {
  return steps_->have_master() && !workers_.empty() &&
         std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.mapped; });
}

void Daemon::dispatch(const attempt::Event& e) {
  const attempt::State before = state_;
  const attempt::Transition t = attempt::next(machine_, state_, e);
  if (!t.accepted) return;
  state_ = t.state;
  const uint64_t mine = ++dispatches_;
  for (const attempt::Action& a : t.actions) {
    execute(before, a);
    // An action's own outcome (a fatal error while starting) ended the run: the rest is moot.
    if (dispatches_ != mine && state_.phase == attempt::Phase::kExiting) return;
  }
}

void Daemon::execute(const attempt::State& before, const attempt::Action& a) {
  using attempt::ActionKind;
  const auto after = [](double s) {
    return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(s * 1e3));
  };
  switch (a.kind) {
    case ActionKind::kStopWorkers:
      stop_workers(a.text, before.phase == attempt::Phase::kStopping);
      return;
    case ActionKind::kBeginStep:
      begin_step();
      return;
    case ActionKind::kStopAtBoundary:
      stop_at_boundary(a);
      return;
    case ActionKind::kCheckpoint:
      checkpoint_now(steps_->done_step(), false);
      return;
    case ActionKind::kArmStopDeadline:
      stop_deadline_ = Clock::now() + std::chrono::seconds(60);
      return;
    case ActionKind::kStartAttempt:
      start_attempt();
      return;
    case ActionKind::kScheduleRestart:
      if (a.resume) resume_to_ = a.step;
      restart_at_ = after(a.seconds);
      return;
    case ActionKind::kAwaitCoord:
      await_deadline_ = after(a.seconds);
      // The answer (registered) carries the job's state.
      if (state_.await == attempt::Await::kState) coord_->sync();
      return;
    case ActionKind::kAck:
      coord_->ack(command_id_, a.ok, a.text);
      return;
    case ActionKind::kExit:
      finish(a.code);
      return;
    case ActionKind::kSay:
      say(a);
      return;
  }
}

// The log lines and events of the lifecycle's transitions (their words: attempt_notes.h).
void Daemon::say(const attempt::Action& a) {
  const Words w = words_of(a, {last_signal_, steps_->done_step(), spec_.restart.max_restarts,
                               state_.restarts});
  if (!w.line.empty()) log(w.line);
  if (!w.event.empty()) event(w.event, w.fields);
  if (w.fatal) announce_fatal(a.text);
}

// ---- attempts ----------------------------------------------------------------------------------

// The kStartAttempt action: state_ is kStarting (attempt::next reset the attempt's flags).
void Daemon::start_attempt() {
  steps_->reset();
  std::string rdv_error;
  if (!res_->make_dirs(state_.attempt, &rdv_error)) {
    fatal("rendezvous: " + rdv_error);
    return;
  }
  try {
    res_->create_shm(state_.attempt, wpn_);
  } catch (const std::exception& e) {
    log(std::string("fatal: ") + e.what());
    dispatch(event_of(attempt::EventKind::kFatal, e.what()));
    return;
  }
  supervisor_.reset(wpn_, o_.node_rank * wpn_, [this](int rank) {
    return fmt::format("{}/logs/worker-{}.log", job_dir_, rank);
  });
  open_timelines();
  for (Worker& w : workers_) {
    spawn(w);
    // fatal(): the workers already started are killed on the way out
    if (state_.phase == attempt::Phase::kExiting) return;
  }
  if (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.running; })) {
    dispatch(event_of(attempt::EventKind::kStartFailed, "a worker could not be started"));
    return;
  }
  log(fmt::format("attempt {}: spawned {} workers (ranks {}..{}), rendezvous {}", state_.attempt, wpn_,
                  o_.node_rank * wpn_, o_.node_rank * wpn_ + wpn_ - 1, res_->rdv()));
  try {
    optim::NodeOptimizer& opt = res_->make_optimizer();
    // What this node holds: shard optimizer, master and moments of its range only.
    contract::NodeRange held = opt.range();
    if (!opt.sharded()) {
      held.begin = 0;
      held.end = layout_->total();
      held.first_bucket = 0;
      held.end_bucket = static_cast<int>(layout_->buckets().size());
    }
    const bool residual = opt.state_buffer("residual").data != nullptr;
    log(fmt::format(
        "optimizer state: 3 x {} floats of range [{}, {}) (buckets [{}, {}), shard {}){}"
        ": {} bytes",
        held.size(), held.begin, held.end, held.first_bucket, held.end_bucket,
        spec::to_string(spec_.parallel.shard),
        residual ? fmt::format(" + residual {} floats", opt.state_buffer("residual").end -
                                                                opt.state_buffer("residual").begin)
                 : "",
        opt.state_bytes()));
    // Resume (asked for, ring-coord's restart point, or a local restart after a checkpoint of
    // this run): the current lineage's checkpoint every node has. A resume that was asked for
    // and loads nothing fails the attempt, naming why; it never trains from fresh weights.
    ckpts_->agree_run(res_->exchange());
    const bool coord_step = coord_ && resume_to_.value_or(0) > 0;
    // --resume-if-any (a Slurm batch script without ring-coord): the lineage decides, agreed
    // by every node (one that sees a checkpoint makes every node try, and a node that then loads
    // nothing fails the attempt).
    const bool if_any = !coord_ && !o_.resume && o_.resume_if_any &&
                        ckpts_->lineage_has_checkpoint(res_->exchange());
    const bool want_resume = o_.resume || coord_step || if_any ||
                             (!coord_ && state_.attempt > 0 && ckpts_->saved_any());
    const int64_t max_step = coord_step ? *resume_to_ : INT64_MAX;
    bool resumed = false;
    if (want_resume) {
      try {
        resumed = ckpts_
                      ->resume(opt.state_tensors(), max_step, coord_step, res_->exchange(),
                               [&](const ckpt::LoadResult& r) {
                                 opt.restore_step(r.step);
                                 steps_->resumed(r.step, r.meta.value("cursor", json()));
                               })
                      .loaded;
      } catch (const ResumeFailure& e) {
        if (!e.retry()) {
          // Every attempt would find the same: fail the run now, naming why.
          fatal(e.what());
          return;
        }
        log(std::string("attempt failed to start: ") + e.what());
        event("attempt_failed", {{"error", e.what()}});
        dispatch(event_of(attempt::EventKind::kStartFailed, e.what()));
        return;
      }
    }
    const std::string& init_from = spec_.model.init_from;
    if (resumed && !init_from.empty()) {
      log("model.init_from " + init_from + " not used: resuming from checkpoint.dir");
    } else if (!init_from.empty()) {
      // Fine-tuning: the master weights come from the checkpoint, the moments (and residual)
      // stay zero, and the run starts at step 0 with the data from its start.
      ckpt::LoadResult r;
      try {
        const ckpt::Layout job = checkpoint_layout(spec_, *layout_, o_.nodes);
        r = load_init_from(init_from, opt.state_tensors(), o_.node_rank, o_.nodes, &job);
      } catch (const ckpt::CheckpointError& e) {
        fatal(std::string("cannot initialise from model.init_from: ") + e.what());
        return;
      }
      opt.restore_step(0);
      steps_->resumed(0, json());
      log(fmt::format(
          "master weights initialised from {} (step {}, written by {} node{}; read "
          "{}); optimizer state zero, starting at step 0",
          r.path, r.step, r.nodes, r.nodes == 1 ? "" : "s", fmt::join(r.shards_read, ", ")));
      event("initialised_from", {{"path", r.path}, {"step", r.step}});
    }
    if (!resumed) ckpts_->start_fresh();
    ckpts_->open(state_.attempt, opt.state_tensors());
  } catch (const ckpt::CheckpointMismatch& e) {
    // A sound checkpoint of another model: every restart would find the same one.
    fatal(std::string("cannot resume: ") + e.what());
    return;
  } catch (const std::exception& e) {
    log(std::string("attempt failed to start: ") + e.what());
    event("attempt_failed", {{"error", e.what()}});
    dispatch(event_of(attempt::EventKind::kStartFailed, "the attempt could not start"));
    return;
  }
  unblocked_at_ = Clock::now();  // the exchange bootstrap and the resume load blocked the loop
  if (coord_) coord_->set_progress(state_.attempt, steps_->done_step());
  event("attempt_started", {{"workers", wpn_}, {"start_step", steps_->done_step()}});
}

// Starts one worker (supervisor.h) with its command line, cpuset and GPU.
void Daemon::spawn(Worker& w) {
  const placement::WorkerPlacement& pl = placement_.workers[w.local];
  Supervisor::Launch launch;
  launch.argv = worker_argv({worker_bin_, fs::absolute(o_.spec).string(), world_,
                             res_->rdv() + "/workers", sock_path_, o_.transport,
                             o_.worker_threads},
                            w);
  launch.cpus = pl.cpus;
  launch.cuda_visible_devices = pl.cuda_visible_devices;
  launch.banner = fmt::format("=== attempt {} ===\n", state_.attempt);
  std::string fatal_why, failed;
  supervisor_.spawn(w, launch, &fatal_why, &failed);
  if (!fatal_why.empty()) {
    fatal(fatal_why);
    return;
  }
  if (!w.running) {
    log(fmt::format("worker rank {}: {}", w.rank, failed));
    return;
  }
  const std::string& cuda = pl.cuda_visible_devices;
  std::string cpus;
  for (int c : pl.cpus) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
  log(fmt::format("worker rank {} (local {}) pid {} | cpus {}{}{}", w.rank, w.local, w.pid,
                  cpus.empty() ? "any" : cpus, pl.shared ? " (shared)" : "",
                  cuda.empty() ? "" : " | CUDA_VISIBLE_DEVICES=" + cuda));
  event("worker_started", {{"rank", w.rank}, {"pid", w.pid}, {"cpus", pl.cpus}});
}

// The kStopWorkers action (state_ is kStopping): SIGUSR2 now, SIGKILL after the grace (on_tick).
void Daemon::stop_workers(const std::string& why, bool already_stopping) {
  const int n = supervisor_.stop();
  if (!already_stopping && n > 0) log(fmt::format("stopping {} workers: {}", n, why));
  if (n == 0) asio::post(io_, [this] { end_attempt(); });
}

void Daemon::end_attempt() {
  if (!state_.live()) return;
  for (const Worker& w : workers_)
    if (w.running) return;
  control_.close_all();
  unlink_timelines();
  dump_timeline(true);  // the attempt's last steps (a failure's flight recorder) stay readable
  const bool had_checkpointer = ckpts_->active();
  ckpts_->close(state_.stop_requested(), steps_->done_step());
  res_->release();
  attempt::Event e = event_of(attempt::EventKind::kAllExited);
  // The run's last checkpoint (of the step it ends at) failed: the message that fails the run
  // (it must not end "completed" or "resumable from here" with older weights on disk), or "".
  if (had_checkpointer)
    e.final_checkpoint_error = ckpts_->final_error(steps_->failed_at_done_step(),
                                                   state_.stop_requested(), steps_->done_step());
  dispatch(e);
}

// The kExit action: leave the event loop (run() returns state_.exit_code).
void Daemon::finish(int) {
  boost::system::error_code ec;
  control_.stop();
  signals_.cancel(ec);
  tick_.cancel();
  io_.stop();
}

// An error that no restart can mend (a log that cannot be opened, a rendezvous directory that
// is not ours): say it on stderr whatever the output mode (ringctl shows ringd's stderr), in the
// log and as the `failed` event, and exit 1 at once instead of retrying.
void Daemon::fatal(const std::string& why) {
  if (state_.phase == attempt::Phase::kExiting) return;
  announce_fatal(why);
  dispatch(event_of(attempt::EventKind::kFatal, why));
}

void Daemon::announce_fatal(const std::string& why) {
  if (o_.json)
    out_.error("fatal: " + why);  // log() leaves stderr alone with --json
  else
    log("fatal: " + why);
  event("failed", {{"step", steps_->done_step()}, {"error", why}});
  fatal_error_ = why;
}

// ---- sockets -----------------------------------------------------------------------------------

std::string Daemon::peer_name(const ConnPtr& c) const {
  if (c->local >= 0 && c->local < static_cast<int>(workers_.size()))
    return fmt::format("worker rank {} (local {}, pid {})", workers_[c->local].rank, c->local,
                       workers_[c->local].pid);
  return "a control connection that has not said hello";
}

// A message that breaks the protocol: the worker that sent it is failed (killed, the attempt
// ends as after any worker failure); a connection that is not a worker yet is closed. ringd
// itself goes on.
void Daemon::protocol_error(const ConnPtr& c, const std::string& what) {
  const std::string who = peer_name(c);
  if (c->local >= 0 && workers_[c->local].running &&
      state_.phase != attempt::Phase::kStopping) {
    worker_failed(workers_[c->local], "protocol error: " + what);
  } else {
    log(fmt::format("protocol error from {}: {}; connection closed", who, what));
  }
}

void Daemon::on_message(const ConnPtr& c, const contract::control::WorkerMessage& msg) {
  namespace ctl = contract::control;
  if (const auto* h = std::get_if<ctl::Hello>(&msg)) {
    if (c->local >= 0) throw ProtocolError("a second hello on one connection");
    const int local = static_cast<int>(h->local);
    // Who is really at the other end (SO_PEERCRED), not what the message says.
    pid_t peer_pid = -1;
    uid_t peer_uid = 0;
    const bool have_cred = ControlServer::peer(c, &peer_pid, &peer_uid);
    const std::string why =
        hello_refusal(*h, workers_, layout_->total(), have_cred, peer_pid, peer_uid, geteuid());
    if (!why.empty()) {
      log("refused a worker: " + why);
      c->close_after = true;
      control_.write(c, {{"t", "stop"}, {"reason", why}});
      return;
    }
    c->local = local;
    Worker& w = workers_[local];
    w.connected = true;
    w.last_seen = Clock::now();
    send(local, {{"t", "welcome"},
                 {"shm", res_->shm().name()},
                 {"start_step", steps_->done_step()},
                 {"need_init", !steps_->have_master() && local == 0},
                 {"cursor", steps_->cursor()}});
    return;
  }
  if (c->local < 0)
    throw ProtocolError("'" + ctl::to_json(msg).value("t", std::string("?")) + "' before hello");
  Worker& w = workers_[c->local];
  w.last_seen = Clock::now();
  if (state_.phase == attempt::Phase::kStopping) return;
  if (std::holds_alternative<ctl::Mapped>(msg)) {
    w.mapped = true;
    if (std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.mapped; })) {
      contract::ShmRegion& shm = res_->shm();
      shm.unlink();
      unlink_timelines();
      log(fmt::format("all {} workers connected; shared memory {} ({:.1f} MiB) mapped and unlinked",
                      wpn_, shm.name(), shm.bytes() / 1048576.0));
      maybe_begin();
    }
  } else if (std::holds_alternative<ctl::Init>(msg)) {
    if (c->local == 0 && !steps_->have_master()) {
      steps_->init_master(res_->opt(), res_->shm());
      log("master weights initialised from rank " + std::to_string(w.rank));
      maybe_begin();
    }
  } else if (const auto* b = std::get_if<ctl::Bucket>(&msg)) {
    if (b->step != steps_->cur_step()) {
      worker_failed(w, fmt::format("sent bucket of step {} during step {}", b->step, steps_->cur_step()));
      return;
    }
    on_bucket(w, static_cast<int>(b->b));
  } else if (const auto* d = std::get_if<ctl::Done>(&msg)) {
    if (d->step != steps_->cur_step()) {
      worker_failed(w, "finished a step that is not in flight");
      return;
    }
    w.done = true;
    w.done_msg = *d;
    maybe_finish_step();
  }
  // Heartbeat: last_seen above is all it does.
}

// ---- steps -------------------------------------------------------------------------------------

void Daemon::maybe_begin() {
  if (steps_->cur_step() != 0 || state_.finishing || state_.phase == attempt::Phase::kStopping) return;
  if (!ready()) return;
  dispatch(event_of(attempt::EventKind::kBoundary));  // the first step, or the end of the run
}

// The kStopAtBoundary action (state_ is kFinishing): every step is done or a stop is agreed.
void Daemon::stop_at_boundary(const attempt::Action& a) {
  if (ckpts_->active() && a.checkpoint && ckpts_->last_started() != steps_->done_step() &&
      steps_->done_step() > 0)
    checkpoint_now(steps_->done_step(), true);
  stop_deadline_ = Clock::now() + std::chrono::seconds(60);
  for (const Worker& w : workers_) send(w.local, {{"t", "stop"}, {"reason", a.text}});
}

// The kBeginStep action: the next step's weights into shared memory, its params to the workers.
void Daemon::begin_step() {
  int64_t changed = -1;
  try {
    // The attempt's first step gathers every weight from the other nodes (shard optimizer).
    Blocking b{this};
    changed = steps_->begin_step(workers_, res_->shm(), res_->opt());
  } catch (const std::exception& e) {
    log(fmt::format("step {}: publishing the weights failed: {}", steps_->done_step() + 1,
                    e.what()));
    event("optimizer_failed", {{"step", steps_->done_step() + 1}, {"error", e.what()}});
    dispatch(event_of(attempt::EventKind::kStepFailed, "the optimizer failed"));
    return;
  }
  step_began_ = Clock::now();
  for (const Worker& w : workers_)
    send(w.local, {{"t", "params"},
                   {"step", steps_->cur_step()},
                   {"changed", changed},
                   {"stop", state_.stop_signals > 0}});
}

void Daemon::on_bucket(Worker& w, int b) {
  const std::string wrong = steps_->on_bucket(workers_, w, b, res_->shm(), res_->opt(), [this] {
    // The optimizer is about to change the state the checkpoint is still writing.
    if (const auto stalled = ckpts_->drain_before_update()) {
      blocked_ += *stalled;
      unblocked_at_ = Clock::now();
    }
  });
  if (!wrong.empty()) {
    worker_failed(w, wrong);
    return;
  }
  maybe_finish_step();
}

void Daemon::maybe_finish_step() {
  if (!steps_->step_complete(workers_)) return;
  StepDriver::Finished f;
  const int64_t step_in_flight = steps_->cur_step();
  const int64_t opt0 = contract::timeline::now_ns();
  try {
    Blocking b{this};
    f = steps_->finish_step(workers_, res_->opt(), state_.attempt);
    // steady_clock is CLOCK_MONOTONIC here, the timeline's clock.
    auto ns = [](Clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    };
    for (const optim::ExchangeSpan& x : f.result.exchanges)
      daemon_tl_.record({.kind = contract::timeline::Phase::kExchange,
                         .step = step_in_flight,
                         .layer = x.bucket,
                         .begin_ns = ns(x.begin),
                         .end_ns = ns(x.end)});
    daemon_tl_.record({.kind = contract::timeline::Phase::kOptimizer,
                       .step = step_in_flight,
                       .begin_ns = opt0,
                       .end_ns = contract::timeline::now_ns(),
                       .bytes = f.result.bytes_sent});
  } catch (const std::exception& e) {
    log(fmt::format("step {}: optimizer failed: {}", steps_->cur_step(), e.what()));
    event("optimizer_failed", {{"step", steps_->cur_step()}, {"error", e.what()}});
    dispatch(event_of(attempt::EventKind::kStepFailed, "the optimizer failed"));
    return;
  }
  const int64_t done_step = steps_->done_step();
  if (f.done.stop) dispatch(event_of(attempt::EventKind::kStopInStep));
  const optim::StepResult& r = f.result;
  const contract::StepStats& st = f.stats;
  json& j = f.record;
  if (o_.hash_weights) {
    char h[17];
    std::snprintf(h, sizeof(h), "%016llx",
                  static_cast<unsigned long long>(
                      fnv1a(res_->opt().weights(), static_cast<size_t>(res_->shm().params_n()) * 4)));
    j["weights_xxh"] = h;
    out_.log_file(fmt::format("step {} weights {}", done_step, h));
  }
  out_.step(j,
            fmt::format("{} | optimizer {:.1f} ms ({:.1f} exposed) | {:.2f} MB exchanged",
                        contract::format_step(st), r.optimizer_s * 1e3, r.exposed_s * 1e3,
                        r.bytes_sent / 1e6),
            done_step % std::max<int64_t>(1, spec_.train.log_every) == 0 || done_step == 1 ||
                done_step == total_steps_);
  if (coord_) coord_->set_progress(state_.attempt, done_step);
  std::vector<protocol::RankStep> ranks = observe_step(done_step);
  if (coord_) {
    coord_->send(protocol::StepReport{coord_->node(), coord_->job(), state_.attempt, done_step,
                                      st.loss, st.tokens_per_s, f.wall_s,
                                      j["comm_s"].get<double>(), std::move(ranks)});
  }
  // A checkpoint at this boundary (periodic, or asked by ring-coord), then the next step or the
  // end of the run.
  attempt::Event e = event_of(attempt::EventKind::kStepDone);
  e.periodic_checkpoint = spec_.checkpoint.every_steps > 0 &&
                          done_step % spec_.checkpoint.every_steps == 0 &&
                          done_step < total_steps_;
  dispatch(e);
  // After the next step's weights went out: the workers compute while the file is written.
  if (state_.live()) dump_timeline(false);
}

void Daemon::checkpoint_now(int64_t step, bool wait) {
  if (!ckpts_->active()) return;
  const int64_t c0 = contract::timeline::now_ns();
  ckpts_->start(step, {{"cursor", steps_->cursor()}, {"attempt", state_.attempt}, {"world", world_}});
  if (wait) {
    Blocking b{this};
    ckpts_->wait(step);
  }
  // The part of the checkpoint the loop waited for (the write goes on asynchronously).
  daemon_tl_.record({.kind = contract::timeline::Phase::kCheckpoint,
                     .step = step,
                     .begin_ns = c0,
                     .end_ns = contract::timeline::now_ns()});
}

// ---- watching ----------------------------------------------------------------------------------

void Daemon::on_signal(int sig) {
  if (gen_) {
    gen_->on_signal(sig);
    if (gen_->ended()) finish(gen_->exit_code());
    return;
  }
  if (sig == SIGCHLD) {
    reap();
    return;
  }
  // Under Slurm one stop arrives twice within milliseconds (slurmstepd signals every process of
  // the step, and srun passes on the SIGTERM it got itself): a repeat within 1 s is the same
  // request, not the operator's "stop at once". The second may have waited behind a blocking
  // call of the loop (a checkpoint drain): that time does not count.
  const auto now = Clock::now();
  const auto unblocked = (now - first_stop_signal_) - (blocked_ - blocked_at_first_signal_);
  if (state_.stop_signals == 1 && unblocked < std::chrono::seconds(1)) {
    log(fmt::format("{} again within 1 s: taken as the same stop request", strsignal(sig)));
    return;
  }
  if (state_.stop_signals == 0) {
    first_stop_signal_ = now;
    blocked_at_first_signal_ = blocked_;
  }
  last_signal_ = sig;
  dispatch(event_of(attempt::EventKind::kStopSignal));
}

void Daemon::reap() {
  const bool expected = state_.finishing || state_.phase == attempt::Phase::kStopping;
  for (const auto& [wp, st] : supervisor_.reap(expected)) {
    Worker& w = *wp;
    const pid_t got = w.pid;
    w.running = false;
    const bool clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (state_.finishing && clean) {
      log(fmt::format("worker rank {} exited", w.rank));
      event("worker_exited", {{"rank", w.rank}, {"pid", got}, {"exit_code", 0}});
    } else if (state_.phase == attempt::Phase::kStopping) {  // the first death stops the rest
      const bool ours = WIFSIGNALED(st) && WTERMSIG(st) == kWorkerStopSignal;
      log(fmt::format("worker rank {} (pid {}) {}", w.rank, got,
                      ours ? std::string("stopped") : describe_status(st)));
    } else {
      DeathReport d = death_report(w, st, fmt::format("during step {}", steps_->cur_step()));
      log(d.line);
      json ev = std::move(d.event);
      ev["step"] = steps_->cur_step();
      event("worker_died", ev);
      dispatch(event_of(attempt::EventKind::kWorkerFailed, fmt::format("rank {} died", w.rank)));
    }
  }
  if (state_.live() && !supervisor_.any_running()) end_attempt();
}

void Daemon::worker_failed(Worker& w, const std::string& what) {
  log(fmt::format("worker rank {} (pid {}) {}: killing it", w.rank, w.pid, what));
  event("worker_failed", {{"rank", w.rank}, {"pid", w.pid}, {"error", what}});
  supervisor_.kill(w);
  dispatch(event_of(attempt::EventKind::kWorkerFailed, fmt::format("rank {} failed", w.rank)));
}

void Daemon::on_tick() {
  if (gen_) {
    gen_->on_tick();
    if (gen_->ended()) {
      finish(gen_->exit_code());
      return;
    }
    tick_.expires_after(std::chrono::milliseconds(100));
    tick_.async_wait([this](const boost::system::error_code& e) {
      if (!e) on_tick();
    });
    return;
  }
  const auto now = Clock::now();
  using attempt::Phase;
  if (state_.live() && state_.phase != Phase::kStopping) {
    if (!check_hang(now)) {
      if (auto late = supervisor_.overdue(now, unblocked_at_)) {
        // A worker silent past the heartbeat timeout (stopped, or stuck as a whole) during a
        // step: the flight recorders say where the others wait before it is failed.
        if (late->first->connected) report_hang(now, o_.heartbeat_timeout_s, false);
        worker_failed(*late->first, late->second);
      }
    }
    if ((state_.finishing || state_.stop_requested()) && now > stop_deadline_)
      dispatch(event_of(attempt::EventKind::kStopTimeout));
  }
  if (state_.phase == Phase::kStopping) supervisor_.kill_overdue(now);
  ckpts_->poll();
  if (state_.phase == Phase::kRestarting && now >= restart_at_)
    dispatch(event_of(attempt::EventKind::kRestartDue));
  if (state_.phase == Phase::kAwaitingCoord && now > await_deadline_)
    dispatch(event_of(attempt::EventKind::kAwaitTimeout));
  if (state_.phase == Phase::kExiting) return;
  tick_.expires_after(std::chrono::milliseconds(100));
  tick_.async_wait([this](const boost::system::error_code& e) {
    if (!e) on_tick();
  });
}

// ---- observability -----------------------------------------------------------------------------

std::string Daemon::node_label() const {
  return coord_ ? coord_->node() : fmt::format("node{}", o_.node_rank);
}

// One timeline file per worker, created (zeroed) before the worker starts and mapped here for
// the whole attempt. A file that cannot be made leaves that
// worker without a timeline (said in the log); training does not depend on it.
void Daemon::open_timelines() {
  unlink_timelines();
  std::vector<int64_t> ranks;
  for (const Worker& w : workers_) ranks.push_back(w.rank);
  const std::vector<std::string> paths =
      create_timelines(ranks, sock_dir_, &tl_maps_, [this](const std::string& m) { log(m); });
  for (Worker& w : workers_) {
    w.timeline = paths[static_cast<size_t>(w.local)];
    if (!w.timeline.empty()) tl_paths_.push_back(w.timeline);
  }
  stragglers_.reset();
  hang_step_ = 0;
}

// The timeline files' names go once every worker has mapped its file (ringd keeps its own
// mappings), at the end of an attempt and on exit: nothing is left in /dev/shm.
void Daemon::unlink_timelines() {
  for (const std::string& p : tl_paths_) ::unlink(p.c_str());
  tl_paths_.clear();
}

// The step's per-rank summary (the step report's ranks) from the workers' done messages, and
// the straggler finding it moves.
std::vector<protocol::RankStep> Daemon::observe_step(int64_t step) {
  std::vector<protocol::RankStep> ranks;
  std::vector<RankSample> samples;
  for (const Worker& w : workers_) {
    const contract::control::Done& d = w.done_msg;
    protocol::RankStep r;
    r.rank = w.rank;
    r.step_time_s = (d.step_ms + d.data_ms) / 1e3;
    r.data_s = d.data_ms / 1e3;
    r.compute_s = d.compute_ms / 1e3;
    r.wait_s = d.wait_ms / 1e3;
    r.comm_s = d.comm_ms / 1e3;
    r.hop_bytes = d.bytes_sent;
    if (d.prev >= 0) r.prev = d.prev;
    ranks.push_back(r);
    samples.push_back({w.rank, d.prev, r.step_time_s, r.wait_s});
  }
  const StragglerTracker::Change c = stragglers_.add(step, samples);
  if (c.cleared) {
    const json d = straggler_data(*c.cleared, node_label(), true);
    log(d["message"].get<std::string>());
    event("straggler_cleared", d);
  }
  if (c.named) {
    const json d = straggler_data(*c.named, node_label(), false);
    log(d["message"].get<std::string>());
    event("straggler", d);
  }
  return ranks;
}

// A step in flight past observability.step_deadline_s: report the hang (report_hang), once per
// step. True when that failed a worker.
bool Daemon::check_hang(Clock::time_point now) {
  const double deadline = spec_.observability.step_deadline_s;
  const int64_t step = steps_->cur_step();
  if (deadline <= 0 || step == 0 || hang_step_ == step) return false;
  const double elapsed =
      std::chrono::duration<double>(now - std::max(step_began_, unblocked_at_)).count();
  if (elapsed <= deadline) return false;
  return report_hang(now, deadline, true);
}

// Reads every worker's flight recorder, reports the hang of the step in flight (`hang`: the ranks
// that never arrived, where the others wait; `deadline` is what passed: the step deadline, or the
// heartbeat timeout of a silent worker) and writes the node's timeline into the job directory.
// With `fail`, a stuck rank of this node is failed like a hung worker (the restart policy
// follows). When every local rank waits on ranks of other nodes, those nodes' ringd report the
// stuck ones; this node only says where it waits. True when it failed a worker.
bool Daemon::report_hang(Clock::time_point now, double deadline, bool fail) {
  const int64_t step = steps_->cur_step();
  if (step == 0 || hang_step_ == step) return false;
  hang_step_ = step;
  const double elapsed =
      std::chrono::duration<double>(now - std::max(step_began_, unblocked_at_)).count();
  std::vector<HangInput> in;
  for (const Worker& w : workers_) {
    HangInput h;
    h.rank = w.rank;
    h.pid = w.pid;
    h.done = w.done;
    h.running = w.running;
    h.proc_state = proc_state(w.pid);
    if (w.local < static_cast<int>(tl_maps_.size()) && tl_maps_[w.local].valid())
      h.snap = contract::timeline::read_mapped(tl_maps_[w.local].data(), step);
    in.push_back(std::move(h));
  }
  const HangFinding f = analyse_hang(step, elapsed, deadline, in, contract::timeline::now_ns());
  log("hang: " + f.message);
  event("hang", hang_data(step, deadline, f));
  dump_timeline(true);
  if (!fail || f.missing.empty()) return false;
  for (Worker& w : workers_)
    if (w.rank == f.missing.front() && w.running) {
      worker_failed(w, fmt::format("hung in step {} (no progress past the {:g} s step deadline)",
                                   step, deadline));
      return true;
    }
  return false;
}

// The node's recent timeline into <job dir>/timeline/node-<K>.jsonl, what `ringctl trace` reads
// (docs/observability.md): at most every 5 s at a step end, and at once (force) on a hang and at
// the end of an attempt.
void Daemon::dump_timeline(bool force) {
  const auto now = Clock::now();
  if (!force && now - last_dump_ < std::chrono::seconds(5)) return;
  if (tl_maps_.empty()) return;
  last_dump_ = now;
  const std::string e =
      dump_node_timeline(job_dir_, o_.node_rank, node_label(), tl_maps_, daemon_tl_.events(0));
  if (!e.empty()) log("timeline: " + e);
}

// ---- ring-coord -------------------------------------------------------------------------------
// Messages from the coordinator arrive on the link thread and are posted here (the event loop).

void Daemon::on_coord(const protocol::Message& m) {
  if (exiting()) return;
  if (gen_) {
    gen_->on_coord(m);
    if (gen_->ended()) finish(gen_->exit_code());
    return;
  }
  const CoordInput in = interpret(m, coord_->job(), state_, ckpts_->active());
  if (in.refusal) {
    coord_->ack(in.command_id, false, *in.refusal);
    return;
  }
  if (!in.note.empty()) log(in.note);
  if (in.report) event("command", *in.report);
  command_id_ = in.command_id;  // attempt::next acknowledges it (kAck)
  if (in.event) dispatch(*in.event);
}

}  // namespace

// ---- entry -------------------------------------------------------------------------------------

int run(const Options& o) {
  // ringd outlives its stdout and stderr (`ringctl run` killed, a closed pipe): a write there
  // fails with EPIPE instead of killing it, the stream stops taking lines and the log file goes
  // on. A file size limit fails the write (EFBIG) instead of killing ringd mid-checkpoint.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);
  // Errors before the daemon runs go through its outputs too (stderr as --log-format says).
  Output early(o);
  spec::LoadResult loaded = spec::load_spec_file(o.spec);
  for (const auto& d : loaded.diagnostics)
    early.error(d.str(), d.severity == spec::Diagnostic::Severity::kError ? spdlog::level::err
                                                                          : spdlog::level::warn);
  if (!loaded.ok()) {
    early.error(fmt::format("{}: invalid spec ({} error(s))", o.spec, loaded.error_count()));
    return kExitUsage;
  }
  spec::JobSpec s = *loaded.spec;
  if (auto f = check_spec(s, o)) {
    early.error(f->message);
    return f->code;
  }
  std::ifstream in(o.spec, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    Daemon d(o, s, text);
    return d.run();
  } catch (const std::exception& e) {
    early.error(std::string("fatal: ") + e.what());
    return kExitFailed;
  }
}

}  // namespace ring::ringd
