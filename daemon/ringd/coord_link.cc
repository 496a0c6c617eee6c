#include "daemon/ringd/coord_link.h"

#include <signal.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include <algorithm>

#include <fmt/format.h>

#include "coordinator/daemon_link.h"
#include "common/version.h"
#include "coordinator/security.h"

namespace ring::ringd {

namespace proto = ring::protocol;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::optional<int64_t> opt_i64(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

std::string clip(std::string s, size_t n) {
  if (s.size() > n) s.resize(n);
  return s;
}

}  // namespace

std::string coord_node_name(int64_t job, int node_rank) {
  // The host: Slurm's name for it (what topology.conf and the job's node list use), else the
  // short host name. The suffix makes the name unique per job and node rank: two jobs (or two
  // steps of one job) on one host must not share a name, or commands would reach the wrong
  // ringd and one daemon's heartbeats would hide the other's death.
  std::string h;
  if (const char* n = std::getenv("SLURMD_NODENAME"); n && proto::valid_node_name(n)) {
    h = n;
  } else {
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
      std::snprintf(host, sizeof(host), "node");
    h = host;
    if (auto dot = h.find('.'); dot != std::string::npos && dot > 0) h.resize(dot);
  }
  std::string name = h + "-j" + std::to_string(job) + "-n" + std::to_string(node_rank);
  if (!proto::valid_node_name(name)) name = "node-j" + std::to_string(job) + "-n" +
                                            std::to_string(node_rank);
  return name;
}

CoordLink::CoordLink(CoordLinkOptions opts, std::function<void(const proto::Message&)> on_message)
    : opts_(std::move(opts)), on_message_(std::move(on_message)) {
  opts_.registration.jobs = {proto::JobProgress{opts_.job, 0, 0}};
  // Key files are read here so a bad path is an error at start, not on the link thread.
  coord::DaemonLinkOptions lo;
  lo.endpoint = opts_.endpoint;
  if (lo.endpoint.rfind("tcp://", 0) == 0) {
    const char* sk = std::getenv("RING_COORD_SERVER_KEY");
    const char* ck = std::getenv("RING_COORD_CLIENT_KEY");
    if (!sk || !*sk || !ck || !*ck)
      throw std::runtime_error(
          "--coord " + lo.endpoint +
          ": a tcp:// coordinator needs RING_COORD_SERVER_KEY (the coordinator's "
          "<state_dir>/curve/server.pub) and RING_COORD_CLIENT_KEY (this user's key pair, listed "
          "in the coordinator's curve/clients)");
    lo.server_public_key = coord::read_public_key(sk);
    coord::CurveKeyPair pair = coord::read_key_file(ck);
    lo.client_public_key = pair.public_key;
    lo.client_secret_key = pair.secret_key;
  } else if (lo.endpoint.rfind("ipc://", 0) != 0) {
    throw std::runtime_error("--coord " + lo.endpoint +
                             ": expected ipc://PATH or tcp://HOST:PORT");
  }
  // The DaemonLink (a ZeroMQ socket) lives on the link thread only.
  thread_ = std::thread([this, lo] {
    // Signals are the main thread's (ringd's asio loop): keep them off this one.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    try {
      coord::DaemonLink link(lo, opts_.registration);
      loop(link);
    } catch (const std::exception& e) {
      on_message_(proto::ErrorReply{0, proto::code::kInternal,
                                    std::string("coordinator link failed: ") + e.what(), ""});
    }
  });
}

