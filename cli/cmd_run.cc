// ringctl run SPEC [--steps N] [--resume] [--job-dir DIR]: train on this machine with a
// coordinator and one node daemon, and show live progress.
//
// 1. Validates the spec (errors as `ringctl validate` prints them; exit 1).
// 2. Uses the coordinator at the endpoint (--coord, $RING_COORD, the default ipc socket) when one
//    answers; otherwise starts `ring-coord --endpoint EP` as a child (its own process group, so
//    Ctrl-C reaches only us; killed at the end; log in <job-dir>/logs/ring-coord.log). Either way
//    `ringctl status` works from another terminal while the job runs.
// 3. Submits the job (with its job dir) and spawns
//      ringd --spec SPEC --job-dir DIR --coord EP --job ID --json [--steps N] [--resume]
//    (contract: daemon/INTERFACE.md) in its own process group; ringd's stderr goes to
//    <job-dir>/logs/ringd-run.stderr and its log to <job-dir>/logs/ringd-0.log (both shown live
//    with --verbose; their last lines when ringd fails).
// The spec must be one ringd can run (validated as `ringctl validate` does, one node), and the
// job directory must be ours, private and writable (common/cli/job_dir.h), both checked before
// anything starts.
// 4. Reads ringd's JSON lines: step lines drive a progress bar (step, loss, tokens/s, ETA) on a
//    terminal, or one plain line per step otherwise; event lines are printed as they come.
// 5. Ctrl-C forwards SIGINT (ringd checkpoints and stops, exit 75); a second Ctrl-C forwards it
//    again (ringd stops at once, skipping the checkpoint); a third kills ringd's process group.
// 6. Prints a summary and exits with ringd's status mapped onto ringctl's codes (cli/exit_codes.h:
//    0 done, 1 failed or refused, 8 cancelled through ring-coord, 9 ringd killed by a signal,
//    75 stopped and resumable).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "common/cli/job_dir.h"
#include "common/install/locate.h"
#include "common/proc/spawn.h"
#include "common/plan/plan.h"
#include "common/spec/parse.h"

