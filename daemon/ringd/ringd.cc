// ringd: one Boost.Asio event loop (this thread) that spawns and watches the node's workers, talks
// to them over unix sockets, moves gradients and weights through shared memory and drives the
// NodeOptimizer (whose pipeline thread does the exchange between daemons and the AdamW update).
#include "daemon/ringd/ringd.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <utility>  // before asio: Boost 1.74 awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/cli/flags.h"
#include "common/cli/job_dir.h"
#include "common/install/locate.h"
#include "common/proc/close_fds.h"
#include "common/proc/reap.h"
#include "common/spec/parse.h"
#include "daemon/checkpoint/checkpoint.h"
#include "daemon/optim/node_optimizer.h"
#include "daemon/placement/affinity.h"
#include "daemon/placement/cpu_topology.h"
#include "daemon/placement/discovery.h"
#include "daemon/placement/placement.h"
#include "daemon/ringd/coord_link.h"
#include "daemon/ringd/owned_paths.h"
#include "daemon/ringd/transport_exchange.h"
#include "worker/model/config.h"
#include "worker/model/layout.h"
#include "worker/offload/control.h"
#include "worker/offload/shm.h"
#include "worker/train/trainer.h"

namespace ring::ringd {
namespace {

namespace asio = boost::asio;
using local_stream = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
namespace fs = std::filesystem;

// ringd stops its workers with this signal (workers ignore SIGTERM and SIGINT), then SIGKILL.
constexpr int kWorkerStopSignal = SIGUSR2;

const char* kUsage =
    "usage: ringd --spec FILE [--job-dir DIR] [--node-rank N --nodes M] [--rendezvous DIR]\n"
    "             [--coord ENDPOINT --job ID] [--steps N] [--resume] [--threads T] [--json]\n"
    "The node daemon: runs this node's ring-worker processes, owns the optimizer (CPU AdamW,\n"
    "top-k), checkpoints, restarts. Contract: daemon/INTERFACE.md.\n"
    "  --worker-bin PATH          ring-worker to spawn (default: next to ringd, then PATH)\n"
    "  --transport NAME           transport plugin for workers and daemons (default ucx)\n"
    "  --worker-threads T         kernel threads per worker (default resources.cpus_per_worker)\n"
    "  --heartbeat-timeout S      worker silence counted as a hang (default 30)\n"
    "  --startup-timeout S        spawn to first contact (default 300)\n"
    "  --stop-grace S             SIGUSR2 to SIGKILL when stopping workers (default 5)\n"
    "  --hash-weights             steps carry weights_xxh, a hash of the master weights\n";

[[noreturn]] void usage_error(const std::string& msg) {
  flags::usage_exit("ringd", msg, kUsage, kExitUsage);
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st))
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(st)) + " (" +
           strsignal(WTERMSIG(st)) + ")";
  return "stopped";
}

std::vector<std::string> last_lines(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 16384);
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) lines.push_back(l);
  if (from > 0 && !lines.empty()) lines.erase(lines.begin());  // a partial first line
  if (lines.size() > count) lines.erase(lines.begin(), lines.end() - count);
  return lines;
}

uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string find_worker_bin(const std::string& given) {
  if (!given.empty()) return given;
  // Next to ringd, the install bindir, the build tree when ringd runs from it, PATH; when none
  // is executable the caller's message shows every place tried.
  std::vector<std::string> tried;
  std::string found = install::find_program("ring-worker", {"RING_WORKER_BIN"}, "worker", &tried);
  if (!found.empty()) return found;
  std::string all;
  for (const auto& t : tried) all += (all.empty() ? "" : ", ") + t;
  return all;
}

// Opens a file ringd writes into the job directory (its log, steps.jsonl, a worker's log) for
// appending: never through a symbolic link (O_NOFOLLOW), only a regular file (a FIFO would block
// the open, so O_NONBLOCK until checked), created 0600 and made 0600 when an earlier version left
// it readable by others. Returns the descriptor, or -1 with the reason in `why`.
int open_private_append(const std::string& path, std::string* why) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK,
             0600);
  if (fd < 0) {
    const int e = errno;
    *why = e == ELOOP ? path + " is a symbolic link; refusing to write through it"
                      : "cannot open " + path + ": " + std::strerror(e);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    *why = path + " is not a regular file; refusing to write into it";
    return -1;
  }
  if (st.st_uid == ::geteuid() && (st.st_mode & 077)) ::fchmod(fd, 0600);
  ::fcntl(fd, F_SETFL, O_WRONLY | O_APPEND);  // clears O_NONBLOCK
  return fd;
}

// A line-oriented append-only file (ringd's log, steps.jsonl). A write error (a full disk) is
// kept, not thrown: the caller says it once.
class AppendFile {
 public:
  AppendFile() = default;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool open(const std::string& path, std::string* why) {
    path_ = path;
    fd_ = open_private_append(path, why);
    return fd_ >= 0;
  }
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Appends `line` and a newline; false (errno text in *why) when the write failed.
  bool write_line(const std::string& line, std::string* why) {
    if (fd_ < 0) return false;
    const std::string s = line + "\n";
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::write(fd_, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        *why = "cannot write " + path_ + ": " + std::strerror(n < 0 ? errno : EIO);
        return false;
      }
      off += static_cast<size_t>(n);
    }
    return true;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

struct Worker {
  int local = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::string log;
  Clock::time_point spawned, last_seen;
  bool connected = false, mapped = false;
  int buckets = 0;        // buckets delivered this step
  bool done = false;      // step finished
  offload::control::Done done_msg;
};

// A worker's control messages are JSON lines of a few hundred bytes (the loader cursor is the
// largest part); a line longer than this is a protocol error, not a reason to grow a buffer.
constexpr size_t kMaxControlLine = 1 << 20;
// ringd -> worker lines waiting to be written; a worker that stops reading fails past this.
constexpr size_t kMaxQueuedBytes = 16 << 20;

// A control message that breaks the protocol (a missing field, a wrong type, a value out of
// range); the message names the field and the rule.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Conn {
  explicit Conn(asio::io_context& io) : sock(io), buf(kMaxControlLine) {}
  local_stream::socket sock;
  asio::streambuf buf;
  int local = -1;  // -1 until hello
  // Writes are asynchronous (a worker that does not read must not stop the event loop): a queue
  // of lines, one async_write at a time.
  std::deque<std::string> out;
  size_t out_bytes = 0;
  bool writing = false;
  bool close_after = false;  // close once the queue is written (a refusal)
};

class Daemon {
 public:
  Daemon(const Options& o, spec::JobSpec spec, std::string spec_text)
      : o_(o), spec_(std::move(spec)), spec_text_(std::move(spec_text)), signals_(io_),
        tick_(io_), acceptor_(io_) {}

  int run();

 private:
  // ---- logging and events
  void log(const std::string& line);
  void event(const std::string& name, json fields);
  // ---- attempts
  void start_attempt();
  void spawn(Worker& w);
  void stop_workers(const std::string& why);
  void end_attempt();
  void finish(int code);
  void fatal(const std::string& why);
  void remove_stale_attempts();
  bool make_attempt_dirs(std::string* why);
  // ---- sockets
  void accept();
  void read(std::shared_ptr<Conn> c);
  void on_message(const std::shared_ptr<Conn>& c, const offload::control::WorkerMessage& msg);
  void send(int local, const json& m);
  void write(const std::shared_ptr<Conn>& c, const json& m);
  void write_next(const std::shared_ptr<Conn>& c);
  void protocol_error(const std::shared_ptr<Conn>& c, const std::string& what);
  std::string peer_name(const std::shared_ptr<Conn>& c) const;
  // ---- steps
  void maybe_begin();
  void begin_step();
  void on_bucket(Worker& w, int b);
  void maybe_finish_step();
  void checkpoint_now(int64_t step, bool wait);
  bool report_checkpoint(const ckpt::SaveResult& r);
  // ---- watching
  void on_signal(int sig);
  void await_commit(int64_t step);
  void reap();
  void on_tick();
  void worker_failed(Worker& w, const std::string& what);
  // ---- ring-coord (--coord): coord_link.h
  void on_coord(const protocol::Message& m);
  void on_command(const protocol::Command& c);
  void coord_decide(const std::string& state);
  void await_coord(int what, double seconds);
  void apply_restart_policy();

  Options o_;
  spec::JobSpec spec_;
  std::string spec_text_, spec_hash_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::steady_timer tick_;
  local_stream::acceptor acceptor_;
  std::string sock_dir_, sock_path_;

  std::string job_dir_, rdv_root_, worker_bin_, ckpt_dir_;
  AppendFile log_file_, steps_file_;
  bool log_write_failed_ = false, steps_write_failed_ = false, stdout_gone_ = false;
  void log_line(const std::string& line);
  void out_line(const std::string& line);
  int wpn_ = 1, world_ = 1;
  int64_t total_steps_ = 0;
  std::unique_ptr<model::ParamLayout> layout_;
  placement::Placement placement_;

