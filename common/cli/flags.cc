#include "common/cli/flags.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ring::flags {

int64_t parse_int(std::string_view flag, const char* value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  // strtoll skips leading blanks: a value must start with its sign or first digit.
  const unsigned char c0 = static_cast<unsigned char>(value[0]);
  const bool starts_well = c0 == '-' || c0 == '+' || std::isdigit(c0);
  long long x = starts_well ? std::strtoll(value, &end, 10) : 0;
  if (!starts_well || errno != 0 || end == value || *end != '\0' || x < lo || x > hi)
    throw FlagError(std::string(flag) + ": expected an integer in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "], got '" + value + "'");
  return x;
}

double parse_seconds(std::string_view flag, const char* value) {
  // Decimal only: strtod would also take blanks, hex floats ("0x1p-3"), "nan" and "inf".
  bool decimal = *value != '\0';
  for (const char* p = value; *p; ++p)
    if (!std::isdigit(static_cast<unsigned char>(*p)) && !std::strchr(".eE+-", *p)) decimal = false;
  char* end = nullptr;
  double x = decimal ? std::strtod(value, &end) : 0;
  // At least a millisecond: a timeout of 1e-300 s is a typo, and would make every peer late.
  if (!decimal || end == value || *end != '\0' || !std::isfinite(x) || !(x >= kMinSeconds) ||
      x > kMaxSeconds)
    throw FlagError(std::string(flag) + ": expected seconds in [0.001, 1e6], got '" + value + "'");
  return x;
}

}  // namespace ring::flags
