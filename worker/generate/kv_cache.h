// The KV cache of generation: fixed-size pages per (layer, K/V head), content-addressed, in tiers.
//
// A page holds `page_tokens` consecutive tokens of one sequence for one layer and one K/V head:
// K [page_tokens, head_dim] then V [page_tokens, head_dim] (after RoPE, as the attention saw
// them) stored as CacheConfig::dtype in every tier: fp32, or bf16 (a bf16 model's K/V are bf16
// values already, so its pages hold them exactly in half the bytes; write_row rounds with the one
// rounding, common/numeric/bf16.h, which leaves such values unchanged), plus the document id of each token (host metadata; positions are implied: page i of
// a sequence covers positions [i * page_tokens, (i + 1) * page_tokens)).
//
// Tiers. Every page has a BACKING copy in the host tier (aligned host memory, at most host_bytes
// in all) or, when that is full, in the disk tier (one file per process, 0600, in a private 0700
// directory under disk_dir, mmapped; removed when the cache is destroyed). The FAST tier is a
// bounded pool of page slots allocated once (fast_bytes: its resident size never exceeds it)
// holding copies of some pages, in host memory or, given a backend (the DEVICE fast tier), in
// that backend's memory (GPU HBM with the CUDA backend), where the backend's paged decode kernel
// reads them; see "Device fast tier" below. The fast tier holds the pages of each sequence's
// sliding window (the most recent `window` tokens: always fast) and the pages with the most
// attention mass in recent steps (promoted ahead of need). Attention reads a page where it is
// (fast copy if any, else the backing in place): no K/V moves between tiers for the computation.
// With a host pool, where a page is never changes the arithmetic done on it; with a device pool,
// fast pages are computed by the backend's kernel (same math, its own rounding).
//
// Content addressing. A full page's key is a 128-bit hash of the (token id, document id) pairs of
// the sequence's prefix up to and including the page, with its layer and head: sequences with a
// common prefix share the prefix pages (stored once, reference counted). The page being written
// (a sequence's last, partial page) is private until it is full.
//
// Device fast tier (constructed with a backend). The pool is one backend allocation of fast
// slots x page bytes (K then V per slot, of the cache's dtype, kernels/backend.h
// PagedDecodeArgs's layout) plus the
// rows' document ids [slots, page_tokens]. Promotion copies a page's filled rows and ids from
// its backing with the backend's asynchronous host-to-device copy (offload_to_device: ordered
// before every later kernel); a row written to a page with a fast copy goes to both the
// same way. Host-tier page buffers are pinned when allocated (pin_host: cudaHostRegister on the
// CUDA backend; a page that cannot be pinned is copied through the driver's staging, still
// correct), so promotions are DMA from pinned memory. Copies read their source after the call
// returns: sources stay untouched until sync_fast() (which DecodeAttention calls after each
// layer's kernel), and int8 pages are dequantized into staging buffers kept until then.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace ring::gen {

// Errors of generation (bad configuration, a tier full, a disk file that cannot be made).
class GenerateError : public std::runtime_error {
 public:
  explicit GenerateError(const std::string& m) : std::runtime_error(m) {}
};

struct CacheConfig {
  int64_t page_tokens = 1024;        // tokens per page (>= 16)
  int64_t fast_bytes = 256LL << 20;  // the fast pool's size (0: no fast tier)
  int64_t host_bytes = 0;            // host tier limit (0: no limit)
  std::string disk_dir;              // "" : no disk tier
  int64_t window = -1;               // tokens always fast; -1: page_tokens
  bool promote = true;               // promote pages by attention mass
  double mass_decay = 0.5;           // per step: mass = decay * mass + this step's mass
  // Opt-in, NOT exact: full pages backed in the host tier are stored as int8 (K per channel, V
  // per token, symmetric scales over the page, from the page's values of `dtype`); attention
  // dequantizes them as it reads them (rounded to bf16 in a bf16 cache), and a fast copy holds the
  // same dequantized values (so tiers still never change a bit).
  bool host_int8 = false;
  // How K/V are stored in every tier: kF32, or kBF16 (half the bytes per token; values rounded
  // by the one rounding as they are written).
  kernels::DType dtype = kernels::DType::kF32;
  // Throws GenerateError naming the field and the rule.
  void check() const;
  int64_t window_tokens() const { return window < 0 ? page_tokens : window; }
};

