// The GEMM providers on this machine: fp32 GFLOP/s of OpenBLAS with the kernels it picks itself,
// OpenBLAS forced to the kernel sets named by --coretypes (OPENBLAS_CORETYPE), and oneDNN, at
// 2048^3 and at the worker model's shapes (bench/train_step_bench.cc's model on 8192 tokens:
// d_model 256, mlp_hidden 704; forward NT, input gradient NN, weight gradient TN).
//
//   gemm_bench [--threads 2] [--reps 5] [--coretypes Haswell,SkylakeX] [--quick]
//
// OpenBLAS picks its kernels once, when it loads, so every configuration runs in a child process
// (this binary with --child); each repetition runs one child per configuration in turn, so load
// drifts hit all of them alike. A child makes one warm-up call per shape, then times one call.
// Reported, per configuration and shape, median [min..max] of: wall-clock GFLOP/s, and FLOPs per
// CPU-second of the child times the thread count (what the rate would be had the threads had
// their cores: on a loaded machine the first drops with the share of the cores the run gets,
// the second far less); the best configuration per shape; what RING_GEMM=auto chooses here
// (kernels/cpu/gemm.h).
//
//   gemm_bench --bf16 [--threads 2] [--reps 5] [--quick]
//   RING_BF16_GEMM=convert gemm_bench --bf16 ...   (one bf16 path only)
//
// The bf16 GEMM paths (kernels/cpu/gemm.h: oneDNN matmul, convert = bf16 -> fp32 tiles and the
// active fp32 provider) against the best fp32 sgemm built in (OpenBLAS, oneDNN; each timed, the
// faster taken per repetition) on the same shapes, in this process, interleaved per repetition
// (one warm-up call each first). Shapes: the model's GEMMs at d_model 4096 (8192 tokens) and the
// small model's; C as training stores it (forward and input gradient bf16, weight gradient fp32
// with beta 1). Reported per shape: GFLOP/s per path, median [min..max], wall clock and per
// CPU-second x threads, and the ratio bf16 / best fp32 paired per repetition.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_stats.h"
#include "bench/gemm_timing.h"
#include "common/numeric/bf16.h"
#include "kernels/cpu/gemm.h"

extern "C" char* openblas_get_corename(void);

