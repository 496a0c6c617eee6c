#include "daemon/ringd/output.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "common/log/file_sink.h"
#include "common/log/log.h"

namespace ring::ringd {
namespace {

// The logger of ringd's stderr lines. Text: the lines as ringd always wrote them
// ("2026-12-02 06:25:14 ringd[0] msg"); json: common/log's JSON lines (ts, level, program, pid,
// logger, msg, node).
// ringd's line: "2026-12-02 06:25:14 ringd[0] msg" (local time).
std::string line_pattern(const Options& o) {
  return fmt::format("%Y-%m-%d %H:%M:%S ringd[{}] %v", o.node_rank);
}

std::shared_ptr<spdlog::logger> make_stderr_log(const Options& o) {
  if (o.log_format == "json") {
    ring::log::setup("ringd", ring::log::Format::kJsonLines);
    return ring::log::get("ringd");
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  sink->set_formatter(ring::log::make_text_formatter(line_pattern(o)));
  return std::make_shared<spdlog::logger>("ringd-stderr", sink);
}

// "ringd: ..." messages on stderr (text mode), escaped.
std::shared_ptr<spdlog::logger> make_stderr_raw() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  sink->set_formatter(ring::log::make_text_formatter("%v"));
  return std::make_shared<spdlog::logger>("ringd-stderr-raw", sink);
}

// A logger of the log file with `pattern`; a failed write is said once on stderr (the log itself
// cannot carry it) and the log goes on there.
std::shared_ptr<spdlog::logger> make_file_log(const std::shared_ptr<files::AppendFile>& file,
                                              const std::string& pattern, const char* name) {
  auto sink = std::make_shared<ring::log::FileSink>(
      file, ring::log::make_text_formatter(pattern), [](const std::string& why) {
        std::cerr << "ringd: " << why << "; the log goes on on stderr only" << std::endl;
      });
  return std::make_shared<spdlog::logger>(name, sink);
}

}  // namespace

Output::Output(const Options& o)
    : o_(o), stderr_log_(make_stderr_log(o)), stderr_raw_(make_stderr_raw()),
      file_lines_(make_file_log(log_file_, line_pattern(o), "ringd-file")),
      file_raw_(make_file_log(log_file_, "%v", "ringd-file-raw")) {}

bool Output::open(const std::string& job_dir, std::string* why) {
  return log_file_->open(fmt::format("{}/logs/ringd-{}.log", job_dir, o_.node_rank), why) &&
         (o_.node_rank != 0 || steps_file_.open(job_dir + "/steps.jsonl", why));
}

void Output::log(const std::string& text) {
  // Worker output, file names and peers' messages reach this line: the formatters escape them.
  file_lines_->info(text);
  if (o_.json) return;  // stdout carries the JSON lines; the log file has everything
  if (o_.log_format == "json")
    ring::log::event(*stderr_log_, spdlog::level::info, text, {{"node", o_.node_rank}});
  else
    stderr_log_->info(text);
}

void Output::log_file(const std::string& text) { file_raw_->info(text); }

void Output::error(const std::string& text, spdlog::level::level_enum level) {
  file_lines_->log(level, text);
  if (o_.log_format == "json")
    ring::log::event(*stderr_log_, level, "ringd: " + text, {{"node", o_.node_rank}});
  else
    stderr_raw_->log(level, "ringd: " + text);
}

// stdout (--json lines). Once it is gone (EPIPE: the reader, e.g. `ringctl run`, died) ringd
// stops writing there and goes on: the log file and steps.jsonl keep everything.
void Output::out_line(const std::string& line) {
  if (stdout_gone_) return;
  std::cout << line << std::endl;
  if (!std::cout) {
    stdout_gone_ = true;
    log_file("stdout is closed (" + std::string(std::strerror(errno)) +
             "): no more lines there; the log file and steps.jsonl go on");
  }
}

nlohmann::json Output::event(const std::string& name, nlohmann::json fields, int64_t attempt) {
  fields["event"] = name;
  fields["node"] = o_.node_rank;
  fields["attempt"] = attempt;
  const std::string s = log::dump_json(fields);
  log_file("event " + s);
  if (o_.json && o_.node_rank == 0) out_line(s);
  return fields;
}

void Output::step(const nlohmann::json& record, const std::string& text, bool text_due) {
  if (o_.node_rank != 0) return;
  const std::string line = log::dump_json(record);
  std::string why;
  if (!steps_file_.write_line(line, &why) && !steps_write_failed_) {
    steps_write_failed_ = true;  // said once; the step reports still reach ring-coord
    log(why + " (steps are no longer recorded there)");
  }
  if (o_.json) {
    out_line(line);
  } else if (o_.log_format == "json") {
    ring::log::event(*stderr_log_, spdlog::level::info, "step", record);
  } else if (text_due) {
    stderr_raw_->info(text);
  }
}

}  // namespace ring::ringd
