#include "coordinator/web.h"

#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "common/protocol/protocol.h"
#include "coordinator/prometheus.h"
#include "coordinator/queries.h"
#include "coordinator/security.h"
#include "coordinator/web_view.h"

namespace ring::coord {

namespace proto = ring::protocol;
using nlohmann::json;

// ---- listen address, token ------------------------------------------------------------------

std::optional<HttpListen> parse_http_listen(const std::string& s, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<HttpListen> {
    if (why) *why = w;
    return std::nullopt;
  };
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return fail("expected [IPV6]:PORT");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos) return fail("expected HOST:PORT (e.g. 127.0.0.1:9464)");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos) return fail("write an IPv6 address as [ADDR]:PORT");
  }
  if (host.empty()) return fail("no address before the port (e.g. 127.0.0.1:9464)");
  // An IP literal only: a name could resolve to a wider address than it looks.
  if (!is_ip_address(host))
    return fail("'" + host + "' is not an IPv4 or IPv6 address (names are not accepted)");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535)
    return fail("port '" + port + "' is not a number 0..65535 (0: any free port)");
  return HttpListen{host, static_cast<uint16_t>(std::stoul(port))};
}

std::string read_or_create_http_token(const std::string& state_dir) {
  const std::string path = state_dir + "/" + kHttpTokenFile;
  int fd = open_private_file(path, "http token file");
  std::string text;
  char buf[256];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0 && text.size() < 4096;)
    text.append(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  if (text.empty()) {
    unsigned char raw[32];
    randombytes_buf(raw, sizeof raw);
    static const char* hex = "0123456789abcdef";
    for (unsigned char c : raw) {
      text += hex[c >> 4];
      text += hex[c & 15];
    }
    std::string line = text + "\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
      ::close(fd);
      throw SecurityError("cannot write the http token file " + path);
    }
  } else if (text.size() < 32 || text.find_first_of(" \t\r\n\"\\;,") != std::string::npos) {
    ::close(fd);
    throw SecurityError("http token file " + path +
                        ": expected one token of at least 32 characters without spaces, quotes, "
                        "';' or ','; delete the file to have a new one made");
  }
  ::close(fd);
  return text;
}

void record_http_address(const std::string& state_dir, const std::string& url) {
  const std::string path = state_dir + "/" + kHttpAddressFile;
  int fd = open_private_file(path, "http address file");
  std::string line = url + "\n";
  bool ok = ::ftruncate(fd, 0) == 0 &&
            ::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) throw SecurityError("cannot write " + path);
}

