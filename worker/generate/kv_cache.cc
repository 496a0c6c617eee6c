#include "worker/generate/kv_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "common/numeric/bf16.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "worker/data/shuffle.h"

namespace ring::gen {
namespace {

using data::mix64;

constexpr int64_t kOsPage = 4096;

}  // namespace

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kFast: return "fast";
    case Tier::kHost: return "host";
    case Tier::kDisk: return "disk";
  }
  return "?";
}

void CacheConfig::check() const {
  if (page_tokens < 16 || page_tokens > (1 << 20))
    throw GenerateError(fmt::format("page_tokens {} must be in [16, 1048576]", page_tokens));
  if (fast_bytes < 0) throw GenerateError("fast_bytes must be >= 0");
  if (host_bytes < 0) throw GenerateError("host_bytes must be >= 0 (0: no limit)");
  if (window < -1) throw GenerateError("window must be >= 0 tokens (or -1: one page)");
  if (!(mass_decay >= 0.0 && mass_decay <= 1.0))
    throw GenerateError("mass_decay must be in [0, 1]");
  if (dtype != kernels::DType::kF32 && dtype != kernels::DType::kBF16)
    throw GenerateError("the KV cache's dtype must be fp32 or bf16");
}

void PrefixHash::add(int32_t id, int32_t doc) {
  const uint64_t x = (static_cast<uint64_t>(static_cast<uint32_t>(id)) << 32) |
                     static_cast<uint32_t>(doc);
  a_ = mix64(a_ ^ x);
  b_ = mix64(b_ + x * 0xff51afd7ed558ccdULL + 1);
}

void PrefixHash::add(const PrefixHash& prefix, int64_t position) {
  auto lo = [](uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); };
  auto hi = [](uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v >> 32)); };
  add(lo(prefix.a_), hi(prefix.a_));
  add(lo(prefix.b_), hi(prefix.b_));
  const uint64_t p = static_cast<uint64_t>(position);
  add(lo(p), hi(p));
}

PageKey PrefixHash::key(int layer, int head) const {
  const uint64_t lh = (static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(head);
  return PageKey{mix64(a_ ^ mix64(lh)), mix64(b_ ^ mix64(lh + 0x5555))};
}

KvCache::KvCache(const CacheConfig& config, int layers, int kv_heads, int64_t head_dim,
                 kernels::Backend* device)
    : config_(config), layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), device_(device) {
  config_.check();
  fast_slots_ = config_.fast_bytes / page_bytes();
  if (fast_slots_ > 0 && device_ != nullptr) {
    // The device fast tier: the pool and the rows' document ids in the backend's memory.
    void* pool = nullptr;
    void* docs = nullptr;
    const size_t pool_bytes = static_cast<size_t>(fast_slots_ * page_bytes());
    const size_t doc_bytes = static_cast<size_t>(fast_slots_ * config_.page_tokens) * 4;
    kernels::Status st = device_->alloc(pool_bytes, &pool);
    if (st == kernels::Status::kOk) st = device_->alloc(doc_bytes, &docs);
    if (st != kernels::Status::kOk) {
      const std::string why = device_->last_error();
      if (pool != nullptr) device_->free(pool);
      throw GenerateError(fmt::format(
          "cannot allocate the fast tier ({} bytes, fast_bytes) on the {} backend: {}{}",
          pool_bytes + doc_bytes, device_->name(), kernels::status_string(st),
          why.empty() ? "" : " (" + why + ")"));
    }
    fast_pool_ = static_cast<char*>(pool);
    fast_docs_ = static_cast<int32_t*>(docs);
    fast_owner_.assign(static_cast<size_t>(fast_slots_), -1);
    for (int64_t s = fast_slots_ - 1; s >= 0; --s) fast_free_.push_back(s);
  } else if (fast_slots_ > 0) {
    void* p = std::aligned_alloc(64, static_cast<size_t>(fast_slots_ * page_bytes()));
    if (p == nullptr)
      throw GenerateError(fmt::format("cannot allocate the fast tier ({} bytes)",
                                      fast_slots_ * page_bytes()));
    fast_pool_ = static_cast<char*>(p);
    fast_owner_.assign(static_cast<size_t>(fast_slots_), -1);
    for (int64_t s = fast_slots_ - 1; s >= 0; --s) fast_free_.push_back(s);
  }
  disk_slot_bytes_ = (page_bytes() + kOsPage - 1) / kOsPage * kOsPage;
}

