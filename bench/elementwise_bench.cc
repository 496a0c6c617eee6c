// Bandwidth of the CPU backend's streaming elementwise kernels (fill, scale, axpy, add) against a
// memory copy split over the same threads, measured interleaved in the same run. Each kernel is
// memory bound, so its bytes moved per second over memcpy's is the figure of merit (1.0: as fast
// as the copy; write-allocate makes a pure store stream such as fill cost about as much as a
// copy per byte written, so fill's ratio can read above 1).
//
//   elementwise_bench [N floats, default 67108864] [benchmark flags]
//
// Bytes moved per element: fill 4 (write), scale 8 (read + write), axpy 12, add 12; memcpy 8.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_stats.h"
#include "kernels/backend.h"
#include "kernels/cpu/ops.h"

namespace {

using ring::kernels::Backend;
using ring::kernels::Status;

int64_t g_n = int64_t{1} << 26;  // 64M floats: 256 MiB per array
int g_threads = 0;
std::unique_ptr<Backend> g_backend;
float *g_a, *g_b, *g_c;

const std::map<std::string, double> kBytesPerElement = {
    {"Fill", 4}, {"Scale", 8}, {"Axpy", 12}, {"Add", 12}, {"Memcpy", 8}};

void check(Status s, benchmark::State& state) {
  if (s != Status::kOk) state.SkipWithError("kernel failed");
}

void BM_Fill(benchmark::State& state) {
  for (auto _ : state) {
    check(g_backend->fill(g_n, 0.25f, g_c), state);
    benchmark::ClobberMemory();
  }
}
void BM_Scale(benchmark::State& state) {
  for (auto _ : state) {
    check(g_backend->scale(g_n, 1.0f, g_c), state);
    benchmark::ClobberMemory();
  }
}
void BM_Axpy(benchmark::State& state) {
  for (auto _ : state) {
    check(g_backend->axpy(g_n, 1e-7f, g_a, g_c), state);
    benchmark::ClobberMemory();
  }
}
void BM_Add(benchmark::State& state) {
  for (auto _ : state) {
    check(g_backend->add(g_n, g_a, g_b, g_c), state);
    benchmark::ClobberMemory();
  }
}
// Same threads, same static split as the kernels: each thread copies one contiguous part.
void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(g_n);
  char* dst = reinterpret_cast<char*>(g_c);
  const char* src = reinterpret_cast<const char*>(g_a);
  for (auto _ : state) {
#pragma omp parallel num_threads(g_threads)
    {
      size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      size_t chunk = (bytes / nt + 63) / 64 * 64;
      size_t b = std::min(bytes, id * chunk), e = std::min(bytes, b + chunk);
      std::memcpy(dst + b, src + b, e - b);
    }
    benchmark::ClobberMemory();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') {
      char* end = nullptr;
      g_n = std::strtoll(argv[i], &end, 10);
      if (*end != '\0' || g_n <= 0) {
        std::fprintf(stderr, "elementwise_bench: N must be a positive integer, got '%s'\n",
                     argv[i]);
        return 2;
      }
    } else {
      args.push_back(argv[i]);
    }
  }
  std::string err;
  g_backend = ring::kernels::create_backend("cpu", 0, &err);
  if (!g_backend) {
    std::fprintf(stderr, "elementwise_bench: %s\n", err.c_str());
    return 1;
  }
  g_threads = ring::kernels::cpu::hardware_threads();
  for (float** p : {&g_a, &g_b, &g_c}) {
    void* mem = nullptr;
    if (g_backend->alloc(sizeof(float) * g_n, &mem) != Status::kOk) {
      std::fprintf(stderr, "elementwise_bench: out of memory for 3 x %lld floats\n",
                   static_cast<long long>(g_n));
      return 1;
    }
    *p = static_cast<float*>(mem);
  }
  // Pre-touch with the kernels' own threads and split (first touch costs ~0.3 s/GiB here).
  g_backend->fill(g_n, 1.f, g_a);
  g_backend->fill(g_n, 2.f, g_b);
  g_backend->fill(g_n, 0.f, g_c);

  std::string reps = "--benchmark_repetitions=7";
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  args.insert(args.begin() + 1, {reps.data(), interleave.data()});
  int bargc = static_cast<int>(args.size());
  benchmark::Initialize(&bargc, args.data());
  for (auto [name, fn] : std::vector<std::pair<const char*, void (*)(benchmark::State&)>>{
           {"Fill", BM_Fill},
           {"Scale", BM_Scale},
           {"Axpy", BM_Axpy},
           {"Add", BM_Add},
           {"Memcpy", BM_Memcpy}})
    benchmark::RegisterBenchmark(name, fn)->UseRealTime()->Unit(benchmark::kMillisecond);
  ring::bench::CaptureReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  const auto& copy = reporter.seconds["Memcpy"];
  if (copy.empty()) return 1;
  const auto tc = ring::bench::spread(copy);
  std::printf("\n== elementwise summary: n=%lld (%.0f MiB per array), threads=%d, isa=%s ==\n",
              static_cast<long long>(g_n), 4.0 * g_n / (1 << 20), g_threads,
              ring::kernels::cpu::isa_name(ring::kernels::cpu::active_isa()));
  std::printf("memcpy : %.2f GB/s (median)\n", 8.0 * g_n / tc.median / 1e9);
  for (const char* name : {"Fill", "Scale", "Axpy", "Add"}) {
    const auto& t = reporter.seconds[name];
    if (t.empty()) continue;
    const double bpe = kBytesPerElement.at(name);
    // bandwidth ratio = (bpe n / t_op) / (8 n / t_copy), paired repetition by repetition
    std::vector<double> ratio;
    for (size_t i = 0; i < std::min(t.size(), copy.size()); ++i)
      ratio.push_back(bpe / 8.0 * copy[i] / t[i]);
    const auto r = ring::bench::spread(ratio);
    std::printf("%-6s : %.2f GB/s (median), / memcpy bandwidth: median %.3f (min %.3f, max %.3f)\n",
                name, bpe * g_n / ring::bench::spread(t).median / 1e9, r.median, r.min, r.max);
  }
  return 0;
}
