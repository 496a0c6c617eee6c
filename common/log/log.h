// Logging for every binary: spdlog loggers writing to stderr, as text or as JSON lines.
//
//   ring::log::setup("ring-worker", ring::log::Format::kJsonLines, spdlog::level::info);
//   auto lg = ring::log::get("worker");          // one named logger per subsystem
//   lg->info("launched {} ranks", n);   // {"ts":...,"level":"info",...,"msg":"launched 2 ranks"}
//   ring::log::event(*lg, spdlog::level::warn, "rank failed", {{"rank", 2}, {"signal", 9}});
//
// Text: spdlog's usual "[2026-12-02 06:25:14.123] [worker] [info] msg key=value" line. JSON lines:
// one object per line, keys in this order: ts (UTC, ISO 8601 with milliseconds), level, program,
// pid, logger, msg, then the event's fields; what operators and scripts query.
// In both formats control bytes of a message cannot start a new line or drive a terminal: JSON
// escapes them (\u000a), text writes them as \xHH; invalid UTF-8 becomes U+FFFD in JSON.
// Loggers are synchronous: event() hands its fields to the formatter on the calling thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

namespace ring::log {

enum class Format { kText, kJsonLines };

// "text" -> kText, "json" -> kJsonLines; nullopt for anything else.
std::optional<Format> parse_format(std::string_view name);
// "trace", "debug", "info", "warn", "error", "critical", "off"; nullopt for anything else.
std::optional<spdlog::level::level_enum> parse_level(std::string_view name);
// What parse_format and parse_level accept, for help texts and validators.
inline constexpr const char* kFormatNames[] = {"text", "json"};
inline constexpr const char* kLevelNames[] = {"trace", "debug",    "info", "warn",
                                              "error", "critical", "off"};

// Text for a log line: control bytes (a newline that would forge a line, an escape sequence that
// drives the terminal) as \xHH, everything else as it is. The text formatter applies it; a log
// written outside spdlog (ringd's log file) calls it.
std::string escape_controls(std::string_view s);
// External text (a worker's log lines, a file name, a peer's message) made valid UTF-8: each
// invalid byte becomes U+FFFD; valid text is returned unchanged. Text from outside goes through
// this before it reaches JSON, so a stray byte never makes a serializer throw.
std::string valid_utf8(std::string_view s);
// j.dump() that never throws on invalid UTF-8 in a string (replaced by U+FFFD): the one way
// ringd, ring-coord and ringctl serialize JSON that may hold external text.
std::string dump_json(const nlohmann::json& j, int indent = -1);

// The text formatter with spdlog's `pattern` ("%Y-%m-%d %H:%M:%S ringd[0] %v") instead of its
// usual line, escaping as kText does: for a log whose line format is part of a contract
// (file_sink.h).
std::unique_ptr<spdlog::formatter> make_text_formatter(std::string pattern);
// The formatter of `format` for `program` (setup installs it; tests and other sinks use it).
std::unique_ptr<spdlog::formatter> make_formatter(std::string_view program, Format format);

// The process's logging: spdlog's default logger and every logger made by get() write to stderr
// in `format` at `level` and above. Loggers made before are switched over too. Call it once,
// early in main; before it, get() loggers write text to stderr.
void setup(std::string_view program, Format format,
           spdlog::level::level_enum level = spdlog::level::info);

// The named logger of a subsystem ("coord", "worker"), made on first use with setup's sink,
// formatter and level, and registered with spdlog (spdlog::get(name) finds it).
std::shared_ptr<spdlog::logger> get(const std::string& name);

// A message with fields (a JSON object): members of the line in JSON, " key=value" after the
// message in text (strings as they are, other values as JSON).
void event(spdlog::logger& logger, spdlog::level::level_enum level, std::string_view msg,
           const nlohmann::json& fields);

}  // namespace ring::log
