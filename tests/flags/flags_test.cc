#include "common/cli/flags.h"

#include "common/cli/endpoint.h"

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

// One endpoint rule for ringctl, ringd (connect) and ring-coord (bind).
TEST(Flags, EndpointRuleForConnectAndBind) {
  using ring::flags::endpoint_error;
  using ring::flags::EndpointUse;
  for (EndpointUse u : {EndpointUse::kConnect, EndpointUse::kBind}) {
    EXPECT_EQ(endpoint_error("ipc:///run/ring/coord.sock", u), "");
    EXPECT_EQ(endpoint_error("tcp://login1:5555", u), "");
    EXPECT_EQ(endpoint_error("tcp://[::1]:5555", u), "");
    EXPECT_EQ(endpoint_error("ipc://relative.sock", u),
              "ipc:// needs an absolute path (ipc:///DIR/coord.sock)");
    EXPECT_EQ(endpoint_error("ipc:///run/ring/", u),
              "ipc:// needs a socket file name in a directory (ipc:///DIR/coord.sock)");
    EXPECT_NE(endpoint_error("ipc:///" + std::string(200, 'a') + "/s", u).find("takes at most 107"),
              std::string::npos);
    EXPECT_EQ(endpoint_error("ipc:///run/a\nb/s", u), "the socket path contains a control character");
    EXPECT_EQ(endpoint_error("tcp://login1", u), "tcp:// needs HOST:PORT (tcp://login1:5555)");
    EXPECT_EQ(endpoint_error("tcp://::1:5555", u),
              "an IPv6 address must be in brackets (tcp://[::1]:PORT)");
    EXPECT_EQ(endpoint_error("udp://x:1", u), "expected ipc://PATH or tcp://HOST:PORT, got 'udp://x:1'");
    EXPECT_NE(endpoint_error("tcp://a;b:5", u).find("contains ';'"), std::string::npos);
  }
  // Connect: a real port on a named host.
  EXPECT_EQ(endpoint_error("tcp://login1:0", EndpointUse::kConnect), "port '0' is not in 1..65535");
  EXPECT_EQ(endpoint_error("tcp://login1:99999", EndpointUse::kConnect),
            "port '99999' is not in 1..65535");
  EXPECT_EQ(endpoint_error("tcp://*:5555", EndpointUse::kConnect).find("contains '*'") !=
                std::string::npos,
            true);
  EXPECT_EQ(endpoint_error("tcp://:5555", EndpointUse::kConnect),
            "tcp:// needs a host before ':' (tcp://login1:5555)");
  EXPECT_EQ(endpoint_error("ipc:///coord.sock", EndpointUse::kConnect), "");
  // Bind: any interface, any free port; the socket's directory is ring-coord's to prepare.
  EXPECT_EQ(endpoint_error("ipc:///coord.sock", EndpointUse::kBind),
            "ipc:// needs a socket file name in a directory (ipc:///DIR/coord.sock)");
  EXPECT_EQ(endpoint_error("tcp://*:0", EndpointUse::kBind), "");
  EXPECT_EQ(endpoint_error("tcp://127.0.0.1:*", EndpointUse::kBind), "");
  EXPECT_EQ(endpoint_error("tcp://127.0.0.1:99999", EndpointUse::kBind),
            "port '99999' is not a TCP port (0..65535, 0 or * for any free port)");
  EXPECT_EQ(endpoint_error("tcp://127.0.0.1:-1", EndpointUse::kBind),
            "port '-1' is not a TCP port (0..65535, 0 or * for any free port)");
}

// Seconds in a range of the caller's, with the bounds as written: no hex, NaN or infinity.
TEST(Flags, SecondsInARangeOfTheCallers) {
  EXPECT_EQ(ring::flags::parse_seconds_in("--t", "2.5", 0.05, 3600), 2.5);
  for (const char* bad : {"nan", "inf", "0x10", "0.01", "3601", " 5", ""})
    EXPECT_EQ(error_of([&] { ring::flags::parse_seconds_in("--t", bad, 0.05, 3600); }),
              std::string("--t: expected seconds in [0.05, 3600], got '") + bad + "'");
  EXPECT_EQ(error_of([&] { ring::flags::parse_seconds_in("--t", "x", 1e-3, 1e6); }),
            "--t: expected seconds in [0.001, 1e6], got 'x'");
}