namespace {

namespace cpu = ring::kernels::cpu;
using ring::bench::GemmShape;

std::vector<GemmShape> shapes(bool quick) {
  std::vector<GemmShape> s = {{false, false, 2048, 2048, 2048}, {false, true, 8192, 704, 256}};
  if (quick) return s;
  s.push_back({false, true, 8192, 256, 704});   // forward, MLP down projection
  s.push_back({false, false, 8192, 256, 704});  // input gradient of the MLP up projection
  s.push_back({true, false, 704, 256, 8192});   // weight gradient of the MLP up projection
  s.push_back({false, true, 8192, 256, 256});   // forward, attention projections
  return s;
}

// Child: times every shape through one provider and prints "core NAME", then one
// "LABEL WALL_GFLOPS CPU_GFLOPS" line per shape.
int child(const std::string& provider, int threads, bool quick) {
  cpu::GemmProvider p =
      provider == "onednn" ? cpu::GemmProvider::kOneDnn : cpu::GemmProvider::kOpenBlas;
  std::printf("core %s\n", openblas_get_corename());
  for (const GemmShape& s : shapes(quick)) {
    ring::bench::GemmTimer t(s, 1);
    if (t.gflops(p, threads) < 0) return 1;  // warm-up: thread pools, page faults, JIT
    double cpu_rate = 0;
    const double g = t.gflops(p, threads, &cpu_rate);
    if (g < 0) return 1;
    std::printf("%s %.3f %.3f\n", s.label().c_str(), g, cpu_rate);
  }
  return 0;
}

struct Config {
  Config(cpu::GemmProvider p, std::string core) : provider(p), coretype(std::move(core)) {}
  cpu::GemmProvider provider;
  std::string coretype;  // OPENBLAS_CORETYPE for the child; empty: as this process has it
  std::string name;      // filled from the first child's report
  // By shape label: wall-clock GFLOP/s, and per CPU-second times threads.
  std::map<std::string, std::vector<double>> wall, cpu;
};

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// Runs one child for c; false (with the reason on stderr) if it failed.
bool run_child(const std::string& exe, Config& c, int threads, bool quick,
               const char* own_coretype) {
  if (!c.coretype.empty()) {
    setenv("OPENBLAS_CORETYPE", c.coretype.c_str(), 1);
  } else if (own_coretype) {
    setenv("OPENBLAS_CORETYPE", own_coretype, 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  const std::string cmd = "'" + exe + "' --child " + cpu::gemm_provider_name(c.provider) +
                          " --threads " + std::to_string(threads) + (quick ? " --quick" : "");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return false;
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, got);
  const int rc = pclose(pipe);
  if (rc != 0) {
    std::fprintf(stderr, "gemm_bench: child '%s' failed (status %d): %s\n", cmd.c_str(), rc,
                 out.c_str());
    return false;
  }
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("core ", 0) == 0) {
      const std::string core = line.substr(5);
      c.name = c.provider == cpu::GemmProvider::kOneDnn
                   ? "onednn"
                   : "openblas " + core + (c.coretype.empty() ? " (own)" : " (forced)");
      continue;
    }
    // "NN 2048x2048x2048 41.2 80.3": the label is everything before the last two fields.
    const size_t b = line.rfind(' '), a = b == std::string::npos ? b : line.rfind(' ', b - 1);
    if (a == std::string::npos) continue;
    const std::string label = line.substr(0, a);
    c.wall[label].push_back(std::atof(&line[a + 1]));
    c.cpu[label].push_back(std::atof(&line[b + 1]));
  }
  return true;
}

// ---- bf16 -----------------------------------------------------------------------------------
struct Bf16Shape {
  GemmShape s;
  ring::kernels::DType c;  // how training stores this C
  float beta;
  const char* what;
};

std::vector<Bf16Shape> bf16_shapes(bool quick) {
  using ring::kernels::DType;
  std::vector<Bf16Shape> v = {
      {{false, true, 8192, 4096, 4096}, DType::kBF16, 0.f, "forward, d_model 4096"},
      {{false, false, 2048, 2048, 2048}, DType::kBF16, 0.f, "2048^3"},
  };
  if (quick) return v;
  v.push_back({{false, false, 8192, 4096, 4096}, DType::kBF16, 0.f, "input gradient"});
  v.push_back({{true, false, 4096, 4096, 8192}, DType::kF32, 1.f, "weight gradient, fp32 +="});
  v.push_back({{false, true, 8192, 704, 256}, DType::kBF16, 0.f, "small model, MLP up"});
  v.push_back({{true, false, 704, 256, 8192}, DType::kF32, 1.f, "small model, weight grad"});
  return v;
}

// Seconds of wall clock and of process CPU time around f().
template <class F>
std::pair<double, double> timed(F&& f) {
  timespec c0{}, c1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  return {wall, (c1.tv_sec - c0.tv_sec) + 1e-9 * (c1.tv_nsec - c0.tv_nsec)};
}

