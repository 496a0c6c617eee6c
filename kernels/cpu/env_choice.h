// A process-wide choice made once from the environment at first use and replaceable afterwards
// (tests and benchmarks switch it): the ISA of ops.cc (RING_CPU_ISA) and the GEMM provider of
// gemm.cc (RING_GEMM). Reading it costs one atomic load once chosen.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>

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

// What resolving an environment value gave: the value, why (one line, logged), and whether the
// value was not honoured as written (a warning).
template <typename E>
struct Resolved {
  E value{};
  std::string reason;
  bool warning = false;
};

// The values such a choice can take, each with its spelling in the environment variable and
// whether this build has it: one table per choice instead of a name switch and a built switch.
template <typename E>
struct NamedChoice {
  E value;
  const char* name;
  bool built;
};

template <typename E, size_t N>
constexpr const NamedChoice<E>* find_choice(const NamedChoice<E> (&table)[N], E v) {
  for (const NamedChoice<E>& c : table)
    if (c.value == v) return &c;
  return nullptr;
}
template <typename E, size_t N>
constexpr const char* choice_name(const NamedChoice<E> (&table)[N], E v) {
  const NamedChoice<E>* c = find_choice(table, v);
  return c ? c->name : "unknown";
}
template <typename E, size_t N>
constexpr bool choice_built(const NamedChoice<E> (&table)[N], E v) {
  const NamedChoice<E>* c = find_choice(table, v);
  return c && c->built;
}

}  // namespace ring::kernels::cpu
