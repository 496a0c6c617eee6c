// The passkey length curriculum (worker/train/passkey_curriculum.h): parsing, stage boundaries,
// the samples each step draws; and gradient accumulation over several sequences in one step
// (Trainer::train_step on a vector) against the same sequences packed into one.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/data/errors.h"
#include "worker/data/loader.h"
#include "worker/model/attention.h"
#include "worker/train/passkey_curriculum.h"
#include "worker/train/trainer.h"

namespace ring::train {
namespace {

TEST(PasskeyCurriculum, Parse) {
  auto st = parse_passkey_curriculum("128:800:16,512:300,1024:2:1");
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].seq_len, 128);
  EXPECT_EQ(st[0].steps, 800);
  EXPECT_EQ(st[0].seqs, 16);
  EXPECT_EQ(st[1].seq_len, 512);
  EXPECT_EQ(st[1].steps, 300);
  EXPECT_EQ(st[1].seqs, 0);
  EXPECT_EQ(st[2].seqs, 1);
  for (const char* bad : {"", "128", "128:", ":5", "128:0", "8:10", "128:10:0", "128:10:2:3",
                          "128:10,", "128:1x", "a:b", "128:10;256:5"}) {
    EXPECT_THROW(parse_passkey_curriculum(bad), std::invalid_argument) << bad;
  }
  try {
    parse_passkey_curriculum("128:10,256:-1");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("256:-1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("STEPS"), std::string::npos) << e.what();
  }
}

TEST(PasskeyCurriculum, StagesAndSamples) {
  data::PasskeyOptions o{512, 5, 7, data::PasskeyLabels::kAnswer};
  PasskeyCurriculum c(o, 2, {{128, 3, 4}, {256, 2, 0}});
  EXPECT_EQ(c.stage(1).seq_len, 128);
  EXPECT_EQ(c.stage(3).seqs, 4);
  EXPECT_EQ(c.stage(4).seq_len, 256);
  EXPECT_EQ(c.stage(4).seqs, 2);  // 0: the final samples per step
  EXPECT_EQ(c.stage(6).seq_len, 512);
  EXPECT_EQ(c.stage(1000).seqs, 2);
  std::vector<int64_t> starts;
  for (int64_t s = 1; s <= 8; ++s) {
    if (c.starts_stage(s)) starts.push_back(s);
  }
  EXPECT_EQ(starts, (std::vector<int64_t>{1, 4, 6}));

  // Each step's samples have the stage's length and labels; no sample index repeats.
  std::set<int64_t> seen;
  int64_t drawn = 0;
  for (int64_t s = 1; s <= 7; ++s) {
    std::vector<data::Sequence> seqs = c.next_step(s);
    ASSERT_EQ(static_cast<int64_t>(seqs.size()), c.stage(s).seqs);
    for (const data::Sequence& q : seqs) {
      EXPECT_EQ(q.size(), c.stage(s).seq_len);
      EXPECT_EQ(q.valid_labels(), 5);  // answer labels only
      data::check_sequence(q);
      EXPECT_TRUE(seen.insert(q.segments[0].doc).second);
      ++drawn;
    }
  }
  EXPECT_EQ(c.samples_drawn(), drawn);
  EXPECT_EQ(drawn, 3 * 4 + 2 * 2 + 2 * 2);

  EXPECT_THROW(PasskeyCurriculum(o, 1, {{64, 5, 1}}), data::DataError);  // too short for a key
  EXPECT_THROW(PasskeyCurriculum(o, 0, {}), std::invalid_argument);
}

TEST(PasskeyCurriculum, WithoutStagesIsThePasskeySource) {
  data::PasskeyOptions o{256, 5, 3, data::PasskeyLabels::kAll};
  PasskeyCurriculum c(o, 1, {});
  data::PasskeyLoader loader(o);
  for (int64_t s = 1; s <= 5; ++s) {
    std::vector<data::Sequence> seqs = c.next_step(s);
    ASSERT_EQ(seqs.size(), 1u);
    data::Sequence want = loader.next_sequence();
    EXPECT_EQ(seqs[0].tokens, want.tokens);
    EXPECT_EQ(seqs[0].labels, want.labels);
  }
}

// Two sequences in one step (gradients accumulated, loss over all their labels) give the loss
// and gradient of the same two sequences packed into one with a document boundary.
TEST(Trainer, AccumulatedSequencesMatchPackedOne) {
  spec::LoadResult r = spec::load_spec_string(R"(
job: {name: accumulate}
model: {layers: 2, d_model: 128, heads: 4, mlp: swiglu, vocab: 256}
data: {source: passkey, seq_len: 128, seed: 1}
optimizer: {lr: 1.0e-3, offload: none}
train: {steps: 1, seed: 2}
resources: {nodes: 1, workers_per_node: 1, backend: cpu}
)",
                                              "accumulate.yaml");
  for (const auto& d : r.diagnostics) ADD_FAILURE() << d.str();
  ASSERT_TRUE(r.ok());
  std::string err;
  auto backend = kernels::create_backend("cpu", 1, &err);
  ASSERT_TRUE(backend) << err;
  data::PasskeyOptions o{128, 5, 1, data::PasskeyLabels::kAll};
  std::vector<data::Sequence> two{data::make_passkey_sample(o, 0).sequence,
                                  data::make_passkey_sample(o, 1).sequence};
  data::Sequence packed;
  for (int i = 0; i < 2; ++i) {
    const data::Sequence& q = two[i];
    packed.tokens.insert(packed.tokens.end(), q.tokens.begin(), q.tokens.end());
    packed.labels.insert(packed.labels.end(), q.labels.begin(), q.labels.end());
    for (int64_t p : q.positions) packed.positions.push_back(p + i * 128);
    packed.doc_ids.insert(packed.doc_ids.end(), q.size(), i);
  }
  model::LocalAttention a1(backend.get()), a2(backend.get());
  Trainer t1(*r.spec, backend.get(), &a1, 1), t2(*r.spec, backend.get(), &a2, 1);
  StepStats x = t1.train_step(two), y = t2.train_step(packed);
  EXPECT_EQ(x.tokens, 256);
  EXPECT_EQ(x.valid, y.valid);
  EXPECT_NEAR(x.loss, y.loss, 1e-5 * y.loss);
  EXPECT_NEAR(x.grad_norm, y.grad_norm, 1e-4 * y.grad_norm);
}

}  // namespace
}  // namespace ring::train
