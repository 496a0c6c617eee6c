#include "worker/offload/control.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace ring::offload::control {

using nlohmann::json;

namespace {

// Typed access to one message's fields; every failure names "<kind>.<key>" and the rule.
struct Fields {
  const json& j;
  std::string kind;

  [[noreturn]] void fail(const std::string& key, const std::string& rule) const {
    throw ControlError(kind + "." + key, "control message '" + kind + "': " + key + ": " + rule);
  }
  const json* find(const std::string& key) const {
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  }
  const json& at(const std::string& key) const {
    const json* v = find(key);
    if (!v) fail(key, "missing");
    return *v;
  }
  int64_t integer(const json& v, const std::string& key, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(key, "must be an integer, got " + std::string(v.type_name()));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(key, "out of range");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      fail(key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
    return x;
  }
  int64_t i64(const std::string& key, int64_t lo, int64_t hi) const {
    return integer(at(key), key, lo, hi);
  }
  int64_t i64_or(const std::string& key, int64_t lo, int64_t hi, int64_t dflt) const {
    const json* v = find(key);
    return v ? integer(*v, key, lo, hi) : dflt;
  }
  // A non-negative number; null stands for a non-finite value (nlohmann writes NaN and inf as
  // null) and reads as NaN when allowed.
  double number_or(const std::string& key, double dflt, bool null_is_nan, bool non_negative) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (v->is_null() && null_is_nan) return std::numeric_limits<double>::quiet_NaN();
    if (!v->is_number()) fail(key, "must be a number, got " + std::string(v->type_name()));
    const double x = v->get<double>();
    // nlohmann reads 1e400 as inf, and writes inf back as null: keep every value finite (or NaN)
    // so that a message re-encodes to itself.
    if (!std::isfinite(x)) {
      if (null_is_nan) return std::numeric_limits<double>::quiet_NaN();
      fail(key, "must be finite");
    }
    if (non_negative && !(x >= 0)) fail(key, "must not be negative");
    return x;
  }
  bool boolean(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_boolean()) fail(key, "must be true or false, got " + std::string(v.type_name()));
    return v.get<bool>();
  }
  bool boolean_or(const std::string& key, bool dflt) const {
    return find(key) ? boolean(key) : dflt;
  }
  std::string str_or(const std::string& key, const std::string& dflt) const {
    const json* v = find(key);
    if (!v) return dflt;
    if (!v->is_string()) fail(key, "must be a string, got " + std::string(v->type_name()));
    return v->get<std::string>();
  }
  json cursor() const {
    const json* v = find("cursor");
    if (!v || v->is_null()) return json();
    if (!v->is_object()) fail("cursor", "must be an object or null");
    return *v;
  }
};

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

json parse_line(std::string_view line, const char* who) {
  if (line.size() > kMaxLineBytes)
    throw ControlError("", std::string(who) + " control line of " + std::to_string(line.size()) +
                               " bytes exceeds " + std::to_string(kMaxLineBytes));
  json j;
  try {
    // allow_exceptions=false still throws for a number out of double range (out_of_range.406).
    j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  } catch (const json::exception& e) {
    throw ControlError("", std::string(who) + " control line is not JSON: " + e.what());
  }
  if (j.is_discarded())
    throw ControlError(
        "", std::string(who) + " control line is not JSON: " + std::string(line.substr(0, 200)));
  return j;
}

std::string kind_of(const json& j) {
  if (!j.is_object()) throw ControlError("", "control message must be a JSON object");
  auto it = j.find("t");
  if (it == j.end()) throw ControlError("t", "control message: t: missing");
  if (!it->is_string()) throw ControlError("t", "control message: t: must be a string");
  return it->get<std::string>();
}

// A shm name as shm_open takes it: one leading '/', no other, printable, at most NAME_MAX.
bool valid_shm_name(const std::string& s) {
  if (s.size() < 2 || s.size() > 255 || s[0] != '/') return false;
  for (size_t i = 1; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '/' || c < 0x21 || c > 0x7e) return false;
  }
  return s != "/." && s != "/..";
}

}  // namespace

