#include "common/log/log.h"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace ring::log {
namespace {

// The fields of the event() being logged on this thread (sinks format on the caller's thread).
thread_local const nlohmann::json* t_fields = nullptr;

}  // namespace

std::string escape_controls(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) len = 1, cp = c;
    else if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (p[i + k] & 0xc0) == 0x80;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are invalid too.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
               (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)))
      ok = false;
    if (ok) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    }
  }
  return out;
}

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

class TextFormatter : public spdlog::formatter {
 public:
  explicit TextFormatter(std::string pattern = "%+")
      : pattern_(std::move(pattern)), inner_(std::make_unique<spdlog::pattern_formatter>(pattern_)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string text(msg.payload.data(), msg.payload.size());
    if (t_fields) {
      for (const auto& [k, v] : t_fields->items())
        text += " " + k + "=" + (v.is_string() ? v.get<std::string>() : dump_json(v));
    }
    text = escape_controls(text);
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(text.data(), text.size());
    inner_->format(copy, dest);
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<TextFormatter>(pattern_);
  }

 private:
  std::string pattern_;
  std::unique_ptr<spdlog::formatter> inner_;
};

// "2026-12-02T06:25:14.123Z"
std::string iso_utc(spdlog::log_clock::time_point t) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
}

class JsonFormatter : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string program) : program_(std::move(program)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json j;
    j["ts"] = iso_utc(msg.time);
    const auto level = spdlog::level::to_string_view(msg.level);
    j["level"] = std::string(level.data(), level.size());
    j["program"] = program_;
    j["pid"] = static_cast<long>(::getpid());
    if (msg.logger_name.size() > 0)
      j["logger"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    j["msg"] = std::string(msg.payload.data(), msg.payload.size());
    if (t_fields) {
      for (const auto& [k, v] : t_fields->items()) {
        std::string key = k;
        while (j.contains(key)) key += "_";  // a field never replaces ts, level, msg, ...
        j[key] = v;
      }
    }
    const std::string line =
        j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(program_);
  }

 private:
  std::string program_;
};

struct State {
  std::mutex mu;
  std::shared_ptr<spdlog::sinks::sink> sink;
  spdlog::level::level_enum level = spdlog::level::info;
};

State& state() {
  static State s;
  return s;
}

// The one stderr sink every logger of get() shares; text until setup() says otherwise.
std::shared_ptr<spdlog::sinks::sink> sink_locked(State& s) {
  if (!s.sink) {
    s.sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    s.sink->set_formatter(std::make_unique<TextFormatter>());
  }
  return s.sink;
}

}  // namespace

std::optional<Format> parse_format(std::string_view name) {
  if (name == "text") return Format::kText;
  if (name == "json") return Format::kJsonLines;
  return std::nullopt;
}

std::optional<spdlog::level::level_enum> parse_level(std::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kLevelNames)); ++i)
    if (name == kLevelNames[i]) return static_cast<spdlog::level::level_enum>(i);
  return std::nullopt;
}

std::unique_ptr<spdlog::formatter> make_text_formatter(std::string pattern) {
  return std::make_unique<TextFormatter>(std::move(pattern));
}

std::unique_ptr<spdlog::formatter> make_formatter(std::string_view program, Format format) {
  if (format == Format::kJsonLines) return std::make_unique<JsonFormatter>(std::string(program));
  return std::make_unique<TextFormatter>();
}

void setup(std::string_view program, Format format, spdlog::level::level_enum level) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto sink = sink_locked(s);
  sink->set_formatter(make_formatter(program, format));
  s.level = level;
  spdlog::set_level(level);  // every registered logger, and the level of those made later
  auto def = std::make_shared<spdlog::logger>(std::string(program), sink);
  def->set_level(level);
  spdlog::set_default_logger(def);
}

std::shared_ptr<spdlog::logger> get(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto lg = std::make_shared<spdlog::logger>(name, sink_locked(s));
  lg->set_level(s.level);
  spdlog::register_logger(lg);
  return lg;
}

void event(spdlog::logger& logger, spdlog::level::level_enum level, std::string_view msg,
           const nlohmann::json& fields) {
  if (!logger.should_log(level)) return;
  t_fields = fields.is_object() && !fields.empty() ? &fields : nullptr;
  logger.log(level, "{}", msg);
  t_fields = nullptr;
}

}  // namespace ring::log