KvCache::~KvCache() {
  // Device tier: copies in flight read host and disk buffers and write the pool: let them
  // finish before anything is unmapped or freed.
  if (device_ != nullptr) device_->offload_wait();
  for (char* p : disk_map_)
    if (p != nullptr) ::munmap(p, static_cast<size_t>(disk_slot_bytes_));
  if (disk_fd_ >= 0) ::close(disk_fd_);  // unnamed: its space goes back with the descriptor
  if (device_ != nullptr)
    for (char* p : pinned_) device_->unpin_host(p);
  for (auto& p : pages_) {
    if (p.backing == Tier::kHost && p.backing_data != nullptr) std::free(p.backing_data);
    std::free(p.q8);
  }
  for (char* p : host_free_) std::free(p);
  if (device_ != nullptr) {
    device_->free(fast_pool_);
    device_->free(fast_docs_);
  } else {
    std::free(fast_pool_);
  }
}

void KvCache::to_device(void* dst, const void* src, size_t bytes, const char* what) {
  const kernels::Status st = device_->offload_to_device(dst, src, bytes);
  if (st != kernels::Status::kOk) {
    const std::string why = device_->last_error();
    throw GenerateError(fmt::format("fast tier on the {} backend: {} failed: {}{}",
                                    device_->name(), what, kernels::status_string(st),
                                    why.empty() ? "" : " (" + why + ")"));
  }
}

void KvCache::sync_fast() {
  if (device_ == nullptr) return;
  const kernels::Status st = device_->offload_wait();
  if (st != kernels::Status::kOk) {
    const std::string why = device_->last_error();
    throw GenerateError(fmt::format("fast tier on the {} backend: waiting for copies failed: {}{}",
                                    device_->name(), kernels::status_string(st),
                                    why.empty() ? "" : " (" + why + ")"));
  }
  staging_.clear();
}

int64_t KvCache::window_slots() const {
  const int64_t w = config_.window_tokens();
  if (w == 0) return 0;
  const int64_t per_head = (w + config_.page_tokens - 1) / config_.page_tokens + 1;
  return per_head * layers_ * kv_heads_;
}

char* KvCache::host_alloc() {
  if (!host_free_.empty()) {
    char* p = host_free_.back();
    host_free_.pop_back();
    host_used_ += page_bytes();
    return p;
  }
  if (config_.host_bytes > 0 && host_used_ + page_bytes() > config_.host_bytes) return nullptr;
  // Device tier: whole OS pages, so each buffer's pinning covers pages of its own.
  const size_t align = device_ != nullptr ? static_cast<size_t>(kOsPage) : 64;
  const size_t bytes = (static_cast<size_t>(page_bytes()) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, bytes);
  if (p == nullptr) throw GenerateError("out of host memory for KV cache pages");
  host_used_ += page_bytes();
  // Device tier: pinned, so promotions are DMA from it. A buffer that cannot be pinned still
  // works (the driver copies it through its staging); it is simply slower.
  if (device_ != nullptr &&
      device_->pin_host(p, bytes) == kernels::Status::kOk)
    pinned_.push_back(static_cast<char*>(p));
  return static_cast<char*>(p);
}

