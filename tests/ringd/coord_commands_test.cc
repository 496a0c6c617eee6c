// What ring-coord's messages ask of ringd's attempt (daemon/ringd/coord_commands.h), without a
// coordinator: each command becomes its attempt event, a command for another job is refused, the
// job's state counts only while ringd waits for it, an error reply is only logged.
#include "daemon/ringd/coord_commands.h"

#include <gtest/gtest.h>

namespace {

using namespace ring;
using ringd::CoordInput;
using ringd::interpret;

protocol::Command cmd(protocol::CommandKind k, int64_t job = 7) {
  protocol::Command c;
  c.id = 41;
  c.command = k;
  c.job = job;
  c.attempt = 3;
  c.step = 20;
  c.reason = "because";
  return c;
}

TEST(CoordCommands, CommandsBecomeAttemptEvents) {
  const ringd::attempt::State running;
  struct Case {
    protocol::CommandKind kind;
    ringd::attempt::EventKind want;
    const char* name;
  };
  for (const Case& c :
       {Case{protocol::CommandKind::kStop, ringd::attempt::EventKind::kCoordStop, "stop"},
        Case{protocol::CommandKind::kRollBack, ringd::attempt::EventKind::kCoordRollBack,
             "roll_back"},
        Case{protocol::CommandKind::kCheckpointNow,
             ringd::attempt::EventKind::kCoordCheckpointNow, "checkpoint_now"}}) {
    const CoordInput in = interpret(cmd(c.kind), 7, running, true);
    ASSERT_TRUE(in.event.has_value()) << c.name;
    EXPECT_FALSE(in.refusal.has_value());
    EXPECT_EQ(in.event->kind, c.want) << c.name;
    EXPECT_EQ(in.event->text, "because");
    EXPECT_TRUE(in.event->has_checkpointer);
    EXPECT_EQ(in.command_id, 41);
    EXPECT_EQ(in.note, std::string("ring-coord: ") + c.name + " (attempt 3, step 20): because");
    ASSERT_TRUE(in.report.has_value());
    EXPECT_EQ((*in.report)["command"], c.name);
    EXPECT_EQ((*in.report)["id"], 41);
  }
  const CoordInput rb = interpret(cmd(protocol::CommandKind::kRollBack), 7, running, false);
  EXPECT_EQ(rb.event->attempt, 3);
  EXPECT_EQ(rb.event->step, 20);
  EXPECT_FALSE(rb.event->has_checkpointer);
}

TEST(CoordCommands, CommandForAnotherJobIsRefused) {
  const CoordInput in = interpret(cmd(protocol::CommandKind::kStop, 8), 7, {}, true);
  EXPECT_FALSE(in.event.has_value());
  ASSERT_TRUE(in.refusal.has_value());
  EXPECT_EQ(*in.refusal, "this ringd serves job 7, not 8");
  EXPECT_EQ(in.command_id, 41);
  EXPECT_FALSE(in.report.has_value());
}

TEST(CoordCommands, JobStateCountsOnlyWhileAwaited) {
  protocol::Registered r;
  r.jobs.push_back({});
  r.jobs.back().job = 9;
  r.jobs.back().state = "running";
  r.jobs.push_back({});
  r.jobs.back().job = 7;
  r.jobs.back().state = "cancelled";
  ringd::attempt::State waiting;
  waiting.phase = ringd::attempt::Phase::kAwaitingCoord;
  waiting.await = ringd::attempt::Await::kState;
  const CoordInput in = interpret(r, 7, waiting, true);
  ASSERT_TRUE(in.event.has_value());
  EXPECT_EQ(in.event->kind, ringd::attempt::EventKind::kCoordState);
  EXPECT_EQ(in.event->text, "cancelled");
  EXPECT_EQ(in.note, "ring-coord: the job is cancelled");
  // A re-registration while training, or an answer without this job: nothing.
  EXPECT_FALSE(interpret(r, 7, ringd::attempt::State{}, true).event.has_value());
  EXPECT_FALSE(interpret(r, 5, waiting, true).event.has_value());
}

TEST(CoordCommands, ErrorReplyIsLoggedOnly) {
  protocol::ErrorReply e;
  e.code = "bad_field";
  e.message = "no such job";
  e.field = "job";
  const CoordInput in = interpret(e, 7, {}, true);
  EXPECT_FALSE(in.event.has_value());
  EXPECT_FALSE(in.refusal.has_value());
  EXPECT_EQ(in.note, "ring-coord: no such job (bad_field, job)");
  e.field.clear();
  EXPECT_EQ(interpret(e, 7, {}, true).note, "ring-coord: no such job (bad_field)");
}

}  // namespace
