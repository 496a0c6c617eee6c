// The decode attention's thread pool (worker/generate/thread_pool.h): every task of a job runs
// exactly once and before parallel_for returns, whatever the thread count (more threads than
// cores included, so workers are descheduled mid-job and wake late), a worker that wakes after
// a job ended never runs a task of it, and workers asleep between jobs wake for the next one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "worker/generate/thread_pool.h"

namespace ring::gen {
namespace {

TEST(ThreadPool, EveryTaskRunsOnceBeforeTheCallReturns) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1000}) {
      for (int rep = 0; rep < 200; ++rep) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
              << threads << " threads, n " << n << ", task " << i << ", repetition " << rep;
      }
    }
  }
}

// Each job has a record that outlives it; the record is closed when parallel_for returns, and a
// task that finds its job's record closed ran after the job ended (a late worker claiming with a
// stale ticket).
TEST(ThreadPool, LateWorkersNeverRunTasksOfAFinishedJob) {
  struct Job {
    std::atomic<bool> closed{false};
    std::atomic<int64_t> ran{0};
  };
  ThreadPool pool(6);  // more threads than this machine's cores: some wake late
  std::atomic<int64_t> late{0};
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<int64_t> sizes;
  for (int j = 0; j < 3000; ++j) {
    jobs.push_back(std::make_unique<Job>());
    Job* job = jobs.back().get();
    const int64_t n = 1 + j % 9;
    sizes.push_back(n);
    pool.parallel_for(n, [&late, job](int64_t) {
      if (job->closed.load()) late.fetch_add(1);
      job->ran.fetch_add(1);
    });
    job->closed.store(true);
  }
  EXPECT_EQ(late.load(), 0);
  for (size_t j = 0; j < jobs.size(); ++j) EXPECT_EQ(jobs[j]->ran.load(), sizes[j]) << "job " << j;
}

TEST(ThreadPool, WorkersAsleepBetweenJobsWakeForTheNext) {
  ThreadPool pool(3);
  for (int round = 0; round < 20; ++round) {
    // Idle long enough for the workers to stop spinning and sleep on the futex.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic<int64_t> sum{0};
    pool.parallel_for(100, [&](int64_t i) { sum.fetch_add(i); });
    ASSERT_EQ(sum.load(), 4950) << "round " << round;
  }
}

TEST(ThreadPool, DestroyedWhileWorkersSpinOrSleep) {
  for (int round = 0; round < 50; ++round) {
    ThreadPool pool(4);
    std::atomic<int> n{0};
    pool.parallel_for(16, [&](int64_t) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 16);
    if (round % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }  // each destructor joins its workers (the test would hang otherwise)
}

}  // namespace
}  // namespace ring::gen
