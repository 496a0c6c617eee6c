// JSON-lines helpers for tests that read what ringd and ring-worker write (--json, steps.jsonl).
// Library ring_test_common (tests/common/CMakeLists.txt).
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/test_proc.h"

namespace ring::test {

// Every line of `path` that parses as JSON, in order; other lines (a line still being written,
// plain log text) are skipped.
std::vector<nlohmann::json> json_lines(const std::string& path);

// Polls `path` every `poll` until it holds a JSON line satisfying pred; returns that line, or a
// null json when none appeared within `seconds`.
template <class Pred>
nlohmann::json wait_line(const std::string& path, Pred pred, double seconds,
                         std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (const nlohmann::json& j : json_lines(path))
      if (pred(j)) return j;
    std::this_thread::sleep_for(poll);
  }
  return nlohmann::json();
}

}  // namespace ring::test
