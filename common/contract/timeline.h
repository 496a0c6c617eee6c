// The per-rank phase timeline and flight recorder: a fixed-size file that ringd creates (one per
// worker: in /dev/shm, a tmpfs, so that records never cause disk writeback; else in its private
// control directory) and both map. The worker's
// main thread appends one record per finished phase (data, forward/backward of a layer, each
// ring hop's send, receive and wait, each gradient bucket handed to ringd, collectives) into a
// ring of kCapacity records, and keeps in the header what it is doing right now (the wait it is
// blocked in, a progress counter and its time). ringd reads the file whenever it likes: the
// records of a worker that was SIGSTOPped, whose main thread is stuck, or that died are still
// there (the flight recorder of a hang), and nothing is asked of the worker.
//
//   TimelineWriter w;                       // worker: maps the file ringd created
//   w.open(path, rank);
//   int64_t t0 = now_ns();  ...  w.record({.kind = Phase::kForward, .step = s, .layer = l,
//                                          .begin_ns = t0, .end_ns = now_ns()});
//   TimelineFile f = read_timeline(path);  // ringd, ringctl tests: header and valid records
//
// No allocation per record: a record is a fixed slot written under a per-slot sequence number
// (odd while being written), so a reader never takes a torn record. Times are CLOCK_MONOTONIC
// nanoseconds (the node's steady clock: comparable between the ranks of one node); the header
// keeps a (monotonic, Unix) pair taken at open so that a trace can place nodes on one time axis.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ring::contract::timeline {

inline constexpr uint64_t kMagic = 0x314E4C454D495452ull;  // "RTIMELN1" (bytes, little endian)
inline constexpr uint32_t kVersion = 1;
// Records per rank: 64 B each, 4 MiB per file. A step of a model of L layers on a ring of P
// ranks writes about L x (6P + 4) records, so this keeps the last 32 steps of 80 layers x 8 ranks.
inline constexpr uint64_t kCapacity = 65536;

enum class Phase : uint16_t {
  kNone = 0,
  kStep = 1,         // the worker's whole step (params received -> done sent)
  kData = 2,         // reading and packing the step's sequences (and an injected debug delay)
  kForward = 3,      // one layer's forward (layer)
  kBackward = 4,     // one layer's backward (layer)
  kRingSend = 5,     // a hop's send: posted -> completed, as the progress engine saw it (layer,
                     // hop, peer = receiver, bytes)
  kRingRecv = 6,     // a hop's receive: posted -> completed (layer, hop, peer = sender, bytes)
  kRingWait = 7,     // blocked waiting for a hop's receive (layer, hop, peer = sender)
  kHandover = 8,     // a gradient bucket copied into ringd's slot (layer = bucket index, bytes)
  kCollective = 9,   // a collective over all ranks (the loss all_gather, the label count)
  kExchange = 10,    // ringd: exchange between nodes
  kOptimizer = 11,   // ringd: the optimizer's end of the step (exposed part)
  kCheckpoint = 12,  // ringd: a checkpoint write (step)
  kParamsWait = 13,  // waiting for ringd's weights of the next step
  kDecode = 14,      // generation: one decode step of the batch (step = the decode step, 1..)
  kHeadAllToAll = 15,  // head-parallel attention: an all-to-all inside the head group (layer,
                       // peer = the group's first rank, hop = the group's size)
  kMax = 16,
};
// "forward", "ring_recv", ... (the trace's event names); "?" for an unknown value.
const char* phase_name(Phase p);
const char* phase_name(uint16_t p);

struct Record {
  std::atomic<uint64_t> seq;  // (index + 1) * 2 when valid, odd while being written, 0: empty
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  int64_t step = 0;
  int64_t bytes = 0;
  uint16_t kind = 0;
  int16_t hop = -1;
  int32_t layer = -1;
  int32_t peer = -1;
  uint32_t pad0 = 0;
  int64_t pad1 = 0;
};
static_assert(sizeof(Record) == 64);

// One record's values (what a writer passes and a reader gets back).
struct Event {
  Phase kind = Phase::kNone;
  int64_t step = 0;
  int32_t layer = -1;
  int16_t hop = -1;
  int32_t peer = -1;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  int64_t bytes = 0;
};

