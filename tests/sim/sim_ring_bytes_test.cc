// The simulator's ring traffic against a real ring: ring-worker --launch-local runs one step of a
// two-rank variant of configs/examples/tiny.yaml (packed documents, zigzag), and the bytes its
// rank 0 sent (K/V blocks and dK/dV accumulators, from RingStats) must equal what
// `ringctl simulate` counts for a rank, to the byte.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/common/run.h"

namespace {

using ring::test::run;

const std::string kBin = RING_BINARY_DIR;
const std::string kSrc = RING_SOURCE_DIR;

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = "/tmp/ring-sim-bytes-XXXXXX";
    EXPECT_NE(mkdtemp(t.data()), nullptr);
    path = t;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(SimRingBytes, EqualTheRealRingsBytes) {
  TempDir t;
  std::string text = ring::test::read_file(kSrc + "/configs/examples/tiny.yaml");
  auto sub = [&](const std::string& from, const std::string& to) {
    text = std::regex_replace(text, std::regex(from), to);
  };
  sub("seq_len: 16384", "seq_len: 4096");
  sub("max_doc_len: 4096", "max_doc_len: 1500");
  sub("context_ranks: 4", "context_ranks: 2");
  sub("workers_per_node: 4", "workers_per_node: 2");
  sub("dir: checkpoints.*", "dir: " + t.path + "/ck");
  const std::string spec = t.path + "/spec.yaml";
  std::ofstream(spec) << text;
  const std::string log = t.path + "/steps.json";
  auto r = run(kBin + "/worker/ring-worker --spec " + spec + " --launch-local --steps 1 --threads 1 --log-json " + log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(log);
  std::string line;
  ASSERT_TRUE(std::getline(in, line)) << r.output;
  const auto step = nlohmann::json::parse(line);
  const double real = step["bytes_sent_rank0"].get<double>();
  ASSERT_GT(real, 0);

  auto s = run(kBin + "/cli/ringctl simulate " + spec + " --gpu A100 --expand full --json 2>/dev/null");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  const auto j = nlohmann::json::parse(s.output);
  EXPECT_EQ(j["ring_bytes_per_rank"].get<double>(), real);
  // And the hop counts: forward P-1 and backward P-1 K/V hops, P accumulators, per layer.
  EXPECT_EQ(j["hops"]["forward"]["count"], 2 * 4 * 1);
  EXPECT_EQ(j["hops"]["dkv"]["count"], 2 * 4 * 2);
}

}  // namespace
