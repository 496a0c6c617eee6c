// Command-line flags as ringd and ring-worker read them: a table of `--flag [value]` entries, each
// with its rule, applied to argv in order; errors name the flag and the rule.
//
//   ring::flags::FlagSet fs(kUsage);                     // --help / -h print kUsage, exit 0
//   fs.text("--spec", &a.spec).toggle("--resume", &a.resume)
//     .integer("--steps", &a.steps, 1, int64_t{1} << 40).seconds("--stop-grace", &a.grace_s);
//   fs.parse(argc, argv);
//
// Malformed input throws FlagError with the whole message ("--steps: expected an integer in
// [1, 1099511627776], got 'x'", "--spec needs a value", "--spec needs a value (got the flag
// --resume)", "unknown argument '--x'"); a program
// prints it with its usage text (usage_exit) and exits 2. ArgWalker is the walk underneath, for
// a program that wants its own loop.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

// Walks argv[1..argc) one argument at a time; value() consumes the argument after the flag.
class ArgWalker {
 public:
  ArgWalker(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next argument (false after the last); flag() is that argument.
  bool next();
  const std::string& flag() const { return flag_; }

  // The flag's value, consumed: "FLAG needs a value" when the flag is the last argument.
  const char* value();
  // The next argument, not consumed (nullptr after the last).
  const char* peek() const;
  int64_t int_value(int64_t lo, int64_t hi) { return parse_int(flag_, value(), lo, hi); }
  double seconds_value() { return parse_seconds(flag_, value()); }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string flag_;
};

// The flags of one program. Each name may be given once in the table; on the command line a
// later occurrence overrides an earlier one.
class FlagSet {
 public:
  explicit FlagSet(std::string usage) : usage_(std::move(usage)) {}

  // A flag without a value that sets *out = true.
  FlagSet& toggle(const std::string& name, bool* out);
  // A flag whose value is kept as given.
  FlagSet& text(const std::string& name, std::string* out);
  FlagSet& text(const std::string& name, std::optional<std::string>* out);
  // parse_int(name, value, lo, hi) into an integer or an optional integer.
  template <typename T>
  FlagSet& integer(const std::string& name, T* out, int64_t lo, int64_t hi) {
    return custom(name, [out, lo, hi](const std::string& flag, const char* v) {
      *out = static_cast<typename Target<T>::type>(parse_int(flag, v, lo, hi));
    });
  }
  // parse_seconds(name, value).
  FlagSet& seconds(const std::string& name, double* out);
  // A flag with a value and a rule of its own: `on` throws FlagError naming the flag.
  FlagSet& custom(const std::string& name,
                  std::function<void(const std::string& flag, const char* value)> on);
  // Appended to "unknown argument 'X'" (e.g. " (multi-rank mode)").
  FlagSet& unknown_note(std::string note);

  // Applies argv[1..argc) in order: --help or -h print the usage to stdout and exit 0; an
  // argument not in the table is "unknown argument 'X'" (with "; did you mean 'Y'?" for a typo
  // of a flag Y); a value flag last is "X needs a value".
  void parse(int argc, char** argv);
  // Whether parse() met the flag.
  bool seen(const std::string& name) const { return seen_.count(name) > 0; }

 private:
  template <typename T>
  struct Target {
    using type = T;
  };
  template <typename T>
  struct Target<std::optional<T>> {
    using type = T;
  };
  struct Entry {
    bool takes_value = true;
    std::function<void(const std::string&, const char*)> on;
  };
  FlagSet& add(const std::string& name, Entry e);
  // The flag of the table closest to a misspelt one (two edits at most), or "".
  std::string closest_flag(const std::string& word) const;

  std::string usage_;
  std::string unknown_note_;
  std::map<std::string, Entry, std::less<>> entries_;
  std::set<std::string, std::less<>> seen_;
};

// Prints "PROGRAM: MESSAGE\n" and the usage text to stderr, then exits with `code`.
[[noreturn]] void usage_exit(std::string_view program, std::string_view message,
                             std::string_view usage, int code = 2);

}  // namespace ring::flags
