#include "common/contract/timeline.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ring::contract::timeline {
namespace {

constexpr const char* kNames[] = {
    "none",      "step",     "data",       "forward",  "backward",  "ring_send",  "ring_recv",
    "ring_wait", "handover", "collective", "exchange", "optimizer", "checkpoint", "params_wait",
    "decode",    "head_all_to_all"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Phase::kMax));

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

Header* header_of(void* base) {
  return static_cast<Header*>(base);
}
Record* records_of(void* base) {
  return reinterpret_cast<Record*>(static_cast<char*>(base) + kHeaderBytes);
}

void* map_file(const std::string& path, bool writable, std::string* error) {
  const int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    *error = errno_text("cannot open timeline", path);
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<size_t>(st.st_size) != kFileBytes) {
    ::close(fd);
    *error =
        "timeline " + path + ": not a regular file of " + std::to_string(kFileBytes) + " bytes";
    return nullptr;
  }
  void* p = ::mmap(nullptr, kFileBytes, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    *error = errno_text("cannot map timeline", path);
    return nullptr;
  }
  const Header* h = header_of(p);
  if (h->magic != kMagic || h->version != kVersion || h->header_bytes != kHeaderBytes ||
      h->capacity != kCapacity) {
    ::munmap(p, kFileBytes);
    *error = "timeline " + path + ": not a timeline file of version " + std::to_string(kVersion);
    return nullptr;
  }
  return p;
}

Event event_of(const Record& r) {
  Event e;
  e.kind = static_cast<Phase>(r.kind);
  e.step = r.step;
  e.layer = r.layer;
  e.hop = r.hop;
  e.peer = r.peer;
  e.begin_ns = r.begin_ns;
  e.end_ns = r.end_ns;
  e.bytes = r.bytes;
  return e;
}

TimelineWriter* g_active = nullptr;

}  // namespace

const char* phase_name(uint16_t p) {
  return p < static_cast<uint16_t>(Phase::kMax) ? kNames[p] : "?";
}
const char* phase_name(Phase p) {
  return phase_name(static_cast<uint16_t>(p));
}

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
int64_t unix_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string create_file(const std::string& path, int64_t rank) {
  // A new file (O_EXCL: in a shared directory such as /dev/shm nobody can plant it first); one of
  // ours left by an earlier attempt is replaced, anything else there is refused.
  int fd =
      ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0 && errno == EEXIST) {
    struct stat old {};
    if (::lstat(path.c_str(), &old) != 0 || !S_ISREG(old.st_mode) || old.st_uid != ::geteuid())
      return "timeline " + path + " exists and is not a regular file of ours: not replaced";
    ::unlink(path.c_str());
    fd =
        ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, S_IRUSR | S_IWUSR);
  }
  if (fd < 0) return errno_text("cannot create timeline", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "timeline " + path + ": not a regular file";
  }
  // A fresh, zeroed file of the full size (a truncate to 0 first drops an earlier attempt's).
  if (::fchmod(fd, S_IRUSR | S_IWUSR) != 0 || ::ftruncate(fd, 0) != 0 ||
      ::ftruncate(fd, static_cast<off_t>(kFileBytes)) != 0) {
    const std::string e = errno_text("cannot size timeline", path);
    ::close(fd);
    return e;
  }
  void* p = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return errno_text("cannot map timeline", path);
  Header* h = header_of(p);
  h->version = kVersion;
  h->header_bytes = kHeaderBytes;
  h->capacity = kCapacity;
  h->rank = rank;
  h->clock_mono_ns = now_ns();
  h->clock_unix_ns = unix_ns();
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  ::munmap(p, kFileBytes);
  return "";
}

TimelineWriter::~TimelineWriter() {
  if (g_active == this) g_active = nullptr;
  if (h_) ::munmap(h_, kFileBytes);
}

std::string TimelineWriter::open(const std::string& path, int64_t rank, int64_t pid) {
  std::string error;
  void* p = map_file(path, true, &error);
  if (!p) return error;
  Header* h = header_of(p);
  if (const int64_t owner = h->rank; owner != rank) {
    ::munmap(p, kFileBytes);
    return "timeline " + path + " is rank " + std::to_string(owner) + "'s, not rank " +
           std::to_string(rank) + "'s";
  }
  h->pid = pid;
  h->clock_mono_ns = now_ns();
  h->clock_unix_ns = unix_ns();
  h->progress_ns.store(now_ns(), std::memory_order_relaxed);
  h_ = h;
  recs_ = records_of(p);
  return "";
}

