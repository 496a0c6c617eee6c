// Shared by the ringd tests (built with RINGD_BIN and RING_WORKER defined): ringd's command line
// for a test and the worker pids it reported.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/test_json.h"

namespace ring::test {

// ringd on `spec` in job dir `dir`, JSON output, one thread per worker, the built ring-worker.
inline std::vector<std::string> ringd_args(const std::string& spec, const std::string& dir,
                                           std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {RINGD_BIN,   "--spec",           spec, "--job-dir", dir,
                                "--json",    "--worker-threads", "1",  "--worker-bin",
                                RING_WORKER, "--threads",        "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The pids of ringd's worker_started events in its JSON output file `out`.
inline std::vector<pid_t> worker_pids(const std::string& out) {
  std::vector<pid_t> p;
  for (const nlohmann::json& j : json_lines(out))
    if (j.value("event", "") == "worker_started") p.push_back(j.at("pid").get<pid_t>());
  return p;
}

}  // namespace ring::test
