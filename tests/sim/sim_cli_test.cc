// ringctl simulate as a user runs it: output on every built-in topology, --json, --trace, and
// errors that name the flag (bad topology, bad straggler or slow-link syntax, missing files).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/common/run.h"

namespace {

using ring::test::run;

const std::string kRingctl = std::string(RING_BINARY_DIR) + "/cli/ringctl";
const std::string kTiny = std::string(RING_SOURCE_DIR) + "/configs/examples/tiny.yaml";
const std::string k70b = std::string(RING_SOURCE_DIR) + "/configs/examples/70b-1m-64x8-h100.yaml";

bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/ring-sim-cli-XXXXXX";
    EXPECT_NE(mkdtemp(t.data()), nullptr);
    path = t;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(RingctlSimulate, EveryTopologyJson) {
  for (const char* t : {"fat-tree", "dragonfly+", "torus3d"}) {
    auto r = run(kRingctl + " simulate " + k70b + " --topology " + t + " --json 2>/dev/null");
    ASSERT_EQ(r.exit_code, 0) << t << ": " << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_GT(j["step_s"].get<double>(), 0) << t;
    EXPECT_EQ(j["ranks"], 512) << t;
    EXPECT_GT(j["effective_ring_bw_bytes_per_s"].get<double>(), 0) << t;
    EXPECT_FALSE(j["critical_path"].empty()) << t;
  }
}

TEST(RingctlSimulate, TextAndTrace) {
  TempDir t;
  auto r = run(kRingctl + " simulate " + kTiny + " --gpu H100 --trace " + t.path + "/trace.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "critical path")) << r.output;
  EXPECT_TRUE(contains(r.output, "effective ring bandwidth")) << r.output;
  EXPECT_TRUE(std::filesystem::file_size(t.path + "/trace.json") > 1000);
}

TEST(RingctlSimulate, ErrorsNameTheFlag) {
  struct Case {
    std::string args, flag;
    int code;
  } cases[] = {
      {"--topology fat-tee", "--topology", 2},
      {"--topology /nonexistent/topology.conf", "--topology", 2},
      {"--straggler 3", "--straggler", 2},
      {"--straggler x:2", "--straggler", 2},
      {"--straggler 3:0.5", "--straggler", 2},
      {"--slow-link 1-2", "--slow-link", 2},
      {"--gpu V100", "--gpu", 2},
      {"--gpu cpu", "--calibration", 2},
      {"--gpu cpu --calibration /nonexistent/cal.json", "--calibration", 2},
      {"--gpu H100 --straggler 99:2", "--straggler", 2},
      {"--gpu H100 --slow-link 7:2", "--slow-link", 2},
      {"--ring-order random", "--ring-order", 2},
  };
  for (const auto& c : cases) {
    auto r = run(kRingctl + " simulate " + kTiny + " " + c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << ": " << r.output;
    EXPECT_TRUE(contains(r.output, c.flag)) << c.args << ": " << r.output;
  }
  // 3 nodes x 8 workers is not a multiple of the 64-rank ring.
  auto r = run(kRingctl + " simulate " + k70b + " --nodes 3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--nodes")) << r.output;
  r = run(kRingctl + " simulate /nonexistent/spec.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "/nonexistent/spec.yaml")) << r.output;
}

TEST(RingctlSimulate, CalibrationFileErrorsNameTheKey) {
  TempDir t;
  const std::string cal = t.path + "/cal.json";
  {
    std::ofstream(cal) << R"({"gemm_flops": 1e11, "attention_fwd_flops": 5e10})";
  }
  auto r = run(kRingctl + " simulate " + kTiny + " --gpu cpu --calibration " + cal);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "attention_bwd_flops")) << r.output;
  {
    std::ofstream(cal) << R"({"gemm_flops": 1e11, "attention_fwd_flops": 5e10,
      "attention_bwd_flops": 4e10, "intra_node_bytes_per_s": 5e9, "adamw_params_per_s": 1e9})";
  }
  r = run(kRingctl + " simulate " + kTiny + " --gpu cpu --calibration " + cal);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "calibration file")) << r.output;
}

}  // namespace
