#include "common/protocol/protocol.h"

#include <algorithm>

#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

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

// Reads the fields of one JSON object, with the dotted path used in errors. finish() refuses
// fields that were not read.
class Reader {
 public:
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

  int64_t i64(const char* key, int64_t lo, int64_t hi) { return as_i64(need(key), key, lo, hi); }
  std::optional<int64_t> opt_i64(const char* key, int64_t lo, int64_t hi) {
    const json* v = find(key);
    if (!v || v->is_null()) return std::nullopt;
    return as_i64(*v, key, lo, hi);
  }
  int64_t i64_or(const char* key, int64_t lo, int64_t hi, int64_t dflt) {
    return opt_i64(key, lo, hi).value_or(dflt);
  }

  double num(const char* key, double lo, double hi) { return as_num(need(key), key, lo, hi); }
  std::optional<double> opt_num(const char* key, double lo, double hi) {
    const json* v = find(key);
    if (!v || v->is_null()) return std::nullopt;
    return as_num(*v, key, lo, hi);
  }

  bool boolean(const char* key) {
    const json& v = need(key);
    if (!v.is_boolean()) fail(field(key), std::string("expected a boolean, got ") + json_kind(v));
    return v.get<bool>();
  }
  std::optional<bool> opt_bool(const char* key) {
    const json* v = find(key);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_boolean()) fail(field(key), std::string("expected a boolean, got ") + json_kind(*v));
    return v->get<bool>();
  }

  std::string str(const char* key, size_t min_len, size_t max_len) {
    return as_str(need(key), field(key), min_len, max_len);
  }
  std::string opt_str(const char* key, size_t max_len) {
    const json* v = find(key);
    if (!v || v->is_null()) return {};
    return as_str(*v, field(key), 0, max_len);
  }
  std::string node(const char* key) {
    std::string s = str(key, 1, kMaxName);
    if (!valid_node_name(s))
      fail(field(key), "'" + s + "' is not a node name (letters, digits, '.', '_', '-')");
    return s;
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

  void finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!seen_.count(it.key())) fail(field(it.key().c_str()), "unknown field");
  }

 private:
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

