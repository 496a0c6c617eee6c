// ring_checkpoint: sharded, asynchronous, checksummed checkpoints and their loading.
//
// On disk (format reference: docs/checkpoints.md):
//
//   DIR/step-00000050/            one directory per step, complete once renamed to this name
//        checkpoint.json          written by node 0 last: step, nodes, each shard manifest's xxh3
//        node-00000.json          node 0's shard manifest: tensors (name, dtype, shape, offset,
//        node-00000.bin             bytes, xxh3-64), free JSON metadata (cursor, RNG, ...)
//        node-00001.json / .bin   node 1's shard, ...
//   DIR/step-00000060.partial-<tag>/   being written (or left by a crash); never loaded
//   DIR/step-00000040.superseded-<tag>/  a step written again by a later branch, set aside
//   DIR/latest                    "step-00000050\n" (the head of the current lineage) or "none\n"
//                                 (a fresh run: no checkpoint yet), replaced atomically
//
// Lineage: every checkpoint records its attempt's tag and `parent`, the checkpoint that attempt
// resumed from (null: it started from nothing). The current lineage is the head named by
// `latest`, the checkpoints of its attempt at or below it, then its parent and so on. Loading,
// `latest` and retention follow only that chain; a checkpoint off it is superseded (a branch
// abandoned by a resume from an older step, or an earlier run's) and kept until retention
// removes it (once every kept checkpoint of the lineage is newer).
//
// Writing (Checkpointer): each node writes its shard into the shared partial directory, fsyncs
// the data file, then writes its manifest (temp + rename, fsynced). Node 0 then waits for every
// node's manifest, writes checkpoint.json, fsyncs, renames the partial directory to its final
// name, fsyncs DIR, replaces `latest` and applies keep_last retention (complete checkpoints only).
//
// Asynchronous without a second copy of the optimizer state: the writer thread writes the
// registered tensors straight from live memory, chunk by chunk, advancing through all tensors
// at the same relative position (so w, m and v of one bucket are written close together). The
// optimizer calls before_modify() on a range before changing it: a range already written
// returns at once; a range not yet reached is copied into a small staging buffer (bounded by
// Options::staging_bytes) that the writer then uses instead; a range the writer is reading right
// now, or one that does not fit in the staging budget, blocks until the writer has passed it.
// That blocked time is the training stall and is reported in SaveResult.
//
//   ring::ckpt::Checkpointer ck({.dir = "/ckpt", .keep_last = 3, .node_rank = 0, .nodes = 1});
//   ck.add_tensor("master", ring::ckpt::DType::kF32, {n}, w.data());   // once, stable pointers
//   ck.add_tensor("adam.m", ring::ckpt::DType::kF32, {n}, m.data());
//   ...
//   ck.start(step, {{"cursor", cursor_json}, {"rng", rng_json}});      // returns at once
//   ... in the optimizer, per bucket:  ck.before_modify(w.data() + b0, (b1 - b0) * 4);
//   SaveResult r = ck.wait();   // or poll(); r.ok, r.error, r.path, r.stall_s
//
// Loading: load_latest() tries complete checkpoints from the newest down; a missing file, a
// truncated or malformed manifest, a size or checksum mismatch makes it say what is wrong
// (file and rule) in LoadResult::skipped and fall back to the previous complete one. Tensors are
// found by name in whichever shard holds them, so a checkpoint written by N nodes loads on M
// (per-node tensors follow the rule of LoadTarget::per_node); format 1 checkpoints (flat
// tensors) load by slicing (LoadTarget::flat_name).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace ring::ckpt {

// 2: the shard layout record (Layout) in checkpoint.json and every shard manifest; format 1
// checkpoints (no layout) are still read.
inline constexpr int kFormatVersion = 2;
inline constexpr const char* kWriterVersion = "ringmaster 0.1.0";

// Bad input (a path, a registration, a manifest) or an I/O failure; the message names the file
// or the argument and the rule broken.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A sound checkpoint that does not fit this job (tensor missing, other shape or dtype, other
// node count): loading stops instead of falling back, since older ones would not fit either.
class CheckpointMismatch : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

enum class DType { kF32, kF16, kBF16, kI32, kI64, kU8, kU64 };
const char* dtype_name(DType t);            // "f32", "f16", "bf16", "i32", "i64", "u8", "u64"
std::optional<DType> parse_dtype(const std::string& s);
size_t dtype_size(DType t);

// xxh3-64 of bytes, as 16 lower-case hex digits (the manifest's checksum form).
std::string xxh3_hex(const void* data, size_t bytes);
std::string step_dir_name(int64_t step);  // "step-00000050"

// One node's part of the writer's flat parameter layout (contract::NodeRange): floats
// [begin, end), gradient buckets [first_bucket, end_bucket).
struct LayoutRange {
  int node = 0;
  int64_t begin = 0, end = 0;
  int first_bucket = 0, end_bucket = 0;
  bool operator==(const LayoutRange&) const = default;
};