bool token_matches(const std::string& presented, const std::string& expected) {
  if (presented.size() != expected.size() || expected.empty()) return false;
  return sodium_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

// ---- helpers ----------------------------------------------------------------------------------

namespace {

HttpResponse text_reply(int status, const std::string& t) {
  return {status, "text/plain; charset=utf-8", t + "\n", {}};
}

HttpResponse json_reply(const json& j, int status = 200) {
  // error_handler::replace: text from peers is not guaranteed UTF-8.
  return {status,
          "application/json",
          j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
          {}};
}

HttpResponse json_error(int status, const std::string& msg) {
  return json_reply({{"error", msg}}, status);
}

std::string num(double v, const char* fmt = "%.6g") {
  if (std::isnan(v)) return "NaN";
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

std::string rate(double v) {
  if (v >= 1e9) return num(v / 1e9, "%.3g") + "G";
  if (v >= 1e6) return num(v / 1e6, "%.3g") + "M";
  if (v >= 1e3) return num(v / 1e3, "%.3g") + "k";
  return num(v, "%.3g");
}

std::string bytes_text(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  return num(b, "%.3g") + " " + u[i];
}

std::string when(double unix_s) {
  if (unix_s <= 0) return "-";
  time_t t = static_cast<time_t>(unix_s);
  struct tm tm;
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%SZ", &tm);
  return b;
}

// A query parameter as an integer in [lo, hi]; nullopt when absent. Sets `bad` when present but
// not such an integer.
std::optional<int64_t> int_param(const HttpRequest& r, const std::string& key, int64_t lo,
                                 int64_t hi, std::string& bad) {
  auto it = r.query.find(key);
  if (it == r.query.end()) return std::nullopt;
  const std::string& v = it->second;
  bool neg = !v.empty() && v[0] == '-';
  std::string digits = neg ? v.substr(1) : v;
  if (digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    bad = "query parameter " + key + "='" + v + "' is not an integer";
    return std::nullopt;
  }
  int64_t x = std::stoll(v);
  if (x < lo || x > hi) {
    bad = "query parameter " + key + "=" + v + " is out of range [" + std::to_string(lo) + ", " +
          std::to_string(hi) + "]";
    return std::nullopt;
  }
  return x;
}

// "/api/jobs/12/steps" -> {"api","jobs","12","steps"}
std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  for (size_t a = 0; a < path.size();) {
    size_t b = path.find('/', a);
    if (b == std::string::npos) b = path.size();
    if (b > a) out.push_back(path.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

std::optional<int64_t> job_id_of(const std::string& s) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(s);
}

json job_json(Store& store, const JobRow& j) {
  auto m = proto::to_json(proto::Message{proto::StatusReply{0, {job_info(store, j, {})}}});
  return m["jobs"][0];
}

json event_json(const proto::EventRecord& e) {
  return {{"id", e.id},     {"time", e.time}, {"attempt", e.attempt},
          {"node", e.node}, {"kind", e.kind}, {"data", e.data}};
}

// Keeps at most n points, evenly spaced, the last one always.
template <typename T>
std::vector<T> thin(const std::vector<T>& v, size_t n) {
  if (v.size() <= n || n < 2) return v;
  std::vector<T> out;
  for (size_t i = 0; i < n - 1; ++i) out.push_back(v[i * (v.size() - 1) / (n - 1)]);
  out.push_back(v.back());
  return out;
}

mustache::data new_list() {
  return mustache::data(mustache::data::type::list);
}

// A line chart (line_chart.mustache): x = step, y = value. Finite values only (a NaN loss is
// left out).
mustache::data line_chart(const std::string& id, const std::string& title,
                          const std::vector<std::pair<double, double>>& pts_in) {
  std::vector<std::pair<double, double>> pts;
  for (auto p : pts_in)
    if (std::isfinite(p.first) && std::isfinite(p.second)) pts.push_back(p);
  // The picture and its plot area's margins (left, right, top, bottom), in SVG pixels.
  const double W = 640, H = 200, L = 60, R = 10, T = 20, B = 30;
  mustache::data d;
  d.set("id", id);
  d.set("title", title);
  d.set("width", num(W));
  d.set("height", num(H));
  d.set("left", num(L));
  d.set("right", num(W - R));
  d.set("top", num(T));
  d.set("bottom", num(H - B));
  d.set("plot_width", num(W - L - R));
  d.set("plot_height", num(H - T - B));
  d.set("center_x", num(W / 2));
  d.set("center_y", num(H / 2 + 10));  // a text's baseline: its middle a little lower
  d.set("label_x", num(L - 4));
  d.set("y_max_y", num(T + 4));
  d.set("axis_y", num(H - 8));
  d.set("has_points", !pts.empty());
  if (pts.empty()) return d;
  double x0 = pts.front().first, x1 = pts.back().first, y0 = pts[0].second, y1 = pts[0].second;
  for (auto [x, y] : pts) {
    y0 = std::min(y0, y);
    y1 = std::max(y1, y);
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
  std::string points;
  for (auto [x, y] : pts) points += num(X(x), "%.1f") + "," + num(Y(y), "%.1f") + " ";
  if (!points.empty()) points.pop_back();
  mustache::data circles = new_list();  // a dot with its value per point, for short series
  if (pts.size() <= 200)
    for (auto [x, y] : pts)
      circles.push_back(mustache::object{{"cx", num(X(x), "%.1f")},
                                         {"cy", num(Y(y), "%.1f")},
                                         {"step", num(x, "%.0f")},
                                         {"value", num(y)}});
  d.set("points", points);
  d.set("n_points", std::to_string(pts.size()));
  d.set("circles", circles);
  d.set("y_max", num(y1));
  d.set("y_min", num(y0));
  d.set("x_first", num(x0, "%.0f"));
  d.set("x_last", num(pts.back().first, "%.0f"));
  return d;
}

// A page of coordinator/web/templates/ with its data (coordinator/web_view.h).
HttpResponse html(const std::string& page, const std::string& title, mustache::data d = {},
                  int status = 200) {
  return {status,
          "text/html; charset=utf-8",
          render_page(page, title, std::move(d)),
          {{"Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
            "frame-ancestors 'none'"},
           {"X-Frame-Options", "DENY"}}};
}

std::string rank_label_text(const RankSummary& s) {
  return s.rank < 0 ? "other" : std::to_string(s.rank);
}

std::string finding_text(const proto::EventRecord& e) {
  std::string msg = e.data.value("message", "");
  if (!msg.empty()) return msg;
  return e.data.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string cookie_session(const std::string& cookie) {
  // "a=b; ring_session=XYZ; c=d"
  for (size_t a = 0; a < cookie.size();) {
    size_t b = cookie.find(';', a);
    if (b == std::string::npos) b = cookie.size();
    std::string kv = cookie.substr(a, b - a);
    size_t s = kv.find_first_not_of(' ');
    if (s != std::string::npos) kv = kv.substr(s);
    if (kv.rfind("ring_session=", 0) == 0) return kv.substr(13);
    a = b + 1;
  }
  return "";
}

}  // namespace

// ---- the app ----------------------------------------------------------------------------------

WebApp::WebApp(WebOptions o) : o_(std::move(o)) {}
WebApp::~WebApp() = default;

Store& WebApp::store() {
  if (!store_) {
    Store::Options so;
    so.read_only = true;
    store_ = std::make_unique<Store>(o_.db_path, so);
  }
  return *store_;
}

HttpResponse WebApp::handle(const HttpRequest& r) {
  authenticated_ = false;
  try {
    HttpResponse out = route(r);
    out.authenticated = out.authenticated || authenticated_;
    return out;
  } catch (const Refused& e) {
    return json_error(404, e.what());
  } catch (const DbError& e) {
    // A failed read (database busy, or replaced): open a fresh connection next time.
    store_.reset();
    return text_reply(503, std::string("database: ") + e.what());
  }
}

bool WebApp::host_allowed(const std::string& host_header) const {
  // "name", "name:port", "1.2.3.4:5", "[::1]:5"
  std::string h = host_header;
  if (!h.empty() && h.front() == '[') {
    const size_t e = h.find(']');
    h = e == std::string::npos ? "" : h.substr(1, e - 1);
  } else if (const size_t c = h.rfind(':'); c != std::string::npos && h.find(':') == c) {
    h = h.substr(0, c);
  }
  // No Host at all: an HTTP/1.0 client (a browser always sends one, so a rebinding page does).
  if (host_header.empty()) return true;
  for (char& ch : h) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (h.empty()) return false;
  if (h == "localhost" || is_ip_address(h)) return true;
  for (const std::string& n : o_.host_names) {
    std::string l = n;
    for (char& ch : l) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (h == l) return true;
  }
  return false;
}

std::string WebApp::open_session() {
  const double now = now_unix();
  for (auto it = sessions_.begin(); it != sessions_.end();)
    it = it->second < now ? sessions_.erase(it) : std::next(it);
  if (sessions_.size() >= 4096) sessions_.erase(sessions_.begin());
  unsigned char raw[32];
  randombytes_buf(raw, sizeof raw);
  static const char* hex = "0123456789abcdef";
  std::string id;
  for (unsigned char c : raw) {
    id += hex[c >> 4];
    id += hex[c & 15];
  }
  sessions_[id] = now + o_.session_s;
  return id;
}

bool WebApp::session_valid(const std::string& id) {
  if (id.size() != 64) return false;
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return false;
  if (it->second < now_unix()) {
    sessions_.erase(it);
    return false;
  }
  return true;
}

HttpResponse WebApp::login(const HttpRequest& r) {
  if (r.method == "GET") return html("login", "ring-coord: sign in");
  std::string presented;
  for (size_t a = 0; a < r.body.size();) {
    size_t b = r.body.find('&', a);
    if (b == std::string::npos) b = r.body.size();
    std::string kv = r.body.substr(a, b - a);
    if (kv.rfind("token=", 0) == 0) presented = percent_decode(kv.substr(6), true).value_or("");
    a = b + 1;
  }
  if (o_.token.empty())
    return {303, "text/plain; charset=utf-8", "no token needed\n", {{"Location", "/"}}};
  if (!token_matches(presented, o_.token))
    return html("login_failed", "ring-coord: sign in", {}, 401);
  // The cookie is a random session id of this endpoint, valid session_s: never the long-lived
  // token, which a cookie would carry to wherever else the browser sends it.
  HttpResponse ok{303,
                  "text/plain; charset=utf-8",
                  "signed in\n",
                  {{"Location", "/"},
                   {"Set-Cookie", "ring_session=" + open_session() +
                                      "; Path=/; HttpOnly; SameSite=Strict; Max-Age=" +
                                      std::to_string(static_cast<int64_t>(o_.session_s))}}};
  ok.authenticated = true;
  return ok;
}

// A valid token (Authorization: Bearer) or session cookie: nullopt, and the request is marked
// authenticated; else the 401 to send.
std::optional<HttpResponse> WebApp::refuse_unauthenticated(const HttpRequest& r) {
  if (o_.token.empty()) return std::nullopt;
  authenticated_ = r.authorization.rfind("Bearer ", 0) == 0
                       ? token_matches(r.authorization.substr(7), o_.token)
                       : session_valid(cookie_session(r.cookie));
  if (authenticated_) return std::nullopt;  // the connection proved itself
  const bool page_req = r.path == "/" || r.path.rfind("/jobs", 0) == 0;
  HttpResponse resp =
      page_req ? html("token_required", "ring-coord: sign in", {}, 401)
               : text_reply(401,
                            "this endpoint needs `Authorization: Bearer <token>` (the token is "
                            "in the coordinator's state directory, file http.token)");
  resp.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"ring-coord\"");
  return resp;
}

namespace {

// What a handler is given: the store, the export limits, the time, the request.
struct RouteCtx {
  Store& store;
  const ExportLimits& limits;
  double now;
  const HttpRequest& r;
};

HttpResponse api_jobs(const RouteCtx& c) {
  json out = json::array();
  for (const auto& j : exported_jobs(c.store, c.limits, c.now))
    out.push_back(job_json(c.store, j));
  return json_reply(out);
}

HttpResponse api_nodes(const RouteCtx& c) {
  json out = json::array();
  for (const auto& n : exported_nodes(c.store, c.limits, c.now))
    out.push_back({{"node", n.name},
                   {"uid", n.uid},
                   {"state", n.state},
                   {"last_heartbeat", n.last_heartbeat},
                   {"heartbeat_age_s", std::max(0.0, c.now - n.last_heartbeat)}});
  return json_reply(out);
}

HttpResponse api_job(const RouteCtx& c, const JobRow* j) {
  json out = job_json(c.store, *j);
  json s = json::array();
  for (const auto& f : current_stragglers(c.store, j->id))
    s.push_back({{"rank", f.rank},
                 {"node", f.node},
                 {"source", f.source},
                 {"event", event_json(f.event)}});
  out["stragglers"] = s;
  json hangs = json::array();
  for (const auto& e : latest_events(c.store, j->id, {"hang"}, 5))
    hangs.push_back(event_json(e));
  out["hangs"] = hangs;
  return json_reply(out);
}

HttpResponse api_job_steps(const RouteCtx& c, const JobRow* j) {
  std::string bad;
  auto from = int_param(c.r, "from_step", 0, int64_t{1} << 53, bad).value_or(0);
  auto limit = int_param(c.r, "limit", 1, 100000, bad).value_or(10000);
  if (!bad.empty()) return json_error(400, bad);
  json out = json::array();
  for (const auto& s : c.store.steps(j->id, from > 0 ? from - 1 : 0, limit))
    out.push_back(proto::step_record_json(s));
  return json_reply(out);
}

HttpResponse api_job_ranks(const RouteCtx& c, const JobRow* j) {
  std::string bad;
  auto step = int_param(c.r, "step", 0, int64_t{1} << 53, bad);
  auto steps = int_param(c.r, "steps", 1, 1000, bad).value_or(1);
  if (!bad.empty()) return json_error(400, bad);
  auto rows = step ? rank_rows(c.store, j->id, *step - steps + 1, *step, 100000)
                   : rank_window(c.store, j->id, steps);
  json out = json::array();
  for (const auto& x : rows) out.push_back(proto::rank_step_record_json(x));
  return json_reply(out);
}

HttpResponse api_job_events(const RouteCtx& c, const JobRow* j) {
  std::string bad;
  auto limit = int_param(c.r, "limit", 1, 10000, bad).value_or(100);
  if (!bad.empty()) return json_error(400, bad);
  json out = json::array();
  for (const auto& e : recent_events(c.store, j->id, limit)) out.push_back(event_json(e));
  return json_reply(out);
}

HttpResponse api_job_checkpoints(const RouteCtx& c, const JobRow* j) {
  json out = json::array();
  for (const auto& c : checkpoints(c.store, j->id, 100))
    out.push_back({{"step", c.step},
                   {"shards", c.shards},
                   {"complete_shards", c.complete_shards},
                   {"bytes", c.bytes},
                   {"seconds", c.seconds ? json(*c.seconds) : json(nullptr)},
                   {"created_at", c.created_at}});
  return json_reply(out);
}

HttpResponse page_index(const RouteCtx& c) {
  mustache::data jobs = new_list();
  for (const auto& j : exported_jobs(c.store, c.limits, c.now)) {
    auto strag = current_stragglers(c.store, j.id);
    std::string findings;
    if (!strag.empty())
      findings = std::to_string(strag.size()) + " straggler" + (strag.size() > 1 ? "s" : "");
    jobs.push_back(
        mustache::object{{"id", std::to_string(j.id)},
                         {"name", j.name},
                         {"owner", j.owner_user},
                         {"state", to_string(j.state)},
                         {"step", std::to_string(j.last_step)},
                         {"total_steps", std::to_string(j.total_steps)},
                         {"loss", j.last_loss ? num(*j.last_loss) : "-"},
                         {"tokens_per_s", j.last_tokens_per_s ? rate(*j.last_tokens_per_s) : "-"},
                         {"slurm_job", j.slurm_job_id.empty() ? "-" : j.slurm_job_id},
                         {"restarts", std::to_string(j.restarts)},
                         {"findings", findings},
                         {"updated", when(j.updated_at)}});
  }
  mustache::data nodes = new_list();
  for (const auto& n : exported_nodes(c.store, c.limits, c.now))
    nodes.push_back(
        mustache::object{{"name", n.name},
                         {"state", n.state},
                         {"heartbeat_age", num(std::max(0.0, c.now - n.last_heartbeat), "%.1f")}});
  mustache::data d;
  d.set("has_jobs", !jobs.is_empty_list());
  d.set("jobs", jobs);
  d.set("has_nodes", !nodes.is_empty_list());
  d.set("nodes", nodes);
  return html("index", "ringmaster jobs", std::move(d));
}

// The job page's sections (job.mustache), each adding its values to `d`.

void job_findings_data(const RouteCtx& c, const JobRow* j, mustache::data& d) {
  auto strag = current_stragglers(c.store, j->id);
  auto hangs = latest_events(c.store, j->id, {"hang"}, 3);
  d.set("no_findings", strag.empty() && hangs.empty());
  mustache::data stragglers = new_list();
  for (const auto& f : strag)
    stragglers.push_back(mustache::object{{"rank", std::to_string(f.rank)},
                                          {"source", f.source},
                                          {"node", f.node},
                                          {"across_nodes", f.source == "coordinator"},
                                          {"message", finding_text(f.event)},
                                          {"time", when(f.event.time)}});
  d.set("stragglers", stragglers);
  mustache::data hang_list = new_list();
  for (const auto& e : hangs) {
    std::string missing;
    if (auto m = e.data.find("missing"); m != e.data.end() && m->is_array()) missing = m->dump();
    mustache::data waiting = new_list();  // where the other ranks wait, the first 16
    if (auto w = e.data.find("waiting"); w != e.data.end() && w->is_array()) {
      size_t n = 0;
      for (const auto& x : *w) {
        if (++n > 16) break;
        waiting.push_back(
            mustache::object{{"rank", x.contains("rank") ? x["rank"].dump() : std::string("?")},
                             {"where", x.value("where", "")}});
      }
    }
    hang_list.push_back(mustache::object{
        {"step", e.data.contains("step") ? e.data["step"].dump() : std::string("?")},
        {"has_missing", !missing.empty()},
        {"missing", missing},
        {"message", finding_text(e)},
        {"time", when(e.time)},
        {"has_waiting", !waiting.is_empty_list()},
        {"waiting", waiting}});
  }
  d.set("hangs", hang_list);
}

void job_curves_data(const RouteCtx& c, const JobRow* j, mustache::data& d) {
  // The last 5000 steps, at most 500 points each.
  int64_t after = std::max<int64_t>(0, j->last_step - 5000);
  auto series = thin(step_points(c.store, j->id, after + 1), 500);
  std::vector<std::pair<double, double>> loss, tps;
  for (const auto& p : series) {
    loss.emplace_back(static_cast<double>(p.step), p.loss);
    tps.emplace_back(static_cast<double>(p.step), p.tokens_per_s);
  }
  mustache::data charts = new_list();
  charts.push_back(line_chart("loss", "loss", loss));
  charts.push_back(line_chart("tokens_per_s", "tokens/s", tps));
  d.set("charts", charts);
}

// The latest step's phases per rank (stacked bars), and hop bandwidth.
void job_phases_data(const RouteCtx& c, const std::vector<proto::RankStepRecord>& window,
                     mustache::data& d) {
  const double row_h = 16, x0 = 70, bars_w = 420;
  int64_t last_step = window.back().step;
  std::vector<proto::RankStepRecord> latest;
  for (const auto& x : window)
    if (x.step == last_step && static_cast<size_t>(x.rank.rank) < c.limits.max_ranks)
      latest.push_back(x);
  double maxs = 0;
  for (const auto& x : latest)
    maxs = std::max(maxs, x.rank.data_s + x.rank.compute_s + x.rank.wait_s + x.rank.comm_s);
  if (maxs <= 0) maxs = 1;
  mustache::data rows = new_list();
  double y = 10;
  for (const auto& x : latest) {
    mustache::data phases = new_list();
    double xx = x0;
    for (auto [name, v] : {std::pair{"data", x.rank.data_s},
                           {"compute", x.rank.compute_s},
                           {"wait", x.rank.wait_s},
                           {"comm", x.rank.comm_s}}) {
      double w = v / maxs * bars_w;
      phases.push_back(mustache::object{
          {"phase", name}, {"x", num(xx, "%.1f")}, {"width", num(w, "%.1f")}, {"seconds", num(v)}});
      xx += w;
    }
    rows.push_back(mustache::object{
        {"rank", std::to_string(x.rank.rank)},
        {"text_y", num(y + 11)},
        {"bar_y", num(y + 2)},
        {"phases", phases},
        {"step_time", num(x.rank.step_time_s, "%.4g")},
        {"bandwidth", x.rank.comm_s > 0
                          ? rate(static_cast<double>(x.rank.hop_bytes) / x.rank.comm_s) + "B/s"
                          : "-"}});
    y += row_h;
  }
  d.set("last_step", std::to_string(last_step));
  d.set("phases_height", num(30 + row_h * static_cast<double>(latest.size()), "%.0f"));
  d.set("phases_x", num(x0));
  d.set("latest_ranks", rows);
  d.set("legend_y", num(y + 14));
}

// Per-rank step time over the window (bars and a table), and the phases of the latest step.
void job_ranks_data(const RouteCtx& c, const JobRow* j, mustache::data& d) {
  auto window = rank_window(c.store, j->id, c.limits.window_steps);
  auto sums = summarize_ranks(window, c.limits.max_ranks);
  d.set("has_ranks", !sums.empty());
  if (sums.empty()) return;
  const double row_h = 16, bar_x = 110, bar_w = 440;
  double maxt = 0;
  for (const auto& s : sums) maxt = std::max(maxt, s.p90);
  if (maxt <= 0) maxt = 1;
  mustache::data rows = new_list();
  double y = 10;
  for (const auto& s : sums) {
    double w50 = s.p50 / maxt * bar_w, w90 = s.p90 / maxt * bar_w;
    rows.push_back(mustache::object{
        {"label", s.rank < 0 ? "other (" + std::to_string(s.folded_ranks) + ")"
                             : "rank " + std::to_string(s.rank)},
        {"rank", rank_label_text(s)},
        {"node", s.node},
        {"text_y", num(y + 11)},
        {"bar_y", num(y + 2)},
        {"p50_width", num(w50, "%.1f")},
        {"p90_x", num(bar_x + w90, "%.1f")},
        {"tick_y1", num(y + 1)},
        {"tick_y2", num(y + 14)},
        {"p50", num(s.p50)},
        {"p90", num(s.p90)},
        {"p50_short", num(s.p50, "%.4g")},
        {"p90_short", num(s.p90, "%.4g")},
        {"p99_short", num(s.p99, "%.4g")},
        {"wait_short", num(s.mean_wait_s, "%.4g")},
        {"bandwidth",
         s.comm_s > 0 ? rate(static_cast<double>(s.hop_bytes) / s.comm_s) + "B/s" : "-"}});
    y += row_h;
  }
  d.set("window_steps", std::to_string(c.limits.window_steps));
  d.set("step_time_height", num(20 + row_h * static_cast<double>(sums.size()), "%.0f"));
  d.set("bar_x", num(bar_x));
  d.set("rank_summaries", rows);
  job_phases_data(c, window, d);
}

void job_checkpoints_data(const RouteCtx& c, const JobRow* j, mustache::data& d) {
  auto ck = checkpoints(c.store, j->id, 20);
  mustache::data rows = new_list();
  for (const auto& k : ck)
    rows.push_back(mustache::object{{"step", std::to_string(k.step)},
                                    {"complete_shards", std::to_string(k.complete_shards)},
                                    {"shards", std::to_string(k.shards)},
                                    {"incomplete", k.complete_shards != k.shards},
                                    {"size", bytes_text(static_cast<double>(k.bytes))},
                                    {"write_s", k.seconds ? num(*k.seconds, "%.3f") : "-"},
                                    {"created", when(k.created_at)}});
  d.set("has_checkpoints", !ck.empty());
  d.set("checkpoints", rows);
}

void job_events_data(const RouteCtx& c, const JobRow* j, mustache::data& d) {
  mustache::data rows = new_list();
  for (const auto& e : recent_events(c.store, j->id, 50))
    rows.push_back(
        mustache::object{{"time", when(e.time)},
                         {"attempt", std::to_string(e.attempt)},
                         {"node", e.node},
                         {"kind", e.kind},
                         {"data", e.data.dump(-1, ' ', false, json::error_handler_t::replace)}});
  d.set("events", rows);
}

HttpResponse page_job(const RouteCtx& c, const JobRow* j) {
  const std::string jid = std::to_string(j->id);
  mustache::data d;
  d.set("id", jid);
  d.set("name", j->name);
  d.set("state", to_string(j->state));
  d.set("has_reason", !j->state_reason.empty());
  d.set("reason", j->state_reason);
  d.set("owner", j->owner_user);
  d.set("attempt", std::to_string(j->attempt));
  d.set("restarts", std::to_string(j->restarts));
  d.set("max_restarts", std::to_string(j->max_restarts));
  d.set("step", std::to_string(j->last_step));
  d.set("total_steps", std::to_string(j->total_steps));
  d.set("has_slurm_job", !j->slurm_job_id.empty());
  d.set("slurm_job", j->slurm_job_id);
  job_findings_data(c, j, d);
  job_curves_data(c, j, d);
  job_ranks_data(c, j, d);
  job_checkpoints_data(c, j, d);
  job_events_data(c, j, d);
  return html("job", "job " + jid + ": " + j->name, std::move(d));
}

// Every path served, one a line: a pattern whose "{job}" segment is a job id (resolved before
// the handler runs: 404 when it is not one or no such job exists), and its handler.
struct Route {
  const char* pattern;
  HttpResponse (*plain)(const RouteCtx&) = nullptr;
  HttpResponse (*of_job)(const RouteCtx&, const JobRow*) = nullptr;
};
const Route kRoutes[] = {
    {"/", page_index},
    {"/jobs/{job}", nullptr, page_job},
    {"/api/jobs", api_jobs},
    {"/api/nodes", api_nodes},
    {"/api/jobs/{job}", nullptr, api_job},
    {"/api/jobs/{job}/steps", nullptr, api_job_steps},
    {"/api/jobs/{job}/ranks", nullptr, api_job_ranks},
    {"/api/jobs/{job}/events", nullptr, api_job_events},
    {"/api/jobs/{job}/checkpoints", nullptr, api_job_checkpoints},
};

// The route of `seg` and the text of its "{job}" segment ("" when it has none).
const Route* find_route(const std::vector<std::string>& seg, std::string* job_text) {
  for (const Route& rt : kRoutes) {
    const auto want = segments(rt.pattern);
    if (want.size() != seg.size()) continue;
    bool match = true;
    std::string job;
    for (size_t i = 0; i < want.size() && match; ++i) {
      if (want[i] == "{job}") job = seg[i];
      else match = want[i] == seg[i];
    }
    if (match) {
      *job_text = job;
      return &rt;
    }
  }
  return nullptr;
}

}  // namespace

HttpResponse WebApp::route(const HttpRequest& r) {
  // DNS rebinding: a browser on another site's page sends that site's name as the Host.
  if (!host_allowed(r.host))
    return text_reply(421, "the Host header '" + r.host.substr(0, 200) +
                               "' is not a name of this server (ring-coord serves IP addresses, "
                               "localhost and this machine's names)");
  const bool is_login = r.path == "/login";
  if (r.method != "GET" && !(is_login && r.method == "POST"))
    return {405,
            "text/plain; charset=utf-8",
            "only GET (and POST /login) are served\n",
            {{"Allow", is_login ? "GET, POST" : "GET"}}};
  if (is_login) return login(r);
  if (auto refused = refuse_unauthenticated(r)) return *refused;

  const RouteCtx c{store(), o_.limits, now_unix(), r};
  if (r.path == "/metrics")
    return {200, kPrometheusContentType, render_metrics(c.store, c.limits, c.now), {}};
  const auto seg = segments(r.path);
  const bool api = !seg.empty() && seg[0] == "api";
  std::string job_text;
  const Route* rt = find_route(seg, &job_text);
  if (!rt)
    return api ? json_error(404, "no such API path: " + r.path)
               : html("not_found", "not found", mustache::object{{"has_job", false}}, 404);
  if (rt->plain) return rt->plain(c);
  auto id = job_id_of(job_text);
  std::optional<JobRow> j = id ? c.store.job(*id) : std::nullopt;
  if (!j) {
    if (!api)
      return html("not_found", "not found", mustache::object{{"has_job", true}, {"job", job_text}},
                  404);
    return json_error(404, id ? "job " + job_text + " does not exist"
                              : "'" + job_text + "' is not a job id");
  }
  return rt->of_job(c, &*j);
}

}  // namespace ring::coord
