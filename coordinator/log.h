// ring-coord's logger ("coord"): every line's text passes through escape_for_log (security.h),
// because peers control many of the strings logged (names, messages, reasons, parse errors that
// quote their input), and a newline in one of them must not start a forged line.
#pragma once

#include <chrono>
#include <memory>

#include <spdlog/spdlog.h>

namespace ring::coord {

std::shared_ptr<spdlog::logger> logger();

using Clock = std::chrono::steady_clock;

// Operations longer than this are logged (warn) as slow.
inline constexpr double kSlow = 0.02;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace ring::coord
