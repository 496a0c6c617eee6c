// ringctl logs JOB [--worker R] [--ringd] [--follow] [--lines N]: a job's logs, read from its
// job directory (recorded in ring-coord at submit; daemon/INTERFACE.md):
//   logs/worker-<rank>.log  each worker's stdout+stderr (global rank), all attempts
//   logs/ringd-<node>.log   each node daemon's own log (--ringd)
// Without --worker every worker log is shown, each line prefixed with "[worker R] ". --follow
// keeps reading new lines (and logs that appear) until the job reaches a final state or Ctrl-C.
// The job directory must be visible on this host (a shared file system on a cluster).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "cli/ctl_common.h"
#include "cli/local_state.h"

namespace ring::cli {

namespace fs = std::filesystem;

namespace {

struct LogsOpts {
  CoordFlags coord;
  std::string job;
  std::optional<int64_t> worker;
  bool ringd = false;
  bool follow = false;
  int64_t lines = -1;  // -1: everything (without --follow), the last 20 (with)
};

// One log file being read: where we are, and the partial last line.
struct Tail {
  std::string path;
  std::string prefix;
  std::streamoff offset = 0;
  std::string partial;
};

// The log files of the job dir matching `stem-<N>.log`, ordered by N. Regular files only (not
// followed through symlinks): opening a FIFO someone left there would block.
std::vector<std::pair<int64_t, std::string>> list_logs(const std::string& dir,
                                                       const std::string& stem) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code tec;
    if (e.symlink_status(tec).type() != fs::file_type::regular) continue;
    std::string n = e.path().filename().string();
    std::string pre = stem + "-";
    if (n.rfind(pre, 0) != 0 || n.size() <= pre.size() + 4 || n.substr(n.size() - 4) != ".log")
      continue;
    std::string num = n.substr(pre.size(), n.size() - pre.size() - 4);
    if (num.empty() || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    out.emplace_back(std::stoll(num), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Prints what was appended since the last call; the first call keeps only the last `lines`.
void drain(Tail& t, int64_t first_lines, bool first) {
  // O_NONBLOCK|O_NOFOLLOW and a regular-file check: the path may have been replaced since it
  // was listed.
  int fd = ::open(t.path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return;
  }
  std::streamoff size = st.st_size;
  if (size < t.offset) t.offset = 0, t.partial.clear();  // truncated or replaced: start over
  if (size == t.offset) {
    ::close(fd);
    return;
  }
  std::string data(static_cast<size_t>(size - t.offset), '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::pread(fd, data.data() + got, data.size() - got, t.offset + got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(got);
  t.offset += static_cast<std::streamoff>(data.size());
  data = t.partial + data;
  size_t end = data.rfind('\n');
  if (end == std::string::npos) {
    t.partial = data;
    return;
  }
  t.partial = data.substr(end + 1);
  std::deque<std::string> out;
  size_t pos = 0;
  while (pos <= end) {
    size_t nl = data.find('\n', pos);
    out.push_back(data.substr(pos, nl - pos));
    pos = nl + 1;
    if (first && first_lines >= 0 && static_cast<int64_t>(out.size()) > first_lines)
      out.pop_front();
  }
  for (const auto& l : out) std::cout << t.prefix << l << "\n";
}

int run_logs(const LogsOpts& o) {
  std::string ep = o.coord.resolved_endpoint();
  return guarded(ep, [&] {
    int64_t job = parse_job_id(o.job);
    coord::Client c(with_local_state(o.coord.client_options()));
    auto st = c.status(job);
    if (st.job_dir.empty()) {
      std::cerr << "ringctl: job " << job
                << " has no job directory recorded (submitted by an older ringctl); its logs "
                   "are in <job-dir>/logs of the `ringd --job-dir` it runs with\n";
      return kExitFailed;
    }
    std::string dir = st.job_dir + "/logs";
    struct stat sb;
    if (::stat(st.job_dir.c_str(), &sb) != 0) {
      std::cerr << "ringctl: job " << job << "'s directory " << st.job_dir
                << " does not exist on this host"
                << (st.state == "pending" ? " yet (the job is pending: no daemon has started it)"
                                          : " (read the logs on a node that mounts it)")
                << "\n";
      return kExitFailed;
    }
    std::string stem = o.ringd ? "ringd" : "worker";
    std::map<std::string, Tail> tails;
    auto refresh = [&] {
      auto found = list_logs(dir, stem);
      bool several = !o.worker;  // every log: say whose each line is
      for (const auto& [n, path] : found) {
        if (o.worker && n != *o.worker) continue;
        if (tails.count(path)) continue;
        tails[path] = Tail{path, several ? "[" + stem + " " + std::to_string(n) + "] " : "", 0, {}};
      }
      return found;
    };
    auto found = refresh();
    if (tails.empty() && !o.follow) {
      std::string have;
      for (const auto& f : found) have += (have.empty() ? "" : ", ") + std::to_string(f.first);
      if (o.worker)
        std::cerr << "ringctl: no log of " << stem << " " << *o.worker << " in " << dir
                  << (have.empty() ? " (no " + stem + " has started yet)"
                                   : " (" + stem + "s with logs: " + have + ")")
                  << "\n";
      else
        std::cerr << "ringctl: no " << stem << " logs in " << dir << " yet (state: " << st.state
                  << "; --follow waits for them)\n";
      return kExitFailed;
    }
    int64_t first_lines = o.lines >= 0 ? o.lines : (o.follow ? 20 : -1);
    std::map<std::string, bool> started;
    auto drain_all = [&] {
      for (auto& [p, t] : tails) {
        drain(t, first_lines, !started[p]);
        started[p] = true;
      }
      std::cout << std::flush;
    };
    drain_all();
    if (!o.follow) return kExitOk;
    install_stop_signals();
    auto last_status = now_unix();
    while (sleep_unless_stopped(0.3)) {
      refresh();
      drain_all();
      if (now_unix() - last_status > 1) {
        last_status = now_unix();
        auto s = c.status(job).state;
        if (s == "completed" || s == "failed" || s == "cancelled" || s == "stopped") {
          refresh();
          drain_all();
          break;
        }
      }
    }
    return kExitOk;
  });
}

}  // namespace

Subcommand add_logs(CLI::App& app) {
  auto o = std::make_shared<LogsOpts>();
  auto* s = app.add_subcommand("logs", "A job's worker (or ringd) logs, from its job directory");
  s->add_option("job", o->job, "Job id")->required();
  s->add_option("-w,--worker", o->worker, "Only this worker (global rank)")
      ->check(flags::integer_in(0, (int64_t{1} << 32) - 1));
  s->add_flag("--ringd", o->ringd, "The node daemons' logs instead (--worker picks the node)");
  s->add_flag("-f,--follow", o->follow, "Keep printing new lines until the job ends");
  s->add_option("-n,--lines", o->lines,
                "Start with the last N lines of each log (default: all; 20 with --follow)")
      ->check(flags::integer_in(0, int64_t{1} << 31));
  o->coord.add_to(s);
  return {s, [o] { return run_logs(*o); }};
}

}  // namespace ring::cli