namespace ring::cli {

namespace fs = std::filesystem;

namespace {

struct RunOpts {
  CoordFlags coord;
  std::string spec;
  std::optional<int64_t> steps;
  bool resume = false;
  bool force = false;  // start although the plan says it does not fit
  std::string job_dir;
  std::optional<int64_t> threads;
  bool verbose = false;
  std::string name;
  SetFlags set;
};

std::atomic<int> g_sigint{0};
std::atomic<int> g_sigterm{0};
void on_sigint(int) {
  g_sigint.fetch_add(1);
}
void on_sigterm(int) {
  g_sigterm.fetch_add(1);
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// True when something accepts connections on the ipc socket (a quick check before asking).
bool ipc_listening(const std::string& endpoint) {
  std::string path = endpoint.substr(6);
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path) return false;
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A coordinator answers a status request at the endpoint within `timeout_s`.
bool coordinator_answers(const CoordFlags& flags, double timeout_s) {
  auto o = flags.client_options();
  if (o.endpoint.rfind("ipc://", 0) == 0 && !ipc_listening(o.endpoint)) return false;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  try {
    coord::Client c(o);
    c.status();
    return true;
  } catch (const coord::ConnectError&) {
    return false;
  } catch (const coord::TimeoutError&) {
    return false;
  }
}

// A child process in its own process group (Ctrl-C reaches only us) that dies (SIGTERM) with us;
// stdin /dev/null, no descriptor of ours above 2 (common/proc/spawn.h).
pid_t spawn(const std::vector<std::string>& argv, int out_fd, int err_fd) {
  proc::SpawnOptions o;
  o.argv = argv;
  o.new_process_group = true;
  o.death_signal = SIGTERM;
  o.stdin_fd = proc::kDevNull;
  o.stdout_fd = out_fd;
  o.stderr_fd = err_fd;
  o.reset_signals = {SIGINT, SIGTERM, SIGPIPE};
  proc::Spawned child = proc::spawn(o);
  if (!child) throw std::runtime_error(child.error);
  return child.pid;
}

int exit_status(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Waits for a child up to `timeout_s`: its wait status, or -1 if it is still running.
int wait_child(pid_t pid, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string tail_of_file(const std::string& path, size_t lines) {
  std::ifstream f(path);
  std::deque<std::string> q;
  std::string l;
  while (std::getline(f, l)) {
    q.push_back(l);
    if (q.size() > lines) q.pop_front();
  }
  std::string s;
  for (const auto& x : q) s += "  | " + x + "\n";
  return s;
}

// ring-coord started by us, stopped (SIGTERM, then SIGKILL) when this goes out of scope.
struct OwnedCoordinator {
  pid_t pid = -1;
  std::string log;
  ~OwnedCoordinator() { stop(); }
  void stop() {
    if (pid <= 0) return;
    ::kill(pid, SIGTERM);
    if (wait_child(pid, 5) < 0) {
      ::kill(pid, SIGKILL);
      wait_child(pid, 5);
    }
    pid = -1;
  }
};

// What the progress display knows.
struct Progress {
  int64_t total = 0;
  int64_t first_step = -1;
  int64_t step = 0;
  double loss = NAN;
  double tps = 0;
  double tps_sum = 0;
  int64_t n = 0;
  std::chrono::steady_clock::time_point t_first, t_last;
  bool bar_shown = false;
};

class Display {
 public:
  Display(bool tty, int64_t total) : tty_(tty) { p_.total = total; }

  void step(const nlohmann::json& j) {
    auto now = std::chrono::steady_clock::now();
    int64_t s = j.value("step", int64_t{0});
    if (p_.first_step < 0) {
      p_.first_step = s;
      p_.t_first = now;
    }
    p_.step = s;
    p_.loss = j.contains("loss") && j["loss"].is_number() ? j["loss"].get<double>() : NAN;
    p_.tps = j.contains("tokens_per_s") && j["tokens_per_s"].is_number()
                 ? j["tokens_per_s"].get<double>()
                 : 0;
    p_.tps_sum += p_.tps;
    ++p_.n;
    p_.t_last = now;
    if (tty_) {
      draw();
    } else {
      char buf[160];
      std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.4f  tok/s %s  eta %s",
                    static_cast<long long>(p_.step), static_cast<long long>(p_.total), p_.loss,
                    format_rate(p_.tps).c_str(), eta().c_str());
      std::cout << buf << std::endl;
    }
  }

  // A line above the bar (events, warnings).
  void line(const std::string& text) {
    if (tty_ && p_.bar_shown) std::cout << "\r\033[K";
    std::cout << text << "\n";
    if (tty_ && p_.bar_shown) draw();
    std::cout << std::flush;
  }

  void finish() {
    if (tty_ && p_.bar_shown) std::cout << "\n";
    std::cout << std::flush;
  }

  const Progress& progress() const { return p_; }

  std::string eta() const {
    if (p_.n < 2 || p_.step >= p_.total) return p_.step >= p_.total ? "0s" : "-";
    double per = std::chrono::duration<double>(p_.t_last - p_.t_first).count() /
                 static_cast<double>(p_.step - p_.first_step);
    return format_duration(per * static_cast<double>(p_.total - p_.step));
  }

 private:
  void draw() {
    constexpr int kWidth = 24;
    double frac = p_.total > 0 ? std::min(1.0, static_cast<double>(p_.step) / p_.total) : 0;
    int filled = static_cast<int>(frac * kWidth);
    std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "\r\033[K[%s] %3.0f%%  step %lld/%lld  loss %.4f  %s tok/s  ETA %s", bar.c_str(),
                  frac * 100, static_cast<long long>(p_.step), static_cast<long long>(p_.total),
                  p_.loss, format_rate(p_.tps).c_str(), eta().c_str());
    std::cout << buf << std::flush;
    p_.bar_shown = true;
  }

  bool tty_;
  Progress p_;
};

// An event line from ringd, for people.
std::string describe_event(const nlohmann::json& j) {
  std::string name = j.value("event", std::string("event"));
  std::string s;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "event") continue;
    if ((it.key() == "last_lines" || it.key() == "last_log") && it->is_array()) {
      for (const auto& l : *it) s += "\n    | " + (l.is_string() ? l.get<std::string>() : l.dump());
      continue;
    }
    s = (s.empty() || s[0] == '\n' ? "" : " ") + s;
    s = it.key() + "=" + (it->is_string() ? it->get<std::string>() : it->dump()) + s;
  }
  bool bad = name.find("died") != std::string::npos || name.find("fail") != std::string::npos;
  return (bad ? paint(name, "31") : paint(name, "36")) + (s.empty() ? "" : " " + s);
}

// The new lines of a log file another process appends to: from its size when this was made (an
// earlier run's lines are not ours), partial last lines kept until they end. Keeps the last 20.
// ringd's "event {...}" lines are left out: ringctl prints those from ringd's stdout.
class LogFollower {
 public:
  explicit LogFollower(std::string path) : path_(std::move(path)) {
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0) offset_ = st.st_size;
  }
  const std::string& path() const { return path_; }
  const std::deque<std::string>& tail() const { return tail_; }

