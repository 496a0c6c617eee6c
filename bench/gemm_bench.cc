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
// Reported: GFLOP/s median [min..max] per configuration and shape, the best configuration per
// shape, and what RING_GEMM=auto chooses here (kernels/cpu/gemm.h).
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
#include <vector>

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

// Child: times every shape through one provider and prints "core NAME" then "LABEL GFLOPS" lines.
int child(const std::string& provider, int threads, bool quick) {
  cpu::GemmProvider p = provider == "onednn" ? cpu::GemmProvider::kOneDnn
                                             : cpu::GemmProvider::kOpenBlas;
  std::printf("core %s\n", openblas_get_corename());
  for (const GemmShape& s : shapes(quick)) {
    ring::bench::GemmTimer t(s, 1);
    if (t.gflops(p, threads) < 0) return 1;  // warm-up: thread pools, page faults, JIT
    const double g = t.gflops(p, threads);
    if (g < 0) return 1;
    std::printf("%s %.3f\n", s.label().c_str(), g);
  }
  return 0;
}

struct Config {
  cpu::GemmProvider provider;
  std::string coretype;  // OPENBLAS_CORETYPE for the child; empty: as this process has it
  std::string name;      // filled from the first child's report
  std::map<std::string, std::vector<double>> gflops;  // by shape label
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
    const size_t sp = line.rfind(' ');
    if (sp != std::string::npos) c.gflops[line.substr(0, sp)].push_back(std::atof(&line[sp + 1]));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  bool quick = false;
  std::string child_provider, coretypes = "Haswell,SkylakeX";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (arg == "--coretypes" && i + 1 < argc) {
      coretypes = argv[++i];
    } else if (arg == "--child" && i + 1 < argc) {
      child_provider = argv[++i];
    } else if (arg == "--quick") {
      quick = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--reps R] [--coretypes Haswell,SkylakeX] [--quick]\n",
                   argv[0]);
      return 2;
    }
  }
  if (threads < 1 || reps < 1) {
    std::fprintf(stderr, "gemm_bench: --threads and --reps must be >= 1\n");
    return 2;
  }
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
  for (auto p : ring::bench::built_gemm_providers()) configs.push_back({p, "", "", {}});
  std::stringstream list(coretypes);
  for (std::string core; std::getline(list, core, ',');) {
    if (!core.empty()) configs.push_back({cpu::GemmProvider::kOpenBlas, core, "", {}});
  }
  const std::string exe = self_exe();
  for (int r = 0; r < reps; ++r) {
    for (Config& c : configs) {
      if (!run_child(exe, c, threads, quick, own_coretype)) return 1;
    }
  }

  std::printf("%-22s", "GFLOP/s");
  for (const Config& c : configs) std::printf(" %26s", c.name.c_str());
  std::printf("  best\n");
  for (const GemmShape& s : shapes(quick)) {
    std::printf("%-22s", s.label().c_str());
    double best = -1;
    std::string best_name;
    for (Config& c : configs) {
      const ring::bench::Spread sp = ring::bench::spread(c.gflops[s.label()]);
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
  return 0;
}
