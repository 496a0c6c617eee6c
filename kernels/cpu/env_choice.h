// A process-wide choice made once from the environment at first use and replaceable afterwards
// (tests and benchmarks switch it): the ISA of ops.cc (RING_CPU_ISA) and the GEMM provider of
// gemm.cc (RING_GEMM). Reading it costs one atomic load once chosen.
#pragma once

#include <atomic>
#include <mutex>

namespace ring::kernels::cpu {

class EnvChoice {
 public:
  // The current value (>= 0); the first call runs choose() (which reads the environment and
  // logs what it decided) exactly once, whichever thread gets there first.
  template <class Choose>
  int get(Choose&& choose) {
    int v = value_.load(std::memory_order_acquire);
    if (v >= 0) return v;
    std::call_once(once_, [&] {
      int expected = -1;
      value_.compare_exchange_strong(expected, choose());
    });
    return value_.load(std::memory_order_acquire);
  }
  // Replaces the value. The environment is consumed first, so it cannot override this later.
  template <class Choose>
  void set(int value, Choose&& choose) {
    get(choose);
    value_.store(value, std::memory_order_release);
  }

 private:
  std::atomic<int> value_{-1};  // -1: not chosen yet
  std::once_flag once_;
};

}  // namespace ring::kernels::cpu
