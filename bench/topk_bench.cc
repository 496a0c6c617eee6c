// Top-k by magnitude (gradient compression at density 0.001): our topk_abs on n fp32
// values (default 256M = 1 GiB) against
//   - one streaming read of the same memory (a vectorized sum, same threads): target within 2x;
//   - std::nth_element (the textbook way: |x| copied into a buffer, nth_element for the k-th
//     magnitude, then one pass collecting the indices at or above it; single-threaded).
// Measured interleaved in the same run, repetitions paired for the ratios.
//
//   topk_bench [--n=268435456] [--density=0.001] [--threads=0] [--reps=7] [benchmark flags]
// Memory is allocated once and pre-touched (first touch costs about 0.3 s/GiB here).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"

namespace {

using ring::kernels::Backend;
using ring::kernels::Status;

int64_t g_n = int64_t{1} << 28;
double g_density = 0.001;
int g_threads = 0;
int g_reps = 7;
int64_t g_k = 0;

std::unique_ptr<Backend> g_backend;
float* g_x;       // [n] gradient-like values
float* g_abs;     // [n] scratch for the nth_element baseline
uint32_t* g_idx;  // [k]
float* g_val;     // [k]
volatile float g_sink;

void* alloc_bytes(size_t bytes) {
  void* p = nullptr;
  if (g_backend->alloc(bytes, &p) != Status::kOk) {
    std::fprintf(stderr, "topk_bench: out of memory\n");
    std::exit(1);
  }
  return p;
}

// Streaming read baseline: sum of all values, 4 independent AVX2 accumulators per thread
// (plain loop where AVX2 is missing).
__attribute__((target("avx2,fma"))) float sum_avx2(const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
  for (; i < n; ++i) s += x[i];
  return s;
}

float parallel_sum(const float* x, int64_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  float total = 0;
#pragma omp parallel num_threads(g_threads) reduction(+ : total)
  {
    int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t chunk = (n + nt - 1) / nt;
    int64_t b = std::min(n, id * chunk), e = std::min(n, b + chunk);
    if (avx2) {
      total += sum_avx2(x + b, e - b);
    } else {
      float s = 0;
      for (int64_t i = b; i < e; ++i) s += x[i];
      total += s;
    }
  }
  return total;
}

void BM_TopK(benchmark::State& state) {
  for (auto _ : state) {
    if (g_backend->topk_abs(g_n, g_k, g_x, g_idx, g_val) != Status::kOk) {
      state.SkipWithError("topk_abs failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 4 * g_n);
}

void BM_StreamRead(benchmark::State& state) {
  for (auto _ : state) g_sink = parallel_sum(g_x, g_n);
  state.SetBytesProcessed(state.iterations() * 4 * g_n);
}

void BM_NthElement(benchmark::State& state) {
  for (auto _ : state) {
    for (int64_t i = 0; i < g_n; ++i) g_abs[i] = std::fabs(g_x[i]);
    std::nth_element(g_abs, g_abs + (g_k - 1), g_abs + g_n, std::greater<float>());
    const float kth = g_abs[g_k - 1];
    int64_t o = 0;
    for (int64_t i = 0; i < g_n && o < g_k; ++i) {
      if (std::fabs(g_x[i]) >= kth) {
        g_idx[o] = static_cast<uint32_t>(i);
        g_val[o++] = g_x[i];
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 4 * g_n);
}

}  // namespace

int main(int argc, char** argv) {
  using ring::bench::take_flag;
  std::vector<char*> args = {argv[0]};
  std::string v;
  bool nth = true;
  for (int i = 1; i < argc; ++i) {
    if (take_flag(argv[i], "--n", &v)) {
      g_n = std::atoll(v.c_str());
    } else if (take_flag(argv[i], "--density", &v)) {
      g_density = std::atof(v.c_str());
    } else if (take_flag(argv[i], "--threads", &v)) {
      g_threads = std::atoi(v.c_str());
    } else if (take_flag(argv[i], "--reps", &v)) {
      g_reps = std::atoi(v.c_str());
    } else if (take_flag(argv[i], "--nth", &v)) {
      nth = v != "0";
    } else {
      args.push_back(argv[i]);
    }
  }
  g_k = static_cast<int64_t>(g_density * static_cast<double>(g_n));
  if (g_n <= 0 || g_n > (int64_t{1} << 32) || g_k < 1 || g_k > g_n || g_threads < 0 || g_reps < 1) {
    std::fprintf(stderr, "topk_bench: need 0 < n <= 2^32, 1 <= density*n <= n, threads >= 0\n");
    return 2;
  }
  std::string err;
  g_backend = ring::kernels::create_backend("cpu", g_threads, &err);
  if (!g_backend) {
    std::fprintf(stderr, "topk_bench: %s\n", err.c_str());
    return 1;
  }
  if (g_threads == 0) g_threads = ring::kernels::cpu::hardware_threads();
  g_x = static_cast<float*>(alloc_bytes(4 * g_n));
  g_abs = nth ? static_cast<float*>(alloc_bytes(4 * g_n)) : nullptr;
  g_idx = static_cast<uint32_t*>(alloc_bytes(4 * g_k));
  g_val = static_cast<float*>(alloc_bytes(4 * g_k));
  // Gradient-like data, generated (and first touched) in parallel: approximately normal (sum
  // of 4 uniforms) with a scale that varies per 64K block, like gradients of different layers.
#pragma omp parallel for num_threads(g_threads) schedule(static)
  for (int64_t blk = 0; blk < (g_n + 65535) / 65536; ++blk) {
    uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(blk + 1);
    float scale = 0.1f + static_cast<float>(blk % 97) * 0.05f;
    int64_t e = std::min(g_n, (blk + 1) * 65536);
    for (int64_t i = blk * 65536; i < e; ++i) {
      float u = 0;
      for (int q = 0; q < 4; ++q) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        u += static_cast<float>(s >> 40) * 0x1.0p-24f;
      }
      g_x[i] = (u - 2.f) * scale;
    }
  }
  if (nth) g_backend->fill(g_n, 0.f, g_abs);

  std::string reps = "--benchmark_repetitions=" + std::to_string(g_reps);
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  args.insert(args.begin() + 1, {reps.data(), interleave.data()});
  int bargc = static_cast<int>(args.size());
  benchmark::Initialize(&bargc, args.data());
  benchmark::RegisterBenchmark("TopK", BM_TopK)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("StreamRead", BM_StreamRead)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  if (nth) {
    benchmark::RegisterBenchmark("NthElement", BM_NthElement)
        ->UseRealTime()
        ->Iterations(1)
        ->Repetitions(std::min(g_reps, 3))
        ->Unit(benchmark::kMillisecond);
  }
  ring::bench::CaptureReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  const auto& topk = reporter.seconds["TopK"];
  const auto& read = reporter.seconds["StreamRead"];
  if (topk.empty() || read.empty()) return 1;
  auto r = ring::bench::paired_ratio(topk, read);
  auto tt = ring::bench::spread(topk), tr = ring::bench::spread(read);
  std::printf("\n== Top-k summary: n=%lld (%.2f GiB), k=%lld (density %g), threads=%d, isa=%s ==\n",
              static_cast<long long>(g_n), 4.0 * g_n / (1 << 30), static_cast<long long>(g_k),
              g_density, g_threads, ring::kernels::cpu::isa_name(ring::kernels::cpu::active_isa()));
  std::printf("topk_abs    : %.1f ms (median; %.1f..%.1f), path %d (1 = sampled)\n",
              tt.median * 1e3, tt.min * 1e3, tt.max * 1e3,
              static_cast<int>(ring::kernels::cpu::topk_last_path()));
  std::printf("stream read : %.1f ms (median; %.1f..%.1f) = %.2f GB/s\n", tr.median * 1e3,
              tr.min * 1e3, tr.max * 1e3, 4.0 * g_n / tr.median / 1e9);
  std::printf("topk / stream read time: median %.2f (min %.2f, max %.2f)   target <= 2: %s\n",
              r.median, r.min, r.max, r.median <= 2.0 ? "MET" : "NOT MET");
  if (nth) {
    auto tn = ring::bench::spread(reporter.seconds["NthElement"]);
    std::printf(
        "std::nth_element baseline: %.1f ms (median; %.1f..%.1f): topk_abs is %.1fx "
        "faster\n",
        tn.median * 1e3, tn.min * 1e3, tn.max * 1e3, tn.median / tt.median);
  }
  return 0;
}
