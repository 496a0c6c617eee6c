// The shared-memory header a worker checks when it maps ringd's segment (common/contract/shm.h).
// Input: one mode byte, then the segment's bytes (header first; the segment is exactly that
// long). Mode % 4 == 0: the rest only chooses n and workers for ShmRegion::create, and the
// worker's open() of what create made must succeed. Otherwise the bytes become a real POSIX
// shm segment that ShmRegion::open maps with the header's own n (so the fuzzer gets past that
// check). Property: open() either throws std::runtime_error or returns a region whose params,
// index and every gradient slot lie inside the mapping, in that order, without overlaps.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/contract/shm.h"
#include "tests/fuzz/targets.h"

namespace ring::fuzz {
namespace {

using I = __int128;

std::string name() {
  return "/ring-shm-fuzz-" + std::to_string(getpid());
}

}  // namespace

void shm_input(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const std::string nm = name();
  if (data[0] % 4 == 0) {
    int64_t n = 1;
    int workers = 1;
    if (size > 1) n = 1 + data[1] * 37;
    if (size > 2) workers = 1 + data[2] % 9;
    shm_unlink(nm.c_str());
    contract::ShmRegion made = contract::ShmRegion::create(nm, n, workers);
    try {
      contract::ShmRegion got = contract::ShmRegion::open(nm, n);
      if (got.workers() != workers || got.n() != n) fail("shm", "open() disagrees with create()");
    } catch (const std::runtime_error& e) {
      fail("shm", std::string("open() refused what create() made: ") + e.what());
    }
    return;
  }
  const uint8_t* seg = data + 1;
  const size_t len = size - 1;
  const int fd = shm_open(nm.c_str(), O_CREAT | O_TRUNC | O_RDWR, 0600);
  if (fd < 0) fail("shm", "shm_open " + nm + " failed");
  size_t done = 0;
  while (done < len) {
    const ssize_t w = ::write(fd, seg + done, len - done);
    if (w <= 0) fail("shm", "write failed");
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  contract::ShmHeader h{};
  std::memcpy(&h, seg, std::min(len, sizeof h));
  contract::ShmRegion r;
  try {
    r = contract::ShmRegion::open(nm, h.n);
  } catch (const std::runtime_error&) {
    shm_unlink(nm.c_str());
    return;
  }
  shm_unlink(nm.c_str());
  // Independent bounds check, in 128 bits, from the header as the fuzzer wrote it.
  const I seg_size = static_cast<I>(len), bytes = I{h.params_n} * 4,
          index_bytes = I{h.index_n} * 8, slot_bytes = I{h.slot_n} * 4;
  if (h.params_begin < 0 || h.params_n < 0 || I{h.params_begin} + h.params_n > I{h.n} ||
      h.index_n < 0 || h.index_n > h.n || h.slot_n < 0 || h.slot_n > h.n)
    fail("shm", "opened a segment whose params, index or slots exceed the model");
  const auto within = [&](int64_t offset, I extent, const char* what) {
    if (offset < static_cast<int64_t>(sizeof(contract::ShmHeader)) || I{offset} + extent > seg_size)
      fail("shm", std::string("opened a segment whose ") + what + " lie outside it");
  };
  within(h.params_off, bytes, "params");
  within(h.index_off, index_bytes, "index");
  if (h.workers == 0) fail("shm", "opened a segment without gradient slots");
  if (h.slot_stride < slot_bytes) fail("shm", "opened a segment whose gradient slots overlap");
  within(h.grads_off, I{h.slot_stride} * (h.workers - 1) + slot_bytes, "gradients");
  if (I{h.params_off} + bytes > I{h.index_off} || I{h.index_off} + index_bytes > I{h.grads_off})
    fail("shm", "opened a segment whose regions overlap");
  // Touch the ends of every array through the accessors, as the worker and ringd do.
  volatile float sink = 0;
  if (r.params_n() > 0) sink = sink + r.params()[0] + r.params()[r.params_n() - 1];
  if (r.index_n() > 0) {
    volatile uint64_t isink = r.index()[0] + r.index()[r.index_n() - 1];
    (void)isink;
  }
  if (r.slot_n() > 0)
    for (int k = 0; k < std::min(r.workers(), 64); ++k)
      sink = sink + r.grads(k)[0] + r.grads(k)[r.slot_n() - 1];
}

}  // namespace ring::fuzz
