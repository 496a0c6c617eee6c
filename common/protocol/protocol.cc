#include "common/protocol/protocol.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "common/protocol/fields.h"

namespace ring::protocol {

using nlohmann::json;

namespace {

constexpr int64_t kMaxId = (int64_t{1} << 53);  // exact in a double, for JSON consumers
constexpr size_t kMaxName = 253;
constexpr size_t kMaxText = 4096;
constexpr size_t kMaxList = 4096;
constexpr size_t kMaxPath = 4096;

const char* json_kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// ---- the three ways through a message's field table -------------------------------------------
//
// Each message (and each object inside one) is described ONCE, by a `fields(io, m)` function
// below that lists its fields in order with their rules. The same description drives:
//   Reader    JSON -> struct: checks type, range, length, required/optional; finish() refuses
//             fields that were not described ("unknown field"); errors name "type.path.key".
//   Writer    struct -> JSON: writes every described field (an optional one only when set, or
//             always where the wire format has always carried it: Write::kAlways).
//   Describer the table as data (fields.h), for tests and tools.
// Rules that span fields (an event kind's required fields, a Slurm job id's format) are checks
// in the description that only the Reader runs (`if constexpr (IO::kReading)`).

// When an optional field is written.
enum class Write { kIfSet, kAlways };

// Reads the fields of one JSON object, with the dotted path used in errors. finish() refuses
// fields that were not read.
class Reader {
 public:
  static constexpr bool kReading = true;

