// `ringctl eval --passkey` against the training evaluation (train::evaluate_passkey) on the
// same samples, in one process and over 2 ranks; the depth-moved samples (eval::passkey_at_depth)
// keep the generator's answer, filler and question and put the key line where asked.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "tests/common/tiny_model.h"
#include "tests/common/tiny_weights.h"
#include "worker/data/passkey.h"
#include "worker/eval/eval_run.h"
#include "worker/model/attention.h"
#include "worker/model/model.h"
#include "worker/train/passkey_eval.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int code = -1;
  std::string out, err;
};

// stdout and stderr apart (the report is stdout; progress and notes are stderr).
Result run(const std::string& args, const std::string& env = "") {
  Result r;
  char tmpl[] = "/tmp/ring-evalerr-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd >= 0) ::close(fd);
  const std::string cmd = env + " " + std::string(RINGCTL) + " " + args + " 2>" + tmpl;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  FILE* e = std::fopen(tmpl, "r");
  while (e != nullptr && (n = std::fread(buf, 1, sizeof buf, e)) > 0) r.err.append(buf, n);
  if (e != nullptr) std::fclose(e);
  std::remove(tmpl);
  return r;
}

constexpr const char* kUcxLocal = "UCX_TLS=self,posix UCX_NET_DEVICES=lo";
constexpr int64_t kLen = 160, kSamples = 6, kSeed = 77, kDigits = 5;

class EvalPasskey : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "ring-evalpk-XXXXXX").string();
    dir_ = ::mkdtemp(t.data());
    std::string err;
    be_ = ring::kernels::create_backend("cpu", 2, &err);
    ASSERT_NE(be_, nullptr) << err;
    params_ = ring::test::tiny_params(c_, be_.get(), 36, ring::test::kSharpAttentionAndEmbedding);
    ASSERT_TRUE(ring::test::write_checkpoint(dir_ + "/ckpt", c_, params_).ok);
  }
  void TearDown() override { fs::remove_all(dir_); }

  json eval(const std::string& extra, const std::string& env = "") {
    const Result r = run("eval --checkpoint " + dir_ + "/ckpt --passkey random,0.5 --passkey-len " +
                             std::to_string(kLen) + " --passkey-samples " +
                             std::to_string(kSamples) + " --passkey-seed " +
                             std::to_string(kSeed) + " --json --threads 2 " + extra,
                         env);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    if (r.code != 0) return json();
    return json::parse(r.out);
  }

  std::string dir_;
  const ring::model::ModelConfig c_ = ring::test::tiny_model_config();
  std::unique_ptr<ring::kernels::Backend> be_;
  std::vector<float> params_;
};

TEST_F(EvalPasskey, RandomDepthEqualsTheTrainingEvaluationOnTheSameSamples) {
  ring::model::LocalAttention att(be_.get());
  ring::model::Model m(c_, be_.get(), &att);
  m.set_params(params_);
  const ring::train::PasskeyAccuracy want = ring::train::evaluate_passkey(
      m, {kLen, kDigits, kSeed, ring::data::PasskeyLabels::kAll}, kSamples);
  // The answer loss is far from zero and from chance's log(256): the comparison has teeth.
  ASSERT_GT(want.answer_loss, 0.1);
  for (const char* how : {"one process", "2 ranks"}) {
    SCOPED_TRACE(how);
    const bool ranks = std::string(how) == "2 ranks";
    const json j = ranks ? eval("--ranks 2", kUcxLocal) : eval("");
    ASSERT_TRUE(j.contains("passkey"));
    EXPECT_EQ(j["passkey"]["digits"], kDigits);
    EXPECT_EQ(j["passkey"]["seed"], kSeed);
    const json& row = j["passkey"]["results"][0];
    ASSERT_EQ(row["depth"], "random");
    EXPECT_EQ(row["samples"], kSamples);
    EXPECT_EQ(row["digit_accuracy"].get<double>(), want.digit_accuracy);
    EXPECT_EQ(row["key_accuracy"].get<double>(), want.key_accuracy);
    // One process: the same forward, the same sum: equal. Over ranks: ring attention's merge.
    if (ranks)
      EXPECT_NEAR(row["answer_loss"].get<double>(), want.answer_loss, 1e-6 * want.answer_loss);
    else
      EXPECT_EQ(row["answer_loss"].get<double>(), want.answer_loss);
  }
}

