#include "daemon/ringd/observer.h"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "common/files/atomic_write.h"

namespace ring::ringd {

namespace tl = contract::timeline;
using json = nlohmann::json;

json straggler_data(const StragglerTracker::Finding& f, const std::string& node, bool cleared) {
  json d = {{"rank", f.rank},
            {"node", node},
            {"step", f.step},
            {"steps", f.steps},
            {"behind_s", f.behind_s},
            {"noise_s", f.noise_s},
            {"sigmas", f.sigmas}};
  d["message"] = cleared
                     ? fmt::format(
                           "rank {} on {} is no longer a straggler (last in {} of the recent "
                           "steps)",
                           f.rank, node, f.steps)
                     : fmt::format(
                           "rank {} on {} is a straggler: the ranks after it waited {:.3f} s for "
                           "it per step (median), {}, last in {} of the recent steps (step {})",
                           f.rank, node, f.behind_s, StragglerTracker::describe_noise(f), f.steps,
                           f.step);
  return d;
}

// ---- hangs -------------------------------------------------------------------------------------

std::string describe_wait(const tl::Event& c) {
  switch (c.kind) {
    case tl::Phase::kRingWait:
      return fmt::format("ring recv from rank {}, layer {} hop {}", c.peer, c.layer, c.hop);
    case tl::Phase::kRingSend:
      return fmt::format("ring send to rank {}, layer {} hop {}", c.peer, c.layer, c.hop);
    case tl::Phase::kCollective:
      return "collective over all ranks (an all_gather: training's label count, loss or token "
             "count; generation's decode partials or sampled tokens)";
    case tl::Phase::kParamsWait:
      return "waiting for ringd's weights";
    case tl::Phase::kHeadAllToAll:
      return fmt::format(
          "head all-to-all inside the group of ranks {}..{} (two-level attention), layer {}",
          c.peer, c.peer + c.hop - 1, c.layer);
    default:
      return tl::phase_name(c.kind);
  }
}

char proc_state(pid_t pid) {
  if (pid <= 0) return '?';
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return '?';
  return text[close + 2];
}

HangFinding analyse_hang(int64_t step, double elapsed_s, double deadline_s,
                         const std::vector<HangInput>& workers, int64_t now_ns,
                         const std::string& what) {
  HangFinding f;
  std::vector<std::string> why;
  for (const HangInput& w : workers) {
    if (w.done) continue;
    // Ended or ending (a zombie not reaped yet, e.g. a rank that just failed on a lost peer):
    // its death is reported as such, it is not what the step waits for.
    if (!w.running || w.proc_state == 'Z' || w.proc_state == 'X') continue;
    const bool stopped = w.proc_state == 'T' || w.proc_state == 't';
    const tl::Event& cur = w.snap.current;
    const bool peer_wait =
        w.snap.ok && (cur.kind == tl::Phase::kRingWait || cur.kind == tl::Phase::kRingSend ||
                      cur.kind == tl::Phase::kCollective || cur.kind == tl::Phase::kHeadAllToAll);
    if (!stopped && peer_wait) {
      f.waiting.push_back({w.rank, describe_wait(cur)});
      continue;
    }
    // Moving right now (its main thread recorded progress within the last second): not stuck.
    const double idle_s = (now_ns - w.snap.progress_ns) * 1e-9;
    if (!stopped && w.snap.ok && idle_s < std::min(1.0, 0.5 * deadline_s)) continue;
    f.missing.push_back(w.rank);
    if (stopped) {
      why.push_back(fmt::format("rank {} is stopped (SIGSTOP)", w.rank));
    } else if (!w.snap.ok) {
      why.push_back(fmt::format("rank {} has no flight recorder", w.rank));
    } else {
      std::string last = "nothing yet";
      if (!w.snap.events.empty()) {
        const tl::Event& e = w.snap.events.back();
        last = fmt::format("{} of step {}{}", tl::phase_name(e.kind), e.step,
                           e.layer >= 0 ? fmt::format(" layer {}", e.layer) : "");
      }
      why.push_back(
          fmt::format("rank {} made no progress for {:.1f} s outside any wait (main "
                      "thread stuck; last finished {})",
                      w.rank, (now_ns - w.snap.progress_ns) * 1e-9, last));
    }
  }
  // A rank that finished the step waits for its end too: ringd's next weights come only when
  // every rank is done. (A rank stopped in the step's last collective, after its last send, lets
  // the others finish it; they are listed here, not left out.)
  std::string held_by;
  for (int64_t r : f.missing) held_by += fmt::format("{}rank {}", held_by.empty() ? "" : ", ", r);
  for (const HangInput& w : workers)
    if (w.done)
      f.waiting.push_back(
          {w.rank, fmt::format("finished step {}: waits for the step's end (ringd's next weights), "
                               "held up by {}",
                               step, held_by.empty() ? "ranks of other nodes" : held_by)});
  std::sort(
      f.waiting.begin(), f.waiting.end(),
      [](const HangFinding::Waiting& a, const HangFinding::Waiting& b) { return a.rank < b.rank; });
  std::string waits;
  for (const auto& w : f.waiting)
    waits += fmt::format("{}rank {}: {}", waits.empty() ? "" : "; ", w.rank, w.where);
  std::string whys;
  for (const std::string& s : why) whys += (whys.empty() ? "" : "; ") + s;
  f.message = fmt::format(
      "{} still in flight after {:.1f} s (deadline {:g} s): {}{}",
      what.empty() ? fmt::format("step {}", step) : what, elapsed_s, deadline_s,
      f.missing.empty() ? std::string("no rank of this node is stuck: its ranks wait on ranks of "
                                      "other nodes")
                        : "never arrived: " + whys,
      waits.empty() ? "" : "; waiting: " + waits);
  return f;
}

json hang_data(int64_t step, double deadline_s, const HangFinding& f) {
  json waiting = json::array();
  for (const auto& w : f.waiting) waiting.push_back({{"rank", w.rank}, {"where", w.where}});
  return {{"step", step},
          {"deadline_s", deadline_s},
          {"missing", f.missing},
          {"waiting", waiting},
          {"message", f.message}};
}

// ---- timeline files ----------------------------------------------------------------------------

namespace {

// Timeline files an earlier ringd of this user left in /dev/shm when it was killed before its
// workers had mapped them (their names go only then): this user's by name and owner, regular
// files, and the ringd whose pid the name carries is gone (no process of that pid named ringd:
// pids are reused). Nothing else is touched.
void remove_stale_timelines(const std::function<void(const std::string&)>& say) {
  const std::string prefix = fmt::format("ringmaster-timeline-u{}-p", ::geteuid());
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const char* p = name.c_str() + prefix.size();
    char* end = nullptr;
    const long pid = std::strtol(p, &end, 10);
    if (end == p || pid <= 0 || std::strncmp(end, "-r", 2) != 0 || pid == ::getpid()) continue;
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::string c;
    if (comm && std::getline(comm, c) && c == "ringd") continue;
    if (::unlink(e.path().c_str()) == 0) say("removed a stale timeline file " + e.path().string());
  }
}

}  // namespace