  // Attempt state.
  int attempt_ = 0, restarts_ = 0;
  bool attempt_live_ = false;
  bool stopping_workers_ = false;
  Clock::time_point kill_at_;
  std::vector<Worker> workers_;
  std::vector<std::shared_ptr<Conn>> conns_;
  offload::ShmRegion shm_;
  std::unique_ptr<TransportExchange> exchange_;
  optim::LocalExchange local_exchange_;
  std::unique_ptr<optim::NodeOptimizer> opt_;
  std::unique_ptr<ckpt::Checkpointer> ck_;
  std::vector<float> node_grad_;
  bool have_master_ = false;
  int64_t done_step_ = 0;        // last completed step
  int64_t cur_step_ = 0;         // step in flight (0: none)
  int buckets_ready_ = 0;        // node buckets handed to the optimizer this step
  bool finishing_ = false;       // every step done, workers told to stop
  json cursor_;                  // loader cursor after done_step_
  Clock::time_point step_t0_;
  double ckpt_stall_s_ = 0;
  int64_t last_ckpt_step_ = -1;
  int64_t stop_ckpt_saved_ = -1;  // step of a checkpoint written and waited for (on a stop)
  bool last_all_changed_ = true;
  bool attempt_failed_ = false;
  std::string attempt_rdv_;

  // Exit.
  int stop_signals_ = 0;         // SIGTERM/SIGINT/SIGUSR1 received (repeats within 1 s: once)
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
  // Several nodes: every node stops after the same step. A node with a stop signal says so in
  // its params; the workers pass it on in the step's loss all_gather and report it in "done", so
  // every ringd learns it at the end of the same step (the signal reaches the nodes at slightly
  // different times, often in different steps; a node stopping alone would leave the others'
  // workers waiting in a collective for it).
  bool stop_agreed_ = false;
  bool stop_requested() const { return stop_signals_ > 0 || stop_agreed_; }
  bool exiting_ = false;
  int exit_code_ = kExitOk;
  bool restart_pending_ = false;
  Clock::time_point restart_at_;
  Clock::time_point stop_deadline_{Clock::time_point::max()};

  // ring-coord (--coord). With a coordinator, restarts after a failure are its decision (the
  // spec's restart policy, applied by ring-coord: stop, then roll_back to a new attempt); ringd
  // falls back to its own policy only when the coordinator stays silent.
  std::unique_ptr<CoordLink> coord_;
  std::optional<int64_t> resume_to_;  // resume from the newest complete checkpoint <= this step
  enum Await { kAwaitNone, kAwaitAfterFailure, kAwaitState, kAwaitRollBack };
  int await_ = kAwaitNone;
  Clock::time_point await_deadline_;
  bool coord_stop_ = false;           // a stop command: stop the workers, then ask for the state
  std::string coord_stop_reason_;
  bool rollback_pending_ = false;     // a roll_back command while an attempt is live
  int64_t rollback_attempt_ = 0, rollback_step_ = 0;
  bool ckpt_requested_ = false;       // checkpoint_now: at the next step boundary
  std::string fatal_error_;           // fatal(): the exit message
  // Checkpoint results by step (this node's view: ok = its shard is durable, and on node 0 the
  // commit done): the last one of a run must not fail silently.
  std::map<int64_t, std::string> ckpt_failed_;
  std::set<int64_t> ckpt_ok_;
  bool final_checkpoint_failed();
  std::string newest_complete_checkpoint();
};

// ---------------------------------------------------------------------------------------------

void Daemon::log(const std::string& line) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  const std::string l = fmt::format("{} ringd[{}] {}", ts, o_.node_rank, line);
  log_line(l);
  if (!o_.json) std::cerr << l << std::endl;
}

// ringd's log file; a failed write is said once on stderr (the log itself cannot carry it).
void Daemon::log_line(const std::string& line) {
  std::string why;
  if (log_file_.is_open() && !log_file_.write_line(line, &why) && !log_write_failed_) {
    log_write_failed_ = true;
    std::cerr << "ringd: " << why << "; the log goes on on stderr only" << std::endl;
  }
}

// stdout (--json lines). Once it is gone (EPIPE: the reader, e.g. `ringctl run`, died) ringd
// stops writing there and goes on: the log file and steps.jsonl keep everything.
void Daemon::out_line(const std::string& line) {
  if (stdout_gone_) return;
  std::cout << line << std::endl;
  if (!std::cout) {
    stdout_gone_ = true;
    log_line("stdout is closed (" + std::string(std::strerror(errno)) +
             "): no more lines there; the log file and steps.jsonl go on");
  }
}

void Daemon::event(const std::string& name, json fields) {
  fields["event"] = name;
  fields["node"] = o_.node_rank;
  fields["attempt"] = attempt_;
  const std::string s = fields.dump();
  log_line("event " + s);
  if (o_.json && o_.node_rank == 0) out_line(s);
  if (coord_) coord_->report(name, fields);
}

