#include "common/contract/control.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

namespace ring::contract::control {

using nlohmann::json;

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// One field of message M: what FieldInfo says about it, and the member of M it is read into and
// written from. The reader (read_message) and the writer (write_message) both walk these.
template <class M>
struct Field {
  FieldInfo info;
  std::variant<int64_t M::*, double M::*, bool M::*, std::string M::*, json M::*> member;
  bool write_false = true;                             // kBoolean: false is written too
  bool (*valid_string)(const std::string&) = nullptr;  // kString: an extra rule
  const char* string_rule = "";                        // ... and its text
};

template <class M>
struct Message {
  const char* kind;
  bool from_worker;
  std::vector<Field<M>> fields;
};

// ---- field builders ---------------------------------------------------------------------------

template <class M>
Field<M> integer(const char* key, int64_t M::*m, int64_t lo, int64_t hi, bool required = true) {
  Field<M> f{FieldInfo{key, FieldType::kInteger, required, lo, hi}, m};
  return f;
}
// An integer in [lo, n], n the model size the reader is given.
template <class M>
Field<M> up_to_n(const char* key, int64_t M::*m, int64_t lo) {
  Field<M> f = integer(key, m, lo, kInt64Max);
  f.info.bounded_by_n = true;
  return f;
}
template <class M>
Field<M> version(const char* key, int64_t M::*m, int64_t v) {
  Field<M> f = integer(key, m, v, v);
  f.info.version = true;
  return f;
}
// Optional; absent reads as the member's default.
template <class M>
Field<M> number(const char* key, double M::*m, bool null_is_nan, bool non_negative) {
  Field<M> f{FieldInfo{key, FieldType::kNumber, false}, m};
  f.info.null_is_nan = null_is_nan;
  f.info.non_negative = non_negative;
  return f;
}
template <class M>
Field<M> boolean(const char* key, bool M::*m, bool required, bool write_false = true) {
  Field<M> f{FieldInfo{key, FieldType::kBoolean, required}, m};
  f.write_false = write_false;
  return f;
}
template <class M>
Field<M> string(const char* key, std::string M::*m, bool required,
                bool (*valid)(const std::string&) = nullptr, const char* rule = "") {
  Field<M> f{FieldInfo{key, FieldType::kString, required}, m};
  f.valid_string = valid;
  f.string_rule = rule;
  return f;
}
// Optional; absent reads as null.
template <class M>
Field<M> object_or_null(const char* key, json M::*m) {
  return Field<M>{FieldInfo{key, FieldType::kObjectOrNull, false}, m};
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

// ---- the tables: one per message ---------------------------------------------------------------

// Every message of both directions. Field order is the order the reader checks them in (so the
// first bad field is the one named) and the writer writes them in. One field a line.
// clang-format off
const auto& tables() {
  static const auto all = std::make_tuple(
      // worker -> ringd
      Message<Hello>{"hello", true, {
          integer("rank", &Hello::rank, 0, kInt32Max),
          integer("local", &Hello::local, 0, kInt32Max),
          integer("pid", &Hello::pid, 1, kInt32Max),
          integer("n", &Hello::n, 1, kInt64Max),
          version("proto", &Hello::proto, kProtocolVersion)}},
      Message<Mapped>{"mapped", true, {}},
      Message<Init>{"init", true, {}},
      Message<Heartbeat>{"hb", true, {}},
      Message<Bucket>{"bucket", true, {
          integer("step", &Bucket::step, 1, kInt64Max),
          integer("b", &Bucket::b, 0, kInt32Max)}},
      Message<Done>{"done", true, {
          integer("step", &Done::step, 1, kInt64Max),
          number("loss_sum", &Done::loss_sum, /*null_is_nan=*/true, /*non_negative=*/false),
          integer("valid", &Done::valid, 0, kInt64Max, /*required=*/false),
          integer("tokens", &Done::tokens, 0, kInt64Max, /*required=*/false),
          number("step_ms", &Done::step_ms, false, true),
          number("ring_wait_ms", &Done::ring_wait_ms, false, true),
          integer("bytes_sent", &Done::bytes_sent, 0, kInt64Max, /*required=*/false),
          object_or_null("cursor", &Done::cursor),
          boolean("stop", &Done::stop, /*required=*/false, /*write_false=*/false),
          number("data_ms", &Done::data_ms, false, true),
          number("compute_ms", &Done::compute_ms, false, true),
          number("wait_ms", &Done::wait_ms, false, true),
          number("comm_ms", &Done::comm_ms, false, true),
          integer("prev", &Done::prev, -1, kInt32Max, /*required=*/false)}},
      // ringd -> worker
      Message<Welcome>{"welcome", false, {
          string("shm", &Welcome::shm, /*required=*/true, valid_shm_name,
                 "must be a shared-memory name ('/' and 1..254 printable bytes, no '/')"),
          integer("start_step", &Welcome::start_step, 0, kInt64Max - 1),
          boolean("need_init", &Welcome::need_init, /*required=*/true),
          object_or_null("cursor", &Welcome::cursor)}},
      Message<Params>{"params", false, {
          integer("step", &Params::step, 1, kInt64Max),
          up_to_n("changed", &Params::changed, -1),
          boolean("stop", &Params::stop, /*required=*/false)}},
      Message<Stop>{"stop", false, {
          string("reason", &Stop::reason, /*required=*/false)}});
  return all;
}
// clang-format on

template <class M>
const Message<M>& table() {
  return std::get<Message<M>>(tables());
}

// ---- the reader and the writer, driven by a table ---------------------------------------------

template <class M>
void read_field(const Message<M>& t, const Field<M>& f, const json& j, int64_t n, M& m) {
  const FieldInfo& i = f.info;
  const auto fail = [&](const std::string& rule) {
    throw ControlError(std::string(t.kind) + "." + i.key,
                       "control message '" + std::string(t.kind) + "': " + i.key + ": " + rule);
  };
  const auto it = j.find(i.key);
  if (it == j.end()) {
    if (i.required) fail("missing");
    return;
  }
  const json& v = *it;
  const std::string got = std::string(", got ") + v.type_name();
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(m.*member)>;
        T& dst = m.*member;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (!v.is_number_integer()) fail("must be an integer" + got);
          if (v.is_number_unsigned() && v.template get<uint64_t>() > uint64_t{kInt64Max})
            fail("out of range");
          const int64_t x = v.template get<int64_t>();
          if (i.version && x != i.lo) {
            const char* sender = t.from_worker ? "the worker" : "ringd";
            const char* receiver = t.from_worker ? "ringd" : "the worker";
            fail(std::string(sender) + " speaks control protocol " + std::to_string(x) + ", " +
                 receiver + " speaks " + std::to_string(i.lo) +
                 " (ring-worker and ringd must come from the same build)");
          }
          const int64_t hi = i.bounded_by_n ? std::max(n, i.lo) : i.hi;
          if (x < i.lo || x > hi)
            fail(std::to_string(x) + " is outside [" + std::to_string(i.lo) + ", " +
                 std::to_string(hi) + "]");
          dst = x;
        } else if constexpr (std::is_same_v<T, double>) {
          // null stands for a non-finite value (nlohmann writes NaN and inf as null).
          if (v.is_null() && i.null_is_nan) {
            dst = std::numeric_limits<double>::quiet_NaN();
            return;
          }
          if (!v.is_number()) fail("must be a number" + got);
          const double x = v.template get<double>();
          // nlohmann reads 1e400 as inf, and writes inf back as null: keep every value finite
          // (or NaN) so that a message re-encodes to itself.
          if (!std::isfinite(x)) {
            if (!i.null_is_nan) fail("must be finite");
            dst = std::numeric_limits<double>::quiet_NaN();
            return;
          }
          if (i.non_negative && !(x >= 0)) fail("must not be negative");
          dst = x;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!v.is_boolean()) fail("must be true or false" + got);
          dst = v.template get<bool>();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!v.is_string()) fail("must be a string" + got);
          dst = v.template get<std::string>();
          if (f.valid_string && !f.valid_string(dst)) fail(f.string_rule);
        } else {
          if (v.is_null()) return;
          if (!v.is_object()) fail("must be an object or null");
          dst = v;
        }
      },
      f.member);
}

