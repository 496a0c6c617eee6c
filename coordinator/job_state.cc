#include "coordinator/job_state.h"

#include <utility>

namespace ring::coord {

namespace {

using S = JobState;

// THE table of allowed transitions. Anything not listed is refused.
constexpr std::pair<S, S> kTransitions[] = {
    // A daemon joins: the first attempt starts. Cancel before any daemon came. Failure to
    // schedule (e.g. sbatch refused) fails it.
    {S::kPending, S::kStarting},
    {S::kPending, S::kCancelled},
    {S::kPending, S::kFailed},
    // The first step report of the attempt arrives; the attempt fails; the last step was
    // reached right away (resume at the end); cancel; Slurm requeued the allocation.
    {S::kStarting, S::kRunning},
    {S::kStarting, S::kRestarting},
    {S::kStarting, S::kFailed},
    {S::kStarting, S::kCompleting},
    {S::kStarting, S::kCancelling},
    {S::kStarting, S::kPending},
    // Training.
    {S::kRunning, S::kCompleting},
    {S::kRunning, S::kRestarting},
    {S::kRunning, S::kFailed},
    {S::kRunning, S::kCancelling},
    {S::kRunning, S::kPending},
    // Backoff elapsed: next attempt; restarts were exhausted meanwhile; cancel; requeue.
    {S::kRestarting, S::kStarting},
    {S::kRestarting, S::kFailed},
    {S::kRestarting, S::kCancelling},
    {S::kRestarting, S::kPending},
    // Every node finished; a node failed before finishing (roll back or fail); cancel.
    {S::kCompleting, S::kCompleted},
    {S::kCompleting, S::kRestarting},
    {S::kCompleting, S::kFailed},
    {S::kCompleting, S::kCancelling},
    // Every live daemon confirmed the stop (or was lost).
    {S::kCancelling, S::kCancelled},
    // Its owner restarts a failed job (from its latest checkpoint).
    {S::kFailed, S::kRestarting},
    // Every node stopped on its own stop signal, after a checkpoint (resumable); its owner
    // restarts it, or Slurm requeues it.
    {S::kStarting, S::kStopped},
    {S::kRunning, S::kStopped},
    {S::kRestarting, S::kStopped},
    {S::kCompleting, S::kStopped},
    {S::kStopped, S::kRestarting},
    {S::kStopped, S::kPending},
};

}  // namespace

const char* to_string(JobState s) {
  switch (s) {
    case S::kPending:
      return "pending";
    case S::kStarting:
      return "starting";
    case S::kRunning:
      return "running";
    case S::kRestarting:
      return "restarting";
    case S::kCompleting:
      return "completing";
    case S::kCompleted:
      return "completed";
    case S::kFailed:
      return "failed";
    case S::kCancelling:
      return "cancelling";
    case S::kCancelled:
      return "cancelled";
    case S::kStopped:
      return "stopped";
  }
  return "?";
}

std::optional<JobState> job_state_from_string(std::string_view s) {
  for (S st : kAllJobStates)
    if (s == to_string(st)) return st;
  return std::nullopt;
}

bool is_terminal(JobState s) {
  return s == S::kCompleted || s == S::kFailed || s == S::kCancelled || s == S::kStopped;
}

bool is_active(JobState s) {
  return s == S::kStarting || s == S::kRunning || s == S::kCompleting;
}

bool transition_allowed(JobState from, JobState to) {
  for (const auto& [a, b] : kTransitions)
    if (a == from && b == to) return true;
  return false;
}

std::vector<JobState> allowed_from(JobState from) {
  std::vector<JobState> out;
  for (const auto& [a, b] : kTransitions)
    if (a == from) out.push_back(b);
  return out;
}

void check_transition(JobState from, JobState to, const std::string& what) {
  if (transition_allowed(from, to)) return;
  std::string allowed;
  for (S s : allowed_from(from))
    allowed += (allowed.empty() ? "" : ", ") + std::string(to_string(s));
  throw InvalidTransition(from, to,
                          what + ": cannot go from " + to_string(from) + " to " + to_string(to) +
                              " (allowed from " + to_string(from) + ": " +
                              (allowed.empty() ? "none, it is final" : allowed) + ")");
}

}  // namespace ring::coord