CoordLink::~CoordLink() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CoordLink::loop(coord::DaemonLink& link) {
  auto progress = [&] {
    return std::vector<proto::JobProgress>{{opts_.job, attempt_.load(), step_.load()}};
  };
  link.registration().jobs = progress();
  link.register_now();
  Clock::time_point next_hb = Clock::now() + std::chrono::milliseconds(
                                                 static_cast<int64_t>(interval_s_.load() * 1e3));
  int64_t syncs_done = 0;
  for (;;) {
    std::deque<proto::Message> out;
    int64_t syncs = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_ && out_.empty()) break;
      out.swap(out_);
      syncs = sync_requests_;
    }
    for (const proto::Message& m : out) link.send(m);
    if (syncs > syncs_done) {
      syncs_done = syncs;
      link.registration().jobs = progress();
      link.register_now();
    }
    const auto now = Clock::now();
    if (now >= next_hb) {
      link.registration().jobs = progress();
      link.heartbeat(progress());
      next_hb = now + std::chrono::milliseconds(static_cast<int64_t>(interval_s_.load() * 1e3));
    }
    // Short polls: queued reports go out within ~20 ms.
    while (auto m = link.recv(std::chrono::milliseconds(20))) {
      if (auto* r = std::get_if<proto::Registered>(&*m)) {
        if (r->heartbeat_interval_s > 0) interval_s_ = r->heartbeat_interval_s;
        std::lock_guard<std::mutex> g(mu_);
        ++registered_;
        if (!first_)
          for (const proto::Assignment& a : r->jobs)
            if (a.job == opts_.job) first_ = a;
        cv_.notify_all();
      }
      on_message_(*m);
    }
  }
}

std::optional<proto::Assignment> CoordLink::wait_registered(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  cv_.wait_for(g, timeout, [&] { return registered_ > 0; });
  return first_;
}

void CoordLink::sync() {
  std::lock_guard<std::mutex> g(mu_);
  ++sync_requests_;
}

bool CoordLink::sync_and_wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> g(mu_);
  ++sync_requests_;
  const int64_t want = registered_ + 1;
  return cv_.wait_for(g, timeout, [&] { return registered_ >= want; });
}

void CoordLink::set_progress(int64_t attempt, int64_t step) {
  attempt_ = attempt;
  step_ = step;
}

void CoordLink::send(proto::Message m) {
  std::lock_guard<std::mutex> g(mu_);
  out_.push_back(std::move(m));
}

void CoordLink::ack(int64_t command_id, bool ok, const std::string& error) {
  send(proto::CommandAck{node(), command_id, ok, clip(error, 1000)});
}