int Daemon::run() {
  // Stop signals from the start (placement and registration take seconds): they wait in the
  // signal_set until the loop runs. SIGHUP (the terminal of `ringctl run` hung up) is a stop
  // like SIGTERM: checkpoint, then exit 75.
  signals_.add(SIGCHLD);
  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.add(SIGUSR1);
  signals_.add(SIGHUP);
  // Job directory and files.
  job_dir_ = o_.job_dir.empty() ? jobdir::prepare_default_job_dir(spec_.job.name) : o_.job_dir;
  std::error_code ec;
  // What ringd creates is private: the job directory (when missing) and logs/ are 0700.
  if (!fs::exists(fs::symlink_status(job_dir_, ec))) {
    fs::create_directories(job_dir_, ec);
    if (!ec && ::chmod(job_dir_.c_str(), 0700) != 0) ec.assign(errno, std::generic_category());
  }
  if (!ec && ::mkdir((job_dir_ + "/logs").c_str(), 0700) != 0 && errno != EEXIST)
    ec.assign(errno, std::generic_category());
  if (ec) {
    std::cerr << "ringd: --job-dir " << job_dir_ << ": " << ec.message() << "\n";
    return kExitUsage;
  }
  {
    struct stat st;
    if (::lstat((job_dir_ + "/logs").c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      std::cerr << "ringd: --job-dir " << job_dir_
                << ": logs is not a directory (a symbolic link?); refusing to write there\n";
      return kExitFailed;
    }
  }
  job_dir_ = fs::absolute(job_dir_).string();
  // The job's own files: a job directory the user cannot write is a fatal error now, named on
  // stderr, not a log line nobody sees followed by restarts.
  {
    std::string why;
    if (!log_file_.open(fmt::format("{}/logs/ringd-{}.log", job_dir_, o_.node_rank), &why) ||
        (o_.node_rank == 0 && !steps_file_.open(job_dir_ + "/steps.jsonl", &why))) {
      std::cerr << "ringd: " << why << "\n";
      return kExitFailed;
    }
  }
  rdv_root_ = o_.rendezvous.empty() ? job_dir_ + "/rendezvous" : o_.rendezvous;
  if (const char* id = std::getenv("SLURM_JOB_ID"); id && *id && o_.rendezvous.empty()) {
    const char* rc = std::getenv("SLURM_RESTART_COUNT");
    rdv_root_ += fmt::format("/slurm-{}.{}", id, rc && *rc ? rc : "0");
  } else if (o_.nodes == 1) {
    // One node: the attempt directories an earlier run left go. Only those: a real directory of
    // ours named attempt-<N> holding ringd's marker (owned_paths.h), never the directory the
    // user named (--rendezvous ~/work must not lose the user's files).
    remove_stale_attempts();
  }
  // checkpoint.dir (common/spec/keys.cc): empty means no checkpoints; a relative path is taken
  // from the job directory. With a directory, stop and on-demand checkpoints are written even
  // when checkpoint.every_steps is 0 (no periodic ones then).
  ckpt_dir_ = spec_.checkpoint.dir;
  if (!ckpt_dir_.empty() && ckpt_dir_[0] != '/')
    ckpt_dir_ = (fs::path(job_dir_) / ckpt_dir_).lexically_normal().string();
  if (!ckpt_dir_.empty()) {
    // A checkpoint directory that cannot be written is said now, not at the first checkpoint
    // (which could be the stop checkpoint of a preemption). Created 0700: it holds the weights.
    std::error_code cec;
    if (!fs::exists(ckpt_dir_, cec)) {
      fs::create_directories(ckpt_dir_, cec);
      if (!cec) ::chmod(ckpt_dir_.c_str(), 0700);
    }
    if (cec || !fs::is_directory(ckpt_dir_, cec) || ::access(ckpt_dir_.c_str(), W_OK | X_OK) != 0) {
      std::cerr << "ringd: checkpoint.dir " << ckpt_dir_ << ": "
                << (cec ? cec.message()
                        : fs::is_directory(ckpt_dir_) ? std::string(std::strerror(errno))
                                                      : std::string("not a directory"))
                << "\n";
      return kExitFailed;
    }
  }
  spec_hash_ = ckpt::xxh3_hex(spec_text_.data(), spec_text_.size());
  worker_bin_ = find_worker_bin(o_.worker_bin);
  if (worker_bin_.empty() || access(worker_bin_.c_str(), X_OK) != 0) {
    std::cerr << "ringd: no ring-worker executable found (tried '" << worker_bin_
              << "'); give --worker-bin PATH or RING_WORKER_BIN\n";
    return kExitUsage;
  }

  wpn_ = static_cast<int>(spec_.resources.workers_per_node);
  world_ = wpn_ * o_.nodes;
  total_steps_ = o_.steps.value_or(spec_.train.steps);
  layout_ = std::make_unique<model::ParamLayout>(model::ModelConfig::from_spec(spec_));
  node_grad_.assign(static_cast<size_t>(layout_->total()), 0.f);

  // Placement: GPUs (CUDA backend) and cores for each local worker.
  try {
    placement::PlacementRequest req;
    req.workers = wpn_;
    req.cpus_per_worker = static_cast<int>(spec_.resources.cpus_per_worker);
    placement::GpuTopology gpus;
    if (spec_.resources.backend == spec::Backend::kCuda) {
      req.device = placement::Device::kGpu;
      gpus = placement::discover_gpus().topology;
    } else {
      req.device = placement::Device::kCpu;
    }
    placement_ = placement::place_workers(gpus, placement::discover_cpu_topology(), req);
  } catch (const std::exception& e) {
    std::cerr << "ringd: placement: " << e.what() << "\n";
    return kExitFailed;
  }

  // Control socket: a short path (108-byte limit) in a private per-user directory, marked so
  // that the next ringd removes it when this one is killed (owned_paths.h).
  try {
    sock_dir_ = make_control_dir([this](const std::string& n) { log(n); });
  } catch (const std::exception& e) {
    std::cerr << "ringd: control socket directory: " << e.what() << "\n";
    return kExitFailed;
  }
  sock_path_ = sock_dir_ + "/ctl.sock";
  struct RemoveOnExit {  // every way out of run(), exceptions included
    const std::string& dir;
    ~RemoveOnExit() { remove_own_dir(dir); }
  } remove_sock_dir{sock_dir_};
  acceptor_.open(local_stream());
  acceptor_.bind(local_stream::endpoint(sock_path_));
  acceptor_.listen();

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

  std::function<void(const boost::system::error_code&, int)> on_sig =
      [this, &on_sig](const boost::system::error_code& e, int sig) {
        if (e) return;
        on_signal(sig);
        if (!exiting_) signals_.async_wait(on_sig);
      };
  signals_.async_wait(on_sig);
  accept();
  tick_.expires_after(std::chrono::milliseconds(100));
  tick_.async_wait([this](const boost::system::error_code& e) {
    if (!e) on_tick();
  });

  if (!o_.coord.empty()) {
    // Register (node, GPUs, topology, the job) and learn the attempt to run.
    protocol::Register reg;
    reg.node = coord_node_name(std::stoll(o_.job), o_.node_rank);
    try {
      for (const placement::GpuInfo& g : placement::discover_gpus().topology.gpus)
        reg.gpus.push_back({g.index, g.name.empty() ? "unknown" : g.name,
                            static_cast<int64_t>(g.memory_mib)});
      const placement::CpuTopology cpu = placement::discover_cpu_topology();
      reg.topology.numa_nodes = std::max<int64_t>(1, static_cast<int64_t>(cpu.numa_nodes.size()));
      reg.topology.cpus = std::max<int64_t>(1, static_cast<int64_t>(cpu.cores.size()));
    } catch (const std::exception& e) {
      log(std::string("topology for ring-coord: ") + e.what());
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0)
      reg.topology.host_memory_mib = static_cast<int64_t>(pages) * page / (1024 * 1024);
    reg.topology.summary =
        fmt::format("{} GPU(s), {} core(s), {} NUMA node(s), {} worker(s) per node",
                    reg.gpus.size(), reg.topology.cpus, reg.topology.numa_nodes, wpn_);
    reg.ringd_version = "ringd 1 (protocol " + std::to_string(protocol::kVersion) + ")";
    try {
      coord_ = std::make_unique<CoordLink>(
          CoordLinkOptions{o_.coord, std::stoll(o_.job), reg},
          [this](const protocol::Message& m) { asio::post(io_, [this, m] { on_coord(m); }); });
    } catch (const std::exception& e) {
      std::cerr << "ringd: " << e.what() << "\n";
      return kExitUsage;
    }
    log(fmt::format("ring-coord {}: registering as node {} for job {}", o_.coord, reg.node, o_.job));
    std::optional<protocol::Assignment> a = coord_->wait_registered(std::chrono::seconds(30));
    if (!a) {
      attempt_ = 1;
      log("ring-coord did not answer within 30 s (or does not list the job): starting attempt 1; "
          "the link keeps trying and the coordinator reconciles when it answers");
    } else {
      log(fmt::format("ring-coord: job {} is {}, attempt {}, resume step {}", a->job, a->state,
                      a->attempt, a->resume_step));
      const std::string& st = a->state;
      int code = -1;
      if (st == "cancelled" || st == "cancelling") code = kExitCancelled;
      else if (st == "failed") code = kExitFailed;
      else if (st == "completed" || st == "completing") code = kExitOk;
      if (code >= 0) {
        log("nothing to run: the job is " + st);
        coord_.reset();
        return code;
      }
      attempt_ = static_cast<int>(std::max<int64_t>(1, a->attempt));
      if (a->resume_step > 0) resume_to_ = a->resume_step;
    }
  }

  start_attempt();
  io_.run();

  // Every exit path: no worker survives.
  for (Worker& w : workers_)
    if (w.running) kill(-w.pid, SIGKILL);
  for (Worker& w : workers_)
    if (w.running) waitpid(w.pid, nullptr, 0);
  if (coord_) {
    // A barrier: the coordinator answers this registration after it handled every report before.
    if (!coord_->sync_and_wait(std::chrono::seconds(5)))
      log("ring-coord did not confirm the last reports within 5 s");
    coord_.reset();
  }
  return exit_code_;
}

// ---- attempts ----------------------------------------------------------------------------------

void Daemon::start_attempt() {
  restart_pending_ = false;
  attempt_live_ = true;
  attempt_failed_ = false;
  stopping_workers_ = false;
  finishing_ = false;
  cur_step_ = 0;
  last_all_changed_ = true;
  have_master_ = false;
  done_step_ = 0;
  cursor_ = json();
  attempt_rdv_ = fmt::format("{}/attempt-{}", rdv_root_, attempt_);
  std::string rdv_error;
  if (!make_attempt_dirs(&rdv_error)) {
    fatal("rendezvous: " + rdv_error);
    return;
  }
  try {
    // The name carries this process's pid and the attempt, so a segment of that name is the
    // leftover of an earlier ringd that had the same pid and was killed before its workers
    // mapped it (shared memory outlives processes): replace it.
    const std::string shm = offload::shm_name(spec_.job.name, o_.node_rank, getpid(), attempt_);
    if (shm_unlink(shm.c_str()) == 0) log("removed a stale shared-memory segment " + shm);
    shm_ = offload::ShmRegion::create(shm, layout_->total(), wpn_);
  } catch (const std::exception& e) {
    log(std::string("fatal: ") + e.what());
    finish(kExitFailed);
    return;
  }
  workers_.assign(wpn_, Worker{});
  for (int l = 0; l < wpn_; ++l) {
    Worker& w = workers_[l];
    w.local = l;
    w.rank = o_.node_rank * wpn_ + l;
    w.log = fmt::format("{}/logs/worker-{}.log", job_dir_, w.rank);
    spawn(w);
    if (exiting_) return;  // fatal(): the workers already started are killed on the way out
  }
  if (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.running; })) {
    attempt_failed_ = true;
    stop_workers("a worker could not be started");
    return;
  }
  log(fmt::format("attempt {}: spawned {} workers (ranks {}..{}), rendezvous {}", attempt_, wpn_,
                  o_.node_rank * wpn_, o_.node_rank * wpn_ + wpn_ - 1, attempt_rdv_));
  try {
    optim::Exchange* ex = &local_exchange_;
    if (o_.nodes > 1) {
      exchange_ = std::make_unique<TransportExchange>(o_.transport, o_.node_rank, o_.nodes,
                                                      attempt_rdv_ + "/daemons", 120000, 60000);
      ex = exchange_.get();
    }
    opt_ = std::make_unique<optim::NodeOptimizer>(spec_, *layout_, total_steps_, o_.threads, ex);
    // Resume (asked for, or any restart): the newest complete checkpoint of every node.
    const bool want_resume =
        coord_ ? (o_.resume || resume_to_.value_or(0) > 0) : (o_.resume || attempt_ > 0);
    const int64_t max_step = resume_to_.value_or(0) > 0 ? *resume_to_ : INT64_MAX;
    if (want_resume && ckpt_dir_.empty()) {
      log("checkpoints are off (checkpoint.dir is empty): starting from step 0");
    } else if (want_resume) {
      std::vector<ckpt::LoadTarget> targets;
      for (const optim::StateTensor& t : opt_->state_tensors())
        targets.push_back({t.name, ckpt::DType::kF32, {t.size}, t.data});
      ckpt::LoadResult r =
          ckpt::load_latest(ckpt_dir_, o_.node_rank, o_.nodes, targets, max_step);
      if (o_.nodes > 1) {
        // Every node must resume from the same step: the smallest one any node loaded.
        int64_t mine = r.loaded ? r.step : -1;
        auto all = ex->allgather(&mine, sizeof(mine));
        int64_t least = mine;
        for (auto& b : all) {
          int64_t v;
          std::memcpy(&v, b.data(), sizeof(v));
          least = std::min(least, v);
        }
        if (least < 0 && r.loaded) {
          r.loaded = false;
          r.message = "another node has no checkpoint: starting from step 0";
        } else if (least >= 0 && least != mine) {
          r = ckpt::load_latest(ckpt_dir_, o_.node_rank, o_.nodes, targets, least);
        }
      }
      for (const std::string& sk : r.skipped) log("checkpoint skipped: " + sk);
      if (r.loaded) {
        if (!r.spec_hash.empty() && r.spec_hash != spec_hash_)
          log("note: checkpoint " + r.path + " was written with another spec (hash " +
              r.spec_hash + ", now " + spec_hash_ + ")");
        opt_->restore_step(r.step);
        have_master_ = true;
        done_step_ = r.step;
        cursor_ = r.meta.value("cursor", json());
        log(fmt::format("resuming from {} (step {})", r.path, r.step));
        event("resumed", {{"step", r.step}, {"path", r.path}});
      } else {
        log("no complete checkpoint in " + ckpt_dir_ + ": starting from step 0" +
            (r.message.empty() ? "" : " (" + r.message + ")"));
      }
    }
    if (!ckpt_dir_.empty()) {
      ckpt::Options co;
      co.dir = ckpt_dir_;
      co.keep_last = std::max<int64_t>(1, spec_.checkpoint.keep_last);
      co.node_rank = o_.node_rank;
      co.nodes = o_.nodes;
      co.tag = std::to_string(attempt_);
      co.spec_hash = spec_hash_;
      ck_ = std::make_unique<ckpt::Checkpointer>(co);
      for (const optim::StateTensor& t : opt_->state_tensors())
        ck_->add_tensor(t.name, ckpt::DType::kF32, {t.size}, t.data);
    }
  } catch (const ckpt::CheckpointMismatch& e) {
    // A sound checkpoint of another model: every restart would find the same one.
    fatal(std::string("cannot resume: ") + e.what());
    return;
  } catch (const std::exception& e) {
    log(std::string("attempt failed to start: ") + e.what());
    event("attempt_failed", {{"error", e.what()}});
    attempt_failed_ = true;
    stop_workers("the attempt could not start");
    return;
  }
  unblocked_at_ = Clock::now();  // the exchange bootstrap and the resume load blocked the loop
  if (coord_) coord_->set_progress(attempt_, done_step_);
  event("attempt_started", {{"workers", wpn_}, {"start_step", done_step_}});
}

