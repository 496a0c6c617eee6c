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
