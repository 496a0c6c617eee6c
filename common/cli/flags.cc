#include "common/cli/flags.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "common/cli/edit_distance.h"

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

bool ArgWalker::next() {
  if (i_ + 1 >= argc_) return false;
  flag_ = argv_[++i_];
  return true;
}

const char* ArgWalker::value() {
  if (i_ + 1 >= argc_) throw FlagError(flag_ + " needs a value");
  return argv_[++i_];
}

const char* ArgWalker::peek() const {
  return i_ + 1 < argc_ ? argv_[i_ + 1] : nullptr;
}

FlagSet& FlagSet::add(const std::string& name, Entry e) {
  if (!entries_.emplace(name, std::move(e)).second)
    throw std::logic_error("FlagSet: " + name + " is in the table twice");
  return *this;
}

FlagSet& FlagSet::toggle(const std::string& name, bool* out) {
  return add(name, {false, [out](const std::string&, const char*) { *out = true; }});
}

FlagSet& FlagSet::text(const std::string& name, std::string* out) {
  return custom(name, [out](const std::string&, const char* v) { *out = v; });
}

FlagSet& FlagSet::text(const std::string& name, std::optional<std::string>* out) {
  return custom(name, [out](const std::string&, const char* v) { *out = v; });
}

FlagSet& FlagSet::seconds(const std::string& name, double* out) {
  return custom(name, [out](const std::string& flag, const char* v) {
    *out = parse_seconds(flag, v);
  });
}

FlagSet& FlagSet::custom(const std::string& name,
                         std::function<void(const std::string& flag, const char* value)> on) {
  return add(name, {true, std::move(on)});
}

FlagSet& FlagSet::unknown_note(std::string note) {
  unknown_note_ = std::move(note);
  return *this;
}

std::string FlagSet::closest_flag(const std::string& word) const {
  if (word.size() < 3 || word[0] != '-') return "";
  std::string best;
  size_t best_d = 3;  // two edits at most: a typo, not another flag
  for (const auto& [name, _] : entries_)
    if (size_t d = cli::edit_distance(word, name); d < best_d) best_d = d, best = name;
  return best;
}

void FlagSet::parse(int argc, char** argv) {
  ArgWalker w(argc, argv);
  while (w.next()) {
    const std::string& f = w.flag();
    if (f == "--help" || f == "-h") {
      std::cout << usage_;
      std::exit(0);
    }
    auto it = entries_.find(f);
    if (it == entries_.end()) {
      std::string hint;
      if (std::string c = closest_flag(f); !c.empty()) hint = "; did you mean '" + c + "'?";
      throw FlagError("unknown argument '" + f + "'" + hint + unknown_note_);
    }
    // "--job-dir --resume": the value left out, the next flag would be taken for it.
    if (it->second.takes_value)
      if (const char* next = w.peek(); next && entries_.count(std::string_view(next)))
        throw FlagError(f + " needs a value (got the flag " + next + ")");
    it->second.on(f, it->second.takes_value ? w.value() : nullptr);
    seen_.insert(f);
  }
}

void usage_exit(std::string_view program, std::string_view message, std::string_view usage,
                int code) {
  std::cerr << program << ": " << message << "\n" << usage;
  std::exit(code);
}

}  // namespace ring::flags
