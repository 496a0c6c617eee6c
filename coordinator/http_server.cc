#include "coordinator/http_server.h"

#include <fcntl.h>
#include <pwd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <sstream>
#include <fstream>
#include <filesystem>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

namespace ring::coord {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::optional<std::string> percent_decode(std::string_view s, bool plus_is_space) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

bool is_ip_address(const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

bool is_loopback_host(const std::string& host) {
  boost::system::error_code ec;
  auto a = asio::ip::make_address(host, ec);
  return !ec && a.is_loopback();
}

namespace {

HttpResponse plain(int status, std::string text) {
  return HttpResponse{status, "text/plain; charset=utf-8", std::move(text) + "\n", {}};
}

// Target -> path and query; nullopt when the encoding is bad.
bool split_target(const std::string& target, HttpRequest& r) {
  size_t q = target.find('?');
  auto path = percent_decode(std::string_view(target).substr(0, q), false);
  if (!path) return false;
  r.path = *path;
  if (q == std::string::npos) return true;
  std::string_view rest = std::string_view(target).substr(q + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view kv = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (kv.empty()) continue;
    size_t eq = kv.find('=');
    auto k = percent_decode(kv.substr(0, eq), true);
    auto v =
        percent_decode(eq == std::string_view::npos ? std::string_view() : kv.substr(eq + 1), true);
    if (!k || !v) return false;
    r.query[*k] = *v;
  }
  return true;
}

// The fields a handler sees, from a parsed request (the one conversion the server and
// parse_http_request share). False when the target's percent-encoding is bad.
bool fill_request(const http::request<http::string_body>& req, HttpRequest& r) {
  r.method = std::string(req.method_string());
  r.target = std::string(req.target());
  r.authorization = std::string(req[http::field::authorization]);
  r.cookie = std::string(req[http::field::cookie]);
  r.content_type = std::string(req[http::field::content_type]);
  r.host = std::string(req[http::field::host]);
  r.body = req.body();
  return split_target(r.target, r);
}

}  // namespace

std::optional<HttpRequest> parse_http_request(std::string_view bytes, size_t max_header_bytes,
                                              size_t max_body_bytes, std::string* error) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(static_cast<uint32_t>(max_header_bytes));
  parser.body_limit(max_body_bytes);
  parser.eager(true);
  beast::error_code ec;
  size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    const size_t n = parser.put(asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) break;
    if (n == 0) break;
    used += n;
  }
  if (!ec && !parser.is_done()) {
    parser.put_eof(ec);
    if (!ec && !parser.is_done()) ec = http::error::partial_message;
  }
  if (ec) {
    if (error) *error = ec.message();
    return std::nullopt;
  }
  HttpRequest r;
  if (!fill_request(parser.get(), r)) {
    if (error) *error = "malformed percent-encoding in the target";
    return std::nullopt;
  }
  return r;
}

struct HttpServer::Impl {
  Options opts;
  Handler handler;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::atomic<size_t> open{0};
  std::atomic<uint64_t> n_requests{0}, n_refused{0}, n_evicted{0};
  tcp::endpoint bound;

  struct Session : std::enable_shared_from_this<Session> {
    Impl& srv;
    beast::tcp_stream stream;
    beast::flat_buffer buf;
    std::optional<http::request_parser<http::string_body>> parser;
    http::response<http::string_body> res;

    // Waiting for a request (not handling or writing one); since when; whether a request on it
    // ever proved who sent it. Touched on the server's thread only.
    bool waiting = true;
    bool proven = false;
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();

    Session(Impl& s, tcp::socket sock) : srv(s), stream(std::move(sock)) { ++srv.open; }
    ~Session() { --srv.open; }

    std::chrono::milliseconds timeout() const {
      return std::chrono::milliseconds(static_cast<int64_t>(srv.opts.timeout_s * 1000));
    }

    void read() {
      parser.emplace();
      parser->header_limit(static_cast<uint32_t>(srv.opts.max_header_bytes));
      parser->body_limit(srv.opts.max_body_bytes);
      waiting = true;
      since = std::chrono::steady_clock::now();
      // The head within head_timeout_s (a client that trickles bytes is cut off), then the body.
      stream.expires_after(std::chrono::milliseconds(
          static_cast<int64_t>(std::min(srv.opts.head_timeout_s, srv.opts.timeout_s) * 1000)));
      http::async_read_header(
          stream, buf, *parser,
          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
    }

    void on_head(beast::error_code ec) {
      if (ec) return on_read(ec);
      stream.expires_after(timeout());
      http::async_read(
          stream, buf, *parser,
          [self = shared_from_this()](beast::error_code ec2, size_t) { self->on_read(ec2); });
    }

    void on_read(beast::error_code ec) {
      waiting = false;
      if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted ||
          ec == beast::error::timeout || ec == asio::error::connection_reset ||
          ec == asio::error::eof)
        return close();
      if (ec == http::error::body_limit) return reply(plain(413, "request body too large"), false);
      if (ec == http::error::header_limit)
        return reply(plain(431, "request header fields too large"), false);
      if (ec) return reply(plain(400, "bad request: " + ec.message()), false);
      const auto& req = parser->get();
      HttpRequest r;
      ++srv.n_requests;
      HttpResponse out;
      if (!fill_request(req, r)) {
        out = plain(400, "bad request: malformed percent-encoding in the target");
      } else {
        try {
          out = srv.handler(r);
        } catch (const std::exception& e) {
          out = plain(500, std::string("internal error: ") + e.what());
        }
      }
      proven = proven || out.authenticated;
      reply(std::move(out), req.keep_alive());
    }

