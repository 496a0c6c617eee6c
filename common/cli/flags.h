// The value rules every program's flags share (common/cli/cli11_flags.h applies them to CLI11
// options): a decimal integer in a range, a duration in seconds. Malformed input throws FlagError
// with the whole message ("--steps: expected an integer in [1, 1099511627776], got 'x'").
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string_view>

namespace ring::flags {

class FlagError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A decimal integer in [lo, hi], all of `value`: "FLAG: expected an integer in [LO, HI], got 'V'".
int64_t parse_int(std::string_view flag, const char* value, int64_t lo, int64_t hi);

// A duration in seconds in [0.001, 1e6], written in decimal ("2", "0.5", "1e3"; not nan, inf,
// hex or blanks): "FLAG: expected seconds in [0.001, 1e6], got 'V'".
inline constexpr double kMinSeconds = 0.001;
inline constexpr double kMaxSeconds = 1e6;
double parse_seconds(std::string_view flag, const char* value);
// The same rule in [lo, hi]: "FLAG: expected seconds in [LO, HI], got 'V'" (bounds as %g
// writes them, exponents without '+' and leading zeros: 1e6).
double parse_seconds_in(std::string_view flag, const char* value, double lo, double hi);

}  // namespace ring::flags
