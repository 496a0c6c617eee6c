#include "common/cli/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

using ring::flags::ArgWalker;
using ring::flags::FlagError;

namespace {

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const FlagError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no FlagError";
  return "";
}

// argv as main() gets it (argv[0] is the program).
struct Argv {
  std::vector<std::string> args;
  std::vector<char*> ptrs;
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (auto& s : args) ptrs.push_back(s.data());
    ptrs.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(args.size()); }
  char** argv() { return ptrs.data(); }
};

}  // namespace

TEST(Flags, ParseIntChecksTheWholeValueAndTheRange) {
  EXPECT_EQ(ring::flags::parse_int("--steps", "12", 1, 100), 12);
  EXPECT_EQ(ring::flags::parse_int("--threads", "0", 0, 4096), 0);
  EXPECT_EQ(ring::flags::parse_int("--stagger-us", "-5", -10, 10), -5);
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--steps", "x", 1, 1099511627776); }),
            "--steps: expected an integer in [1, 1099511627776], got 'x'");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--steps", "0", 1, 10); }),
            "--steps: expected an integer in [1, 10], got '0'");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--rank", "3k", 0, 65535); }),
            "--rank: expected an integer in [0, 65535], got '3k'");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("--nodes", "", 1, 65536); }),
            "--nodes: expected an integer in [1, 65536], got ''");
  EXPECT_EQ(error_of([] { ring::flags::parse_int("SLURM_NNODES", "99999999999999999999", 1, 65536); }),
            "SLURM_NNODES: expected an integer in [1, 65536], got '99999999999999999999'");
}

TEST(Flags, ParseSecondsTakesDecimalsFromAMillisecondToAMillion) {
  EXPECT_DOUBLE_EQ(ring::flags::parse_seconds("--stop-grace", "0.25"), 0.25);
  EXPECT_DOUBLE_EQ(ring::flags::parse_seconds("--stop-grace", "1e6"), 1e6);
  EXPECT_DOUBLE_EQ(ring::flags::parse_seconds("--stop-grace", "0.001"), 0.001);
  // NaN and infinities in every spelling strtod takes, hex floats, blanks, and positive values
  // so small that every peer would count as late at once.
  for (const char* bad : {"0", "-1", "nan", "NaN", "-nan", "inf", "-inf", "infinity", "2e6", "5s",
                          "", "0x10", "0x1p-3", " 5", "5 ", "1e-300", "4e-324", "0.0009"}) {
    EXPECT_EQ(
        error_of([&] { ring::flags::parse_seconds("--heartbeat-timeout", bad); }),
        std::string("--heartbeat-timeout: expected seconds in [0.001, 1e6], got '") + bad + "'");
  }
}

TEST(Flags, ParseIntTakesDecimalTextOnly) {
  EXPECT_EQ(ring::flags::parse_int("--steps", "+12", 1, 100), 12);
  for (const char* bad : {" 12", "12 ", "0x10", "1e3", "12.0", "nan", "inf"})
    EXPECT_EQ(error_of([&] { ring::flags::parse_int("--steps", bad, 1, 100); }),
              std::string("--steps: expected an integer in [1, 100], got '") + bad + "'");
}

// "--job-dir --resume": the flag's value left out, the next flag is not taken for it.
TEST(Flags, AFlagIsNotTakenForTheValueOfAnother) {
  std::string dir;
  bool resume = false;
  double grace = 0;
  ring::flags::FlagSet fs("usage\n");
  fs.text("--job-dir", &dir).toggle("--resume", &resume).seconds("--stop-grace", &grace);
  Argv a({"prog", "--job-dir", "--resume"});
  EXPECT_EQ(error_of([&] { fs.parse(a.argc(), a.argv()); }),
            "--job-dir needs a value (got the flag --resume)");
  EXPECT_EQ(dir, "");
  // A value that merely starts with '-' is still a value.
  ring::flags::FlagSet fs2("usage\n");
  fs2.text("--job-dir", &dir).toggle("--resume", &resume);
  Argv b({"prog", "--job-dir", "-odd-name", "--resume"});
  fs2.parse(b.argc(), b.argv());
  EXPECT_EQ(dir, "-odd-name");
  EXPECT_TRUE(resume);
}

TEST(Flags, WalkerReadsFlagsAndValuesInOrder) {
  Argv a({"prog", "--spec", "s.yaml", "--resume", "--steps", "7", "--stop-grace", "1.5"});
  ArgWalker w(a.argc(), a.argv());
  ASSERT_TRUE(w.next());
  EXPECT_EQ(w.flag(), "--spec");
  EXPECT_STREQ(w.value(), "s.yaml");
  ASSERT_TRUE(w.next());
  EXPECT_EQ(w.flag(), "--resume");
  ASSERT_TRUE(w.next());
  EXPECT_EQ(w.int_value(1, 10), 7);
  ASSERT_TRUE(w.next());
  EXPECT_DOUBLE_EQ(w.seconds_value(), 1.5);
  EXPECT_FALSE(w.next());
  EXPECT_FALSE(w.next());

  Argv none({"prog"});
  EXPECT_FALSE(ArgWalker(none.argc(), none.argv()).next());
}

