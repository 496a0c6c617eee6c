// `ringctl trace`: the nodes' timeline files (<job dir>/timeline/node-<K>.jsonl, written by each
// ringd: daemon/ringd/observer.h) merged into one Chrome / Perfetto trace (JSON trace-event
// format: {"traceEvents":[...]}, complete events "X" with microsecond ts and dur).
//
// Processes are nodes (pid K, named "node K (<name>)"), threads are ranks: tid 10 R + 1 carries a
// rank's phases (step, data, forward/backward per layer with the ring waits inside, gradient
// handovers, collectives), 10 R + 2 its ring receives and 10 R + 3 its ring sends (posted ->
// completed; they overlap the compute, so they get their own tracks), tid 0 ringd's own phases
// (optimizer, checkpoint). Times: each node's monotonic clock mapped to Unix time with the
// (monotonic, Unix) pair of its file, then made relative to the earliest event.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ring::cli {

struct TraceOptions {
  std::optional<int64_t> step;  // only this step (default: every step in the files)
};

// The node files of a job directory (regular files named node-<K>.jsonl in <dir>/timeline),
// ordered by K.
std::vector<std::string> timeline_files(const std::string& job_dir);

// Builds the trace from the files' contents. Throws std::runtime_error naming the file and line
// of a malformed record.
nlohmann::json build_trace(const std::vector<std::pair<std::string, std::string>>& files,
                           const TraceOptions& o);

}  // namespace ring::cli