// The disk tier's page file has no name while it is in use: an unnamed file (O_TMPFILE) in
// disk_dir, or, where the file system cannot make one, a private file unlinked as soon as it is
// open. Ctrl-C, SIGTERM, SIGKILL or a rank error leave nothing behind: the space goes back when
// the descriptor closes.
void KvCache::open_disk() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(config_.disk_dir, ec))
    throw GenerateError(fmt::format("disk_dir '{}' is not a directory", config_.disk_dir));
  disk_path_ = (fs::path(config_.disk_dir) / fmt::format("ring-kv-{}.pages (unnamed)", ::getpid()))
                   .string();
  disk_fd_ = ::open(config_.disk_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (disk_fd_ >= 0) return;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
    throw GenerateError(fmt::format("cannot create the disk tier file under disk_dir '{}': {}",
                                    config_.disk_dir, std::strerror(errno)));
  std::string tmpl = (fs::path(config_.disk_dir) / "ring-kv-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)  // 0700
    throw GenerateError(fmt::format("cannot create a directory under disk_dir '{}': {}",
                                    config_.disk_dir, std::strerror(errno)));
  const std::string dir = buf.data();
  const std::string path = dir + fmt::format("/kv-{}.pages", ::getpid());
  disk_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const int err = errno;
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
  if (disk_fd_ < 0)
    throw GenerateError(fmt::format("cannot create the disk tier file {}: {}", path,
                                    std::strerror(err)));
}

int64_t KvCache::disk_grow() {
  if (!disk_free_.empty()) {
    int64_t s = disk_free_.back();
    disk_free_.pop_back();
    return s;
  }
  if (disk_fd_ < 0) open_disk();
  const int64_t s = disk_slots_;
  const off_t end = static_cast<off_t>((s + 1) * disk_slot_bytes_);
  // The space is reserved now: a sparse file on a full disk would fail later, at a store into
  // the mapping, as SIGBUS with no message.
  if (const int rc = ::posix_fallocate(disk_fd_, static_cast<off_t>(s * disk_slot_bytes_),
                                       static_cast<off_t>(disk_slot_bytes_));
      rc != 0)
    throw GenerateError(fmt::format(
        "disk tier file {}: cannot reserve page {} ({} bytes, {} in all): {}{}", disk_path_, s,
        disk_slot_bytes_, static_cast<int64_t>(end), std::strerror(rc),
        rc == ENOSPC ? " (ENOSPC: disk_dir " + config_.disk_dir +
                           " is full; free space there, choose another generate.disk_dir or raise "
                           "generate.host_gb)"
                     : ""));
  void* m = ::mmap(nullptr, static_cast<size_t>(disk_slot_bytes_), PROT_READ | PROT_WRITE,
                   MAP_SHARED, disk_fd_, static_cast<off_t>(s * disk_slot_bytes_));
  if (m == MAP_FAILED)
    throw GenerateError(fmt::format("disk tier file {}: mmap failed: {}", disk_path_,
                                    std::strerror(errno)));
  disk_map_.push_back(static_cast<char*>(m));
  ++disk_slots_;
  return s;
}

PageId KvCache::acquire(const PageKey& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  ++pages_[it->second].refs;
  ++shared_hits_;
  return it->second;
}

PageId KvCache::create(int layer, int head) {
  PageId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<PageId>(pages_.size());
    pages_.emplace_back();
  }
  Page& p = pages_[id];
  p = Page{};
  p.layer = layer;
  p.head = head;
  p.refs = 1;
  p.docs.assign(static_cast<size_t>(config_.page_tokens), 0);
  p.kmin.assign(static_cast<size_t>(head_dim_), std::numeric_limits<float>::infinity());
  p.kmax.assign(static_cast<size_t>(head_dim_), -std::numeric_limits<float>::infinity());
  p.backing_data = host_alloc();
  if (p.backing_data != nullptr) {
    p.backing = Tier::kHost;
  } else if (!config_.disk_dir.empty()) {
    p.backing = Tier::kDisk;
    p.disk_slot = disk_grow();
    p.backing_data = disk_map_[p.disk_slot];
  } else {
    free_ids_.push_back(id);
    p.refs = 0;
    throw GenerateError(fmt::format(
        "the host tier is full ({} bytes, host_bytes); raise it or give a disk tier (disk_dir)",
        config_.host_bytes));
  }
  return id;
}

void KvCache::seal(PageId id, const PageKey& key) {
  Page& p = pages_[id];
  if (p.keyed) return;
  if (by_key_.count(key) != 0) return;
  p.keyed = true;
  p.key = key;
  by_key_[key] = id;
  if (config_.host_int8 && p.backing == Tier::kHost && p.tokens == config_.page_tokens) quantize(id);
}

