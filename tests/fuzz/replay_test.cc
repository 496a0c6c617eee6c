// Replays every fuzz corpus (tests/fuzz/corpus/<target>/: seeds and every past finding) and every
// spec we have (configs/) through the fuzz targets in the normal build, so a fixed finding stays
// fixed. A target that breaks a property aborts (targets.h), which fails this test with the
// target's message; the file being replayed is printed first.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/common/run.h"
#include "tests/fuzz/targets.h"

namespace {

namespace fs = std::filesystem;
using Target = void (*)(const uint8_t*, size_t);

int replay(const std::vector<std::string>& dirs, Target target) {
  std::vector<fs::path> files;
  for (const auto& dir : dirs)
    for (const auto& e : fs::recursive_directory_iterator(ring::test::source_path(dir)))
      if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::fprintf(stderr, "replay %s\n", f.c_str());
    const std::string bytes = ring::test::read_file(f.string());
    target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  return static_cast<int>(files.size());
}

TEST(FuzzReplay, SpecCorpusAndConfigs) {
  EXPECT_GT(replay({"configs", "tests/fuzz/corpus/spec"}, ring::fuzz::spec_input), 40);
}

TEST(FuzzReplay, ProtocolCorpus) {
  EXPECT_GE(replay({"tests/fuzz/corpus/protocol"}, ring::fuzz::protocol_input), 21);
}

TEST(FuzzReplay, WorkerControlCorpus) {
  EXPECT_GE(replay({"tests/fuzz/corpus/worker_control"}, ring::fuzz::worker_control_input), 9);
}

TEST(FuzzReplay, CheckpointCorpus) {
  EXPECT_GE(replay({"tests/fuzz/corpus/checkpoint"}, ring::fuzz::checkpoint_input), 3);
}

TEST(FuzzReplay, ShmCorpus) {
  EXPECT_GE(replay({"tests/fuzz/corpus/shm"}, ring::fuzz::shm_input), 2);
}

TEST(FuzzReplay, SafetensorsCorpus) {
  EXPECT_GE(replay({"tests/fuzz/corpus/safetensors"}, ring::fuzz::safetensors_input), 6);
}

TEST(FuzzReplay, HttpCorpus) {
  EXPECT_GE(replay({"tests/fuzz/corpus/http"}, ring::fuzz::http_input), 5);
}

TEST(FuzzReplay, HfConfigCorpus) {
  EXPECT_GE(replay({"tests/fuzz/corpus/hf_config"}, ring::fuzz::hf_config_input), 4);
}

}  // namespace
