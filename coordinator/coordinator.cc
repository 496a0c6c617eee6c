#include "coordinator/coordinator.h"

#include <fcntl.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/cli/job_dir.h"
#include "common/protocol/protocol.h"
#include "common/spec/parse.h"
#include "common/topology/cluster.h"
#include "common/topology/global_order.h"
#include "common/topology/hostlist.h"
#include "coordinator/queries.h"
#include "coordinator/store.h"

namespace ring::coord {

namespace proto = ring::protocol;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Every log line's text passes through escape_for_log (security.h): peers control many of the
// strings we log (names, messages, reasons, parse errors that quote their input), and a newline
// in one of them must not start a forged line of ours.
class EscapingSink : public spdlog::sinks::sink {
 public:
  explicit EscapingSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {
    set_level(spdlog::level::trace);  // the logger's level filters
  }
  void log(const spdlog::details::log_msg& msg) override {
    std::string text = escape_for_log({msg.payload.data(), msg.payload.size()});
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(text.data(), text.size());
    inner_->log(copy);
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override {
    inner_->set_formatter(std::move(f));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
};

std::shared_ptr<spdlog::logger> logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::get("coord");
    if (!lg) {
      lg = std::make_shared<spdlog::logger>(
          "coord", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
      lg->set_level(spdlog::get_level());
      spdlog::register_logger(lg);
    }
    // A logger made elsewhere (a test, an embedding program) gets the same escaping.
    for (auto& sink : lg->sinks())
      if (!std::dynamic_pointer_cast<EscapingSink>(sink))
        sink = std::make_shared<EscapingSink>(sink);
    return lg;
  }();
  return l;
}

// Operations longer than this are logged (warn) as slow.
constexpr double kSlow = 0.02;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t request_id(const proto::Message& m) {
  return std::visit(
      [](const auto& x) -> int64_t {
        if constexpr (requires { x.id; })
          return x.id;
        else
          return 0;
      },
      m);
}

// "ipc:///run/x/coord.sock" -> "/run/x/coord.sock"
std::string ipc_path(const std::string& ep) {
  return ep.substr(6);
}

// A node is (uid, name): the uid its daemon connected with and the name it registered. Two
// users' daemons may use one name; neither can speak for the other's node.
struct NodeId {
  uint32_t uid = 0;
  std::string name;
  auto operator<=>(const NodeId&) const = default;
};

NodeId member_id(const JobNodeRow& jn) {
  return {static_cast<uint32_t>(jn.node_uid), jn.node};
}

bool unix_socket_alive(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    ::close(fd);
    return false;
  }
  std::memcpy(a.sun_path, path.c_str(), path.size());
  bool alive = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return alive;
}

}  // namespace

struct Coordinator::Impl {
  CoordinatorOptions opts;
  std::atomic<bool>& stop;
  int lock_fd = -1;
  std::unique_ptr<Store> store;
  zmq::context_t ctx;
  zmq::socket_t zap;
  struct Listener {
    zmq::socket_t sock;
    bool curve = false;
    std::string endpoint;
  };
  std::vector<Listener> listeners;
  std::string server_public;
  std::string clients_file;
  // The cluster topology of --topology (empty: built from the leaf switches daemons report).
  std::optional<topology::ClusterTopology> cluster;

  // Live view of nodes (the DB keeps the durable part).
  struct NodeLive {
    std::string peer;  // current peer key; empty when not connected since our start
    uint32_t uid = 0;
    Clock::time_point last;
    double last_unix = 0;
    bool up = true;
    bool dirty = false;  // last_unix not yet written
  };
  std::map<NodeId, NodeLive> nodes;
  std::map<std::string, NodeId> peer_node;  // peer key -> node

  // Batched step metrics and per-job progress.
  std::vector<proto::StepReport> step_buf;
  struct Progress {
    int64_t step;
    double loss, tps;
    double at;  // when it arrived: the job's updated_at, before and after the flush
  };
  std::map<int64_t, Progress> progress_buf;
  Clock::time_point last_metrics_flush = Clock::now();
  Clock::time_point last_hb_flush = Clock::now();

  // Commands in flight, for the ack's event.
  struct CmdInfo {
    int64_t job;
    proto::CommandKind kind;
    NodeId node;  // only this node may acknowledge it
  };
  std::map<int64_t, CmdInfo> commands;
  int64_t next_cmd = 1;
  std::map<std::pair<int64_t, std::string>, Clock::time_point> last_reconcile;

  // Replies and commands of the message being handled, sent after its transaction commits.
  std::vector<std::pair<std::string, std::string>> outbox;

  std::atomic<uint64_t> n_messages{0}, n_rejected{0}, n_heartbeats{0}, n_steps{0};

  Impl(CoordinatorOptions o, std::atomic<bool>& s) : opts(std::move(o)), stop(s), ctx(1) {}

  ~Impl() {
    for (auto& l : listeners) {
      l.sock.set(zmq::sockopt::linger, 0);
      if (!l.curve && l.endpoint.rfind("ipc://", 0) == 0) {
        l.sock.close();
        ::unlink(ipc_path(l.endpoint).c_str());
      }
    }
    if (lock_fd >= 0) ::close(lock_fd);
  }

  // ---- setup ---------------------------------------------------------------------------------

