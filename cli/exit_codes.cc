#include "cli/exit_codes.h"

#include <sys/wait.h>

#include <cstring>

#include <fmt/format.h>

namespace ring::cli {

namespace {
// ringd's codes (daemon/ringd/ringd.h, daemon/INTERFACE.md).
constexpr int kRingdOk = 0;
constexpr int kRingdUsage = 2;
constexpr int kRingdCancelled = 3;
constexpr int kRingdStopped = 75;
}  // namespace

const std::vector<ExitCodeDoc>& exit_code_table() {
  static const std::vector<ExitCodeDoc> t{
      {kExitOk, "success"},
      {kExitFailed,
       "invalid input (a spec with errors, a missing file or job directory), or the "
       "job failed (run: ringd failed or refused the job)"},
      {kExitUsage,
       "usage error: an unknown command or flag, a missing or malformed argument, a "
       "number out of its range"},
      {kExitNoFit, "plan --check: the job does not fit its resources"},
      {kExitNoCoord, "no coordinator answers at the endpoint"},
      {kExitNotFound, "no such job"},
      {kExitDenied, "the job belongs to another user"},
      {kExitInvalidState, "refused in the job's current state"},
      {kExitCancelled, "run: the job was cancelled (ringctl cancel; ringd's 3)"},
      {kExitKilled, "run: ringd was killed by a signal (the summary names it)"},
      {kExitRequeue,
       "slurm-started: the allocation holds a node the job excludes; ring-coord requeues the "
       "job without it (the batch script starts no ringd)"},
      {kExitStopped, "run: stopped early on request, resumable (ringd's 75)"},
  };
  return t;
}

std::string exit_code_help() {
  std::string s = "Exit codes:\n";
  for (const auto& e : exit_code_table()) s += fmt::format("  {:>2}  {}\n", e.code, e.meaning);
  return s;
}

int from_ringd_status(int st) {
  if (!WIFEXITED(st)) return kExitKilled;
  switch (WEXITSTATUS(st)) {
    case kRingdOk:
      return kExitOk;
    case kRingdCancelled:
      return kExitCancelled;
    case kRingdStopped:
      return kExitStopped;
    default:
      return kExitFailed;  // 1 failed, 2 refused, anything else
  }
}

std::string describe_ringd_status(int st) {
  if (WIFSIGNALED(st))
    return fmt::format("ringd killed by signal {} ({})", WTERMSIG(st), strsignal(WTERMSIG(st)));
  if (!WIFEXITED(st)) return "ringd ended abnormally";
  switch (WEXITSTATUS(st)) {
    case kRingdOk:
      return "completed";
    case kRingdStopped:
      return "stopped (resumable)";
    case kRingdUsage:
      return "refused by ringd (usage or spec error)";
    case kRingdCancelled:
      return "cancelled (ringctl cancel)";
    default:
      return fmt::format("failed (ringd exit {})", WEXITSTATUS(st));
  }
}

}  // namespace ring::cli
