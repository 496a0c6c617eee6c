// The Chrome / Perfetto trace-event format (JSON: {"traceEvents": [...], "displayTimeUnit":
// "ms"}), written by `ringctl trace` (a job's recorded timeline) and `ringctl simulate --trace`
// (a simulated step): processes and threads named by metadata events ("M"), spans as complete
// events ("X") with microsecond ts and dur.
//
//   ring::trace::ChromeTrace t;
//   t.process(1, "ranks");  t.thread(1, 11, "rank 1", 11);
//   t.complete("forward L3", 1, 11, 1200.0, 85.5, {{"layer", 3}}, "forward");
//   t.write("step.json");   // 0600, replaced whole
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace ring::trace {

class ChromeTrace {
 public:
  // A process's name (pid: a node, or a kind of activity).
  void process(int64_t pid, const std::string& name);
  // A thread's name within its process, and where it sorts (default: by tid).
  void thread(int64_t pid, int64_t tid, const std::string& name,
              std::optional<int64_t> sort_index = std::nullopt);
  // A span: `name` on (pid, tid) from ts_us for dur_us microseconds; `category` is optional.
  void complete(const std::string& name, int64_t pid, int64_t tid, double ts_us, double dur_us,
                nlohmann::json args = nlohmann::json::object(), const std::string& category = "");

  size_t spans() const { return spans_; }
  // The whole document.
  nlohmann::json document() const;
  // The document as one line of JSON and a newline, into `path` (0600, replaced whole, never
  // through a symbolic link: files::write_file_atomic). Throws files::AtomicWriteError.
  void write(const std::string& path) const;

 private:
  nlohmann::json events_ = nlohmann::json::array();
  size_t spans_ = 0;
};

}  // namespace ring::trace
