// ringctl's exit codes: one meaning each, for every subcommand. `ringctl --help` prints this
// table (exit_code_table()) and docs/operator-guide.md ("Exit codes") repeats it; a test checks
// that the two agree.
//
// ringd's own codes (daemon/INTERFACE.md: 0 done, 1 failed, 2 refused, 3 cancelled through
// ring-coord, 75 stopped and resumable) are its contract with Slurm and ringctl; `ringctl run`
// maps them and a death by signal onto this table (from_ringd_status), so that no code means two
// things and no 128+N leaks out.
#pragma once

#include <string>
#include <vector>

namespace ring::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;        // invalid input (spec errors), or the job failed
inline constexpr int kExitUsage = 2;         // bad flags or arguments
inline constexpr int kExitNoFit = 3;         // plan --check: the job does not fit
inline constexpr int kExitNoCoord = 4;       // no coordinator answered at the endpoint
inline constexpr int kExitNotFound = 5;      // no such job
inline constexpr int kExitDenied = 6;        // the job belongs to another user
inline constexpr int kExitInvalidState = 7;  // refused in the job's state (cancel a done job)
inline constexpr int kExitCancelled = 8;     // run: the job was cancelled (ringctl cancel)
inline constexpr int kExitKilled = 9;        // run: ringd was killed by a signal
inline constexpr int kExitRequeue = 10;      // slurm-started: requeued without excluded nodes
inline constexpr int kExitStopped = 75;      // run: stopped early and resumable (EX_TEMPFAIL)

struct ExitCodeDoc {
  int code;
  std::string meaning;
};
// Every code above with its meaning, in order: the --help epilogue and the operator guide.
const std::vector<ExitCodeDoc>& exit_code_table();
// The table as the --help epilogue prints it ("Exit codes:\n  0  success\n ...").
std::string exit_code_help();

// The exit code of `ringctl run` for ringd's wait status (waitpid): 0 -> 0, 1 -> 1,
// 2 (ringd refused its arguments or the spec) -> 1, 3 (cancelled) -> kExitCancelled,
// 75 -> kExitStopped, any other code -> 1, killed by a signal -> kExitKilled.
int from_ringd_status(int wait_status);
// What happened to ringd, for the summary ("completed", "cancelled (ringctl cancel)", "ringd
// killed by signal 9 (Killed)", "failed (ringd exit 1)").
std::string describe_ringd_status(int wait_status);

}  // namespace ring::cli
