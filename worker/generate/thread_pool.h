// The CPU threads of decode attention: a fixed set of worker threads plus the calling thread,
// running the tasks of one parallel_for at a time.
//
// Why not an OpenMP parallel region: a decode step runs one region per layer, each a few hundred
// microseconds at 32K tokens of context, and a region's fork (waking the team) and join (every
// thread arriving at the barrier, the caller woken from it) cost tens of microseconds each on
// this kind of machine; on a loaded machine the join waits a whole time slice for a thread that
// was descheduled before it took any task. Here the caller takes tasks itself and returns as soon
// as every task is DONE: a worker that wakes late finds none left and never holds the caller up
// (only a task a worker has started is waited for). Workers spin briefly after a job (the next
// layer's job usually comes within that), then sleep on a futex (std::atomic::wait).
//
// Tasks are claimed one at a time from one atomic ticket (generation << 32 | next index), so a
// worker still holding a previous job's ticket can never run a task of the wrong job.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace ring::gen {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // 0: all cores; threads - 1 workers are started
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const { return threads_; }
  // Runs fn(i) for i in [0, n), each once, on the caller and the workers (dynamically: a task at
  // a time); returns when all are done. One call at a time (not reentrant, one caller thread).
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void worker();
  // Claims and runs tasks of generation gen until none are left.
  void run(uint32_t gen);

  int threads_ = 1;
  std::vector<std::thread> workers_;
  uint32_t gen_ = 0;  // the caller's last generation
  alignas(64) std::atomic<uint64_t> ticket_{0};
  alignas(64) std::atomic<int64_t> done_{0};
  alignas(64) std::atomic<uint32_t> posted_{0};  // the last generation posted (the futex word)
  std::atomic<int> sleepers_{0};
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::atomic<int64_t> n_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace ring::gen
