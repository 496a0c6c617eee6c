// One timed fp32 GEMM through a provider of kernels/cpu/gemm.h (OpenBLAS, oneDNN), shared by
// gemm_bench and attention_bench, whose sgemm baseline is the best provider built in: a baseline
// run by an OpenBLAS that fell back to old kernels measures nothing (docs/performance.md).
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace ring::bench {

// C[m,n] = op(A) op(B), row-major, 2 m n k FLOPs.
struct GemmShape {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  std::string label() const {
    return std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " " + std::to_string(m) + "x" +
           std::to_string(n) + "x" + std::to_string(k);
  }
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};

// The providers this build has, in kernels::cpu::kGemmProviders order.
inline std::vector<kernels::cpu::GemmProvider> built_gemm_providers() {
  std::vector<kernels::cpu::GemmProvider> out;
  for (auto p : kernels::cpu::kGemmProviders) {
    if (kernels::cpu::gemm_provider_built(p)) out.push_back(p);
  }
  return out;
}

// Operands of one shape (uniform in [-1, 1]) and the timed call.
class GemmTimer {
 public:
  GemmTimer(GemmShape s, uint32_t seed) : s_(s) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    a_.resize(static_cast<size_t>(s.m * s.k));
    b_.resize(static_cast<size_t>(s.k * s.n));
    c_.resize(static_cast<size_t>(s.m * s.n));
    for (float& x : a_) x = u(rng);
    for (float& x : b_) x = u(rng);
  }
  const GemmShape& shape() const { return s_; }

  // GFLOP/s of one call; negative when the provider failed (the status is printed). When
  // cpu_gflops is given: FLOPs per second of this process's CPU time (all threads) times
  // `threads`, the rate had the threads had their cores, which load on a shared machine lowers
  // far less than the wall-clock rate.
  double gflops(kernels::cpu::GemmProvider p, int threads, double* cpu_gflops = nullptr) {
    timespec c0{}, c1{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    const auto t0 = std::chrono::steady_clock::now();
    const kernels::Status st =
        kernels::cpu::sgemm(p, s_.ta, s_.tb, s_.m, s_.n, s_.k, 1.f, a_.data(), s_.ta ? s_.m : s_.k,
                            b_.data(), s_.tb ? s_.k : s_.n, 0.f, c_.data(), s_.n, threads);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    if (cpu_gflops) {
      const double cpu = (c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec);
      *cpu_gflops = s_.flops() / cpu * threads * 1e-9;
    }
    if (st != kernels::Status::kOk) {
      std::fprintf(stderr, "sgemm %s through %s failed: %s\n", s_.label().c_str(),
                   kernels::cpu::gemm_provider_name(p), kernels::status_string(st));
      return -1;
    }
    return s_.flops() / t * 1e-9;
  }

 private:
  GemmShape s_;
  std::vector<float> a_, b_, c_;
};

}  // namespace ring::bench