    void reply(HttpResponse out, bool keep_alive) {
      res = {};
      res.version(11);
      res.result(static_cast<unsigned>(out.status));
      res.set(http::field::server, "ring-coord");
      res.set(http::field::content_type, out.content_type);
      res.set(http::field::cache_control, "no-store");
      res.set("X-Content-Type-Options", "nosniff");
      for (auto& [k, v] : out.headers) res.set(k, v);
      res.body() = std::move(out.body);
      res.keep_alive(keep_alive);
      res.prepare_payload();
      stream.expires_after(timeout());
      http::async_write(stream, res,
                        [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
                          if (ec || !keep_alive) return self->close();
                          self->read();
                        });
    }

    void close() {
      beast::error_code ec;
      stream.socket().shutdown(tcp::socket::shutdown_both, ec);
      stream.socket().close(ec);
    }
  };

  // Sessions that may wait for a request (weak: a closed one simply expires).
  std::vector<std::weak_ptr<Session>> sessions;

  // Makes room for a new connection: closes the oldest session waiting for a request that never
  // proved who it is, else the oldest waiting one. False when every session is busy.
  bool evict_one() {
    std::shared_ptr<Session> victim;
    std::vector<std::weak_ptr<Session>> live;
    for (auto& w : sessions)
      if (auto s = w.lock()) {
        live.push_back(w);
        if (!s->waiting) continue;
        if (!victim || (victim->proven && !s->proven) ||
            (victim->proven == s->proven && s->since < victim->since))
          victim = s;
      }
    sessions = std::move(live);
    if (!victim) return false;
    victim->close();
    ++n_evicted;
    return true;
  }

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        if (open.load() >= opts.max_connections && !evict_one()) {
          ++n_refused;
          beast::error_code ignored;
          sock.close(ignored);
        } else {
          // Known to evict_one() for its life (one entry; closed ones are dropped as found).
          if (sessions.size() > 4 * opts.max_connections)
            sessions.erase(std::remove_if(sessions.begin(), sessions.end(),
                                          [](const auto& w) { return w.expired(); }),
                           sessions.end());
          auto s = std::make_shared<Session>(*this, std::move(sock));
          sessions.push_back(s);
          s->read();
        }
      }
      accept();
    });
  }
};

std::string describe_port_holder(uint16_t port) {
  // Lines: "sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode"; local
  // address "0100007F:2328"; state 0A is LISTEN.
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, txrx, trtm, retr, uid, timeout, inode;
      if (!(f >> sl >> local >> remote >> st >> txrx >> trtm >> retr >> uid >> timeout >> inode))
        continue;
      const size_t colon = local.rfind(':');
      if (st != "0A" || colon == std::string::npos) continue;
      if (std::strtoul(local.c_str() + colon + 1, nullptr, 16) != port) continue;
      const uid_t u = static_cast<uid_t>(std::strtoul(uid.c_str(), nullptr, 10));
      std::string who = "uid " + uid;
      if (const passwd* pw = ::getpwuid(u)) who += std::string(" (") + pw->pw_name + ")";
      std::string pid;
      const std::string want = "socket:[" + inode + "]";
      std::error_code ec;
      for (const auto& p : std::filesystem::directory_iterator("/proc", ec)) {
        const std::string name = p.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::error_code e2;
        for (const auto& fd : std::filesystem::directory_iterator(p.path() / "fd", e2)) {
          std::error_code e3;
          if (std::filesystem::read_symlink(fd.path(), e3).string() == want) pid = name;
          if (!pid.empty()) break;
        }
        if (!pid.empty()) break;
      }
      return "port " + std::to_string(port) + " is held by " + who +
             (pid.empty() ? "" : ", pid " + pid);
    }
  }
  return "port " + std::to_string(port) + ": no listener found";
}

HttpServer::HttpServer(Options opts, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(opts);
  impl_->handler = std::move(handler);
  const std::string where = impl_->opts.host + ":" + std::to_string(impl_->opts.port);
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(impl_->opts.host, ec);
  if (ec)
    throw HttpError("http address " + where + ": '" + impl_->opts.host +
                    "' is not an IPv4 or IPv6 address");
  tcp::endpoint ep(addr, impl_->opts.port);
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw HttpError("cannot listen on http " + where + ": " + ec.message());
  // The listening socket must not leak into what the coordinator spawns (it spawns nothing
  // today, but the rule holds for every descriptor).
  ::fcntl(a.native_handle(), F_SETFD, FD_CLOEXEC);
  impl_->bound = a.local_endpoint();
  impl_->accept();
  impl_->thread = std::thread([im = impl_.get()] { im->io.run(); });
}

HttpServer::~HttpServer() {
  asio::post(impl_->io, [im = impl_.get()] {
    beast::error_code ec;
    im->acceptor.close(ec);
    im->io.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string HttpServer::address() const {
  const auto& b = impl_->bound;
  std::string host = b.address().to_string();
  if (b.address().is_v6()) host = "[" + host + "]";
  return host + ":" + std::to_string(b.port());
}

uint16_t HttpServer::port() const {
  return impl_->bound.port();
}

HttpServer::Stats HttpServer::stats() const {
  return {impl_->n_requests.load(), impl_->n_refused.load(), impl_->n_evicted.load()};
}

}  // namespace ring::coord
