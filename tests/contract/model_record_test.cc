// The model record of a checkpoint's layout (contract::model_record) and its inverse: every
// reader of a record (generate's --checkpoint, export without model.yaml) goes through
// model_config_from_record, which names the key and the rule it breaks.
#include <gtest/gtest.h>

#include <string>

#include "common/contract/model_config.h"

using ring::contract::ModelConfig;
using ring::contract::ModelError;
using ring::contract::model_config_from_record;
using ring::contract::model_record;

namespace {

ModelConfig sample() {
  ModelConfig c;
  c.layers = 3;
  c.d_model = 48;
  c.heads = 6;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.mlp_hidden = 96;
  c.vocab = 300;
  c.mlp = ring::spec::MlpKind::kGelu;
  c.tie_embeddings = true;
  return c;
}

std::string error_of(const nlohmann::json& r) {
  try {
    model_config_from_record(r);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ModelRecord, TheInverseGivesTheSameShapeBack) {
  for (auto mlp : {ring::spec::MlpKind::kGelu, ring::spec::MlpKind::kSwiGLU}) {
    ModelConfig c = sample();
    c.mlp = mlp;
    c.tie_embeddings = mlp == ring::spec::MlpKind::kGelu;
    ModelConfig back = model_config_from_record(model_record(c));
    EXPECT_EQ(model_record(back), model_record(c));
    EXPECT_EQ(back.q_dim(), c.q_dim());
    EXPECT_EQ(back.kv_dim(), c.kv_dim());
  }
}

TEST(ModelRecord, AMalformedRecordNamesTheKeyAndTheRule) {
  nlohmann::json r = model_record(sample());
  EXPECT_EQ(error_of(nlohmann::json::array()), "model record: expected an object, got []");
  auto without = r;
  without.erase("heads");
  EXPECT_EQ(error_of(without), "model record: key 'heads' is missing");
  auto text = r;
  text["heads"] = "6";
  EXPECT_EQ(error_of(text), "model record: key 'heads': expected an integer, got \"6\"");
  auto fraction = r;
  fraction["vocab"] = 300.5;
  EXPECT_EQ(error_of(fraction), "model record: key 'vocab': expected an integer, got 300.5");
  auto tie = r;
  tie["tie_embeddings"] = 1;
  EXPECT_EQ(error_of(tie), "model record: key 'tie_embeddings': expected true or false, got 1");
  auto mlp = r;
  mlp["mlp"] = "relu";
  EXPECT_EQ(error_of(mlp), "model record: key 'mlp': unknown kind \"relu\"");
  auto shape = r;
  shape["kv_heads"] = 4;  // 6 heads are not a multiple of 4
  EXPECT_EQ(error_of(shape), "model config: heads must be a multiple of kv_heads");
}

// Record 2 carries the settings (issue 36): every RoPE scaling type, the norm eps, the dtype and
// max_positions come back exactly; a record 1 (shape only, as checkpoints before it) reads with
// the spec's defaults; malformed settings name the key and the rule.
TEST(ModelRecord, SettingsRoundTripAndOldRecordsStillRead) {
  using ring::spec::RopeScaling;
  for (RopeScaling s :
       {RopeScaling::kNone, RopeScaling::kLinear, RopeScaling::kLlama3, RopeScaling::kYarn}) {
    ModelConfig c = sample();
    c.dtype = ring::spec::DType::kBf16;
    c.rope_theta = 500000.f;
    c.norm_eps = 1e-6f;
    c.max_positions = 131072;
    c.rope_scaling = s;
    c.rope_scaling_factor = 8;
    c.rope_original_context = 8192;
    c.rope_low_freq_factor = 1;
    c.rope_high_freq_factor = 4;
    c.rope_beta_fast = 32;
    c.rope_beta_slow = 1;
    const nlohmann::json r = model_record(c);
    EXPECT_EQ(r["record"], 2);
    EXPECT_EQ(ring::contract::model_record_version(r), 2);
    ModelConfig back = model_config_from_record(r);
    EXPECT_EQ(model_record(back), r);
    EXPECT_EQ(back.rope_theta, 500000.f);
    EXPECT_EQ(back.norm_eps, 1e-6f);
    EXPECT_EQ(back.dtype, ring::spec::DType::kBf16);
    EXPECT_EQ(back.max_positions, 131072);
    EXPECT_EQ(back.rope_scaling, s);
    if (s != RopeScaling::kNone) EXPECT_EQ(back.rope_scaling_factor, 8);
    if (s == RopeScaling::kLlama3 || s == RopeScaling::kYarn)
      EXPECT_EQ(back.rope_original_context, 8192);
    // Only the keys the type uses are written.
    EXPECT_EQ(r.contains("rope_low_freq_factor"), s == RopeScaling::kLlama3);
    EXPECT_EQ(r.contains("rope_beta_fast"), s == RopeScaling::kYarn);
  }
  // Record 1: the shape only.
  nlohmann::json old = model_record(sample());
  for (const char* k : {"record", "dtype", "rope_theta", "norm_eps", "rope_scaling",
                        "max_positions"})
    old.erase(k);
  EXPECT_EQ(ring::contract::model_record_version(old), 1);
  ModelConfig back = model_config_from_record(old);
  EXPECT_EQ(back.rope_theta, 10000.f);
  EXPECT_EQ(back.norm_eps, 1e-5f);
  EXPECT_EQ(back.rope_scaling, ring::spec::RopeScaling::kNone);
  EXPECT_EQ(back.dtype, ring::spec::DType::kFp32);
  EXPECT_EQ(back.max_positions, 0);
}

TEST(ModelRecord, MalformedSettingsNameTheKeyAndTheRule) {
  ModelConfig c = sample();
  c.rope_scaling = ring::spec::RopeScaling::kLlama3;
  c.rope_scaling_factor = 8;
  c.rope_original_context = 8192;
  const nlohmann::json r = model_record(c);
  auto with = [&](const char* k, nlohmann::json v) {
    nlohmann::json x = r;
    x[k] = v;
    return x;
  };
  auto without = [&](const char* k) {
    nlohmann::json x = r;
    x.erase(k);
    return x;
  };
  EXPECT_EQ(error_of(with("rope_scaling", "dynamic")),
            "model record: key 'rope_scaling': expected one of none, linear, llama3, yarn, got "
            "\"dynamic\"");
  EXPECT_EQ(error_of(with("dtype", "fp16")),
            "model record: key 'dtype': expected one of fp32, bf16, got \"fp16\"");
  EXPECT_EQ(error_of(with("rope_theta", "5e5")),
            "model record: key 'rope_theta': expected a number, got \"5e5\"");
  EXPECT_EQ(error_of(without("rope_original_context")),
            "model record: key 'rope_original_context' is missing");
  EXPECT_EQ(error_of(with("rope_original_context", 8192.5)),
            "model record: key 'rope_original_context': expected an integer, got 8192.5");
  EXPECT_EQ(error_of(with("rope_high_freq_factor", 0.5)),
            "model config: rope_scaling llama3 needs 0 < rope_low_freq_factor < "
            "rope_high_freq_factor");
  EXPECT_EQ(error_of(with("norm_eps", -1)), "model config: norm_eps must be a finite number > 0");
  EXPECT_EQ(error_of(with("record", 3)),
            "model record: key 'record': version 3 is newer than this ringmaster reads (2)");
  EXPECT_EQ(error_of(with("record", "2")),
            "model record: key 'record': expected the integer 2, got \"2\"");
}
