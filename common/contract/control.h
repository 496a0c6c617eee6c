// The lines of ringd's worker control socket (one JSON object per line, key "t" names the kind),
// parsed and checked in one place so that neither side acts on a field of the wrong type or out
// of range. ringd is trusted by its workers and the socket is private to the node's user, but a
// wrong message must still end in an error naming the field, never in a crash, an uncaught
// nlohmann exception or an out-of-bounds access into the shared memory.
//
//   worker -> ringd:  hello {rank, local, pid, n, proto}, mapped, init, hb, bucket {step, b},
//                     done {step, loss_sum, valid, tokens, step_ms, ring_wait_ms, bytes_sent,
//                           cursor, stop, data_ms, compute_ms, wait_ms, comm_ms, prev}
//   ringd -> worker:  welcome {shm, start_step, need_init, cursor}, params {step, changed, stop},
//                     stop {reason}
//
//   WorkerMessage m = parse_worker_line(line);   // throws ControlError naming the field
//   if (auto* b = std::get_if<Bucket>(&m)) ...
//
// Each message's fields are one declarative table in control.cc (key, type, range, required or
// not), which drives both the reader and the writer, the way common/spec/keys.cc drives the
// spec: a new field is a struct member and a table line, and both directions follow.
//
// Versioning: hello carries the worker's kProtocolVersion in `proto`; ringd refuses a worker whose
// version differs (ControlError on hello.proto naming both versions), so a ring-worker and a ringd
// from different builds never act on each other's lines. Bump kProtocolVersion whenever a field's
// meaning, type or range changes or a required field is added. Unknown keys are ignored.
// Tests: tests/contract/control_test.cc (every message, every malformed field), tests/fuzz
// (worker_control_fuzz and replay).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace ring::contract::control {

// The version of the control protocol this build speaks (Hello::proto).
inline constexpr int64_t kProtocolVersion = 1;

// Longest line either side accepts; a welcome carries the loader cursor (a few hundred bytes).
inline constexpr size_t kMaxLineBytes = 1u << 20;

class ControlError : public std::runtime_error {
 public:
  ControlError(std::string field, const std::string& message)
      : std::runtime_error(message), field_(std::move(field)) {}
  // "done.loss_sum"; empty when the whole line is wrong (not JSON, too long, unknown kind).
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// ---- worker -> ringd ----------------------------------------------------------------------------

struct Hello {
  int64_t rank = 0;
  int64_t local = 0;
  int64_t pid = 0;
  int64_t n = 0;  // floats in the worker's model layout
  int64_t proto = kProtocolVersion;  // the sender's control protocol; must equal the receiver's
};
struct Mapped {};
struct Init {};
struct Heartbeat {};
struct Bucket {
  int64_t step = 0;
  int64_t b = 0;
};
struct Done {
  int64_t step = 0;
  double loss_sum = 0;  // JSON null (a NaN or infinite loss) reads as NaN
  int64_t valid = 0;
  int64_t tokens = 0;
  double step_ms = 0;
  double ring_wait_ms = 0;
  int64_t bytes_sent = 0;
  nlohmann::json cursor;  // the loader cursor after the step: an object, or null
  bool stop = false;      // some rank's ringd has a stop request (every rank passes it on)
  // The step's phases (optional; the per-rank summary of the step report, protocol::RankStep):
  double data_ms = 0;     // reading and packing the batch
  double compute_ms = 0;  // the rest: kernels and what is not waiting or sending
  double wait_ms = 0;     // blocked on a peer: ring receives and collectives
  double comm_ms = 0;     // blocked on sends and handing gradient buckets to ringd
  int64_t prev = -1;      // global rank this rank's ring receives from (-1: no ring)
};
using WorkerMessage = std::variant<Hello, Mapped, Init, Heartbeat, Bucket, Done>;

// ---- ringd -> worker ----------------------------------------------------------------------------

struct Welcome {
  std::string shm;         // POSIX shm name: "/" then 1..254 bytes without '/'
  int64_t start_step = 0;  // steps already done
  bool need_init = false;
  nlohmann::json cursor;  // an object, or null
};
struct Params {
  int64_t step = 0;
  int64_t changed = -1;  // -1: every weight; else the count of changed coordinates (<= n)
  bool stop = false;
};
struct Stop {
  std::string reason;
};
using RingdMessage = std::variant<Welcome, Params, Stop>;

// ---- the field tables, for documentation and tests ------------------------------------------

enum class FieldType { kInteger, kNumber, kBoolean, kString, kObjectOrNull };

struct FieldInfo {
  std::string key;
  FieldType type = FieldType::kInteger;
  bool required = true;
  // kInteger: the accepted range. bounded_by_n: hi is the model size n the reader is given.
  int64_t lo = 0, hi = 0;
  bool bounded_by_n = false;
  // kNumber: JSON null (how a NaN or infinity is written) reads as NaN; else must be finite.
  bool null_is_nan = false;
  bool non_negative = false;
  // kInteger: the value must equal lo (= hi): a version.
  bool version = false;
};

struct MessageInfo {
  std::string kind;  // the "t" value
  bool from_worker = true;  // worker -> ringd (else ringd -> worker)
  std::vector<FieldInfo> fields;
};

// Every message kind of both directions, in the order of the variants' alternatives.
const std::vector<MessageInfo>& message_table();

// Parse one line (without its '\n'). Throw ControlError.
WorkerMessage parse_worker_line(std::string_view line);
// n: floats in the worker's model layout (bounds Params.changed).
RingdMessage parse_ringd_line(std::string_view line, int64_t n);
// Same, from parsed JSON (no size check).
WorkerMessage worker_from_json(const nlohmann::json& j);
RingdMessage ringd_from_json(const nlohmann::json& j, int64_t n);

// JSON form of each message (with "t"); to_json(parse(x)) parses again to the same message.
nlohmann::json to_json(const WorkerMessage& m);
nlohmann::json to_json(const RingdMessage& m);
// The line on the socket: compact JSON and '\n'.
std::string encode(const WorkerMessage& m);
std::string encode(const RingdMessage& m);

}  // namespace ring::contract::control
