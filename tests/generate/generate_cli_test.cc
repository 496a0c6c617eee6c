// `ringctl generate` end to end: a checkpoint written with the checkpoint library (format 2, its
// layout record names the model), byte prompts, greedy tokens equal to the argmax of a
// teacher-forced forward over the same tokens, --json, -o (0600), sampling seeds, flag errors;
// over several ranks (--ranks P, and srun's task variables) the tokens of one process.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint/checkpoint.h"
#include "kernels/backend.h"
#include "tests/common/test_proc.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ring::model::ModelConfig;

struct Result {
  int code = -1;
  std::string out;
};

// env: "NAME=value ..." for the command (the ranks' UCX stays on this host, as in the ring tests).
Result run(const std::string& args, const std::string& env = "") {
  Result r;
  const std::string cmd = env + " " + std::string(RINGCTL) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "ring-gencli-XXXXXX").string();
    dir_ = ::mkdtemp(t.data());
    std::string err;
    be_ = ring::kernels::create_backend("cpu", 2, &err);
    ASSERT_NE(be_, nullptr) << err;
    // The tiny model, seed 21, attention and embedding x 8 (the checkpoint of the job and Slurm
    // tests too, tests/generate/write_test_checkpoint.cc).
    params_ = ring::test::tiny_params(c_, be_.get(), 21, ring::test::kSharpAttentionAndEmbedding);
    ASSERT_TRUE(ring::test::write_checkpoint(dir_ + "/ckpt", c_, params_).ok);
    prompt_ = "The quick brown fox jumps over the lazy dog. ";
    for (int i = 0; i < 4; ++i) prompt_ += prompt_;  // 720 bytes: several 64-token pages
    std::ofstream(dir_ + "/p1.txt") << prompt_;
    std::ofstream(dir_ + "/p2.txt") << prompt_ << "And then";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Teacher-forced argmax after every prefix of ids[0..n) for n >= first.
  std::vector<int32_t> teacher_next(const std::vector<int32_t>& ids, size_t first,
                                    ring::spec::DType dtype = ring::spec::DType::kFp32) {
    ring::model::LocalAttention att(be_.get());
    ModelConfig c = c_;
    c.dtype = dtype;
    ring::model::Model m(c, be_.get(), &att);
    m.set_params(params_);
    std::vector<int32_t> labels(ids.size(), -1);
    std::vector<int64_t> pos(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) pos[i] = static_cast<int64_t>(i);
    m.forward({static_cast<int64_t>(ids.size()), ids.data(), labels.data(), pos.data(), nullptr},
              1);
    std::vector<int32_t> out;
    for (size_t i = first - 1; i < ids.size(); ++i) {
      const float* row = m.logits() + static_cast<int64_t>(i) * c_.vocab;
      out.push_back(static_cast<int32_t>(std::max_element(row, row + c_.vocab) - row));
    }
    return out;
  }

  std::string dir_;
  const ModelConfig c_ = ring::test::tiny_model_config();
  std::unique_ptr<ring::kernels::Backend> be_;
  std::vector<float> params_;
  std::string prompt_;
};

TEST_F(GenerateCli, GreedyTokensEqualTheTeacherForcedArgmax) {
  const Result r = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/p1.txt " + dir_ +
                       "/p2.txt --json --max-tokens 12 --page-tokens 64 --fast-bytes 160K "
                       "--window 64 --threads 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out.substr(r.out.find('{')));
  ASSERT_EQ(j["prompts"].size(), 2u);
  for (const auto& p : j["prompts"]) {
    const std::string text =
        p["file"].get<std::string>().find("p2") != std::string::npos ? prompt_ + "And then"
                                                                      : prompt_;
    std::vector<int32_t> ids(text.begin(), text.end());
    const auto gen = p["tokens"].get<std::vector<int32_t>>();
    ASSERT_EQ(gen.size(), 12u);
    EXPECT_EQ(p["prompt_tokens"], ids.size());
    EXPECT_EQ(p["step_s"].size(), 11u);
    const size_t first = ids.size();
    ids.insert(ids.end(), gen.begin(), gen.end() - 1);
    EXPECT_EQ(teacher_next(ids, first), gen) << p["file"];
  }
  // The two prompts share their first 11 full pages (704 bytes) in both layers and heads.
  EXPECT_EQ(j["cache"]["shared_page_hits"], 11 * 2 * 2);
  EXPECT_LE(j["cache"]["fast_peak_bytes"].get<int64_t>(), 160 * 1024);
  EXPECT_GT(j["cache"]["page_tasks"]["host"].get<int64_t>(), 0);
  EXPECT_GT(j["cache"]["page_tasks"]["shared"].get<int64_t>(), 0);
}