template <class M>
M read_message(const Message<M>& t, const json& j, int64_t n) {
  M m{};
  // A message without fields (mapped, init, hb) has no members to read into.
  if constexpr (!std::is_empty_v<M>) {
    for (const Field<M>& f : t.fields) read_field(t, f, j, n, m);
  }
  return m;
}

template <class M>
json write_message(const Message<M>& t, const M& m) {
  json j = json::object();
  j["t"] = t.kind;
  if constexpr (!std::is_empty_v<M>) {
    for (const Field<M>& f : t.fields) {
      std::visit(
          [&](auto member) {
            const auto& x = m.*member;
            using T = std::remove_cvref_t<decltype(x)>;
            if constexpr (std::is_same_v<T, bool>) {
              if (x || f.write_false) j[f.info.key] = x;
            } else if constexpr (std::is_same_v<T, double>) {
              j[f.info.key] = std::isfinite(x) ? json(x) : json(nullptr);
            } else {
              j[f.info.key] = x;
            }
          },
          f.member);
    }
  }
  return j;
}

// The alternative of Variant whose table has kind `kind`, read from j.
template <class Variant, size_t... I>
bool read_variant(const std::string& kind, const json& j, int64_t n, Variant& out,
                  std::index_sequence<I...>) {
  const auto one = [&](const auto& t) {
    if (kind != t.kind) return false;
    out = read_message(t, j, n);
    return true;
  };
  return (one(table<std::variant_alternative_t<I, Variant>>()) || ...);
}

