// CLI11 options with the strict value rules of flags.h, and one way to run the parse: what
// ring-worker (and ringd) use so that every binary parses flags with CLI11 like ringctl and
// ring-coord, with the same messages as before.
//
//   CLI::App app{"ring-worker: ...", "ring-worker"};
//   app.set_version_flag("--version", std::string("ring-worker ") + ring::kVersion);
//   ring::flags::add_integer(app, "--steps", &a.steps, 1, int64_t{1} << 40, "optimizer steps");
//   ring::flags::add_custom(app, "--labels", [&](const std::string& flag, const std::string& v) {
//     if (v != "all") throw ring::flags::FlagError(flag + ": expected all, got '" + v + "'");
//   }, "passkey labels");
//   ring::flags::parse_or_exit(app, argc, argv);   // --help/--version exit 0; errors exit 2
//
// Every option keeps the last of several occurrences (as FlagSet did), so a launcher may append
// a flag the user also gave.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "common/cli/endpoint.h"
#include "common/cli/flags.h"

namespace ring::flags {

// An option with a value and a rule of its own: `on` throws FlagError naming the flag
// ("--x: expected ..."), reported as that message.
CLI::Option* add_custom(CLI::App& app, const std::string& name,
                        std::function<void(const std::string& flag, const std::string& value)> on,
                        const std::string& help);

// parse_int(name, value, lo, hi) into an integer or an optional integer.
template <typename T>
CLI::Option* add_integer(CLI::App& app, const std::string& name, T* out, int64_t lo, int64_t hi,
                         const std::string& help) {
  // int for int and for std::optional<int> (deduction of std::optional{x} unwraps an optional).
  using Target = typename decltype(std::optional{*out})::value_type;
  return add_custom(
             app, name,
             [out, lo, hi](const std::string& flag, const std::string& v) {
               *out = static_cast<Target>(parse_int(flag, v.c_str(), lo, hi));
             },
             help)
      ->type_name("INT");
}

// parse_seconds(name, value).
CLI::Option* add_seconds(CLI::App& app, const std::string& name, double* out,
                         const std::string& help);

// CLI11 rules with the same messages for every program (CLI11 puts "FLAG: " in front):
// "expected an integer in [LO, HI], got 'V'" (parse_int), "expected seconds in [LO, HI], got
// 'V'" (parse_seconds_in: decimal only, never NaN, infinities or hex), and the endpoint rule
// (endpoint.h).
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator seconds_in(double lo, double hi);
CLI::Validator endpoint_rule(EndpointUse use);

// The option of `app` closest to a misspelt `word` (two edits at most), or "".
std::string closest_option(const CLI::App& app, const std::string& word);

// Parses argv[1..argc). --help and --version print to stdout and exit 0. Anything else wrong
// prints "PROGRAM: MESSAGE" and "  `PROGRAM --help` lists the flags" to stderr and exits 2:
// an argument not in the table is "unknown argument 'X'" (with "; did you mean 'Y'?" for a typo),
// a bad value is the rule's message ("--steps: expected an integer in [1, 1099511627776], got
// 'x'"), a value left out is CLI11's ("--spec: 1 required TEXT missing").
void parse_or_exit(CLI::App& app, int argc, char** argv);

// Prints "PROGRAM: MESSAGE" and the --help hint to stderr and exits 2 (for rules between flags
// checked after the parse).
[[noreturn]] void usage_error(const CLI::App& app, const std::string& message);

}  // namespace ring::flags