  void open_state() {
    if (opts.state_dir.empty()) throw std::runtime_error("no state directory given");
    // Parents (e.g. ~/.local/state on a fresh account) are created with the usual modes; the
    // state directory itself is private (0700).
    if (const auto parent = std::filesystem::path(opts.state_dir).parent_path(); !parent.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(parent, ec);
      if (ec)
        throw SecurityError("cannot create " + parent.string() +
                            " (parent of the state directory " + opts.state_dir +
                            "): " + ec.message());
    }
    // The state directory holds every job's spec and the CURVE secret key: private, checked as
    // ssh checks ~/.ssh (no symlink, ours, 0700), and so are the files in it.
    prepare_state_dir(opts.state_dir);
    std::string lock = opts.state_dir + "/coord.lock";
    lock_fd = open_private_file(lock, "lock file");
    if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {};
      ssize_t n = ::pread(lock_fd, buf, sizeof buf - 1, 0);
      (void)n;
      throw std::runtime_error("another ring-coord (pid " + std::string(buf) +
                               ") is using state directory " + opts.state_dir);
    }
    std::string pid = std::to_string(::getpid());
    if (::ftruncate(lock_fd, 0) != 0 || ::pwrite(lock_fd, pid.data(), pid.size(), 0) < 0) {
      // Informational only.
    }
    // SQLite creates the database 0644 (less the umask) and gives -wal and -shm the database's
    // mode: create it 0600 first, and refuse existing files that others could read.
    const std::string db = opts.state_dir + "/coord.db";
    ::close(open_private_file(db, "database"));
    check_private_file_if_present(db + "-wal", "database log");
    check_private_file_if_present(db + "-shm", "database index");
    store = std::make_unique<Store>(db, Store::Options{opts.synchronous_full, 0});
    // Every node gets a full heartbeat timeout from our start: the time we were down is not
    // theirs.
    auto now = Clock::now();
    for (const auto& n : store->nodes()) {
      NodeLive nl;
      nl.uid = static_cast<uint32_t>(n.uid);
      nl.last = now;
      nl.last_unix = n.last_heartbeat;
      nl.up = n.state == "up";
      nodes[{static_cast<uint32_t>(n.uid), n.name}] = nl;
    }
  }

  void bind_all() {
    zap = zmq::socket_t(ctx, zmq::socket_type::rep);
    zap.set(zmq::sockopt::linger, 0);
    zap.bind("inproc://zeromq.zap.01");
    std::vector<std::string> eps = opts.endpoints;
    if (eps.empty()) eps.push_back(default_endpoint());
    for (const auto& ep : eps) {
      if (std::string why = endpoint_error(ep); !why.empty())
        throw std::invalid_argument("endpoint '" + ep + "': " + why);
      Listener l{zmq::socket_t(ctx, zmq::socket_type::router), false, ep};
      l.sock.set(zmq::sockopt::linger, 0);
      // Messages above 1 MiB make libzmq drop the connection; 64 KiB..1 MiB get a too_large
      // reply.
      l.sock.set(zmq::sockopt::maxmsgsize, int64_t{1} << 20);
      l.sock.set(zmq::sockopt::sndhwm, 100000);
      l.sock.set(zmq::sockopt::rcvhwm, 100000);
      l.sock.set(zmq::sockopt::zap_domain, "ringmaster");
      if (ep.rfind("ipc://", 0) == 0) {
        std::string path = ipc_path(ep);
        auto slash = path.rfind('/');
        if (slash == std::string::npos || slash == 0)
          throw SecurityError("ipc endpoint " + ep + " needs an absolute path in a directory");
        prepare_socket_dir(path.substr(0, slash), opts.socket_mode);
        if (unix_socket_alive(path))
          throw std::runtime_error("endpoint " + ep + " is in use by another process");
        l.sock.bind(ep);
        ::chmod(path.c_str(), opts.socket_mode == SocketMode::kShared ? 0666 : 0600);
      } else if (ep.rfind("tcp://", 0) == 0) {
        auto keys = load_or_create_curve_keys(opts.state_dir + "/curve", "server");
        server_public = keys.public_key;
        clients_file = opts.state_dir + "/curve/clients";
        check_clients_file(clients_file);
        l.curve = true;
        l.sock.set(zmq::sockopt::curve_server, 1);
        l.sock.set(zmq::sockopt::curve_secretkey, keys.secret_key);
        l.sock.bind(ep);
        l.endpoint = l.sock.get(zmq::sockopt::last_endpoint);
      } else {
        throw std::runtime_error("unsupported endpoint '" + ep +
                                 "' (use ipc://PATH or tcp://HOST:PORT)");
      }
      logger()->info("listening on {}{}", l.endpoint, l.curve ? " (CURVE)" : "");
      listeners.push_back(std::move(l));
    }
    record_endpoints();
  }

  // <state_dir>/endpoints: every endpoint this state was served at, one a line. ringctl reads
  // the state read-only when nothing answers at one of them (cli/local_state.h), e.g. after the
  // ring-coord a `ringctl run` started has stopped.
  void record_endpoints() {
    const std::string path = opts.state_dir + "/" + kEndpointsFile;
    int fd = open_private_file(path, "endpoints file");
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    std::set<std::string> known;
    for (size_t a = 0, b; a < text.size(); a = b + 1) {
      b = text.find('\n', a);
      if (b == std::string::npos) b = text.size();
      known.insert(text.substr(a, b - a));
    }
    std::string add;
    for (const auto& l : listeners)
      if (!known.count(l.endpoint)) add += l.endpoint + "\n";
    if (!text.empty() && text.back() != '\n') add = "\n" + add;
    if (!add.empty() && ::pwrite(fd, add.data(), add.size(), static_cast<off_t>(text.size())) < 0)
      logger()->warn("cannot record the endpoints in {}: {}", path, std::strerror(errno));
    ::close(fd);
  }

  // ---- ZAP (RFC 27) --------------------------------------------------------------------------

  void handle_zap() {
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(zap, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
    auto reply = [&](const std::string& status, const std::string& text, const std::string& user) {
      std::vector<zmq::const_buffer> parts;
      std::string ver = "1.0";
      std::string rid = req.size() > 1 ? req[1].to_string() : "";
      zap.send(zmq::buffer(ver), zmq::send_flags::sndmore);
      zap.send(zmq::buffer(rid), zmq::send_flags::sndmore);
      zap.send(zmq::buffer(status), zmq::send_flags::sndmore);
      zap.send(zmq::buffer(text), zmq::send_flags::sndmore);
      zap.send(zmq::buffer(user), zmq::send_flags::sndmore);
      zap.send(zmq::str_buffer(""), zmq::send_flags::none);
    };
    if (req.size() < 6) return reply("500", "malformed ZAP request", "");
    std::string mechanism = req[5].to_string();
    if (mechanism == "NULL") return reply("200", "OK", "");
    if (mechanism == "CURVE" && req.size() >= 7 && req[6].size() == 32) {
      char z85[41];
      zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
      std::vector<AuthorizedClient> clients;
      try {
        clients = read_authorized_clients(clients_file);
      } catch (const SecurityError& e) {
        // Changed after we started: admit no one until it is fixed.
        logger()->error("refused CURVE client {}: {}", z85, e.what());
        return reply("400", "clients file refused", "");
      }
      for (const auto& c : clients)
        if (c.public_key == z85) return reply("200", "OK", std::to_string(c.uid));
      logger()->warn("refused CURVE client {} from {}: key not in {}", z85, req[3].to_string(),
                     clients_file);
      return reply("400", "unknown client key", "");
    }
    reply("400", "mechanism not allowed", "");
  }

  // ---- sending -------------------------------------------------------------------------------

  void queue(const std::string& peer, const proto::Message& m) {
    outbox.emplace_back(peer, proto::encode(m));
  }
  void send_now(const std::string& peer, const std::string& payload) {
    auto& l = listeners[static_cast<unsigned char>(peer[0])];
    try {
      if (!l.sock.send(zmq::buffer(peer.data() + 1, peer.size() - 1),
                       zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        return;
      (void)l.sock.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      logger()->warn("send failed: {}", e.what());
    }
  }
  void flush_outbox() {
    for (auto& [peer, payload] : outbox) send_now(peer, payload);
    outbox.clear();
  }
  void reply_error(const std::string& peer, int64_t id, const std::string& code,
                   const std::string& message, const std::string& field = "") {
    ++n_rejected;
    send_now(peer, proto::encode(proto::ErrorReply{id, code, message, field}));
  }

  // Sends a command to a node if it is connected; returns whether it was sent.
  bool command(const NodeId& node, proto::CommandKind kind, int64_t job, int64_t attempt,
               int64_t step, const std::string& reason) {
    auto it = nodes.find(node);
    if (it == nodes.end() || it->second.peer.empty() || !it->second.up) return false;
    int64_t id = next_cmd++;
    commands[id] = {job, kind, node};
    if (commands.size() > 100000) commands.erase(commands.begin());
    queue(it->second.peer, proto::Command{id, kind, job, attempt, step, reason});
    last_reconcile[{job, node.name}] = Clock::now();
    logger()->info("job {}: {} -> {} (attempt {}, step {}): {}", job, proto::to_string(kind),
                   node.name, attempt, step, reason);
    return true;
  }

  // Nodes of a job that are connected and not lost or done.
  std::vector<NodeId> live_members(int64_t job) {
    std::vector<NodeId> out;
    for (const auto& jn : store->job_nodes(job)) {
      if (jn.state == "lost" || jn.state == "done") continue;
      auto it = nodes.find(member_id(jn));
      if (it != nodes.end() && it->second.up) out.push_back(member_id(jn));
    }
    return out;
  }

  // ---- authorisation -------------------------------------------------------------------------

  bool is_admin(uint32_t uid) const {
    return uid == 0 ||
           std::find(opts.admin_uids.begin(), opts.admin_uids.end(), uid) != opts.admin_uids.end();
  }
  JobRow owned_job(int64_t id, uint32_t uid, const char* action) {
    auto j = store->job(id);
    if (!j)
      throw Refused(proto::code::kNotFound, "job " + std::to_string(id) + " does not exist", "job");
    if (static_cast<uint32_t>(j->owner_uid) != uid && !is_admin(uid))
      throw Refused(proto::code::kPermissionDenied,
                    "job " + std::to_string(id) + " belongs to " + j->owner_user + " (uid " +
                        std::to_string(j->owner_uid) + "); " + user_name(uid) + " (uid " +
                        std::to_string(uid) + ") may not " + action +
                        " it (only its owner or an admin may)");
    return *j;
  }

  // ---- job logic -----------------------------------------------------------------------------

  // The job's global ring order over its current member nodes (common/topology), recorded in the
  // job (jobs.ring_order) and as a `ring_order` event when it changes. The topology is the
  // cluster file given with --topology, else a switch tree built from the leaf switches the
  // daemons registered with (nodes under one leaf adjacent); nodes it does not know go last in
  // natural name order.
  void update_ring_order(int64_t job_id) {
    auto j = store->job(job_id);
    if (!j) return;
    std::vector<std::string> members;
    std::map<std::string, uint32_t> member_uid;
    for (const auto& jn : store->job_nodes(job_id))
      if (jn.state != "lost") {
        members.push_back(jn.node);
        member_uid[jn.node] = static_cast<uint32_t>(jn.node_uid);
      }
    std::sort(members.begin(), members.end(), topology::natural_less);
    if (members.empty()) return;
    topology::GlobalOrder g;
    try {
      if (cluster) {
        // The topology knows hosts: order by host, then name the job's nodes again.
        std::vector<std::string> hosts;
        std::map<std::string, std::string> node_of;
        for (const auto& n : members) {
          std::string h = topology::host_of_daemon_node(n);
          if (node_of.count(h)) h = n;  // two of the job's daemons on one host
          node_of[h] = n;
          hosts.push_back(h);
        }
        g = topology::global_ring_order(*cluster, hosts);
        for (auto& n : g.nodes) n = node_of[n];
        for (auto& n : g.unknown) n = node_of[n];
      } else {
        std::vector<topology::Switch> sw{{"(cluster)", -1, {}, {}, 0, 0}};
        std::map<std::string, int> leaf;
        for (const auto& n : members) {
          auto row = store->node(member_uid[n], n);
          if (!row) continue;
          json t = json::parse(row->topology, nullptr, false);
          std::string l = t.is_object() ? t.value("leaf_switch", "") : "";
          if (l.empty()) continue;
          auto it = leaf.find(l);
          if (it == leaf.end()) {
            it = leaf.emplace(l, static_cast<int>(sw.size())).first;
            sw.push_back({l, 0, {}, {}, 0, 0});
          }
          sw[it->second].nodes.push_back(n);
        }
        if (leaf.empty()) {
          g.nodes = members;
          g.method = "natural";
        } else {
          g = topology::global_ring_order(topology::ClusterTopology::tree(std::move(sw)), members);
        }
      }
    } catch (const std::exception& e) {
      logger()->warn("job {}: no ring order: {}", job_id, e.what());
      return;
    }
    std::string order = json(g.nodes).dump();
    if (order == j->ring_order) return;
    store->set_ring_order(job_id, order);
    store->add_event(job_id, j->attempt, "", "ring_order",
                     {{"nodes", g.nodes},
                      {"method", g.method},
                      {"hops", g.hops},
                      {"node_list_hops", g.node_list_hops},
                      {"unknown", g.unknown}});
  }

  int64_t resume_step_of(const JobRow& j) {
    for (const auto& a : store->attempts(j.id))
      if (a.number == j.attempt) return a.resume_step;
    return 0;
  }

  // The current attempt failed (worker death, node loss): roll back per the restart policy, or
  // fail the job. Runs inside the caller's transaction.
  void fail_attempt(JobRow j, const std::string& reason) {
    store->end_attempt(j.id, j.attempt, reason);
    auto members = live_members(j.id);
    if (j.restarts < j.max_restarts) {
      double delay =
          std::min(j.backoff_s * std::pow(2.0, static_cast<double>(j.restarts)), j.backoff_max_s);
      store->set_attempt(j.id, j.attempt, j.restarts + 1);
      store->set_restart(j.id, now_unix() + delay, std::nullopt);
      store->set_state(j.id, JobState::kRestarting, reason);
      store->add_event(j.id, j.attempt, "", "restart_scheduled",
                       {{"restart", j.restarts + 1},
                        {"max_restarts", j.max_restarts},
                        {"delay_s", delay},
                        {"reason", reason}});
      for (const auto& n : members)
        command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, "rolling back: " + reason);
    } else {
      store->set_state(j.id, JobState::kFailed,
                       reason + "; restarts exhausted (" + std::to_string(j.restarts) + " of " +
                           std::to_string(j.max_restarts) + ")");
      for (const auto& n : members)
        command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, "job failed: " + reason);
    }
  }

  void start_next_attempt(JobRow j) {
    int64_t n = j.attempt + 1;
    int64_t resume = j.restart_step ? *j.restart_step
                                    : store->latest_complete_checkpoint(j.id, j.nodes).value_or(0);
    std::string why = j.state_reason.empty() ? "restart" : j.state_reason;
    store->begin_attempt(j.id, n, why, resume);
    store->set_attempt(j.id, n, j.restarts);
    store->set_restart(j.id, std::nullopt, std::nullopt);
    store->set_state(j.id, JobState::kStarting,
                     "attempt " + std::to_string(n) + " from step " + std::to_string(resume));
    store->set_job_nodes_attempt(j.id, n);
    for (const auto& jn : store->job_nodes(j.id)) {
      if (jn.state == "lost") continue;
      auto it = nodes.find(member_id(jn));
      if (it == nodes.end() || !it->second.up) continue;
      store->set_job_node_state(j.id, jn.node, "active");
      command(member_id(jn), proto::CommandKind::kRollBack, j.id, n, resume, why);
    }
  }

  // Finishes cancelling once no member is left running.
  void maybe_cancelled(int64_t job_id) {
    auto j = store->job(job_id);
    if (!j || j->state != JobState::kCancelling) return;
    for (const auto& jn : store->job_nodes(job_id)) {
      if (jn.state != "active") continue;
      auto it = nodes.find(member_id(jn));
      if (it != nodes.end() && it->second.up) return;  // still waiting for this one
    }
    store->end_attempt(job_id, j->attempt, "cancelled");
    store->set_state(job_id, JobState::kCancelled, "every node stopped");
  }

  // A daemon may serve a job of its own uid; root's daemons may serve any job (docs/security.md).
  // --admin-uid is for client requests only: an admin may cancel a job, not speak for its nodes.
  static bool may_serve(uint32_t uid, const JobRow& j) {
    return uid == 0 || static_cast<uint32_t>(j.owner_uid) == uid;
  }

  // Refused joins are recorded (event, warning) once per node and job, so that a daemon listing
  // another user's job in every heartbeat cannot flood that job's events or our log.
  std::set<std::pair<int64_t, NodeId>> refused_joins;

  void refuse_join(const JobRow& j, const NodeId& node, const std::string& reason) {
    if (!refused_joins.insert({j.id, node}).second) return;
    if (refused_joins.size() > 100000) refused_joins.clear();
    logger()->warn("node {} (uid {}) may not serve job {}: {}", node.name, node.uid, j.id, reason);
    store->add_event(j.id, j.attempt, node.name, "join_refused",
                     {{"uid", node.uid}, {"reason", reason}});
  }

  // A daemon says it serves this job (register/heartbeat). Returns its assignment.
  std::optional<proto::Assignment> join_job(const NodeId& node, const proto::JobProgress& jp) {
    auto j = store->job(jp.job);
    if (!j) {
      logger()->debug("node {} (uid {}) claims job {}, which does not exist", node.name, node.uid,
                      jp.job);
      return std::nullopt;
    }
    if (!may_serve(node.uid, *j)) {
      refuse_join(*j, node,
                  "daemon uid " + std::to_string(node.uid) + " is not the job owner's (uid " +
                      std::to_string(j->owner_uid) + ")");
      return std::nullopt;
    }
    auto members = store->job_nodes(j->id);
    auto me = std::find_if(members.begin(), members.end(),
                           [&](const JobNodeRow& r) { return r.node == node.name; });
    bool member = me != members.end();
    if (member && member_id(*me) != node) {
      // The job already has a member of this name that is another uid's node (the owner's and
      // root's daemons both may serve it). It keeps its place while it is alive.
      auto other = nodes.find(member_id(*me));
      if (me->state != "lost" && other != nodes.end() && other->second.up) {
        refuse_join(
            *j, node,
            "the job already has node " + node.name + " of uid " + std::to_string(me->node_uid));
        return std::nullopt;
      }
      member = false;  // the other one is gone: this node takes the name's place in the job
    }
    if (is_terminal(j->state) || j->state == JobState::kCancelling) {
      if (member && me->state == "active" && j->state == JobState::kCancelling) {
        command(node, proto::CommandKind::kStop, j->id, j->attempt, 0, "job cancelled");
      } else if (jp.attempt > 0 && (!member || me->state == "active")) {
        command(node, proto::CommandKind::kStop, j->id, j->attempt, 0,
                std::string("job is ") + to_string(j->state));
      }
      return proto::Assignment{j->id, j->attempt, 0, to_string(j->state)};
    }
    if (j->state == JobState::kPending) {
      int64_t resume = store->latest_complete_checkpoint(j->id, j->nodes).value_or(0);
      store->begin_attempt(j->id, 1 + j->attempt, "first start", resume);
      store->set_attempt(j->id, 1 + j->attempt, j->restarts);
      store->add_job_node(j->id, node.name, node.uid, 1 + j->attempt);
      store->set_state(j->id, JobState::kStarting, "node " + node.name + " joined");
      update_ring_order(j->id);
      j = store->job(jp.job);
    } else if (!member || me->state == "lost") {
      store->add_job_node(j->id, node.name, node.uid, j->attempt);
      store->add_event(j->id, j->attempt, node.name, "node_joined", json::object());
      update_ring_order(j->id);
    }
    int64_t resume = resume_step_of(*j);
    if ((j->state == JobState::kStarting || j->state == JobState::kRunning) && jp.attempt > 0 &&
        jp.attempt < j->attempt)
      command(node, proto::CommandKind::kRollBack, j->id, j->attempt, resume,
              "node is on attempt " + std::to_string(jp.attempt));
    return proto::Assignment{j->id, j->attempt, resume, to_string(j->state)};
  }

  // The node a daemon message speaks for: (the connection's uid, the message's node name). The
  // peer must be bound to it, or (after our restart) the node must be known; otherwise the daemon
  // must register. There is no way to speak for another uid's node, root included (root's
  // daemons are nodes of uid 0).
  NodeId bind_node(const std::string& peer, uint32_t uid, const std::string& name) {
    NodeId id{uid, name};
    auto pn = peer_node.find(peer);
    if (pn != peer_node.end()) {
      if (pn->second != id)
        throw Refused(proto::code::kWrongPeer,
                      "this connection registered as node " + pn->second.name + ", not " + name,
                      "node");
      return id;
    }
    if (!nodes.count(id))
      throw Refused(proto::code::kNotRegistered, "node " + name + " (uid " + std::to_string(uid) +
                                                     ") is not registered; send register first");
    rebind(peer, id);
    logger()->info("node {} reconnected (uid {})", name, uid);
    return id;
  }

  void rebind(const std::string& peer, const NodeId& node) {
    auto& nl = nodes[node];
    if (!nl.peer.empty() && nl.peer != peer) peer_node.erase(nl.peer);
    nl.peer = peer;
    nl.uid = node.uid;
    peer_node[peer] = node;
    mark_alive(node);
  }

  void mark_alive(const NodeId& node) {
    auto& nl = nodes[node];
    nl.last = Clock::now();
    nl.last_unix = now_unix();
    nl.dirty = true;
    if (!nl.up) {
      nl.up = true;
      store->set_node_state(node.uid, node.name, "up");
      store->add_event(std::nullopt, 0, node.name, "node_up", {{"uid", node.uid}});
      logger()->info("node {} (uid {}) is back", node.name, node.uid);
    }
  }

  // ---- handlers ------------------------------------------------------------------------------

  void on(const std::string& peer, uint32_t uid, const proto::Register& m) {
    // The node is (uid, name): registering never touches another uid's node of the same name.
    NodeId id{uid, m.node};
    if (auto pn = peer_node.find(peer); pn != peer_node.end() && pn->second != id)
      throw Refused(proto::code::kWrongPeer,
                    "this connection registered as node " + pn->second.name + ", not " + m.node,
                    "node");
    json gpus = json::array();
    for (const auto& g : m.gpus)
      gpus.push_back({{"index", g.index}, {"model", g.model}, {"memory_mib", g.memory_mib}});
    json topo = {{"numa_nodes", m.topology.numa_nodes},
                 {"cpus", m.topology.cpus},
                 {"host_memory_mib", m.topology.host_memory_mib},
                 {"leaf_switch", m.topology.leaf_switch},
                 {"summary", m.topology.summary}};
    double t = now_unix();
    store->upsert_node({m.node, uid, "up", t, t, gpus.dump(), topo.dump(), m.ringd_version});
    bool was_lost = nodes.count(id) && !nodes[id].up;
    nodes[id].up = true;
    rebind(peer, id);
    store->add_event(std::nullopt, 0, m.node, was_lost ? "node_up" : "node_registered",
                     {{"uid", uid}, {"gpus", m.gpus.size()}, {"ringd_version", m.ringd_version}});
    proto::Registered r{m.node, opts.heartbeat_interval_s, opts.heartbeat_timeout_s, {}};
    for (const auto& jp : m.jobs)
      if (auto a = join_job(id, jp)) r.jobs.push_back(*a);
    queue(peer, r);
  }

  void on(const std::string& peer, uint32_t uid, const proto::Heartbeat& m) {
    ++n_heartbeats;
    NodeId id = bind_node(peer, uid, m.node);
    mark_alive(id);
    for (const auto& jp : m.jobs) {
      // The hot path (1000s per second): two indexed single-row reads.
      auto j = store->job_brief(jp.job);
      if (!j) continue;
      auto me = store->job_node(jp.job, m.node);
      if (!me || me->state == "lost" || member_id(*me) != id) {
        join_job(id, jp);
        continue;
      }
      // Reconcile: commands are idempotent and re-sent (at most every 2 s) until the daemon's
      // heartbeat shows it complied.
      auto key = std::make_pair(jp.job, m.node);
      auto lr = last_reconcile.find(key);
      bool due = lr == last_reconcile.end() ||
                 seconds_since(lr->second) > std::max(2.0, 2 * opts.heartbeat_interval_s);
      if (!due || jp.attempt == 0) continue;
      if ((j->state == JobState::kCancelling && me->state == "active") ||
          (is_terminal(j->state) && me->state == "active")) {
        command(id, proto::CommandKind::kStop, jp.job, j->attempt, 0,
                std::string("job is ") + to_string(j->state));
      } else if ((j->state == JobState::kStarting || j->state == JobState::kRunning) &&
                 jp.attempt < j->attempt) {
        command(id, proto::CommandKind::kRollBack, jp.job, j->attempt,
                resume_step_of(*store->job(jp.job)),
                "node is on attempt " + std::to_string(jp.attempt));
      }
    }
  }

  // A job message (step, event) from a node: the node must be a member of the job, as this
  // uid's node, and the uid must be allowed to serve the job (its owner, or root).
  JobRow member_job(const NodeId& node, int64_t job_id) {
    auto j = store->job(job_id);
    if (!j)
      throw Refused(proto::code::kNotFound, "job " + std::to_string(job_id) + " does not exist",
                    "job");
    if (!may_serve(node.uid, *j))
      throw Refused(proto::code::kPermissionDenied,
                    "job " + std::to_string(job_id) + " belongs to uid " +
                        std::to_string(j->owner_uid) + "; a daemon of uid " +
                        std::to_string(node.uid) + " may not report for it",
                    "job");
    for (const auto& jn : store->job_nodes(job_id))
      if (member_id(jn) == node) return *j;
    throw Refused(proto::code::kPermissionDenied,
                  "node " + node.name + " (uid " + std::to_string(node.uid) +
                      ") is not part of job " + std::to_string(job_id) +
                      " (list the job in register or heartbeat first)",
                  "job");
  }

  void on(const std::string& peer, uint32_t uid, const proto::StepReport& m) {
    ++n_steps;
    NodeId id = bind_node(peer, uid, m.node);
    mark_alive(id);
    JobRow j = member_job(id, m.job);
    if (m.attempt != j.attempt || is_terminal(j.state)) return;  // stale: an older attempt
    if (j.state == JobState::kStarting)
      store->set_state(j.id, JobState::kRunning,
                       "first step of attempt " + std::to_string(j.attempt));
    step_buf.push_back(m);
    auto& p = progress_buf[j.id];
    if (m.step >= p.step) p = {m.step, m.loss, m.tokens_per_s, now_unix()};
  }

  void on(const std::string& peer, uint32_t uid, const proto::Event& m) {
    NodeId id = bind_node(peer, uid, m.node);
    mark_alive(id);
    JobRow j = member_job(id, m.job);
    json data = json::object();
    if (m.rank) data["rank"] = *m.rank;
    if (m.pid) data["pid"] = *m.pid;
    if (m.exit_code) data["exit_code"] = *m.exit_code;
    if (m.signal) data["signal"] = *m.signal;
    if (m.step) data["step"] = *m.step;
    if (m.bytes) data["bytes"] = *m.bytes;
    if (!m.path.empty()) data["path"] = m.path;
    if (m.complete) data["complete"] = *m.complete;
    if (!m.last_log.empty()) data["last_log"] = m.last_log;
    if (!m.message.empty()) data["message"] = m.message;
    bool current = m.attempt == j.attempt;
    if (!current) data["stale"] = true;
    store->add_event(j.id, m.attempt, m.node, proto::to_string(m.kind), data);
    switch (m.kind) {
      case proto::EventKind::kWorkerStarted:
        store->upsert_worker(j.id, m.attempt, m.node, *m.rank, m.pid, "running", std::nullopt,
                             std::nullopt);
        break;
      case proto::EventKind::kWorkerExited:
        store->upsert_worker(j.id, m.attempt, m.node, *m.rank, m.pid, "exited", m.exit_code,
                             std::nullopt);
        break;
      case proto::EventKind::kWorkerDied: {
        store->upsert_worker(j.id, m.attempt, m.node, *m.rank, m.pid, "died", m.exit_code,
                             m.signal);
        if (current && is_active(j.state)) {
          std::string how = m.signal ? "signal " + std::to_string(*m.signal)
                                     : "exit code " + std::to_string(*m.exit_code);
          fail_attempt(j, "worker rank " + std::to_string(*m.rank) + " on " + m.node + " died (" +
                              how + ")");
        }
        break;
      }
      case proto::EventKind::kCheckpointSaved:
        store->upsert_checkpoint(j.id, *m.step, m.node, m.path, *m.bytes, *m.complete);
        break;
      case proto::EventKind::kCheckpointFailed:
        break;
      case proto::EventKind::kJobCompleted: {
        if (!current) break;
        store->set_job_node_state(j.id, m.node, "done");
        if (j.state == JobState::kStarting || j.state == JobState::kRunning) {
          store->set_state(j.id, JobState::kCompleting, "node " + m.node + " finished");
          j.state = JobState::kCompleting;
        }
        if (j.state == JobState::kCompleting) {
          bool all_done = true;
          for (const auto& jn : store->job_nodes(j.id))
            if (jn.state == "active") all_done = false;
          if (all_done) {
            store->end_attempt(j.id, j.attempt, "completed");
            store->set_state(j.id, JobState::kCompleted,
                             "every node finished step " + std::to_string(*m.step));
          }
        }
        break;
      }
      case proto::EventKind::kJobStopped:
        store->set_job_node_state(j.id, m.node, "stopped");
        maybe_cancelled(j.id);
        break;
    }
  }

  void on(const std::string& peer, uint32_t uid, const proto::CommandAck& m) {
    NodeId id = bind_node(peer, uid, m.node);
    mark_alive(id);
    auto it = commands.find(m.id);
    if (it == commands.end()) {
      logger()->debug("ack of unknown command {} from {}", m.id, m.node);
      return;
    }
    // Only the node the command was sent to may acknowledge it (ids are small and guessable).
    if (it->second.node != id)
      throw Refused(proto::code::kPermissionDenied,
                    "command " + std::to_string(m.id) + " was not sent to node " + m.node +
                        " (uid " + std::to_string(uid) + ")",
                    "cmd");
    json data = {{"cmd", m.id}, {"command", proto::to_string(it->second.kind)}, {"ok", m.ok}};
    if (!m.error.empty()) data["error"] = m.error;
    if (store->job(it->second.job))
      store->add_event(it->second.job, 0, m.node, "command_ack", data);
    commands.erase(it);
  }

  // What the read-only requests (coordinator/queries.h) add to the database: progress and step
  // reports not yet flushed, and the nodes' liveness.
  LiveView live_view() const {
    LiveView v;
    v.progress = [this](int64_t job) -> std::optional<LiveView::Progress> {
      auto it = progress_buf.find(job);
      if (it == progress_buf.end()) return std::nullopt;
      return LiveView::Progress{it->second.step, it->second.loss, it->second.tps, it->second.at};
    };
    v.node = [this](uint32_t uid, const std::string& name) -> std::optional<LiveView::Node> {
      auto it = nodes.find(NodeId{uid, name});
      if (it == nodes.end()) return std::nullopt;
      return LiveView::Node{it->second.up, it->second.last_unix};
    };
    v.unflushed_steps = &step_buf;
    return v;
  }

  void on(const std::string& peer, uint32_t uid, const proto::SubmitRequest& m) {
    auto r = ring::spec::load_spec_string(m.spec, "submitted spec");
    if (!r.ok()) {
      std::string msg = std::to_string(r.error_count()) + " error(s) in the spec:";
      int shown = 0;
      for (const auto& d : r.diagnostics) {
        if (d.severity != ring::spec::Diagnostic::Severity::kError) continue;
        if (++shown > 10) {
          msg += "\n  ...";
          break;
        }
        msg += "\n  " + d.str();
      }
      throw Refused(proto::code::kInvalidSpec, msg, "spec");
    }
    const auto& s = *r.spec;
    JobRow j;
    j.name = m.name.empty() ? s.job.name : m.name;
    if (j.name.empty()) j.name = "job";
    j.owner_uid = uid;
    j.owner_user = user_name(uid);
    j.spec = m.spec;
    j.spec_hash = sha256_hex(m.spec);
    j.nodes = s.resources.nodes;
    j.total_steps = m.steps.value_or(s.train.steps);
    j.max_restarts = s.restart.max_restarts;
    j.backoff_s = s.restart.backoff_s;
    j.backoff_max_s = std::max(s.restart.backoff_max_s, 0.0);
    // daemon/INTERFACE.md: the job dir defaults to the owner's (common/cli/job_dir.h);
    // checkpoints go to checkpoint.dir, a relative one under the job dir; none when it is empty.
    j.job_dir = m.job_dir.empty() ? jobdir::default_job_dir(s.job.name, uid) : m.job_dir;
    while (j.job_dir.size() > 1 && j.job_dir.back() == '/') j.job_dir.pop_back();
    j.checkpoint_dir = s.checkpoint.dir.empty() || s.checkpoint.dir[0] == '/'
                           ? s.checkpoint.dir
                           : j.job_dir + "/" + s.checkpoint.dir;
    int64_t id = store->insert_job(j);
    queue(peer, proto::SubmitReply{m.id, id, j.name, j.spec_hash, "pending"});
  }

  void on(const std::string& peer, uint32_t, const proto::StatusRequest& m) {
    queue(peer, answer(*store, m, live_view()));
  }

  void on(const std::string& peer, uint32_t, const proto::EventsRequest& m) {
    queue(peer, answer(*store, m));
  }

  void on(const std::string& peer, uint32_t, const proto::StepsRequest& m) {
    queue(peer, answer(*store, m, live_view()));
  }

  void on(const std::string& peer, uint32_t uid, const proto::CancelRequest& m) {
    JobRow j = owned_job(m.job, uid, "cancel");
    std::string who = "cancelled by " + user_name(uid);
    if (j.state == JobState::kCancelling) {
      queue(peer, proto::OkReply{m.id, j.id, "cancelling", "already cancelling"});
      return;
    }
    if (j.state == JobState::kPending) {
      store->set_state(j.id, JobState::kCancelled, who);
    } else {
      store->set_state(j.id, JobState::kCancelling, who);  // refuses terminal states
      for (const auto& n : live_members(j.id))
        command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, who);
      maybe_cancelled(j.id);
    }
    queue(peer, proto::OkReply{m.id, j.id, to_string(store->job(j.id)->state), who});
  }

  void on(const std::string& peer, uint32_t uid, const proto::RestartRequest& m) {
    JobRow j = owned_job(m.job, uid, "restart");
    std::string who = "restart requested by " + user_name(uid);
    if (m.from_step) who += " from step " + std::to_string(*m.from_step);
    if (j.state == JobState::kRestarting) {
      store->set_restart(j.id, now_unix(), m.from_step);
    } else {
      check_transition(j.state, JobState::kRestarting, "job " + std::to_string(j.id));
      if (is_active(j.state)) {
        store->end_attempt(j.id, j.attempt, who);
        for (const auto& n : live_members(j.id))
          command(n, proto::CommandKind::kStop, j.id, j.attempt, 0, who);
      }
      store->set_restart(j.id, now_unix(), m.from_step);
      store->set_state(j.id, JobState::kRestarting, who);
    }
    queue(peer, proto::OkReply{m.id, j.id, "restarting", who});
  }

  void on(const std::string& peer, uint32_t uid, const proto::CheckpointRequest& m) {
    JobRow j = owned_job(m.job, uid, "checkpoint");
    if (j.state != JobState::kRunning)
      throw Refused(proto::code::kInvalidState,
                    "job " + std::to_string(j.id) + " is " + to_string(j.state) +
                        "; only a running job can checkpoint",
                    "job");
    int sent = 0;
    for (const auto& n : live_members(j.id))
      sent += command(n, proto::CommandKind::kCheckpointNow, j.id, j.attempt, 0,
                      "requested by " + user_name(uid));
    store->add_event(j.id, j.attempt, "", "checkpoint_requested",
                     {{"by", user_name(uid)}, {"nodes", sent}});
    queue(peer, proto::OkReply{m.id, j.id, to_string(j.state),
                               "checkpoint_now sent to " + std::to_string(sent) + " node(s)"});
  }

  void on(const std::string& peer, uint32_t, const proto::NodesRequest& m) {
    queue(peer, answer(*store, m, live_view()));
  }

  // What Slurm did with the job (issue 8): recorded with the job; a start after a requeue (node
  // failure, preemption, `ringctl restart`) ends the attempt Slurm killed and begins the next one
  // from the latest complete checkpoint. The new allocation's daemons join it afresh (the old
  // members are marked lost; the ones that come back re-join).
  void on(const std::string& peer, uint32_t uid, const proto::SlurmJobRequest& m) {
    JobRow j = owned_job(m.job, uid, "record Slurm state of");
    json data = {{"slurm_job_id", m.slurm_job_id}};
    if (m.event == "submit_failed") {
      if (j.state != JobState::kPending)
        throw Refused(proto::code::kInvalidState,
                      "job " + std::to_string(j.id) + " is " + to_string(j.state) +
                          "; only a pending job can fail to submit",
                      "job");
      store->add_event(j.id, 0, "", "slurm_submit_failed", {{"message", m.message}});
      store->set_state(j.id, JobState::kFailed, "sbatch refused the job: " + m.message);
      queue(peer, proto::OkReply{m.id, j.id, "failed", "recorded"});
      return;
    }
    if (m.slurm_job_id != j.slurm_job_id) store->set_slurm_job_id(j.id, m.slurm_job_id);
    if (m.event == "submitted") {
      store->add_event(j.id, j.attempt, "", "slurm_submitted", data);
      queue(peer, proto::OkReply{m.id, j.id, to_string(j.state),
                                 "Slurm job " + m.slurm_job_id + " recorded"});
      return;
    }
    data["restarts"] = m.restarts;
    data["nodes"] = m.nodes;
    store->add_event(j.id, j.attempt, "", "slurm_started", data);
    std::string msg = "start recorded";
    if (m.restarts > 0 && j.attempt > 0 && !is_terminal(j.state) &&
        j.state != JobState::kCancelling) {
      std::string why = "Slurm requeue " + std::to_string(m.restarts) + " of job " +
                        m.slurm_job_id + " on " + m.nodes;
      if (is_active(j.state)) store->end_attempt(j.id, j.attempt, why);
      if (j.state != JobState::kRestarting) store->set_state(j.id, JobState::kRestarting, why);
      for (const auto& jn : store->job_nodes(j.id))
        if (jn.state != "lost") store->set_job_node_state(j.id, jn.node, "lost");
      int64_t n = j.attempt + 1;
      int64_t resume = store->latest_complete_checkpoint(j.id, j.nodes).value_or(0);
      store->begin_attempt(j.id, n, why, resume);
      store->set_attempt(j.id, n, j.restarts);
      store->set_restart(j.id, std::nullopt, std::nullopt);
      store->set_state(j.id, JobState::kStarting,
                       "attempt " + std::to_string(n) + " from step " + std::to_string(resume) +
                           " (" + why + ")");
      msg = "attempt " + std::to_string(n) + " from step " + std::to_string(resume);
    }
    queue(peer, proto::OkReply{m.id, j.id, to_string(store->job(j.id)->state), msg});
  }

  template <typename T>
  void on(const std::string&, uint32_t, const T&) {
    throw Refused(proto::code::kUnknownType,
                  std::string("'") + proto::type_name(proto::Message{T{}}) +
                      "' is not a request the coordinator accepts",
                  "type");
  }

  // ---- the loop ------------------------------------------------------------------------------

  void handle_listener(size_t li) {
    auto& l = listeners[li];
    for (int burst = 0; burst < 256; ++burst) {
      std::vector<zmq::message_t> frames;
      zmq::recv_result_t got;
      try {
        got = zmq::recv_multipart(l.sock, std::back_inserter(frames), zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        logger()->warn("receive failed: {}", e.what());
        return;
      }
      if (!got) return;
      ++n_messages;
      std::string peer(1, static_cast<char>(li));
      peer += frames[0].to_string();
      if (frames.size() != 2) {
        logger()->warn("rejected a message of {} frames (expected 1)", frames.size() - 1);
        reply_error(peer, 0, proto::code::kBadJson, "expected exactly one frame per message");
        continue;
      }
      const zmq::message_t& body = frames[1];
      std::optional<uint32_t> uid;
      if (l.curve) {
        const char* u = zmq_msg_gets(body.handle(), "User-Id");
        if (u && *u) uid = static_cast<uint32_t>(std::strtoul(u, nullptr, 10));
      } else {
        uid = uid_from_peer_address(zmq_msg_gets(body.handle(), "Peer-Address"));
      }
      if (!uid) {
        reply_error(peer, 0, proto::code::kPermissionDenied,
                    "cannot tell the peer's user (no peer credentials)");
        continue;
      }
      std::string_view bytes(static_cast<const char*>(body.data()), body.size());
      proto::Message msg;
      try {
        msg = proto::parse(bytes);
      } catch (const proto::ProtocolError& e) {
        logger()->warn("rejected message from uid {} ({} bytes): {}", *uid, bytes.size(), e.what());
        reply_error(peer, proto::peek_request_id(bytes), e.code(), e.what(), e.field());
        continue;
      } catch (const std::exception& e) {  // never let bad input end the loop
        logger()->error("rejected message from uid {} ({} bytes): {}", *uid, bytes.size(),
                        e.what());
        reply_error(peer, 0, proto::code::kBadJson, e.what());
        continue;
      }
      dispatch(peer, *uid, msg);
    }
  }

  void dispatch(const std::string& peer, uint32_t uid, const proto::Message& msg) {
    int64_t id = request_id(msg);
    outbox.clear();
    auto t0 = Clock::now();
    try {
      Txn t(store->db());
      std::visit([&](const auto& m) { on(peer, uid, m); }, msg);
      t.commit();
      flush_outbox();
      if (seconds_since(t0) > kSlow)
        logger()->warn("slow: {} took {:.1f} ms", proto::type_name(msg), 1e3 * seconds_since(t0));
      return;
    } catch (const Refused& e) {
      logger()->info("refused {} from uid {}: {}", proto::type_name(msg), uid, e.what());
      outbox.clear();
      reply_error(peer, id, e.code, e.what(), e.field);
    } catch (const InvalidTransition& e) {
      outbox.clear();
      reply_error(peer, id, proto::code::kInvalidState, e.what(), "job");
    } catch (const std::exception& e) {
      logger()->error("internal error handling {}: {}", proto::type_name(msg), e.what());
      outbox.clear();
      reply_error(peer, id, proto::code::kInternal, std::string("internal error: ") + e.what());
    }
    // The transaction rolled back; in-memory node bindings may be ahead of the database, which
    // is harmless (they are rebuilt from heartbeats).
  }

  // Batched, re-sent or superseded data is written without waiting for fsync (NORMAL); every
  // other transaction runs with the configured mode (FULL by default).
  struct RelaxedSync {
    Impl& im;
    explicit RelaxedSync(Impl& i) : im(i) {
      if (im.opts.synchronous_full) im.store->db().exec("PRAGMA synchronous=NORMAL");
    }
    ~RelaxedSync() {
      if (im.opts.synchronous_full) {
        try {
          im.store->db().exec("PRAGMA synchronous=FULL");
        } catch (...) {
        }
      }
    }
  };

  void flush_metrics() {
    if (step_buf.empty() && progress_buf.empty()) return;
    auto t0 = Clock::now();
    RelaxedSync relaxed(*this);
    Txn t(store->db());
    double now = now_unix();
    for (const auto& s : step_buf) store->add_step(s, now);
    for (const auto& [job, p] : progress_buf) store->set_progress(job, p.step, p.loss, p.tps, p.at);
    t.commit();
    if (seconds_since(t0) > kSlow)
      logger()->warn("slow: {} step reports took {:.1f} ms to write", step_buf.size(),
                     1e3 * seconds_since(t0));
    step_buf.clear();
    progress_buf.clear();
  }

  void flush_heartbeats() {
    auto t0 = Clock::now();
    RelaxedSync relaxed(*this);
    Txn t(store->db());
    for (auto& [id, nl] : nodes)
      if (nl.dirty) {
        store->touch_node(id.uid, id.name, nl.last_unix);
        nl.dirty = false;
      }
    t.commit();
    if (seconds_since(t0) > kSlow)
      logger()->warn("slow: heartbeat times took {:.1f} ms to write", 1e3 * seconds_since(t0));
  }

  // Jobs no daemon serves: the coordinator cannot start a daemon, so a job that is not
  // Slurm's (a `ringctl run` killed with kill -9 takes its ringd along) and has had no member
  // node that is up (active or stopped) for a heartbeat timeout fails as "abandoned" instead of
  // staying starting or running forever; the time it spent restarting counts, so an attempt
  // that starts with no daemon at all fails at once. A Slurm job waits: Slurm requeues it or
  // reports its end. Its owner may `ringctl restart` it when a daemon is back.
  std::map<int64_t, Clock::time_point> unserved_since;
  Clock::time_point last_abandon_check = Clock::now();

  void check_abandoned() {
    std::map<int64_t, Clock::time_point> still;
    for (JobState st :
         {JobState::kStarting, JobState::kRunning, JobState::kCompleting, JobState::kRestarting})
      for (const auto& j : store->jobs_in_state(st)) {
        if (!j.slurm_job_id.empty()) continue;
        bool served = false;
        for (const auto& jn : store->job_nodes(j.id)) {
          if (jn.state != "active" && jn.state != "stopped") continue;
          auto it = nodes.find(member_id(jn));
          if (it != nodes.end() && it->second.up) served = true;
        }
        if (served) continue;
        auto prev = unserved_since.find(j.id);
        auto since = prev != unserved_since.end() ? prev->second : Clock::now();
        still[j.id] = since;
        double idle = seconds_since(since);
        if (j.state == JobState::kRestarting || idle <= opts.heartbeat_timeout_s) continue;
        outbox.clear();
        try {
          Txn t(store->db());
          std::string why = "abandoned: no daemon has served attempt " + std::to_string(j.attempt) +
                            " for " + std::to_string(static_cast<int>(std::round(idle))) +
                            " s (its ringd exited or was killed, e.g. with its `ringctl run`)";
          logger()->warn("job {}: {}", j.id, why);
          store->end_attempt(j.id, j.attempt, why);
          store->add_event(j.id, j.attempt, "", "abandoned", {{"reason", why}, {"idle_s", idle}});
          store->set_state(j.id, JobState::kFailed, why);
          t.commit();
          flush_outbox();
          still.erase(j.id);
        } catch (const std::exception& e) {
          logger()->error("failing abandoned job {}: {}", j.id, e.what());
        }
      }
    unserved_since = std::move(still);
  }

  void check_timers() {
    // Lost nodes.
    for (auto& [id, nl] : nodes) {
      if (!nl.up || seconds_since(nl.last) <= opts.heartbeat_timeout_s) continue;
      const std::string& name = id.name;
      outbox.clear();
      try {
        Txn t(store->db());
        nl.up = false;
        std::string why = "node " + name + " lost (no heartbeat for " +
                          std::to_string(static_cast<int>(std::round(seconds_since(nl.last)))) +
                          " s)";
        logger()->warn("{} (uid {})", why, id.uid);
        store->set_node_state(id.uid, name, "lost");
        store->add_event(std::nullopt, 0, name, "node_lost", {{"reason", why}, {"uid", id.uid}});
        for (int64_t jid : store->jobs_of_node(id.uid, name)) {
          auto me = store->job_node(jid, name);
          if (!me || member_id(*me) != id || me->state == "done" || me->state == "lost") continue;
          bool was_active = me->state == "active";
          store->set_job_node_state(jid, name, "lost");
          auto j = store->job(jid);
          store->add_event(jid, j->attempt, name, "node_lost", {{"reason", why}});
          if (was_active && is_active(j->state))
            fail_attempt(*j, why);
          else if (j->state == JobState::kCancelling)
            maybe_cancelled(jid);
        }
        t.commit();
        flush_outbox();
      } catch (const std::exception& e) {
        logger()->error("marking node {} lost: {}", name, e.what());
        nl.up = true;  // retry on the next tick
      }
    }
    // Restarts whose backoff elapsed.
    double now = now_unix();
    for (const auto& j : store->jobs_in_state(JobState::kRestarting)) {
      if (j.restart_at && *j.restart_at > now) continue;
      outbox.clear();
      try {
        Txn t(store->db());
        start_next_attempt(j);
        t.commit();
        flush_outbox();
      } catch (const std::exception& e) {
        logger()->error("restarting job {}: {}", j.id, e.what());
      }
    }
    if (seconds_since(last_abandon_check) >= 0.5) {
      last_abandon_check = Clock::now();
      try {
        check_abandoned();
      } catch (const std::exception& e) {
        logger()->error("checking for abandoned jobs: {}", e.what());
      }
    }
    if (seconds_since(last_metrics_flush) >= opts.metrics_flush_s) {
      last_metrics_flush = Clock::now();
      try {
        flush_metrics();
      } catch (const std::exception& e) {
        logger()->error("writing step metrics: {}", e.what());
      }
    }
    if (seconds_since(last_hb_flush) >= opts.heartbeat_flush_s) {
      last_hb_flush = Clock::now();
      try {
        flush_heartbeats();
      } catch (const std::exception& e) {
        logger()->error("writing heartbeat times: {}", e.what());
      }
    }
  }

  void run() {
    std::vector<zmq::pollitem_t> items;
    items.push_back({zap.handle(), 0, ZMQ_POLLIN, 0});
    for (auto& l : listeners) items.push_back({l.sock.handle(), 0, ZMQ_POLLIN, 0});
    auto tick =
        std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(opts.tick_s * 1000)));
    auto last_timer = Clock::now();
    while (!stop.load()) {
      try {
        zmq::poll(items.data(), items.size(), tick);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (items[0].revents & ZMQ_POLLIN) handle_zap();
      for (size_t i = 1; i < items.size(); ++i)
        if (items[i].revents & ZMQ_POLLIN) handle_listener(i - 1);
      if (Clock::now() - last_timer >= tick) {
        last_timer = Clock::now();
        check_timers();
      }
    }
    try {
      flush_metrics();
      flush_heartbeats();
    } catch (const std::exception& e) {
      logger()->error("final flush: {}", e.what());
    }
  }
};

Coordinator::Coordinator(CoordinatorOptions opts)
    : impl_(std::make_unique<Impl>(std::move(opts), stop_)) {
  if (!impl_->opts.topology_file.empty())
    impl_->cluster = topology::load_cluster_topology(impl_->opts.topology_file);
  impl_->open_state();
  impl_->bind_all();
}

Coordinator::~Coordinator() = default;

void Coordinator::run() {
  impl_->run();
}

std::vector<std::string> Coordinator::endpoints() const {
  std::vector<std::string> out;
  for (const auto& l : impl_->listeners) out.push_back(l.endpoint);
  return out;
}

std::string Coordinator::server_public_key() const {
  return impl_->server_public;
}

Coordinator::Stats Coordinator::stats() const {
  return {impl_->n_messages.load(), impl_->n_rejected.load(), impl_->n_heartbeats.load(),
          impl_->n_steps.load()};
}

}  // namespace ring::coord
