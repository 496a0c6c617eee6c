// ring::log: the JSON-lines and text formatters (every line parses, the fixed keys and the
// event's fields are there, control bytes cannot forge a line) and setup()/get().
#include "common/log/log.h"

#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <nlohmann/json.hpp>

namespace ring::log {
namespace {

// A logger named `name` writing to `out` with the formatter of `format`.
std::shared_ptr<spdlog::logger> logger_to(std::ostringstream& out, Format format,
                                          const std::string& name = "worker") {
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  sink->set_formatter(make_formatter("ring-test", format));
  auto lg = std::make_shared<spdlog::logger>(name, sink);
  lg->set_level(spdlog::level::trace);
  return lg;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(LogJson, EveryLineIsAnObjectWithTheFixedKeys) {
  std::ostringstream out;
  auto lg = logger_to(out, Format::kJsonLines);
  lg->info("launched {} ranks", 2);
  lg->warn("slow step");
  const auto ls = lines(out.str());
  ASSERT_EQ(ls.size(), 2u) << out.str();
  const auto j = nlohmann::json::parse(ls[0]);
  EXPECT_EQ(j.at("msg"), "launched 2 ranks");
  EXPECT_EQ(j.at("level"), "info");
  EXPECT_EQ(j.at("program"), "ring-test");
  EXPECT_EQ(j.at("logger"), "worker");
  EXPECT_EQ(j.at("pid"), static_cast<long>(getpid()));
  // ISO 8601 UTC with milliseconds.
  const std::string ts = j.at("ts");
  ASSERT_EQ(ts.size(), 24u) << ts;
  EXPECT_EQ(ts[10], 'T');
  EXPECT_EQ(ts[19], '.');
  EXPECT_EQ(ts.back(), 'Z');
  // The keys come in a fixed order, ts first.
  EXPECT_EQ(ls[0].rfind("{\"ts\":", 0), 0u) << ls[0];
  EXPECT_EQ(nlohmann::json::parse(ls[1]).at("level"), "warning");
}

TEST(LogJson, EventFieldsBecomeMembersAndNeverReplaceTheFixedOnes) {
  std::ostringstream out;
  auto lg = logger_to(out, Format::kJsonLines);
  event(*lg, spdlog::level::err, "rank failed",
        {{"rank", 2}, {"signal", 9}, {"msg", "shadow"}, {"cause", "killed"}});
  lg->info("plain");  // the fields were for that one line only
  const auto ls = lines(out.str());
  ASSERT_EQ(ls.size(), 2u) << out.str();
  const auto j = nlohmann::json::parse(ls[0]);
  EXPECT_EQ(j.at("msg"), "rank failed");
  EXPECT_EQ(j.at("msg_"), "shadow");
  EXPECT_EQ(j.at("rank"), 2);
  EXPECT_EQ(j.at("signal"), 9);
  EXPECT_EQ(j.at("cause"), "killed");
  EXPECT_EQ(j.at("level"), "error");
  EXPECT_FALSE(nlohmann::json::parse(ls[1]).contains("rank"));
}

TEST(LogJson, ControlBytesAndBadUtf8StayInsideTheLine) {
  std::ostringstream out;
  auto lg = logger_to(out, Format::kJsonLines);
  const std::string nasty = "line1\n{\"level\":\"forged\"}\r\x1b[31m\x7f \xff end";
  lg->error("{}", nasty);
  event(*lg, spdlog::level::info, "field", {{"path", "a\nb"}});
  const auto ls = lines(out.str());
  ASSERT_EQ(ls.size(), 2u) << out.str();
  for (const std::string& l : ls)
    for (unsigned char c : l) EXPECT_GE(c, 0x20) << "raw control byte in " << l;
  const auto j = nlohmann::json::parse(ls[0]);
  const std::string msg = j.at("msg");
  EXPECT_EQ(msg.rfind("line1\n{\"level\":\"forged\"}\r\x1b[31m", 0), 0u) << msg;
  EXPECT_NE(msg.find("\xef\xbf\xbd"), std::string::npos) << "invalid UTF-8 -> U+FFFD";
  EXPECT_EQ(nlohmann::json::parse(ls[1]).at("path"), "a\nb");
}

TEST(LogText, SpdlogPatternWithFieldsAndEscapedControls) {
  std::ostringstream out;
  auto lg = logger_to(out, Format::kText, "coord");
  event(*lg, spdlog::level::info, "worker restarted", {{"rank", 1}, {"why", "exit 3"}});
  lg->warn("two\nlines\x1b");
  const auto ls = lines(out.str());
  ASSERT_EQ(ls.size(), 2u) << out.str();
  EXPECT_NE(ls[0].find("] [coord] [info] worker restarted rank=1 why=exit 3"), std::string::npos)
      << ls[0];
  EXPECT_EQ(ls[0].front(), '[');
  EXPECT_NE(ls[1].find("[warning] two\\x0alines\\x1b"), std::string::npos) << ls[1];
}

TEST(Log, ParsesFormatsAndLevels) {
  EXPECT_EQ(parse_format("text"), Format::kText);
  EXPECT_EQ(parse_format("json"), Format::kJsonLines);
  EXPECT_FALSE(parse_format("JSON"));
  EXPECT_FALSE(parse_format(""));
  EXPECT_EQ(parse_level("warn"), spdlog::level::warn);
  EXPECT_EQ(parse_level("off"), spdlog::level::off);
  EXPECT_EQ(parse_level("trace"), spdlog::level::trace);
  EXPECT_FALSE(parse_level("warning"));
}

// setup() switches the shared stderr sink: loggers made by get() before and after it follow,
// and the level filters.
TEST(Log, SetupAppliesToEveryLoggerOfGet) {
  auto before = get("log-test-before");
  testing::internal::CaptureStderr();
  setup("ring-test", Format::kJsonLines, spdlog::level::info);
  auto after = get("log-test-after");
  EXPECT_EQ(get("log-test-after"), after) << "one logger per name";
  before->info("from before");
  after->debug("filtered out");
  after->info("from after");
  spdlog::info("default logger");
  const auto ls = lines(testing::internal::GetCapturedStderr());
  setup("ring-test", Format::kText, spdlog::level::info);
  ASSERT_EQ(ls.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(ls[0]).at("logger"), "log-test-before");
  EXPECT_EQ(nlohmann::json::parse(ls[1]).at("msg"), "from after");
  EXPECT_EQ(nlohmann::json::parse(ls[2]).at("logger"), "ring-test");
}

}  // namespace
}  // namespace ring::log

// Issue 31.7: external text into JSON. valid_utf8 keeps valid text byte for byte and turns each
// invalid byte (stray continuation, truncated sequence, overlong form, surrogate, > U+10FFFF)
// into U+FFFD; dump_json never throws where json::dump() does (type_error.316).
TEST(Log, ExternalTextIsMadeValidUtf8) {
  const std::string ok = "plain ascii, caf\xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80";
  EXPECT_EQ(ring::log::valid_utf8(ok), ok);
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(ring::log::valid_utf8("a\xff" "b"), "a" + fffd + "b");
  EXPECT_EQ(ring::log::valid_utf8("\xc3"), fffd);                       // truncated
  EXPECT_EQ(ring::log::valid_utf8("\xc0\xaf"), fffd + fffd);            // overlong '/'
  EXPECT_EQ(ring::log::valid_utf8("\xed\xa0\x80"), fffd + fffd + fffd); // a surrogate
  EXPECT_EQ(ring::log::valid_utf8("\xf4\x90\x80\x80"), fffd + fffd + fffd + fffd);
  nlohmann::json j = {{"line", std::string("x\xff\xfey")}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  const std::string s = ring::log::dump_json(j);
  EXPECT_EQ(nlohmann::json::parse(s)["line"], "x" + fffd + fffd + "y");
  EXPECT_EQ(nlohmann::json::parse(ring::log::dump_json({{"l", ring::log::valid_utf8("x\xff")}}))["l"],
            "x" + fffd);
}