int bf16_bench(int threads, int reps, bool quick) {
  namespace kn = ring::kernels;
  // RING_BF16_GEMM=convert|onednn times that path only (e.g. convert under DNNL_MAX_CPU_ISA=AVX2,
  // where oneDNN has no bf16 matmul); unset or auto times every path built in.
  const char* only = std::getenv("RING_BF16_GEMM");
  std::vector<cpu::Bf16GemmPath> paths;
  for (auto p : cpu::kBf16GemmPaths) {
    if (!cpu::bf16_gemm_path_built(p)) continue;
    if (only && *only && std::strcmp(only, "auto") != 0 &&
        std::strcmp(only, cpu::bf16_gemm_path_name(p)) != 0) {
      continue;
    }
    paths.push_back(p);
  }
  const auto facts = cpu::bf16_gemm_facts();
  const auto choice = cpu::resolve_bf16_gemm_path("", facts);
  std::printf("bf16 GEMM: CPU AVX512_BF16 %s, AMX-BF16 %s; auto chooses %s (%s); convert runs "
              "on the fp32 provider %s\n",
              facts.avx512_bf16 ? "yes" : "no", facts.amx_bf16 ? "yes" : "no",
              cpu::bf16_gemm_path_name(choice.value), choice.reason.c_str(),
              cpu::gemm_provider_name(cpu::active_gemm_provider()));
  for (const Bf16Shape& bs : bf16_shapes(quick)) {
    const GemmShape& s = bs.s;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const size_t na = s.m * s.k, nb = s.k * s.n, nc = s.m * s.n;
    std::vector<float> a(na), b(nb), c(nc, 0.f);
    std::vector<uint16_t> a16(na), b16(nb);
    for (size_t i = 0; i < na; ++i) a16[i] = ring::numeric::f32_to_bf16(a[i] = u(rng));
    for (size_t i = 0; i < nb; ++i) b16[i] = ring::numeric::f32_to_bf16(b[i] = u(rng));
    std::vector<uint8_t> cb(nc * kn::dtype_size(bs.c), 0);
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    // Configurations: every fp32 provider, then every bf16 path. Index -> seconds per rep.
    struct Run {
      std::string name;
      std::function<kn::Status()> call;
      std::vector<double> wall, cpu;
    };
    std::vector<Run> runs;
    for (auto p : ring::bench::built_gemm_providers()) {
      runs.push_back({std::string("fp32 ") + cpu::gemm_provider_name(p), [&, p] {
                        return cpu::sgemm(p, s.ta, s.tb, s.m, s.n, s.k, 1.f, a.data(), lda,
                                          b.data(), ldb, bs.beta, c.data(), s.n, threads);
                      }, {}, {}});
    }
    const size_t n_fp32 = runs.size();
    for (auto p : paths) {
      runs.push_back({std::string("bf16 ") + cpu::bf16_gemm_path_name(p), [&, p] {
                        std::string err;
                        kn::Status st = cpu::bf16_gemm(p, s.ta, s.tb, s.m, s.n, s.k, 1.f,
                                                       a16.data(), lda, b16.data(), ldb, bs.beta,
                                                       cb.data(), bs.c, s.n, threads, &err);
                        if (st != kn::Status::kOk) std::fprintf(stderr, "%s\n", err.c_str());
                        return st;
                      }, {}, {}});
    }
    for (int r = -1; r < reps; ++r) {  // r = -1: warm-up (JIT, primitive cache, page faults)
      for (Run& run : runs) {
        kn::Status st = kn::Status::kOk;
        auto [wall, cpu_s] = timed([&] { st = run.call(); });
        if (st != kn::Status::kOk) {
          std::fprintf(stderr, "gemm_bench: %s %s failed: %s\n", run.name.c_str(),
                       s.label().c_str(), kn::status_string(st));
          return 1;
        }
        if (r < 0) continue;
        run.wall.push_back(s.flops() / wall * 1e-9);
        run.cpu.push_back(s.flops() / cpu_s * threads * 1e-9);
      }
    }
    std::printf("\n%s (%s; C %s, beta %g)\n", s.label().c_str(), bs.what,
                bs.c == kn::DType::kF32 ? "fp32" : "bf16", bs.beta);
    for (bool wall : {true, false}) {
      // The best fp32 provider of each repetition.
      std::vector<double> best;
      for (int r = 0; r < reps; ++r) {
        double x = 0;
        for (size_t i = 0; i < n_fp32; ++i) x = std::max(x, (wall ? runs[i].wall : runs[i].cpu)[r]);
        best.push_back(x);
      }
      for (const Run& run : runs) {
        const auto& v = wall ? run.wall : run.cpu;
        const ring::bench::Spread g = ring::bench::spread(v);
        std::printf("  %-13s %-21s %8.1f [%.1f..%.1f] GFLOP/s", run.name.c_str(),
                    wall ? "wall clock" : "per CPU-s x threads", g.median, g.min, g.max);
        if (&run - runs.data() >= static_cast<long>(n_fp32)) {
          const ring::bench::Spread q = ring::bench::paired_ratio(v, best);
          std::printf("   %.2fx [%.2f..%.2f] of best fp32", q.median, q.min, q.max);
        }
        std::printf("\n");
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  bool quick = false;
  bool bf16 = false;
  std::string child_provider, coretypes = "Haswell,SkylakeX";
  CLI::App app{"GEMM providers (OpenBLAS, oneDNN) at 2048^3 and the worker model's shapes"};
  app.add_option("--threads", threads, "threads per GEMM")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "repetitions per configuration")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--coretypes", coretypes,
                 "OpenBLAS kernel sets to force (OPENBLAS_CORETYPE), comma-separated")
      ->capture_default_str();
  app.add_flag("--quick", quick, "2048^3 and one model shape only");
  app.add_flag("--bf16", bf16, "bf16 GEMM paths vs the best fp32 sgemm, in this process");
  app.add_option("--child", child_provider, "internal: time one provider in this process")
      ->check(CLI::IsMember({"openblas", "onednn"}))
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (!child_provider.empty()) return child(child_provider, threads, quick);
  if (bf16) return bf16_bench(threads, reps, quick);

  const char* own_coretype = std::getenv("OPENBLAS_CORETYPE");
  const char* ring_gemm = std::getenv("RING_GEMM");
  const cpu::GemmChoice choice =
      cpu::resolve_gemm_provider(ring_gemm ? ring_gemm : "", cpu::gemm_facts());
  std::printf("gemm_bench: %s, threads %d, reps %d, load %.2f\n", cpu_model().c_str(), threads,
              reps, [] {
                double l[1] = {0};
                return getloadavg(l, 1) == 1 ? l[0] : -1.0;
              }());
  std::printf("RING_GEMM=%s chooses %s (%s)\n", ring_gemm ? ring_gemm : "(unset: auto)",
              cpu::gemm_provider_name(choice.value), choice.reason.c_str());

  std::vector<Config> configs;
  for (auto p : ring::bench::built_gemm_providers()) configs.push_back(Config{p, ""});
  std::stringstream list(coretypes);
  for (std::string core; std::getline(list, core, ',');) {
    if (!core.empty()) configs.push_back(Config{cpu::GemmProvider::kOpenBlas, core});
  }
  const std::string exe = self_exe();
  for (int r = 0; r < reps; ++r) {
    for (Config& c : configs) {
      if (!run_child(exe, c, threads, quick, own_coretype)) return 1;
    }
  }

  for (bool wall : {true, false}) {
    std::printf("\n%-22s", wall ? "GFLOP/s (wall clock)" : "GFLOP/CPU-s x threads");
    for (const Config& c : configs) std::printf(" %26s", c.name.c_str());
    std::printf("  best\n");
    for (const GemmShape& s : shapes(quick)) {
      std::printf("%-22s", s.label().c_str());
      double best = -1;
      std::string best_name;
      for (Config& c : configs) {
        const ring::bench::Spread sp = ring::bench::spread((wall ? c.wall : c.cpu)[s.label()]);
        char cell[64];
        std::snprintf(cell, sizeof(cell), "%.1f [%.1f..%.1f]", sp.median, sp.min, sp.max);
        std::printf(" %26s", cell);
        if (sp.median > best) {
          best = sp.median;
          best_name = c.name;
        }
      }
      std::printf("  %s\n", best_name.c_str());
    }
  }
  return 0;
}
