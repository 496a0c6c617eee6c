// AdamW step throughput: bytes/s of one fused step over n fp32 parameters (param,
// grad, m, v read; param, m, v written: 28 bytes per parameter) against
//   - a memory copy of the same state size (16 n bytes copied with memcpy, split over the same
//     threads; counted as 32 n bytes moved: read + write), measured interleaved in the same run:
//     target ratio >= 0.8;
//   - torch.optim.AdamW (python3-torch 1.13, bench/torch_adamw.py, same n and threads):
//     target >= 5x faster.
//
//   adamw_bench [--n=33554432] [--threads=0] [--reps=7] [--torch=1] [benchmark flags]
// Memory is allocated once and pre-touched by the threads that use it (first touch here costs
// about 0.3 s/GiB and would otherwise dominate).
#include <omp.h>

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

int64_t g_n = int64_t{1} << 25;  // 32M parameters: 512 MiB of optimizer state
int g_threads = 0;
int g_reps = 7;
bool g_torch = true;

std::unique_ptr<Backend> g_backend;
float *g_p, *g_g, *g_m, *g_v;  // [n] each
char *g_src, *g_dst;           // [16 n] bytes each

float* alloc_floats(int64_t n) {
  void* p = nullptr;
  if (g_backend->alloc(sizeof(float) * n, &p) != Status::kOk) {
    std::fprintf(stderr, "adamw_bench: out of memory\n");
    std::exit(1);
  }
  return static_cast<float*>(p);
}

// Same threads, same static split as the kernels: each thread copies one contiguous part.
void parallel_memcpy(char* dst, const char* src, size_t bytes) {
#pragma omp parallel num_threads(g_threads)
  {
    size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    size_t chunk = (bytes / nt + 63) / 64 * 64;
    size_t b = std::min(bytes, id * chunk), e = std::min(bytes, b + chunk);
    std::memcpy(dst + b, src + b, e - b);
  }
}

void BM_AdamW(benchmark::State& state) {
  Backend::AdamWParams hp{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
  for (auto _ : state) {
    if (g_backend->adamw_step(g_n, hp, g_p, g_g, g_m, g_v) != Status::kOk) {
      state.SkipWithError("adamw_step failed");
      break;
    }
    ++hp.step;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 28 * g_n);
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = 16 * static_cast<size_t>(g_n);
  for (auto _ : state) {
    parallel_memcpy(g_dst, g_src, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<int64_t>(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  using ring::bench::take_flag;
  std::vector<char*> args = {argv[0]};
  std::string v;
  for (int i = 1; i < argc; ++i) {
    if (take_flag(argv[i], "--n", &v)) {
      g_n = std::atoll(v.c_str());
    } else if (take_flag(argv[i], "--threads", &v)) {
      g_threads = std::atoi(v.c_str());
    } else if (take_flag(argv[i], "--reps", &v)) {
      g_reps = std::atoi(v.c_str());
    } else if (take_flag(argv[i], "--torch", &v)) {
      g_torch = v != "0";
    } else {
      args.push_back(argv[i]);
    }
  }
  if (g_n <= 0 || g_threads < 0 || g_reps < 1) {
    std::fprintf(stderr, "adamw_bench: --n > 0, --threads >= 0, --reps >= 1\n");
    return 2;
  }
  std::string err;
  g_backend = ring::kernels::create_backend("cpu", g_threads, &err);
  if (!g_backend) {
    std::fprintf(stderr, "adamw_bench: %s\n", err.c_str());
    return 1;
  }
  if (g_threads == 0) g_threads = ring::kernels::cpu::hardware_threads();
  g_p = alloc_floats(g_n);
  g_g = alloc_floats(g_n);
  g_m = alloc_floats(g_n);
  g_v = alloc_floats(g_n);
  g_src = reinterpret_cast<char*>(alloc_floats(4 * g_n));
  g_dst = reinterpret_cast<char*>(alloc_floats(4 * g_n));
  // Pre-touch with the same threads and split the kernels use.
  g_backend->fill(g_n, 0.5f, g_p);
  g_backend->fill(g_n, 1e-3f, g_g);
  g_backend->fill(g_n, 0.f, g_m);
  g_backend->fill(g_n, 0.f, g_v);
  g_backend->fill(4 * g_n, 1.f, reinterpret_cast<float*>(g_src));
  g_backend->fill(4 * g_n, 0.f, reinterpret_cast<float*>(g_dst));

  std::string reps = "--benchmark_repetitions=" + std::to_string(g_reps);
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  args.insert(args.begin() + 1, {reps.data(), interleave.data()});
  int bargc = static_cast<int>(args.size());
  benchmark::Initialize(&bargc, args.data());
  benchmark::RegisterBenchmark("AdamW", BM_AdamW)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("Memcpy", BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
  ring::bench::CaptureReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  const auto& adam = reporter.seconds["AdamW"];
  const auto& copy = reporter.seconds["Memcpy"];
  if (adam.empty() || copy.empty()) return 1;
  // bandwidth ratio = (28 n / t_adam) / (32 n / t_copy) = (28 / 32) * t_copy / t_adam
  std::vector<double> bw_ratio;
  for (size_t i = 0; i < std::min(adam.size(), copy.size()); ++i) {
    bw_ratio.push_back(28.0 / 32.0 * copy[i] / adam[i]);
  }
  auto r = ring::bench::spread(bw_ratio);
  auto ta = ring::bench::spread(adam), tc = ring::bench::spread(copy);
  std::printf("\n== AdamW summary: n=%lld (%.0f MiB state), threads=%d, isa=%s, %zu reps ==\n",
              static_cast<long long>(g_n), 16.0 * g_n / (1 << 20), g_threads,
              ring::kernels::cpu::isa_name(ring::kernels::cpu::active_isa()), r.count);
  std::printf("AdamW  : %.2f GB/s (median; %.2f..%.2f), %.2f ms/step\n",
              28.0 * g_n / ta.median / 1e9, 28.0 * g_n / ta.max / 1e9, 28.0 * g_n / ta.min / 1e9,
              ta.median * 1e3);
  std::printf("memcpy : %.2f GB/s (median; %.2f..%.2f)\n", 32.0 * g_n / tc.median / 1e9,
              32.0 * g_n / tc.max / 1e9, 32.0 * g_n / tc.min / 1e9);
  std::printf("AdamW / memcpy bandwidth: median %.3f (min %.3f, max %.3f)   target >= 0.8: %s\n",
              r.median, r.min, r.max, r.median >= 0.8 ? "MET" : "NOT MET");

  if (g_torch) {
    const ring::bench::TorchAdamW t =
        ring::bench::run_torch_adamw(RING_SOURCE_DIR, g_n, g_threads, g_reps);
    if (!t.ok) {
      std::printf("torch.optim.AdamW: FAILED to run (%d): %s\n", t.rc, t.output.c_str());
      return 1;
    }
    const double med = t.seconds.median, mn = t.seconds.min, mx = t.seconds.max;
    std::printf("%s", t.line.c_str());
    std::printf(
        "torch.optim.AdamW / ours (time per step): median %.2fx (torch min/ours max "
        "%.2fx, torch max/ours min %.2fx)   target >= 5x: %s\n",
        med / ta.median, mn / ta.max, mx / ta.min, med / ta.median >= 5 ? "MET" : "NOT MET");
  }
  return 0;
}