void KvCache::quantize(PageId id) {
  Page& p = pages_[id];
  const int64_t pt = config_.page_tokens, hd = head_dim_;
  char* q = static_cast<char*>(std::malloc(static_cast<size_t>(q8_bytes())));
  if (q == nullptr) throw GenerateError("out of host memory for int8 KV pages");
  int8_t* kq = reinterpret_cast<int8_t*>(q);
  int8_t* vq = kq + pt * hd;
  float* ks = reinterpret_cast<float*>(q + 2 * pt * hd);
  float* vs = ks + hd;
  // The page's values as fp32 (a bf16 page widened: exact).
  std::vector<float> wide;
  const float* k = reinterpret_cast<const float*>(p.backing_data);
  if (config_.dtype == kernels::DType::kBF16) {
    wide.resize(static_cast<size_t>(page_values()));
    kernels::cpu::from_bf16(page_values(), reinterpret_cast<const uint16_t*>(p.backing_data),
                            wide.data(), 1);
    k = wide.data();
  }
  const float* v = k + pt * hd;
  for (int64_t d = 0; d < hd; ++d) {
    float m = 0.f;
    for (int64_t t = 0; t < pt; ++t) m = std::max(m, std::fabs(k[t * hd + d]));
    ks[d] = m > 0.f ? m / 127.f : 1.f;
  }
  for (int64_t t = 0; t < pt; ++t) {
    float m = 0.f;
    for (int64_t d = 0; d < hd; ++d) m = std::max(m, std::fabs(v[t * hd + d]));
    vs[t] = m > 0.f ? m / 127.f : 1.f;
    for (int64_t d = 0; d < hd; ++d) {
      kq[t * hd + d] = static_cast<int8_t>(std::lrint(k[t * hd + d] / ks[d]));
      vq[t * hd + d] = static_cast<int8_t>(std::lrint(v[t * hd + d] / vs[t]));
    }
  }
  host_free_.push_back(p.backing_data);
  host_used_ += q8_bytes() - page_bytes();
  p.backing_data = nullptr;
  p.q8 = q;
  // A fast copy takes the dequantized values: where the page is read never changes a bit.
  if (p.fast_slot >= 0) {
    std::vector<float> deq(static_cast<size_t>(page_values()));
    dequantize_into(id, deq.data());
    if (device_ != nullptr) {
      staging_.emplace_back(static_cast<size_t>(page_bytes()));
      store_rows(deq.data(), p.tokens, staging_.back().data());
      to_device(slot_data(p.fast_slot), staging_.back().data(),
                static_cast<size_t>(page_bytes()), "int8 page's fast copy");
    } else {
      store_rows(deq.data(), p.tokens, slot_data(p.fast_slot));
    }
  }
}

void KvCache::store_rows(const float* kv, int64_t rows, char* dst) const {
  const int64_t n = rows * head_dim_, off = config_.page_tokens * head_dim_;
  if (config_.dtype == kernels::DType::kBF16) {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    kernels::cpu::to_bf16(n, kv, d, 1);
    kernels::cpu::to_bf16(n, kv + off, d + off, 1);
    return;
  }
  float* d = reinterpret_cast<float*>(dst);
  std::memcpy(d, kv, static_cast<size_t>(n) * sizeof(float));
  std::memcpy(d + off, kv + off, static_cast<size_t>(n) * sizeof(float));
}

void KvCache::dequantize(PageId id, float* kv) const { dequantize_into(id, kv); }

void KvCache::dequantize_into(PageId id, float* kv) const {
  const Page& p = pages_[id];
  const int64_t pt = config_.page_tokens, hd = head_dim_;
  const int8_t* kq = reinterpret_cast<const int8_t*>(p.q8);
  const int8_t* vq = kq + pt * hd;
  const float* ks = reinterpret_cast<const float*>(p.q8 + 2 * pt * hd);
  const float* vs = ks + hd;
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t d = 0; d < hd; ++d) {
      kv[t * hd + d] = static_cast<float>(kq[t * hd + d]) * ks[d];
      kv[pt * hd + t * hd + d] = static_cast<float>(vq[t * hd + d]) * vs[t];
    }
  // A bf16 cache reads every value as bf16, a dequantized one too (its fast copy is bf16).
  if (config_.dtype == kernels::DType::kBF16) {
    kernels::cpu::round_bf16(p.tokens * hd, kv, 1);
    kernels::cpu::round_bf16(p.tokens * hd, kv + pt * hd, 1);
  }
}

void KvCache::release(PageId id) {
  Page& p = pages_[id];
  if (--p.refs > 0) return;
  if (p.keyed) by_key_.erase(p.key);
  if (p.fast_slot >= 0) drop_fast(id);
  if (p.q8 != nullptr) {
    std::free(p.q8);
    host_used_ -= q8_bytes();
  } else if (p.backing == Tier::kHost) {
    host_free_.push_back(p.backing_data);
    host_used_ -= page_bytes();
  } else {
    disk_free_.push_back(p.disk_slot);
  }
  p = Page{};
  p.refs = 0;
  free_ids_.push_back(id);
}