TEST(Flags, WalkerErrorsNameTheFlag) {
  Argv a({"prog", "--steps", "0", "--spec"});
  ArgWalker w(a.argc(), a.argv());
  ASSERT_TRUE(w.next());
  EXPECT_EQ(error_of([&] { w.int_value(1, 1099511627776); }),
            "--steps: expected an integer in [1, 1099511627776], got '0'");
  ASSERT_TRUE(w.next());
  EXPECT_EQ(w.flag(), "--spec");
  EXPECT_EQ(error_of([&] { w.value(); }), "--spec needs a value");
  EXPECT_FALSE(w.next());
}

TEST(Flags, UsageExitPrintsProgramMessageAndUsage) {
  EXPECT_EXIT(ring::flags::usage_exit("ringd", "--spec FILE is required", "usage: ringd ...\n"),
              testing::ExitedWithCode(2), "^ringd: --spec FILE is required\nusage: ringd \\.\\.\\.\n$");
}

TEST(Flags, FlagSetAppliesTheTableInOrder) {
  std::string spec;
  std::optional<std::string> backend;
  bool resume = false, json = false;
  int threads = -1;
  std::optional<int64_t> steps;
  double grace = 5;
  std::string labels;
  ring::flags::FlagSet fs("usage\n");
  fs.text("--spec", &spec)
      .text("--backend", &backend)
      .toggle("--resume", &resume)
      .toggle("--json", &json)
      .integer("--threads", &threads, 0, 4096)
      .integer("--steps", &steps, 1, int64_t{1} << 40)
      .seconds("--stop-grace", &grace)
      .custom("--labels", [&](const std::string& flag, const char* v) {
        if (std::string(v) != "all") throw FlagError(flag + ": expected all, got '" + v + "'");
        labels = v;
      });
  Argv a({"prog", "--spec", "s.yaml", "--resume", "--threads", "3", "--steps", "9", "--threads",
          "4", "--stop-grace", "0.5", "--labels", "all", "--backend", "cpu"});
  fs.parse(a.argc(), a.argv());
  EXPECT_EQ(spec, "s.yaml");
  EXPECT_EQ(backend, "cpu");
  EXPECT_TRUE(resume);
  EXPECT_FALSE(json);
  EXPECT_EQ(threads, 4);  // the later one wins
  EXPECT_EQ(steps, 9);
  EXPECT_DOUBLE_EQ(grace, 0.5);
  EXPECT_EQ(labels, "all");
  EXPECT_TRUE(fs.seen("--threads"));
  EXPECT_FALSE(fs.seen("--json"));
}

TEST(Flags, FlagSetErrorsNameTheFlagAndTheRule) {
  auto parse = [](std::vector<std::string> args, const std::string& note = "") {
    int threads = 0;
    std::string spec;
    ring::flags::FlagSet fs("usage\n");
    fs.text("--spec", &spec).integer("--threads", &threads, 0, 4096).custom(
        "--labels", [](const std::string& flag, const char* v) {
          throw FlagError(flag + ": expected all or answer, got '" + v + "'");
        });
    if (!note.empty()) fs.unknown_note(note);
    args.insert(args.begin(), "prog");
    Argv a(args);
    return error_of([&] { fs.parse(a.argc(), a.argv()); });
  };
  EXPECT_EQ(parse({"--threads", "-1"}), "--threads: expected an integer in [0, 4096], got '-1'");
  EXPECT_EQ(parse({"--spec", "s", "--threads"}), "--threads needs a value");
  EXPECT_EQ(parse({"--bogus"}), "unknown argument '--bogus'");
  EXPECT_EQ(parse({"--thread", "2"}), "unknown argument '--thread'; did you mean '--threads'?");
  EXPECT_EQ(parse({"--specs", "x"}, " (multi-rank mode)"),
            "unknown argument '--specs'; did you mean '--spec'? (multi-rank mode)");
  EXPECT_EQ(parse({"extra"}, " (multi-rank mode)"), "unknown argument 'extra' (multi-rank mode)");
  EXPECT_EQ(parse({"--labels", "x"}), "--labels: expected all or answer, got 'x'");
  // The first bad argument is the one reported.
  EXPECT_EQ(parse({"--bogus", "--threads", "x"}), "unknown argument '--bogus'");
}

TEST(Flags, FlagSetHelpPrintsTheUsageAndExitsZero) {
  ring::flags::FlagSet fs("usage: prog --spec FILE\n");
  Argv a({"prog", "-h", "--bogus"});
  EXPECT_EXIT(fs.parse(a.argc(), a.argv()), testing::ExitedWithCode(0), "");
}