  Reader(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {
    if (!obj_.is_object()) fail(path_, std::string("expected an object, got ") + json_kind(obj_));
  }

  [[noreturn]] static void fail(const std::string& field, const std::string& what) {
    throw ProtocolError(code::kBadField, field, "field '" + field + "': " + what);
  }

  std::string field(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  const json* find(const char* key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  const json& need(const char* key) {
    const json* v = find(key);
    if (!v) fail(field(key), "required field is missing");
    return *v;
  }

  // ---- the field kinds (Writer and Describer have the same ones)

  void i64(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    out = as_i64(need(key), key, lo, hi);
  }
  void opt_i64(const char* key, std::optional<int64_t>& out, int64_t lo, int64_t hi) {
    const json* v = find(key);
    if (!v || v->is_null())
      out.reset();
    else
      out = as_i64(*v, key, lo, hi);
  }
  // Optional on the wire with a default; always written.
  void i64_or(const char* key, int64_t& out, int64_t lo, int64_t hi, int64_t dflt) {
    std::optional<int64_t> v;
    opt_i64(key, v, lo, hi);
    out = v.value_or(dflt);
  }
  void num(const char* key, double& out, double lo, double hi) {
    out = as_num(need(key), key, lo, hi);
  }
  void opt_num(const char* key, std::optional<double>& out, double lo, double hi) {
    const json* v = find(key);
    if (!v || v->is_null())
      out.reset();
    else
      out = as_num(*v, key, lo, hi);
  }
  void boolean(const char* key, bool& out) {
    const json& v = need(key);
    if (!v.is_boolean()) fail(field(key), std::string("expected a boolean, got ") + json_kind(v));
    out = v.get<bool>();
  }
  void opt_bool(const char* key, std::optional<bool>& out) {
    const json* v = find(key);
    if (!v || v->is_null()) {
      out.reset();
      return;
    }
    if (!v->is_boolean()) fail(field(key), std::string("expected a boolean, got ") + json_kind(*v));
    out = v->get<bool>();
  }
  void str(const char* key, std::string& out, size_t min_len, size_t max_len) {
    out = as_str(need(key), field(key), min_len, max_len);
  }
  void opt_str(const char* key, std::string& out, size_t max_len, Write = Write::kIfSet) {
    const json* v = find(key);
    out = !v || v->is_null() ? std::string() : as_str(*v, field(key), 0, max_len);
  }
  void node(const char* key, std::string& out) {
    str(key, out, 1, kMaxName);
    if (!valid_node_name(out))
      fail(field(key), "'" + out + "' is not a node name (letters, digits, '.', '_', '-')");
  }
  template <typename E, size_t N>
  void enumeration(const char* key, E& out, const std::pair<E, const char*> (&names)[N]) {
    std::string s;
    str(key, s, 1, 64);
    std::string allowed;
    for (const auto& [e, n] : names) {
      if (s == n) {
        out = e;
        return;
      }
      allowed += (allowed.empty() ? "" : ", ") + std::string(n);
    }
    fail(field(key), "'" + s + "' is not one of: " + allowed);
  }
  // A list of strings (optional: missing means empty).
  void strings(const char* key, std::vector<std::string>& out, size_t max_items, size_t max_len,
               Write = Write::kIfSet) {
    out.clear();
    const json* a = array(key, max_items, false);
    if (!a) return;
    for (size_t i = 0; i < a->size(); ++i)
      out.push_back(as_str((*a)[i], item(field(key), i), 0, max_len));
  }
  // A list of integers (optional: missing means empty).
  void integers(const char* key, std::vector<int64_t>& out, size_t max_items,
                Write = Write::kAlways) {
    out.clear();
    const json* a = array(key, max_items, false);
    if (!a) return;
    for (size_t k = 0; k < a->size(); ++k) {
      const json& v = (*a)[k];
      if (!v.is_number_integer()) fail(item(field(key), k), "expected an integer");
      out.push_back(v.get<int64_t>());
    }
  }
  // Any JSON object (optional: missing means {}).
  void object(const char* key, json& out) {
    const json* d = find(key);
    if (d && !d->is_object())
      fail(field(key), std::string("expected an object, got ") + json_kind(*d));
    out = d ? *d : json::object();
  }
  // One object described by fields(io, T&) (required).
  template <typename T>
  void sub(const char* key, T& out) {
    Reader r(need(key), field(key));
    fields(r, out);
    r.finish();
  }
  // A list of objects described by fields(io, T&); `required` or missing means empty.
  template <typename T>
  void objects(const char* key, std::vector<T>& out, size_t max_items, bool required,
               Write = Write::kAlways) {
    out.clear();
    const json* a = array(key, max_items, required);
    if (!a) return;
    for (size_t i = 0; i < a->size(); ++i) {
      Reader r((*a)[i], item(field(key), i));
      T t;
      fields(r, t);
      r.finish();
      out.push_back(std::move(t));
    }
  }

  void finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!seen_.count(it.key())) fail(field(it.key().c_str()), "unknown field");
  }

 private:
  static std::string item(const std::string& base, size_t i) {
    return base + "[" + std::to_string(i) + "]";
  }

  // An array of at most max_items; missing means empty when optional.
  const json* array(const char* key, size_t max_items, bool required) {
    const json* v = required ? &need(key) : find(key);
    if (!v || v->is_null()) return nullptr;
    if (!v->is_array()) fail(field(key), std::string("expected an array, got ") + json_kind(*v));
    if (v->size() > max_items)
      fail(field(key),
           "at most " + std::to_string(max_items) + " items, got " + std::to_string(v->size()));
    return v;
  }

  static std::string as_str(const json& v, const std::string& f, size_t min_len, size_t max_len) {
    if (!v.is_string()) fail(f, std::string("expected a string, got ") + json_kind(v));
    const auto& s = v.get_ref<const std::string&>();
    if (s.size() < min_len)
      fail(f,
           min_len == 1 ? "must not be empty" : "at least " + std::to_string(min_len) + " bytes");
    if (s.size() > max_len)
      fail(f, "at most " + std::to_string(max_len) + " bytes, got " + std::to_string(s.size()));
    return s;
  }
  int64_t as_i64(const json& v, const char* key, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.is_number_integer() && !v.is_number_unsigned()) {
      x = v.get<int64_t>();
    } else if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(field(key), "out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      x = static_cast<int64_t>(u);
    } else {
      fail(field(key), std::string("expected an integer, got ") + json_kind(v) +
                           (v.is_number_float() ? " (" + show(v) + ")" : ""));
    }
    if (x < lo || x > hi)
      fail(field(key), std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
    return x;
  }
  double as_num(const json& v, const char* key, double lo, double hi) const {
    if (!v.is_number()) fail(field(key), std::string("expected a number, got ") + json_kind(v));
    double x = v.get<double>();
    if (!std::isfinite(x)) fail(field(key), "must be finite");
    if (x < lo || x > hi) {
      std::ostringstream os;
      os << x << " is out of range [" << lo << ", " << hi << "]";
      fail(field(key), os.str());
    }
    return x;
  }

  const json& obj_;
  std::string path_;
  std::set<std::string> seen_;
};

// Writes the described fields of a struct into one JSON object. The descriptions take the
// struct by non-const reference (the Reader fills it); the Writer only reads it.
class Writer {
 public:
  static constexpr bool kReading = false;
  json j = json::object();

