// Helpers shared by adamw_bench, topk_bench and optim_bench: a Google Benchmark reporter that also
// keeps every repetition's time per benchmark, paired-ratio statistics (median, min, max) so a
// figure and its baseline, measured interleaved in the same run, are reported as a ratio, the
// benchmarks' own `--name=value` flags, and the torch.optim.AdamW baseline (bench/torch_adamw.py).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace ring::bench {

// Console output as usual, plus seconds per iteration of every (non-aggregate) repetition,
// keyed by benchmark family name (the part before the first '/').
class CaptureReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.iterations == 0 || r.error_occurred) continue;
      std::string name = r.benchmark_name();
      name = name.substr(0, name.find('/'));
      seconds[name].push_back(r.real_accumulated_time / static_cast<double>(r.iterations));
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, std::vector<double>> seconds;
};

struct Spread {
  double median = 0, min = 0, max = 0;
  size_t count = 0;
};

inline Spread spread(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.count = v.size();
  s.min = v.front();
  s.max = v.back();
  size_t h = v.size() / 2;
  s.median = v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  return s;
}

// Ratios a[i] / b[i] over repetitions i (paired in run order; random interleaving puts the two
// members of a pair close in time).
inline Spread paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) r.push_back(a[i] / b[i]);
  return spread(r);
}

// A benchmark's own flag `--name=value`: true (and *value set) when `arg` is that flag; the
// arguments that are none of them go on to Google Benchmark.
inline bool take_flag(const char* arg, const char* name, std::string* value) {
  size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *value = arg + len + 1;
  return true;
}

// torch.optim.AdamW on the same n, threads and repetitions: bench/torch_adamw.py (python3-torch)
// prints "torch_adamw ... median_s=M min_s=A max_s=B".
struct TorchAdamW {
  bool ok = false;     // ran, exited 0 and printed the line
  int rc = -1;         // pclose status
  std::string line;    // its output from "torch_adamw " on
  std::string output;  // all it printed (stdout and stderr), for the failure message
  Spread seconds;      // per step: median, min, max
};

inline TorchAdamW run_torch_adamw(const std::string& source_dir, long long n, int threads,
                                  int reps) {
  TorchAdamW t;
  std::string cmd = "/usr/bin/python3 " + source_dir + "/bench/torch_adamw.py " +
                    std::to_string(n) + " " + std::to_string(threads) + " " +
                    std::to_string(reps) + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t got;
  while (pipe && (got = fread(buf, 1, sizeof buf, pipe)) > 0) t.output.append(buf, got);
  t.rc = pipe ? pclose(pipe) : -1;
  const char* line = std::strstr(t.output.c_str(), "torch_adamw ");
  const char* values = line ? std::strstr(line, "median_s=") : nullptr;
  t.ok = t.rc == 0 && values &&
         std::sscanf(values, "median_s=%lf min_s=%lf max_s=%lf", &t.seconds.median,
                     &t.seconds.min, &t.seconds.max) == 3;
  if (line) t.line = line;
  return t;
}

}  // namespace ring::bench
