#include "common/cli/flags.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <algorithm>
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

namespace {

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  std::string s = buf;
  auto e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  std::string sign = exp[0] == '-' ? "-" : "";
  exp = exp.substr(exp[0] == '+' || exp[0] == '-' ? 1 : 0);
  exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
  return mant + "e" + sign + exp;
}

}  // namespace

double parse_seconds_in(std::string_view flag, const char* value, double lo, double hi) {
  // Decimal only: strtod would also take blanks, hex floats ("0x1p-3"), "nan" and "inf".
  bool decimal = *value != '\0';
  for (const char* p = value; *p; ++p)
    if (!std::isdigit(static_cast<unsigned char>(*p)) && !std::strchr(".eE+-", *p)) decimal = false;
  char* end = nullptr;
  double x = decimal ? std::strtod(value, &end) : 0;
  if (!decimal || end == value || *end != '\0' || !std::isfinite(x) || !(x >= lo) || x > hi)
    throw FlagError(std::string(flag) + ": expected seconds in [" + number_text(lo) + ", " +
                    number_text(hi) + "], got '" + value + "'");
  return x;
}

double parse_seconds(std::string_view flag, const char* value) {
  // At least a millisecond: a timeout of 1e-300 s is a typo, and would make every peer late.
  return parse_seconds_in(flag, value, kMinSeconds, kMaxSeconds);
}

}  // namespace ring::flags