  void i64(const char* key, const int64_t& v, int64_t, int64_t) { j[key] = v; }
  void opt_i64(const char* key, const std::optional<int64_t>& v, int64_t, int64_t) {
    if (v) j[key] = *v;
  }
  void i64_or(const char* key, const int64_t& v, int64_t, int64_t, int64_t) { j[key] = v; }
  void num(const char* key, const double& v, double, double) { j[key] = v; }
  void opt_num(const char* key, const std::optional<double>& v, double, double) {
    if (v) j[key] = *v;
  }
  void boolean(const char* key, const bool& v) { j[key] = v; }
  void opt_bool(const char* key, const std::optional<bool>& v) {
    if (v) j[key] = *v;
  }
  void str(const char* key, const std::string& v, size_t, size_t) { j[key] = v; }
  void opt_str(const char* key, const std::string& v, size_t, Write w = Write::kIfSet) {
    if (w == Write::kAlways || !v.empty()) j[key] = v;
  }
  void node(const char* key, const std::string& v) { j[key] = v; }
  template <typename E, size_t N>
  void enumeration(const char* key, const E& v, const std::pair<E, const char*> (&names)[N]) {
    for (const auto& [e, n] : names)
      if (e == v) j[key] = n;
  }
  void strings(const char* key, const std::vector<std::string>& v, size_t, size_t,
               Write w = Write::kIfSet) {
    if (w == Write::kAlways || !v.empty()) j[key] = v;
  }
  void integers(const char* key, const std::vector<int64_t>& v, size_t,
                Write w = Write::kAlways) {
    if (w == Write::kAlways || !v.empty()) j[key] = v;
  }
  void object(const char* key, const json& v) { j[key] = v; }
  template <typename T>
  void sub(const char* key, T& v) {
    Writer w;
    fields(w, v);
    j[key] = std::move(w.j);
  }
  template <typename T>
  void objects(const char* key, std::vector<T>& v, size_t, bool, Write when = Write::kAlways) {
    if (when == Write::kIfSet && v.empty()) return;
    json a = json::array();
    for (auto& t : v) {
      Writer w;
      fields(w, t);
      a.push_back(std::move(w.j));
    }
    j[key] = std::move(a);
  }
};

// Records the description as FieldRules (fields.h).
class Describer {
 public:
  static constexpr bool kReading = false;
  std::vector<FieldRule> rules;

  void i64(const char* key, int64_t&, int64_t lo, int64_t hi) { add(key, "integer", true, lo, hi); }
  void opt_i64(const char* key, std::optional<int64_t>&, int64_t lo, int64_t hi) {
    add(key, "integer", false, lo, hi);
  }
  void i64_or(const char* key, int64_t&, int64_t lo, int64_t hi, int64_t) {
    add(key, "integer", false, lo, hi);
  }
  void num(const char* key, double&, double lo, double hi) { add(key, "number", true, lo, hi); }
  void opt_num(const char* key, std::optional<double>&, double lo, double hi) {
    add(key, "number", false, lo, hi);
  }
  void boolean(const char* key, bool&) { add(key, "boolean", true); }
  void opt_bool(const char* key, std::optional<bool>&) { add(key, "boolean", false); }
  void str(const char* key, std::string&, size_t lo, size_t hi) {
    add(key, "string", true, static_cast<double>(lo), static_cast<double>(hi));
  }
  void opt_str(const char* key, std::string&, size_t hi, Write = Write::kIfSet) {
    add(key, "string", false, 0.0, static_cast<double>(hi));
  }
  void node(const char* key, std::string&) { add(key, "node", true, 1.0, double(kMaxName)); }
  template <typename E, size_t N>
  void enumeration(const char* key, E&, const std::pair<E, const char*> (&names)[N]) {
    add(key, "enum", true);
    for (const auto& [e, n] : names) rules.back().choices.push_back(n);
  }
  void strings(const char* key, std::vector<std::string>&, size_t, size_t, Write = Write::kIfSet) {
    add(key, "strings", false);
  }
  void integers(const char* key, std::vector<int64_t>&, size_t, Write = Write::kAlways) {
    add(key, "integers", false);
  }
  void object(const char* key, json&) { add(key, "object", false); }
  template <typename T>
  void sub(const char* key, T&) {
    add(key, "object", true);
  }
  template <typename T>
  void objects(const char* key, std::vector<T>&, size_t, bool required, Write = Write::kAlways) {
    add(key, "objects", required);
  }

