// The writer side of ring_checkpoint: registration, the writer thread, the before_modify guard,
// the commit by node 0 and retention. The on-disk format is in docs/checkpoints.md.
#include "common/checkpoint/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string_view>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/checkpoint/fsutil.h"
#include "common/checkpoint/internal.h"

namespace ring::ckpt {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

bool valid_tag(const std::string& t) {
  if (t.empty() || t.size() > 64) return false;
  for (char c : t)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

bool printable_name(const std::string& n) {
  if (n.empty() || n.size() > 256) return false;
  for (char c : n)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  return true;
}

constexpr uint64_t kAlign = 64;  // tensor offsets in the data file

}  // namespace

// ---- small public helpers ----------------------------------------------------------------

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kU64: return "u64";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& s) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8,
                  DType::kU64})
    if (s == dtype_name(t)) return t;
  return std::nullopt;
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI64: case DType::kU64: return 8;
    case DType::kU8: return 1;
  }
  return 1;
}

std::string xxh3_hex(const void* data, size_t bytes) { return hex16(XXH3_64bits(data, bytes)); }

std::string step_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return buf;
}

namespace detail {

std::string shard_manifest_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "node-%05d.json", r);
  return buf;
}
std::string shard_data_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "node-%05d.bin", r);
  return buf;
}
std::string shard_failed_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "node-%05d.failed", r);
  return buf;
}
std::string partial_dir_name(int64_t step, const std::string& tag) {
  return step_dir_name(step) + ".partial-" + tag;
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace detail

// ---- Checkpointer --------------------------------------------------------------------------

struct Checkpointer::Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const char* data;  // live memory, or null with `fill`
  size_t bytes;
  uint64_t offset;  // in the data file
  Fill fill;        // add_tensor_source: produces the bytes when they are written
};

Checkpointer::Checkpointer(Options opt) : opt_(std::move(opt)) {
  if (opt_.dir.empty()) throw CheckpointError("checkpoint dir: empty; give a directory");
  if (opt_.nodes < 1) throw CheckpointError("checkpoint nodes: " + std::to_string(opt_.nodes) +
                                            ", must be at least 1");
  if (opt_.node_rank < 0 || opt_.node_rank >= opt_.nodes)
    throw CheckpointError("checkpoint node_rank: " + std::to_string(opt_.node_rank) +
                          ", must be in [0, " + std::to_string(opt_.nodes) + ")");
  if (opt_.keep_last < 1)
    throw CheckpointError("checkpoint keep_last: " + std::to_string(opt_.keep_last) +
                          ", must be at least 1");
  if (!valid_tag(opt_.tag))
    throw CheckpointError("checkpoint tag: '" + opt_.tag +
                          "', must be 1-64 characters of [A-Za-z0-9_-]");
  if (opt_.chunk_bytes < 4096)
    throw CheckpointError("checkpoint chunk_bytes: " + std::to_string(opt_.chunk_bytes) +
                          ", must be at least 4096");
  if (!(opt_.commit_timeout_s > 0))
    throw CheckpointError("checkpoint commit_timeout_s: must be positive");
  if (opt_.layout) {
    // As it reads back (manifests are compared with node 0's record at the commit).
    if (opt_.layout->model.is_null()) opt_.layout->model = nlohmann::json::object();
    const Layout& l = *opt_.layout;
    if (l.nodes != opt_.nodes || l.ranges.size() != static_cast<size_t>(opt_.nodes))
      throw CheckpointError("checkpoint layout: " + std::to_string(l.nodes) + " nodes, " +
                            std::to_string(l.ranges.size()) + " ranges, the job has " +
                            std::to_string(opt_.nodes) + " nodes");
    // The record must read back: the reader's rules are the writer's.
    parse_layout(layout_json(l), "checkpoint layout");
  }
}

Checkpointer::~Checkpointer() {
  if (thread_.joinable()) thread_.join();
}

void Checkpointer::add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape,
                              const void* data) {
  register_tensor(name, dtype, std::move(shape), data, nullptr);
}

void Checkpointer::add_tensor_source(const std::string& name, DType dtype,
                                     std::vector<int64_t> shape, Fill fill) {
  if (!fill) throw CheckpointError("add_tensor_source '" + name + "': no fill function");
  if (opt_.chunk_bytes % dtype_size(dtype) != 0)
    throw CheckpointError("add_tensor_source '" + name + "': chunk_bytes " +
                          std::to_string(opt_.chunk_bytes) + " is not a multiple of " +
                          dtype_name(dtype) + "'s size");
  register_tensor(name, dtype, std::move(shape), nullptr, std::move(fill));
}