// bf16 (docs/generation.md "bf16"): --dtype bf16 generates the bf16 teacher's greedy tokens with
// bf16 pages (half the host tier's bytes of the fp32 run of as many tokens), a checkpoint whose
// record says bf16 generates in bf16 without the flag and --dtype fp32 overrides it, and fp16 is
// refused naming the flag.
TEST_F(GenerateCli, Bf16ByFlagAndByTheCheckpointsRecord) {
  const std::string args = dir_ + "/p1.txt --json --max-tokens 12 --page-tokens 64 --threads 2";
  const Result f = run("generate --checkpoint " + dir_ + "/ckpt " + args);
  const Result b = run("generate --checkpoint " + dir_ + "/ckpt --dtype bf16 " + args);
  ASSERT_EQ(f.code, 0) << f.out;
  ASSERT_EQ(b.code, 0) << b.out;
  const json jf = json::parse(f.out.substr(f.out.find('{')));
  const json jb = json::parse(b.out.substr(b.out.find('{')));
  EXPECT_EQ(jf["dtype"], "fp32");
  EXPECT_EQ(jb["dtype"], "bf16");
  EXPECT_EQ(jb["attention"]["kv"], "bf16");
  EXPECT_EQ(2 * jb["cache"]["host_bytes"].get<int64_t>(), jf["cache"]["host_bytes"].get<int64_t>());
  std::vector<int32_t> ids(prompt_.begin(), prompt_.end());
  const auto gen = jb["prompts"][0]["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(gen.size(), 12u);
  const size_t first = ids.size();
  ids.insert(ids.end(), gen.begin(), gen.end() - 1);
  EXPECT_EQ(teacher_next(ids, first, ring::spec::DType::kBf16), gen);
  // A checkpoint trained in bf16: its record says so, and generation follows it.
  ModelConfig c16 = c_;
  c16.dtype = ring::spec::DType::kBf16;
  ASSERT_TRUE(ring::test::write_checkpoint(dir_ + "/ckpt16", c16, params_).ok);
  const Result r = run("generate --checkpoint " + dir_ + "/ckpt16 " + args);
  ASSERT_EQ(r.code, 0) << r.out;
  const json jr = json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(jr["dtype"], "bf16");
  EXPECT_EQ(jr["prompts"][0]["tokens"], jb["prompts"][0]["tokens"]);
  const Result o = run("generate --checkpoint " + dir_ + "/ckpt16 --dtype fp32 " + args);
  ASSERT_EQ(o.code, 0) << o.out;
  const json jo = json::parse(o.out.substr(o.out.find('{')));
  EXPECT_EQ(jo["dtype"], "fp32");
  EXPECT_EQ(jo["prompts"][0]["tokens"], jf["prompts"][0]["tokens"]);
  const Result h = run("generate --checkpoint " + dir_ + "/ckpt --dtype fp16 " + args);
  EXPECT_EQ(h.code, 2) << h.out;
  EXPECT_NE(h.out.find("--dtype fp16: not supported"), std::string::npos) << h.out;
}

TEST_F(GenerateCli, OutputFileSeedsAndDiskTier) {
  const std::string out = dir_ + "/out.txt";
  // Issue 31.6: an existing 0644 file at -o stayed 0644 (the generated text readable by all).
  { std::ofstream(out) << "an earlier output"; }
  ::chmod(out.c_str(), 0644);
  fs::create_directory(dir_ + "/disk");
  const std::string base = "generate --checkpoint " + dir_ + "/ckpt/step-00000002 " + dir_ +
                           "/p1.txt --page-tokens 64 --threads 2 ";
  Result r = run(base + "--max-tokens 10 -o " + out + " --host-bytes 64K --disk-dir " + dir_ + "/disk");
  ASSERT_EQ(r.code, 0) << r.out;
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream in(out, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.size(), 10u);
  EXPECT_TRUE(fs::is_empty(dir_ + "/disk"));  // the disk tier is gone at exit
  // The same greedy text without a disk tier.
  r = run(base + "--max-tokens 10");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(text), std::string::npos);
  // Sampling: the same seed gives the same text; another seed another text.
  const std::string s = base + "--temperature 1.5 --top-p 0.95 --max-tokens 32 --json ";
  auto tokens = [&](const std::string& args) {
    Result x = run(args);
    EXPECT_EQ(x.code, 0) << x.out;
    return json::parse(x.out.substr(x.out.find('{')))["prompts"][0]["tokens"];
  };
  const json five = tokens(s + "--seed 5");
  EXPECT_EQ(tokens(s + "--seed 5"), five);
  EXPECT_NE(tokens(s + "--seed 6"), five);
}

