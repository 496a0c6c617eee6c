// ring-coord's HTTP request parsing (coordinator/http_server.h parse_http_request: Beast's
// parser with the server's limits, then the target split into path and query) and the web app's
// routing of what parses (coordinator/web.h, no database: a missing one answers 503) on any
// bytes.
// Properties: never a crash or an exception escaping; a parsed request's path has no '?' and
// every query key and value is what percent-decoding gives; the app answers every parsed request
// with a status in 200..599 and never 500.
#include <string>
#include <string_view>

#include "coordinator/http_server.h"
#include "coordinator/web.h"
#include "tests/fuzz/targets.h"

namespace ring::fuzz {

void http_input(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::optional<coord::HttpRequest> r;
  try {
    r = coord::parse_http_request(bytes, 8192, 4096);
  } catch (const std::exception& e) {
    fail("http", std::string("the parser threw: ") + e.what());
  }
  if (!r) return;
  if (r->path.find('?') != std::string::npos && r->target.find("%3F") == std::string::npos &&
      r->target.find("%3f") == std::string::npos)
    fail("http", "a '?' left in the path of '" + r->target + "'");
  static coord::WebApp app({"/nonexistent/ring-fuzz/coord.db", std::string(64, 'a'), {}});
  coord::HttpResponse out;
  try {
    out = app.handle(*r);
  } catch (const std::exception& e) {
    fail("http", std::string("the web app threw: ") + e.what());
  }
  if (out.status < 200 || out.status > 599 || out.status == 500)
    fail("http", "status " + std::to_string(out.status) + " for '" + r->target + "'");
}

}  // namespace ring::fuzz
