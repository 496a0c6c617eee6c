#include "common/log/file_sink.h"

#include <string>
#include <utility>

namespace ring::log {

FileSink::FileSink(std::shared_ptr<files::AppendFile> file,
                   std::unique_ptr<spdlog::formatter> formatter,
                   std::function<void(const std::string&)> on_error)
    : spdlog::sinks::base_sink<std::mutex>(std::move(formatter)), file_(std::move(file)),
      on_error_(std::move(on_error)) {}

void FileSink::sink_it_(const spdlog::details::log_msg& msg) {
  if (!file_ || !file_->is_open()) return;
  spdlog::memory_buf_t buf;
  formatter_->format(msg, buf);
  std::string line(buf.data(), buf.size());
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  std::string why;
  if (!file_->write_line(line, &why) && !failed_) {
    failed_ = true;
    if (on_error_) on_error_(why);
  }
}

}  // namespace ring::log
