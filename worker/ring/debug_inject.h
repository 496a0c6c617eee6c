// Test and debug aids read from the environment by a worker under ringd (never set them in a
// production job): they make one rank slow or stuck, so that straggler and hang attribution can
// be checked on a real job.
//
//   RING_DEBUG_DELAY="rank=R,ms=M[,from=S]"  rank R sleeps M ms in the data phase of every step
//                                            from step S (default 1) on: a straggler.
//   RING_DEBUG_BLOCK="rank=R,step=S"         rank R's main thread blocks for good in the data
//                                            phase of step S; its heartbeat thread goes on.
//   RING_TIMELINE=off                        no timeline records (the overhead benchmark's
//                                            baseline); the progress counter and the step
//                                            summary still work. `alternate`: records in even
//                                            steps only (the benchmark compares the two halves
//                                            of one run).
//
// A malformed value is an error naming the variable and the rule (the worker exits 2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ring::cp {

struct DebugInject {
  int64_t delay_ms = 0;    // this rank's delay per step (0: none)
  int64_t delay_from = 1;  // first delayed step
  int64_t block_step = 0;  // this rank blocks in this step (0: never)
};

// Parses the variables' values for `rank` (null: unset). Returns "" or the error.
std::string parse_debug_inject(const char* delay, const char* block, int rank, DebugInject* out);

}  // namespace ring::cp
