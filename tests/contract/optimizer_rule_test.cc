// The optimizer rule both optimizers call (common/contract/optimizer_rule.h). That they give the
// same bits end to end is tests/optim's NodeOptimizer-vs-Trainer test; here, the rule's values.
#include <gtest/gtest.h>

#include <cmath>

#include "common/contract/optimizer_rule.h"

namespace ring::contract {
namespace {

TEST(OptimizerRule, ClipRule) {
  const ClipRule over = clip_rule(25.0, 1.0);  // norm 5 > 1
  EXPECT_DOUBLE_EQ(over.norm, 5.0);
  EXPECT_TRUE(over.clipped);
  EXPECT_EQ(over.scale, static_cast<float>(1.0 / (5.0 + 1e-6)));
  const ClipRule under = clip_rule(0.25, 1.0);  // norm 0.5
  EXPECT_DOUBLE_EQ(under.norm, 0.5);
  EXPECT_FALSE(under.clipped);
  EXPECT_EQ(under.scale, 1.f);
  const ClipRule off = clip_rule(1e6, 0.0);  // grad_clip 0: never
  EXPECT_DOUBLE_EQ(off.norm, 1000.0);
  EXPECT_FALSE(off.clipped);
  EXPECT_EQ(off.scale, 1.f);
  EXPECT_FALSE(clipping_enabled(0.0));
  EXPECT_TRUE(clipping_enabled(0.5));
}

TEST(OptimizerRule, AdamWParamsApplyTheDecayMask) {
  spec::OptimizerSection o;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  const AdamWParams d = adamw_params(o, 3e-4, 12, /*decay=*/true);
  EXPECT_EQ(d.lr, static_cast<float>(3e-4));
  EXPECT_EQ(d.beta1, 0.9f);
  EXPECT_EQ(d.beta2, 0.95f);
  EXPECT_EQ(d.eps, 1e-8f);
  EXPECT_EQ(d.weight_decay, 0.1f);
  EXPECT_EQ(d.step, 12);
  EXPECT_EQ(adamw_params(o, 3e-4, 12, /*decay=*/false).weight_decay, 0.f);
}

// Moved here from tests/worker/training_test.cc with the schedule itself.
TEST(LearningRate, WarmupThenCosineOrConstant) {
  spec::OptimizerSection o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.lr_warmup_steps = 10;
  o.schedule = spec::LrSchedule::kCosine;
  EXPECT_DOUBLE_EQ(learning_rate(o, 1, 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(o, 5, 110), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10, 110), 1.0);
  EXPECT_NEAR(learning_rate(o, 60, 110), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(o, 110, 110), 0.1, 1e-12);
  o.schedule = spec::LrSchedule::kConstant;
  EXPECT_DOUBLE_EQ(learning_rate(o, 60, 110), 1.0);
  o.lr_warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(o, 1, 110), 1.0);
}

}  // namespace
}  // namespace ring::contract