void Daemon::spawn(Worker& w) {
  std::string why;
  const int fd = open_private_append(w.log, &why);
  if (fd < 0) {
    // No restart mends this (a job directory the user cannot write, a planted symlink).
    fatal(fmt::format("worker rank {}: {}", w.rank, why));
    return;
  }
  const std::string banner = fmt::format("=== attempt {} ===\n", attempt_);
  if (::write(fd, banner.data(), banner.size()) < 0) {
    const int e = errno;
    ::close(fd);
    fatal(fmt::format("worker rank {}: cannot write {}: {}", w.rank, w.log, std::strerror(e)));
    return;
  }
  // Everything the child needs is built before fork: ringd has other threads (the optimizer's
  // pipeline, the checkpoint writer, the ring-coord link), so between fork and exec only
  // async-signal-safe calls are made (no allocation, no setenv, no stdio).
  std::vector<std::string> args = {worker_bin_,
                                   "--spec",
                                   fs::absolute(o_.spec).string(),
                                   "--rank",
                                   std::to_string(w.rank),
                                   "--world",
                                   std::to_string(world_),
                                   "--rendezvous",
                                   attempt_rdv_ + "/workers",
                                   "--ringd",
                                   sock_path_,
                                   "--local-rank",
                                   std::to_string(w.local),
                                   "--transport",
                                   o_.transport};
  if (o_.worker_threads >= 0) {
    args.push_back("--threads");
    args.push_back(std::to_string(o_.worker_threads));
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const placement::WorkerPlacement& pl = placement_.workers[w.local];
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : pl.cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  const bool pin = !pl.cpus.empty();
  const std::string cuda = pl.cuda_visible_devices;
  // The environment: ours, with CUDA_VISIBLE_DEVICES replaced when placement chose a GPU.
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (cuda.empty() || std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0) env.emplace_back(*e);
  if (!cuda.empty()) env.push_back("CUDA_VISIBLE_DEVICES=" + cuda);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string exec_failed = "ringd: exec " + worker_bin_ + " failed, errno ";
  // Descriptors above 2 are closed in the child (common/proc/close_fds.h).
  const int max_fd = proc::descriptor_limit();
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    log(fmt::format("fork: {}", std::strerror(errno)));
    ::close(fd);
    return;
  }
  if (pid == 0) {
    // The child: its own process group (ringd stops it with the group), dies with ringd.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGCHLD, SIGUSR1, SIGUSR2, SIGHUP, SIGPIPE, SIGXFSZ}) sigaction(sig, &dfl, nullptr);
    // Stopping the job is ringd's business: Slurm (proctrack signals every process of the step)
    // and terminals send SIGTERM/SIGINT to the workers too, and a worker dying on it would look
    // like a failure before ringd has finished the step and written its checkpoint. ringd stops
    // workers with SIGUSR2, then SIGKILL; PR_SET_PDEATHSIG covers ringd's own death.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGTERM, &ign, nullptr);
    sigaction(SIGINT, &ign, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fd, 1);
    dup2(fd, 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != 0) dup2(devnull, 0);
    proc::close_descriptors_from(3, max_fd);
    if (pin) sched_setaffinity(0, sizeof(set), &set);
    execve(argv[0], argv.data(), envp.data());
    // Async-signal-safe report: the prepared text and the errno in decimal.
    const int e = errno;
    char num[16];
    int n = 0;
    for (int v = e; n == 0 || v > 0; v /= 10) num[n++] = static_cast<char>('0' + v % 10);
    if (::write(2, exec_failed.data(), exec_failed.size()) < 0) _exit(127);
    while (n > 0)
      if (::write(2, &num[--n], 1) < 0) _exit(127);
    if (::write(2, "\n", 1) < 0) _exit(127);
    _exit(127);
  }
  setpgid(pid, pid);
  ::close(fd);
  w.pid = pid;
  w.running = true;
  w.connected = w.mapped = w.done = false;
  w.buckets = 0;
  w.spawned = w.last_seen = Clock::now();
  std::string cpus;
  for (int c : pl.cpus) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
  log(fmt::format("worker rank {} (local {}) pid {} | cpus {}{}{}", w.rank, w.local, pid,
                  cpus.empty() ? "any" : cpus, pl.shared ? " (shared)" : "",
                  cuda.empty() ? "" : " | CUDA_VISIBLE_DEVICES=" + cuda));
  event("worker_started", {{"rank", w.rank}, {"pid", pid}, {"cpus", pl.cpus}});
}

void Daemon::stop_workers(const std::string& why) {
  int n = 0;
  for (Worker& w : workers_)
    if (w.running) {
      kill(-w.pid, kWorkerStopSignal);
      ++n;
    }
  if (!stopping_workers_ && n > 0) log(fmt::format("stopping {} workers: {}", n, why));
  stopping_workers_ = true;
  kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.stop_grace_s * 1e3));
  if (n == 0) asio::post(io_, [this] { end_attempt(); });
}

// A node other than 0 has written its shard of the checkpoint taken on a stop signal; node 0
// commits it once every shard is there. Exiting before that commit would let srun
// (--kill-on-bad-exit: exit 75 counts as bad) kill node 0 mid-commit, so wait for the step's
// final directory, bounded: Slurm's SIGKILL follows KillWait seconds after the SIGTERM anyway.
void Daemon::await_commit(int64_t step) {
  const fs::path final_dir = fs::path(ck_->options().dir) / ckpt::step_dir_name(step);
  const auto end = Clock::now() + std::chrono::seconds(10);
  std::error_code ec;
  while (!fs::exists(final_dir, ec) && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (fs::exists(final_dir, ec))
    log(fmt::format("checkpoint step {} committed by node 0", step));
  else
    log(fmt::format("checkpoint step {}: node 0 has not committed it within 10 s; exiting anyway",
                    step));
}

void Daemon::end_attempt() {
  if (!attempt_live_) return;
  for (const Worker& w : workers_)
    if (w.running) return;
  attempt_live_ = false;
  for (auto& c : conns_) {
    boost::system::error_code ec;
    c->sock.close(ec);
  }
  conns_.clear();
  const bool had_checkpointer = ck_ != nullptr;
  if (ck_) {
    int64_t saved = stop_ckpt_saved_;  // the newest checkpoint this node wrote its shard of
    // Every checkpoint of the attempt, the one in flight included (node 0 may still be
    // committing it): ring-coord resumes from the newest one reported saved.
    for (const ckpt::SaveResult& r : ck_->drain())
      if (report_checkpoint(r)) saved = std::max(saved, r.step);
    if (stop_requested() && o_.node_rank > 0 && saved == done_step_ && saved > 0)
      await_commit(saved);
    ck_.reset();
  }
  opt_.reset();
  exchange_.reset();
  shm_ = offload::ShmRegion();
  if (o_.node_rank == 0) {
    std::string why;
    if (!remove_own_dir(attempt_rdv_, &why)) log("rendezvous directory left in place: " + why);
  }
  if (coord_ && rollback_pending_ && !stop_requested()) {
    rollback_pending_ = false;
    attempt_ = static_cast<int>(rollback_attempt_);
    resume_to_ = rollback_step_;
    log(fmt::format("ring-coord: roll back to attempt {} from step {}", attempt_, rollback_step_));
    restart_pending_ = true;
    restart_at_ = Clock::now();
    return;
  }
  if (coord_ && coord_stop_ && !stop_requested()) {
    log(fmt::format("stopped at step {} by ring-coord ({})", done_step_, coord_stop_reason_));
    event("stopped", {{"step", done_step_}, {"reason", coord_stop_reason_}});
    await_coord(kAwaitState, 10);
    return;
  }
  if (!attempt_failed_ && had_checkpointer && final_checkpoint_failed()) return;
  if (!attempt_failed_) {
    if (stop_requested()) {
      log(fmt::format("stopped at step {} on request (resumable)", done_step_));
      event("stopped", {{"step", done_step_}});
      finish(kExitStopped);
    } else {
      log(fmt::format("completed {} steps", done_step_));
      event("completed", {{"step", done_step_}});
      finish(kExitOk);
    }
    return;
  }
  if (stop_requested()) {
    event("stopped", {{"step", done_step_}});
    finish(kExitStopped);
    return;
  }
  if (coord_) {
    // ring-coord heard of the death (worker_died) and applies the restart policy: it sends stop,
    // then roll_back (or stop alone when restarts are exhausted). Silent: ringd's own policy.
    log("attempt failed: waiting for ring-coord's decision (roll back or stop)");
    await_coord(kAwaitAfterFailure, 15);
    return;
  }
  apply_restart_policy();
}

void Daemon::apply_restart_policy() {
  if (restarts_ < spec_.restart.max_restarts) {
    const double delay =
        std::min(spec_.restart.backoff_s * std::pow(2.0, restarts_), spec_.restart.backoff_max_s);
    ++restarts_;
    ++attempt_;
    if (coord_) resume_to_ = INT64_MAX;  // the newest complete checkpoint
    log(fmt::format("restart {} of {} in {:.1f} s (attempt {})", restarts_,
                    spec_.restart.max_restarts, delay, attempt_));
    event("restarting", {{"restart", restarts_}, {"delay_s", delay}});
    restart_pending_ = true;
    restart_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(delay * 1e3));
    return;
  }
  log(fmt::format("failed: restart.max_restarts ({}) exhausted", spec_.restart.max_restarts));
  event("failed", {{"step", done_step_}, {"restarts", restarts_}});
  finish(kExitFailed);
}

