#include "common/trace/chrome_trace.h"

#include "common/files/atomic_write.h"
#include "common/log/log.h"

namespace ring::trace {

void ChromeTrace::process(int64_t pid, const std::string& name) {
  events_.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
}

void ChromeTrace::thread(int64_t pid, int64_t tid, const std::string& name,
                         std::optional<int64_t> sort_index) {
  events_.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", pid},
                     {"tid", tid},
                     {"args", {{"name", name}}}});
  events_.push_back({{"name", "thread_sort_index"},
                     {"ph", "M"},
                     {"pid", pid},
                     {"tid", tid},
                     {"args", {{"sort_index", sort_index.value_or(tid)}}}});
}

void ChromeTrace::complete(const std::string& name, int64_t pid, int64_t tid, double ts_us,
                           double dur_us, nlohmann::json args, const std::string& category) {
  nlohmann::json e = {{"name", name}, {"ph", "X"}, {"pid", pid}, {"tid", tid},
                      {"ts", ts_us},  {"dur", dur_us}, {"args", std::move(args)}};
  if (!category.empty()) e["cat"] = category;
  events_.push_back(std::move(e));
  ++spans_;
}

nlohmann::json ChromeTrace::document() const {
  return {{"traceEvents", events_}, {"displayTimeUnit", "ms"}};
}

void ChromeTrace::write(const std::string& path) const {
  files::write_file_atomic(path, log::dump_json(document()) + "\n", 0600);
}

}  // namespace ring::trace
