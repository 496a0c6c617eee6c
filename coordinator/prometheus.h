// ring-coord's /metrics: the Prometheus text exposition format 0.0.4, rendered from the Store
// (coordinator/observe.h picks the jobs, nodes and the per-rank window; docs/observability.md
// lists every metric).
//
//   std::string text = render_metrics(store, ExportLimits{}, now_unix());
//
// Format rules kept here: one HELP and one TYPE line per family, all of a family's samples
// together, names [a-zA-Z_:][a-zA-Z0-9_:]*, label values with \\, \" and \n escaped, values as
// Go's ParseFloat reads them (NaN, +Inf, -Inf).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/observe.h"
#include "coordinator/store.h"

namespace ring::coord {

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

using Labels = std::vector<std::pair<std::string, std::string>>;

// Collects metric families and writes them in the text format.
class Exposition {
 public:
  // Starts a family (type: gauge, counter, summary, untyped). A name seen before continues it.
  void family(const std::string& name, const std::string& type, const std::string& help);
  // A sample of the current family; suffix "" or "_sum"/"_count" (summaries).
  void sample(const Labels& labels, double value, const std::string& suffix = "");
  std::string text() const;

  // "a\"b" -> a\"b (label value escaping); help text escapes only \\ and \n.
  static std::string escape_label(const std::string& v);
  static std::string escape_help(const std::string& v);
  static std::string format_value(double v);
  static bool valid_name(const std::string& name);

 private:
  struct Family {
    std::string name, type, help;
    std::vector<std::string> lines;
  };
  std::vector<Family> families_;
  size_t current_ = 0;
};

std::string render_metrics(Store& store, const ExportLimits& lim, double now);

}  // namespace ring::coord
