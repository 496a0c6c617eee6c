// Helpers of the web endpoint tests: a raw HTTP/1.1 client over a TCP socket (no library, so the
// tests see exactly what the server sends) and a strict parser of the Prometheus text format
// 0.0.4 (independent of coordinator/prometheus.cc).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace ring::web_test {

// "http://127.0.0.1:41234/" -> port
inline int port_of(const std::string& url) {
  auto colon = url.rfind(':');
  return std::atoi(url.c_str() + colon + 1);
}

inline int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until the peer closes or `timeout_s` passes.
inline std::string read_all(int fd, double timeout_s) {
  std::string out;
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string raw;
};

inline Response parse_response(const std::string& raw) {
  Response r;
  r.raw = raw;
  size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + 9);
  size_t a = raw.find("\r\n") + 2;
  while (a < head_end) {
    size_t b = raw.find("\r\n", a);
    std::string line = raw.substr(a, b - a);
    size_t c = line.find(':');
    std::string k = line.substr(0, c);
    for (auto& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::string v = line.substr(c + 1);
    while (!v.empty() && v[0] == ' ') v.erase(0, 1);
    r.headers[k] = v;
    a = b + 2;
  }
  r.body = raw.substr(head_end + 4);
  return r;
}

// One request on a fresh connection (Connection: close).
inline Response http(int port, const std::string& method, const std::string& target,
                     const std::vector<std::string>& headers = {}, const std::string& body = "",
                     double timeout_s = 30) {
  int fd = connect_to(port);
  if (fd < 0) return {};
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST")
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  (void)!::write(fd, req.data(), req.size());
  std::string raw = read_all(fd, timeout_s);
  ::close(fd);
  return parse_response(raw);
}

// ---- Prometheus text format 0.0.4, parsed strictly ------------------------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct Parsed {
  std::map<std::string, std::string> type, help;  // family -> type / help
  std::vector<Sample> samples;
  // Samples with this name whose labels include all of `want`.
  std::vector<Sample> find(const std::string& name,
                           const std::map<std::string, std::string>& want = {}) const {
    std::vector<Sample> out;
    for (const auto& s : samples) {
      if (s.name != name) continue;
      bool ok = true;
      for (const auto& [k, v] : want)
        if (!s.labels.count(k) || s.labels.at(k) != v) ok = false;
      if (ok) out.push_back(s);
    }
    return out;
  }
};

// Throws std::runtime_error naming the line and the rule it breaks.
inline Parsed parse_exposition(const std::string& text) {
  Parsed x;
  static const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex label_name_re("[a-zA-Z_][a-zA-Z0-9_]*");
  std::set<std::string> closed;   // families whose samples ended
  std::string current;            // family of the last sample or TYPE
  std::set<std::string> sampled;  // families with samples so far
  size_t lineno = 0;
  auto fail = [&](const std::string& why, const std::string& line) {
    throw std::runtime_error("line " + std::to_string(lineno) + ": " + why + ": " + line);
  };
  auto family_of = [&](const std::string& n) {
    for (const char* suf : {"_sum", "_count", "_bucket"}) {
      std::string s = suf;
      if (n.size() > s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0) {
        std::string base = n.substr(0, n.size() - s.size());
        if (x.type.count(base) && (x.type[base] == "summary" || x.type[base] == "histogram"))
          return base;
      }
    }
    return n;
  };
  if (!text.empty() && text.back() != '\n') throw std::runtime_error("no final newline");
  size_t a = 0;
  while (a < text.size()) {
    size_t b = text.find('\n', a);
    std::string line = text.substr(a, b - a);
    a = b + 1;
    ++lineno;
    if (line.empty()) fail("empty line", line);
    if (line[0] == '#') {
      std::smatch m;
      static const std::regex meta("# (HELP|TYPE) ([^ ]+) (.*)");
      if (!std::regex_match(line, m, meta)) fail("comment is not HELP or TYPE", line);
      std::string n = m[2];
      if (!std::regex_match(n, name_re)) fail("invalid metric name", line);
      if (m[1] == "HELP") {
        if (x.help.count(n)) fail("second HELP", line);
        if (m[3].str().empty()) fail("empty HELP", line);
        x.help[n] = m[3];
      } else {
        if (x.type.count(n)) fail("second TYPE", line);
        static const std::set<std::string> types{"counter", "gauge", "summary", "histogram",
                                                 "untyped"};
        if (!types.count(m[3])) fail("unknown type", line);
        if (sampled.count(n)) fail("TYPE after samples", line);
        x.type[n] = m[3];
      }
      if (!current.empty() && current != n) closed.insert(current);
      current = n;
      continue;
    }
    // name{l="v",...} value
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    Sample s;
    s.name = line.substr(0, i);
    if (!std::regex_match(s.name, name_re)) fail("invalid metric name", line);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) fail("label without =", line);
        std::string ln = line.substr(i, eq - i);
        if (!std::regex_match(ln, label_name_re)) fail("invalid label name '" + ln + "'", line);
        if (eq + 1 >= line.size() || line[eq + 1] != '"') fail("label value not quoted", line);
        std::string v;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\') {
            ++j;
            if (j >= line.size()) fail("dangling backslash", line);
            if (line[j] == 'n')
              v += '\n';
            else if (line[j] == '\\' || line[j] == '"')
              v += line[j];
            else
              fail("bad escape in label value", line);
          } else {
            v += line[j];
          }
        }
        if (j >= line.size()) fail("unterminated label value", line);
        if (s.labels.count(ln)) fail("repeated label " + ln, line);
        s.labels[ln] = v;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) fail("unterminated label set", line);
      ++i;
    }
    if (i >= line.size() || line[i] != ' ') fail("no space before the value", line);
    std::string val = line.substr(i + 1);
    if (val.find(' ') != std::string::npos) fail("timestamps are not expected", line);
    if (val == "NaN")
      s.value = std::nan("");
    else if (val == "+Inf")
      s.value = HUGE_VAL;
    else if (val == "-Inf")
      s.value = -HUGE_VAL;
    else {
      char* end = nullptr;
      s.value = std::strtod(val.c_str(), &end);
      if (val.empty() || *end) fail("value is not a float", line);
    }
    std::string fam = family_of(s.name);
    if (!x.type.count(fam)) fail("sample without TYPE", line);
    if (!x.help.count(fam)) fail("sample without HELP", line);
    if (closed.count(fam)) fail("family's samples are not together", line);
    if (!current.empty() && current != fam) closed.insert(current);
    current = fam;
    sampled.insert(fam);
    if (x.type[fam] == "summary" && s.name == fam && !s.labels.count("quantile"))
      fail("summary sample without quantile", line);
    if (x.type[fam] == "counter" && s.value < 0) fail("negative counter", line);
    x.samples.push_back(std::move(s));
  }
  // No two samples with the same name and labels.
  std::set<std::string> seen;
  for (const auto& s : x.samples) {
    std::string key = s.name;
    for (const auto& [k, v] : s.labels) key += "\x01" + k + "=" + v;
    if (!seen.insert(key).second) throw std::runtime_error("duplicate series " + s.name);
  }
  return x;
}

}  // namespace ring::web_test