 private:
  void add(const char* key, const char* kind, bool required,
           std::optional<double> lo = std::nullopt, std::optional<double> hi = std::nullopt) {
    rules.push_back({key, kind, required, lo, hi, {}});
  }
};

// ---- the field tables ---------------------------------------------------------------------------

constexpr std::pair<EventKind, const char*> kEventNames[] = {
    {EventKind::kWorkerStarted, "worker_started"},
    {EventKind::kWorkerExited, "worker_exited"},
    {EventKind::kWorkerDied, "worker_died"},
    {EventKind::kCheckpointSaved, "checkpoint_saved"},
    {EventKind::kCheckpointFailed, "checkpoint_failed"},
    {EventKind::kJobCompleted, "job_completed"},
    {EventKind::kJobStopped, "job_stopped"},
    {EventKind::kStraggler, "straggler"},
    {EventKind::kStragglerCleared, "straggler_cleared"},
    {EventKind::kHang, "hang"},
    {EventKind::kJobFailed, "job_failed"},
};
constexpr std::pair<CommandKind, const char*> kCommandNames[] = {
    {CommandKind::kStop, "stop"},
    {CommandKind::kRollBack, "roll_back"},
    {CommandKind::kCheckpointNow, "checkpoint_now"},
};

// Pieces.

// The numbers of one step report (StepReport from ringd, StepRecord as recorded).
template <class IO, class M>
void step_numbers(IO& io, M& m) {
  io.num("loss", m.loss, -1e30, 1e30);
  io.num("tokens_per_s", m.tokens_per_s, 0, 1e15);
  io.num("step_time_s", m.step_time_s, 0, 1e7);
  io.num("comm_time_s", m.comm_time_s, 0, 1e7);
}

template <class IO>
void fields(IO& io, GpuInfo& m) {
  io.i64("index", m.index, 0, 1023);
  io.opt_str("model", m.model, 256, Write::kAlways);
  io.i64("memory_mib", m.memory_mib, 0, int64_t{1} << 30);
}
template <class IO>
void fields(IO& io, Topology& m) {
  io.i64("numa_nodes", m.numa_nodes, 1, 1024);
  io.i64("cpus", m.cpus, 1, 1 << 20);
  io.i64("host_memory_mib", m.host_memory_mib, 0, int64_t{1} << 40);
  io.opt_str("leaf_switch", m.leaf_switch, kMaxName, Write::kAlways);
  io.opt_str("summary", m.summary, 1024, Write::kAlways);
}
template <class IO>
void fields(IO& io, JobProgress& m) {
  io.i64("job", m.job, 1, kMaxId);
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.i64("step", m.step, 0, kMaxId);
}
template <class IO>
void fields(IO& io, Assignment& m) {
  io.i64("job", m.job, 1, kMaxId);
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.i64("resume_step", m.resume_step, 0, kMaxId);
  io.str("state", m.state, 1, 32);
}
template <class IO>
void fields(IO& io, JobInfo& m) {
  io.i64("job", m.job, 1, kMaxId);
  io.str("name", m.name, 1, kMaxName);
  io.i64("owner_uid", m.owner_uid, 0, std::numeric_limits<uint32_t>::max());
  io.opt_str("owner", m.owner, kMaxName, Write::kAlways);
  io.str("state", m.state, 1, 32);
  io.opt_str("state_reason", m.state_reason, kMaxText, Write::kAlways);
  io.str("spec_hash", m.spec_hash, 1, 128);
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.i64("restarts", m.restarts, 0, kMaxId);
  io.i64("max_restarts", m.max_restarts, 0, kMaxId);
  io.i64("step", m.step, 0, kMaxId);
  io.i64("total_steps", m.total_steps, 0, kMaxId);
  io.opt_num("loss", m.loss, -1e300, 1e300);
  io.opt_num("tokens_per_s", m.tokens_per_s, 0, 1e300);
  io.opt_i64("last_checkpoint_step", m.last_checkpoint_step, 0, kMaxId);
  io.opt_str("slurm_job_id", m.slurm_job_id, 64, Write::kAlways);
  io.strings("nodes", m.nodes, kMaxList, kMaxName, Write::kAlways);
  io.strings("ring_order", m.ring_order, kMaxList, kMaxName, Write::kAlways);
  io.strings("excluded_nodes", m.excluded_nodes, kMaxList, kMaxName);
  io.opt_str("job_dir", m.job_dir, kMaxPath, Write::kAlways);
  io.opt_str("checkpoint_dir", m.checkpoint_dir, kMaxPath, Write::kAlways);
  io.num("created_at", m.created_at, 0, 1e12);
  io.num("updated_at", m.updated_at, 0, 1e12);
}
template <class IO>
void fields(IO& io, EventRecord& m) {
  io.i64("id", m.id, 1, std::numeric_limits<int64_t>::max());
  io.num("time", m.time, 0, 1e12);
  io.opt_i64("job", m.job, 1, kMaxId);
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.opt_str("node", m.node, kMaxName, Write::kAlways);
  io.str("kind", m.kind, 1, 64);
  io.object("data", m.data);
}
template <class IO>
void fields(IO& io, NodeInfo& m) {
  io.node("name", m.name);
  io.str("state", m.state, 1, 16);
  io.i64("uid", m.uid, 0, std::numeric_limits<uint32_t>::max());
  io.num("last_heartbeat", m.last_heartbeat, 0, 1e12);
  io.i64("gpus", m.gpus, 0, 1024);
  io.opt_str("ringd_version", m.ringd_version, 64, Write::kAlways);
  io.integers("jobs", m.jobs, kMaxList);
}
template <class IO>
void fields(IO& io, StepRecord& m) {
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.i64("step", m.step, 0, kMaxId);
  io.node("node", m.node);
  step_numbers(io, m);
  io.num("time", m.time, 0, 1e12);
}

// daemon -> coordinator.

template <class IO>
void fields(IO& io, Register& m) {
  io.node("node", m.node);
  io.objects("gpus", m.gpus, 1024, true);
  io.sub("topology", m.topology);
  io.str("ringd_version", m.ringd_version, 1, 64);
  io.objects("jobs", m.jobs, kMaxList, false);
}
template <class IO>
void fields(IO& io, Heartbeat& m) {
  io.node("node", m.node);
  io.i64("seq", m.seq, 0, std::numeric_limits<int64_t>::max());
  io.objects("jobs", m.jobs, kMaxList, false);
}
template <class IO>
void fields(IO& io, RankStep& m) {
  io.i64("rank", m.rank, 0, 1 << 24);
  io.num("step_time_s", m.step_time_s, 0, 1e7);
  io.num("data_s", m.data_s, 0, 1e7);
  io.num("compute_s", m.compute_s, 0, 1e7);
  io.num("wait_s", m.wait_s, 0, 1e7);
  io.num("comm_s", m.comm_s, 0, 1e7);
  io.i64("hop_bytes", m.hop_bytes, 0, int64_t{1} << 50);
  io.opt_i64("prev", m.prev, 0, 1 << 24);
}
// A recorded rank row: the RankStep's fields flattened beside attempt, step, node and time.
template <class IO>
void fields(IO& io, RankStepRecord& m) {
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.i64("step", m.step, 0, kMaxId);
  io.node("node", m.node);
  fields(io, m.rank);
  io.num("time", m.time, 0, 1e12);
}
template <class IO>
void fields(IO& io, StepReport& m) {
  io.node("node", m.node);
  io.i64("job", m.job, 1, kMaxId);
  io.i64("attempt", m.attempt, 1, kMaxId);
  io.i64("step", m.step, 0, kMaxId);
  step_numbers(io, m);
  io.objects("ranks", m.ranks, 512, false, Write::kIfSet);
}
template <class IO>
void fields(IO& io, WaitingRank& m) {
  io.i64("rank", m.rank, 0, 1 << 24);
  io.str("where", m.where, 1, 512);
}
template <class IO>
void fields(IO& io, Event& m) {
  io.node("node", m.node);
  io.enumeration("kind", m.kind, kEventNames);
  io.i64("job", m.job, 1, kMaxId);
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.opt_i64("rank", m.rank, 0, 1 << 24);
  io.opt_i64("pid", m.pid, 1, std::numeric_limits<int32_t>::max());
  io.opt_i64("exit_code", m.exit_code, 0, 255);
  io.opt_i64("signal", m.signal, 1, 64);
  io.opt_i64("step", m.step, 0, kMaxId);
  io.opt_i64("bytes", m.bytes, 0, std::numeric_limits<int64_t>::max());
  io.opt_str("path", m.path, kMaxText);
  io.opt_bool("complete", m.complete);
  io.strings("last_log", m.last_log, kMaxLogLines, kMaxLogLineBytes);
  io.opt_str("message", m.message, kMaxText);
  io.opt_num("seconds", m.seconds, 0, 1e7);
  io.opt_i64("steps", m.steps, 0, 1 << 20);
  io.opt_num("behind_s", m.behind_s, 0, 1e7);
  io.opt_num("deadline_s", m.deadline_s, 0, 1e7);
  io.integers("missing", m.missing, 512, Write::kIfSet);
  io.objects("waiting", m.waiting, 512, false, Write::kIfSet);
  io.integers("deleted", m.deleted, 4096, Write::kIfSet);
  io.opt_bool("resumable", m.resumable);
  if constexpr (IO::kReading) {
    // Per-kind required fields.
    auto require = [&](bool ok, const char* key, const char* why) {
      if (!ok) Reader::fail(io.field(key), why);
    };
    switch (m.kind) {
      case EventKind::kWorkerStarted:
        require(m.rank.has_value(), "rank", "required for worker_started");
        break;
      case EventKind::kWorkerExited:
        require(m.rank.has_value(), "rank", "required for worker_exited");
        require(m.exit_code.has_value(), "exit_code", "required for worker_exited");
        break;
      case EventKind::kWorkerDied:
        require(m.rank.has_value(), "rank", "required for worker_died");
        require(m.signal.has_value() != m.exit_code.has_value(), "signal",
                "worker_died needs exactly one of signal and exit_code");
        break;
      case EventKind::kCheckpointSaved:
        require(m.step.has_value(), "step", "required for checkpoint_saved");
        require(!m.path.empty(), "path", "required for checkpoint_saved");
        require(m.bytes.has_value(), "bytes", "required for checkpoint_saved");
        require(m.complete.has_value(), "complete", "required for checkpoint_saved");
        break;
      case EventKind::kCheckpointFailed:
        require(m.step.has_value(), "step", "required for checkpoint_failed");
        break;
      case EventKind::kJobCompleted:
        require(m.step.has_value(), "step", "required for job_completed");
        break;
      case EventKind::kJobStopped:
        break;
      case EventKind::kStraggler:
        require(m.rank.has_value(), "rank", "required for straggler");
        require(m.step.has_value(), "step", "required for straggler");
        require(m.steps.has_value(), "steps", "required for straggler");
        require(m.behind_s.has_value(), "behind_s", "required for straggler");
        break;
      case EventKind::kStragglerCleared:
        require(m.rank.has_value(), "rank", "required for straggler_cleared");
        break;
      case EventKind::kHang:
        require(m.step.has_value(), "step", "required for hang");
        require(m.deadline_s.has_value(), "deadline_s", "required for hang");
        break;
      case EventKind::kJobFailed:
        require(!m.message.empty(), "message", "required for job_failed");
        break;
    }
    for (int64_t r : m.missing)
      if (r < 0 || r > (1 << 24))
        Reader::fail(io.field("missing"), "a rank is out of range [0, 16777216]");
    for (int64_t st : m.deleted)
      if (st < 0 || st > kMaxId) Reader::fail(io.field("deleted"), "a step is out of range");
  }
}
template <class IO>
void fields(IO& io, CommandAck& m) {
  io.node("node", m.node);
  io.i64("cmd", m.id, 1, kMaxId);
  io.boolean("ok", m.ok);
  io.opt_str("error", m.error, kMaxText);
}

// coordinator -> daemon.

template <class IO>
void fields(IO& io, Registered& m) {
  io.node("node", m.node);
  io.num("heartbeat_interval_s", m.heartbeat_interval_s, 0.001, 3600);
  io.num("heartbeat_timeout_s", m.heartbeat_timeout_s, 0.001, 86400);
  io.objects("jobs", m.jobs, kMaxList, false);
}
template <class IO>
void fields(IO& io, Command& m) {
  io.i64("cmd", m.id, 1, kMaxId);
  io.enumeration("command", m.command, kCommandNames);
  io.i64("job", m.job, 1, kMaxId);
  io.i64("attempt", m.attempt, 0, kMaxId);
  io.i64("step", m.step, 0, kMaxId);
  io.opt_str("reason", m.reason, kMaxText, Write::kAlways);
}

// ringctl -> coordinator. Requests and replies carry the client's id, checked first.

template <class IO>
void request_id(IO& io, int64_t& id) {
  io.i64("id", id, 0, kMaxId);
}

bool slurm_job_id_ok(const std::string& v) {
  auto digits = [](const std::string& d) {
    return !d.empty() && std::all_of(d.begin(), d.end(), ::isdigit);
  };
  auto us = v.find('_');
  return us == std::string::npos ? digits(v) : digits(v.substr(0, us)) && digits(v.substr(us + 1));
}

template <class IO>
void fields(IO& io, SubmitRequest& m) {
  request_id(io, m.id);
  io.str("spec", m.spec, 1, kMaxSpecBytes);
  io.opt_str("name", m.name, kMaxName);
  io.opt_str("job_dir", m.job_dir, kMaxPath);
  if constexpr (IO::kReading)
    if (!m.job_dir.empty() && m.job_dir[0] != '/')
      Reader::fail(io.field("job_dir"), "must be an absolute path, got '" + m.job_dir + "'");
  io.opt_i64("steps", m.steps, 1, kMaxId);
}
template <class IO>
void fields(IO& io, StatusRequest& m) {
  request_id(io, m.id);
  io.opt_i64("job", m.job, 1, kMaxId);
}
template <class IO>
void fields(IO& io, EventsRequest& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
  io.i64_or("after", m.after, 0, kMaxId, 0);
  io.i64_or("limit", m.limit, 1, 1000, 100);
}
template <class IO>
void fields(IO& io, StepsRequest& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
  io.i64_or("after", m.after, 0, kMaxId, 0);
  io.i64_or("limit", m.limit, 1, 10000, 1000);
  io.opt_bool("ranks", m.ranks);
}
template <class IO>
void fields(IO& io, CancelRequest& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
}
template <class IO>
void fields(IO& io, RestartRequest& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
  io.opt_i64("from_step", m.from_step, 0, kMaxId);
  io.opt_bool("requeue", m.requeue);
}
template <class IO>
void fields(IO& io, CheckpointRequest& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
}
template <class IO>
void fields(IO& io, NodesRequest& m) {
  request_id(io, m.id);
}
template <class IO>
void fields(IO& io, SlurmJobRequest& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
  io.str("event", m.event, 1, 32);
  if constexpr (IO::kReading)
    if (m.event != "submitted" && m.event != "submit_failed" && m.event != "started")
      Reader::fail(io.field("event"),
                   "'" + m.event + "' is not one of submitted, submit_failed, started");
  io.opt_str("slurm_job_id", m.slurm_job_id, 64);
  if constexpr (IO::kReading)
    if (!slurm_job_id_ok(m.slurm_job_id) && !(m.slurm_job_id.empty() && m.event == "submit_failed"))
      Reader::fail(io.field("slurm_job_id"),
                   "'" + m.slurm_job_id + "' is not a Slurm job id (digits, optionally _N)");
  io.i64_or("restarts", m.restarts, 0, 1000000, 0);
  io.opt_str("nodes", m.nodes, kMaxText);
  io.opt_str("message", m.message, kMaxText);
  io.strings("unhealthy_nodes", m.unhealthy_nodes, kMaxList, kMaxName);
}

// coordinator -> ringctl.

template <class IO>
void fields(IO& io, SubmitReply& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
  io.str("name", m.name, 1, kMaxName);
  io.str("spec_hash", m.spec_hash, 1, 128);
  io.str("state", m.state, 1, 32);
}
template <class IO>
void fields(IO& io, StatusReply& m) {
  request_id(io, m.id);
  io.objects("jobs", m.jobs, 100000, true);
}
template <class IO>
void fields(IO& io, EventsReply& m) {
  request_id(io, m.id);
  io.objects("events", m.events, 1000, true);
}
template <class IO>
void fields(IO& io, StepsReply& m) {
  request_id(io, m.id);
  io.i64("job", m.job, 1, kMaxId);
  io.objects("steps", m.steps, 10000, true);
  io.objects("ranks", m.ranks, 10000, false, Write::kIfSet);
}
template <class IO>
void fields(IO& io, NodesReply& m) {
  request_id(io, m.id);
  io.objects("nodes", m.nodes, 100000, true);
}
template <class IO>
void fields(IO& io, OkReply& m) {
  request_id(io, m.id);
  io.i64_or("job", m.job, 0, kMaxId, 0);
  io.opt_str("state", m.state, 32, Write::kAlways);
  io.opt_str("message", m.message, kMaxText, Write::kAlways);
  io.strings("requeue_without", m.requeue_without, kMaxList, kMaxName);
}
template <class IO>
void fields(IO& io, ErrorReply& m) {
  request_id(io, m.id);
  io.str("code", m.code, 1, 64);
  io.str("message", m.message, 1, 16 * 1024);
  io.opt_str("field", m.field, kMaxName);
}

// The `type` of each alternative of Message, in its order.
constexpr const char* kTypeNames[] = {
    "register",   "heartbeat", "step",         "event",        "command_ack",  "registered",
    "command",    "submit",    "status",       "events",       "cancel",       "restart",
    "checkpoint", "nodes",     "submit_reply", "status_reply", "events_reply", "nodes_reply",
    "ok",         "error",     "slurm_job",    "steps",        "steps_reply"};
static_assert(std::size(kTypeNames) == std::variant_size_v<Message>,
              "every message type needs its name");

// The index of a type name in Message; -1 when unknown.
int type_index(std::string_view type) {
  for (size_t i = 0; i < std::size(kTypeNames); ++i)
    if (type == kTypeNames[i]) return static_cast<int>(i);
  return -1;
}

// Runs f(T{}) for the alternative T of Message at `index`.
template <typename F, size_t... I>
Message with_alternative(size_t index, F&& f, std::index_sequence<I...>) {
  Message out;
  ((index == I ? (out = f(std::variant_alternative_t<I, Message>{}), 0) : 0), ...);
  return out;
}

// Maximum nesting of objects/arrays, outside strings; stops counting past the limit.
int nesting_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"')
      in_str = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth) max_depth = depth;
      if (max_depth > kMaxDepth) return max_depth;
    } else if (c == '}' || c == ']')
      --depth;
  }
  return max_depth;
}

}  // namespace