std::vector<std::string> create_timelines(const std::vector<int64_t>& ranks,
                                          const std::string& fallback_dir,
                                          std::vector<contract::timeline::Mapping>* maps,
                                          const std::function<void(const std::string&)>& say) {
  maps->clear();
  maps->resize(ranks.size());
  std::vector<std::string> paths(ranks.size());
  // tmpfs: /dev/shm when it is one (records then never cause disk writeback in the worker),
  // else the caller's private directory.
  struct statfs fs {};
  const bool shm = ::statfs("/dev/shm", &fs) == 0 && fs.f_type == TMPFS_MAGIC;
  if (shm) remove_stale_timelines(say);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string path =
        shm ? fmt::format("/dev/shm/ringmaster-timeline-u{}-p{}-r{}", ::geteuid(), ::getpid(),
                          ranks[i])
            : fmt::format("{}/timeline-{}.bin", fallback_dir, ranks[i]);
    std::string e = contract::timeline::create_file(path, ranks[i]);
    if (e.empty()) e = (*maps)[i].open(path);
    if (!e.empty()) {
      say(fmt::format("worker rank {}: no timeline: {}", ranks[i], e));
      continue;
    }
    paths[i] = path;
  }
  return paths;
}

// ---- the node's timeline file ------------------------------------------------------------------