std::string item(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

std::vector<JobProgress> read_progress(Reader& r, const char* key, const std::string& type) {
  std::vector<JobProgress> out;
  const json* a = r.array(key, kMaxList, false);
  if (!a) return out;
  for (size_t i = 0; i < a->size(); ++i) {
    Reader e((*a)[i], item(r.field(key), i));
    JobProgress p;
    p.job = e.i64("job", 1, kMaxId);
    p.attempt = e.i64("attempt", 0, kMaxId);
    p.step = e.i64("step", 0, kMaxId);
    e.finish();
    out.push_back(p);
  }
  return out;
}

json write_progress(const std::vector<JobProgress>& v) {
  json a = json::array();
  for (const auto& p : v) a.push_back({{"job", p.job}, {"attempt", p.attempt}, {"step", p.step}});
  return a;
}

std::vector<std::string> read_strings(Reader& r, const char* key, size_t max_items,
                                      size_t max_len) {
  std::vector<std::string> out;
  const json* a = r.array(key, max_items, false);
  if (!a) return out;
  for (size_t i = 0; i < a->size(); ++i)
    out.push_back(Reader::as_str((*a)[i], item(r.field(key), i), 0, max_len));
  return out;
}

// ---- per type ---------------------------------------------------------------------------------

constexpr std::pair<EventKind, const char*> kEventNames[] = {
    {EventKind::kWorkerStarted, "worker_started"},
    {EventKind::kWorkerExited, "worker_exited"},
    {EventKind::kWorkerDied, "worker_died"},
    {EventKind::kCheckpointSaved, "checkpoint_saved"},
    {EventKind::kCheckpointFailed, "checkpoint_failed"},
    {EventKind::kJobCompleted, "job_completed"},
    {EventKind::kJobStopped, "job_stopped"},
};
constexpr std::pair<CommandKind, const char*> kCommandNames[] = {
    {CommandKind::kStop, "stop"},
    {CommandKind::kRollBack, "roll_back"},
    {CommandKind::kCheckpointNow, "checkpoint_now"},
};

template <typename E, size_t N>
E read_enum(Reader& r, const char* key, const std::pair<E, const char*> (&names)[N]) {
  std::string s = r.str(key, 1, 64);
  std::string allowed;
  for (const auto& [e, n] : names) {
    if (s == n) return e;
    allowed += (allowed.empty() ? "" : ", ") + std::string(n);
  }
  Reader::fail(r.field(key), "'" + s + "' is not one of: " + allowed);
}

Register read_register(Reader& r) {
  Register m;
  m.node = r.node("node");
  if (const json* a = r.array("gpus", 1024, true)) {
    for (size_t i = 0; i < a->size(); ++i) {
      Reader g((*a)[i], item(r.field("gpus"), i));
      GpuInfo gi;
      gi.index = g.i64("index", 0, 1023);
      gi.model = g.opt_str("model", 256);
      gi.memory_mib = g.i64("memory_mib", 0, int64_t{1} << 30);
      g.finish();
      m.gpus.push_back(gi);
    }
  }
  {
    Reader t(r.need("topology"), r.field("topology"));
    m.topology.numa_nodes = t.i64("numa_nodes", 1, 1024);
    m.topology.cpus = t.i64("cpus", 1, 1 << 20);
    m.topology.host_memory_mib = t.i64("host_memory_mib", 0, int64_t{1} << 40);
    m.topology.leaf_switch = t.opt_str("leaf_switch", kMaxName);
    m.topology.summary = t.opt_str("summary", 1024);
    t.finish();
  }
  m.ringd_version = r.str("ringd_version", 1, 64);
  m.jobs = read_progress(r, "jobs", "register");
  return m;
}

Event read_event(Reader& r) {
  Event m;
  m.node = r.node("node");
  m.kind = read_enum(r, "kind", kEventNames);
  m.job = r.i64("job", 1, kMaxId);
  m.attempt = r.i64("attempt", 0, kMaxId);
  m.rank = r.opt_i64("rank", 0, 1 << 24);
  m.pid = r.opt_i64("pid", 1, std::numeric_limits<int32_t>::max());
  m.exit_code = r.opt_i64("exit_code", 0, 255);
  m.signal = r.opt_i64("signal", 1, 64);
  m.step = r.opt_i64("step", 0, kMaxId);
  m.bytes = r.opt_i64("bytes", 0, std::numeric_limits<int64_t>::max());
  m.path = r.opt_str("path", kMaxText);
  m.complete = r.opt_bool("complete");
  m.last_log = read_strings(r, "last_log", kMaxLogLines, kMaxLogLineBytes);
  m.message = r.opt_str("message", kMaxText);
  // Per-kind required fields.
  auto require = [&](bool ok, const char* key, const char* why) {
    if (!ok) Reader::fail(r.field(key), why);
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
  }
  return m;
}

JobInfo read_job_info(const json& j, const std::string& path) {
  Reader r(j, path);
  JobInfo m;
  m.job = r.i64("job", 1, kMaxId);
  m.name = r.str("name", 1, kMaxName);
  m.owner_uid = r.i64("owner_uid", 0, std::numeric_limits<uint32_t>::max());
  m.owner = r.opt_str("owner", kMaxName);
  m.state = r.str("state", 1, 32);
  m.state_reason = r.opt_str("state_reason", kMaxText);
  m.spec_hash = r.str("spec_hash", 1, 128);
  m.attempt = r.i64("attempt", 0, kMaxId);
  m.restarts = r.i64("restarts", 0, kMaxId);
  m.max_restarts = r.i64("max_restarts", 0, kMaxId);
  m.step = r.i64("step", 0, kMaxId);
  m.total_steps = r.i64("total_steps", 0, kMaxId);
  m.loss = r.opt_num("loss", -1e300, 1e300);
  m.tokens_per_s = r.opt_num("tokens_per_s", 0, 1e300);
  m.last_checkpoint_step = r.opt_i64("last_checkpoint_step", 0, kMaxId);
  m.slurm_job_id = r.opt_str("slurm_job_id", 64);
  m.nodes = read_strings(r, "nodes", kMaxList, kMaxName);
  m.ring_order = read_strings(r, "ring_order", kMaxList, kMaxName);
  m.job_dir = r.opt_str("job_dir", kMaxPath);
  m.checkpoint_dir = r.opt_str("checkpoint_dir", kMaxPath);
  m.created_at = r.num("created_at", 0, 1e12);
  m.updated_at = r.num("updated_at", 0, 1e12);
  r.finish();
  return m;
}

json write_job_info(const JobInfo& m) {
  json j = {{"job", m.job},
            {"name", m.name},
            {"owner_uid", m.owner_uid},
            {"owner", m.owner},
            {"state", m.state},
            {"state_reason", m.state_reason},
            {"spec_hash", m.spec_hash},
            {"attempt", m.attempt},
            {"restarts", m.restarts},
            {"max_restarts", m.max_restarts},
            {"step", m.step},
            {"total_steps", m.total_steps},
            {"slurm_job_id", m.slurm_job_id},
            {"nodes", m.nodes},
            {"ring_order", m.ring_order},
            {"job_dir", m.job_dir},
            {"checkpoint_dir", m.checkpoint_dir},
            {"created_at", m.created_at},
            {"updated_at", m.updated_at}};
  if (m.loss) j["loss"] = *m.loss;
  if (m.tokens_per_s) j["tokens_per_s"] = *m.tokens_per_s;
  if (m.last_checkpoint_step) j["last_checkpoint_step"] = *m.last_checkpoint_step;
  return j;
}

Message read_body(const std::string& type, Reader& r) {
  if (type == "register") return read_register(r);
  if (type == "heartbeat") {
    Heartbeat m;
    m.node = r.node("node");
    m.seq = r.i64("seq", 0, std::numeric_limits<int64_t>::max());
    m.jobs = read_progress(r, "jobs", type);
    return m;
  }
  if (type == "step") {
    StepReport m;
    m.node = r.node("node");
    m.job = r.i64("job", 1, kMaxId);
    m.attempt = r.i64("attempt", 1, kMaxId);
    m.step = r.i64("step", 0, kMaxId);
    m.loss = r.num("loss", -1e30, 1e30);
    m.tokens_per_s = r.num("tokens_per_s", 0, 1e15);
    m.step_time_s = r.num("step_time_s", 0, 1e7);
    m.comm_time_s = r.num("comm_time_s", 0, 1e7);
    return m;
  }
  if (type == "event") return read_event(r);
  if (type == "command_ack") {
    CommandAck m;
    m.node = r.node("node");
    m.id = r.i64("cmd", 1, kMaxId);
    m.ok = r.boolean("ok");
    m.error = r.opt_str("error", kMaxText);
    return m;
  }
  if (type == "registered") {
    Registered m;
    m.node = r.node("node");
    m.heartbeat_interval_s = r.num("heartbeat_interval_s", 0.001, 3600);
    m.heartbeat_timeout_s = r.num("heartbeat_timeout_s", 0.001, 86400);
    if (const json* a = r.array("jobs", kMaxList, false)) {
      for (size_t i = 0; i < a->size(); ++i) {
        Reader e((*a)[i], item(r.field("jobs"), i));
        Assignment as;
        as.job = e.i64("job", 1, kMaxId);
        as.attempt = e.i64("attempt", 0, kMaxId);
        as.resume_step = e.i64("resume_step", 0, kMaxId);
        as.state = e.str("state", 1, 32);
        e.finish();
        m.jobs.push_back(as);
      }
    }
    return m;
  }
  if (type == "command") {
    Command m;
    m.id = r.i64("cmd", 1, kMaxId);
    m.command = read_enum(r, "command", kCommandNames);
    m.job = r.i64("job", 1, kMaxId);
    m.attempt = r.i64("attempt", 0, kMaxId);
    m.step = r.i64("step", 0, kMaxId);
    m.reason = r.opt_str("reason", kMaxText);
    return m;
  }
  // Requests and replies carry the client's id.
  int64_t id = r.i64("id", 0, kMaxId);
  if (type == "submit") {
    SubmitRequest m;
    m.id = id;
    m.spec = r.str("spec", 1, kMaxSpecBytes);
    m.name = r.opt_str("name", kMaxName);
    m.job_dir = r.opt_str("job_dir", kMaxPath);
    if (!m.job_dir.empty() && m.job_dir[0] != '/')
      Reader::fail(r.field("job_dir"), "must be an absolute path, got '" + m.job_dir + "'");
    m.steps = r.opt_i64("steps", 1, kMaxId);
    return m;
  }
  if (type == "status") return StatusRequest{id, r.opt_i64("job", 1, kMaxId)};
  if (type == "events") {
    EventsRequest m;
    m.id = id;
    m.job = r.i64("job", 1, kMaxId);
    m.after = r.i64_or("after", 0, kMaxId, 0);
    m.limit = r.i64_or("limit", 1, 1000, 100);
    return m;
  }
  if (type == "cancel") return CancelRequest{id, r.i64("job", 1, kMaxId)};
  if (type == "steps") {
    StepsRequest m;
    m.id = id;
    m.job = r.i64("job", 1, kMaxId);
    m.after = r.i64_or("after", 0, kMaxId, 0);
    m.limit = r.i64_or("limit", 1, 10000, 1000);
    return m;
  }
  if (type == "steps_reply") {
    StepsReply m;
    m.id = id;
    m.job = r.i64("job", 1, kMaxId);
    if (const json* a = r.array("steps", 10000, true)) {
      for (size_t i = 0; i < a->size(); ++i) {
        Reader e((*a)[i], item(r.field("steps"), i));
        StepRecord s;
        s.attempt = e.i64("attempt", 0, kMaxId);
        s.step = e.i64("step", 0, kMaxId);
        s.node = e.node("node");
        s.loss = e.num("loss", -1e30, 1e30);
        s.tokens_per_s = e.num("tokens_per_s", 0, 1e15);
        s.step_time_s = e.num("step_time_s", 0, 1e7);
        s.comm_time_s = e.num("comm_time_s", 0, 1e7);
        s.time = e.num("time", 0, 1e12);
        e.finish();
        m.steps.push_back(std::move(s));
      }
    }
    return m;
  }
  if (type == "restart") {
    RestartRequest m;
    m.id = id;
    m.job = r.i64("job", 1, kMaxId);
    m.from_step = r.opt_i64("from_step", 0, kMaxId);
    return m;
  }
  if (type == "checkpoint") return CheckpointRequest{id, r.i64("job", 1, kMaxId)};
  if (type == "slurm_job") {
    SlurmJobRequest m;
    m.id = id;
    m.job = r.i64("job", 1, kMaxId);
    m.event = r.str("event", 1, 32);
    if (m.event != "submitted" && m.event != "submit_failed" && m.event != "started")
      Reader::fail(r.field("event"),
                   "'" + m.event + "' is not one of submitted, submit_failed, started");
    m.slurm_job_id = r.opt_str("slurm_job_id", 64);
    {
      const auto& v = m.slurm_job_id;
      auto us = v.find('_');
      auto digits = [](const std::string& d) {
        return !d.empty() && std::all_of(d.begin(), d.end(), ::isdigit);
      };
      bool ok = us == std::string::npos ? digits(v)
                                        : digits(v.substr(0, us)) && digits(v.substr(us + 1));
      if (!ok && !(v.empty() && m.event == "submit_failed"))
        Reader::fail(r.field("slurm_job_id"),
                     "'" + v + "' is not a Slurm job id (digits, optionally _N)");
    }
    m.restarts = r.i64_or("restarts", 0, 1000000, 0);
    m.nodes = r.opt_str("nodes", kMaxText);
    m.message = r.opt_str("message", kMaxText);
    return m;
  }
  if (type == "nodes") return NodesRequest{id};
  if (type == "submit_reply") {
    SubmitReply m;
    m.id = id;
    m.job = r.i64("job", 1, kMaxId);
    m.name = r.str("name", 1, kMaxName);
    m.spec_hash = r.str("spec_hash", 1, 128);
    m.state = r.str("state", 1, 32);
    return m;
  }
  if (type == "status_reply") {
    StatusReply m;
    m.id = id;
    if (const json* a = r.array("jobs", 100000, true))
      for (size_t i = 0; i < a->size(); ++i)
        m.jobs.push_back(read_job_info((*a)[i], item(r.field("jobs"), i)));
    return m;
  }
  if (type == "events_reply") {
    EventsReply m;
    m.id = id;
    if (const json* a = r.array("events", 1000, true)) {
      for (size_t i = 0; i < a->size(); ++i) {
        Reader e((*a)[i], item(r.field("events"), i));
        EventRecord ev;
        ev.id = e.i64("id", 1, std::numeric_limits<int64_t>::max());
        ev.time = e.num("time", 0, 1e12);
        ev.job = e.opt_i64("job", 1, kMaxId);
        ev.attempt = e.i64("attempt", 0, kMaxId);
        ev.node = e.opt_str("node", kMaxName);
        ev.kind = e.str("kind", 1, 64);
        const json* d = e.find("data");
        if (d && !d->is_object())
          Reader::fail(e.field("data"), std::string("expected an object, got ") + json_kind(*d));
        if (d) ev.data = *d;
        e.finish();
        m.events.push_back(std::move(ev));
      }
    }
    return m;
  }
  if (type == "nodes_reply") {
    NodesReply m;
    m.id = id;
    if (const json* a = r.array("nodes", 100000, true)) {
      for (size_t i = 0; i < a->size(); ++i) {
        Reader e((*a)[i], item(r.field("nodes"), i));
        NodeInfo n;
        n.name = e.node("name");
        n.state = e.str("state", 1, 16);
        n.uid = e.i64("uid", 0, std::numeric_limits<uint32_t>::max());
        n.last_heartbeat = e.num("last_heartbeat", 0, 1e12);
        n.gpus = e.i64("gpus", 0, 1024);
        n.ringd_version = e.opt_str("ringd_version", 64);
        if (const json* js = e.array("jobs", kMaxList, false))
          for (size_t k = 0; k < js->size(); ++k) {
            const json& v = (*js)[k];
            if (!v.is_number_integer())
              Reader::fail(item(e.field("jobs"), k), "expected an integer");
            n.jobs.push_back(v.get<int64_t>());
          }
        e.finish();
        m.nodes.push_back(std::move(n));
      }
    }
    return m;
  }
  if (type == "ok") {
    OkReply m;
    m.id = id;
    m.job = r.i64_or("job", 0, kMaxId, 0);
    m.state = r.opt_str("state", 32);
    m.message = r.opt_str("message", kMaxText);
    return m;
  }
  if (type == "error") {
    ErrorReply m;
    m.id = id;
    m.code = r.str("code", 1, 64);
    m.message = r.str("message", 1, 16 * 1024);
    m.field = r.opt_str("field", kMaxName);
    return m;
  }
  throw ProtocolError(code::kUnknownType, "type",
                      "field 'type': unknown message type '" + type + "'");
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

template <class... Ts>
struct overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
overloaded(Ts...) -> overloaded<Ts...>;

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
  return std::visit(overloaded{
                        [](const Register&) { return "register"; },
                        [](const Heartbeat&) { return "heartbeat"; },
                        [](const StepReport&) { return "step"; },
                        [](const Event&) { return "event"; },
                        [](const CommandAck&) { return "command_ack"; },
                        [](const Registered&) { return "registered"; },
                        [](const Command&) { return "command"; },
                        [](const SubmitRequest&) { return "submit"; },
                        [](const StatusRequest&) { return "status"; },
                        [](const EventsRequest&) { return "events"; },
                        [](const CancelRequest&) { return "cancel"; },
                        [](const RestartRequest&) { return "restart"; },
                        [](const CheckpointRequest&) { return "checkpoint"; },
                        [](const NodesRequest&) { return "nodes"; },
                        [](const SubmitReply&) { return "submit_reply"; },
                        [](const StatusReply&) { return "status_reply"; },
                        [](const EventsReply&) { return "events_reply"; },
                        [](const NodesReply&) { return "nodes_reply"; },
                        [](const OkReply&) { return "ok"; },
                        [](const ErrorReply&) { return "error"; },
                        [](const SlurmJobRequest&) { return "slurm_job"; },
                        [](const StepsRequest&) { return "steps"; },
                        [](const StepsReply&) { return "steps_reply"; },
                    },
                    m);
}

json to_json(const Message& msg) {
  json j = std::visit(
      overloaded{
          [](const Register& m) {
            json gpus = json::array();
            for (const auto& g : m.gpus)
              gpus.push_back(
                  {{"index", g.index}, {"model", g.model}, {"memory_mib", g.memory_mib}});
            return json{{"node", m.node},
                        {"gpus", gpus},
                        {"topology",
                         {{"numa_nodes", m.topology.numa_nodes},
                          {"cpus", m.topology.cpus},
                          {"host_memory_mib", m.topology.host_memory_mib},
                          {"leaf_switch", m.topology.leaf_switch},
                          {"summary", m.topology.summary}}},
                        {"ringd_version", m.ringd_version},
                        {"jobs", write_progress(m.jobs)}};
          },
          [](const Heartbeat& m) {
            return json{{"node", m.node}, {"seq", m.seq}, {"jobs", write_progress(m.jobs)}};
          },
          [](const StepReport& m) {
            return json{{"node", m.node},
                        {"job", m.job},
                        {"attempt", m.attempt},
                        {"step", m.step},
                        {"loss", m.loss},
                        {"tokens_per_s", m.tokens_per_s},
                        {"step_time_s", m.step_time_s},
                        {"comm_time_s", m.comm_time_s}};
          },
          [](const Event& m) {
            json j{{"node", m.node},
                   {"kind", to_string(m.kind)},
                   {"job", m.job},
                   {"attempt", m.attempt}};
            if (m.rank) j["rank"] = *m.rank;
            if (m.pid) j["pid"] = *m.pid;
            if (m.exit_code) j["exit_code"] = *m.exit_code;
            if (m.signal) j["signal"] = *m.signal;
            if (m.step) j["step"] = *m.step;
            if (m.bytes) j["bytes"] = *m.bytes;
            if (!m.path.empty()) j["path"] = m.path;
            if (m.complete) j["complete"] = *m.complete;
            if (!m.last_log.empty()) j["last_log"] = m.last_log;
            if (!m.message.empty()) j["message"] = m.message;
            return j;
          },
          [](const CommandAck& m) {
            json j{{"node", m.node}, {"cmd", m.id}, {"ok", m.ok}};
            if (!m.error.empty()) j["error"] = m.error;
            return j;
          },
          [](const Registered& m) {
            json a = json::array();
            for (const auto& s : m.jobs)
              a.push_back({{"job", s.job},
                           {"attempt", s.attempt},
                           {"resume_step", s.resume_step},
                           {"state", s.state}});
            return json{{"node", m.node},
                        {"heartbeat_interval_s", m.heartbeat_interval_s},
                        {"heartbeat_timeout_s", m.heartbeat_timeout_s},
                        {"jobs", a}};
          },
          [](const Command& m) {
            return json{{"cmd", m.id},    {"command", to_string(m.command)},
                        {"job", m.job},   {"attempt", m.attempt},
                        {"step", m.step}, {"reason", m.reason}};
          },
          [](const SubmitRequest& m) {
            json j{{"id", m.id}, {"spec", m.spec}};
            if (!m.name.empty()) j["name"] = m.name;
            if (!m.job_dir.empty()) j["job_dir"] = m.job_dir;
            if (m.steps) j["steps"] = *m.steps;
            return j;
          },
          [](const StatusRequest& m) {
            json j{{"id", m.id}};
            if (m.job) j["job"] = *m.job;
            return j;
          },
          [](const EventsRequest& m) {
            return json{{"id", m.id}, {"job", m.job}, {"after", m.after}, {"limit", m.limit}};
          },
          [](const CancelRequest& m) {
            return json{{"id", m.id}, {"job", m.job}};
          },
          [](const StepsRequest& m) {
            return json{{"id", m.id}, {"job", m.job}, {"after", m.after}, {"limit", m.limit}};
          },
          [](const StepsReply& m) {
            json a = json::array();
            for (const auto& s : m.steps)
              a.push_back({{"attempt", s.attempt},
                           {"step", s.step},
                           {"node", s.node},
                           {"loss", s.loss},
                           {"tokens_per_s", s.tokens_per_s},
                           {"step_time_s", s.step_time_s},
                           {"comm_time_s", s.comm_time_s},
                           {"time", s.time}});
            return json{{"id", m.id}, {"job", m.job}, {"steps", a}};
          },
          [](const RestartRequest& m) {
            json j{{"id", m.id}, {"job", m.job}};
            if (m.from_step) j["from_step"] = *m.from_step;
            return j;
          },
          [](const CheckpointRequest& m) {
            return json{{"id", m.id}, {"job", m.job}};
          },
          [](const NodesRequest& m) {
            return json{{"id", m.id}};
          },
          [](const SubmitReply& m) {
            return json{{"id", m.id},
                        {"job", m.job},
                        {"name", m.name},
                        {"spec_hash", m.spec_hash},
                        {"state", m.state}};
          },
          [](const StatusReply& m) {
            json a = json::array();
            for (const auto& ji : m.jobs) a.push_back(write_job_info(ji));
            return json{{"id", m.id}, {"jobs", a}};
          },
          [](const EventsReply& m) {
            json a = json::array();
            for (const auto& e : m.events) {
              json j{{"id", e.id},     {"time", e.time}, {"attempt", e.attempt},
                     {"node", e.node}, {"kind", e.kind}, {"data", e.data}};
              if (e.job) j["job"] = *e.job;
              a.push_back(std::move(j));
            }
            return json{{"id", m.id}, {"events", a}};
          },
          [](const NodesReply& m) {
            json a = json::array();
            for (const auto& n : m.nodes)
              a.push_back({{"name", n.name},
                           {"state", n.state},
                           {"uid", n.uid},
                           {"last_heartbeat", n.last_heartbeat},
                           {"gpus", n.gpus},
                           {"ringd_version", n.ringd_version},
                           {"jobs", n.jobs}});
            return json{{"id", m.id}, {"nodes", a}};
          },
          [](const OkReply& m) {
            return json{{"id", m.id}, {"job", m.job}, {"state", m.state}, {"message", m.message}};
          },
          [](const ErrorReply& m) {
            json j{{"id", m.id}, {"code", m.code}, {"message", m.message}};
            if (!m.field.empty()) j["field"] = m.field;
            return j;
          },
          [](const SlurmJobRequest& m) {
            json j{{"id", m.id}, {"job", m.job}, {"event", m.event}, {"restarts", m.restarts}};
            if (!m.slurm_job_id.empty()) j["slurm_job_id"] = m.slurm_job_id;
            if (!m.nodes.empty()) j["nodes"] = m.nodes;
            if (!m.message.empty()) j["message"] = m.message;
            return j;
          },
      },
      msg);
  j["v"] = kVersion;
  j["type"] = type_name(msg);
  return j;
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
  static const std::set<std::string> kTypes = {
      "register",     "heartbeat",    "step",        "event",  "command_ack",
      "registered",   "command",      "submit",      "status", "events",
      "cancel",       "restart",      "checkpoint",  "nodes",  "submit_reply",
      "status_reply", "events_reply", "nodes_reply", "ok",     "error",
      "slurm_job",    "steps",        "steps_reply"};
  if (!kTypes.count(type))
    throw ProtocolError(code::kUnknownType, "type",
                        "field 'type': unknown message type '" + type + "'");
  Reader r(j, type);
  r.find("v");
  r.find("type");
  Message m = read_body(type, r);
  r.finish();
  return m;
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
