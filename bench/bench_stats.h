// Helpers shared by adamw_bench and topk_bench: a Google Benchmark reporter that also keeps
// every repetition's time per benchmark, and paired-ratio statistics (median, min, max) so a
// figure and its baseline, measured interleaved in the same run, are reported as a ratio.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
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

}  // namespace ring::bench
