// ringd's outputs (daemon/ringd/output.h) alone: the log file, stderr, stdout (--json) and
// steps.jsonl of a temp job directory, in each output mode.
#include "daemon/ringd/output.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/common/test_proc.h"

namespace {

using namespace ring;
using ringd::Options;
using ringd::Output;
namespace fs = std::filesystem;

struct Rig {
  test::TempDir t{"ringd-output"};
  Rig() { fs::create_directories(t.path + "/logs"); }
  std::string log_path(int node = 0) const {
    return t.path + "/logs/ringd-" + std::to_string(node) + ".log";
  }
};

TEST(RingdOutput, OpenNamesTheFileItCannotOpen) {
  test::TempDir t("ringd-output");
  Options o;
  Output out(o);
  std::string why;
  EXPECT_FALSE(out.open(t.path + "/missing", &why));  // no logs/ there
  EXPECT_NE(why.find(t.path + "/missing/logs/ringd-0.log"), std::string::npos) << why;
}

TEST(RingdOutput, TextLinesGoToTheLogFileAndStderr) {
  Rig rig;
  Options o;
  o.node_rank = 0;
  Output out(o);
  std::string why;
  ASSERT_TRUE(out.open(rig.t.path, &why)) << why;
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  out.log("hello there");
  const nlohmann::json sent = out.event("started", {{"step", 3}}, 2);
  out.step({{"step", 1}, {"loss", 2.5}}, "step 1 | loss 2.5", true);
  out.step({{"step", 2}, {"loss", 2.25}}, "step 2 | not due", false);
  out.log_file("step 2 weights 0123");
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string std_out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(sent, (nlohmann::json{{"step", 3}, {"event", "started"}, {"node", 0}, {"attempt", 2}}));
  EXPECT_NE(err.find(" ringd[0] hello there\n"), std::string::npos) << err;
  EXPECT_NE(err.find("step 1 | loss 2.5\n"), std::string::npos) << err;
  EXPECT_EQ(err.find("not due"), std::string::npos) << err;
  EXPECT_EQ(err.find("event"), std::string::npos) << err;  // events: the log file only
  EXPECT_EQ(std_out, "");
  const std::string log = test::slurp(rig.log_path());
  EXPECT_NE(log.find(" ringd[0] hello there\n"), std::string::npos) << log;
  EXPECT_NE(log.find("event " + sent.dump() + "\n"), std::string::npos) << log;
  EXPECT_NE(log.find("\nstep 2 weights 0123\n"), std::string::npos) << log;
  const nlohmann::json step1{{"step", 1}, {"loss", 2.5}}, step2{{"step", 2}, {"loss", 2.25}};
  EXPECT_EQ(test::slurp(rig.t.path + "/steps.jsonl"), step1.dump() + "\n" + step2.dump() + "\n");
}

TEST(RingdOutput, JsonModeWritesEventsAndStepsToStdoutOnly) {
  Rig rig;
  Options o;
  o.json = true;
  Output out(o);
  std::string why;
  ASSERT_TRUE(out.open(rig.t.path, &why)) << why;
  testing::internal::CaptureStderr();
  testing::internal::CaptureStdout();
  out.log("quiet on stderr");
  const nlohmann::json sent = out.event("completed", {{"step", 5}}, 1);
  out.step({{"step", 5}}, "text", true);
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string std_out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(err, "");
  const nlohmann::json step5{{"step", 5}};
  EXPECT_EQ(std_out, sent.dump() + "\n" + step5.dump() + "\n");
  EXPECT_NE(test::slurp(rig.log_path()).find("quiet on stderr"), std::string::npos);
}

TEST(RingdOutput, OtherNodesKeepNoStepsAndPrintNoEvents) {
  Rig rig;
  Options o;
  o.json = true;
  o.node_rank = 1;
  Output out(o);
  std::string why;
  ASSERT_TRUE(out.open(rig.t.path, &why)) << why;
  testing::internal::CaptureStdout();
  const nlohmann::json sent = out.event("stopping", {}, 1);
  out.step({{"step", 5}}, "text", true);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(sent["node"], 1);
  EXPECT_FALSE(fs::exists(rig.t.path + "/steps.jsonl"));
  EXPECT_NE(test::slurp(rig.log_path(1)).find("event " + sent.dump()), std::string::npos);
}

}  // namespace

// Worker text and peers' messages reach ringd's log: a newline or a terminal escape in them is
// written as \xHH, so no text forges a log line or drives the terminal that shows the file.
TEST(RingdOutput, ControlBytesAreEscapedInTheLogFileAndOnStderr) {
  Rig rig;
  Options o;
  Output out(o);
  std::string why;
  ASSERT_TRUE(out.open(rig.t.path, &why)) << why;
  testing::internal::CaptureStderr();
  out.log("worker said: ok\n2026-01-01 00:00:00 ringd[0] job completed\x1b[2J");
  out.log_file("raw\rline");
  const std::string err = testing::internal::GetCapturedStderr();
  const std::string log = test::slurp(rig.log_path());
  const std::string want =
      "worker said: ok\\x0a2026-01-01 00:00:00 ringd[0] job completed\\x1b[2J\n";
  EXPECT_NE(log.find(want), std::string::npos) << log;
  EXPECT_NE(err.find(want), std::string::npos) << err;
  EXPECT_NE(log.find("raw\\x0dline\n"), std::string::npos) << log;
  EXPECT_EQ(log.find("\x1b"), std::string::npos) << log;
}

