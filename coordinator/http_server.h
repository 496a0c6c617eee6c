// A small HTTP/1.1 server (Boost.Beast over Asio) for ring-coord's read-only web endpoint
// (coordinator/web.h: /metrics, the dashboard, /api/).
//
// Threading: everything runs in the server's own thread (one io_context); the handler is called
// there, one request at a time, and never touches the coordinator's ZeroMQ loop or its database
// connection. Limits keep a slow or hostile client from holding it: request head and body are
// bounded (431/413), every read and write has a deadline (the connection is closed), and at most
// max_connections are open at once. When full, a new connection takes the place of the oldest one
// that is waiting for a request and never proved who it is (then of the oldest idle one): idle
// or slow unauthenticated connections cannot keep an authorized scraper out; only when every
// connection is busy is the new one closed at accept.
//
//   HttpServer s({.host = "127.0.0.1", .port = 0}, [](const HttpRequest& r) {
//     return HttpResponse{200, "text/plain", "hello\n"};
//   });
//   s.address();   // "127.0.0.1:41234"
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ring::coord {

struct HttpRequest {
  std::string method;                        // "GET"
  std::string target;                        // as sent: "/api/jobs/3?from_step=10"
  std::string path;                          // percent-decoded path: "/api/jobs/3"
  std::map<std::string, std::string> query;  // decoded; a repeated key keeps the last value
  std::string authorization;                 // the Authorization header, verbatim
  std::string cookie;                        // the Cookie header, verbatim
  std::string host;                          // the Host header, verbatim ("127.0.0.1:9000")
  std::string content_type;
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  // The request proved who sent it (a valid token or session): its connection is kept when the
  // server is full and must make room (HttpServer evicts connections that proved nothing first).
  bool authenticated = false;
};

class HttpError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";  // an IPv4 or IPv6 address (no names)
    uint16_t port = 0;               // 0: any free port
    size_t max_connections = 32;
    double timeout_s = 10;  // per read or write of one request/response
    double head_timeout_s = 5;  // the request head must arrive within this, from the first byte
    size_t max_header_bytes = 8192;
    size_t max_body_bytes = 4096;
  };
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds and starts serving. Throws HttpError naming the address and the reason.
  HttpServer(Options opts, Handler handler);
  // Stops accepting, closes every connection and joins the thread.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound address: "127.0.0.1:41234", "[::1]:41234".
  std::string address() const;
  uint16_t port() const;

  struct Stats {
    uint64_t requests = 0;
    uint64_t refused_connections = 0;  // over max_connections, every connection busy
    uint64_t evicted_connections = 0;  // closed to make room for a new one
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One request from bytes as the server reads them (the same parser, limits and conversion):
// nullopt with `error` set for anything the server answers 4xx or drops. For tests and fuzzing.
std::optional<HttpRequest> parse_http_request(std::string_view bytes, size_t max_header_bytes,
                                              size_t max_body_bytes, std::string* error = nullptr);

// "%41" -> "A"; with plus_is_space, '+' -> ' ' (form and query encoding). nullopt when a '%' is
// not followed by two hex digits.
std::optional<std::string> percent_decode(std::string_view s, bool plus_is_space);

// Who listens on TCP `port` on this machine, from /proc/net/tcp{,6}: "port 9000 is held by uid
// 1001 (bob), pid 4242" (the pid when /proc lets us see it), or "port 9000: no listener found".
std::string describe_port_holder(uint16_t port);

// true when `host` is an IPv4 or IPv6 address literal.
bool is_ip_address(const std::string& host);
// true when `host` is a loopback address (127.0.0.0/8, ::1).
bool is_loopback_host(const std::string& host);

}  // namespace ring::coord