WorkerMessage worker_from_json(const json& j) {
  const std::string t = kind_of(j);
  Fields f{j, t};
  if (t == "hello") {
    Hello h;
    h.rank = f.i64("rank", 0, kInt32Max);
    h.local = f.i64("local", 0, kInt32Max);
    h.pid = f.i64("pid", 1, kInt32Max);
    h.n = f.i64("n", 1, INT64_MAX);
    return h;
  }
  if (t == "mapped") return Mapped{};
  if (t == "init") return Init{};
  if (t == "hb") return Heartbeat{};
  if (t == "bucket") return Bucket{f.i64("step", 1, INT64_MAX), f.i64("b", 0, kInt32Max)};
  if (t == "done") {
    Done d;
    d.step = f.i64("step", 1, INT64_MAX);
    d.loss_sum = f.number_or("loss_sum", 0, /*null_is_nan=*/true, /*non_negative=*/false);
    d.valid = f.i64_or("valid", 0, INT64_MAX, 0);
    d.tokens = f.i64_or("tokens", 0, INT64_MAX, 0);
    d.step_ms = f.number_or("step_ms", 0, false, true);
    d.ring_wait_ms = f.number_or("ring_wait_ms", 0, false, true);
    d.bytes_sent = f.i64_or("bytes_sent", 0, INT64_MAX, 0);
    d.cursor = f.cursor();
    d.stop = f.boolean_or("stop", false);
    return d;
  }
  throw ControlError("t", "worker control message: unknown kind '" + t.substr(0, 64) + "'");
}

RingdMessage ringd_from_json(const json& j, int64_t n) {
  const std::string t = kind_of(j);
  Fields f{j, t};
  if (t == "welcome") {
    Welcome w;
    const json& shm = f.at("shm");
    if (!shm.is_string() || !valid_shm_name(shm.get<std::string>()))
      f.fail("shm", "must be a shared-memory name ('/' and 1..254 printable bytes, no '/')");
    w.shm = shm.get<std::string>();
    w.start_step = f.i64("start_step", 0, INT64_MAX - 1);
    w.need_init = f.boolean("need_init");
    w.cursor = f.cursor();
    return w;
  }
  if (t == "params") {
    Params p;
    p.step = f.i64("step", 1, INT64_MAX);
    p.changed = f.i64("changed", -1, n < 0 ? -1 : n);
    p.stop = f.boolean_or("stop", false);
    return p;
  }
  if (t == "stop") return Stop{f.str_or("reason", "")};
  throw ControlError("t", "ringd control message: unknown kind '" + t.substr(0, 64) + "'");
}

WorkerMessage parse_worker_line(std::string_view line) {
  return worker_from_json(parse_line(line, "worker"));
}

RingdMessage parse_ringd_line(std::string_view line, int64_t n) {
  return ringd_from_json(parse_line(line, "ringd"), n);
}

json to_json(const WorkerMessage& m) {
  return std::visit(
      [](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Hello>) {
          return {{"t", "hello"}, {"rank", x.rank}, {"local", x.local}, {"pid", x.pid}, {"n", x.n}};
        } else if constexpr (std::is_same_v<T, Mapped>) {
          return {{"t", "mapped"}};
        } else if constexpr (std::is_same_v<T, Init>) {
          return {{"t", "init"}};
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          return {{"t", "hb"}};
        } else if constexpr (std::is_same_v<T, Bucket>) {
          return {{"t", "bucket"}, {"step", x.step}, {"b", x.b}};
        } else {
          json j = {{"t", "done"},
                    {"step", x.step},
                    {"loss_sum", nullptr},
                    {"valid", x.valid},
                    {"tokens", x.tokens},
                    {"step_ms", x.step_ms},
                    {"ring_wait_ms", x.ring_wait_ms},
                    {"bytes_sent", x.bytes_sent},
                    {"cursor", x.cursor}};
          if (std::isfinite(x.loss_sum)) j["loss_sum"] = x.loss_sum;
          if (x.stop) j["stop"] = true;
          return j;
        }
      },
      m);
}

json to_json(const RingdMessage& m) {
  return std::visit(
      [](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Welcome>) {
          return {{"t", "welcome"},
                  {"shm", x.shm},
                  {"start_step", x.start_step},
                  {"need_init", x.need_init},
                  {"cursor", x.cursor}};
        } else if constexpr (std::is_same_v<T, Params>) {
          return {{"t", "params"}, {"step", x.step}, {"changed", x.changed}, {"stop", x.stop}};
        } else {
          return {{"t", "stop"}, {"reason", x.reason}};
        }
      },
      m);
}

std::string encode(const WorkerMessage& m) {
  return to_json(m).dump() + "\n";
}
std::string encode(const RingdMessage& m) {
  return to_json(m).dump() + "\n";
}

}  // namespace ring::offload::control
