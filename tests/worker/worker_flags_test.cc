// ring-worker's command line (worker/flags.h): --help lists every mode's flags, --version, unknown
// flags with a suggestion, strict numbers, mode rules, --log-format json, and the flags ringd and
// the launcher pass still parse.
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/version.h"
#include "tests/common/run.h"

namespace {

const std::string kWorker = RING_WORKER;

ring::test::RunResult worker(const std::string& args) {
  return ring::test::run(kWorker + " " + args);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(WorkerFlags, VersionIsTheProjectVersion) {
  auto r = worker("--version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, std::string("ring-worker ") + ring::kVersion + "\n");
}

TEST(WorkerFlags, HelpListsTheFlagsOfEveryMode) {
  auto r = worker("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag : {"--spec",          "--steps",
                           "--threads",       "--backend",
                           "--log-json",      "--max-corpus-mb",
                           "--log-format",    "--log-level",
                           "--single-rank",   "--passkey-labels",
                           "--eval-every",    "--eval-samples",
                           "--seqs-per-step", "--passkey-curriculum",
                           "--launch-local",  "--rank",
                           "--world",         "--rendezvous",
                           "--transport",     "--stagger-us",
                           "--timeout-ms",    "--ringd",
                           "--local-rank",    "--version"})
    EXPECT_TRUE(has(r.output, std::string("  ") + flag + " ")) << flag << " missing:\n" << r.output;
  EXPECT_TRUE(has(r.output, "Single process")) << r.output;
  EXPECT_TRUE(has(r.output, "Ring (--launch-local")) << r.output;
}

// Each (arguments after --spec x.yaml, message): exit 2 with "ring-worker: MESSAGE".
void expect_usage_errors(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [args, message] : cases) {
    auto r = worker("--spec x.yaml " + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_TRUE(has(r.output, "ring-worker: " + message)) << args << ":\n" << r.output;
  }
}

TEST(WorkerFlags, UnknownFlagsAreNamedWithTheClosestOne) {
  expect_usage_errors({
      {"--thread 2", "unknown argument '--thread'; did you mean '--threads'?"},
      {"--rank 0 --world 2 --rendezvous /tmp/x --tranport ucx",
       "unknown argument '--tranport'; did you mean '--transport'?"},
      {"surplus", "unknown argument 'surplus'"},
  });
}

TEST(WorkerFlags, NumbersAndChoicesAreStrict) {
  expect_usage_errors({
      {"--steps 1e3", "--steps: expected an integer in [1, 1099511627776], got '1e3'"},
      {"--steps 0", "--steps: expected an integer in [1, 1099511627776], got '0'"},
      {"--threads -1", "--threads: expected an integer in [0, 4096], got '-1'"},
      {"--max-corpus-mb 12abc",
       "--max-corpus-mb: expected an integer in [1, 1048576], got '12abc'"},
      {"--passkey-labels some", "--passkey-labels: expected all or answer, got 'some'"},
      {"--log-format xml", "--log-format: expected text or json, got 'xml'"},
      {"--log-level loud",
       "--log-level: expected trace, debug, info, warn, error, critical or off, got 'loud'"},
      {"--rank 0 --world 2 --rendezvous /tmp/x --timeout-ms 5",
       "--timeout-ms: expected an integer in [100, 3600000], got '5'"},
  });
}

TEST(WorkerFlags, FlagsOfTheOtherModeAndMissingOnesAreNamed) {
  expect_usage_errors({
      {"--rank 0 --world 2 --rendezvous /tmp/x --single-rank",
       "--single-rank is not a flag of the ring mode"},
      {"--transport ucx", "--transport is a flag of the ring mode"},
      {"--rank 2 --world 2 --rendezvous /tmp/x", "--rank 2 is not below --world 2"},
      {"--launch-local --rank 0", "--launch-local chooses ranks and the rendezvous itself"},
      // Generation (--generate) takes the rank flags and nothing of training's.
      {"--generate --spec x.yaml --single-rank", "--single-rank is not a flag of --generate"},
      {"--generate --spec x.yaml --launch-local", "--launch-local is not a flag of --generate"},
      {"--generate --spec x.yaml --rank 0", "--generate --rank R needs --world P and --rendezvous"},
      {"--generate --spec x.yaml --world 2", "--world/--rendezvous need --rank R"},
      {"--generate --spec x.yaml --rank 2 --world 2 --rendezvous /tmp/x",
       "--rank 2 is not below --world 2"},
      {"--spec x.yaml --output o.txt", "--output is a flag of --generate"},
  });
  // A training spec is not a generate job.
  auto t = worker("--generate --spec " + ring::test::source_path("configs/examples/tiny.yaml"));
  EXPECT_EQ(t.exit_code, 2) << t.output;
  EXPECT_TRUE(has(t.output, "is a training spec (job.kind train)")) << t.output;
  auto r = worker("--steps 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.output, "ring-worker: --spec FILE is required")) << r.output;
}

// What ringd and the launcher pass parses (the spec is then what fails), the last of a repeated
// flag wins, and --log-format json turns every diagnostic into a JSON line.
TEST(WorkerFlags, RingdsCommandLineParsesAndJsonLogsAreLines) {
  const std::string missing = "/nonexistent-ring-worker-spec.yaml";
  auto r = worker("--spec " + missing +
                  " --rank 1 --world 2 --rendezvous /tmp/x/workers --ringd /tmp/x/ringd.sock"
                  " --local-rank 1 --transport ucx --threads 1 --world 4 --log-format json");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  std::istringstream lines(r.output);
  int n = 0;
  bool invalid = false;
  for (std::string l; std::getline(lines, l); ++n) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not a JSON line: " << l;
    EXPECT_EQ(j.value("program", ""), "ring-worker");
    EXPECT_TRUE(j.contains("ts") && j.contains("pid") && j.contains("level")) << l;
    invalid = invalid || has(j.value("msg", ""), missing + ": invalid spec");
  }
  EXPECT_GT(n, 0);
  EXPECT_TRUE(invalid) << r.output;
}

}  // namespace
