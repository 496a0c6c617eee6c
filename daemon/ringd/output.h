// ringd's outputs: its log file logs/ringd-<node>.log (every line and event), stderr (its text
// lines, or JSON lines with --log-format json; none with --json, whose stdout carries the JSON
// lines), stdout with --json (node 0's events and step records) and steps.jsonl (node 0). A write
// that fails is said once and the other outputs go on: ringd outlives its reader and a full disk.
// The log file and stderr are spdlog loggers of common/log (log/file_sink.h, the one escaping
// text formatter), so no text a worker or a peer sends forges a line in either.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include "daemon/ringd/job_files.h"
#include "daemon/ringd/options.h"

namespace ring::ringd {

class Output {
 public:
  explicit Output(const Options& o);

  // The job's files in `job_dir`: logs/ringd-<node>.log, and steps.jsonl on node 0. False with
  // the reason (naming the file) in *why.
  bool open(const std::string& job_dir, std::string* why);

  // A log line: "<date> <time> ringd[<node>] <text>" in the log file, and on stderr; control
  // bytes of the text as \xHH (log::escape_controls), so no text forges a line.
  void log(const std::string& text);
  // A line of the log file alone, escaped the same way.
  void log_file(const std::string& text);
  // An error that stops ringd before or outside the log (a bad spec, a job directory that cannot
  // be used): "ringd: <text>" on stderr whatever the output mode (a JSON line with
  // --log-format json), and in the log file once it is open. A spec's warnings come the same way
  // at level warn.
  void error(const std::string& text, spdlog::level::level_enum level = spdlog::level::err);
  // An event: "event {...}" in the log file, the JSON line on stdout (node 0, --json). Returns
  // its fields with event, node and attempt added (what ring-coord is told).
  nlohmann::json event(const std::string& name, nlohmann::json fields, int64_t attempt);
  // A finished step's record (node 0 only): a steps.jsonl line, and the record on stdout
  // (--json), as a JSON line on stderr (--log-format json) or, when `text_due`, `text` there.
  void step(const nlohmann::json& record, const std::string& text, bool text_due);

 private:
  void out_line(const std::string& line);

  const Options& o_;
  std::shared_ptr<spdlog::logger> stderr_log_, stderr_raw_;
  // The log file: timestamped lines and raw ones ("event {...}"), one file.
  std::shared_ptr<AppendFile> log_file_ = std::make_shared<AppendFile>();
  std::shared_ptr<spdlog::logger> file_lines_, file_raw_;
  AppendFile steps_file_;
  bool steps_write_failed_ = false, stdout_gone_ = false;
};

}  // namespace ring::ringd