template <class Variant>
json write_variant(const Variant& m) {
  return std::visit(
      [](const auto& x) { return write_message(table<std::decay_t<decltype(x)>>(), x); }, m);
}

template <class Variant, size_t... I>
void describe(std::vector<MessageInfo>& out, std::index_sequence<I...>) {
  const auto one = [&](const auto& t) {
    MessageInfo info{t.kind, t.from_worker, {}};
    for (const auto& f : t.fields) info.fields.push_back(f.info);
    out.push_back(std::move(info));
  };
  (one(table<std::variant_alternative_t<I, Variant>>()), ...);
}

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

template <class Variant>
Variant from_json(const json& j, int64_t n, const char* who) {
  const std::string t = kind_of(j);
  Variant m;
  if (!read_variant(t, j, n, m, std::make_index_sequence<std::variant_size_v<Variant>>()))
    throw ControlError(
        "t", std::string(who) + " control message: unknown kind '" + t.substr(0, 64) + "'");
  return m;
}

}  // namespace

const std::vector<MessageInfo>& message_table() {
  static const std::vector<MessageInfo> all = [] {
    std::vector<MessageInfo> v;
    describe<WorkerMessage>(v, std::make_index_sequence<std::variant_size_v<WorkerMessage>>());
    describe<RingdMessage>(v, std::make_index_sequence<std::variant_size_v<RingdMessage>>());
    return v;
  }();
  return all;
}

WorkerMessage worker_from_json(const json& j) {
  return from_json<WorkerMessage>(j, 0, "worker");
}

RingdMessage ringd_from_json(const json& j, int64_t n) {
  return from_json<RingdMessage>(j, n, "ringd");
}

WorkerMessage parse_worker_line(std::string_view line) {
  return worker_from_json(parse_line(line, "worker"));
}

RingdMessage parse_ringd_line(std::string_view line, int64_t n) {
  return ringd_from_json(parse_line(line, "ringd"), n);
}

json to_json(const WorkerMessage& m) {
  return write_variant(m);
}
json to_json(const RingdMessage& m) {
  return write_variant(m);
}

std::string encode(const WorkerMessage& m) {
  return to_json(m).dump() + "\n";
}
std::string encode(const RingdMessage& m) {
  return to_json(m).dump() + "\n";
}

}  // namespace ring::contract::control