void Daemon::finish(int code) {
  exit_code_ = code;
  exiting_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  signals_.cancel(ec);
  tick_.cancel();
  io_.stop();
}

// An error that no restart can mend (a log that cannot be opened, a rendezvous directory that
// is not ours): say it on stderr whatever the output mode (ringctl shows ringd's stderr), in the
// log and as the `failed` event, and exit 1 at once instead of retrying.
void Daemon::fatal(const std::string& why) {
  if (exiting_) return;
  log("fatal: " + why);
  if (o_.json) std::cerr << "ringd: " << why << std::endl;  // log() wrote it otherwise
  event("failed", {{"step", done_step_}, {"error", why}});
  fatal_error_ = why;
  attempt_failed_ = true;
  finish(kExitFailed);
}

void Daemon::remove_stale_attempts() {
  std::error_code ec;
  fs::directory_iterator it(rdv_root_, ec), end;
  std::vector<std::string> stale;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("attempt-", 0) == 0) stale.push_back(it->path().string());
  }
  for (const std::string& d : stale) {
    std::string why;
    if (remove_own_dir(d, &why)) log("removed the rendezvous of an earlier run: " + d);
    else log("left in place (not a rendezvous directory ringd made): " + why);
  }
}

// <rdv>/attempt-<A>/{workers,daemons}: created 0700 and marked as ringd's (owned_paths.h), so
// that only they are ever removed. With several nodes another node may have made it already
// (same user); with one node an existing unmarked directory is not ours and is refused.
bool Daemon::make_attempt_dirs(std::string* why) {
  try {
    std::error_code ec;
    if (!fs::exists(rdv_root_, ec)) {
      fs::create_directories(rdv_root_, ec);
      if (ec) throw PathError("cannot create " + rdv_root_ + ": " + ec.message());
      ::chmod(rdv_root_.c_str(), 0700);
    }
    const bool existed = fs::exists(fs::symlink_status(attempt_rdv_, ec));
    ensure_own_dir(attempt_rdv_, 0022);
    if (existed && o_.nodes == 1 && !is_own_marked_dir(attempt_rdv_))
      throw PathError(attempt_rdv_ +
                      " exists and was not made by ringd (no marker); choose another "
                      "--rendezvous or remove it");
    mark_own_dir(attempt_rdv_, fmt::format("ringd rendezvous of job {} attempt {}",
                                           spec_.job.name, attempt_));
    ensure_own_dir(attempt_rdv_ + "/workers", 0022);
    ensure_own_dir(attempt_rdv_ + "/daemons", 0022);
    return true;
  } catch (const std::exception& e) {
    *why = e.what();
    return false;
  }
}

// ---- sockets -----------------------------------------------------------------------------------

void Daemon::accept() {
  auto c = std::make_shared<Conn>(io_);
  acceptor_.async_accept(c->sock, [this, c](const boost::system::error_code& e) {
    if (e) return;
    conns_.push_back(c);
    read(c);
    accept();
  });
}

void Daemon::read(std::shared_ptr<Conn> c) {
  asio::async_read_until(
      c->sock, c->buf, '\n', [this, c](const boost::system::error_code& e, size_t n) {
        if (exiting_) return;
        if (e == asio::error::not_found) {  // kMaxControlLine bytes and no newline
          protocol_error(c, fmt::format("sent a control message longer than the {} byte limit",
                                        kMaxControlLine));
          return;
        }
        if (e) {
          conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
          return;
        }
        std::string line(asio::buffers_begin(c->buf.data()),
                         asio::buffers_begin(c->buf.data()) + n);
        c->buf.consume(n);
        json m = json::parse(line, nullptr, false);
        if (m.is_discarded() || !m.is_object()) {
          protocol_error(c, "sent a message that is not a JSON object: " + line.substr(0, 200));
          return;
        }
        // A field of the wrong type or out of range is the worker's protocol error: it fails that
        // worker, never the daemon. Lines are parsed and checked by the one parser both ends
        // share (worker/offload/control.h, fuzzed); ringd acts only on the parsed message.
        try {
          on_message(c, offload::control::worker_from_json(m));
        } catch (const offload::control::ControlError& x) {
          protocol_error(c, std::string("sent a malformed message: ") + x.what());
          return;
        } catch (const ProtocolError& x) {
          protocol_error(c, std::string("sent a malformed '") +
                                (m.contains("t") && m["t"].is_string()
                                     ? m["t"].get<std::string>()
                                     : std::string("?")) +
                                "' message: " + x.what());
          return;
        } catch (const json::exception& x) {
          protocol_error(c, std::string("sent a malformed '") +
                                (m.contains("t") && m["t"].is_string()
                                     ? m["t"].get<std::string>()
                                     : std::string("?")) +
                                "' message (" + x.what() + "): " + line.substr(0, 200));
          return;
        }
        if (c->sock.is_open()) read(c);
      });
}

std::string Daemon::peer_name(const std::shared_ptr<Conn>& c) const {
  if (c->local >= 0 && c->local < static_cast<int>(workers_.size()))
    return fmt::format("worker rank {} (local {}, pid {})", workers_[c->local].rank, c->local,
                       workers_[c->local].pid);
  return "a control connection that has not said hello";
}

// A message that breaks the protocol: the worker that sent it is failed (killed, the attempt
// ends as after any worker failure); a connection that is not a worker yet is closed. ringd
// itself goes on.
void Daemon::protocol_error(const std::shared_ptr<Conn>& c, const std::string& what) {
  const std::string who = peer_name(c);
  boost::system::error_code ec;
  c->sock.close(ec);
  conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
  if (c->local >= 0 && workers_[c->local].running && !stopping_workers_) {
    worker_failed(workers_[c->local], "protocol error: " + what);
  } else {
    log(fmt::format("protocol error from {}: {}; connection closed", who, what));
  }
}

void Daemon::send(int local, const json& m) {
  for (auto& c : conns_)
    if (c->local == local) {
      write(c, m);
      return;
    }
}

void Daemon::write(const std::shared_ptr<Conn>& c, const json& m) {
  if (!c->sock.is_open()) return;
  std::string s = m.dump() + "\n";
  c->out_bytes += s.size();
  c->out.push_back(std::move(s));
  if (c->out_bytes > kMaxQueuedBytes) {
    protocol_error(c, fmt::format("does not read its control socket ({} bytes waiting)",
                                  c->out_bytes));
    return;
  }
  if (!c->writing) write_next(c);
}

void Daemon::write_next(const std::shared_ptr<Conn>& c) {
  if (c->out.empty() || !c->sock.is_open()) {
    c->writing = false;
    if (c->close_after) {
      boost::system::error_code ec;
      c->sock.close(ec);
    }
    return;
  }
  c->writing = true;
  asio::async_write(c->sock, asio::buffer(c->out.front()),
                    [this, c](const boost::system::error_code& e, size_t) {
                      if (e) {  // the worker is gone: SIGCHLD tells the rest
                        c->out.clear();
                        c->out_bytes = 0;
                        c->writing = false;
                        return;
                      }
                      c->out_bytes -= c->out.front().size();
                      c->out.pop_front();
                      write_next(c);
                    });
}