// How the job that wrote a checkpoint divided its state (format 2): recorded in checkpoint.json
// and every shard manifest as the `layout` object, so a reader can tell the node count, shard
// mode and model apart without knowing the flat layout. The library only records and compares
// it; ringd fills it (daemon/ringd/checkpoints.h checkpoint_layout).
struct Layout {
  std::string shard;                // the writer's parallel.shard: "none", "optimizer"
  // Where the writer kept the top-k residual: "owner" (one copy, residual/<param> in the shard of
  // the range that holds the parameter, like the master), "per_node" (every node saved its own
  // residual/<param> of every parameter), "" (no residual, or not recorded). Optional in the
  // record: a reader tells the two apart by how many shards hold a residual tensor.
  std::string residual;
  int nodes = 0;                    // = ranges.size()
  std::vector<LayoutRange> ranges;  // node order, covering [0, total_floats)
  int64_t total_floats = 0;         // the flat layout's size (alignment gaps included)
  nlohmann::json model;             // the model config (object): layers, d_model, heads, ...
};
bool operator==(const Layout& a, const Layout& b);
nlohmann::json layout_json(const Layout& l);
// Strict: every key's type and range checked; throws CheckpointError naming `file` and the key.
Layout parse_layout(const nlohmann::json& j, const std::string& file);
// "2 nodes, shard optimizer".
std::string describe_layout(const Layout& l);

// A checkpoint's place in its lineage: the tag of the attempt that wrote it, and its step.
struct CheckpointRef {
  std::string tag;
  int64_t step = -1;
  bool operator==(const CheckpointRef&) const = default;
};
std::string describe_ref(const CheckpointRef& r);  // "step 50 (tag r1a2b3c4d-2)"

struct Options {
  std::string dir;             // checkpoint root (created when missing)
  int64_t keep_last = 3;       // complete checkpoints kept after a commit (>= 1)
  int node_rank = 0;           // this node, 0 <= node_rank < nodes
  int nodes = 1;
  std::string tag = "0";       // the attempt: names the partial directory ([A-Za-z0-9_-]+);
                               // ringd's carry the run id ("<run>-<attempt>")
  // The checkpoint this attempt resumed from (nullopt: it started from nothing), recorded as
  // `parent` in every checkpoint it writes.
  std::optional<CheckpointRef> parent;
  std::string spec_hash;       // recorded in every manifest (free form, e.g. xxh3 of the spec)
  size_t chunk_bytes = 4 << 20;      // unit of writing and of progress
  size_t staging_bytes = 16 << 20;   // copy-on-modify budget (not per tensor: in all)
  double commit_timeout_s = 600;     // node 0: how long to wait for the other nodes' shards
  bool fsync = true;                 // false only for tests/benchmarks on tmpfs
  // The job's layout, recorded in every manifest (nullopt: none; layout.nodes must equal nodes).
  std::optional<Layout> layout;
};

struct SaveResult {
  bool ok = false;
  bool committed = false;      // node 0 only: the step directory is final and `latest` names it
                               // (other nodes return once their shard is durable)
  int64_t step = -1;
  std::string path;            // final directory (ok) or the partial one (failed)
  std::string error;           // why it failed: names the file and the errno text
  uint64_t bytes = 0;          // this node's data bytes
  double write_s = 0;          // start() to the shard being durable
  double total_s = 0;          // start() to done (includes waiting for other nodes, commit)
  double stall_s = 0;          // time before_modify() blocked, summed over calls
  double start_wait_s = 0;     // time start() waited for the previous checkpoint to finish
  uint64_t staged_bytes = 0;   // bytes copied to staging by before_modify()
  std::vector<std::string> deleted;  // directories removed by retention
  std::vector<int64_t> deleted_steps;  // of those, the steps whose `step-N` directory went
  std::string superseded;      // an earlier copy of this step set aside ("" : none)
};