enum class Tier : int { kFast = 0, kHost = 1, kDisk = 2 };
const char* tier_name(Tier t);

struct PageKey {
  uint64_t a = 0, b = 0;
  bool operator<(const PageKey& o) const { return a != o.a ? a < o.a : b < o.b; }
  bool operator==(const PageKey& o) const = default;
};

// Running hash of a token prefix: feed (id, doc) pairs in order; key() of a page mixes in the
// layer and head.
class PrefixHash {
 public:
  void add(int32_t id, int32_t doc);
  // Feeds the state of another running hash and a position (a sharded cache's keys: the prefix
  // up to a token and where it stands determine its K/V).
  void add(const PrefixHash& prefix, int64_t position);
  PageKey key(int layer, int head) const;

 private:
  uint64_t a_ = 0x243f6a8885a308d3ULL, b_ = 0x13198a2e03707344ULL;
};

using PageId = int32_t;

struct Page {
  int layer = 0, head = 0;
  int64_t tokens = 0;      // rows filled
  bool keyed = false;      // full and registered under `key`
  PageKey key;
  int refs = 0;            // sequences holding it
  Tier backing = Tier::kHost;
  char* backing_data = nullptr;   // K then V, [2, page_tokens, head_dim] of the cache's dtype
  int64_t disk_slot = -1;
  int64_t fast_slot = -1;         // >= 0: a copy in the fast pool
  std::vector<int32_t> docs;      // [page_tokens]
  double mass = 0;                // decayed attention mass (promotion statistic)
  bool pinned = false;            // in some sequence's window this step
  // Per-channel bounds of the page's keys (approximate mode: an upper bound on q . k).
  std::vector<float> kmin, kmax;  // [head_dim]
  // host_int8: the backing as int8 (backing_data is then null): K [page_tokens, head_dim], V
  // [page_tokens, head_dim], then fp32 scales: K per channel [head_dim], V per token
  // [page_tokens]. value = int8 x scale.
  char* q8 = nullptr;
};

struct CacheStats {
  int64_t pages = 0;             // live pages
  int64_t shared_hits = 0;       // full pages found by key instead of stored again
  int64_t fast_pages = 0, host_pages = 0, disk_pages = 0;  // fast: copies; host/disk: backings
  int64_t fast_resident_bytes = 0;   // slots in use x page bytes
  int64_t fast_capacity_bytes = 0;   // slots x page bytes (<= fast_bytes)
  int64_t fast_peak_bytes = 0;       // the most fast_resident_bytes ever was
  int64_t host_bytes = 0, disk_bytes = 0;
  int64_t promotions = 0, demotions = 0;
  bool fast_on_device = false;   // the fast pool is backend (device) memory
  int64_t pinned_buffers = 0;    // device tier: host page buffers pinned for DMA
};

class KvCache {
 public:
  // device: null for a host fast pool; else the backend whose memory holds the fast pool (the
  // device fast tier, header comment). It must outlive the cache.
  KvCache(const CacheConfig& config, int layers, int kv_heads, int64_t head_dim,
          kernels::Backend* device = nullptr);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const CacheConfig& config() const { return config_; }
  int64_t page_tokens() const { return config_.page_tokens; }
  int64_t head_dim() const { return head_dim_; }
  kernels::DType dtype() const { return config_.dtype; }
  // Bytes of one stored K or V value: 4 (fp32) or 2 (bf16).
  int64_t value_bytes() const { return config_.dtype == kernels::DType::kBF16 ? 2 : 4; }
  int64_t page_values() const { return 2 * config_.page_tokens * head_dim_; }
  int64_t page_bytes() const { return page_values() * value_bytes(); }
  // Fast slots a sequence's window needs (all layers and heads).
  int64_t window_slots() const;
  int64_t fast_slots() const { return fast_slots_; }

  // The full page under key, with one more reference; -1 if none.
  PageId acquire(const PageKey& key);
  // A new private page (refs 1) of (layer, head), backed in host (or disk) memory.
  PageId create(int layer, int head);
  // Registers a full private page under key (if another page has the key already, the page stays
  // private: both hold the same data).
  void seal(PageId id, const PageKey& key);
  void release(PageId id);

