#include "worker/offload/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace ring::offload {
namespace {

int64_t align64(int64_t x) { return (x + 63) / 64 * 64; }

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

ShmRegion ShmRegion::create(const std::string& name, int64_t n, int workers) {
  if (n <= 0 || workers <= 0) fail(name, "n and workers must be positive");
  ShmHeader h;
  h.magic = kShmMagic;
  h.version = kShmVersion;
  h.workers = static_cast<uint32_t>(workers);
  h.n = n;
  h.params_off = align64(sizeof(ShmHeader));
  h.index_off = align64(h.params_off + n * 4);
  h.grads_off = align64(h.index_off + n * 4);
  h.slot_stride = align64(n * 4);
  h.total_bytes = h.grads_off + h.slot_stride * workers;
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
  const ShmHeader* h = r.header();
  if (h->magic != kShmMagic || h->version != kShmVersion)
    fail(name, "not a ringmaster segment of version " + std::to_string(kShmVersion));
  if (h->total_bytes != r.size_) fail(name, "size does not match its header");
  if (h->n != n)
    fail(name, "holds " + std::to_string(h->n) + " floats per tensor, this model has " +
                   std::to_string(n) + " (different spec?)");
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

}  // namespace ring::offload