void Daemon::on_message(const std::shared_ptr<Conn>& c,
                        const offload::control::WorkerMessage& msg) {
  namespace ctl = offload::control;
  if (const auto* h = std::get_if<ctl::Hello>(&msg)) {
    if (c->local >= 0) throw ProtocolError("a second hello on one connection");
    const int local = static_cast<int>(h->local);
    // Who is really at the other end (SO_PEERCRED), not what the message says.
    ucred cred{};
    socklen_t len = sizeof(cred);
    const bool have_cred =
        getsockopt(c->sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    std::string why;
    if (!have_cred || cred.uid != geteuid())
      why = have_cred ? fmt::format("uid {} is not ringd's", cred.uid) : "no peer credentials";
    else if (local >= wpn_ || !workers_[local].running)
      why = fmt::format("local rank {} is not a worker of this attempt", local);
    else if (h->rank != workers_[local].rank)
      why = fmt::format("rank {} should be {}", h->rank, workers_[local].rank);
    else if (h->n != layout_->total())
      why = fmt::format("model of {} floats, ringd's has {} (same spec?)", h->n, layout_->total());
    else if (h->pid != workers_[local].pid || cred.pid != workers_[local].pid)
      why = fmt::format("pid {} (connected from pid {}) is not the worker ringd spawned", h->pid,
                        cred.pid);
    else if (workers_[local].connected)
      why = fmt::format("local rank {} is connected already", local);
    if (!why.empty()) {
      log("refused a worker: " + why);
      c->close_after = true;
      write(c, {{"t", "stop"}, {"reason", why}});
      return;
    }
    c->local = local;
    Worker& w = workers_[local];
    w.connected = true;
    w.last_seen = Clock::now();
    send(local, {{"t", "welcome"},
                 {"shm", shm_.name()},
                 {"start_step", done_step_},
                 {"need_init", !have_master_ && local == 0},
                 {"cursor", cursor_}});
    return;
  }
  if (c->local < 0)
    throw ProtocolError("'" + ctl::to_json(msg).value("t", std::string("?")) + "' before hello");
  Worker& w = workers_[c->local];
  w.last_seen = Clock::now();
  if (stopping_workers_) return;
  if (std::holds_alternative<ctl::Mapped>(msg)) {
    w.mapped = true;
    if (std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.mapped; })) {
      shm_.unlink();
      log(fmt::format("all {} workers connected; shared memory {} ({:.1f} MiB) mapped and unlinked",
                      wpn_, shm_.name(), shm_.bytes() / 1048576.0));
      maybe_begin();
    }
  } else if (std::holds_alternative<ctl::Init>(msg)) {
    if (c->local == 0 && !have_master_) {
      opt_->init_master(shm_.params());
      have_master_ = true;
      log("master weights initialised from rank " + std::to_string(w.rank));
      maybe_begin();
    }
  } else if (const auto* b = std::get_if<ctl::Bucket>(&msg)) {
    if (b->step != cur_step_) {
      worker_failed(w, fmt::format("sent bucket of step {} during step {}", b->step, cur_step_));
      return;
    }
    on_bucket(w, static_cast<int>(b->b));
  } else if (const auto* d = std::get_if<ctl::Done>(&msg)) {
    if (d->step != cur_step_) {
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
  if (cur_step_ != 0 || finishing_ || !have_master_ || stopping_workers_) return;
  if (!std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.mapped; }))
    return;
  begin_step();
}

void Daemon::begin_step() {
  const int64_t s = done_step_ + 1;
  // One node decides alone; several stop after the step in which all of them learnt of it.
  const bool stop_now = stop_agreed_ || (stop_signals_ > 0 && o_.nodes == 1);
  if (s > total_steps_ || stop_now) {
    if (ck_ && stop_signals_ < 2 && last_ckpt_step_ != done_step_ && done_step_ > 0)
      checkpoint_now(done_step_, true);
    finishing_ = true;
    stop_deadline_ = Clock::now() + std::chrono::seconds(60);
    for (const Worker& w : workers_)
      send(w.local, {{"t", "stop"}, {"reason", stop_requested() ? "stop requested" : "done"}});
    return;
  }
  const int64_t n = layout_->total();
  int64_t changed = -1;
  const float* master = opt_->master();
  if (last_all_changed_) {
    // Dense: the whole copy (also the first step of every attempt: workers start from nothing).
    std::memcpy(shm_.params(), master, static_cast<size_t>(n) * sizeof(float));
  } else {
    const std::vector<int64_t>& ch = opt_->changed();
    uint32_t* idx = shm_.index();
    float* dst = shm_.params();
    for (size_t i = 0; i < ch.size(); ++i) {
      idx[i] = static_cast<uint32_t>(ch[i]);
      dst[ch[i]] = master[ch[i]];
    }
    changed = static_cast<int64_t>(ch.size());
  }
  for (Worker& w : workers_) {
    w.buckets = 0;
    w.done = false;
  }
  cur_step_ = s;
  buckets_ready_ = 0;
  opt_->begin_step(s);
  step_t0_ = Clock::now();
  for (const Worker& w : workers_)
    send(w.local,
         {{"t", "params"}, {"step", s}, {"changed", changed}, {"stop", stop_signals_ > 0}});
}

void Daemon::on_bucket(Worker& w, int b) {
  const int nb = static_cast<int>(layout_->buckets().size());
  if (b != w.buckets || b >= nb) {
    worker_failed(w, fmt::format("sent bucket {} when {} was due", b, w.buckets));
    return;
  }
  ++w.buckets;
  while (buckets_ready_ < nb &&
         std::all_of(workers_.begin(), workers_.end(),
                     [&](const Worker& x) { return x.buckets > buckets_ready_; })) {
    const model::GradBucket& bk = layout_->buckets()[buckets_ready_];
    float* dst = node_grad_.data() + bk.begin;
    const int64_t len = bk.end - bk.begin;
    // The node's gradient: the workers' slots summed in local-rank order (deterministic).
    std::memcpy(dst, shm_.grads(0) + bk.begin, static_cast<size_t>(len) * sizeof(float));
    for (int l = 1; l < wpn_; ++l) {
      const float* src = shm_.grads(l) + bk.begin;
      for (int64_t i = 0; i < len; ++i) dst[i] += src[i];
    }
    if (ck_ && ck_->busy()) {
      // The optimizer is about to change the state the checkpoint is still writing.
      const auto t0 = Clock::now();
      const std::vector<ckpt::SaveResult> done = ck_->drain();
      const Clock::duration stalled = Clock::now() - t0;
      ckpt_stall_s_ += std::chrono::duration<double>(stalled).count();
      blocked_ += stalled;
      unblocked_at_ = Clock::now();
      for (const ckpt::SaveResult& r : done) report_checkpoint(r);
    }
    opt_->bucket_ready(bk.index, dst);
    ++buckets_ready_;
  }
  maybe_finish_step();
}

void Daemon::maybe_finish_step() {
  const int nb = static_cast<int>(layout_->buckets().size());
  if (cur_step_ == 0 || buckets_ready_ < nb) return;
  if (!std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.done; }))
    return;
  optim::StepResult r;
  try {
    Blocking b{this};
    r = opt_->finish_step();
  } catch (const std::exception& e) {
    log(fmt::format("step {}: optimizer failed: {}", cur_step_, e.what()));
    event("optimizer_failed", {{"step", cur_step_}, {"error", e.what()}});
    attempt_failed_ = true;
    stop_workers("the optimizer failed");
    return;
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - step_t0_).count();
  done_step_ = cur_step_;
  cur_step_ = 0;
  last_all_changed_ = r.all_changed;
  const offload::control::Done& d = workers_[0].done_msg;
  cursor_ = d.cursor;
  if (!stop_agreed_ && d.stop) {
    stop_agreed_ = true;
    log(stop_signals_ > 0
            ? fmt::format("step {}: every node knows of the stop: checkpoint, then stop", done_step_)
            : fmt::format("step {}: another node was asked to stop: checkpoint, then stop",
                          done_step_));
    if (stop_signals_ == 0) {
      event("stopping", {{"step", done_step_}, {"from", "another node"}});
      stop_deadline_ = Clock::now() + std::chrono::seconds(60);
    }
  }
  // loss_sum is NaN when the worker's loss was NaN or infinite (JSON null).
  const double loss_sum = d.loss_sum;
  const int64_t valid = d.valid;
  const int64_t tokens = d.tokens;
  train::StepStats st;
  st.step = done_step_;
  st.loss = valid > 0 ? loss_sum / static_cast<double>(valid) : 0.0;
  st.tokens = tokens;
  st.valid = valid;
  st.grad_norm = r.grad_norm;
  st.lr = r.lr;
  st.step_ms = wall_s * 1e3;
  st.tokens_per_s = wall_s > 0 ? tokens / wall_s : 0;
  json j = json::parse(train::step_json(st));
  j["attempt"] = attempt_;
  j["comm_s"] = d.ring_wait_ms / 1e3;
  j["optimizer_s"] = r.optimizer_s;
  j["exposed_optimizer_s"] = r.exposed_s;
  j["bytes_exchanged"] = r.bytes_sent;
  j["bytes_dense"] = r.bytes_dense;
  j["compressed"] = r.compressed;
  if (o_.hash_weights) {
    char h[17];
    std::snprintf(h, sizeof(h), "%016llx",
                  static_cast<unsigned long long>(
                      fnv1a(opt_->master(), static_cast<size_t>(layout_->total()) * 4)));
    j["weights_xxh"] = h;
    log_line(fmt::format("step {} weights {}", done_step_, h));
  }
  if (o_.node_rank == 0) {
    const std::string line = j.dump();
    std::string why;
    if (!steps_file_.write_line(line, &why) && !steps_write_failed_) {
      steps_write_failed_ = true;  // said once; the step reports still reach ring-coord
      log(why + " (steps are no longer recorded there)");
    }
    if (o_.json) {
      out_line(line);
    } else if (done_step_ % std::max<int64_t>(1, spec_.train.log_every) == 0 || done_step_ == 1 ||
               done_step_ == total_steps_) {
      std::cerr << fmt::format("{} | optimizer {:.1f} ms ({:.1f} exposed) | {:.2f} MB exchanged",
                               train::format_step(st), r.optimizer_s * 1e3, r.exposed_s * 1e3,
                               r.bytes_sent / 1e6)
                << std::endl;
    }
  }
  if (coord_) {
    coord_->set_progress(attempt_, done_step_);
    coord_->send(protocol::StepReport{coord_->node(), coord_->job(), attempt_, done_step_, st.loss,
                                      st.tokens_per_s, wall_s, j["comm_s"].get<double>()});
  }
  if (ck_ && ((spec_.checkpoint.every_steps > 0 &&
               done_step_ % spec_.checkpoint.every_steps == 0 && done_step_ < total_steps_) ||
              ckpt_requested_)) {
    if (ckpt_requested_) log(fmt::format("checkpoint at step {} (asked by ring-coord)", done_step_));
    ckpt_requested_ = false;
    checkpoint_now(done_step_, false);
  }
  begin_step();
}

