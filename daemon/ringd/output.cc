#include "daemon/ringd/output.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "common/log/log.h"

namespace ring::ringd {
namespace {

// The logger of ringd's stderr lines. Text: the lines as ringd always wrote them
// ("2026-12-02 06:25:14 ringd[0] msg"); json: common/log's JSON lines (ts, level, program, pid,
// logger, msg, node).
std::shared_ptr<spdlog::logger> make_stderr_log(const Options& o) {
  if (o.log_format == "json") {
    ring::log::setup("ringd", ring::log::Format::kJsonLines);
    return ring::log::get("ringd");
  }
  auto lg = std::make_shared<spdlog::logger>("ringd-stderr",
                                             std::make_shared<spdlog::sinks::stderr_sink_mt>());
  lg->set_pattern(fmt::format("%Y-%m-%d %H:%M:%S ringd[{}] %v", o.node_rank));
  return lg;
}

}  // namespace

Output::Output(const Options& o) : o_(o), stderr_log_(make_stderr_log(o)) {}

bool Output::open(const std::string& job_dir, std::string* why) {
  return log_file_.open(fmt::format("{}/logs/ringd-{}.log", job_dir, o_.node_rank), why) &&
         (o_.node_rank != 0 || steps_file_.open(job_dir + "/steps.jsonl", why));
}

void Output::log(const std::string& text) {
  // Worker output, file names and peers' messages reach this line: one escaped line each.
  const std::string line = ring::log::escape_controls(text);
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  log_file(fmt::format("{} ringd[{}] {}", ts, o_.node_rank, line));
  if (o_.json) return;  // stdout carries the JSON lines; the log file has everything
  if (o_.log_format == "json")
    ring::log::event(*stderr_log_, spdlog::level::info, text, {{"node", o_.node_rank}});
  else
    stderr_log_->info(line);
}

// ringd's log file; a failed write is said once on stderr (the log itself cannot carry it).
void Output::log_file(const std::string& text) {
  std::string why;
  const std::string line = ring::log::escape_controls(text);
  if (log_file_.is_open() && !log_file_.write_line(line, &why) && !log_write_failed_) {
    log_write_failed_ = true;
    std::cerr << "ringd: " << why << "; the log goes on on stderr only" << std::endl;
  }
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
    std::cerr << text << std::endl;
  }
}

}  // namespace ring::ringd