class Checkpointer {
 public:
  explicit Checkpointer(Options opt);  // throws CheckpointError on bad options
  ~Checkpointer();                     // waits for a checkpoint in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Registers live memory saved by every checkpoint, in registration order. `data` must stay
  // valid and at the same address for the Checkpointer's life; bytes = product(shape) *
  // dtype_size. Names are unique, non-empty, printable. Not while a checkpoint is in flight.
  void add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                  const void* data);

  // Registers a tensor whose bytes are produced when written instead of read from live memory:
  // fill(offset, bytes, out) writes bytes [offset, offset + bytes) of the tensor to `out`
  // (offset and bytes multiples of the dtype's size, bytes <= Options::chunk_bytes). Called on
  // the writer thread, chunk by chunk, once per checkpoint; an exception it throws fails that
  // checkpoint with its message. For data held elsewhere in another form (an import converting
  // its source files): no copy of the whole tensor exists. before_modify does not apply.
  using Fill = std::function<void(uint64_t offset, uint64_t bytes, void* out)>;
  void add_tensor_source(const std::string& name, DType dtype, std::vector<int64_t> shape,
                         Fill fill);

  // Begins a checkpoint of the registered tensors as they are now, plus `meta` (free JSON: the
  // loader cursor, RNG state, ...). Waits first for a previous one still in flight. Returns at
  // once; the writer thread does the rest. Never throws for I/O: failures land in SaveResult.
  void start(int64_t step, nlohmann::json meta = nlohmann::json::object());

  // The guard: call before modifying [p, p + bytes) of a registered tensor. Cheap (one atomic
  // load) when no checkpoint is in flight. Memory outside registered tensors is ignored.
  void before_modify(const void* p, size_t bytes);

  bool busy() const { return active_.load(std::memory_order_acquire); }
  // Results of finished checkpoints, oldest first, each returned once; nullopt when none is
  // waiting (a checkpoint in flight, or nothing new).
  std::optional<SaveResult> poll();
  // Blocks until the checkpoint in flight (if any) is done; returns the newest result not yet
  // returned (older unreturned ones are dropped), or ok=false with error "no checkpoint started".
  SaveResult wait();
  // Blocks until the checkpoint in flight (if any) is done, commit included (busy() turns false
  // once live memory is no longer read, before node 0 commits); returns every result not yet
  // returned, oldest first.
  std::vector<SaveResult> drain();

  const Options& options() const { return opt_; }
  uint64_t registered_bytes() const;

 private:
  struct Tensor;
  void register_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                       const void* data, Fill fill);
  struct Staged {
    size_t end;                 // [begin (map key), end) in tensor bytes
    std::unique_ptr<char[]> data;
  };
  void run(int64_t step, nlohmann::json meta, double start_wait_s);
  void write_shard(int64_t step, const nlohmann::json& meta, SaveResult& r);
  void commit(int64_t step, SaveResult& r);
  void retain(int64_t step, SaveResult& r);
  void finish_progress();
  void guard_tensor(int t, size_t a, size_t b);

  Options opt_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
  std::vector<int> by_addr_;          // tensor indices sorted by address (before_modify lookup)
  std::atomic<bool> active_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Writer progress, guarded by mu_.
  std::vector<size_t> written_;       // per tensor: bytes [0, written_) are on disk
  int inflight_tensor_ = -1;          // the chunk the writer is reading: tensor, [begin, end)
  size_t inflight_begin_ = 0, inflight_end_ = 0;
  std::vector<std::map<size_t, Staged>> staged_;
  size_t staging_used_ = 0;
  double stall_s_ = 0;
  uint64_t staged_bytes_ = 0;
  std::thread thread_;
  std::deque<SaveResult> done_;       // guarded by mu_
  bool running_ = false;              // guarded by mu_: the writer thread has not finished
};

// ---- reading ------------------------------------------------------------------------------

struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // in the node's .bin file
  uint64_t bytes = 0;
  std::string xxh3;     // 16 hex digits
};

struct ShardManifest {
  int format_version = 0;
  std::string writer_version;
  int64_t step = -1;
  std::string spec_hash;
  int node_rank = 0;
  int nodes = 0;
  std::string tag;
  std::string data_file;     // "node-00000.bin", relative to the step directory
  uint64_t data_bytes = 0;
  double time = 0;           // unix seconds when the shard was done
  std::vector<TensorEntry> tensors;
  nlohmann::json meta;
  std::optional<Layout> layout;  // format 2 with a layout record
  bool has_lineage = false;      // `parent` recorded (null or an object)
  std::optional<CheckpointRef> parent;
};

// Parses and checks a shard manifest's text; throws CheckpointError naming `file` and the rule
// (missing key, wrong type, overlapping tensors, sizes that do not add up, ...).
ShardManifest parse_shard_manifest(const std::string& text, const std::string& file);

enum class Status { kComplete, kIncomplete, kCorrupt };
const char* status_name(Status s);  // "complete", "incomplete", "corrupt"

struct CheckpointInfo {
  std::string path;     // the step directory
  std::string name;     // its basename
  int64_t step = -1;
  std::string tag;      // the attempt that wrote it ("" when unreadable)
  bool has_lineage = false;              // its `parent` is recorded (a writer with lineage)
  std::optional<CheckpointRef> parent;   // the checkpoint its attempt resumed from
  // Complete, but not of the current lineage (an abandoned branch or an earlier run), or set
  // aside as step-N.superseded-<tag>: never loaded by a resume, kept until retention removes it.
  bool superseded = false;
  bool in_lineage = false;  // on the current lineage's chain
  Status status = Status::kCorrupt;
  std::vector<std::string> problems;  // each names the file and what is wrong
  int nodes = 0;
  uint64_t bytes = 0;   // data bytes of all shards
  double time = 0;      // unix seconds of the commit (0 when unknown)
  bool latest = false;  // `latest` names it
  int format_version = 0;        // of checkpoint.json (0 when unknown)
  std::optional<Layout> layout;  // the writer's layout (format 2), when recorded
};

