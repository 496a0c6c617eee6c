// The words of the attempt's transitions (daemon/ringd/attempt_notes.h): the log lines and events
// the integration tests and users grep for.
#include "daemon/ringd/attempt_notes.h"

#include <signal.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace {

using namespace ring::ringd;
using attempt::Note;

attempt::Action note(Note n) {
  attempt::Action a;
  a.kind = attempt::ActionKind::kSay;
  a.note = n;
  return a;
}

TEST(AttemptNotes, StopsNameTheSignalAndTheStep) {
  const NoteFacts f{SIGTERM, 12, 3, 1};
  Words w = words_of(note(Note::kStopping), f);
  EXPECT_EQ(w.line, std::string(strsignal(SIGTERM)) + ": finishing the step, checkpoint, then stop");
  EXPECT_EQ(w.event, "stopping");
  EXPECT_EQ(w.fields, (nlohmann::json{{"signal", SIGTERM}, {"step", 12}}));
  EXPECT_FALSE(w.fatal);
  w = words_of(note(Note::kStopNow), f);
  EXPECT_EQ(w.line, std::string(strsignal(SIGTERM)) + " again: stopping the workers now, no checkpoint");
  EXPECT_EQ(w.event, "");
  w = words_of(note(Note::kStopFromOtherNode), f);
  EXPECT_EQ(w.line, "step 12: another node was asked to stop: checkpoint, then stop");
  EXPECT_EQ(w.fields, (nlohmann::json{{"step", 12}, {"from", "another node"}}));
  attempt::Action by_coord = note(Note::kStoppedByCoord);
  by_coord.text = "cancelled";
  w = words_of(by_coord, f);
  EXPECT_EQ(w.line, "stopped at step 12 by ring-coord (cancelled)");
  EXPECT_EQ(w.event, "stopped");
  EXPECT_EQ(w.fields, (nlohmann::json{{"step", 12}, {"reason", "cancelled"}}));
  w = words_of(note(Note::kStoppedAfterFailure), f);
  EXPECT_EQ(w.line, "");  // an event only
  EXPECT_EQ(w.event, "stopped");
}

TEST(AttemptNotes, RestartsAndTheEndOfTheRun) {
  const NoteFacts f{0, 40, 3, 2};
  attempt::Action r = note(Note::kRestarting);
  r.restart = 2;
  r.seconds = 1.5;
  r.attempt = 3;
  Words w = words_of(r, f);
  EXPECT_EQ(w.line, "restart 2 of 3 in 1.5 s (attempt 3)");
  EXPECT_EQ(w.event, "restarting");
  EXPECT_EQ(w.fields, (nlohmann::json{{"restart", 2}, {"delay_s", 1.5}}));
  w = words_of(note(Note::kRestartsExhausted), f);
  EXPECT_EQ(w.line, "failed: restart.max_restarts (3) exhausted");
  EXPECT_EQ(w.event, "failed");
  EXPECT_EQ(w.fields, (nlohmann::json{{"step", 40}, {"restarts", 2}}));
  w = words_of(note(Note::kCompleted), f);
  EXPECT_EQ(w.line, "completed 40 steps");
  EXPECT_EQ(w.event, "completed");
  attempt::Action failed = note(Note::kFinalCheckpointFailed);
  failed.text = "the final checkpoint (step 40) failed: disk full";
  w = words_of(failed, f);
  EXPECT_TRUE(w.fatal);
  EXPECT_EQ(w.line, "");
  EXPECT_EQ(w.event, "checkpoint_failed");
  EXPECT_EQ(w.fields["final"], true);
  EXPECT_EQ(w.fields["error"], failed.text);
  w = words_of(note(Note::kNone), f);
  EXPECT_EQ(w.line, "");
  EXPECT_EQ(w.event, "");
  EXPECT_FALSE(w.fatal);
}

TEST(AttemptNotes, TheCoordinatorsDecisions) {
  const NoteFacts f{0, 8, 0, 0};
  attempt::Action a = note(Note::kRollBack);
  a.attempt = 4;
  a.step = 6;
  EXPECT_EQ(words_of(a, f).line, "ring-coord: roll back to attempt 4 from step 6");
  a.note = Note::kStartFromCoord;
  EXPECT_EQ(words_of(a, f).line, "ring-coord: starting attempt 4 from step 6");
  EXPECT_EQ(words_of(note(Note::kCheckpointAsked), f).line,
            "checkpoint at step 8 (asked by ring-coord)");
  EXPECT_EQ(words_of(note(Note::kWaitForCoord), f).line,
            "attempt failed: waiting for ring-coord's decision (roll back or stop)");
  EXPECT_EQ(words_of(note(Note::kCoordSilent), f).line,
            "ring-coord did not answer: applying the spec's restart policy here");
  EXPECT_EQ(words_of(note(Note::kCoordNoState), f).line,
            "ring-coord did not say how to go on after its stop: exiting (resumable)");
}

}  // namespace
