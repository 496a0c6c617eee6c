#include "common/cli/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

using ring::flags::FlagError;

namespace {

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const FlagError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no FlagError";
  return "";
}

}  // namespace

TEST(Flags, ParseIntChecksTheWholeValueAndTheRange) {
  EXPECT_EQ(ring::flags::parse_int("--steps", "12", 1, 100), 12);
  EXPECT_EQ(ring::flags::parse_int("--threads", "0", 0, 4096), 0);
  EXPECT_EQ(ring::flags::parse_int("--stagger-us", "-5", -10, 10), -5);
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--steps", "x", 1, 1099511627776); }),
            "--steps: expected an integer in [1, 1099511627776], got 'x'");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--steps", "0", 1, 10); }),
            "--steps: expected an integer in [1, 10], got '0'");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--rank", "3k", 0, 65535); }),
            "--rank: expected an integer in [0, 65535], got '3k'");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--nodes", "", 1, 65536); }),
            "--nodes: expected an integer in [1, 65536], got ''");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("SLURM_NNODES", "99999999999999999999", 1, 65536); }),
            "SLURM_NNODES: expected an integer in [1, 65536], got '99999999999999999999'");
}

TEST(Flags, ParseSecondsTakesDecimalsFromAMillisecondToAMillion) {
  EXPECT_DOUBLE_EQ(ring::flags::parse_seconds("--stop-grace", "0.25"), 0.25);
  EXPECT_DOUBLE_EQ(ring::flags::parse_seconds("--stop-grace", "1e6"), 1e6);
  EXPECT_DOUBLE_EQ(ring::flags::parse_seconds("--stop-grace", "0.001"), 0.001);
  // NaN and infinities in every spelling strtod takes, hex floats, blanks, and positive values
  // so small that every peer would count as late at once.
  for (const char* bad : {"0", "-1", "nan", "NaN", "-nan", "inf", "-inf", "infinity", "2e6", "5s",
                          "", "0x10", "0x1p-3", " 5", "5 ", "1e-300", "4e-324", "0.0009"}) {
    EXPECT_EQ(
        error_of([&] { ring::flags::parse_seconds("--heartbeat-timeout", bad); }),
        std::string("--heartbeat-timeout: expected seconds in [0.001, 1e6], got '") + bad + "'");
  }
}

TEST(Flags, ParseIntTakesDecimalTextOnly) {
  EXPECT_EQ(ring::flags::parse_int("--steps", "+12", 1, 100), 12);
  for (const char* bad : {" 12", "12 ", "0x10", "1e3", "12.0", "nan", "inf"})
    EXPECT_EQ(error_of([&] { ring::flags::parse_int("--steps", bad, 1, 100); }),
              std::string("--steps: expected an integer in [1, 100], got '") + bad + "'");
}
