// --log-format text|json and --log-level LEVEL for a CLI11 program (header-only; link ring_log
// and ring_common), so every binary spells and checks them the same way:
//
//   ring::log::Format format = ring::log::Format::kText;
//   spdlog::level::level_enum level = spdlog::level::info;
//   ring::log::add_log_flags(app, &format, &level, "Logging");
//   ring::flags::parse_or_exit(app, argc, argv);
//   ring::log::setup("ringd", format, level);
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "common/cli/cli11_flags.h"
#include "common/log/log.h"

namespace ring::log {

// Adds both flags to `app` (in help group `group`); a bad value is "--log-format: expected text
// or json, got 'V'" / "--log-level: expected trace, debug, info, warn, error, critical or off,
// got 'V'".
inline void add_log_flags(CLI::App& app, Format* format, spdlog::level::level_enum* level,
                          const std::string& group) {
  flags::add_custom(
      app, "--log-format",
      [format](const std::string& flag, const std::string& v) {
        auto f = parse_format(v);
        if (!f) throw flags::FlagError(flag + ": expected text or json, got '" + v + "'");
        *format = *f;
      },
      "Log on stderr: text (default) or json (one object per line: ts, level, program, pid, "
      "logger, msg)")
      ->type_name("text|json")
      ->group(group);
  flags::add_custom(
      app, "--log-level",
      [level](const std::string& flag, const std::string& v) {
        auto l = parse_level(v);
        if (!l)
          throw flags::FlagError(
              flag + ": expected trace, debug, info, warn, error, critical or off, got '" + v +
              "'");
        *level = *l;
      },
      "Least severity logged: trace, debug, info (default), warn, error, critical or off")
      ->type_name("LEVEL")
      ->group(group);
}

}  // namespace ring::log