TEST_F(GenerateCli, BadInputsNameTheFlag) {
  const std::string base = "generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/p1.txt ";
  Result r = run(base + "--fast-bytes 12Q");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--fast-bytes"), std::string::npos) << r.out;
  r = run("generate --checkpoint " + dir_ + "/nope " + dir_ + "/p1.txt");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--checkpoint"), std::string::npos) << r.out;
  r = run(base + "--top-p 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--top-p"), std::string::npos) << r.out;
  r = run(base + "--fast-bytes 1K --window 4096");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--fast-bytes"), std::string::npos) << r.out;
  r = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/missing.txt");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("missing.txt"), std::string::npos) << r.out;
  std::ofstream(dir_ + "/empty.txt").close();
  r = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/empty.txt");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("empty.txt"), std::string::npos) << r.out;
}

// --backend: cpu or cuda, in one process or over ranks; without a usable GPU (or a build without
// the CUDA backend) the error names the backend and why. With a GPU the run succeeds and says so.
TEST_F(GenerateCli, BackendFlag) {
  const std::string base = "generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/p1.txt ";
  Result r = run(base + "--backend tpu");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--backend"), std::string::npos) << r.out;
  // Over ranks each rank keeps its own device fast tier (the prefill on the cpu backend); each
  // rank that cannot create the backend says so, and the launcher fails naming a rank.
  r = run(base + "--backend cuda --ranks 2 --json --max-tokens 3 --page-tokens 64 --threads 1");
  if (r.code == 0) {
    const json j = json::parse(r.out.substr(r.out.find('{')));
    EXPECT_EQ(j["backend"], "cuda");
    EXPECT_EQ(j["ranks"]["ranks"], 2);
    EXPECT_GT(j["cache"]["page_tasks"]["fast"].get<int64_t>(), 0);
  } else {
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("cannot create the cuda backend: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--backend cuda: rank "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("ringctl generate: rank "), std::string::npos) << r.out;
  }
  r = run(base + "--backend cuda --json --max-tokens 3 --page-tokens 64 --threads 2");
  if (r.code == 0) {
    const json j = json::parse(r.out.substr(r.out.find('{')));
    EXPECT_EQ(j["backend"], "cuda");
    EXPECT_GT(j["cache"]["page_tasks"]["fast"].get<int64_t>(), 0);
  } else {
    EXPECT_EQ(r.code, 1) << r.out;
    const std::string want = "--backend cuda: cannot create the cuda backend: ";
    const size_t at = r.out.find(want);
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_GT(r.out.size(), at + want.size() + 5) << "no reason given: " << r.out;
  }
  r = run(base + "--backend cpu --json --max-tokens 2 --page-tokens 64 --threads 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(json::parse(r.out.substr(r.out.find('{')))["backend"], "cpu");
}

// The smallest cases: a one-byte prompt, one token, no fast tier at all.
TEST_F(GenerateCli, OneBytePromptOneToken) {
  std::ofstream(dir_ + "/one.txt") << "T";
  const Result r = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ +
                       "/one.txt --max-tokens 1 --fast-bytes 0 --window 0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out.substr(r.out.find('{')));
  const auto tokens = j["prompts"][0]["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(tokens.size(), 1u);
  EXPECT_EQ(teacher_next({'T'}, 1), tokens);
  EXPECT_EQ(j["prompts"][0]["step_s"].size(), 0u);
}

// --spec: the model from the spec, the cache from its generate section (flags win over it).
TEST_F(GenerateCli, SpecGivesModelAndCacheSettings) {
  auto spec = [&](const std::string& name, int d_model, const std::string& generate) {
    std::ofstream f(dir_ + "/" + name);
    f << "job: {name: gen}\n"
         "model: " << ring::test::tiny_model_yaml({.d_model = d_model}) << "\n"
         "data: {source: passkey, seq_len: 1024}\n"
         "train: {steps: 1}\n"
      << generate;
    return dir_ + "/" + name;
  };
  const std::string base = "generate --checkpoint " + dir_ + "/ckpt " + dir_ +
                           "/p1.txt --max-tokens 6 --json --threads 2 ";
  const Result plain = run(base);
  ASSERT_EQ(plain.code, 0) << plain.out;
  const json pj = json::parse(plain.out.substr(plain.out.find('{')));
  const std::string good =
      spec("good.yaml", 64, "generate: {page_tokens: 32, fast_gb: 0, window: 0}\n");
  Result r = run(base + "--spec " + good);
  ASSERT_EQ(r.code, 0) << r.out;
  json j = json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["cache"]["page_tokens"], 32);
  EXPECT_EQ(j["cache"]["fast_capacity_bytes"], 0);
  EXPECT_EQ(j["cache"]["page_tasks"]["fast"], 0);
  EXPECT_EQ(j["prompts"][0]["tokens"], pj["prompts"][0]["tokens"]);  // same model, same tokens
  r = run(base + "--spec " + good + " --page-tokens 64");
  ASSERT_EQ(r.code, 0) << r.out;
  j = json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["cache"]["page_tokens"], 64);
  // A spec whose model is not the checkpoint's: the mismatching key is named, with both values.
  r = run(base + "--spec " + spec("other.yaml", 32, ""));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("model.d_model is 32 but the checkpoint"), std::string::npos) << r.out;
  // A window that the spec's fast tier cannot hold names both settings.
  r = run(base + "--spec " + spec("small.yaml", 64, "generate: {fast_gb: 0.00001, window: 4096}\n"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("generate.fast_gb"), std::string::npos) << r.out;
}

