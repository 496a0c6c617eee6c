// ringd's command line (daemon/ringd/options.h): every flag in --help, --version, unknown flags
// named with the closest one, strict numbers (exit 2 naming the flag and the rule), the pairs
// that go together, SLURM_NODEID/SLURM_NNODES.
#include "daemon/ringd/options.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace {

using ring::ringd::ParsedOptions;

std::map<std::string, std::string> g_env;

const char* fake_env(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

struct Result {
  ParsedOptions parsed;
  std::string out, err;
};

Result parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  g_env = std::move(env);
  args.insert(args.begin(), "ringd");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  Result r;
  r.parsed = ring::ringd::parse_options(static_cast<int>(argv.size()), argv.data(), fake_env);
  r.out = testing::internal::GetCapturedStdout();
  r.err = testing::internal::GetCapturedStderr();
  return r;
}

TEST(RingdOptions, HelpListsEveryFlag) {
  Result r = parse({"--help"});
  ASSERT_TRUE(r.parsed.exit_code.has_value());
  EXPECT_EQ(*r.parsed.exit_code, 0);
  for (const char* f : {"--spec", "--job-dir", "--node-rank", "--nodes", "--rendezvous", "--coord",
                        "--job", "--steps", "--resume", "--resume-if-any", "--threads", "--json",
                        "--worker-bin",
                        "--transport", "--worker-threads", "--heartbeat-timeout",
                        "--startup-timeout", "--stop-grace", "--hash-weights", "--log-format", "--version"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f << " missing from --help:\n" << r.out;
}

TEST(RingdOptions, Version) {
  Result r = parse({"--version"});
  ASSERT_TRUE(r.parsed.exit_code.has_value());
  EXPECT_EQ(*r.parsed.exit_code, 0);
  EXPECT_EQ(r.out.rfind("ringd ", 0), 0u) << r.out;
}

TEST(RingdOptions, EveryFlagIsTaken) {
  Result r = parse({"--spec", "s.yaml", "--job-dir", "/j", "--node-rank", "1", "--nodes", "2",
                    "--rendezvous", "/r", "--coord", "ipc:///c", "--job", "12", "--steps", "7",
                    "--resume", "--threads", "3", "--json", "--worker-bin", "/w",
                    "--transport", "tcp", "--worker-threads", "2", "--heartbeat-timeout", "1.5",
                    "--startup-timeout", "9", "--stop-grace", "0.5", "--hash-weights",
                    "--log-format", "json"});
  ASSERT_FALSE(r.parsed.exit_code.has_value()) << r.err;
  const ring::ringd::Options& o = r.parsed.options;
  EXPECT_EQ(o.spec, "s.yaml");
  EXPECT_EQ(o.job_dir, "/j");
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.nodes, 2);
  EXPECT_EQ(o.rendezvous, "/r");
  EXPECT_EQ(o.coord, "ipc:///c");
  EXPECT_EQ(o.job, "12");
  ASSERT_TRUE(o.steps.has_value());
  EXPECT_EQ(*o.steps, 7);
  EXPECT_TRUE(o.resume);
  EXPECT_EQ(o.threads, 3);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(o.worker_bin, "/w");
  EXPECT_EQ(o.transport, "tcp");
  EXPECT_EQ(o.worker_threads, 2);
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout_s, 1.5);
  EXPECT_DOUBLE_EQ(o.startup_timeout_s, 9);
  EXPECT_DOUBLE_EQ(o.stop_grace_s, 0.5);
  EXPECT_TRUE(o.hash_weights);
  EXPECT_EQ(o.log_format, "json");
}

TEST(RingdOptions, Defaults) {
  Result r = parse({"--spec", "s.yaml"});
  ASSERT_FALSE(r.parsed.exit_code.has_value()) << r.err;
  const ring::ringd::Options& o = r.parsed.options;
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.nodes, 1);
  EXPECT_FALSE(o.steps.has_value());
  EXPECT_EQ(o.transport, "ucx");
  EXPECT_EQ(o.worker_threads, -1);
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout_s, 30);
}

