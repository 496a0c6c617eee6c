// The job state machine. Every state change of a job goes through check_transition(), which
// reads the one table of allowed transitions in job_state.cc.
//
//   pending ──▶ starting ──▶ running ──▶ completing ──▶ completed
//      │           │  ▲         │  ▲          │
//      │           ▼  │         ▼  │          ▼
//      │        restarting ◀────┘  └─ (requeue: running/starting/restarting ──▶ pending)
//      │           │
//      ▼           ▼
//   cancelled ◀─ cancelling ◀── (any live state)        failed ──▶ restarting (manual restart)
//   stopped ◀── starting, running, restarting, completing (every node stopped on its own stop
//               signal, resumable); stopped ──▶ restarting (manual restart), pending (requeue)
//
// pending: accepted, no daemon has joined yet (waiting for Slurm or `ringctl run`).
// starting: an attempt exists, daemons are starting workers; no step of this attempt yet.
// running: step reports of the current attempt are arriving.
// restarting: the attempt failed (worker died, node lost, user restart); waiting for the backoff
//   before the next attempt, which rolls back to the latest complete checkpoint.
// completing: some nodes reported the last step; waiting for the others.
// cancelling: stop commands sent; waiting for the daemons to confirm (or be lost).
// stopped: every node stopped on a stop signal of its own (Ctrl-C of `ringctl run`, SIGTERM),
//   after a checkpoint: resumable, not a failure, not a cancel.
// completed, failed, cancelled, stopped: terminal (failed and stopped may be restarted by
//   their owner).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ring::coord {

enum class JobState {
  kPending,
  kStarting,
  kRunning,
  kRestarting,
  kCompleting,
  kCompleted,
  kFailed,
  kCancelling,
  kCancelled,
  kStopped,
};

inline constexpr JobState kAllJobStates[] = {
    JobState::kPending,    JobState::kStarting,   JobState::kRunning,
    JobState::kRestarting, JobState::kCompleting, JobState::kCompleted,
    JobState::kFailed,     JobState::kCancelling, JobState::kCancelled, JobState::kStopped,
};

const char* to_string(JobState s);
std::optional<JobState> job_state_from_string(std::string_view s);

// True for completed, failed and cancelled.
bool is_terminal(JobState s);
// States in which daemons are (or should be) running the job's workers.
bool is_active(JobState s);

// A refused state change: "job 7: cannot go from completed to running (allowed from completed:
// none)".
class InvalidTransition : public std::runtime_error {
 public:
  InvalidTransition(JobState from, JobState to, const std::string& message)
      : std::runtime_error(message), from_(from), to_(to) {}
  JobState from() const { return from_; }
  JobState to() const { return to_; }

 private:
  JobState from_;
  JobState to_;
};

bool transition_allowed(JobState from, JobState to);
// The states reachable from `from` in one step, in table order.
std::vector<JobState> allowed_from(JobState from);
// Throws InvalidTransition when the table does not allow from -> to. `what` prefixes the message
// ("job 7").
void check_transition(JobState from, JobState to, const std::string& what = "job");

}  // namespace ring::coord