// ring-worker alone (offload none) trains and saves its weights (--save-weights); ringctl
// generate takes that checkpoint with the same spec, whose ringd-only rules do not apply here.
TEST_F(GenerateCli, WeightsSavedByRingWorkerAloneGenerate) {
  const std::string spec = dir_ + "/alone.yaml";
  std::ofstream(spec) << "job: {name: alone}\n"
                         "model: {layers: 1, d_model: 32, heads: 2, vocab: 256, rope_theta: 1.0e6}\n"
                         "data: {source: passkey, seq_len: 256, passkey_digits: 3}\n"
                         "optimizer: {lr: 1.0e-3, offload: none}\n"
                         "train: {steps: 3, seed: 5}\n"
                         "resources: {backend: cpu, cpus_per_worker: 1}\n";
  const std::string weights = dir_ + "/weights";
  const std::string cmd = std::string(RING_WORKER) + " --spec " + spec +
                          " --threads 1 --eval-samples 1 --save-weights " + weights + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  EXPECT_NE(out.find("weights: " + weights + "/step-00000003"), std::string::npos) << out;
  auto list = ring::ckpt::list_checkpoints(weights, /*verify=*/true);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].status, ring::ckpt::Status::kComplete);
  ASSERT_TRUE(list[0].layout.has_value());
  EXPECT_EQ(list[0].layout->model["d_model"], 32);
  EXPECT_EQ(list[0].layout->shard, "none");
  std::ofstream(dir_ + "/q.txt") << "What is the pass key? The pass key is ";
  const Result r = run("generate --checkpoint " + weights + " --spec " + spec + " " + dir_ +
                       "/q.txt --max-tokens 3 --json --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["prompts"][0]["tokens"].size(), 3u);
}

