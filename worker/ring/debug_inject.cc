#include "worker/ring/debug_inject.h"

#include <charconv>
#include <map>
#include <string_view>

namespace ring::cp {
namespace {

// "k=v,k=v" with integer values; only `keys` allowed, each at most once, `required` present.
std::string parse_pairs(const char* var, const char* text, const std::map<std::string, bool>& keys,
                        std::map<std::string, int64_t>* out) {
  std::string_view s(text);
  const std::string expected =
      std::string(var) + " must look like \"" +
      (std::string(var) == "RING_DEBUG_DELAY" ? "rank=R,ms=M[,from=S]" : "rank=R,step=S") + "\"";
  while (!s.empty()) {
    const size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return expected + ": '" + std::string(item) + "' has no '='";
    const std::string key(item.substr(0, eq));
    const std::string_view val = item.substr(eq + 1);
    if (!keys.count(key)) return expected + ": unknown key '" + key + "'";
    if (out->count(key)) return expected + ": '" + key + "' given twice";
    int64_t v = 0;
    auto [p, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
    if (ec != std::errc() || p != val.data() + val.size() || v < 0 || v > 86400000)
      return expected + ": " + key + " '" + std::string(val) +
             "' is not an integer in [0, 86400000]";
    (*out)[key] = v;
  }
  for (const auto& [k, required] : keys)
    if (required && !out->count(k)) return expected + ": '" + k + "' is missing";
  return "";
}

}  // namespace

std::string parse_debug_inject(const char* delay, const char* block, int rank, DebugInject* out) {
  *out = DebugInject{};
  if (delay && *delay) {
    std::map<std::string, int64_t> v;
    std::string e =
        parse_pairs("RING_DEBUG_DELAY", delay, {{"rank", true}, {"ms", true}, {"from", false}}, &v);
    if (!e.empty()) return e;
    if (v["rank"] == rank) {
      out->delay_ms = v["ms"];
      out->delay_from = v.count("from") ? std::max<int64_t>(1, v["from"]) : 1;
    }
  }
  if (block && *block) {
    std::map<std::string, int64_t> v;
    std::string e = parse_pairs("RING_DEBUG_BLOCK", block, {{"rank", true}, {"step", true}}, &v);
    if (!e.empty()) return e;
    if (v["step"] < 1) return "RING_DEBUG_BLOCK: step must be at least 1";
    if (v["rank"] == rank) out->block_step = v["step"];
  }
  return "";
}

}  // namespace ring::cp
