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


// ringctl plan --search (sim/search.h; the ranking itself: sim_search_test).
namespace search {

const char* kSmallSpec = R"(job:
  name: search-small
model:
  layers: 8
  d_model: 4096
  heads: 32
  kv_heads: 8
  mlp: swiglu
  mlp_hidden: 11008
  vocab: 32000
  dtype: bf16
  recompute: true
data:
  source: text
  paths: [/tmp]
  seq_len: 262144
parallel:
  context_ranks: 8
  causal_balance: zigzag
optimizer:
  lr: 1.0e-5
  offload: cpu
train:
  steps: 10
resources:
  nodes: 2
  workers_per_node: 4
  backend: cuda
  gpus_per_node: 4
  gpu_type: H100-80G
  host_memory_gb: 200
)";

std::string write_spec(const TempDir& t, const std::string& name, std::string text) {
  const std::string path = t.path + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(RingctlPlanSearch, WriteValidatesAndReproducesTheBest) {
  TempDir t;
  const std::string in = write_spec(t, "small.yaml", kSmallSpec), out = t.path + "/best.yaml";
  auto r = run(kRingctl + " plan --search " + in + " --json --write " + out + " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_FALSE(j["best"].empty());
  const auto& best = j["best"][0];
  EXPECT_GT(j["no_fit"].get<int>(), 0);
  // The written spec validates, fits, says where it came from, and simulates to the same step.
  std::ifstream f(out);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "# Layout picked by `ringctl plan --search " + in)) << text;
  EXPECT_EQ(run(kRingctl + " validate -q " + out).exit_code, 0);
  EXPECT_EQ(run(kRingctl + " plan --check " + out + " >/dev/null 2>&1").exit_code, 0);
  auto s = run(kRingctl + " simulate " + out + " --json 2>/dev/null");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  const auto sj = nlohmann::json::parse(s.output);
  EXPECT_NEAR(sj["step_s"].get<double>(), best["step_s"].get<double>(),
              1e-9 * best["step_s"].get<double>());
  EXPECT_EQ(sj["head_ranks"], best["head_ranks"]);
  // Text: the best five, with every column.
  auto x = run(kRingctl + " plan --search " + in + " 2>&1");
  ASSERT_EQ(x.exit_code, 0) << x.output;
  for (const char* c : {"tokens/s", "MFU", "GPU mem", "host/node", "exposed comm", "best: "})
    EXPECT_TRUE(contains(x.output, c)) << c << "\n" << x.output;
}

TEST(RingctlPlanSearch, BadInputIsAClearError) {
  TempDir t;
  std::string no_nodes = kSmallSpec;
  no_nodes.replace(no_nodes.find("  nodes: 2\n"), 11, "");
  no_nodes.replace(no_nodes.find("context_ranks: 8"), 16, "context_ranks: 4");
  const std::string a = write_spec(t, "no-nodes.yaml", no_nodes);
  auto r = run(kRingctl + " plan --search " + a + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--nodes: " + a + " does not set resources.nodes")) << r.output;
  // Nothing fits: 200 layers on one node.
  const std::string in = write_spec(t, "small.yaml", kSmallSpec);
  r = run(kRingctl + " plan --search " + in + " --nodes 1 --set model.layers=200 2>&1");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "no layout fits memory on 1 node(s) x 4 workers")) << r.output;
  EXPECT_TRUE(contains(r.output, "the closest: U=")) << r.output;
  // Search flags without --search; --check with it.
  r = run(kRingctl + " plan " + in + " --nodes 4 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--nodes is a flag of --search")) << r.output;
  r = run(kRingctl + " plan --search --check " + in + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run(kRingctl + " plan --search " + in + " --gpu B200 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "unknown GPU type 'B200'")) << r.output;
}

}  // namespace search

}  // namespace