void Checkpointer::register_tensor(const std::string& name, DType dtype,
                                   std::vector<int64_t> shape, const void* data, Fill fill) {
  if (busy() || thread_.joinable()) {
    std::lock_guard lk(mu_);
    if (running_) throw CheckpointError("add_tensor '" + name + "': a checkpoint is in flight");
  }
  if (!printable_name(name))
    throw CheckpointError("add_tensor: name '" + name +
                          "' must be 1-256 printable characters");
  for (auto& t : tensors_)
    if (t->name == name) throw CheckpointError("add_tensor: '" + name + "' registered twice");
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw CheckpointError("add_tensor '" + name + "': negative dimension");
    if (d != 0 && n > (UINT64_MAX >> 4) / static_cast<uint64_t>(d))
      throw CheckpointError("add_tensor '" + name + "': size overflows");
    n *= static_cast<uint64_t>(d);
  }
  size_t bytes = n * dtype_size(dtype);
  if (bytes > 0 && !data && !fill) throw CheckpointError("add_tensor '" + name + "': null data");
  uint64_t off = 0;
  if (!tensors_.empty()) {
    auto& last = *tensors_.back();
    off = (last.offset + last.bytes + kAlign - 1) / kAlign * kAlign;
  }
  tensors_.push_back(std::make_unique<Tensor>(Tensor{
      name, dtype, std::move(shape), static_cast<const char*>(data), bytes, off, std::move(fill)}));
  if (!tensors_.back()->fill) by_addr_.push_back(static_cast<int>(tensors_.size() - 1));
  std::sort(by_addr_.begin(), by_addr_.end(),
            [&](int a, int b) { return tensors_[a]->data < tensors_[b]->data; });
  std::lock_guard lk(mu_);
  written_.assign(tensors_.size(), 0);
  staged_.resize(tensors_.size());
}

uint64_t Checkpointer::registered_bytes() const {
  uint64_t s = 0;
  for (auto& t : tensors_) s += t->bytes;
  return s;
}

void Checkpointer::start(int64_t step, nlohmann::json meta) {
  auto t0 = Clock::now();
  if (thread_.joinable()) thread_.join();  // the previous checkpoint's writer
  double waited = seconds_since(t0);
  if (step < 0) {
    std::lock_guard lk(mu_);
    SaveResult r;
    r.step = step;
    r.error = "checkpoint step " + std::to_string(step) + ": must be >= 0";
    done_.push_back(r);
    return;
  }
  {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      written_[i] = 0;
      staged_[i].clear();
    }
    staging_used_ = 0;
    inflight_tensor_ = -1;
    stall_s_ = 0;
    staged_bytes_ = 0;
    running_ = true;
  }
  active_.store(true, std::memory_order_release);
  thread_ = std::thread(
      [this, step, waited, m = std::move(meta)]() mutable { run(step, std::move(m), waited); });
}

void Checkpointer::run(int64_t step, nlohmann::json meta, double start_wait_s) {
  auto t0 = Clock::now();
  SaveResult r;
  r.step = step;
  r.start_wait_s = start_wait_s;
  r.path = fs::join(opt_.dir, detail::partial_dir_name(step, opt_.tag));
  bool shard_ok = false;
  try {
    write_shard(step, meta, r);
    shard_ok = true;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  finish_progress();  // from here on live memory is no longer read: release every guard
  r.write_s = seconds_since(t0);
  if (!shard_ok) {
    // Remove what this node wrote (best effort) so a full disk gets its space back; tell node 0.
    ::unlink(fs::join(r.path, detail::shard_data_name(opt_.node_rank)).c_str());
    ::unlink(fs::join(r.path, detail::shard_manifest_name(opt_.node_rank)).c_str());
    if (opt_.nodes > 1) {
      try {
        fs::write_atomic(r.path, detail::shard_failed_name(opt_.node_rank), r.error + "\n", false);
      } catch (...) {
      }
    }
    if (opt_.node_rank == 0 || opt_.nodes == 1) fs::remove_tree(r.path);
  } else if (opt_.node_rank == 0) {
    try {
      commit(step, r);
      r.ok = true;
      r.committed = true;
    } catch (const std::exception& e) {
      r.error = e.what();
      fs::remove_tree(r.path);
    }
  } else {
    r.ok = true;
  }
  r.total_s = seconds_since(t0);
  std::lock_guard lk(mu_);
  r.stall_s = stall_s_;
  r.staged_bytes = staged_bytes_;
  running_ = false;
  done_.push_back(std::move(r));
  cv_.notify_all();
}

void Checkpointer::finish_progress() {
  std::lock_guard lk(mu_);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    written_[i] = tensors_[i]->bytes;
    staged_[i].clear();
  }
  staging_used_ = 0;
  inflight_tensor_ = -1;
  active_.store(false, std::memory_order_release);
  cv_.notify_all();
}