// --approximate: labelled approximate on stderr and in --json, with a bound per token.
TEST_F(GenerateCli, ApproximateModeIsLabelled) {
  const Result r = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ +
                       "/p1.txt --max-tokens 5 --page-tokens 64 --json --approximate 0.01");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("APPROXIMATE attention"), std::string::npos) << r.out;
  const json j = json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["attention"]["mode"], "approximate");
  const auto bounds = j["prompts"][0]["skipped_mass_bound"].get<std::vector<double>>();
  ASSERT_EQ(bounds.size(), 4u);
  for (double b : bounds) EXPECT_GE(b, 0.0);
  const Result exact = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ +
                           "/p1.txt --max-tokens 5 --page-tokens 64 --json");
  ASSERT_EQ(exact.code, 0) << exact.out;
  const json ej = json::parse(exact.out.substr(exact.out.find('{')));
  EXPECT_EQ(ej["attention"]["mode"], "exact");
  EXPECT_EQ(ej["attention"]["host_kv"], "fp32");
  const Result q8 = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ +
                        "/p1.txt --max-tokens 5 --page-tokens 64 --json --host-int8");
  ASSERT_EQ(q8.code, 0) << q8.out;
  EXPECT_NE(q8.out.find("INT8 host-tier"), std::string::npos) << q8.out;
  const json qj = json::parse(q8.out.substr(q8.out.find('{')));
  EXPECT_EQ(qj["attention"]["host_kv"], "int8 (not exact)");
  EXPECT_LT(qj["cache"]["host_bytes"].get<int64_t>(), ej["cache"]["host_bytes"].get<int64_t>() / 2);
  EXPECT_EQ(run("generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/p1.txt --approximate 1")
                .code,
            2);
}

// Over ranks: the prompts prefilled with ring attention, the cache sharded, the decode steps
// merging the ranks' partials. The tokens (greedy and sampled) are those of one process.
constexpr const char* kUcxLocal = "UCX_TLS=self,posix UCX_NET_DEVICES=lo";

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST_F(GenerateCli, RanksGiveTheTokensOfOneProcess) {
  const std::string base = "generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/p1.txt " + dir_ +
                           "/p2.txt --json --page-tokens 64 --fast-bytes 0 --window 0 "
                           "--max-tokens 12 --threads 1 --timeout 120 ";
  int n = 0;
  auto gen = [&](const std::string& extra) {
    const std::string out = dir_ + "/r" + std::to_string(n++) + ".json";
    const Result r = run(base + extra + " -o " + out, kUcxLocal);
    EXPECT_EQ(r.code, 0) << r.out;
    return r.code == 0 ? read_json(out) : json();
  };
  const std::string sampled = "--temperature 1.2 --top-p 0.95 --seed 4 ";
  const json one = gen(""), one_s = gen(sampled);
  ASSERT_FALSE(one.is_null());
  for (const std::string split : {"zigzag", "contiguous"}) {
    for (int ranks : {2, 4}) {
      SCOPED_TRACE(split + " over " + std::to_string(ranks));
      const std::string flags = "--ranks " + std::to_string(ranks) + " --split " + split + " ";
      const json j = gen(flags);
      if (j.is_null()) continue;
      EXPECT_EQ(j["ranks"]["ranks"], ranks);
      EXPECT_EQ(j["ranks"]["split"], split);
      for (size_t p = 0; p < 2; ++p)
        EXPECT_EQ(j["prompts"][p]["tokens"], one["prompts"][p]["tokens"]) << p;
      // Every rank's pages together: as many as one process holds or more (partial pages).
      EXPECT_GE(j["cache"]["pages"].get<int64_t>(), one["cache"]["pages"].get<int64_t>());
      const json s = gen(flags + sampled);
      for (size_t p = 0; p < 2 && !s.is_null(); ++p)
        EXPECT_EQ(s["prompts"][p]["tokens"], one_s["prompts"][p]["tokens"]) << p;
    }
  }
  // The prefill in two levels (--head-ranks: 2 groups of 2 over 4 ranks): the same tokens.
  const json h = gen("--ranks 4 --head-ranks 2 ");
  for (size_t p = 0; p < 2 && !h.is_null(); ++p)
    EXPECT_EQ(h["prompts"][p]["tokens"], one["prompts"][p]["tokens"]) << "head ranks, " << p;
  // The greedy tokens are the teacher's.
  const std::string text = prompt_;
  std::vector<int32_t> ids(text.begin(), text.end());
  const auto tokens = one["prompts"][0]["tokens"].get<std::vector<int32_t>>();
  const size_t first = ids.size();
  ids.insert(ids.end(), tokens.begin(), tokens.end() - 1);
  EXPECT_EQ(teacher_next(ids, first), tokens);
}