  Page& page(PageId id) { return pages_[id]; }
  const Page& page(PageId id) const { return pages_[id]; }
  // Where the CPU reads page id: K [tokens, head_dim], V [tokens, head_dim] (row stride
  // head_dim) of dtype(): float, or uint16_t bf16 bits; its fast copy with a host pool, else its
  // backing (a device fast copy is read by the backend's kernel from device_pool(), never by the
  // CPU). tier_of: where attention reads it.
  const void* k_of(PageId id) const;
  const void* v_of(PageId id) const;
  Tier tier_of(PageId id) const { return pages_[id].fast_slot >= 0 ? Tier::kFast : pages_[id].backing; }
  // Whether attention must dequantize the page (int8 backing, no fast copy), and into what:
  // kv [2, page_tokens, head_dim] fp32 (K then V; in a bf16 cache each value rounded to bf16, as
  // a fast copy holds it), the page's rows filled.
  bool needs_dequant(PageId id) const {
    return pages_[id].q8 != nullptr && (pages_[id].fast_slot < 0 || device_ != nullptr);
  }
  void dequantize(PageId id, float* kv) const;
  int64_t q8_bytes() const { return 2 * config_.page_tokens * head_dim_ + 4 * (head_dim_ + config_.page_tokens); }
  // Writes row `row` of a page (k, v: [head_dim] fp32, stored as dtype()) to its backing and its
  // fast copy.
  void write_row(PageId id, int64_t row, const float* k, const float* v, int32_t doc);

  // Placement after a step: `pinned` lists the window pages (made fast, required), the others by
  // decayed mass, most first, while slots remain; at most max_moves promotions per call (-1: no
  // limit). Throws GenerateError when the window pages alone exceed the fast pool.
  void place(const std::vector<PageId>& pinned, int64_t max_moves = -1);
  void add_mass(PageId id, double m) { pages_[id].mass += m; }
  void decay_mass();

  CacheStats stats() const;

  // ---- device fast tier ----
  bool fast_on_device() const { return device_ != nullptr; }
  kernels::Backend* device() const { return device_; }
  // Backend memory: [fast_slots, 2, page_tokens, head_dim] of dtype() and [fast_slots,
  // page_tokens].
  const void* device_pool() const { return fast_pool_; }
  const int32_t* device_docs() const { return fast_docs_; }
  // Waits for the fast tier's copies in flight and frees their staging (no-op on a host pool).
  void sync_fast();

 private:
  char* host_alloc();
  char* slot_data(int64_t slot) const { return fast_pool_ + slot * page_bytes(); }
  // rows of K and of V from kv [2, page_tokens, head_dim] fp32 into dst (a page of dtype()).
  void store_rows(const float* kv, int64_t rows, char* dst) const;
  void quantize(PageId id);
  void dequantize_into(PageId id, float* kv) const;
  void make_fast(PageId id);
  void drop_fast(PageId id);
  void open_disk();
  int64_t disk_grow();
  // Device tier: an asynchronous copy into the pool (throws GenerateError on failure).
  void to_device(void* dst, const void* src, size_t bytes, const char* what);

  CacheConfig config_;
  int layers_, kv_heads_;
  int64_t head_dim_;
  std::vector<Page> pages_;
  std::vector<PageId> free_ids_;
  std::map<PageKey, PageId> by_key_;

  // Fast pool: one allocation of fast_slots_ x page_bytes, and who holds each slot.
  char* fast_pool_ = nullptr;
  int64_t fast_slots_ = 0;
  std::vector<PageId> fast_owner_;
  std::vector<int64_t> fast_free_;
  kernels::Backend* device_ = nullptr;          // device tier: the pool's backend
  int32_t* fast_docs_ = nullptr;                // device tier: [fast_slots_, page_tokens]
  std::vector<std::vector<char>> staging_;      // device tier: sources of copies in flight
  std::vector<char*> pinned_;                   // device tier: pinned host page buffers

  int64_t host_used_ = 0;
  std::vector<char*> host_free_;  // recycled host page buffers

  // Disk tier.
  std::string disk_path_;  // for messages: the page file has no name (open_disk)
  int disk_fd_ = -1;
  int64_t disk_slot_bytes_ = 0;
  int64_t disk_slots_ = 0;
  std::vector<int64_t> disk_free_;
  std::vector<char*> disk_map_;  // [disk_slots_] mapping of each slot

  int64_t shared_hits_ = 0, promotions_ = 0, demotions_ = 0, fast_peak_ = 0;
};

}  // namespace ring::gen
