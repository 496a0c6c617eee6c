// ring-coord's web endpoint (opt-in: ring-coord --http HOST:PORT): Prometheus /metrics, a
// read-only dashboard (server-rendered HTML with inline SVG from compiled-in Mustache templates,
// coordinator/web_view.h; no script, nothing fetched from elsewhere) and a JSON API under
// /api/. docs/observability.md lists the pages and metrics; docs/security.md says who may read
// them.
//
// It runs in HttpServer's thread (coordinator/http_server.h) over its own read-only connection
// to coord.db (WAL lets it read while the coordinator writes), so a slow page never stalls the
// ZeroMQ loop. What it shows is what the database holds: step metrics are at most
// metrics_flush_s behind the coordinator, heartbeat times up to heartbeat_flush_s.
//
//   WebApp app({.db_path = dir + "/coord.db", .token = read_or_create_http_token(dir)});
//   HttpServer srv({.host = "127.0.0.1", .port = 0}, [&](const HttpRequest& r) {
//     return app.handle(r);
//   });
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/http_server.h"
#include "coordinator/observe.h"
#include "coordinator/store.h"

namespace ring::coord {

struct WebOptions {
  std::string db_path;
  // Empty: every request is served (only for a loopback address). Else each request but
  // /login must carry `Authorization: Bearer <token>` or the cookie of a session that /login
  // opened with the token (ring_session=<random id>, never the token itself).
  std::string token;
  ExportLimits limits;
  // Host header values served besides IP address literals and "localhost" (with any port): the
  // machine's names. Any other name is refused (421): a page of another site whose name was
  // rebound to this address (DNS rebinding) cannot read the endpoint through the browser.
  std::vector<std::string> host_names;
  double session_s = 12 * 3600;  // how long a sign-in lasts
};

class WebApp {
 public:
  explicit WebApp(WebOptions o);
  ~WebApp();
  // Call from one thread at a time (the server's). Never throws for bad input: 4xx replies.
  HttpResponse handle(const HttpRequest& r);

 private:
  Store& store();
  HttpResponse route(const HttpRequest& r);
  HttpResponse login(const HttpRequest& r);  // GET: the form; POST: a session for the token
  std::optional<HttpResponse> refuse_unauthenticated(const HttpRequest& r);
  bool host_allowed(const std::string& host) const;
  std::string open_session();
  bool session_valid(const std::string& id);
  WebOptions o_;
  std::unique_ptr<Store> store_;
  std::map<std::string, double> sessions_;  // session id -> expiry (unix seconds)
  bool authenticated_ = false;              // the request being handled proved itself
};

// "127.0.0.1:8080", "[::1]:0", "0.0.0.0:9000" -> host and port; nullopt with `why` set when
// it is not an IP address and a port 0..65535.
struct HttpListen {
  std::string host;
  uint16_t port = 0;
};
std::optional<HttpListen> parse_http_listen(const std::string& s, std::string* why);

// In the state directory: the token (64 hex digits; 0600, created on first use) and the
// address the endpoint was last bound at ("http://127.0.0.1:41234/").
inline constexpr const char* kHttpTokenFile = "http.token";
inline constexpr const char* kHttpAddressFile = "http";
std::string read_or_create_http_token(const std::string& state_dir);
void record_http_address(const std::string& state_dir, const std::string& url);

// Constant-time comparison of a presented token with the expected one.
bool token_matches(const std::string& presented, const std::string& expected);

}  // namespace ring::coord