// Logs a finished checkpoint and reports it (ring-coord resumes from the steps reported saved).
bool Daemon::report_checkpoint(const ckpt::SaveResult& r) {
  if (r.ok) {
    ckpt_ok_.insert(r.step);
    ckpt_failed_.erase(r.step);
  } else if (!ckpt_ok_.count(r.step)) {
    ckpt_failed_[r.step] = r.error;
  }
  if (r.ok) {
    log(fmt::format("checkpoint step {} saved: {} ({:.1f} MB in {:.2f} s)", r.step, r.path,
                    r.bytes / 1e6, r.total_s));
    event("checkpoint_saved", {{"step", r.step}, {"path", r.path}, {"bytes", r.bytes}});
  } else {
    log(fmt::format("checkpoint step {} failed: {}", r.step, r.error));
    event("checkpoint_failed", {{"step", r.step}, {"error", r.error}});
  }
  return r.ok;
}

// The run ends (every step done, or a resumable stop) and its last checkpoint, of the step it
// ends at, failed (a full disk): the exit status must not say "completed" or "resumable from
// here" when the newest weights on disk are older. Exit 1 naming the failed checkpoint, the
// reason and the newest complete checkpoint; ring-coord hears it as checkpoint_failed.
bool Daemon::final_checkpoint_failed() {
  auto it = ckpt_failed_.find(done_step_);
  if (done_step_ <= 0 || it == ckpt_failed_.end() || ckpt_ok_.count(done_step_)) return false;
  const std::string msg = fmt::format(
      "the {} checkpoint (step {}) failed: {}; the newest complete checkpoint is {}",
      stop_requested() ? "stop" : "final", done_step_, it->second, newest_complete_checkpoint());
  event("checkpoint_failed", {{"step", done_step_}, {"error", msg}, {"final", true}});
  fatal(msg);
  return true;
}

std::string Daemon::newest_complete_checkpoint() {
  try {
    const std::vector<ckpt::CheckpointInfo> all = ckpt::list_checkpoints(ckpt_dir_, false);
    for (auto it = all.rbegin(); it != all.rend(); ++it)
      if (it->status == ckpt::Status::kComplete)
        return fmt::format("{} (step {})", it->path, it->step);
    return "none (in " + ckpt_dir_ + ")";
  } catch (const std::exception& e) {
    return std::string("unknown (") + e.what() + ")";
  }
}

void Daemon::checkpoint_now(int64_t step, bool wait) {
  if (!ck_) return;
  ck_->start(step, {{"cursor", cursor_}, {"attempt", attempt_}, {"world", world_}});
  last_ckpt_step_ = step;
  if (wait) {
    Blocking b{this};
    for (const ckpt::SaveResult& r : ck_->drain())
      if (report_checkpoint(r) && r.step == step) stop_ckpt_saved_ = r.step;
  }
}

// ---- watching ----------------------------------------------------------------------------------

void Daemon::on_signal(int sig) {
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
  if (stop_signals_ == 1 && unblocked < std::chrono::seconds(1)) {
    log(fmt::format("{} again within 1 s: taken as the same stop request", strsignal(sig)));
    return;
  }
  if (stop_signals_ == 0) {
    first_stop_signal_ = now;
    blocked_at_first_signal_ = blocked_;
  }
  ++stop_signals_;
  if (stop_signals_ == 1) {
    log(fmt::format("{}: finishing the step, checkpoint, then stop", strsignal(sig)));
    event("stopping", {{"signal", sig}, {"step", done_step_}});
    if (!attempt_live_) {
      finish(kExitStopped);
      return;
    }
    stop_deadline_ = Clock::now() + std::chrono::seconds(60);
    if (cur_step_ == 0 && !finishing_) {
      const bool ready =
          have_master_ &&
          std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.mapped; });
      if (ready) begin_step();  // sends stop (after the checkpoint)
      else stop_workers("stop requested before the first step");
    }
  } else {
    log(fmt::format("{} again: stopping the workers now, no checkpoint", strsignal(sig)));
    if (!attempt_live_) {
      finish(kExitStopped);
      return;
    }
    attempt_failed_ = true;
    stop_workers("second stop signal");
  }
}

void Daemon::reap() {
  // Every child that has ended, those killed by a signal first: when one worker is killed its
  // peers fail within milliseconds, and a busy ringd reaps them all at once; the killed one is
  // the cause to report. reap_ended also waits briefly for a killed worker that is a zombie but
  // not yet reapable (its threads still exiting) when only its peers' failures are in.
  std::vector<pid_t> watched;
  for (const Worker& w : workers_)
    if (w.running) watched.push_back(w.pid);
  const bool expected = finishing_ || stopping_workers_;
  const std::vector<std::pair<pid_t, int>> ended = proc::reap_ended(
      watched, [](int st) { return WIFSIGNALED(st) && WTERMSIG(st) != kWorkerStopSignal; },
      expected ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000));
  for (const auto& [got, st] : ended) {
    for (Worker& w : workers_) {
      if (w.pid != got || !w.running) continue;
      w.running = false;
      const bool clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (finishing_ && clean) {
        log(fmt::format("worker rank {} exited", w.rank));
        event("worker_exited", {{"rank", w.rank}, {"pid", got}, {"exit_code", 0}});
      } else if (stopping_workers_) {
        const bool ours = WIFSIGNALED(st) && WTERMSIG(st) == kWorkerStopSignal;
        log(fmt::format("worker rank {} (pid {}) {}", w.rank, got,
                        ours ? std::string("stopped") : describe_status(st)));
      } else {
        const std::vector<std::string> lines = last_lines(w.log, 10);
        std::string text;
        for (const std::string& l : lines) text += "\n    | " + l;
        log(fmt::format("worker rank {} (pid {}) {} during step {}; last log lines:{}", w.rank, got,
                        describe_status(st), cur_step_, text));
        json ev{{"rank", w.rank}, {"pid", got}, {"step", cur_step_}, {"last_lines", lines}};
        if (WIFSIGNALED(st)) {
          ev["signal"] = WTERMSIG(st);
          ev["signal_name"] = strsignal(WTERMSIG(st));
        } else if (WIFEXITED(st)) {
          ev["exit_code"] = WEXITSTATUS(st);
        }
        event("worker_died", ev);
        attempt_failed_ = true;
        stop_workers(fmt::format("rank {} died", w.rank));
      }
    }
  }
  if (attempt_live_ &&
      std::none_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }))
    end_attempt();
}

void Daemon::worker_failed(Worker& w, const std::string& what) {
  log(fmt::format("worker rank {} (pid {}) {}: killing it", w.rank, w.pid, what));
  event("worker_failed", {{"rank", w.rank}, {"pid", w.pid}, {"error", what}});
  attempt_failed_ = true;
  if (w.running) kill(-w.pid, SIGKILL);
  stop_workers(fmt::format("rank {} failed", w.rank));
}

void Daemon::on_tick() {
  const auto now = Clock::now();
  if (attempt_live_ && !stopping_workers_) {
    for (Worker& w : workers_) {
      if (!w.running) continue;
      const double silent =
          std::chrono::duration<double>(now - std::max(w.last_seen, unblocked_at_)).count();
      if (w.connected && silent > o_.heartbeat_timeout_s) {
        worker_failed(w, fmt::format("sent no heartbeat for {:.1f} s (hung)", silent));
        break;
      }
      if (!w.connected && silent > o_.startup_timeout_s) {
        worker_failed(w, fmt::format("did not connect within {:.0f} s", o_.startup_timeout_s));
        break;
      }
    }
    if ((finishing_ || stop_requested()) && now > stop_deadline_) {
      attempt_failed_ = finishing_ ? attempt_failed_ : true;
      stop_workers("workers did not stop in time");
    }
  }
  if (stopping_workers_ && now > kill_at_) {
    for (Worker& w : workers_)
      if (w.running) kill(-w.pid, SIGKILL);
    kill_at_ = now + std::chrono::seconds(3600);
  }
  if (ck_) {
    while (auto r = ck_->poll()) report_checkpoint(*r);
  }
  if (restart_pending_ && now >= restart_at_) start_attempt();
  if (await_ != kAwaitNone && !attempt_live_ && !restart_pending_ && now > await_deadline_) {
    const int was = await_;
    await_ = kAwaitNone;
    if (was == kAwaitAfterFailure) {
      log("ring-coord did not answer: applying the spec's restart policy here");
      apply_restart_policy();
    } else {
      log("ring-coord did not say how to go on after its stop: exiting (resumable)");
      finish(kExitStopped);
    }
  }
  if (exiting_) return;
  tick_.expires_after(std::chrono::milliseconds(100));
  tick_.async_wait([this](const boost::system::error_code& e) {
    if (!e) on_tick();
  });
}