// Depth 0.5: the moved samples scored by hand (argmax of each answer digit's logits, the mean of
// the model's answer loss) give the command's row.
TEST_F(EvalPasskey, AMovedKeyIsScoredAsTheTrainingEvaluationScoresASample) {
  ring::model::LocalAttention att(be_.get());
  ring::model::Model m(c_, be_.get(), &att);
  m.set_params(params_);
  const ring::data::PasskeyOptions po{kLen, kDigits, kSeed, ring::data::PasskeyLabels::kAnswer};
  const ring::eval::PasskeyDepth half{false, 0.5, "0.5"};
  int64_t right = 0, keys = 0;
  double loss = 0, key_depth = 0;
  for (int64_t i = 0; i < kSamples; ++i) {
    const ring::data::PasskeySample s = ring::eval::passkey_at_depth(po, i, half);
    key_depth += static_cast<double>(s.key_start) / kLen;
    const ring::data::Sequence& q = s.sequence;
    const auto r = m.forward({q.size(), q.tokens.data(), q.labels.data(), q.positions.data(),
                              q.doc_ids.data()},
                             q.valid_labels());
    loss += r.loss;
    bool all = true;
    for (int64_t k = 0; k < kDigits; ++k) {
      const float* row = m.logits() + (s.first_predicting_position() + k) * c_.vocab;
      const bool ok = std::max_element(row, row + c_.vocab) - row == s.answer[k];
      right += ok;
      all = all && ok;
    }
    keys += all;
  }
  const json j = eval("");
  ASSERT_TRUE(j.contains("passkey"));
  const json& row = j["passkey"]["results"][1];
  EXPECT_EQ(row["depth"].get<double>(), 0.5);
  EXPECT_EQ(row["digit_accuracy"].get<double>(), static_cast<double>(right) / (kSamples * kDigits));
  EXPECT_EQ(row["key_accuracy"].get<double>(), static_cast<double>(keys) / kSamples);
  EXPECT_NEAR(row["answer_loss"].get<double>(), loss / kSamples, 1e-12 * loss);
  // Where the key line starts in the sample (depth counts filler bytes only).
  EXPECT_NEAR(row["key_depth"].get<double>(), key_depth / kSamples, 1e-12);
}

std::string text_of(const ring::data::Sequence& s) {
  std::string t;
  for (int32_t x : s.tokens) t.push_back(static_cast<char>(x));
  return t;
}

TEST(PasskeyAtDepth, MovesOnlyTheKeyLine) {
  for (int64_t len : {int64_t{120}, int64_t{1000}}) {
    const ring::data::PasskeyOptions po{len, 5, 3, ring::data::PasskeyLabels::kAnswer};
    for (int64_t i = 0; i < 8; ++i) {
      const ring::data::PasskeySample g = ring::data::make_passkey_sample(po, i);
      const std::string gt = text_of(g.sequence);
      const std::string key =
          "\nThe pass key is " + g.answer + ". Remember it. " + g.answer + " is the pass key.\n";
      ASSERT_EQ(gt.compare(g.key_start - 1, key.size(), key), 0) << gt;
      std::string filler = gt;
      filler.erase(g.key_start - 1, key.size());
      const std::string question = "\nWhat is the pass key? The pass key is " + g.answer;
      filler.resize(filler.size() - question.size());
      for (double d : {0.0, 0.1, 0.5, 0.9, 1.0}) {
        SCOPED_TRACE("length " + std::to_string(len) + " sample " + std::to_string(i) +
                     " depth " + std::to_string(d));
        const ring::data::PasskeySample s = ring::eval::passkey_at_depth(po, i, {false, d, ""});
        const std::string st = text_of(s.sequence);
        ASSERT_EQ(st.size(), gt.size());
        EXPECT_EQ(s.answer, g.answer);
        const auto at = static_cast<size_t>(std::llround(d * static_cast<double>(filler.size())));
        EXPECT_EQ(s.key_start, static_cast<int64_t>(at) + 1);
        EXPECT_EQ(st, filler.substr(0, at) + key + filler.substr(at) + question);
        EXPECT_EQ(s.sequence.labels, g.sequence.labels);  // the answer's labels, unchanged
        EXPECT_EQ(s.answer_start, g.answer_start);
      }
      const ring::data::PasskeySample r = ring::eval::passkey_at_depth(po, i, {true, 0, "random"});
      EXPECT_EQ(r.sequence.tokens, g.sequence.tokens);
    }
  }
}

TEST(PasskeyDepths, ParsedOrRefusedNamingTheItem) {
  const auto d = ring::eval::parse_depths("0.1, 50%,random,1");
  ASSERT_EQ(d.size(), 4u);
  EXPECT_DOUBLE_EQ(d[0].depth, 0.1);
  EXPECT_DOUBLE_EQ(d[1].depth, 0.5);
  EXPECT_TRUE(d[2].random);
  EXPECT_DOUBLE_EQ(d[3].depth, 1.0);
  for (const char* bad : {"", "0.1,", "-0.1", "1.01", "120%", "x", "0.5.1", "nan"}) {
    try {
      ring::eval::parse_depths(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ring::eval::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--passkey '" + std::string(bad) + "'"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(ring::eval::parse_lengths("--passkey-len", "4096,16K,1M"),
            (std::vector<int64_t>{4096, 16384, 1 << 20}));
  EXPECT_THROW(ring::eval::parse_lengths("--passkey-len", "16Q"), ring::eval::UsageError);
}

}  // namespace
