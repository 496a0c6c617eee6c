// The control protocol between ring-coord, ringd and ringctl: small, versioned JSON messages over
// ZeroMQ (one frame each; tensors never travel here).
//
//   std::string wire = ring::protocol::encode(Heartbeat{.node = "n0", .seq = 7});
//   ring::protocol::Message m = ring::protocol::parse(wire);   // throws ProtocolError
//   if (auto* hb = std::get_if<Heartbeat>(&m)) ...
//
// Every message is a JSON object with `v` (protocol version, kVersion) and `type`. The parser
// checks the size before parsing (kMaxMessageBytes), the nesting depth, then every field: type,
// range, required/optional, and refuses unknown fields. A ProtocolError names the offending field
// ("register.gpus[1].memory_mib") and the rule, so the coordinator can reply with it.
//
// Who sends what (docs/architecture.md, "Coordinator"):
//   ringd -> coord   register, heartbeat, step, event, command_ack
//   coord -> ringd   registered, command (stop | roll_back | checkpoint_now), error
//   ringctl -> coord submit, status, events, steps, cancel, restart, checkpoint, nodes, slurm_job
//   coord -> ringctl submit_reply, status_reply, events_reply, steps_reply, nodes_reply, ok,
//                    error
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace ring::protocol {

inline constexpr int kVersion = 1;
// Checked on the raw bytes before any parsing.
inline constexpr size_t kMaxMessageBytes = 64 * 1024;
// Objects/arrays nested deeper than this are refused before parsing.
inline constexpr int kMaxDepth = 16;
// Largest spec text a submit may carry (the rest of the message needs a little room).
inline constexpr size_t kMaxSpecBytes = 60 * 1024;
// worker_died carries at most this many log lines of at most kMaxLogLineBytes each.
inline constexpr size_t kMaxLogLines = 50;
inline constexpr size_t kMaxLogLineBytes = 512;

// Error codes used in ProtocolError and in ErrorReply.code.
namespace code {
inline constexpr const char* kTooLarge = "too_large";
inline constexpr const char* kBadJson = "bad_json";
inline constexpr const char* kUnsupportedVersion = "unsupported_version";
inline constexpr const char* kUnknownType = "unknown_type";
inline constexpr const char* kBadField = "bad_field";
// Used only in replies:
inline constexpr const char* kNotRegistered = "not_registered";
inline constexpr const char* kNotFound = "not_found";
inline constexpr const char* kPermissionDenied = "permission_denied";
inline constexpr const char* kInvalidState = "invalid_state";
inline constexpr const char* kInvalidSpec = "invalid_spec";
inline constexpr const char* kWrongPeer = "wrong_peer";
inline constexpr const char* kInternal = "internal";
}  // namespace code

// A message that cannot be accepted. field() is the dotted path ("step.loss"), empty when the
// problem is the whole message (too large, not JSON).
class ProtocolError : public std::runtime_error {
 public:
  ProtocolError(std::string code, std::string field, const std::string& message)
      : std::runtime_error(message), code_(std::move(code)), field_(std::move(field)) {}
  const std::string& code() const { return code_; }
  const std::string& field() const { return field_; }

 private:
  std::string code_;
  std::string field_;
};

// ---- pieces -------------------------------------------------------------------------------

struct GpuInfo {
  int64_t index = 0;       // device ordinal on the node
  std::string model;       // "NVIDIA H100 80GB HBM3"
  int64_t memory_mib = 0;  // device memory
};

// What the coordinator needs from a node's topology to order the global ring.
struct Topology {
  int64_t numa_nodes = 1;
  int64_t cpus = 1;
  int64_t host_memory_mib = 0;
  std::string leaf_switch;  // Slurm topology.conf switch name; empty when unknown
  std::string summary;      // free text for operators ("2x Xeon 8480, NVLink 4")
};

// A job a daemon is working on, as the daemon sees it.
struct JobProgress {
  int64_t job = 0;
  int64_t attempt = 0;  // 0: the daemon has not started an attempt yet
  int64_t step = 0;
};

// A job as the coordinator tells a daemon to run it.
struct Assignment {
  int64_t job = 0;
  int64_t attempt = 0;
  int64_t resume_step = 0;  // latest complete checkpoint (0: from scratch)
  std::string state;        // job state ("starting", "running", ...)
};

// ---- daemon -> coordinator ------------------------------------------------------------------

struct Register {
  std::string node;
  std::vector<GpuInfo> gpus;
  Topology topology;
  std::string ringd_version;
  std::vector<JobProgress> jobs;  // jobs this daemon serves (from --ring-job, or after reconnect)
};

struct Heartbeat {
  std::string node;
  int64_t seq = 0;
  std::vector<JobProgress> jobs;
};

// One worker's share of a step, as its node's ringd measured it (seconds on the node's steady
// clock; `wait_s` is time blocked on peers: ring receives and collectives).
struct RankStep {
  int64_t rank = 0;  // global rank
  double step_time_s = 0;
  double data_s = 0;      // reading and packing the batch
  double compute_s = 0;   // forward and backward kernels
  double wait_s = 0;      // blocked on a peer (ring receive, collective)
  double comm_s = 0;      // sending (ring hops, gradient handover)
  int64_t hop_bytes = 0;  // bytes this rank sent along the ring
  // The global rank it receives from on the ring (its predecessor), so that ring-coord can charge
  // a rank what its successor on another node waited. Optional: older ringd do not send it.
  std::optional<int64_t> prev;
};

struct StepReport {
  std::string node;
  int64_t job = 0;
  int64_t attempt = 0;
  int64_t step = 0;
  double loss = 0;
  double tokens_per_s = 0;
  double step_time_s = 0;
  double comm_time_s = 0;
  std::vector<RankStep> ranks;  // the node's workers (optional; empty: not measured)
};

enum class EventKind {
  kWorkerStarted,     // rank, pid
  kWorkerExited,      // rank, exit_code (a normal exit)
  kWorkerDied,        // rank, signal or exit_code, last_log
  kCheckpointSaved,   // step, path, bytes, complete, seconds (optional)
  kCheckpointFailed,  // step, message
  kJobCompleted,      // step: this node finished the job's last step
  kJobStopped,        // this node stopped the job's workers (after a stop command)
  kStraggler,         // rank, step, steps, behind_s: the rank the others repeatedly wait for
  kStragglerCleared,  // rank: that rank is no longer a straggler
  kHang,              // step, deadline_s, missing, waiting: a step past its deadline
  kJobFailed,         // message, step (optional): ringd failed the run for good (a fatal error)
};
const char* to_string(EventKind k);

// A rank blocked on a peer when a step hung, and where (hang events).
struct WaitingRank {
  int64_t rank = 0;
  std::string where;  // "ring recv from rank 3, layer 2 hop 1"
};

struct Event {
  std::string node;
  EventKind kind = EventKind::kWorkerStarted;
  int64_t job = 0;
  int64_t attempt = 0;
  std::optional<int64_t> rank;
  std::optional<int64_t> pid;
  std::optional<int64_t> exit_code;  // 0..255
  std::optional<int64_t> signal;     // 1..64
  std::optional<int64_t> step;
  std::optional<int64_t> bytes;
  std::string path;
  std::optional<bool> complete;
  std::vector<std::string> last_log;
  std::string message;
  // checkpoint_saved: seconds this node's shard took to write (start to durable). Optional: older
  // ringd do not send it.
  std::optional<double> seconds;
  // Stragglers and hangs (docs/observability.md).
  std::optional<int64_t> steps;       // straggler: of the recent steps, how many it was last in
  std::optional<double> behind_s;     // straggler: median seconds the others waited for it
  std::optional<double> deadline_s;   // hang: the step deadline that passed
  std::vector<int64_t> missing;       // hang: ranks that never arrived
  std::vector<WaitingRank> waiting;   // hang: ranks blocked on a peer
  // checkpoint_saved: the steps whose checkpoints retention removed with this commit (node 0).
  // Optional: older ringd do not send it.
  std::vector<int64_t> deleted;
  // job_stopped: the node stopped on a stop signal of its own after a checkpoint (resumable),
  // not on a command of ring-coord. Optional: older ringd do not send it.
  std::optional<bool> resumable;
};

struct CommandAck {
  std::string node;
  int64_t id = 0;  // Command.id
  bool ok = true;
  std::string error;
};

// ---- coordinator -> daemon ------------------------------------------------------------------

struct Registered {
  std::string node;
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 10;
  std::vector<Assignment> jobs;
};

enum class CommandKind { kStop, kRollBack, kCheckpointNow };
const char* to_string(CommandKind k);

struct Command {
  int64_t id = 0;  // unique per coordinator run; echoed in CommandAck
  CommandKind command = CommandKind::kStop;
  int64_t job = 0;
  int64_t attempt = 0;  // roll_back: the new attempt to start
  int64_t step = 0;     // roll_back: the checkpoint step to resume from
  std::string reason;
};

// ---- ringctl -> coordinator -----------------------------------------------------------------
// `id` is chosen by the client and echoed in the reply.

struct SubmitRequest {
  int64_t id = 0;
  std::string spec;  // YAML text, validated by the coordinator
  std::string name;  // overrides job.name when set
  // Absolute path of the job's directory (logs/, steps.jsonl, checkpoints; daemon/INTERFACE.md);
  // empty: the owner's default, /tmp/ringmaster-<uid>/jobs/<job name> (common/cli/job_dir.h).
  std::string job_dir;
  // Overrides the spec's train.steps as the job's total (`ringctl run --steps`, `ringd --steps`).
  std::optional<int64_t> steps;
};
struct StatusRequest {
  int64_t id = 0;
  std::optional<int64_t> job;  // unset: every job
};
struct EventsRequest {
  int64_t id = 0;
  int64_t job = 0;
  int64_t after = 0;  // only events with a larger id (for --follow)
  int64_t limit = 100;
};
// The step reports the coordinator recorded for a job (`ringctl steps`).
struct StepsRequest {
  int64_t id = 0;
  int64_t job = 0;
  int64_t after = 0;  // only steps > after
  int64_t limit = 1000;
  // true: the per-rank rows (rank_steps) instead of the node reports, `limit` rows. Optional,
  // written only when true (a request without it reads as before).
  std::optional<bool> ranks;
};
struct CancelRequest {
  int64_t id = 0;
  int64_t job = 0;
};
struct RestartRequest {
  int64_t id = 0;
  int64_t job = 0;
  std::optional<int64_t> from_step;  // unset: latest complete checkpoint
  // A Slurm job about to be requeued by its owner (`ringctl restart` runs scontrol requeue right
  // after): end the attempt now, before Slurm's SIGTERM reaches any ringd, so a worker that dies
  // on a peer stopped first is not taken for a failure; Slurm's next start begins the next
  // attempt. Members get no stop command: Slurm stops them.
  std::optional<bool> requeue;
};
struct CheckpointRequest {
  int64_t id = 0;
  int64_t job = 0;
};
struct NodesRequest {
  int64_t id = 0;
};
// What Slurm did with a job submitted through sbatch (`ringctl submit`, and the batch script
// through `ringctl slurm-started`): "submitted" (sbatch accepted it as slurm_job_id),
// "submit_failed" (sbatch refused it: message; the pending job fails), "started" (the batch
// script began on `nodes`, a Slurm hostlist; restarts = SLURM_RESTART_COUNT, > 0 after a requeue
// for node failure, preemption or `ringctl restart`: a new attempt from the latest checkpoint).
struct SlurmJobRequest {
  int64_t id = 0;
  int64_t job = 0;
  std::string event;         // submitted | submit_failed | started
  std::string slurm_job_id;  // digits, optionally _N (array task)
  int64_t restarts = 0;
  std::string nodes;
  std::string message;
  // "started" after a requeue: the hosts Slurm reports down, drained, failing or not responding
  // at this start (sinfo). Those of the previous allocation that never stopped on their own are
  // the failed nodes the job then excludes.
  std::vector<std::string> unhealthy_nodes;
};

// ---- coordinator -> ringctl -----------------------------------------------------------------

struct JobInfo {
  int64_t job = 0;
  std::string name;
  int64_t owner_uid = 0;
  std::string owner;
  std::string state;
  std::string state_reason;
  std::string spec_hash;
  int64_t attempt = 0;
  int64_t restarts = 0;
  int64_t max_restarts = 0;
  int64_t step = 0;
  int64_t total_steps = 0;
  std::optional<double> loss;
  std::optional<double> tokens_per_s;
  std::optional<int64_t> last_checkpoint_step;
  std::string slurm_job_id;
  std::vector<std::string> nodes;
  std::vector<std::string> ring_order;
  // A Slurm job: the hosts its allocations must not hold, each a node whose loss failed an
  // attempt (the job's node_excluded events say when and why).
  std::vector<std::string> excluded_nodes;
  std::string job_dir;         // absolute: logs/worker-<rank>.log, steps.jsonl
  std::string checkpoint_dir;  // absolute: the spec's checkpoint.dir, or <job_dir>/checkpoints
  double created_at = 0;  // Unix seconds
  double updated_at = 0;
};

struct EventRecord {
  int64_t id = 0;
  double time = 0;
  std::optional<int64_t> job;
  int64_t attempt = 0;
  std::string node;
  std::string kind;
  nlohmann::json data = nlohmann::json::object();
};

// One rank's share of a step as recorded (RankStep with its step and node).
struct RankStepRecord {
  int64_t attempt = 0;
  int64_t step = 0;
  std::string node;
  RankStep rank;
  double time = 0;  // Unix seconds the coordinator recorded it
};

// One step report as recorded (StepReport of one node; loss as sent, full precision).
struct StepRecord {
  int64_t attempt = 0;
  int64_t step = 0;
  std::string node;
  double loss = 0;
  double tokens_per_s = 0;
  double step_time_s = 0;
  double comm_time_s = 0;
  double time = 0;  // Unix seconds the coordinator recorded it
};

struct NodeInfo {
  std::string name;
  std::string state;  // up | lost | retired (no heartbeat, every job it served has ended)
  int64_t uid = 0;
  double last_heartbeat = 0;
  int64_t gpus = 0;
  std::string ringd_version;
  std::vector<int64_t> jobs;
};

struct SubmitReply {
  int64_t id = 0;
  int64_t job = 0;
  std::string name;
  std::string spec_hash;
  std::string state;
};
struct StatusReply {
  int64_t id = 0;
  std::vector<JobInfo> jobs;
};
struct EventsReply {
  int64_t id = 0;
  std::vector<EventRecord> events;
};
struct StepsReply {
  int64_t id = 0;
  int64_t job = 0;
  std::vector<StepRecord> steps;
  std::vector<RankStepRecord> ranks;  // StepsRequest.ranks: by step, attempt, rank
};
struct NodesReply {
  int64_t id = 0;
  std::vector<NodeInfo> nodes;
};
struct OkReply {
  int64_t id = 0;
  int64_t job = 0;
  std::string state;
  std::string message;
  // A "started" SlurmJobRequest only: the nodes of this allocation the job excludes (its attempt
  // failed with them). ring-coord requeues the job without them; the batch script starts no
  // ringd. Empty (and absent on the wire) otherwise.
  std::vector<std::string> requeue_without;
};
struct ErrorReply {
  int64_t id = 0;  // the request's id when it could be read, else 0
  std::string code;
  std::string message;
  std::string field;
};

using Message =
    std::variant<Register, Heartbeat, StepReport, Event, CommandAck, Registered, Command,
                 SubmitRequest, StatusRequest, EventsRequest, CancelRequest, RestartRequest,
                 CheckpointRequest, NodesRequest, SubmitReply, StatusReply, EventsReply, NodesReply,
                 OkReply, ErrorReply, SlurmJobRequest, StepsRequest, StepsReply>;

// The `type` string of a message ("register", "status_reply", ...).
const char* type_name(const Message& m);

// JSON form (with v and type) and its serialisation.
nlohmann::json to_json(const Message& m);
// One step record as steps_reply writes it (`ringctl steps --json`, the web API's steps).
nlohmann::json step_record_json(const StepRecord& r);
// One rank's step, flat (`ringctl metrics --ranks --json`, the web API's ranks): attempt, step,
// node, rank, step_time_s, data_s, compute_s, wait_s, comm_s, hop_bytes, time.
nlohmann::json rank_step_record_json(const RankStepRecord& r);
std::string encode(const Message& m);

// Validates and parses one message. Throws ProtocolError.
Message parse(std::string_view bytes);
// Same, from an already parsed JSON value (no size/depth check).
Message from_json(const nlohmann::json& j);

// Best effort: the request id of a message that failed to parse (0 if unreadable), so the error
// reply can be matched by the client.
int64_t peek_request_id(std::string_view bytes);

// A node name: 1..253 of [A-Za-z0-9._-], starting with a letter or digit.
bool valid_node_name(std::string_view s);

}  // namespace ring::protocol