const void* KvCache::k_of(PageId id) const {
  const Page& p = pages_[id];
  return p.fast_slot >= 0 && device_ == nullptr ? slot_data(p.fast_slot) : p.backing_data;
}

const void* KvCache::v_of(PageId id) const {
  return static_cast<const char*>(k_of(id)) + config_.page_tokens * head_dim_ * value_bytes();
}

void KvCache::write_row(PageId id, int64_t row, const float* k, const float* v, int32_t doc) {
  Page& p = pages_[id];
  if (p.q8 != nullptr) throw GenerateError("internal: a write to a full (int8) page");
  const int64_t hd = head_dim_, vb = value_bytes();
  // Byte offsets of the row in K and in V; n: bytes of a row.
  const int64_t at_k = row * hd * vb, at_v = (config_.page_tokens + row) * hd * vb;
  const size_t n = static_cast<size_t>(hd * vb);
  const bool bf16 = config_.dtype == kernels::DType::kBF16;
  if (bf16) {
    kernels::cpu::to_bf16(hd, k, reinterpret_cast<uint16_t*>(p.backing_data + at_k), 1);
    kernels::cpu::to_bf16(hd, v, reinterpret_cast<uint16_t*>(p.backing_data + at_v), 1);
  } else {
    std::memcpy(p.backing_data + at_k, k, n);
    std::memcpy(p.backing_data + at_v, v, n);
  }
  p.docs[static_cast<size_t>(row)] = doc;
  if (p.fast_slot >= 0 && device_ != nullptr) {
    // From the backing (unchanged until sync_fast), on the copy stream, in order with promotions.
    char* f = slot_data(p.fast_slot);
    to_device(f + at_k, p.backing_data + at_k, n, "row copy (K)");
    to_device(f + at_v, p.backing_data + at_v, n, "row copy (V)");
    to_device(fast_docs_ + p.fast_slot * config_.page_tokens + row,
              p.docs.data() + row, sizeof(int32_t), "row copy (document id)");
  } else if (p.fast_slot >= 0) {
    char* f = slot_data(p.fast_slot);
    std::memcpy(f + at_k, p.backing_data + at_k, n);
    std::memcpy(f + at_v, p.backing_data + at_v, n);
  }
  // The keys' bounds from the values as stored (what attention reads).
  for (int64_t d = 0; d < hd; ++d) {
    const float kd =
        bf16 ? numeric::bf16_to_f32(reinterpret_cast<const uint16_t*>(p.backing_data + at_k)[d])
             : k[d];
    p.kmin[static_cast<size_t>(d)] = std::min(p.kmin[static_cast<size_t>(d)], kd);
    p.kmax[static_cast<size_t>(d)] = std::max(p.kmax[static_cast<size_t>(d)], kd);
  }
  p.tokens = std::max(p.tokens, row + 1);
}

void KvCache::make_fast(PageId id) {
  Page& p = pages_[id];
  const int64_t s = fast_free_.back();
  fast_free_.pop_back();
  fast_owner_[static_cast<size_t>(s)] = id;
  p.fast_slot = s;
  // The rows written so far (the rest is written through write_row), as stored: bytes.
  char* f = slot_data(s);
  const int64_t pt = config_.page_tokens, hd = head_dim_, vb = value_bytes();
  const size_t rows = static_cast<size_t>(p.tokens * hd * vb);
  const int64_t off_v = pt * hd * vb;
  const char* src = p.backing_data;
  if (p.q8 != nullptr) {
    // Its dequantized values (staged until sync_fast on a device).
    std::vector<float> deq(static_cast<size_t>(page_values()));
    dequantize_into(id, deq.data());
    if (device_ == nullptr) {
      store_rows(deq.data(), p.tokens, f);
      src = nullptr;
    } else {
      staging_.emplace_back(static_cast<size_t>(page_bytes()));
      store_rows(deq.data(), p.tokens, staging_.back().data());
      src = staging_.back().data();
    }
  }
  if (device_ != nullptr) {
    // Asynchronous copies of the filled rows (pinned backing: DMA) and their document ids.
    to_device(f, src, rows, "promotion (K)");
    to_device(f + off_v, src + off_v, rows, "promotion (V)");
    to_device(fast_docs_ + s * pt, p.docs.data(), static_cast<size_t>(p.tokens) * sizeof(int32_t),
              "promotion (document ids)");
  } else if (src != nullptr) {
    std::memcpy(f, src, rows);
    std::memcpy(f + off_v, src + off_v, rows);
  }
  ++promotions_;
  const int64_t used = (fast_slots_ - static_cast<int64_t>(fast_free_.size())) * page_bytes();
  fast_peak_ = std::max(fast_peak_, used);
}

