#include "common/protocol/protocol.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/protocol/fields.h"
#include "common/wire/table.h"

namespace ring::protocol {

using nlohmann::json;

namespace {

using wire::Cursor;
using wire::Presence;
using wire::Table;

constexpr int64_t kMaxId = (int64_t{1} << 53);  // exact in a double, for JSON consumers
constexpr size_t kMaxName = wire::kMaxNodeName;
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

// ---- the dialect: how a broken rule reads ------------------------------------------------------
//
// Each message (and each object inside one) is described once, by its table below (common/wire:
// key, kind, range, required or optional, written always or when set). The same table drives the
// reader (JSON -> struct; a key no row reads is refused as an unknown field; an optional field
// may be null), the writer (struct -> JSON) and field_rules (fields.h). Rules that span fields (an
// event kind's required fields, a Slurm job id's format) are check rows, which only the reader
// runs. Errors name "type.path.key" and the rule.

std::string expected(const wire::Breach& b) {
  const json& v = *b.value;
  switch (b.expected) {
    case wire::Shape::kInteger:
      // An item of a list of integers says only what it should be.
      if (b.item) return "expected an integer";
      return std::string("expected an integer, got ") + json_kind(v) +
             (v.is_number_float() ? " (" + show(v) + ")" : "");
    case wire::Shape::kNumber:
      return std::string("expected a number, got ") + json_kind(v);
    case wire::Shape::kBoolean:
      return std::string("expected a boolean, got ") + json_kind(v);
    case wire::Shape::kString:
      return std::string("expected a string, got ") + json_kind(v);
    case wire::Shape::kArray:
      return std::string("expected an array, got ") + json_kind(v);
    default:
      return std::string("expected an object, got ") + json_kind(v);
  }
}

std::string range(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string wording(const wire::Breach& b) {
  using What = wire::Breach::What;
  switch (b.what) {
    case What::kMissing:
      return "required field is missing";
    case What::kWrongType:
      return expected(b);
    case What::kIntegerOverflow:
      return "out of range " + range(b.lo, b.hi);
    case What::kIntegerRange:
      return std::to_string(b.x) + " is out of range " + range(b.lo, b.hi);
    case What::kNotFinite:
      return "must be finite";
    case What::kNumberRange: {
      std::ostringstream os;
      os << b.number << " is out of range [" << b.min << ", " << b.max << "]";
      return os.str();
    }
    case What::kTooShort:
      return b.limit == 1 ? "must not be empty" : "at least " + std::to_string(b.limit) + " bytes";
    case What::kTooLong:
      return "at most " + std::to_string(b.limit) + " bytes, got " + std::to_string(b.size);
    case What::kTooManyItems:
      return "at most " + std::to_string(b.limit) + " items, got " + std::to_string(b.size);
    case What::kUnknownField:
      return "unknown field";
    default:
      return b.text;
  }
}

// "field 'register.gpus[1].memory_mib': -5 is out of range [0, 1073741824]"
void fail(const wire::Where& w, const wire::Breach& b) {
  const std::string field = w.path();
  throw ProtocolError(code::kBadField, field, "field '" + field + "': " + wording(b));
}

constexpr wire::Dialect kDialect{
    .null_is_absent = true, .refuse_unknown = true, .nonfinite_as_null = false, .fail = fail};

// ---- the field tables ---------------------------------------------------------------------------

using wire::boolean;
using wire::check;
using wire::embed;
using wire::enumeration;
using wire::integer;
using wire::integers;
using wire::json_object;
using wire::node;
using wire::number;
using wire::object;
using wire::objects;
using wire::string;
using wire::strings;

constexpr Presence kRequired = Presence::kRequired;
constexpr Presence kOptional = Presence::kOptional;  // may be absent; always written
constexpr Presence kWhenSet = Presence::kWhenSet;    // may be absent; written when set

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

// clang-format off
// One table a struct: table<GpuInfo>(), ..., table<StepsReply>(). Rows are checked in order, so
// the first bad field is the one named.
template <class M>
const Table<M>& table();

// Pieces.

// The numbers of one step report (StepReport from ringd, StepRecord as recorded).
template <class M>
std::vector<wire::Field<M>> step_numbers() {
  return {number("loss", &M::loss, -1e30, 1e30),
          number("tokens_per_s", &M::tokens_per_s, 0, 1e15),
          number("step_time_s", &M::step_time_s, 0, 1e7),
          number("comm_time_s", &M::comm_time_s, 0, 1e7)};
}

template <>
const Table<GpuInfo>& table<GpuInfo>() {
  static const Table<GpuInfo> t{"", {
      integer("index", &GpuInfo::index, 0, 1023),
      string("model", &GpuInfo::model, 0, 256, kOptional),
      integer("memory_mib", &GpuInfo::memory_mib, 0, int64_t{1} << 30)}};
  return t;
}
template <>
const Table<Topology>& table<Topology>() {
  static const Table<Topology> t{"", {
      integer("numa_nodes", &Topology::numa_nodes, 1, 1024),
      integer("cpus", &Topology::cpus, 1, 1 << 20),
      integer("host_memory_mib", &Topology::host_memory_mib, 0, int64_t{1} << 40),
      string("leaf_switch", &Topology::leaf_switch, 0, kMaxName, kOptional),
      string("summary", &Topology::summary, 0, 1024, kOptional)}};
  return t;
}
template <>
const Table<JobProgress>& table<JobProgress>() {
  static const Table<JobProgress> t{"", {
      integer("job", &JobProgress::job, 1, kMaxId),
      integer("attempt", &JobProgress::attempt, 0, kMaxId),
      integer("step", &JobProgress::step, 0, kMaxId)}};
  return t;
}
template <>
const Table<Assignment>& table<Assignment>() {
  static const Table<Assignment> t{"", {
      integer("job", &Assignment::job, 1, kMaxId),
      integer("attempt", &Assignment::attempt, 0, kMaxId),
      integer("resume_step", &Assignment::resume_step, 0, kMaxId),
      string("state", &Assignment::state, 1, 32)}};
  return t;
}
template <>
const Table<JobInfo>& table<JobInfo>() {
  constexpr int64_t kMaxUid = std::numeric_limits<uint32_t>::max();
  static const Table<JobInfo> t{"", {
      integer("job", &JobInfo::job, 1, kMaxId),
      string("name", &JobInfo::name, 1, kMaxName),
      integer("owner_uid", &JobInfo::owner_uid, 0, kMaxUid),
      string("owner", &JobInfo::owner, 0, kMaxName, kOptional),
      string("state", &JobInfo::state, 1, 32),
      string("state_reason", &JobInfo::state_reason, 0, kMaxText, kOptional),
      string("spec_hash", &JobInfo::spec_hash, 1, 128),
      integer("attempt", &JobInfo::attempt, 0, kMaxId),
      integer("restarts", &JobInfo::restarts, 0, kMaxId),
      integer("max_restarts", &JobInfo::max_restarts, 0, kMaxId),
      integer("step", &JobInfo::step, 0, kMaxId),
      integer("total_steps", &JobInfo::total_steps, 0, kMaxId),
      number("loss", &JobInfo::loss, -1e300, 1e300),
      number("tokens_per_s", &JobInfo::tokens_per_s, 0, 1e300),
      integer("last_checkpoint_step", &JobInfo::last_checkpoint_step, 0, kMaxId),
      string("slurm_job_id", &JobInfo::slurm_job_id, 0, 64, kOptional),
      strings("nodes", &JobInfo::nodes, kMaxList, kMaxName, kOptional),
      strings("ring_order", &JobInfo::ring_order, kMaxList, kMaxName, kOptional),
      strings("excluded_nodes", &JobInfo::excluded_nodes, kMaxList, kMaxName, kWhenSet),
      string("job_dir", &JobInfo::job_dir, 0, kMaxPath, kOptional),
      string("checkpoint_dir", &JobInfo::checkpoint_dir, 0, kMaxPath, kOptional),
      number("created_at", &JobInfo::created_at, 0, 1e12),
      number("updated_at", &JobInfo::updated_at, 0, 1e12)}};
  return t;
}
template <>
const Table<EventRecord>& table<EventRecord>() {
  static const Table<EventRecord> t{"", {
      integer("id", &EventRecord::id, 1, std::numeric_limits<int64_t>::max()),
      number("time", &EventRecord::time, 0, 1e12),
      integer("job", &EventRecord::job, 1, kMaxId),
      integer("attempt", &EventRecord::attempt, 0, kMaxId),
      string("node", &EventRecord::node, 0, kMaxName, kOptional),
      string("kind", &EventRecord::kind, 1, 64),
      json_object("data", &EventRecord::data, /*null_ok=*/false)}};
  return t;
}
template <>
const Table<NodeInfo>& table<NodeInfo>() {
  static const Table<NodeInfo> t{"", {
      node("name", &NodeInfo::name),
      string("state", &NodeInfo::state, 1, 16),
      integer("uid", &NodeInfo::uid, 0, std::numeric_limits<uint32_t>::max()),
      number("last_heartbeat", &NodeInfo::last_heartbeat, 0, 1e12),
      integer("gpus", &NodeInfo::gpus, 0, 1024),
      string("ringd_version", &NodeInfo::ringd_version, 0, 64, kOptional),
      integers("jobs", &NodeInfo::jobs, kMaxList, kOptional)}};
  return t;
}
template <>
const Table<StepRecord>& table<StepRecord>() {
  static const Table<StepRecord> t{"", {
      integer("attempt", &StepRecord::attempt, 0, kMaxId),
      integer("step", &StepRecord::step, 0, kMaxId),
      node("node", &StepRecord::node),
      step_numbers<StepRecord>(),
      number("time", &StepRecord::time, 0, 1e12)}};
  return t;
}
template <>
const Table<RankStep>& table<RankStep>() {
  static const Table<RankStep> t{"", {
      integer("rank", &RankStep::rank, 0, 1 << 24),
      number("step_time_s", &RankStep::step_time_s, 0, 1e7),
      number("data_s", &RankStep::data_s, 0, 1e7),
      number("compute_s", &RankStep::compute_s, 0, 1e7),
      number("wait_s", &RankStep::wait_s, 0, 1e7),
      number("comm_s", &RankStep::comm_s, 0, 1e7),
      integer("hop_bytes", &RankStep::hop_bytes, 0, int64_t{1} << 50),
      integer("prev", &RankStep::prev, 0, 1 << 24)}};
  return t;
}
// A recorded rank row: the RankStep's fields flattened beside attempt, step, node and time.
template <>
const Table<RankStepRecord>& table<RankStepRecord>() {
  static const Table<RankStepRecord> t{"", {
      integer("attempt", &RankStepRecord::attempt, 0, kMaxId),
      integer("step", &RankStepRecord::step, 0, kMaxId),
      node("node", &RankStepRecord::node),
      embed(&RankStepRecord::rank, table<RankStep>()),
      number("time", &RankStepRecord::time, 0, 1e12)}};
  return t;
}
template <>
const Table<WaitingRank>& table<WaitingRank>() {
  static const Table<WaitingRank> t{"", {
      integer("rank", &WaitingRank::rank, 0, 1 << 24),
      string("where", &WaitingRank::where, 1, 512)}};
  return t;
}

// daemon -> coordinator.

template <>
const Table<Register>& table<Register>() {
  static const Table<Register> t{"register", {
      node("node", &Register::node),
      objects("gpus", &Register::gpus, table<GpuInfo>(), 1024, kRequired),
      object("topology", &Register::topology, table<Topology>()),
      string("ringd_version", &Register::ringd_version, 1, 64),
      objects("jobs", &Register::jobs, table<JobProgress>(), kMaxList, kOptional)}};
  return t;
}
template <>
const Table<Heartbeat>& table<Heartbeat>() {
  static const Table<Heartbeat> t{"heartbeat", {
      node("node", &Heartbeat::node),
      integer("seq", &Heartbeat::seq, 0, std::numeric_limits<int64_t>::max()),
      objects("jobs", &Heartbeat::jobs, table<JobProgress>(), kMaxList, kOptional)}};
  return t;
}
template <>
const Table<StepReport>& table<StepReport>() {
  static const Table<StepReport> t{"step", {
      node("node", &StepReport::node),
      integer("job", &StepReport::job, 1, kMaxId),
      integer("attempt", &StepReport::attempt, 1, kMaxId),
      integer("step", &StepReport::step, 0, kMaxId),
      step_numbers<StepReport>(),
      objects("ranks", &StepReport::ranks, table<RankStep>(), 512, kWhenSet)}};
  return t;
}

// An event kind's required fields, then the ranks and steps of its lists.
void event_rules(const Event& m, const Cursor& c) {
  auto require = [&](bool ok, const char* key, const char* why) {
    if (!ok) c.fail(key, why);
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
    if (r < 0 || r > (1 << 24)) c.fail("missing", "a rank is out of range [0, 16777216]");
  for (int64_t st : m.deleted)
    if (st < 0 || st > kMaxId) c.fail("deleted", "a step is out of range");
}

template <>
const Table<Event>& table<Event>() {
  static const Table<Event> t{"event", {
      node("node", &Event::node),
      enumeration("kind", &Event::kind, kEventNames),
      integer("job", &Event::job, 1, kMaxId),
      integer("attempt", &Event::attempt, 0, kMaxId),
      integer("rank", &Event::rank, 0, 1 << 24),
      integer("pid", &Event::pid, 1, std::numeric_limits<int32_t>::max()),
      integer("exit_code", &Event::exit_code, 0, 255),
      integer("signal", &Event::signal, 1, 64),
      integer("step", &Event::step, 0, kMaxId),
      integer("bytes", &Event::bytes, 0, std::numeric_limits<int64_t>::max()),
      string("path", &Event::path, 0, kMaxText, kWhenSet),
      boolean("complete", &Event::complete),
      strings("last_log", &Event::last_log, kMaxLogLines, kMaxLogLineBytes, kWhenSet),
      string("message", &Event::message, 0, kMaxText, kWhenSet),
      number("seconds", &Event::seconds, 0, 1e7),
      integer("steps", &Event::steps, 0, 1 << 20),
      number("behind_s", &Event::behind_s, 0, 1e7),
      number("deadline_s", &Event::deadline_s, 0, 1e7),
      integers("missing", &Event::missing, 512, kWhenSet),
      objects("waiting", &Event::waiting, table<WaitingRank>(), 512, kWhenSet),
      integers("deleted", &Event::deleted, 4096, kWhenSet),
      boolean("resumable", &Event::resumable),
      check(event_rules)}};
  return t;
}
template <>
const Table<CommandAck>& table<CommandAck>() {
  static const Table<CommandAck> t{"command_ack", {
      node("node", &CommandAck::node),
      integer("cmd", &CommandAck::id, 1, kMaxId),
      boolean("ok", &CommandAck::ok),
      string("error", &CommandAck::error, 0, kMaxText, kWhenSet)}};
  return t;
}

// coordinator -> daemon.

template <>
const Table<Registered>& table<Registered>() {
  static const Table<Registered> t{"registered", {
      node("node", &Registered::node),
      number("heartbeat_interval_s", &Registered::heartbeat_interval_s, 0.001, 3600),
      number("heartbeat_timeout_s", &Registered::heartbeat_timeout_s, 0.001, 86400),
      objects("jobs", &Registered::jobs, table<Assignment>(), kMaxList, kOptional)}};
  return t;
}
template <>
const Table<Command>& table<Command>() {
  static const Table<Command> t{"command", {
      integer("cmd", &Command::id, 1, kMaxId),
      enumeration("command", &Command::command, kCommandNames),
      integer("job", &Command::job, 1, kMaxId),
      integer("attempt", &Command::attempt, 0, kMaxId),
      integer("step", &Command::step, 0, kMaxId),
      string("reason", &Command::reason, 0, kMaxText, kOptional)}};
  return t;
}

// ringctl -> coordinator. Requests and replies carry the client's id, checked first.

template <class M>
wire::Field<M> request_id() {
  return integer("id", &M::id, 0, kMaxId);
}

std::string absolute_path(const std::string& s) {
  return !s.empty() && s[0] != '/' ? "must be an absolute path, got '" + s + "'" : "";
}

template <>
const Table<SubmitRequest>& table<SubmitRequest>() {
  static const Table<SubmitRequest> t{"submit", {
      request_id<SubmitRequest>(),
      string("spec", &SubmitRequest::spec, 1, kMaxSpecBytes),
      string("name", &SubmitRequest::name, 0, kMaxName, kWhenSet),
      string("job_dir", &SubmitRequest::job_dir, 0, kMaxPath, kWhenSet, absolute_path),
      integer("steps", &SubmitRequest::steps, 1, kMaxId)}};
  return t;
}
template <>
const Table<StatusRequest>& table<StatusRequest>() {
  static const Table<StatusRequest> t{"status", {
      request_id<StatusRequest>(),
      integer("job", &StatusRequest::job, 1, kMaxId)}};
  return t;
}
template <>
const Table<EventsRequest>& table<EventsRequest>() {
  static const Table<EventsRequest> t{"events", {
      request_id<EventsRequest>(),
      integer("job", &EventsRequest::job, 1, kMaxId),
      integer("after", &EventsRequest::after, 0, kMaxId, kOptional),
      integer("limit", &EventsRequest::limit, 1, 1000, kOptional)}};
  return t;
}
template <>
const Table<StepsRequest>& table<StepsRequest>() {
  static const Table<StepsRequest> t{"steps", {
      request_id<StepsRequest>(),
      integer("job", &StepsRequest::job, 1, kMaxId),
      integer("after", &StepsRequest::after, 0, kMaxId, kOptional),
      integer("limit", &StepsRequest::limit, 1, 10000, kOptional),
      boolean("ranks", &StepsRequest::ranks)}};
  return t;
}
template <>
const Table<CancelRequest>& table<CancelRequest>() {
  static const Table<CancelRequest> t{"cancel", {
      request_id<CancelRequest>(),
      integer("job", &CancelRequest::job, 1, kMaxId)}};
  return t;
}
template <>
const Table<RestartRequest>& table<RestartRequest>() {
  static const Table<RestartRequest> t{"restart", {
      request_id<RestartRequest>(),
      integer("job", &RestartRequest::job, 1, kMaxId),
      integer("from_step", &RestartRequest::from_step, 0, kMaxId),
      boolean("requeue", &RestartRequest::requeue)}};
  return t;
}
template <>
const Table<CheckpointRequest>& table<CheckpointRequest>() {
  static const Table<CheckpointRequest> t{"checkpoint", {
      request_id<CheckpointRequest>(),
      integer("job", &CheckpointRequest::job, 1, kMaxId)}};
  return t;
}
template <>
const Table<NodesRequest>& table<NodesRequest>() {
  static const Table<NodesRequest> t{"nodes", {request_id<NodesRequest>()}};
  return t;
}

std::string slurm_event(const std::string& s) {
  return s == "submitted" || s == "submit_failed" || s == "started"
             ? ""
             : "'" + s + "' is not one of submitted, submit_failed, started";
}
bool slurm_job_id_ok(const std::string& v) {
  auto digits = [](const std::string& d) {
    return !d.empty() && std::all_of(d.begin(), d.end(), ::isdigit);
  };
  auto us = v.find('_');
  return us == std::string::npos ? digits(v) : digits(v.substr(0, us)) && digits(v.substr(us + 1));
}
// A Slurm job id, except for a submit that failed (sbatch gave none).
void slurm_job_id_rule(const SlurmJobRequest& m, const Cursor& c) {
  if (!slurm_job_id_ok(m.slurm_job_id) && !(m.slurm_job_id.empty() && m.event == "submit_failed"))
    c.fail("slurm_job_id",
           "'" + m.slurm_job_id + "' is not a Slurm job id (digits, optionally _N)");
}

template <>
const Table<SlurmJobRequest>& table<SlurmJobRequest>() {
  static const Table<SlurmJobRequest> t{"slurm_job", {
      request_id<SlurmJobRequest>(),
      integer("job", &SlurmJobRequest::job, 1, kMaxId),
      string("event", &SlurmJobRequest::event, 1, 32, kRequired, slurm_event),
      string("slurm_job_id", &SlurmJobRequest::slurm_job_id, 0, 64, kWhenSet),
      check(slurm_job_id_rule),
      integer("restarts", &SlurmJobRequest::restarts, 0, 1000000, kOptional),
      string("nodes", &SlurmJobRequest::nodes, 0, kMaxText, kWhenSet),
      string("message", &SlurmJobRequest::message, 0, kMaxText, kWhenSet),
      strings("unhealthy_nodes", &SlurmJobRequest::unhealthy_nodes, kMaxList, kMaxName,
              kWhenSet)}};
  return t;
}

// coordinator -> ringctl.

template <>
const Table<SubmitReply>& table<SubmitReply>() {
  static const Table<SubmitReply> t{"submit_reply", {
      request_id<SubmitReply>(),
      integer("job", &SubmitReply::job, 1, kMaxId),
      string("name", &SubmitReply::name, 1, kMaxName),
      string("spec_hash", &SubmitReply::spec_hash, 1, 128),
      string("state", &SubmitReply::state, 1, 32)}};
  return t;
}
template <>
const Table<StatusReply>& table<StatusReply>() {
  static const Table<StatusReply> t{"status_reply", {
      request_id<StatusReply>(),
      objects("jobs", &StatusReply::jobs, table<JobInfo>(), 100000, kRequired)}};
  return t;
}
template <>
const Table<EventsReply>& table<EventsReply>() {
  static const Table<EventsReply> t{"events_reply", {
      request_id<EventsReply>(),
      objects("events", &EventsReply::events, table<EventRecord>(), 1000, kRequired)}};
  return t;
}
template <>
const Table<StepsReply>& table<StepsReply>() {
  static const Table<StepsReply> t{"steps_reply", {
      request_id<StepsReply>(),
      integer("job", &StepsReply::job, 1, kMaxId),
      objects("steps", &StepsReply::steps, table<StepRecord>(), 10000, kRequired),
      objects("ranks", &StepsReply::ranks, table<RankStepRecord>(), 10000, kWhenSet)}};
  return t;
}
template <>
const Table<NodesReply>& table<NodesReply>() {
  static const Table<NodesReply> t{"nodes_reply", {
      request_id<NodesReply>(),
      objects("nodes", &NodesReply::nodes, table<NodeInfo>(), 100000, kRequired)}};
  return t;
}
template <>
const Table<OkReply>& table<OkReply>() {
  static const Table<OkReply> t{"ok", {
      request_id<OkReply>(),
      integer("job", &OkReply::job, 0, kMaxId, kOptional),
      string("state", &OkReply::state, 0, 32, kOptional),
      string("message", &OkReply::message, 0, kMaxText, kOptional),
      strings("requeue_without", &OkReply::requeue_without, kMaxList, kMaxName, kWhenSet)}};
  return t;
}
template <>
const Table<ErrorReply>& table<ErrorReply>() {
  static const Table<ErrorReply> t{"error", {
      request_id<ErrorReply>(),
      string("code", &ErrorReply::code, 1, 64),
      string("message", &ErrorReply::message, 1, 16 * 1024),
      string("field", &ErrorReply::field, 0, kMaxName, kWhenSet)}};
  return t;
}

// clang-format on

// Every message, in the order of Message's alternatives (the constructor's types check it); the
// alternative is chosen by its table's name, the message's `type`.
const wire::Catalog<Message>& catalog() {
  static const wire::Catalog<Message> c(
      table<Register>(), table<Heartbeat>(), table<StepReport>(), table<Event>(),
      table<CommandAck>(), table<Registered>(), table<Command>(), table<SubmitRequest>(),
      table<StatusRequest>(), table<EventsRequest>(), table<CancelRequest>(),
      table<RestartRequest>(), table<CheckpointRequest>(), table<NodesRequest>(),
      table<SubmitReply>(), table<StatusReply>(), table<EventsReply>(), table<NodesReply>(),
      table<OkReply>(), table<ErrorReply>(), table<SlurmJobRequest>(), table<StepsRequest>(),
      table<StepsReply>());
  return c;
}

// The table's rule as fields.h describes it.
FieldRule field_rule(const wire::Rule& r) {
  FieldRule f{r.key, "", r.required(), std::nullopt, std::nullopt, {}};
  switch (r.kind) {
    case wire::Kind::kInteger:
      f.kind = "integer";
      f.lo = static_cast<double>(r.lo);
      f.hi = static_cast<double>(r.hi);
      break;
    case wire::Kind::kNumber:
      f.kind = "number";
      f.lo = r.min;
      f.hi = r.max;
      break;
    case wire::Kind::kString:
    case wire::Kind::kNode:
      f.kind = r.kind == wire::Kind::kNode ? "node" : "string";
      f.lo = static_cast<double>(r.min_len);
      f.hi = static_cast<double>(r.max_len);
      break;
    case wire::Kind::kBoolean:
      f.kind = "boolean";
      break;
    case wire::Kind::kEnum:
      f.kind = "enum";
      f.choices = r.choices;
      break;
    case wire::Kind::kStrings:
      f.kind = "strings";
      break;
    case wire::Kind::kIntegers:
      f.kind = "integers";
      break;
    case wire::Kind::kObjects:
      f.kind = "objects";
      break;
    default:  // kJson, kObject
      f.kind = "object";
      break;
  }
  return f;
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
  return wire::valid_node_name(s);
}

const char* type_name(const Message& m) {
  return catalog().name(m).c_str();
}

json to_json(const Message& msg) {
  json j = catalog().write(msg, kDialect);
  j["v"] = kVersion;
  j["type"] = type_name(msg);
  return j;
}

json step_record_json(const StepRecord& r) {
  return wire::write(table<StepRecord>(), r, kDialect);
}

json rank_step_record_json(const RankStepRecord& r) {
  return {{"attempt", r.attempt},
          {"step", r.step},
          {"node", r.node},
          {"rank", r.rank.rank},
          {"step_time_s", r.rank.step_time_s},
          {"data_s", r.rank.data_s},
          {"compute_s", r.rank.compute_s},
          {"wait_s", r.rank.wait_s},
          {"comm_s", r.rank.comm_s},
          {"hop_bytes", r.rank.hop_bytes},
          {"time", r.time}};
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
  const int index = catalog().find(type);
  if (index < 0)
    throw ProtocolError(code::kUnknownType, "type",
                        "field 'type': unknown message type '" + type + "'");
  Cursor c(j, kDialect, type);
  c.accept("v");
  c.accept("type");
  return catalog().read(static_cast<size_t>(index), c);
}

std::vector<std::string> message_types() {
  std::vector<std::string> out;
  for (size_t i = 0; i < catalog().size(); ++i) out.push_back(catalog().name(i));
  return out;
}

std::vector<FieldRule> field_rules(std::string_view type) {
  const int index = catalog().find(type);
  if (index < 0) return {};
  std::vector<FieldRule> out;
  for (const wire::Rule& r : catalog().rules(static_cast<size_t>(index)))
    out.push_back(field_rule(r));
  return out;
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