void TimelineWriter::record(const Event& e) {
  if (!h_) return;
  if (enabled_) {
    const uint64_t i = h_->next.load(std::memory_order_relaxed);
    Record& r = recs_[i % kCapacity];
    r.seq.store((i + 1) * 2 - 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    r.begin_ns = e.begin_ns;
    r.end_ns = e.end_ns;
    r.step = e.step;
    r.bytes = e.bytes;
    r.kind = static_cast<uint16_t>(e.kind);
    r.hop = e.hop;
    r.layer = e.layer;
    r.peer = e.peer;
    r.seq.store((i + 1) * 2, std::memory_order_release);
    h_->next.store(i + 1, std::memory_order_release);
  }
  h_->progress.fetch_add(1, std::memory_order_relaxed);
  h_->progress_ns.store(e.end_ns, std::memory_order_relaxed);
}

void TimelineWriter::set_step(int64_t step) {
  step_ = step;
  if (h_) h_->step.store(step, std::memory_order_relaxed);
}

void TimelineWriter::wait_begin(Phase kind, int64_t step, int32_t layer, int16_t hop,
                                int32_t peer) {
  if (!h_) return;
  Current& c = h_->current;
  const uint64_t s = c.seq.load(std::memory_order_relaxed);
  c.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  c.kind = static_cast<uint16_t>(kind);
  c.step = step;
  c.layer = layer;
  c.hop = hop;
  c.peer = peer;
  c.since_ns = now_ns();
  c.seq.store(s + 2, std::memory_order_release);
}

void TimelineWriter::wait_end() {
  if (!h_) return;
  Current& c = h_->current;
  const uint64_t s = c.seq.load(std::memory_order_relaxed);
  c.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  c.kind = 0;
  c.seq.store(s + 2, std::memory_order_release);
  progress();
}

void TimelineWriter::progress() {
  if (!h_) return;
  h_->progress.fetch_add(1, std::memory_order_relaxed);
  h_->progress_ns.store(now_ns(), std::memory_order_relaxed);
}

TimelineWriter* active() {
  return g_active;
}
void set_active(TimelineWriter* w) {
  g_active = w;
}

Snapshot read_mapped(const void* base, int64_t min_step) {
  Snapshot s;
  void* b = const_cast<void*>(base);
  const Header* h = header_of(b);
  if (h->magic != kMagic || h->version != kVersion) {
    s.error = "not a timeline";
    return s;
  }
  s.ok = true;
  s.rank = h->rank;
  s.pid = h->pid;
  s.clock_mono_ns = h->clock_mono_ns;
  s.clock_unix_ns = h->clock_unix_ns;
  s.progress = h->progress.load(std::memory_order_relaxed);
  s.progress_ns = h->progress_ns.load(std::memory_order_relaxed);
  s.step = h->step.load(std::memory_order_relaxed);
  // The current wait: retried while the writer changes it (bounded: a stopped writer in the
  // middle of a change leaves it odd, then it reads as "not waiting").
  Header* hw = header_of(b);
  for (int tries = 0; tries < 100; ++tries) {
    const uint64_t a = hw->current.seq.load(std::memory_order_acquire);
    if (a % 2) continue;
    Event c;
    c.kind = static_cast<Phase>(hw->current.kind);
    c.step = hw->current.step;
    c.layer = hw->current.layer;
    c.hop = hw->current.hop;
    c.peer = hw->current.peer;
    c.begin_ns = hw->current.since_ns;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (hw->current.seq.load(std::memory_order_relaxed) == a) {
      s.current = c;
      break;
    }
  }
  const uint64_t next = h->next.load(std::memory_order_acquire);
  const uint64_t first = next > kCapacity ? next - kCapacity : 0;
  Record* recs = records_of(b);
  s.events.reserve(static_cast<size_t>(next - first));
  for (uint64_t i = first; i < next; ++i) {
    Record& r = recs[i % kCapacity];
    const uint64_t want = (i + 1) * 2;
    if (r.seq.load(std::memory_order_acquire) != want) continue;  // overwritten or being written
    Event e = event_of(r);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.seq.load(std::memory_order_relaxed) != want) continue;
    if (e.step < min_step) continue;
    s.events.push_back(e);
  }
  return s;
}

Snapshot read_file(const std::string& path, int64_t min_step) {
  Mapping m;
  Snapshot s;
  s.error = m.open(path);
  if (!s.error.empty()) return s;
  return read_mapped(m.data(), min_step);
}

Mapping::~Mapping() {
  if (base_) ::munmap(base_, kFileBytes);
}
Mapping::Mapping(Mapping&& o) noexcept : base_(o.base_) {
  o.base_ = nullptr;
}
Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, kFileBytes);
    base_ = o.base_;
    o.base_ = nullptr;
  }
  return *this;
}
std::string Mapping::open(const std::string& path) {
  std::string error;
  void* p = map_file(path, false, &error);
  if (!p) return error;
  if (base_) ::munmap(base_, kFileBytes);
  base_ = p;
  return "";
}

}  // namespace ring::contract::timeline
