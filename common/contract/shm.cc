#include "common/contract/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace ring::contract {
namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw std::runtime_error("shared memory " + name + ": " + what);
}

}  // namespace

std::string shm_name(const std::string& job, int node, int pid, int attempt) {
  std::string j;
  for (char c : job)
    j += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-') ? c
                                                                                             : '_';
  if (j.size() > 64) j.resize(64);
  return "/ringmaster-" + j + "-n" + std::to_string(node) + "-p" + std::to_string(pid) + "-a" +
         std::to_string(attempt);
}

std::string shm_header_problem(const ShmHeader& h, int64_t size, int64_t n) {
  if (h.magic != kShmMagic || h.version != kShmVersion)
    return "not a ringmaster segment of version " + std::to_string(kShmVersion);
  if (size < static_cast<int64_t>(sizeof(ShmHeader))) return "smaller than its header";
  if (h.total_bytes != size)
    return "size " + std::to_string(size) + " does not match its header (" +
           std::to_string(h.total_bytes) + ")";
  if (h.n != n)
    return "holds " + std::to_string(h.n) + " floats per tensor, this model has " +
           std::to_string(n) + " (different spec?)";
  if (n <= 0) return "n " + std::to_string(n) + " is not positive";
  if (h.workers == 0 || h.workers > (1u << 16))
    return "gradient slots " + std::to_string(h.workers) + " outside [1, 65536]";
  if (h.params_begin < 0 || h.params_n < 0 || h.params_begin > n || h.params_n > n - h.params_begin)
    return "params [" + std::to_string(h.params_begin) + ", +" + std::to_string(h.params_n) +
           ") outside the model's " + std::to_string(n) + " floats";
  if (h.index_n < 0 || h.index_n > n || h.slot_n < 0 || h.slot_n > n)
    return "index " + std::to_string(h.index_n) + " or slot " + std::to_string(h.slot_n) +
           " floats outside [0, " + std::to_string(n) + "]";
  // Every bound below is computed in 128 bits: the header is data, its sums may overflow.
  using I = __int128;
  const I bytes = I{h.params_n} * 4;
  const I index_bytes = I{h.index_n} * 8;
  const I slot_bytes = I{h.slot_n} * 4;
  const auto region = [&](const char* what, int64_t off, I len, I lo) -> std::string {
    if (off % 64 != 0)
      return std::string(what) + " offset " + std::to_string(off) + " is not 64-aligned";
    if (I{off} < lo || I{off} + len > I{size})
      return std::string(what) + " region at " + std::to_string(off) +
             " overlaps another or lies outside the " + std::to_string(size) + " bytes";
    return "";
  };
  std::string p = region("params", h.params_off, bytes, sizeof(ShmHeader));
  if (p.empty()) p = region("index", h.index_off, index_bytes, I{h.params_off} + bytes);
  if (!p.empty()) return p;
  if (h.slot_stride % 64 != 0 || I{h.slot_stride} < slot_bytes)
    return "gradient slot stride " + std::to_string(h.slot_stride) + " is not a 64-aligned " +
           "size of at least " + std::to_string(h.slot_n * 4) + " bytes";
  return region("gradients", h.grads_off, I{h.slot_stride} * (h.workers - 1) + slot_bytes,
                I{h.index_off} + index_bytes);
}

namespace {

ShmHeader header_for(const ShmShape& s) {
  ShmHeader h;
  h.magic = kShmMagic;
  h.version = kShmVersion;
  h.workers = static_cast<uint32_t>(s.workers);
  h.n = s.n;
  h.params_begin = s.params_begin;
  h.params_n = s.params_n;
  h.index_n = s.index_n;
  h.slot_n = s.slot_n;
  const auto o = shm_offsets<int64_t>(s.params_n, s.index_n, s.slot_n, s.workers);
  h.params_off = o.params_off;
  h.index_off = o.index_off;
  h.grads_off = o.grads_off;
  h.slot_stride = o.slot_stride;
  h.total_bytes = o.total_bytes;
  return h;
}

}  // namespace

int64_t shm_total_bytes(const ShmShape& shape) { return header_for(shape).total_bytes; }

ShmRegion ShmRegion::create(const std::string& name, const ShmShape& shape) {
  if (shape.n <= 0 || shape.workers <= 0) fail(name, "n and workers must be positive");
  if (shape.params_begin < 0 || shape.params_n < 0 || shape.params_begin + shape.params_n > shape.n ||
      shape.index_n < 0 || shape.index_n > shape.n || shape.slot_n < 0 || shape.slot_n > shape.n)
    fail(name, "params, index or slot sizes outside the model's " + std::to_string(shape.n) +
                   " floats");
  const ShmHeader h = header_for(shape);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail(name, std::string("shm_open: ") + std::strerror(errno));
  if (ftruncate(fd, h.total_bytes) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    fail(name, "ftruncate to " + std::to_string(h.total_bytes) + " bytes: " + std::strerror(e));
  }
  void* p = mmap(nullptr, h.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    fail(name, std::string("mmap: ") + std::strerror(e));
  }
  std::memcpy(p, &h, sizeof(h));
  ShmRegion r;
  r.name_ = name;
  r.base_ = static_cast<char*>(p);
  r.size_ = h.total_bytes;
  r.owner_ = true;
  r.linked_ = true;
  return r;
}

ShmRegion ShmRegion::open(const std::string& name, int64_t n) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) fail(name, std::string("shm_open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(ShmHeader))) {
    close(fd);
    fail(name, "smaller than its header");
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) fail(name, std::string("mmap: ") + std::strerror(e));
  ShmRegion r;
  r.name_ = name;
  r.base_ = static_cast<char*>(p);
  r.size_ = st.st_size;
  const std::string problem = shm_header_problem(*r.header(), r.size_, n);
  if (!problem.empty()) fail(name, problem);
  return r;
}

ShmRegion::ShmRegion(ShmRegion&& o) noexcept { *this = std::move(o); }

ShmRegion& ShmRegion::operator=(ShmRegion&& o) noexcept {
  if (this != &o) {
    unlink();
    if (base_) munmap(base_, size_);
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    owner_ = std::exchange(o.owner_, false);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

void ShmRegion::unlink() {
  if (owner_ && linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

ShmRegion::~ShmRegion() {
  unlink();
  if (base_) munmap(base_, size_);
  base_ = nullptr;
}

}  // namespace ring::contract