// Under srun every task is a rank: SLURM_PROCID of SLURM_STEP_NUM_TASKS, on --rendezvous.
TEST_F(GenerateCli, SrunTaskVariablesMakeTheRanks) {
  const std::string base = "generate --checkpoint " + dir_ + "/ckpt " + dir_ +
                           "/p1.txt --json --page-tokens 64 --max-tokens 8 --threads 1 "
                           "--timeout 120 ";
  const Result one = run(base + "-o " + dir_ + "/one.json");
  ASSERT_EQ(one.code, 0) << one.out;
  std::vector<Result> res(2);
  std::vector<std::thread> tasks;
  for (int r = 0; r < 2; ++r)
    tasks.emplace_back([&, r] {
      res[static_cast<size_t>(r)] =
          run(base + "--rendezvous " + dir_ + "/rdv -o " + dir_ + "/srun.json",
              std::string(kUcxLocal) + " SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=" + std::to_string(r));
    });
  for (auto& t : tasks) t.join();
  for (const Result& r : res) ASSERT_EQ(r.code, 0) << r.out;
  const json j = read_json(dir_ + "/srun.json");  // written by rank 0 only
  EXPECT_EQ(j["ranks"]["ranks"], 2);
  EXPECT_EQ(j["prompts"][0]["tokens"], read_json(dir_ + "/one.json")["prompts"][0]["tokens"]);
}

TEST_F(GenerateCli, RankFlagErrorsNameTheRule) {
  const std::string base = "generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/p1.txt ";
  Result r = run(base + "--rank 0 --world 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--rendezvous"), std::string::npos) << r.out;
  r = run(base + "--rank 2 --world 2 --rendezvous " + dir_ + "/x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("0 <= --rank < --world"), std::string::npos) << r.out;
  r = run(base, "SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("under srun with 2 tasks, --rendezvous DIR"), std::string::npos) << r.out;
  r = run(base + "--ranks 2", "SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("srun starts the ranks"), std::string::npos) << r.out;
  r = run(base + "--ranks 4 --head-ranks 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--head-ranks 3 must divide the 4 ranks"), std::string::npos) << r.out;
  r = run(base + "--ranks 2 --split diagonal");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--split 'diagonal'"), std::string::npos) << r.out;
  std::ofstream(dir_ + "/three.txt") << "The";
  r = run("generate --checkpoint " + dir_ + "/ckpt " + dir_ + "/three.txt --ranks 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("three.txt: 3 tokens cannot be cut over 2 ranks (the zigzag split needs "
                       "at least 4)"),
            std::string::npos)
      << r.out;
}

// A rank killed in the middle of a run: the launcher stops the other, names the rank and how it
// ended, exits 1, and leaves no process behind.
TEST_F(GenerateCli, KilledRankStopsTheOthers) {
  using namespace std::chrono_literals;
  const std::string out = dir_ + "/big.txt";
  ring::test::ProcOptions opts = ring::test::ucx_loopback();
  opts.kill_on_timeout = true;
  ring::test::Proc launcher({RINGCTL, "generate", "--checkpoint", dir_ + "/ckpt", dir_ + "/p1.txt",
                             "--page-tokens", "64", "--max-tokens", "100000000", "--ranks", "2",
                             "--threads", "1", "--timeout", "120", "-o", out},
                            dir_ + "/launcher.log", dir_ + "/launcher.log", opts);
  // Rank 1: the process whose command line has "--rank" then "1" (and names `out`).
  auto rank1 = [&]() -> pid_t {
    for (pid_t p : ring::test::processes_mentioning(out)) {
      const std::string cmd = ring::test::slurp("/proc/" + std::to_string(p) + "/cmdline");
      if (cmd.find(std::string("--rank\0001\0", 9)) != std::string::npos) return p;
    }
    return -1;
  };
  pid_t victim = -1;
  for (auto until = std::chrono::steady_clock::now() + 120s;
       victim < 0 && std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(50ms))
    victim = rank1();
  ASSERT_GT(victim, 0) << ring::test::slurp(dir_ + "/launcher.log");
  ::kill(victim, SIGKILL);
  const int st = launcher.wait(120);
  ASSERT_NE(st, -1) << "the launcher did not end\n" << ring::test::slurp(dir_ + "/launcher.log");
  EXPECT_EQ(ring::test::exit_code(st), 1);
  EXPECT_NE(ring::test::slurp(dir_ + "/launcher.log").find("rank 1 was killed by signal 9"),
            std::string::npos)
      << ring::test::slurp(dir_ + "/launcher.log");
  EXPECT_TRUE(ring::test::wait_for_no_processes(out, 60));
}

}  // namespace
