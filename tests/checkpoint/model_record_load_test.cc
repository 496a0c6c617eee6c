// The model record a checkpoint carries (issue 36) as the loaders and readers use it: the one
// reader (ckpt::read_checkpoint_model) gives back the whole config from a step directory or a
// root; a resume (load_latest with the job's layout) refuses another setting or another
// model.dtype naming the key; model.init_from (load_from_path) converts another dtype but refuses
// another rope_theta; a record 1 (shape only, as before settings were recorded) still loads and
// reads with the spec's defaults.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint/checkpoint.h"
#include "common/checkpoint/model.h"
#include "common/contract/model_config.h"
#include "tests/common/test_proc.h"

namespace {

using ring::contract::ModelConfig;
namespace ckpt = ring::ckpt;

ModelConfig imported() {
  ModelConfig c;
  c.layers = 1;
  c.d_model = 16;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 8;
  c.mlp_hidden = 32;
  c.vocab = 300;
  c.tie_embeddings = false;
  c.dtype = ring::spec::DType::kBf16;
  c.rope_theta = 500000.f;
  c.norm_eps = 1e-6f;
  c.rope_scaling = ring::spec::RopeScaling::kLlama3;
  c.rope_scaling_factor = 32;
  c.rope_original_context = 8192;
  c.max_positions = 131072;
  return c;
}

// One tensor "master/w" of 4 floats, the layout record holding `model`.
void write(const std::string& dir, const nlohmann::json& model) {
  ckpt::Options o;
  o.dir = dir;
  o.fsync = false;
  ckpt::Layout l;
  l.shard = "none";
  l.nodes = 1;
  l.total_floats = 4;
  l.ranges = {{0, 0, 4, 0, 1}};
  l.model = model;
  o.layout = l;
  static const float w[4] = {1, 2, 3, 4};
  ckpt::Checkpointer ck(o);
  ck.add_tensor("master/w", ckpt::DType::kF32, {4}, w);
  ck.start(0);
  ASSERT_TRUE(ck.wait().ok);
}

ckpt::Layout job_of(const ModelConfig& c) {
  ckpt::Layout l;
  l.model = ring::contract::model_record(c);
  return l;
}

std::string mismatch(const std::function<void()>& f) {
  try {
    f();
  } catch (const ckpt::CheckpointMismatch& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelRecordLoad, TheOneReaderGivesTheWholeConfig) {
  ring::test::TempDir t("model-record");
  write(t.path + "/ck", ring::contract::model_record(imported()));
  for (const std::string& p : {t.path + "/ck", t.path + "/ck/step-00000000"}) {
    const ckpt::CheckpointModel m = ckpt::read_checkpoint_model(p);
    EXPECT_TRUE(m.settings);
    EXPECT_EQ(m.step, 0);
    EXPECT_EQ(ring::contract::model_record(m.config), ring::contract::model_record(imported()));
  }
  EXPECT_THROW(ckpt::read_checkpoint_model(t.path + "/none"), ckpt::CheckpointError);
  // A malformed record names the file and the key.
  nlohmann::json bad = ring::contract::model_record(imported());
  bad["rope_scaling"] = "ntk";
  write(t.path + "/bad", bad);
  try {
    ckpt::read_checkpoint_model(t.path + "/bad");
    ADD_FAILURE() << "accepted";
  } catch (const ckpt::CheckpointError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("checkpoint.json: layout.model: model record: key 'rope_scaling'"),
              std::string::npos)
        << w;
  }
}

TEST(ModelRecordLoad, AResumeRefusesAnotherSettingOrDtypeAndInitFromConvertsTheDtype) {
  ring::test::TempDir t("model-record");
  const std::string dir = t.path + "/ck";
  write(dir, ring::contract::model_record(imported()));
  float got[4] = {};
  const std::vector<ckpt::LoadTarget> targets = {{"master/w", ckpt::DType::kF32, {4}, got}};

  // The same config loads both ways; max_positions is never compared.
  ModelConfig same = imported();
  same.max_positions = 4096;
  const ckpt::Layout j_same = job_of(same);
  EXPECT_TRUE(ckpt::load_latest(dir, 0, 1, targets, INT64_MAX, &j_same).loaded);
  EXPECT_EQ(got[3], 4.f);
  EXPECT_TRUE(ckpt::load_from_path(dir, 0, 1, targets, &j_same).loaded);

  // Another model.dtype: a resume is refused naming it, init_from converts.
  ModelConfig fp32 = imported();
  fp32.dtype = ring::spec::DType::kFp32;
  const ckpt::Layout j_fp32 = job_of(fp32);
  const std::string e =
      mismatch([&] { ckpt::load_latest(dir, 0, 1, targets, INT64_MAX, &j_fp32); });
  EXPECT_NE(e.find("written for another model: dtype \"bf16\" (this job: \"fp32\")"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("set model.dtype: bf16"), std::string::npos) << e;
  EXPECT_TRUE(ckpt::load_from_path(dir, 0, 1, targets, &j_fp32).loaded);

  // Another rope_theta or norm_eps: refused both ways, naming the key and both values.
  ModelConfig theta = imported();
  theta.rope_theta = 10000.f;
  const ckpt::Layout j_theta = job_of(theta);
  for (const std::string& m :
       {mismatch([&] { ckpt::load_latest(dir, 0, 1, targets, INT64_MAX, &j_theta); }),
        mismatch([&] { ckpt::load_from_path(dir, 0, 1, targets, &j_theta); })})
    EXPECT_NE(m.find("rope_theta 500000.0 (this job: 10000.0)"), std::string::npos) << m;
  ModelConfig none = imported();
  none.rope_scaling = ring::spec::RopeScaling::kNone;
  const ckpt::Layout j_none = job_of(none);
  const std::string n = mismatch([&] { ckpt::load_from_path(dir, 0, 1, targets, &j_none); });
  EXPECT_NE(n.find("rope_scaling \"llama3\" (this job: \"none\")"), std::string::npos) << n;
  EXPECT_NE(n.find("rope_scaling_factor 32.0 (this job: unset)"), std::string::npos) << n;
}

TEST(ModelRecordLoad, ARecordOneStillLoadsAndReadsWithTheDefaults) {
  ring::test::TempDir t("model-record");
  nlohmann::json old = ring::contract::model_record(imported());
  for (const char* k : {"record", "dtype", "rope_theta", "norm_eps", "rope_scaling",
                        "rope_scaling_factor", "rope_original_context", "rope_low_freq_factor",
                        "rope_high_freq_factor", "max_positions"})
    old.erase(k);
  write(t.path + "/ck", old);
  const ckpt::CheckpointModel m = ckpt::read_checkpoint_model(t.path + "/ck");
  EXPECT_FALSE(m.settings);
  EXPECT_EQ(m.config.rope_theta, 10000.f);
  EXPECT_EQ(m.config.rope_scaling, ring::spec::RopeScaling::kNone);
  // A job of any settings resumes it: only the shape it records is compared.
  float got[4] = {};
  const ckpt::Layout job = job_of(imported());
  EXPECT_TRUE(ckpt::load_latest(t.path + "/ck", 0, 1, {{"master/w", ckpt::DType::kF32, {4}, got}},
                                INT64_MAX, &job)
                  .loaded);
  ModelConfig other = imported();
  other.heads = 4;
  other.kv_heads = 4;
  other.head_dim = 4;
  const ckpt::Layout j_other = job_of(other);
  const std::string e = mismatch([&] {
    ckpt::load_latest(t.path + "/ck", 0, 1, {{"master/w", ckpt::DType::kF32, {4}, got}},
                      INT64_MAX, &j_other);
  });
  EXPECT_NE(e.find("heads 2 (this job: 4)"), std::string::npos) << e;
}
