// Training on a token dataset (data.source: tokens): the license texts encoded with a
// SentencePiece model trained here (spm_train, 512 pieces), written as .bin/.idx, read back
// through make_source; a small model's loss falls well below the unigram entropy of the ids.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/spec/parse.h"
#include "kernels/backend.h"
#include "worker/data/loader.h"
#include "worker/data/token_corpus.h"
#include "worker/data/token_file.h"
#include "worker/data/tokenizer.h"
#include "worker/model/attention.h"
#include "worker/train/trainer.h"

namespace fs = std::filesystem;

namespace ring::train {
namespace {

TEST(TokensSource, LossFallsWellBelowUnigramEntropy) {
  char t[] = "/tmp/ring-tokens-train-XXXXXX";
  const fs::path dir = ::mkdtemp(t);
  std::string inputs;
  for (const auto& e : fs::directory_iterator("/usr/share/common-licenses"))
    if (e.is_regular_file()) inputs.append(inputs.empty() ? "" : ",").append(e.path().string());
  ASSERT_EQ(
      std::system(("spm_train --input=" + inputs + " --model_prefix=" + (dir / "tok").string() +
                   " --vocab_size=512 --model_type=unigram --minloglevel=2 >/dev/null 2>&1")
                      .c_str()),
      0);
  auto tok = data::Tokenizer::load((dir / "tok.model").string());
  auto text = data::TextCorpus::load({"/usr/share/common-licenses"}, {.max_doc_len = 0});
  {
    data::TokenFileWriter w((dir / "lic").string(), 2, 512);
    for (int64_t i = 0; i < text.num_docs(); ++i) {
      auto b = text.doc(i);
      w.add_document(tok->encode_document(
          std::string_view(reinterpret_cast<const char*>(b.data()), b.size())));
    }
    w.finish();
  }
  const std::string yaml = R"(
job: {name: tokens-small}
model: {layers: 2, d_model: 128, heads: 4, kv_heads: 2, mlp: swiglu, vocab: 512}
data:
  source: tokens
  paths: [)" + (dir / "lic.bin").string() +
                           R"(]
  seq_len: 512
  seed: 3
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, schedule: cosine, lr_warmup_steps: 20,
            weight_decay: 0.1, offload: none}
train: {steps: 300, grad_clip: 1.0, seed: 1, log_every: 20}
resources: {nodes: 1, workers_per_node: 1, backend: cpu, host_memory_gb: 4}
)";
  spec::LoadResult r = spec::load_spec_string(yaml, "tokens_training_test.yaml");
  for (const auto& d : r.diagnostics) ADD_FAILURE() << d.str();
  ASSERT_TRUE(r.ok());
  const spec::JobSpec& spec = *r.spec;
  auto source = data::make_source(spec.data);
  data::check_vocab(*source, spec.model.vocab);
  auto* loader = dynamic_cast<data::TextLoader*>(source.get());
  ASSERT_NE(loader, nullptr);
  // Unigram entropy of the ids (nats): the loss of the best context-free model.
  std::vector<double> count(512, 0.0);
  const auto& c = loader->corpus();
  std::vector<int32_t> ids;
  for (int64_t d = 0; d < c.num_docs(); ++d) {
    ids.resize(static_cast<size_t>(c.doc_len(d)));
    c.copy_tokens(d, 0, c.doc_len(d), ids.data());
    for (int32_t id : ids) count[id] += 1;
  }
  double total = static_cast<double>(c.total_tokens()), entropy = 0;
  for (double n : count)
    if (n > 0) entropy -= n / total * std::log(n / total);
  std::printf("token dataset: %lld documents, %lld ids; unigram entropy %.4f nats\n",
              static_cast<long long>(c.num_docs()), static_cast<long long>(c.total_tokens()),
              entropy);

  std::string err;
  const char* th = std::getenv("RING_TEST_THREADS");
  auto backend = kernels::create_backend("cpu", th ? std::atoi(th) : 1, &err);
  ASSERT_TRUE(backend) << err;
  model::LocalAttention attention(backend.get());
  Trainer trainer(spec, backend.get(), &attention, spec.train.steps);
  double window = 0, first = 0, tail = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 1; s <= spec.train.steps; ++s) {
    StepStats st = trainer.train_step(source->next_sequence());
    ASSERT_TRUE(std::isfinite(st.loss)) << "step " << s;
    window += st.loss;
    if (s > spec.train.steps - 30) tail += st.loss / 30;
    if (s % spec.train.log_every == 0) {
      st.loss = window / spec.train.log_every;
      if (first == 0) first = st.loss;
      std::printf("%s\n", format_step(st).c_str());
      std::fflush(stdout);
      window = 0;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "first window %.4f, final (mean of the last 30 steps) %.4f nats vs unigram "
      "entropy %.4f, %.1f s\n",
      first, tail, entropy, secs);
  EXPECT_LT(tail, entropy - 0.5) << "the model did not learn beyond id frequencies";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ring::train
