#include "coordinator/coordinator.h"

#include "common/cli/endpoint.h"

#include <fcntl.h>
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

#include "common/protocol/protocol.h"
#include "common/topology/cluster.h"
#include "coordinator/auth.h"
#include "coordinator/client_requests.h"
#include "coordinator/daemon_messages.h"
#include "coordinator/engine.h"
#include "coordinator/log.h"
#include "coordinator/security.h"
#include "coordinator/store.h"
#include "coordinator/timers.h"
#include "coordinator/web.h"

namespace ring::coord {

using nlohmann::json;

namespace {

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

// The loop: sockets, ZAP, parsing, one transaction per message, then the timers. The parts do
// the work: auth.h (who speaks), daemon_messages.h, client_requests.h, timers.h, over the
// Engine they share (engine.h).
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
  std::unique_ptr<Engine> engine;
  std::unique_ptr<DaemonMessages> daemons;
  std::unique_ptr<ClientRequests> requests;
  std::unique_ptr<Timers> timers;
  // The web endpoint: its own thread and read-only connection (declared after the engine so it
  // stops first; the server before the app its handler uses).
  std::unique_ptr<WebApp> web;
  std::unique_ptr<HttpServer> http;
  std::string http_url;

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
  }

  void bind_all() {
    zap = zmq::socket_t(ctx, zmq::socket_type::rep);
    zap.set(zmq::sockopt::linger, 0);
    zap.bind("inproc://zeromq.zap.01");
    std::vector<std::string> eps = opts.endpoints;
    if (eps.empty()) eps.push_back(default_endpoint());
    for (const auto& ep : eps) {
      if (std::string why = flags::endpoint_error(ep, flags::EndpointUse::kBind); !why.empty())
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

  void start_http() {
    if (opts.http_listen.empty()) return;
    std::string why;
    auto where = parse_http_listen(opts.http_listen, &why);
    if (!where) throw std::invalid_argument("--http '" + opts.http_listen + "': " + why);
    if (!opts.http_token && !is_loopback_host(where->host))
      throw SecurityError("--http " + opts.http_listen +
                          " is not a loopback address: it needs the token (leave out "
                          "--http-auth none)");
    WebOptions w;
    w.db_path = opts.state_dir + "/coord.db";
    if (opts.http_token) w.token = read_or_create_http_token(opts.state_dir);
    w.limits.window_steps = opts.metrics_window_steps;
    w.limits.max_ranks = opts.metrics_max_ranks;
    {
      char h[256] = {};
      if (::gethostname(h, sizeof h - 1) == 0 && h[0]) {
        w.host_names.push_back(h);
        const std::string full = h;
        if (const size_t dot = full.find('.'); dot != std::string::npos)
          w.host_names.push_back(full.substr(0, dot));
      }
    }
    web = std::make_unique<WebApp>(std::move(w));
    HttpServer::Options so;
    so.host = where->host;
    so.port = where->port;
    so.timeout_s = opts.http_timeout_s;
    so.max_connections = opts.http_max_connections;
    try {
      http = std::make_unique<HttpServer>(
          so, [app = web.get()](const HttpRequest& r) { return app->handle(r); });
    } catch (const HttpError& e) {
      // Only the web part fails: the coordinator serves its jobs. The address file names no
      // endpoint, so nothing is pointed at whoever holds the port.
      record_http_address(opts.state_dir, "");
      web.reset();
      logger()->error("web endpoint not started: {}{}", e.what(),
                      where->port ? "; " + describe_port_holder(where->port) : std::string());
      return;
    }
    http_url = "http://" + http->address() + "/";
    record_http_address(opts.state_dir, http_url);
    logger()->info("web endpoint on {} ({})", http_url,
                   opts.http_token ? "token required" : "no token: every local user may read it");
  }

  // <state_dir>/endpoints: every endpoint this state was served at, one a line. ringctl reads
  // the state read-only when nothing answers at one of them (cli/local_state.h), e.g. after the
  // ring-coord a `ringctl run` started has stopped.
  void record_endpoints() {
    const std::string path = opts.state_dir + "/" + kEndpointsFile;
    int fd = open_private_file(path, "endpoints file");
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
      text.append(buf, static_cast<size_t>(n));
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
      ++engine->n_messages;
      std::string peer(1, static_cast<char>(li));
      peer += frames[0].to_string();
      if (frames.size() != 2) {
        logger()->warn("rejected a message of {} frames (expected 1)", frames.size() - 1);
        reply_error(peer, 0, proto::code::kBadJson, "expected exactly one frame per message");
        continue;
      }
      const zmq::message_t& body = frames[1];
      std::optional<uint32_t> uid = sender_uid(body, l.curve);
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
    engine->outbox.clear();
    auto t0 = Clock::now();
    try {
      Txn t(store->db());
      std::visit([&](const auto& m) { handle(peer, uid, m); }, msg);
      t.commit();
      engine->flush_outbox();
      if (seconds_since(t0) > kSlow)
        logger()->warn("slow: {} took {:.1f} ms", proto::type_name(msg), 1e3 * seconds_since(t0));
      return;
    } catch (const Refused& e) {
      logger()->info("refused {} from uid {}: {}", proto::type_name(msg), uid, e.what());
      engine->outbox.clear();
      reply_error(peer, id, e.code, e.what(), e.field);
    } catch (const InvalidTransition& e) {
      engine->outbox.clear();
      reply_error(peer, id, proto::code::kInvalidState, e.what(), "job");
    } catch (const std::exception& e) {
      logger()->error("internal error handling {}: {}", proto::type_name(msg), e.what());
      engine->outbox.clear();
      reply_error(peer, id, proto::code::kInternal, std::string("internal error: ") + e.what());
    }
    // The transaction rolled back; in-memory node bindings may be ahead of the database, which
    // is harmless (they are rebuilt from heartbeats).
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
      if (items[0].revents & ZMQ_POLLIN) serve_zap(zap, clients_file);
      for (size_t i = 1; i < items.size(); ++i)
        if (items[i].revents & ZMQ_POLLIN) handle_listener(i - 1);
      if (Clock::now() - last_timer >= tick) {
        last_timer = Clock::now();
        timers->tick();
      }
    }
    try {
      timers->flush();
    } catch (const std::exception& e) {
      logger()->error("final flush: {}", e.what());
    }
  }

  void reply_error(const std::string& peer, int64_t id, const std::string& code,
                   const std::string& message, const std::string& field = "") {
    ++engine->n_rejected;
    send_now(peer, proto::encode(proto::ErrorReply{id, code, message, field}));
  }

  // A daemon message, a client request, or a message the coordinator does not accept.
  template <typename T>
  void handle(const std::string& peer, uint32_t uid, const T& m) {
    if constexpr (requires { daemons->on(peer, uid, m); })
      daemons->on(peer, uid, m);
    else if constexpr (requires { requests->on(peer, uid, m); })
      requests->on(peer, uid, m);
    else
      throw Refused(proto::code::kUnknownType,
                    std::string("'") + proto::type_name(proto::Message{T{}}) +
                        "' is not a request the coordinator accepts",
                    "type");
  }
};

Coordinator::Coordinator(CoordinatorOptions opts)
    : impl_(std::make_unique<Impl>(std::move(opts), stop_)) {
  std::optional<topology::ClusterTopology> cluster;
  if (!impl_->opts.topology_file.empty())
    cluster = topology::load_cluster_topology(impl_->opts.topology_file);
  impl_->open_state();
  impl_->engine = std::make_unique<Engine>(impl_->opts, *impl_->store);
  impl_->engine->cluster = std::move(cluster);
  impl_->engine->send = [im = impl_.get()](const std::string& peer, const std::string& payload) {
    im->send_now(peer, payload);
  };
  impl_->daemons = std::make_unique<DaemonMessages>(*impl_->engine);
  impl_->requests = std::make_unique<ClientRequests>(*impl_->engine);
  impl_->timers = std::make_unique<Timers>(*impl_->engine);
  impl_->bind_all();
  impl_->start_http();
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

std::string Coordinator::http_url() const {
  return impl_->http_url;
}

std::string Coordinator::server_public_key() const {
  return impl_->server_public;
}

Coordinator::Stats Coordinator::stats() const {
  const Engine& e = *impl_->engine;
  return {e.n_messages.load(), e.n_rejected.load(), e.n_heartbeats.load(), e.n_steps.load()};
}

}  // namespace ring::coord
