// The node's shared-memory segment between ringd and its workers (POSIX shm_open + mmap): the
// tensors of the offloaded optimizer step never go through a socket.
//
//   layout (byte offsets 64-aligned, all sizes in the header):
//     header                            ShmHeader
//     params   [params_n] fp32          ringd -> workers: the weights for the next step, floats
//                                       [params_begin, params_begin + params_n) of the layout
//     index    [index_n] uint64         ringd -> workers: lazy mode, the coordinates that changed
//                                       (64-bit: models over 2^32 floats)
//     grads    [workers][slot_n] fp32   worker k -> ringd: its gradient, written bucket by bucket
//
//   The whole model (ShmShape::whole): params_begin 0, params_n = index_n = slot_n = n.
//   parallel.shard full: params hold the node's range only, no lazy index (index_n 0), and each
//   slot the worker's shard (contract::worker_shards; slot_n = the largest of the node's).
//
// ringd creates one segment per attempt (name unique per job, node, ringd pid and attempt),
// and unlinks the name as soon as every worker has mapped it, so nothing is left in /dev/shm
// even when ringd is killed later; the memory goes away with the last mapping.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace ring::contract {

inline constexpr uint64_t kShmMagic = 0x52494e47534d3031ull;  // "RINGSM01"
inline constexpr uint32_t kShmVersion = 3;  // 2: 64-bit lazy index; 3: partial params and slots

struct ShmHeader {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t workers = 0;
  int64_t n = 0;             // floats per tensor (the model's flat layout total)
  int64_t params_off = 0;    // bytes from the start
  int64_t index_off = 0;
  int64_t grads_off = 0;
  int64_t slot_stride = 0;   // bytes between two workers' gradient slots
  int64_t total_bytes = 0;
  int64_t params_begin = 0;  // flat offset of params[0]
  int64_t params_n = 0;      // floats of params
  int64_t index_n = 0;       // entries of the lazy index
  int64_t slot_n = 0;        // floats per gradient slot
};

// What a segment holds (see the layout above).
struct ShmShape {
  int64_t n = 0;  // floats of the model's flat layout
  int workers = 0;
  int64_t params_begin = 0, params_n = 0, index_n = 0, slot_n = 0;
  static ShmShape whole(int64_t n, int workers) { return {n, workers, 0, n, n, n}; }
};
// The segment's byte offsets: header, params, index, the gradient slots, each 64-byte aligned. In
// T: int64_t for the segment itself, double for the planner's sizes of models past int64 bytes.
template <class T>
struct ShmOffsets {
  T params_off = 0, index_off = 0, grads_off = 0, slot_stride = 0, total_bytes = 0;
};
template <class T>
ShmOffsets<T> shm_offsets(T params_n, T index_n, T slot_n, T workers) {
  auto align64 = [](T x) {
    if constexpr (std::is_floating_point_v<T>) return std::ceil(x / T{64}) * T{64};
    else return (x + T{63}) / T{64} * T{64};
  };
  ShmOffsets<T> o;
  o.params_off = align64(static_cast<T>(sizeof(ShmHeader)));
  o.index_off = align64(o.params_off + params_n * T{4});
  o.grads_off = align64(o.index_off + index_n * T{8});
  o.slot_stride = align64(slot_n * T{4});
  o.total_bytes = o.grads_off + o.slot_stride * workers;
  return o;
}
// The segment's bytes for `shape` (header, regions and alignment), as create() sizes it.
int64_t shm_total_bytes(const ShmShape& shape);

class ShmRegion {
 public:
  // ringd: creates (O_EXCL) and sizes the segment. Throws std::runtime_error naming the segment
  // and the errno text.
  static ShmRegion create(const std::string& name, const ShmShape& shape);
  static ShmRegion create(const std::string& name, int64_t n, int workers) {
    return create(name, ShmShape::whole(n, workers));
  }
  // A worker: maps an existing segment and checks its header against n (shm_header_problem).
  // Throws std::runtime_error naming the segment and what does not match.
  static ShmRegion open(const std::string& name, int64_t n);

  ShmRegion() = default;
  ShmRegion(ShmRegion&& o) noexcept;
  ShmRegion& operator=(ShmRegion&& o) noexcept;
  ~ShmRegion();

  const std::string& name() const { return name_; }
  int64_t n() const { return header()->n; }
  int workers() const { return static_cast<int>(header()->workers); }
  // params()[0] is float params_begin() of the layout; params_n() floats.
  float* params() const { return reinterpret_cast<float*>(base_ + header()->params_off); }
  int64_t params_begin() const { return header()->params_begin; }
  int64_t params_n() const { return header()->params_n; }
  int64_t index_n() const { return header()->index_n; }
  int64_t slot_n() const { return header()->slot_n; }
  bool whole() const { return params_n() == n() && slot_n() == n(); }
  uint64_t* index() const { return reinterpret_cast<uint64_t*>(base_ + header()->index_off); }
  float* grads(int slot) const {
    return reinterpret_cast<float*>(base_ + header()->grads_off + slot * header()->slot_stride);
  }
  int64_t bytes() const { return size_; }
  // Removes the name (idempotent); mappings stay valid.
  void unlink();
  bool valid() const { return base_ != nullptr; }

 private:
  const ShmHeader* header() const { return reinterpret_cast<const ShmHeader*>(base_); }
  std::string name_;
  char* base_ = nullptr;
  int64_t size_ = 0;
  bool owner_ = false;
  bool linked_ = false;
};

// Why a segment with this header cannot be used by a model of n floats (empty: it can): a wrong
// magic or version, a size other than total_bytes, another n, or a params, index or gradient
// region that is misaligned, overlaps another or lies outside the segment's `size` bytes.
// ShmRegion::open refuses such a segment with this text, so no accessor reads past the mapping.
std::string shm_header_problem(const ShmHeader& h, int64_t size, int64_t n);

// "/ringmaster-<job>-n<node>-p<pid>-a<attempt>", job name reduced to [A-Za-z0-9_.-].
std::string shm_name(const std::string& job, int node, int pid, int attempt);

}  // namespace ring::contract