  template <typename F>
  void poll(F&& on_line) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return;
    }
    if (st.st_size < offset_) offset_ = 0, partial_.clear();  // replaced: start over
    char buf[65536];
    while (true) {
      ssize_t n = ::pread(fd, buf, sizeof buf, offset_);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      offset_ += n;
      partial_.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    size_t pos;
    while ((pos = partial_.find('\n')) != std::string::npos) {
      std::string l = partial_.substr(0, pos);
      partial_.erase(0, pos + 1);
      if (l.rfind("event ", 0) == 0) continue;  // ringd's events: shown from its stdout already
      tail_.push_back(l);
      if (tail_.size() > 20) tail_.pop_front();
      on_line(l);
    }
  }

 private:
  std::string path_;
  off_t offset_ = 0;
  std::string partial_;
  std::deque<std::string> tail_;
};

// The ring-coord we started exited because another `ringctl run` started one on the same state
// at the same moment: whether that one answers (waiting while it opens its database).
bool another_run_started_it(const CoordFlags& coord, const std::string& our_log) {
  if (tail_of_file(our_log, 10).find("another ring-coord") == std::string::npos) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until && !g_sigint && !g_sigterm) {
    if (coordinator_answers(coord, 1)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// A training job on this machine, before anything starts: its data must be here (this machine
// is the node; ringd would refuse it anyway), and it must fit as `ringctl plan --check` says (a
// job that does not fit fails later, out of memory, after its restarts; --force runs it anyway).
int check_this_machine(const spec::JobSpec& spec, const RunOpts& o) {
  if (const auto missing = spec::missing_data_paths(spec); !missing.empty()) {
    for (const auto& m : missing) std::cerr << o.spec << ": " << m << "\n";
    return kExitFailed;
  }
  const plan::Plan p = plan::make_plan(spec);
  if (p.fits() || o.force) return kExitOk;
  std::cerr << o.spec << ": does not fit this machine:"
            << (p.fits_device ? ""
                              : fmt::format(" {:.2f} GB per worker of {:.2f} GB usable on {};",
                                            p.worker_total / 1e9, p.device_usable / 1e9,
                                            p.device_name))
            << (p.fits_host ? ""
                            : fmt::format(" {:.2f} GB of host memory of {:.2f} GB;",
                                          p.host_total / 1e9, p.host_capacity / 1e9))
            << " `ringctl plan " << o.spec << "` shows where it goes; --force runs it anyway\n";
  return kExitNoFit;
}

// 1. The spec, loaded as run/submit load it (this build's limits as errors), for one node; the
// generate inputs and this machine checked. kExitOk with the spec in *r, else the exit code.
int load_run_spec(const RunOpts& o, spec::LoadResult* r) {
  auto load = spec::job_spec_options();
  load.overrides = o.set.overrides();
  *r = spec::load_spec_file(o.spec, load);
  for (const auto& d : r->diagnostics) std::cerr << d.str() << "\n";
  if (!r->ok()) {
    std::cerr << o.spec << ": " << r->error_count() << " error(s); `ringctl validate " << o.spec
              << "` lists them, fix them before running\n";
    return kExitFailed;
  }
  // One ringd on this machine: ringd would refuse a spec for more nodes (resources.nodes
  // must equal the ringd started), after the coordinator has recorded the job.
  if (r->spec->resources.nodes != 1) {
    std::cerr << o.spec << ": resources.nodes is " << r->spec->resources.nodes
              << ": `ringctl run` trains on this machine (one node); submit a multi-node job "
                 "to Slurm with `ringctl submit`\n";
    return kExitFailed;
  }
  // A generate job's relative inputs, from here: ringd reads the spec ring-coord records.
  if (absolute_generate_paths(*r->spec, &load.overrides)) *r = spec::load_spec_file(o.spec, load);
  if (!r->ok()) return kExitFailed;
  const auto& spec = *r->spec;
  const bool generate = spec.job.kind == spec::JobKind::kGenerate;
  if (generate && (o.steps || o.resume)) {
    std::cerr << "ringctl: " << (o.steps ? "--steps" : "--resume") << ": " << o.spec
              << " is a generate job (job.kind generate): it has no steps and nothing to resume "
                 "from\n";
    return kExitUsage;
  }
  if (const std::string why = generate_inputs_problem(spec); !why.empty()) {
    std::cerr << o.spec << ": " << why << "\n";
    return kExitFailed;
  }
  if (!generate) return check_this_machine(spec, o);
  return kExitOk;
}

// 3. A coordinator that answers at `ep`: the one there, or (ipc:// only) a ring-coord started
// for this run, logging into the job directory (*owned; stopped when the run ends).
int ensure_coordinator(const RunOpts& o, const std::string& ep, const std::string& job_dir,
                       OwnedCoordinator* owned) {
  if (coordinator_answers(o.coord, 2)) {
    std::cout << "using the coordinator at " << ep << "\n";
    return kExitOk;
  }
  if (ep.rfind("ipc://", 0) != 0) {
    std::cerr << "ringctl: no coordinator answers at " << ep
              << "; `ringctl run` starts its own only on an ipc:// endpoint: start ring-coord "
                 "there, or leave --coord out\n";
    return kExitNoCoord;
  }
  std::vector<std::string> tried;
  std::string bin = install::find_program("ring-coord", {"RING_COORD_BIN"}, "coordinator", &tried);
  if (bin.empty() || ::access(bin.c_str(), X_OK) != 0) {
    std::cerr << "ringctl: no coordinator at " << ep << " and ring-coord not found (tried "
              << join(tried, ", ") << "); build it or set RING_COORD_BIN\n";
    return kExitNoCoord;
  }
  owned->log = job_dir + "/logs/ring-coord.log";
  int fd = ::open(owned->log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  owned->pid = spawn({bin, "--endpoint", ep}, fd, fd);
  if (fd >= 0) ::close(fd);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  bool up = false;
  while (!up && std::chrono::steady_clock::now() < end && !g_sigint && !g_sigterm) {
    int st = 0;
    if (::waitpid(owned->pid, &st, WNOHANG) == owned->pid) {
      owned->pid = -1;
      if (another_run_started_it(o.coord, owned->log)) {
        std::cout << "using the coordinator at " << ep << " (another run started it)\n";
        return kExitOk;
      }
      std::cerr << "ringctl: ring-coord exited (status " << exit_status(st)
                << ") instead of serving " << ep << ":\n"
                << tail_of_file(owned->log, 10);
      return kExitNoCoord;
    }
    up = coordinator_answers(o.coord, 0.5);
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!up) {
    std::cerr << "ringctl: the ring-coord started for " << ep << " did not answer:\n"
              << tail_of_file(owned->log, 10);
    return kExitNoCoord;
  }
  std::cout << "ring-coord started at " << ep << " (log " << owned->log
            << "; it stops when this run ends)\n";
  return kExitOk;
}

// What one ringd run gave: its wait status and what the summary tells of it.
struct RingdRun {
  int status = -1;
  double wall_s = 0;
  std::string last_ckpt, gen_output;  // from its events
  std::deque<std::string> err_tail;   // its last stderr lines
  std::string err_log;                // where its stderr went
  std::vector<std::string> log_tail;  // its log's last lines
  std::string log_path;
  Progress progress;
};

// Reads whole lines from fd into on_line; at end of file (or an error) the rest, then *open false.
template <class OnLine>
void pump_lines(int fd, std::string& buf, bool& open, OnLine& on_line) {
  char chunk[65536];
  ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
    if (!buf.empty()) on_line(buf);
    buf.clear();
    open = false;
    return;
  }
  if (n < 0) return;
  buf.append(chunk, static_cast<size_t>(n));
  size_t pos;
  while ((pos = buf.find('\n')) != std::string::npos) {
    on_line(buf.substr(0, pos));
    buf.erase(0, pos + 1);
  }
}

// Ctrl-C and SIGTERM on to ringd: the first Ctrl-C stops at the next checkpoint, the second at
// once, the third kills it. ringd takes a stop signal repeated within 1 s for the same one (Slurm
// delivers its SIGTERM twice): a second Ctrl-C is passed on once 1.2 s have gone since the first.
struct SignalForwarder {
  int forwarded = 0, term_forwarded = 0;
  std::chrono::steady_clock::time_point first;
  void poll(pid_t pid, bool generate, Display& disp) {
    int si = g_sigint.load();
    const auto now = std::chrono::steady_clock::now();
    if (si > forwarded && (forwarded == 0 || now - first > std::chrono::milliseconds(1200))) {
      if (forwarded == 0) first = now;
      si = forwarded + 1;
      forwarded = si;
      if (si == 1) {
        disp.line(generate ? "stopping: ringd stops the generation (nothing is written)"
                           : "stopping: ringd writes a checkpoint and stops (Ctrl-C again to "
                             "stop at once)");
        ::kill(pid, SIGINT);
      } else if (si == 2) {
        disp.line("stopping at once (no checkpoint; Ctrl-C again to kill ringd)");
        ::kill(pid, SIGINT);
      } else {
        disp.line("killing ringd");
        ::kill(-pid, SIGKILL);
      }
    }
    const int stt = g_sigterm.load();
    if (stt > term_forwarded) {
      term_forwarded = stt;
      ::kill(pid, SIGTERM);
    }
  }
};

// 4-5. ringd for the job, its JSON lines shown as progress, signals passed on, until it exits.
RingdRun run_ringd(const RunOpts& o, const std::vector<std::string>& argv,
                   const std::string& job_dir, bool generate, int64_t total) {
  RingdRun run;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  run.err_log = job_dir + "/logs/ringd-run.stderr";
  int err_fd =
      ::open(run.err_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  // ringd --json logs to <job-dir>/logs/ringd-0.log only (its stderr carries fatal errors):
  // read what it appends to show it with --verbose and its last lines when it fails.
  LogFollower ringd_log(job_dir + "/logs/ringd-0.log");
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = spawn(argv, out[1], err[1]);
  ::close(out[1]);
  ::close(err[1]);

  Display disp(stdout_is_tty(), total);
  std::string out_buf, err_buf;
  SignalForwarder signals;
  bool out_open = true, err_open = true;
  auto handle_line = [&](const std::string& l) {
    nlohmann::json j = nlohmann::json::parse(l, nullptr, false);
    if (j.is_object() && j.contains("event")) {
      if (j["event"] == "checkpoint_saved" && j.contains("step")) run.last_ckpt = j["step"].dump();
      if (j["event"] == "generate_started" && j.contains("output") && j["output"].is_string())
        run.gen_output = j["output"].get<std::string>();
      disp.line(describe_event(j));
    } else if (j.is_object() && j.contains("step")) {
      disp.step(j);
    } else if (!l.empty()) {
      disp.line(l);
    }
  };
  auto handle_err = [&](const std::string& l) {
    if (err_fd >= 0) {
      std::string line = l + "\n";
      ssize_t w = ::write(err_fd, line.data(), line.size());
      (void)w;
    }
    run.err_tail.push_back(l);
    if (run.err_tail.size() > 20) run.err_tail.pop_front();
    if (o.verbose) disp.line(paint("ringd: ", "2") + l);
  };
  auto show_log = [&](const std::string& l) {
    if (o.verbose) disp.line(paint("ringd: ", "2") + l);
  };
  while (out_open || err_open) {
    signals.poll(pid, generate, disp);
    pollfd p[2] = {{out_open ? out[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}};
    int n = ::poll(p, 2, 200);
    ringd_log.poll(show_log);
    if (n < 0) continue;  // EINTR: a signal, handled above
    if (p[0].revents) pump_lines(out[0], out_buf, out_open, handle_line);
    if (p[1].revents) pump_lines(err[0], err_buf, err_open, handle_err);
  }
  ::close(out[0]);
  ::close(err[0]);
  if (err_fd >= 0) ::close(err_fd);
  while (run.status < 0) {
    run.status = wait_child(pid, 0.5);
    if (run.status < 0 && g_sigint.load() > 2) ::kill(-pid, SIGKILL);
  }
  ringd_log.poll(show_log);
  disp.finish();
  run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.progress = disp.progress();
  run.log_tail.assign(ringd_log.tail().begin(), ringd_log.tail().end());
  run.log_path = ringd_log.path();
  return run;
}

bool final_state(const std::string& s) {
  return s == "completed" || s == "failed" || s == "cancelled" || s == "stopped";
}

// 6. The job as the coordinator ends up with it: ringd's last reports reach it before ringd
// exits, so wait a moment for a final state; a job left live is cancelled (no daemon serves it).
std::optional<protocol::JobInfo> final_job_info(coord::Client& client, int64_t job) {
  std::optional<protocol::JobInfo> info;
  for (int i = 0; i < 20; ++i) {
    try {
      info = client.status(job);
    } catch (const coord::ClientError&) {
      break;
    }
    if (final_state(info->state)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (info && !final_state(info->state)) {
    try {
      client.cancel(job);
      info = client.status(job);
    } catch (const coord::ClientError&) {
    }
  }
  return info;
}

// The summary after the run: outcome, steps and loss, the coordinator's state, checkpoints, logs,
// how to resume; after a failure (not a stop or a cancel) ringd's last log and stderr lines.
void print_summary(const RunOpts& o, const spec::JobSpec& spec, const protocol::SubmitReply& sub,
                   const std::string& job_dir, int64_t total, const RingdRun& run,
                   const std::optional<protocol::JobInfo>& info) {
  const bool generate = spec.job.kind == spec::JobKind::kGenerate;
  const Progress& pr = run.progress;
  std::string set_args;  // shell-quoted, to paste
  for (const auto& a : o.set.args) {
    std::string q;
    for (char ch : a) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    set_args += " --set '" + q + "'";
  }
  std::ostringstream sum;
  const int rc = from_ringd_status(run.status);
  // A generate job stopped early has nothing to resume from.
  const std::string outcome =
      generate && rc == kExitStopped ? std::string("stopped") : describe_ringd_status(run.status);
  sum << "job " << sub.job << " (" << sub.name << ") " << outcome << " after "
      << format_duration(run.wall_s);
  if (generate) {
    sum << (rc == kExitOk ? ": generated" : ": generation did not finish");
  } else if (pr.n > 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, ": steps %lld-%lld of %lld, final loss %.4f, mean %s tok/s",
                  static_cast<long long>(pr.first_step), static_cast<long long>(pr.step),
                  static_cast<long long>(total), pr.loss,
                  format_rate(pr.tps_sum / static_cast<double>(pr.n)).c_str());
    sum << buf;
  } else {
    sum << ": no step finished";
  }
  sum << "\n";
  if (info)
    sum << "  coordinator: " << info->state
        << (info->state_reason.empty() ? "" : " (" + info->state_reason + ")") << "\n";
  std::string ckpt_dir = info ? info->checkpoint_dir : "";
  if (!ckpt_dir.empty())
    sum << "  checkpoints: " << ckpt_dir
        << (info && info->last_checkpoint_step
                ? " (latest complete: step " + std::to_string(*info->last_checkpoint_step) + ")"
                : (!run.last_ckpt.empty() ? " (last saved: step " + run.last_ckpt + ")" : ""))
        << "\n";
  if (generate && rc == kExitOk && !run.gen_output.empty())
    sum << "  output: " << run.gen_output << "\n";
  sum << "  logs: " << job_dir << "/logs (ringctl logs " << sub.job << ")\n";
  if (rc == kExitStopped && generate)
    sum << "  generation is not resumable: run it again with: ringctl run " << o.spec << "\n";
  else if (rc == kExitStopped)
    sum << "  resume with: ringctl run " << o.spec << " --resume"
        << (job_dir == jobdir::default_job_dir(spec.job.name, ::geteuid())
                ? ""
                : " --job-dir " + job_dir)
        << (o.steps ? " --steps " + std::to_string(*o.steps) : "") << set_args << "\n";
  std::cout << sum.str() << std::flush;
  // Failed: what ringd said last, from its log (the cause: "cannot open .../worker-0.log:
  // Permission denied", "restart.max_restarts exhausted") and from its stderr.
  // (Not after a cancel: ringd did what it was asked, its log is no error.)
  if (rc != kExitOk && rc != kExitStopped && rc != kExitCancelled && !o.verbose) {
    if (!run.log_tail.empty()) {
      std::cerr << "last lines of ringd's log (" << run.log_path << "):\n";
      for (const auto& l : run.log_tail) std::cerr << "  | " << l << "\n";
    }
    if (!run.err_tail.empty()) {
      std::cerr << "last lines of ringd's stderr (" << run.err_log << "):\n";
      for (const auto& l : run.err_tail) std::cerr << "  | " << l << "\n";
    }
  }
}

int run_run(const RunOpts& o) {
  spec::LoadResult r;
  if (const int rc = load_run_spec(o, &r); rc != kExitOk) return rc;
  const std::string& spec_text = r.text;  // what was validated, not a second read of the file
  const auto& spec = *r.spec;
  const int64_t total = o.steps ? *o.steps : spec.train.steps;
  const bool generate = spec.job.kind == spec::JobKind::kGenerate;

  // 2. The job directory.
  // Checked up front (ours, private, writable: common/cli/job_dir.h): a directory ringd cannot
  // write fails here with its name, not later in a log file after restarts.
  std::string job_dir;
  try {
    job_dir = choose_job_dir(o.job_dir, spec.job.name, std::cerr);
  } catch (const jobdir::JobDirError& e) {
    std::cerr << "ringctl: " << e.what() << "\n";
    return kExitFailed;
  }

  // The daemon binary, before anything starts.
  std::vector<std::string> tried;
  std::string ringd = install::find_program("ringd", {"RING_RINGD_BIN", "RING_RINGD", "RINGD"},
                                            "daemon/ringd", &tried);
  if (ringd.empty() || ::access(ringd.c_str(), X_OK) != 0) {
    std::cerr << "ringctl: ringd not found (tried " << join(tried, ", ")
              << "); build it (cmake --build build --target ringd), install it next to "
                 "ringctl, or set RING_RINGD_BIN\n";
    return kExitFailed;
  }

  // 3. The coordinator.
  std::string ep = o.coord.resolved_endpoint();
  OwnedCoordinator owned;
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = on_sigterm;
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  int rc = guarded(ep, [&] { return ensure_coordinator(o, ep, job_dir, &owned); });
  if (rc != kExitOk) return rc;
  if (g_sigint || g_sigterm) return kExitStopped;

  return guarded(ep, [&]() -> int {
    coord::Client client(o.coord.client_options());
    auto sub = client.submit(spec_text, o.name, job_dir, o.steps);
    std::cout << "job " << sub.job << " (" << sub.name << ") submitted; job dir " << job_dir
              << "\n  follow it from another terminal: ringctl status " << sub.job
              << "  |  ringctl logs " << sub.job << " -f\n"
              << std::flush;
    // ringd runs the spec the coordinator recorded (with any --set overrides), from a private
    // copy in the job directory as `submit` makes, not from a second read of the file.
    const std::string spec_path = job_dir + "/spec-" + std::to_string(sub.job) + ".yaml";
    try {
      write_file_as(spec_path, spec_text, 0600);
    } catch (const std::runtime_error& e) {
      std::cerr << "ringctl: " << e.what() << "\n";
      client.cancel(sub.job);  // no daemon will serve it
      return kExitFailed;
    }
    // 4. ringd.
    std::vector<std::string> argv{ringd,       "--spec", spec_path,
                                  "--job-dir", job_dir,  "--coord",
                                  ep,          "--job",  std::to_string(sub.job),
                                  "--json"};
    if (o.steps) argv.insert(argv.end(), {"--steps", std::to_string(*o.steps)});
    if (o.resume) argv.push_back("--resume");
    if (o.threads) argv.insert(argv.end(), {"--threads", std::to_string(*o.threads)});
    const RingdRun run = run_ringd(o, argv, job_dir, generate, total);
    print_summary(o, spec, sub, job_dir, total, run, final_job_info(client, sub.job));
    return from_ringd_status(run.status);
  });
}

}  // namespace

Subcommand add_run(CLI::App& app) {
  auto o = std::make_shared<RunOpts>();
  auto* s = app.add_subcommand(
      "run", "Train on this machine: a coordinator (reused or started), ringd, live progress");
  // A missing spec is bad input (exit 1, named by the spec loader), not a usage error.
  s->add_option("spec", o->spec, "Job spec (YAML)")->required();
  s->add_option("--steps", o->steps, "Train this many steps (overrides train.steps)")
      ->check(flags::integer_in(1, int64_t{1} << 40));
  s->add_flag("--resume", o->resume, "Continue from the latest complete checkpoint");
  s->add_flag("--force", o->force,
              "Run even when `ringctl plan --check` says the job does not fit this machine");
  s->add_option("--job-dir", o->job_dir,
                "Directory for logs, steps.jsonl and relative checkpoints, yours and not "
                "writable by others (default /tmp/ringmaster-<uid>/jobs/<job.name>)");
  s->add_option("--threads", o->threads, "Optimizer threads of ringd")->check(flags::integer_in(1, 4096));
  s->add_option("--name", o->name, "Job name in the coordinator (default: job.name)")
      ->check(job_name_rule());
  o->set.add_to(s);
  s->add_flag(
      "-v,--verbose", o->verbose,
      "Show ringd's own log lines (<job-dir>/logs/ringd-0.log and its stderr) as they come");
  o->coord.add_to(s);
  return {s, [o] { return run_run(*o); }};
}

}  // namespace ring::cli
