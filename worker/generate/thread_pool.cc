#include "worker/generate/thread_pool.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

namespace ring::gen {
namespace {

// How long a worker spins for the next job before it sleeps: longer than the dense part of a
// decode step's layer (the gap between two layers' jobs), short enough not to matter to others.
constexpr auto kSpin = std::chrono::microseconds(100);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

constexpr uint64_t kIndexMask = 0xffffffffULL;

}  // namespace

ThreadPool::ThreadPool(int threads) {
  threads_ = threads > 0 ? threads : std::max(1, omp_get_num_procs());
  workers_.reserve(static_cast<size_t>(threads_ - 1));
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  posted_.fetch_add(1, std::memory_order_seq_cst);
  posted_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(uint32_t gen) {
  uint64_t t = ticket_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(t >> 32) != gen) return;  // a later job: not ours
    // fn_ and n_ are the job's while its generation holds the ticket (they change only after
    // every task of it is done, and a claim below succeeds only if none is left unclaimed).
    const auto* fn = fn_.load(std::memory_order_acquire);
    const int64_t n = n_.load(std::memory_order_acquire);
    const int64_t i = static_cast<int64_t>(t & kIndexMask);
    if (i >= n) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire))
      continue;  // t reloaded
    (*fn)(i);
    done_.fetch_add(1, std::memory_order_release);
    t = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = posted_.load(std::memory_order_acquire);
    if (g == seen) {
      const auto until = std::chrono::steady_clock::now() + kSpin;
      for (int spins = 0; g == seen; ++spins) {
        cpu_relax();
        g = posted_.load(std::memory_order_acquire);
        if ((spins & 255) == 255 && std::chrono::steady_clock::now() > until) break;
      }
    }
    while (g == seen && !stop_.load(std::memory_order_seq_cst)) {
      // Sleep; the caller notifies only while someone sleeps (sleepers_ and posted_ are both
      // seq_cst: it sees the count, or this thread sees the new generation).
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      g = posted_.load(std::memory_order_seq_cst);
      if (g == seen) posted_.wait(seen, std::memory_order_seq_cst);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      g = posted_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_seq_cst)) return;
    seen = g;
    run(g);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (threads_ == 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // The ticket's index has 32 bits: a larger n runs as several jobs.
  constexpr int64_t kMaxJob = int64_t{1} << 31;
  if (n > kMaxJob) {
    for (int64_t lo = 0; lo < n; lo += kMaxJob) {
      const int64_t len = std::min(kMaxJob, n - lo);
      parallel_for(len, [&](int64_t i) { fn(lo + i); });
    }
    return;
  }
  const uint32_t gen = ++gen_;
  // Close the ticket first (the new generation, no index claimable): a worker that loaded the
  // previous job's ticket and reads the new n_ below cannot claim with it.
  ticket_.store((static_cast<uint64_t>(gen) << 32) | kIndexMask, std::memory_order_seq_cst);
  // Released: a worker that reads them has the closed ticket ordered before its claim.
  fn_.store(&fn, std::memory_order_release);
  n_.store(n, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  ticket_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);
  posted_.store(gen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) posted_.notify_all();
  run(gen);
  // Only tasks a worker has claimed are left: wait for them (spinning, then yielding the core
  // to a descheduled worker).
  for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096)
      cpu_relax();
    else
      std::this_thread::yield();
  }
}

}  // namespace ring::gen