// What the worker is doing now (the flight recorder's "where"), written under `seq` (odd while
// being changed).
struct Current {
  std::atomic<uint64_t> seq;
  uint16_t kind = 0;  // the wait it is blocked in: kRingWait (receive), kRingSend (send),
                      // kCollective, kParamsWait; kNone: not waiting on a peer
  int16_t hop = -1;
  int32_t layer = -1;
  int32_t peer = -1;
  uint32_t pad = 0;
  int64_t step = 0;
  int64_t since_ns = 0;
};

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t capacity;
  int64_t rank;
  int64_t pid;
  int64_t clock_mono_ns;  // a (monotonic, Unix) pair from the writer's open
  int64_t clock_unix_ns;
  std::atomic<uint64_t> next;        // records written so far (the slot is next % capacity)
  std::atomic<uint64_t> progress;    // the main thread's progress counter (every phase end)
  std::atomic<int64_t> progress_ns;  // when it last advanced
  std::atomic<int64_t> step;         // the step the worker is in (0: none yet)
  Current current;
};
inline constexpr size_t kHeaderBytes = 4096;
static_assert(sizeof(Header) <= kHeaderBytes);
inline constexpr size_t kFileBytes = kHeaderBytes + kCapacity * sizeof(Record);

static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int64_t>::is_always_lock_free,
              "the timeline's atomics live in shared memory: they must be lock-free");

// CLOCK_MONOTONIC, nanoseconds.
int64_t now_ns();
// CLOCK_REALTIME, nanoseconds.
int64_t unix_ns();

// ringd: creates the file at `path` for `rank`: new (O_EXCL, O_NOFOLLOW), 0600, zeroed, header
// written; a regular file of ours already there (an earlier attempt's) is replaced, anything
// else (a symbolic link, another user's file) refused. Returns "" or the error.
std::string create_file(const std::string& path, int64_t rank);

// The writer side (the worker). Single writer: the main thread.
class TimelineWriter {
 public:
  TimelineWriter() = default;
  ~TimelineWriter();
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  // Maps the file ringd created (checks magic, version, size and rank). Returns "" or the error.
  std::string open(const std::string& path, int64_t rank, int64_t pid);
  bool active() const { return h_ != nullptr && enabled_; }
  // Recording on or off (the overhead benchmark). The progress counter and `current` go on.
  void set_enabled(bool on) { enabled_ = on; }

  void record(const Event& e);
  void set_step(int64_t step);
  int64_t step() const { return step_; }
  // The main thread blocks on a peer from now (kRingWait, kCollective, kParamsWait ...).
  void wait_begin(Phase kind, int64_t step, int32_t layer, int16_t hop, int32_t peer);
  void wait_end();
  void progress();

 private:
  Header* h_ = nullptr;
  Record* recs_ = nullptr;
  bool enabled_ = true;
  int64_t step_ = 0;
};

// The process's writer (the worker sets it up once; null: no timeline). Instrumented code calls
// through it so that the model and ring attention need no extra parameter.
TimelineWriter* active();
void set_active(TimelineWriter* w);

// A snapshot of a file (the reader side: ringd, tests).
struct Snapshot {
  bool ok = false;
  std::string error;
  int64_t rank = -1;
  int64_t pid = 0;
  int64_t clock_mono_ns = 0, clock_unix_ns = 0;
  uint64_t progress = 0;
  int64_t progress_ns = 0;
  int64_t step = 0;
  Event current;              // kind kNone: not waiting
  std::vector<Event> events;  // valid records, oldest first
};
// Reads the file at `path`; `min_step` > 0 keeps only records of steps >= min_step.
Snapshot read_file(const std::string& path, int64_t min_step = 0);
// Same from a mapping of kFileBytes (ringd keeps one per worker).
Snapshot read_mapped(const void* base, int64_t min_step = 0);

// A read-only mapping of a timeline file that outlives the worker (ringd keeps one per rank).
class Mapping {
 public:
  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  std::string open(const std::string& path);
  const void* data() const { return base_; }
  bool valid() const { return base_ != nullptr; }

 private:
  void* base_ = nullptr;
};

}  // namespace ring::contract::timeline
