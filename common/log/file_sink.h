// A log file whose line format is part of a contract (ringd's logs/ringd-<node>.log, read by
// `ringctl logs` and operators' scripts): an spdlog sink that appends each formatted line to a
// private file (files/append_file.h), formatted by this library's text formatter (log.h
// make_text_formatter: the caller's pattern, control bytes escaped), so no text a worker or a
// peer sends can forge a line.
//
//   auto file = std::make_shared<ring::files::AppendFile>();
//   if (!file->open(path, &why)) fail(why);
//   auto sink = std::make_shared<ring::log::FileSink>(
//       file, ring::log::make_text_formatter("%Y-%m-%d %H:%M:%S ringd[0] %v"), say_once);
//   spdlog::logger lines("ringd-file", sink);
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/sinks/base_sink.h>

#include "common/files/append_file.h"

namespace ring::log {

class FileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // Lines go to `file` (open, or every line is dropped); the first failed write is passed to
  // `on_error` (once: a full disk would otherwise repeat it for every line), later ones are
  // retried silently.
  FileSink(std::shared_ptr<files::AppendFile> file, std::unique_ptr<spdlog::formatter> formatter,
           std::function<void(const std::string& why)> on_error);

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  std::shared_ptr<files::AppendFile> file_;
  std::function<void(const std::string&)> on_error_;
  bool failed_ = false;
};

}  // namespace ring::log
