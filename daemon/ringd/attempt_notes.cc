#include "daemon/ringd/attempt_notes.h"

#include <cstring>

#include <fmt/format.h>

namespace ring::ringd {

Words words_of(const attempt::Action& a, const NoteFacts& f) {
  using attempt::Note;
  Words w;
  const int64_t step = f.done_step;
  switch (a.note) {
    case Note::kNone:
      break;
    case Note::kStopping:
      w.line = fmt::format("{}: finishing the step, checkpoint, then stop", strsignal(f.last_signal));
      w.event = "stopping";
      w.fields = {{"signal", f.last_signal}, {"step", step}};
      break;
    case Note::kStopNow:
      w.line = fmt::format("{} again: stopping the workers now, no checkpoint",
                           strsignal(f.last_signal));
      break;
    case Note::kStopAgreed:
      w.line = fmt::format("step {}: every node knows of the stop: checkpoint, then stop", step);
      break;
    case Note::kStopFromOtherNode:
      w.line = fmt::format("step {}: another node was asked to stop: checkpoint, then stop", step);
      w.event = "stopping";
      w.fields = {{"step", step}, {"from", "another node"}};
      break;
    case Note::kCheckpointAsked:
      w.line = fmt::format("checkpoint at step {} (asked by ring-coord)", step);
      break;
    case Note::kStoppedByCoord:
      w.line = fmt::format("stopped at step {} by ring-coord ({})", step, a.text);
      w.event = "stopped";
      w.fields = {{"step", step}, {"reason", a.text}};
      break;
    case Note::kStoppedResumable:
      w.line = fmt::format("stopped at step {} on request (resumable)", step);
      w.event = "stopped";
      w.fields = {{"step", step}, {"resumable", true}};
      break;
    case Note::kStoppedAfterFailure:
      w.event = "stopped";
      w.fields = {{"step", step}};
      break;
    case Note::kCompleted:
      w.line = fmt::format("completed {} steps", step);
      w.event = "completed";
      w.fields = {{"step", step}};
      break;
    case Note::kRestarting:
      w.line = fmt::format("restart {} of {} in {:.1f} s (attempt {})", a.restart, f.max_restarts,
                           a.seconds, a.attempt);
      w.event = "restarting";
      w.fields = {{"restart", a.restart}, {"delay_s", a.seconds}};
      break;
    case Note::kRestartsExhausted:
      w.line = fmt::format("failed: restart.max_restarts ({}) exhausted", f.max_restarts);
      w.event = "failed";
      w.fields = {{"step", step}, {"restarts", f.restarts}};
      break;
    case Note::kRollBack:
      w.line = fmt::format("ring-coord: roll back to attempt {} from step {}", a.attempt, a.step);
      break;
    case Note::kStartFromCoord:
      w.line = fmt::format("ring-coord: starting attempt {} from step {}", a.attempt, a.step);
      break;
    case Note::kWaitForCoord:
      w.line = "attempt failed: waiting for ring-coord's decision (roll back or stop)";
      break;
    case Note::kCoordSilent:
      w.line = "ring-coord did not answer: applying the spec's restart policy here";
      break;
    case Note::kCoordNoState:
      w.line = "ring-coord did not say how to go on after its stop: exiting (resumable)";
      break;
    case Note::kCoordStoppedIdle:
      w.event = "stopped";
      w.fields = {{"step", step}, {"reason", a.text}};
      break;
    case Note::kFinalCheckpointFailed:
      w.event = "checkpoint_failed";
      w.fields = {{"step", step}, {"error", a.text}, {"final", true}};
      w.fatal = true;
      break;
  }
  return w;
}

}  // namespace ring::ringd
