#include "common/topology/hostlist.h"

#include <fmt/format.h>

#include <cctype>

namespace ring::topology {

namespace {

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// One item: literal text and bracket groups, expanded into `out`.
void expand_item(std::string_view expr, size_t base, std::string_view item,
                 std::vector<std::string>& out) {
  auto fail = [&](size_t at, const std::string& what) {
    return TopologyError(
        fmt::format("hostlist '{}': at character {}: {}", expr, base + at + 1, what));
  };
  // Parts: literal strings between groups, and each group's list of values.
  std::vector<std::string> partial{""};
  size_t i = 0;
  while (i < item.size()) {
    if (item[i] == ']') throw fail(i, "']' without '['");
    if (item[i] != '[') {
      size_t j = item.find_first_of("[]", i);
      if (j == std::string_view::npos) j = item.size();
      for (auto& p : partial) p.append(item.substr(i, j - i));
      i = j;
      continue;
    }
    size_t close = item.find(']', i);
    if (close == std::string_view::npos) throw fail(i, "'[' is not closed");
    std::string_view body = item.substr(i + 1, close - i - 1);
    if (body.find('[') != std::string_view::npos) throw fail(i, "nested '['");
    if (trim(body).empty()) throw fail(i, "empty brackets");
    std::vector<std::string> values;
    size_t r = 0;
    while (r <= body.size()) {
      size_t comma = body.find(',', r);
      if (comma == std::string_view::npos) comma = body.size();
      std::string_view range = trim(body.substr(r, comma - r));
      size_t dash = range.find('-');
      std::string_view lo_s = dash == std::string_view::npos ? range : range.substr(0, dash);
      std::string_view hi_s = dash == std::string_view::npos ? range : range.substr(dash + 1);
      if (!all_digits(lo_s) || !all_digits(hi_s) || lo_s.size() > 9 || hi_s.size() > 9) {
        throw fail(i + 1 + r, fmt::format("'{}' is not a number or a range N-M", range));
      }
      long lo = std::stol(std::string(lo_s)), hi = std::stol(std::string(hi_s));
      if (hi < lo) throw fail(i + 1 + r, fmt::format("range '{}' goes down", range));
      if (static_cast<size_t>(hi - lo + 1) * partial.size() + values.size() > kMaxHostlistNames) {
        throw fail(i + 1 + r, fmt::format("expands to more than {} names", kMaxHostlistNames));
      }
      const int width = static_cast<int>(lo_s.size());
      for (long v = lo; v <= hi; ++v) values.push_back(fmt::format("{:0{}}", v, width));
      r = comma + 1;
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const auto& p : partial)
      for (const auto& v : values) next.push_back(p + v);
    partial = std::move(next);
    i = close + 1;
  }
  for (auto& p : partial) {
    if (p.empty()) throw fail(0, "empty host name");
    for (char c : p)
      if (std::isspace(static_cast<unsigned char>(c))) throw fail(0, "space inside a host name");
    out.push_back(std::move(p));
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expression) {
  std::vector<std::string> out;
  if (trim(expression).empty()) throw TopologyError("hostlist is empty");
  // Top-level commas split items; commas inside brackets belong to the ranges.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= expression.size(); ++i) {
    char c = i < expression.size() ? expression[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    // The end of the text closes the last item even inside an unclosed '[' (reported below).
    if ((c == ',' && depth <= 0) || i == expression.size()) {
      std::string_view item = expression.substr(start, i - start);
      size_t skip = 0;
      while (skip < item.size() && std::isspace(static_cast<unsigned char>(item[skip]))) ++skip;
      if (trim(item).empty()) {
        throw TopologyError(
            fmt::format("hostlist '{}': at character {}: empty item", expression, start + 1));
      }
      expand_item(expression, start + skip, trim(item), out);
      if (out.size() > kMaxHostlistNames) {
        throw TopologyError(fmt::format("hostlist '{}' expands to more than {} names", expression,
                                        kMaxHostlistNames));
      }
      start = i + 1;
      depth = 0;
    }
  }
  return out;
}

bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    bool da = std::isdigit(static_cast<unsigned char>(a[i]));
    bool db = std::isdigit(static_cast<unsigned char>(b[j]));
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      // Compare as numbers without overflow: strip leading zeros, then length, then digits.
      size_t is = i, js = j;
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      int c = a.compare(is, ie - is, b, js, je - js);
      if (c != 0) return c < 0;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if (a.size() - i != b.size() - j) return a.size() - i < b.size() - j;
  return a < b;
}

std::string host_of_daemon_node(const std::string& node) {
  const size_t n = node.rfind("-n");
  const size_t j = n == std::string::npos || n == 0 ? std::string::npos : node.rfind("-j", n - 1);
  auto digits = [&](size_t from, size_t to) {
    return to > from && node.find_first_not_of("0123456789", from) >= to;
  };
  if (j == std::string::npos || j == 0 || !digits(n + 2, node.size()) || !digits(j + 2, n))
    return node;
  return node.substr(0, j);
}

}  // namespace ring::topology
