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
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_stats.h"
#include "bench/gemm_timing.h"
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

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  bool quick = false;
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
  app.add_option("--child", child_provider, "internal: time one provider in this process")
      ->check(CLI::IsMember({"openblas", "onednn"}))
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (!child_provider.empty()) return child(child_provider, threads, quick);

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
              cpu::gemm_provider_name(choice.provider), choice.reason.c_str());

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