void DaemonTimeline::record(const tl::Event& e) {
  if (ring_.empty()) return;
  ring_[next_ % ring_.size()] = e;
  ++next_;
}

std::vector<tl::Event> DaemonTimeline::events(int64_t min_step) const {
  std::vector<tl::Event> out;
  const uint64_t first = next_ > ring_.size() ? next_ - ring_.size() : 0;
  for (uint64_t i = first; i < next_; ++i) {
    const tl::Event& e = ring_[i % ring_.size()];
    if (e.step >= min_step) out.push_back(e);
  }
  return out;
}

std::string write_node_timeline(const std::string& path, int node_rank, const std::string& node,
                                const std::vector<tl::Snapshot>& ranks,
                                const std::vector<tl::Event>& ringd_events, int64_t steps,
                                size_t max_records) {
  int64_t newest = 0;
  for (const tl::Snapshot& s : ranks)
    for (const tl::Event& e : s.events) newest = std::max(newest, e.step);
  for (const tl::Event& e : ringd_events) newest = std::max(newest, e.step);
  int64_t from = std::max<int64_t>(0, newest - steps + 1);
  // Fewer steps when the records of `steps` steps would pass max_records (the newest kept).
  std::map<int64_t, size_t> per_step;
  size_t total = 0;
  auto count = [&](const tl::Event& e) {
    if (e.step >= from) {
      ++per_step[e.step];
      ++total;
    }
  };
  for (const tl::Snapshot& s : ranks)
    for (const tl::Event& e : s.events) count(e);
  for (const tl::Event& e : ringd_events) count(e);
  for (auto it = per_step.begin(); total > max_records && it != per_step.end(); ++it) {
    total -= it->second;
    from = it->first + 1;
  }
  std::string out;
  json ids = json::array();
  for (const tl::Snapshot& s : ranks) ids.push_back(s.rank);
  const int64_t mono = tl::now_ns(), unix_now = tl::unix_ns();
  out += json{{"node_rank", node_rank},
              {"node", node},
              {"ranks", ids},
              {"clock", {{"mono_ns", mono}, {"unix_ns", unix_now}}}}
             .dump() +
         "\n";
  size_t n = 0;
  auto line = [&](int64_t rank, const tl::Event& e) {
    if (e.step < from || n >= max_records) return;
    ++n;
    out += fmt::format("[{},{},\"{}\",{},{},{},{},{},{}]\n", rank, e.step, tl::phase_name(e.kind),
                       e.layer, e.hop, e.peer, e.begin_ns, e.end_ns, e.bytes);
  };
  for (const tl::Event& e : ringd_events) line(-1, e);
  for (const tl::Snapshot& s : ranks)
    for (const tl::Event& e : s.events) line(s.rank, e);
  try {
    files::write_file_atomic(path, out, 0600, false);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string dump_node_timeline(const std::string& job_dir, int node_rank, const std::string& node,
                               const std::vector<tl::Mapping>& maps,
                               const std::vector<tl::Event>& ringd_events) {
  const std::string dir = job_dir + "/timeline";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return fmt::format("cannot create {}: {}", dir, std::strerror(errno));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
    return fmt::format("{} is not a directory of ours (a symbolic link?): not written", dir);
  std::vector<tl::Snapshot> snaps;
  for (const tl::Mapping& m : maps)
    if (m.valid()) snaps.push_back(tl::read_mapped(m.data()));
  return write_node_timeline(fmt::format("{}/node-{}.jsonl", dir, node_rank), node_rank, node,
                             snaps, ringd_events, 32, 2000000);
}

}  // namespace ring::ringd
