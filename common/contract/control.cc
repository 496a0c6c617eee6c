#include "common/contract/control.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/wire/table.h"

namespace ring::contract::control {

using nlohmann::json;

namespace {

using wire::boolean;
using wire::bounded_integer;
using wire::integer;
using wire::json_object;
using wire::number;
using wire::number_or_nan;
using wire::Presence;
using wire::string;
using wire::Table;
using wire::version;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Presence kRequired = Presence::kRequired;
constexpr Presence kOptional = Presence::kOptional;  // may be absent; always written
constexpr Presence kWhenSet = Presence::kWhenSet;    // may be absent; written when set

// ---- the dialect: how a broken rule reads ------------------------------------------------------

std::string got(const wire::Breach& b) {
  return std::string(", got ") + b.value->type_name();
}

std::string wording(const wire::Breach& b) {
  using What = wire::Breach::What;
  switch (b.what) {
    case What::kMissing:
      return "missing";
    case What::kWrongType:
      switch (b.expected) {
        case wire::Shape::kInteger:
          return "must be an integer" + got(b);
        case wire::Shape::kNumber:
          return "must be a number" + got(b);
        case wire::Shape::kBoolean:
          return "must be true or false" + got(b);
        case wire::Shape::kString:
          return "must be a string" + got(b);
        default:
          return "must be an object or null";
      }
    case What::kIntegerOverflow:
      return "out of range";
    case What::kIntegerRange:
      return std::to_string(b.x) + " is outside [" + std::to_string(b.lo) + ", " +
             std::to_string(b.hi) + "]";
    case What::kNotFinite:
      return "must be finite";
    case What::kNumberRange:
      return "must not be negative";  // the only range of a control number
    default:
      return b.text;
  }
}

// "control message 'done': loss_sum: must be a number, got string", naming "done.loss_sum".
void fail(const wire::Where& w, const wire::Breach& b) {
  throw ControlError(w.path(),
                     "control message '" + std::string(w.root) + "': " + w.rel + ": " + wording(b));
}

// Unknown keys are ignored; a NaN loss is written as null and read back as NaN.
constexpr wire::Dialect kDialect{
    .null_is_absent = false, .refuse_unknown = false, .nonfinite_as_null = true, .fail = fail};

// ---- the tables: one per message ---------------------------------------------------------------

// A shm name as shm_open takes it: one leading '/', no other, printable, at most NAME_MAX.
bool valid_shm_name(const std::string& s) {
  if (s.size() < 2 || s.size() > 255 || s[0] != '/') return false;
  for (size_t i = 1; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '/' || c < 0x21 || c > 0x7e) return false;
  }
  return s != "/." && s != "/..";
}
std::string shm_rule(const std::string& s) {
  return valid_shm_name(s)
             ? std::string()
             : "must be a shared-memory name ('/' and 1..254 printable bytes, no '/')";
}

// hello.proto of another build.
std::string proto_mismatch(int64_t got, int64_t want) {
  return "the worker speaks control protocol " + std::to_string(got) + ", ringd speaks " +
         std::to_string(want) + " (ring-worker and ringd must come from the same build)";
}

// clang-format off
// Field order is the order the reader checks them in (so the first bad field is the one named).
// One field a line.
template <class M>
const Table<M>& table();

// worker -> ringd

template <>
const Table<Hello>& table<Hello>() {
  static const Table<Hello> t{"hello", {
      integer("rank", &Hello::rank, 0, kInt32Max),
      integer("local", &Hello::local, 0, kInt32Max),
      integer("pid", &Hello::pid, 1, kInt32Max),
      integer("n", &Hello::n, 1, kInt64Max),
      version("proto", &Hello::proto, kProtocolVersion, proto_mismatch)}};
  return t;
}
template <>
const Table<Mapped>& table<Mapped>() {
  static const Table<Mapped> t{"mapped", {}};
  return t;
}
template <>
const Table<Init>& table<Init>() {
  static const Table<Init> t{"init", {}};
  return t;
}
template <>
const Table<Heartbeat>& table<Heartbeat>() {
  static const Table<Heartbeat> t{"hb", {}};
  return t;
}
template <>
const Table<Bucket>& table<Bucket>() {
  static const Table<Bucket> t{"bucket", {
      integer("step", &Bucket::step, 1, kInt64Max),
      integer("b", &Bucket::b, 0, kInt32Max)}};
  return t;
}
template <>
const Table<Done>& table<Done>() {
  static const Table<Done> t{"done", {
      integer("step", &Done::step, 1, kInt64Max),
      number_or_nan("loss_sum", &Done::loss_sum, kOptional),
      integer("valid", &Done::valid, 0, kInt64Max, kOptional),
      integer("tokens", &Done::tokens, 0, kInt64Max, kOptional),
      number("step_ms", &Done::step_ms, 0, kInf, kOptional),
      number("ring_wait_ms", &Done::ring_wait_ms, 0, kInf, kOptional),
      integer("bytes_sent", &Done::bytes_sent, 0, kInt64Max, kOptional),
      json_object("cursor", &Done::cursor, /*null_ok=*/true),
      boolean("stop", &Done::stop, kWhenSet),
      number("data_ms", &Done::data_ms, 0, kInf, kOptional),
      number("compute_ms", &Done::compute_ms, 0, kInf, kOptional),
      number("wait_ms", &Done::wait_ms, 0, kInf, kOptional),
      number("comm_ms", &Done::comm_ms, 0, kInf, kOptional),
      integer("prev", &Done::prev, -1, kInt32Max, kOptional)}};
  return t;
}

// ringd -> worker

template <>
const Table<Welcome>& table<Welcome>() {
  static const Table<Welcome> t{"welcome", {
      string("shm", &Welcome::shm, kRequired, shm_rule),
      integer("start_step", &Welcome::start_step, 0, kInt64Max - 1),
      boolean("need_init", &Welcome::need_init),
      json_object("cursor", &Welcome::cursor, /*null_ok=*/true)}};
  return t;
}
template <>
const Table<Params>& table<Params>() {
  static const Table<Params> t{"params", {
      integer("step", &Params::step, 1, kInt64Max),
      bounded_integer("changed", &Params::changed, -1),  // at most n, the model size
      boolean("stop", &Params::stop, kOptional)}};
  return t;
}
template <>
const Table<Stop>& table<Stop>() {
  static const Table<Stop> t{"stop", {
      string("reason", &Stop::reason, kOptional)}};
  return t;
}

// clang-format on

// Each direction's messages, chosen by "t".
template <class Variant>
const wire::Catalog<Variant>& catalog();

template <>
const wire::Catalog<WorkerMessage>& catalog<WorkerMessage>() {
  static const wire::Catalog<WorkerMessage> c(table<Hello>(), table<Mapped>(), table<Init>(),
                                              table<Heartbeat>(), table<Bucket>(), table<Done>());
  return c;
}
template <>
const wire::Catalog<RingdMessage>& catalog<RingdMessage>() {
  static const wire::Catalog<RingdMessage> c(table<Welcome>(), table<Params>(), table<Stop>());
  return c;
}

FieldInfo info(const wire::Rule& r) {
  FieldInfo f;
  f.key = r.key;
  f.required = r.required();
  switch (r.kind) {
    case wire::Kind::kInteger:
      f.type = FieldType::kInteger;
      f.lo = r.lo;
      f.hi = r.hi;
      f.bounded_by_n = r.bounded;
      f.version = r.version;
      break;
    case wire::Kind::kNumber:
      f.type = FieldType::kNumber;
      f.null_is_nan = r.null_is_nan;
      f.non_negative = r.min >= 0;
      break;
    case wire::Kind::kBoolean:
      f.type = FieldType::kBoolean;
      break;
    case wire::Kind::kString:
      f.type = FieldType::kString;
      break;
    default:
      f.type = FieldType::kObjectOrNull;
      break;
  }
  return f;
}

template <class Variant>
void describe(std::vector<MessageInfo>& out, bool from_worker) {
  const auto& c = catalog<Variant>();
  for (size_t i = 0; i < c.size(); ++i) {
    MessageInfo m{c.name(i), from_worker, {}};
    for (const wire::Rule& r : c.rules(i)) m.fields.push_back(info(r));
    out.push_back(std::move(m));
  }
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
  const auto& c = catalog<Variant>();
  const int index = c.find(t);
  if (index < 0)
    throw ControlError(
        "t", std::string(who) + " control message: unknown kind '" + t.substr(0, 64) + "'");
  wire::Cursor cursor(j, kDialect, t, n);
  return c.read(static_cast<size_t>(index), cursor);
}

template <class Variant>
json write(const Variant& m) {
  const auto& c = catalog<Variant>();
  json j = c.write(m, kDialect);
  j["t"] = c.name(m);
  return j;
}

}  // namespace

const std::vector<MessageInfo>& message_table() {
  static const std::vector<MessageInfo> all = [] {
    std::vector<MessageInfo> v;
    describe<WorkerMessage>(v, /*from_worker=*/true);
    describe<RingdMessage>(v, /*from_worker=*/false);
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
  return write(m);
}
json to_json(const RingdMessage& m) {
  return write(m);
}

std::string encode(const WorkerMessage& m) {
  return to_json(m).dump() + "\n";
}
std::string encode(const RingdMessage& m) {
  return to_json(m).dump() + "\n";
}

}  // namespace ring::contract::control
