#include "coordinator/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "coordinator/security.h"

namespace ring::coord {

namespace {

// Every log line's text passes through escape_for_log (security.h): peers control many of the
// strings we log (names, messages, reasons, parse errors that quote their input), and a newline
// in one of them must not start a forged line of ours.
class EscapingSink : public spdlog::sinks::sink {
 public:
  explicit EscapingSink(std::shared_ptr<spdlog::sinks::sink> inner) : inner_(std::move(inner)) {
    set_level(spdlog::level::trace);  // the logger's level filters
  }
  void log(const spdlog::details::log_msg& msg) override {
    std::string text = escape_for_log({msg.payload.data(), msg.payload.size()});
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(text.data(), text.size());
    inner_->log(copy);
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override {
    inner_->set_formatter(std::move(f));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
};

}  // namespace

std::shared_ptr<spdlog::logger> logger() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto lg = spdlog::get("coord");
    if (!lg) {
      lg = std::make_shared<spdlog::logger>(
          "coord", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
      lg->set_level(spdlog::get_level());
      spdlog::register_logger(lg);
    }
    // A logger made elsewhere (a test, an embedding program) gets the same escaping.
    for (auto& sink : lg->sinks())
      if (!std::dynamic_pointer_cast<EscapingSink>(sink))
        sink = std::make_shared<EscapingSink>(sink);
    return lg;
  }();
  return l;
}

}  // namespace ring::coord