// Lists step directories under dir (complete, partial and damaged), oldest step first. With
// verify, every data file is read and every tensor's checksum compared; without, manifests,
// file presence and sizes are checked. Throws CheckpointError when dir cannot be read.
std::vector<CheckpointInfo> list_checkpoints(const std::string& dir, bool verify);
CheckpointInfo inspect_checkpoint(const std::string& step_dir, bool verify);

// The current lineage of `all` (list_checkpoints' result) as indices into it, newest first:
// the head `latest` names ("" : `latest` is missing, the newest committed step is the head;
// "none": empty), the checkpoints of the head's attempt at or below it, then its parent's, and
// so on. Checkpoints written before lineage was recorded continue the chain by step order.
std::vector<size_t> current_lineage(const std::vector<CheckpointInfo>& all,
                                    const std::string& latest);
// The content of DIR/latest without its newline ("" when missing or unreadable).
std::string read_latest(const std::string& dir);
// Moves the head of the lineage: DIR/latest names `step_dir_name` ("none": no checkpoint yet),
// replaced atomically. Throws CheckpointError naming the file.
void set_latest(const std::string& dir, const std::string& name, bool fsync = true);

struct LoadTarget {
  LoadTarget() = default;
  LoadTarget(std::string n, DType t, std::vector<int64_t> s, void* d)
      : name(std::move(n)), dtype(t), shape(std::move(s)), data(d) {}

  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  void* data = nullptr;  // product(shape) * dtype_size bytes
  // Every node of the writer saved its own (ringd: the top-k residual). Same node count as the
  // writer: this node's own shard's. Another node count: node 0 gets the sum over all the
  // writer's nodes (f32 only, added in node order), the other nodes zeros, so the total owed
  // to the model is kept. Not per_node: the copy in whichever shard holds the name (this node's
  // own shard first).
  bool per_node = false;
  // Format 1 (flat tensors): when no shard has `name`, the elements [flat_offset, flat_offset +
  // product(shape)) of the flat tensor `flat_name` ("" : none) are loaded instead.
  std::string flat_name;
  int64_t flat_offset = 0;  // elements
};

struct LoadResult {
  bool loaded = false;           // false: no usable checkpoint (targets may hold partial data)
  int64_t step = -1;
  std::string path;
  std::string spec_hash;
  nlohmann::json meta;
  std::vector<std::string> skipped;  // "step-00000050: node-00000.bin: tensor 'adam.m' ..."
  std::string message;               // one line for the log: what was loaded, what was skipped
  int nodes = 0;                     // the writer's node count
  int format_version = 0;
  std::optional<Layout> layout;          // the writer's layout (format 2)
  std::vector<std::string> shards_read;  // the data files this node read
  std::string tag;                       // the loaded checkpoint's attempt tag
  std::string name;                      // its directory's name
  // Complete checkpoints in dir that are not of the current lineage (never loaded).
  int superseded = 0;
};

// Loads the targets of node `node_rank` of `nodes` from the newest complete checkpoint of the
// current lineage (current_lineage) with step <= max_step, whatever node count wrote it: each target is looked up by name in the shards
// (LoadTarget says which), and only the data files holding a needed tensor are read, every
// checksum verified; falls back to older ones on damage. A checkpoint that does not fit the job
// is a hard error, not a fallback (older ones would not fit either): throws CheckpointMismatch
// naming the tensor (missing, other shape or dtype) or, with `job`, the model config that
// differs from job->model (format 2), or a flat tensor that is not job->total_floats long
// (format 1). Several nodes agree on a step by calling again with max_step = the smallest step
// loaded.
LoadResult load_latest(const std::string& dir, int node_rank, int nodes,
                       const std::vector<LoadTarget>& targets, int64_t max_step = INT64_MAX,
                       const Layout* job = nullptr);

// Loads the targets from the checkpoint at `path` (model.init_from): a step directory (it holds
// checkpoint.json; named step-N) loads exactly that step; any other directory is a checkpoint
// root and loads its newest complete step, as load_latest. Throws CheckpointError naming the path
// when it is not a directory or nothing loads (with what was skipped), CheckpointMismatch as
// load_latest. The result has loaded == true.
LoadResult load_from_path(const std::string& path, int node_rank, int nodes,
                          const std::vector<LoadTarget>& targets, const Layout* job = nullptr);

}  // namespace ring::ckpt
