// The cost of one timeline record (common/contract/timeline.h: TimelineWriter::record into a
// mapped file on /dev/shm) against the same 64 bytes stored into a plain in-process ring of the
// same size, in the same run: ns per record, median and spread over repetitions. With the
// records a step writes (printed by bench/timeline_overhead.sh) this bounds the timeline's share
// of a step independently of the run-to-run noise of whole steps.
//   timeline_record_bench [--records N] [--reps R]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/contract/timeline.h"

namespace tl = ring::contract::timeline;

namespace {
struct Spread {
  double median, min, max;
};
Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}
}  // namespace

int main(int argc, char** argv) {
  int64_t records = 2000000;
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--records") == 0) records = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  const std::string path = "/dev/shm/ringmaster-timeline-bench-" + std::to_string(::getpid());
  if (const std::string e = tl::create_file(path, 0); !e.empty()) {
    std::fprintf(stderr, "timeline_record_bench: %s\n", e.c_str());
    return 1;
  }
  tl::TimelineWriter w;
  if (const std::string e = w.open(path, 0, ::getpid()); !e.empty()) {
    std::fprintf(stderr, "timeline_record_bench: %s\n", e.c_str());
    return 1;
  }
  ::unlink(path.c_str());
  struct Plain {
    int64_t v[8];
  };
  std::vector<Plain> ring(tl::kCapacity);
  using Clock = std::chrono::steady_clock;
  std::vector<double> rec_ns, plain_ns, ratio;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < records; ++i)
      w.record({.kind = tl::Phase::kRingRecv,
                .step = i,
                .layer = 3,
                .hop = 1,
                .peer = 2,
                .begin_ns = i,
                .end_ns = i + 1,
                .bytes = 4096});
    const double a = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / records;
    t0 = Clock::now();
    for (int64_t i = 0; i < records; ++i) {
      Plain& p = ring[static_cast<size_t>(i) % ring.size()];
      p.v[0] = i;
      p.v[1] = i;
      p.v[2] = i + 1;
      p.v[3] = i;
      p.v[4] = 4096;
      p.v[5] = 3;
      asm volatile("" : : "r"(&p) : "memory");
    }
    const double b = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / records;
    rec_ns.push_back(a);
    plain_ns.push_back(b);
    ratio.push_back(a / b);
  }
  const Spread s = spread(rec_ns), p = spread(plain_ns), q = spread(ratio);
  std::printf(
      "timeline record: %.1f ns (min %.1f, max %.1f) | plain 64-byte store: %.1f ns | "
      "ratio %.2f (min %.2f, max %.2f), %d reps of %lld records\n",
      s.median, s.min, s.max, p.median, q.median, q.min, q.max, reps,
      static_cast<long long>(records));
  std::printf("ns_per_record %.2f\n", s.median);
  return 0;
}