void KvCache::drop_fast(PageId id) {
  Page& p = pages_[id];
  fast_owner_[static_cast<size_t>(p.fast_slot)] = -1;
  fast_free_.push_back(p.fast_slot);
  p.fast_slot = -1;
  ++demotions_;
}

void KvCache::decay_mass() {
  for (auto& p : pages_) p.mass *= config_.mass_decay;
}

void KvCache::place(const std::vector<PageId>& pinned, int64_t max_moves) {
  if (static_cast<int64_t>(pinned.size()) > fast_slots_) {
    throw GenerateError(fmt::format(
        "the sliding window needs {} fast pages ({} bytes) but the fast tier holds {} ({} bytes, "
        "fast_bytes); raise fast_bytes or lower window",
        pinned.size(), static_cast<int64_t>(pinned.size()) * page_bytes(), fast_slots_,
        config_.fast_bytes));
  }
  for (auto& p : pages_) p.pinned = false;
  for (PageId id : pinned) pages_[id].pinned = true;
  // Wanted: the pinned pages, then the live pages by mass (most first) while slots remain.
  std::vector<PageId> want(pinned.begin(), pinned.end());
  if (config_.promote) {
    std::vector<PageId> rest;
    for (PageId id = 0; id < static_cast<PageId>(pages_.size()); ++id)
      if (pages_[id].refs > 0 && !pages_[id].pinned) rest.push_back(id);
    const size_t room = static_cast<size_t>(fast_slots_) - want.size();
    auto by_mass = [&](PageId a, PageId b) {
      if (pages_[a].mass != pages_[b].mass) return pages_[a].mass > pages_[b].mass;
      return a < b;
    };
    if (rest.size() > room) {
      std::partial_sort(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(room), rest.end(),
                        by_mass);
      rest.resize(room);
    }
    want.insert(want.end(), rest.begin(), rest.end());
  }
  std::vector<char> wanted(pages_.size(), 0);
  for (PageId id : want) wanted[static_cast<size_t>(id)] = 1;
  // Demote first (frees slots), then promote: pinned pages always, others within max_moves.
  for (int64_t s = 0; s < fast_slots_; ++s) {
    const PageId id = fast_owner_[static_cast<size_t>(s)];
    if (id >= 0 && !wanted[static_cast<size_t>(id)]) drop_fast(id);
  }
  int64_t moves = 0;
  for (PageId id : want) {
    if (pages_[id].fast_slot >= 0) continue;
    if (!pages_[id].pinned && max_moves >= 0 && moves >= max_moves) continue;
    make_fast(id);
    if (!pages_[id].pinned) ++moves;
  }
}

CacheStats KvCache::stats() const {
  CacheStats s;
  for (const auto& p : pages_) {
    if (p.refs <= 0) continue;
    ++s.pages;
    if (p.fast_slot >= 0) ++s.fast_pages;
    if (p.backing == Tier::kHost) ++s.host_pages;
    else ++s.disk_pages;
  }
  s.shared_hits = shared_hits_;
  s.fast_resident_bytes = (fast_slots_ - static_cast<int64_t>(fast_free_.size())) * page_bytes();
  s.fast_capacity_bytes = fast_slots_ * page_bytes();
  s.fast_peak_bytes = fast_peak_;
  s.host_bytes = host_used_;
  s.disk_bytes = disk_slots_ * disk_slot_bytes_;
  s.promotions = promotions_;
  s.demotions = demotions_;
  s.fast_on_device = device_ != nullptr;
  s.pinned_buffers = static_cast<int64_t>(pinned_.size());
  return s;
}

}  // namespace ring::gen