TEST(RingdOptions, LaterFlagWins) {
  Result r = parse({"--spec", "a.yaml", "--steps", "3", "--spec", "b.yaml", "--steps", "4"});
  ASSERT_FALSE(r.parsed.exit_code.has_value()) << r.err;
  EXPECT_EQ(r.parsed.options.spec, "b.yaml");
  EXPECT_EQ(*r.parsed.options.steps, 4);
}

TEST(RingdOptions, UsageErrorsNameTheFlagAndExit2) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--spec", "s", "--step", "3"}, "unknown flag '--step'; did you mean '--steps'?"},
      {{"--spec", "s", "--json-out"}, "unknown flag '--json-out'"},
      {{"--spec", "s", "extra"}, "unexpected argument 'extra'"},
      {{"--spec", "s", "--steps", "0"}, "--steps: expected an integer in [1, 1099511627776], got '0'"},
      {{"--spec", "s", "--steps", "2.5"}, "--steps: expected an integer in [1, 1099511627776], got '2.5'"},
      {{"--spec", "s", "--steps", "1e3"}, "--steps: expected an integer in [1, 1099511627776], got '1e3'"},
      {{"--spec", "s", "--threads", "-1"}, "--threads: expected an integer in [0, 4096], got '-1'"},
      {{"--spec", "s", "--stop-grace", "nan"}, "--stop-grace: expected seconds in [0.001, 1e6], got 'nan'"},
      {{"--spec", "s", "--heartbeat-timeout", "0x10"},
       "--heartbeat-timeout: expected seconds in [0.001, 1e6], got '0x10'"},
      {{"--spec", "s", "--job", "x", "--coord", "ipc:///c"},
       "--job: expected an integer in [1, 9007199254740992], got 'x'"},
      {{"--spec", "s", "--log-format", "yaml"}, "--log-format: yaml not in {text,json}"},
      {{"--spec"}, "--spec"},
      {{}, "--spec FILE is required"},
      {{"--spec", "s", "--node-rank", "1"}, "--node-rank and --nodes go together"},
      {{"--spec", "s", "--node-rank", "2", "--nodes", "2"}, "--node-rank 2 is not below --nodes 2"},
      {{"--spec", "s", "--coord", "ipc:///c"}, "--coord and --job go together"},
      {{"--spec", "s", "--job", "3", "--coord", "tcp://login1:0"}, "--coord: port '0' is not in 1..65535"},
      {{"--spec", "s", "--job", "3", "--coord", "ipc://rel.sock"}, "--coord: ipc:// needs an absolute path"},
  };
  for (const auto& [args, want] : cases) {
    Result r = parse(args);
    std::string cmd;
    for (const std::string& a : args) cmd += " " + a;
    ASSERT_TRUE(r.parsed.exit_code.has_value()) << cmd;
    EXPECT_EQ(*r.parsed.exit_code, 2) << cmd;
    EXPECT_EQ(r.err.rfind("ringd: ", 0), 0u) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << cmd << ": " << r.err;
  }
}

TEST(RingdOptions, SlurmNodeFromTheEnvironment) {
  Result r = parse({"--spec", "s"}, {{"SLURM_NODEID", "2"}, {"SLURM_NNODES", "4"}});
  ASSERT_FALSE(r.parsed.exit_code.has_value()) << r.err;
  EXPECT_EQ(r.parsed.options.node_rank, 2);
  EXPECT_EQ(r.parsed.options.nodes, 4);
  // The flags win over the environment.
  r = parse({"--spec", "s", "--node-rank", "0", "--nodes", "1"},
            {{"SLURM_NODEID", "2"}, {"SLURM_NNODES", "4"}});
  EXPECT_EQ(r.parsed.options.nodes, 1);
  r = parse({"--spec", "s"}, {{"SLURM_NODEID", "x"}, {"SLURM_NNODES", "4"}});
  ASSERT_TRUE(r.parsed.exit_code.has_value());
  EXPECT_EQ(*r.parsed.exit_code, 2);
  EXPECT_NE(r.err.find("SLURM_NODEID: expected an integer in [0, 65535], got 'x'"),
            std::string::npos)
      << r.err;
}

}  // namespace