const char* to_string(EventKind k) {
  for (const auto& [e, n] : kEventNames)
    if (e == k) return n;
  return "?";
}
const char* to_string(CommandKind k) {
  for (const auto& [e, n] : kCommandNames)
    if (e == k) return n;
  return "?";
}

bool valid_node_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxName) return false;
  if (!std::isalnum(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return false;
  return true;
}

const char* type_name(const Message& m) {
  return kTypeNames[m.index()];
}

json to_json(const Message& msg) {
  Writer w;
  // The descriptions take the message by reference to fill it; the Writer only reads it.
  std::visit([&](const auto& m) { fields(w, const_cast<std::decay_t<decltype(m)>&>(m)); }, msg);
  w.j["v"] = kVersion;
  w.j["type"] = type_name(msg);
  return std::move(w.j);
}

json step_record_json(const StepRecord& r) {
  return to_json(StepsReply{0, 1, {r}, {}})["steps"][0];
}

// Invalid UTF-8 (e.g. a spec diagnostic cut mid-character) is replaced, never thrown.
std::string encode(const Message& m) {
  return to_json(m).dump(-1, ' ', false, json::error_handler_t::replace);
}

Message from_json(const json& j) {
  if (!j.is_object())
    throw ProtocolError(code::kBadJson, "",
                        std::string("message must be a JSON object, got ") + json_kind(j));
  auto vit = j.find("v");
  if (vit == j.end())
    throw ProtocolError(code::kBadField, "v", "field 'v': required field is missing");
  if (!vit->is_number_integer())
    throw ProtocolError(code::kBadField, "v",
                        std::string("field 'v': expected an integer, got ") + json_kind(*vit));
  if (vit->get<int64_t>() != kVersion)
    throw ProtocolError(code::kUnsupportedVersion, "v",
                        "field 'v': protocol version " + vit->dump() +
                            " is not supported (this build speaks " + std::to_string(kVersion) +
                            ")");
  auto tit = j.find("type");
  if (tit == j.end())
    throw ProtocolError(code::kBadField, "type", "field 'type': required field is missing");
  if (!tit->is_string())
    throw ProtocolError(code::kBadField, "type",
                        std::string("field 'type': expected a string, got ") + json_kind(*tit));
  const std::string type = tit->get<std::string>();
  int index = type_index(type);
  if (index < 0)
    throw ProtocolError(code::kUnknownType, "type",
                        "field 'type': unknown message type '" + type + "'");
  Reader r(j, type);
  r.find("v");
  r.find("type");
  Message m = with_alternative(
      static_cast<size_t>(index),
      [&](auto t) -> Message {
        fields(r, t);
        return t;
      },
      std::make_index_sequence<std::variant_size_v<Message>>{});
  r.finish();
  return m;
}

std::vector<std::string> message_types() {
  return {std::begin(kTypeNames), std::end(kTypeNames)};
}

std::vector<FieldRule> field_rules(std::string_view type) {
  int index = type_index(type);
  if (index < 0) return {};
  Describer d;
  with_alternative(
      static_cast<size_t>(index),
      [&](auto t) -> Message {
        fields(d, t);
        return t;
      },
      std::make_index_sequence<std::variant_size_v<Message>>{});
  return d.rules;
}

Message parse(std::string_view bytes) {
  if (bytes.size() > kMaxMessageBytes)
    throw ProtocolError(code::kTooLarge, "",
                        "message of " + std::to_string(bytes.size()) + " bytes exceeds the " +
                            std::to_string(kMaxMessageBytes) + "-byte limit");
  if (nesting_depth(bytes) > kMaxDepth)
    throw ProtocolError(code::kBadJson, "",
                        "message nests deeper than " + std::to_string(kMaxDepth) + " levels");
  json j;
  try {
    // allow_exceptions=false still throws for some inputs (number overflow: out_of_range.406).
    j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  } catch (const json::exception& e) {
    throw ProtocolError(code::kBadJson, "", e.what());
  }
  if (j.is_discarded()) {
    // Parse again with exceptions for the position of the error.
    std::string why = "not valid JSON";
    try {
      json unused = json::parse(bytes.begin(), bytes.end());
      (void)unused;
    } catch (const json::exception& e) {
      why = e.what();
    }
    throw ProtocolError(code::kBadJson, "", why);
  }
  return from_json(j);
}

int64_t peek_request_id(std::string_view bytes) {
  if (bytes.size() > kMaxMessageBytes || nesting_depth(bytes) > kMaxDepth) return 0;
  json j;
  try {
    j = json::parse(bytes.begin(), bytes.end(), nullptr, false);
  } catch (const json::exception&) {
    return 0;
  }
  if (!j.is_object()) return 0;
  auto it = j.find("id");
  if (it == j.end() || !it->is_number_integer()) return 0;
  int64_t id = it->get<int64_t>();
  return id >= 0 && id <= kMaxId ? id : 0;
}

}  // namespace ring::protocol