void CoordLink::report(const std::string& name, const json& f) {
  proto::Event e;
  e.node = node();
  e.job = opts_.job;
  e.attempt = f.value("attempt", attempt_.load());
  e.rank = opt_i64(f, "rank");
  e.pid = opt_i64(f, "pid");
  e.step = opt_i64(f, "step");
  if (name == "worker_started") {
    e.kind = proto::EventKind::kWorkerStarted;
    e.step.reset();
  } else if (name == "worker_exited") {
    e.kind = proto::EventKind::kWorkerExited;
    e.exit_code = opt_i64(f, "exit_code").value_or(0);
  } else if (name == "worker_died" || name == "worker_failed") {
    // worker_failed: ringd killed it (hung, broke the protocol) with SIGKILL.
    e.kind = proto::EventKind::kWorkerDied;
    if (auto s = opt_i64(f, "signal")) e.signal = s;
    else if (auto c = opt_i64(f, "exit_code")) e.exit_code = c;
    else e.signal = 9;
    if (f.contains("error")) e.message = clip(f["error"].get<std::string>(), 4000);
    if (f.contains("last_lines") && f["last_lines"].is_array()) {
      const json& ll = f["last_lines"];
      const size_t from = ll.size() > proto::kMaxLogLines ? ll.size() - proto::kMaxLogLines : 0;
      for (size_t i = from; i < ll.size(); ++i)
        if (ll[i].is_string()) e.last_log.push_back(clip(ll[i], proto::kMaxLogLineBytes));
    }
  } else if (name == "checkpoint_saved") {
    e.kind = proto::EventKind::kCheckpointSaved;
    e.path = f.value("path", "");
    e.bytes = opt_i64(f, "bytes").value_or(0);
    e.complete = true;  // this node's shard is durable
    if (f.contains("seconds") && f["seconds"].is_number())
      e.seconds = std::clamp(f["seconds"].get<double>(), 0.0, 1e7);
    if (f.contains("deleted") && f["deleted"].is_array())
      for (const json& d : f["deleted"])
        if (d.is_number_integer() && e.deleted.size() < 4096) e.deleted.push_back(d.get<int64_t>());
    if (!e.step || e.path.empty()) return;
  } else if (name == "checkpoint_failed") {
    e.kind = proto::EventKind::kCheckpointFailed;
    e.message = clip(f.value("error", ""), 4000);
    if (!e.step) return;
  } else if (name == "completed") {
    e.kind = proto::EventKind::kJobCompleted;
    if (!e.step) return;
  } else if (name == "stopped") {
    e.kind = proto::EventKind::kJobStopped;
    e.message = clip(f.value("reason", ""), 4000);
    if (f.value("resumable", false)) e.resumable = true;
  } else if (name == "failed") {
    // A fatal error (a checkpoint of another model, model.init_from missing, ...): every
    // attempt would meet it, so ring-coord fails the job instead of waiting for this node.
    e.kind = proto::EventKind::kJobFailed;
    e.message = clip(f.value("error", ""), 4000);
    if (e.message.empty()) e.message = "ringd failed the run";
  } else if (name == "straggler" || name == "straggler_cleared") {
    e.kind = name == "straggler" ? proto::EventKind::kStraggler
                                 : proto::EventKind::kStragglerCleared;
    e.steps = opt_i64(f, "steps");
    if (f.contains("behind_s") && f["behind_s"].is_number())
      e.behind_s = std::clamp(f["behind_s"].get<double>(), 0.0, 1e7);
    e.message = clip(f.value("message", ""), 4000);
    if (!e.rank || (name == "straggler" && (!e.step || !e.steps || !e.behind_s))) return;
  } else if (name == "hang") {
    e.kind = proto::EventKind::kHang;
    if (f.contains("deadline_s") && f["deadline_s"].is_number())
      e.deadline_s = std::clamp(f["deadline_s"].get<double>(), 0.0, 1e7);
    if (f.contains("missing") && f["missing"].is_array())
      for (const json& r : f["missing"])
        if (r.is_number_integer() && e.missing.size() < 512) e.missing.push_back(r.get<int64_t>());
    if (f.contains("waiting") && f["waiting"].is_array())
      for (const json& w : f["waiting"])
        if (w.is_object() && w.contains("rank") && e.waiting.size() < 512)
          e.waiting.push_back({w["rank"].get<int64_t>(), clip(w.value("where", "?"), 500)});
    e.message = clip(f.value("message", ""), 4000);
    if (!e.step || !e.deadline_s) return;
  } else {
    return;  // ringd-only events (attempt_started, restarting, ...) stay in its log
  }
  send(e);
}

protocol::Register make_registration(int64_t job, int node_rank, int workers_per_node,
                                     const NodeFacts& facts) {
  protocol::Register reg;
  reg.node = coord_node_name(job, node_rank);
  if (facts.gpus)
    for (const placement::GpuInfo& g : facts.gpus->gpus)
      reg.gpus.push_back(
          {g.index, g.name.empty() ? "unknown" : g.name, static_cast<int64_t>(g.memory_mib)});
  if (facts.cpu) {
    reg.topology.numa_nodes =
        std::max<int64_t>(1, static_cast<int64_t>(facts.cpu->numa_nodes.size()));
    reg.topology.cpus = std::max<int64_t>(1, static_cast<int64_t>(facts.cpu->cores.size()));
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0)
    reg.topology.host_memory_mib = static_cast<int64_t>(pages) * page / (1024 * 1024);
  reg.topology.summary =
      fmt::format("{} GPU(s), {} core(s), {} NUMA node(s), {} worker(s) per node",
                  reg.gpus.size(), reg.topology.cpus, reg.topology.numa_nodes, workers_per_node);
  reg.ringd_version =
      fmt::format("ringd {} (protocol {})", ring::kVersion, protocol::kVersion);
  return reg;
}

}  // namespace ring::ringd