// ---- ring-coord -------------------------------------------------------------------------------
// Messages from the coordinator arrive on the link thread and are posted here (the event loop).

void Daemon::await_coord(int what, double seconds) {
  await_ = what;
  await_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
  if (what == kAwaitState) coord_->sync();  // the answer (registered) carries the job's state
}

void Daemon::on_coord(const protocol::Message& m) {
  if (exiting_) return;
  if (const auto* c = std::get_if<protocol::Command>(&m)) {
    on_command(*c);
  } else if (const auto* r = std::get_if<protocol::Registered>(&m)) {
    for (const protocol::Assignment& a : r->jobs)
      if (a.job == coord_->job() && await_ == kAwaitState) coord_decide(a.state);
  } else if (const auto* e = std::get_if<protocol::ErrorReply>(&m)) {
    log(fmt::format("ring-coord: {} ({}{}{})", e->message, e->code, e->field.empty() ? "" : ", ",
                    e->field));
  }
}

void Daemon::on_command(const protocol::Command& c) {
  const char* kind = protocol::to_string(c.command);
  if (c.job != coord_->job()) {
    coord_->ack(c.id, false, fmt::format("this ringd serves job {}, not {}", coord_->job(), c.job));
    return;
  }
  log(fmt::format("ring-coord: {} (attempt {}, step {}): {}", kind, c.attempt, c.step, c.reason));
  event("command", {{"command", kind}, {"id", c.id}, {"reason", c.reason}});
  switch (c.command) {
    case protocol::CommandKind::kCheckpointNow:
      if (!attempt_live_ || finishing_) {
        coord_->ack(c.id, false, "no attempt is training on this node now");
      } else if (!ck_) {
        coord_->ack(c.id, false, "checkpoints are off for this job (checkpoint.dir is empty)");
      } else {
        ckpt_requested_ = true;  // maybe_finish_step: at the next step boundary
        coord_->ack(c.id, true);
      }
      return;
    case protocol::CommandKind::kStop:
      coord_->ack(c.id, true);
      if (coord_stop_ && await_ != kAwaitRollBack) return;  // already stopping
      coord_stop_ = true;
      coord_stop_reason_ = c.reason;
      rollback_pending_ = false;
      if (attempt_live_) {
        stop_workers("ring-coord: " + c.reason);  // end_attempt() goes on
      } else {
        restart_pending_ = false;
        event("stopped", {{"step", done_step_}, {"reason", c.reason}});
        await_coord(kAwaitState, 10);
      }
      return;
    case protocol::CommandKind::kRollBack:
      coord_->ack(c.id, true);
      if (attempt_live_ && c.attempt == attempt_ && !stopping_workers_) return;  // on it already
      coord_stop_ = false;
      await_ = kAwaitNone;
      if (attempt_live_) {
        rollback_pending_ = true;
        rollback_attempt_ = c.attempt;
        rollback_step_ = c.step;
        stop_workers(fmt::format("ring-coord: roll back to attempt {}", c.attempt));
      } else {
        attempt_ = static_cast<int>(c.attempt);
        resume_to_ = c.step;
        log(fmt::format("ring-coord: starting attempt {} from step {}", attempt_, c.step));
        restart_pending_ = true;
        restart_at_ = Clock::now();
      }
      return;
  }
}

void Daemon::coord_decide(const std::string& state) {
  log("ring-coord: the job is " + state);
  if (state == "cancelling" || state == "cancelled") {
    await_ = kAwaitNone;
    finish(kExitCancelled);
  } else if (state == "failed") {
    await_ = kAwaitNone;
    finish(kExitFailed);
  } else if (state == "completed" || state == "completing") {
    await_ = kAwaitNone;
    finish(kExitOk);
  } else {
    // restarting (or starting/running after a restart request): roll_back comes after the
    // coordinator's backoff.
    await_coord(kAwaitRollBack, spec_.restart.backoff_max_s + 60);
  }
}

}  // namespace

// ---- entry -------------------------------------------------------------------------------------

Options parse_options(int argc, char** argv) try {
  Options o;
  flags::FlagSet fs(kUsage);
  // Grouped by kind; the order of the command line is what counts.
  fs.text("--spec", &o.spec)
      .text("--job-dir", &o.job_dir)
      .text("--coord", &o.coord)
      .text("--job", &o.job)
      .text("--rendezvous", &o.rendezvous)
      .text("--worker-bin", &o.worker_bin)
      .text("--transport", &o.transport);
  fs.integer("--node-rank", &o.node_rank, 0, 65535)
      .integer("--nodes", &o.nodes, 1, 65536)
      .integer("--steps", &o.steps, 1, int64_t{1} << 40)
      .integer("--threads", &o.threads, 0, 4096)
      .integer("--worker-threads", &o.worker_threads, 0, 4096);
  fs.seconds("--heartbeat-timeout", &o.heartbeat_timeout_s)
      .seconds("--startup-timeout", &o.startup_timeout_s)
      .seconds("--stop-grace", &o.stop_grace_s);
  fs.toggle("--resume", &o.resume).toggle("--json", &o.json).toggle("--hash-weights", &o.hash_weights);
  fs.parse(argc, argv);
  const bool node_given = fs.seen("--node-rank"), nodes_given = fs.seen("--nodes");
  if (o.spec.empty()) usage_error("--spec FILE is required");
  if (node_given != nodes_given) usage_error("--node-rank and --nodes go together");
  if (!node_given) {
    const char* id = std::getenv("SLURM_NODEID");
    const char* nn = std::getenv("SLURM_NNODES");
    if (id && nn && *id && *nn) {
      o.node_rank = static_cast<int>(flags::parse_int("SLURM_NODEID", id, 0, 65535));
      o.nodes = static_cast<int>(flags::parse_int("SLURM_NNODES", nn, 1, 65536));
    }
  }
  if (o.node_rank >= o.nodes)
    usage_error("--node-rank " + std::to_string(o.node_rank) + " is not below --nodes " +
                std::to_string(o.nodes));
  if (o.coord.empty() != o.job.empty()) usage_error("--coord and --job go together");
  if (!o.job.empty()) flags::parse_int("--job", o.job.c_str(), 1, int64_t{1} << 53);
  return o;
} catch (const flags::FlagError& e) {
  usage_error(e.what());
}

int run(const Options& o) {
  // ringd outlives its stdout and stderr (`ringctl run` killed, a closed pipe): a write there
  // fails with EPIPE instead of killing it, the stream stops taking lines and the log file goes
  // on. A file size limit fails the write (EFBIG) instead of killing ringd mid-checkpoint.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);
  spec::LoadResult loaded = spec::load_spec_file(o.spec);
  for (const auto& d : loaded.diagnostics) std::cerr << d.str() << "\n";
  if (!loaded.ok()) {
    std::cerr << "ringd: " << o.spec << ": invalid spec (" << loaded.error_count()
              << " error(s))\n";
    return kExitUsage;
  }
  spec::JobSpec s = *loaded.spec;
  const int64_t world = s.resources.workers_per_node * o.nodes;
  if (s.parallel.data_replicas != 1) {
    std::cerr << "ringd: " << o.spec << ": parallel.data_replicas = " << s.parallel.data_replicas
              << ": ringd runs one ring (data_replicas 1)\n";
    return kExitUsage;
  }
  if (s.parallel.context_ranks != world) {
    std::cerr << "ringd: " << o.spec << ": parallel.context_ranks = " << s.parallel.context_ranks
              << " but " << o.nodes << " node(s) x resources.workers_per_node "
              << s.resources.workers_per_node << " = " << world << " workers\n";
    return kExitUsage;
  }
  if (s.resources.nodes != o.nodes) {
    std::cerr << "ringd: " << o.spec << ": resources.nodes = " << s.resources.nodes << " but "
              << o.nodes << " ringd node(s) were started (--nodes / SLURM_NNODES)\n";
    return kExitUsage;
  }
  if (s.optimizer.offload != spec::Offload::kCpu) {
    std::cerr << "ringd: " << o.spec
              << ": optimizer.offload = none: the in-worker optimizer is ring-worker "
                 "--launch-local; ringd runs optimizer.offload: cpu\n";
    return kExitUsage;
  }
  if (s.optimizer.update == spec::UpdateMode::kLazy) {
    // The lazy-update index in shared memory (worker/offload/shm.h) holds 32-bit coordinates:
    // a larger model would update the wrong coordinates silently.
    const int64_t n = model::ParamLayout(model::ModelConfig::from_spec(s)).total();
    if (n > (int64_t{1} << 32)) {
      std::cerr << "ringd: " << o.spec << ": optimizer.update = lazy with " << n
                << " parameters: the lazy-update index holds 32-bit coordinates (at most "
                << (int64_t{1} << 32) << " parameters); use optimizer.update: dense\n";
      return kExitUsage;
    }
  }
  std::ifstream in(o.spec, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    Daemon d(o, s, text);
    return d.run();
  } catch (const std::exception& e) {
    std::cerr << "ringd: fatal: " << e.what() << "\n";
    return kExitFailed;
  }
}

}  // namespace ring::ringd