void Checkpointer::write_shard(int64_t step, const nlohmann::json& meta, SaveResult& r) {
  const std::string& pdir = r.path;
  fs::mkdirs(pdir);
  const std::string man_name = detail::shard_manifest_name(opt_.node_rank);
  const std::string data_name = detail::shard_data_name(opt_.node_rank);
  const std::string data_path = fs::join(pdir, data_name);
  ::unlink(fs::join(pdir, man_name).c_str());  // a stale manifest of this node must not count
  ::unlink(fs::join(pdir, detail::shard_failed_name(opt_.node_rank)).c_str());

  uint64_t total = 0;
  if (!tensors_.empty()) total = tensors_.back()->offset + tensors_.back()->bytes;
  r.bytes = registered_bytes();

  int fd = ::open(data_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw CheckpointError(data_path + ": cannot create: " + fs::errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  // Reserve the space first: a full disk fails here, before anything is written.
  if (total > 0) {
    int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(total));
    if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
      throw CheckpointError(data_path + ": cannot reserve " + std::to_string(total) +
                            " bytes: " + fs::errno_text(errno));
  }

  const size_t nt = tensors_.size();
  std::vector<XXH3_state_t*> states(nt, nullptr);
  struct StateFree {
    std::vector<XXH3_state_t*>& s;
    ~StateFree() {
      for (auto* p : s) XXH3_freeState(p);
    }
  } state_free{states};
  for (size_t i = 0; i < nt; ++i) {
    states[i] = XXH3_createState();
    XXH3_64bits_reset(states[i]);
  }

  struct Piece {
    size_t begin, end;
    const char* src;
  };
  std::vector<Piece> pieces;
  std::unique_ptr<char[]> filled;  // one chunk of a source tensor (add_tensor_source)
  for (const auto& T : tensors_)
    if (T->fill && !filled) filled = std::make_unique<char[]>(opt_.chunk_bytes);
  size_t unflushed = 0;  // bytes written since writeback was last started
  for (;;) {
    // The tensor that is least far along (relative to its size) gets the next chunk.
    int t = -1;
    long double best = 2;
    for (size_t i = 0; i < nt; ++i) {
      if (written_[i] >= tensors_[i]->bytes) continue;  // only the writer changes written_
      long double f = static_cast<long double>(written_[i]) / tensors_[i]->bytes;
      if (f < best) best = f, t = static_cast<int>(i);
    }
    if (t < 0) break;
    const Tensor& T = *tensors_[t];
    size_t x, y;
    pieces.clear();
    {
      std::lock_guard lk(mu_);
      x = written_[t];
      y = std::min(T.bytes, x + opt_.chunk_bytes);
      inflight_tensor_ = t;
      inflight_begin_ = x;
      inflight_end_ = y;
      auto& st = staged_[t];
      auto it = st.upper_bound(x);
      if (it != st.begin()) --it;
      size_t cur = x;
      for (; it != st.end() && it->first < y; ++it) {
        size_t sb = std::max(it->first, x), se = std::min(it->second.end, y);
        if (se <= sb) continue;
        if (cur < sb) pieces.push_back({cur, sb, T.data + cur});
        pieces.push_back({sb, se, it->second.data.get() + (sb - it->first)});
        cur = se;
      }
      if (cur < y && !T.fill) pieces.push_back({cur, y, T.data + cur});
    }
    if (T.fill) {  // outside the lock: producing the bytes may take a while
      T.fill(x, y - x, filled.get());
      pieces.push_back({x, y, filled.get()});
    }
    for (const Piece& p : pieces) {
      fs::pwrite_all(fd, p.src, p.end - p.begin, T.offset + p.begin, data_path);
      XXH3_64bits_update(states[t], p.src, p.end - p.begin);
      unflushed += p.end - p.begin;
    }
    // Start writeback of what is written every 64 MiB, so the closing fdatasync waits for the
    // tail only and the writer is not throttled on the whole shard's dirty pages. Advisory: an
    // error shows again at fdatasync.
    if (opt_.fsync && unflushed >= (size_t{64} << 20)) {
      (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
      unflushed = 0;
    }
    {
      std::lock_guard lk(mu_);
      written_[t] = y;
      inflight_tensor_ = -1;
      auto& st = staged_[t];
      for (auto it = st.begin(); it != st.end() && it->second.end <= y;) {
        staging_used_ -= it->second.end - it->first;
        it = st.erase(it);
      }
    }
    cv_.notify_all();
  }
  if (opt_.fsync && ::fdatasync(fd) != 0)
    throw CheckpointError(data_path + ": fsync failed: " + fs::errno_text(errno));
  if (::close(fd) != 0) {
    closer.fd = -1;
    throw CheckpointError(data_path + ": close failed: " + fs::errno_text(errno));
  }
  closer.fd = -1;

  ShardManifest m;
  m.format_version = kFormatVersion;
  m.writer_version = kWriterVersion;
  m.step = step;
  m.spec_hash = opt_.spec_hash;
  m.node_rank = opt_.node_rank;
  m.nodes = opt_.nodes;
  m.tag = opt_.tag;
  m.data_file = data_name;
  m.data_bytes = total;
  m.time = detail::now_unix();
  m.meta = meta;
  m.layout = opt_.layout;
  m.has_lineage = true;
  m.parent = opt_.parent;
  for (size_t i = 0; i < nt; ++i) {
    const Tensor& T = *tensors_[i];
    m.tensors.push_back(
        {T.name, T.dtype, T.shape, T.offset, T.bytes, hex16(XXH3_64bits_digest(states[i]))});
  }
  fs::write_atomic(pdir, man_name, detail::shard_manifest_json(m).dump(1) + "\n", opt_.fsync);
}

void Checkpointer::commit(int64_t step, SaveResult& r) {
  const std::string& pdir = r.path;
  // Wait for every node's shard manifest (or its failure note).
  auto t0 = Clock::now();
  std::vector<std::string> texts(opt_.nodes);
  std::vector<ShardManifest> parsed(opt_.nodes);
  int have = 0;
  int sleep_ms = 5;
  std::vector<bool> got(opt_.nodes, false);
  while (have < opt_.nodes) {
    for (int n = 0; n < opt_.nodes; ++n) {
      if (got[n]) continue;
      std::string failed = fs::join(pdir, detail::shard_failed_name(n));
      if (fs::exists(failed)) {
        std::string why;
        try {
          why = fs::read_file(failed, 4096);
        } catch (...) {
        }
        while (!why.empty() && why.back() == '\n') why.pop_back();
        throw CheckpointError(step_dir_name(step) + ": node " + std::to_string(n) +
                              " failed to write its shard: " + why);
      }
      std::string path = fs::join(pdir, detail::shard_manifest_name(n));
      if (!fs::exists(path)) continue;
      texts[n] = fs::read_file(path, detail::kManifestLimit);
      ShardManifest sm = parse_shard_manifest(texts[n], path);
      if (sm.step != step || sm.tag != opt_.tag || sm.nodes != opt_.nodes || sm.node_rank != n)
        throw CheckpointError(path + ": belongs to another checkpoint (step " +
                              std::to_string(sm.step) + ", tag '" + sm.tag + "', nodes " +
                              std::to_string(sm.nodes) + "), expected step " +
                              std::to_string(step) + ", tag '" + opt_.tag + "'");
      if (sm.layout.has_value() != opt_.layout.has_value() ||
          (sm.layout && !(*sm.layout == *opt_.layout)))
        throw CheckpointError(
            path + ": records another layout than node 0's (" +
            (sm.layout ? describe_layout(*sm.layout) : std::string("none")) + ", node 0: " +
            (opt_.layout ? describe_layout(*opt_.layout) : std::string("none")) + ")");
      if (sm.parent != opt_.parent)
        throw CheckpointError(path + ": records another parent than node 0's (" +
                              (sm.parent ? describe_ref(*sm.parent) : std::string("none")) +
                              ", node 0: " +
                              (opt_.parent ? describe_ref(*opt_.parent) : std::string("none")) +
                              ")");
      parsed[n] = std::move(sm);
      got[n] = true;
      ++have;
    }
    if (have == opt_.nodes) break;
    if (seconds_since(t0) > opt_.commit_timeout_s) {
      std::string missing;
      for (int n = 0; n < opt_.nodes; ++n)
        if (!got[n]) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      throw CheckpointError(step_dir_name(step) + ": nodes " + missing +
                            " did not write their shard within " +
                            std::to_string(opt_.commit_timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 200);
  }

  nlohmann::json top;
  top["format"] = "ringmaster-checkpoint";
  top["format_version"] = kFormatVersion;
  top["writer_version"] = kWriterVersion;
  top["step"] = step;
  top["nodes"] = opt_.nodes;
  top["tag"] = opt_.tag;
  top["spec_hash"] = opt_.spec_hash;
  top["time"] = detail::now_unix();
  if (opt_.layout) top["layout"] = layout_json(*opt_.layout);
  top["parent"] = detail::parent_json(opt_.parent);
  auto shards = nlohmann::json::array();
  uint64_t total = 0;
  for (int n = 0; n < opt_.nodes; ++n) {
    const ShardManifest& sm = parsed[n];
    total += sm.data_bytes;
    shards.push_back({{"node_rank", n},
                      {"manifest", detail::shard_manifest_name(n)},
                      {"manifest_xxh3", xxh3_hex(texts[n].data(), texts[n].size())},
                      {"data_file", sm.data_file},
                      {"data_bytes", sm.data_bytes}});
  }
  top["shards"] = shards;
  top["data_bytes"] = total;
  fs::write_atomic(pdir, detail::kTopManifest, top.dump(1) + "\n", opt_.fsync);

  // Publish: the final name appears complete, in one rename.
  const std::string final_dir = fs::join(opt_.dir, step_dir_name(step));
  if (fs::exists(final_dir)) {
    // The same step written again: by a branch that resumed from an older step, or by a run that
    // started afresh. The earlier copy is not of this lineage: set it aside as superseded (kept
    // until retention removes it), since rename() will not replace a non-empty directory.
    const std::string aside = detail::superseded_dir_name(step, opt_.tag);
    if (::rename(final_dir.c_str(), fs::join(opt_.dir, aside).c_str()) != 0)
      throw CheckpointError(final_dir + ": cannot set the previous copy aside as " + aside + ": " +
                            fs::errno_text(errno));
    r.superseded = aside;
  }
  if (::rename(pdir.c_str(), final_dir.c_str()) != 0)
    throw CheckpointError(final_dir + ": rename from " + pdir + " failed: " +
                          fs::errno_text(errno));
  r.path = final_dir;
  if (opt_.fsync) fs::fsync_dir(opt_.dir);
  fs::write_atomic(opt_.dir, detail::kLatest, step_dir_name(step) + "\n", opt_.fsync);
  retain(step, r);
}

// Retention, along the lineage this commit made current: keep its newest keep_last complete
// checkpoints and delete its older ones; delete superseded checkpoints (off the lineage) once
// every kept one is newer; delete partial directories of other attempts at or below this step
// (never loadable). Damaged checkpoints are left for the operator.
//
// A checkpoint is deleted by renaming it out of the step names first (one rename), then
// removing the tree: a process killed in the middle leaves a `.ringmaster-deleting-step-...`
// directory (never listed, swept by the next retention), not a half-deleted checkpoint that
// reads as corrupt.
void Checkpointer::retain(int64_t step, SaveResult& r) {
  constexpr std::string_view kTrash = ".ringmaster-deleting-";
  {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(opt_.dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(kTrash, 0) == 0 && detail::parse_step_name(name.substr(kTrash.size())))
        fs::remove_tree(e.path().string());
    }
  }
  const std::vector<CheckpointInfo> all = list_checkpoints(opt_.dir, false);
  const std::vector<size_t> chain = current_lineage(all, step_dir_name(step));
  std::vector<bool> on_chain(all.size(), false);
  for (size_t i : chain) on_chain[i] = true;
  const auto remove = [&](const CheckpointInfo& c) {
    const std::string trash = fs::join(opt_.dir, std::string(kTrash) + c.name);
    std::error_code ec;
    std::filesystem::rename(c.path, trash, ec);
    fs::remove_tree(ec ? c.path : trash);
    r.deleted.push_back(c.name);
    auto sn = detail::parse_step_name(c.name);
    if (sn && !sn->partial && !sn->superseded) r.deleted_steps.push_back(c.step);
  };
  int64_t oldest_kept = step;
  int64_t kept = 0;
  for (size_t i : chain) {
    const CheckpointInfo& c = all[i];
    if (c.status != Status::kComplete) continue;
    if (kept < opt_.keep_last || c.step == step) {
      ++kept;
      oldest_kept = std::min(oldest_kept, c.step);
    } else {
      remove(c);
    }
  }
  for (size_t i = 0; i < all.size(); ++i) {
    const CheckpointInfo& c = all[i];
    auto sn = detail::parse_step_name(c.name);
    if (!sn) continue;
    if (sn->partial) {
      if (sn->tag != opt_.tag && sn->step <= step) remove(c);
      continue;
    }
    if (!on_chain[i] && c.status == Status::kComplete && c.step < oldest_kept) remove(c);
  }
}

void Checkpointer::before_modify(const void* p, size_t bytes) {
  if (!active_.load(std::memory_order_acquire) || bytes == 0) return;
  const char* a = static_cast<const char*>(p);
  const char* b = a + bytes;
  // Registered tensors overlapping [a, b), by address.
  auto it = std::upper_bound(by_addr_.begin(), by_addr_.end(), a,
                             [&](const char* v, int t) { return v < tensors_[t]->data; });
  if (it != by_addr_.begin()) --it;
  for (; it != by_addr_.end(); ++it) {
    const Tensor& T = *tensors_[*it];
    if (T.data >= b) break;
    const char* te = T.data + T.bytes;
    if (te <= a) continue;
    size_t lo = static_cast<size_t>(std::max(a, T.data) - T.data);
    size_t hi = static_cast<size_t>(std::min(b, te) - T.data);
    guard_tensor(*it, lo, hi);
  }
}

void Checkpointer::guard_tensor(int t, size_t a, size_t b) {
  std::unique_lock lk(mu_);
  auto t0 = Clock::now();
  bool slow = false;
  while (active_.load(std::memory_order_acquire)) {
    size_t a2 = std::max(a, written_[t]);
    if (a2 >= b) break;
    slow = true;
    if (inflight_tensor_ == t && inflight_begin_ < b && a2 < inflight_end_) {
      cv_.wait(lk);  // the writer is reading this range now
      continue;
    }
    // The parts of [a2, b) not staged yet.
    auto& st = staged_[t];
    std::vector<std::pair<size_t, size_t>> gaps;
    size_t cur = a2;
    auto s = st.upper_bound(a2);
    if (s != st.begin()) --s;
    for (; s != st.end() && s->first < b; ++s) {
      if (s->second.end <= cur) continue;
      if (s->first > cur) gaps.emplace_back(cur, s->first);
      cur = std::max(cur, s->second.end);
    }
    if (cur < b) gaps.emplace_back(cur, b);
    size_t need = 0;
    for (auto& g : gaps) need += g.second - g.first;
    if (need == 0) break;
    if (staging_used_ + need <= opt_.staging_bytes) {
      const char* base = tensors_[t]->data;
      for (auto& g : gaps) {
        Staged sg{g.second, std::make_unique<char[]>(g.second - g.first)};
        std::memcpy(sg.data.get(), base + g.first, g.second - g.first);
        st.emplace(g.first, std::move(sg));
      }
      staging_used_ += need;
      staged_bytes_ += need;
      break;
    }
    cv_.wait(lk);  // no staging room: wait for the writer to pass (and free staging)
  }
  if (slow) stall_s_ += seconds_since(t0);
}

std::optional<SaveResult> Checkpointer::poll() {
  std::lock_guard lk(mu_);
  if (done_.empty()) return std::nullopt;
  SaveResult r = std::move(done_.front());
  done_.pop_front();
  return r;
}

SaveResult Checkpointer::wait() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  if (done_.empty()) {
    SaveResult r;
    r.error = "no checkpoint started";
    return r;
  }
  SaveResult r = std::move(done_.back());
  done_.clear();
  return r;
}

std::vector<SaveResult> Checkpointer::drain() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  std::vector<SaveResult> out(std::make_move_iterator(done_.begin()),
                              std::make_move_iterator(done_.end()));
  done_.clear();
  return out;
}

}  // namespace ring::ckpt
