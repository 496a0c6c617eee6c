// The loss of a chat batch against PyTorch (tests/worker/chat_loss_ref.py, float64): a sequence
// of packed conversations from the chat source (worker/data/chat.h) through the model, against
// the reference's cross-entropy over the assistant targets only, where the reference applies a
// mask the test derives from the rendered text itself (not from the loader).
//
// Tolerances: the loss within 1e-6 relative (ours fp32, torch fp64); each parameter tensor's
// gradient within 1e-4 relative L2 (as tests/worker/model_test.cc). The gradient the masked
// positions would add if they leaked is checked to be far above that tolerance, so a leak fails.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "worker/data/chat.h"
#include "worker/data/loader.h"
#include "worker/data/token_corpus.h"
#include "worker/model/attention.h"
#include "worker/model/config.h"
#include "worker/model/model.h"

namespace fs = std::filesystem;
using namespace ring;

namespace {

template <typename T>
void write_raw(const fs::path& p, const std::vector<T>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(T)));
}

std::vector<double> read_f64(const fs::path& p, size_t n) {
  std::vector<double> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(double)));
  if (!f.good()) v.clear();
  return v;
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b, int64_t off, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = off; i < off + n; ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? INFINITY : 0.0);
}

}  // namespace

TEST(ChatLoss, AssistantTokensOnlyAgainstTorch) {
  const fs::path dir = fs::temp_directory_path() / ("ring_chat_loss_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // Conversations with several turns, byte-level through a user template.
  {
    std::ofstream t(dir / "t.yaml");
    t << "system: {prefix: \"<s>\", end: \"</s>\"}\n"
         "user: {prefix: \"<u>\", end: \"</u>\"}\n"
         "assistant: {prefix: \"<a>\", end: \"</a>\", separator: \"\\n\"}\n";
    std::ofstream j(dir / "c.jsonl");
    for (int i = 0; i < 6; ++i) {
      nlohmann::json m;
      m["messages"] = {
          {{"role", "system"}, {"content", "be kind " + std::to_string(i)}},
          {{"role", "user"}, {"content", "q" + std::string(static_cast<size_t>(i + 2), 'x')}},
          {{"role", "assistant"}, {"content", "answer " + std::to_string(i * 37)}},
          {{"role", "user"}, {"content", "more?"}},
          {{"role", "assistant"}, {"content", std::string(static_cast<size_t>(i + 1), 'y')}}};
      j << m.dump() << "\n";
    }
  }
  spec::DataSection d;
  d.source = spec::DataSource::kChat;
  d.paths = {(dir / "c.jsonl").string()};
  d.chat_template = (dir / "t.yaml").string();
  d.seq_len = 160;
  d.pack = true;
  d.min_doc_len = 1;
  d.seed = 2;
  auto src = data::make_source(d);
  src->next_sequence();
  const data::Sequence seq = src->next_sequence();  // starts inside a conversation
  const auto& loader = dynamic_cast<const data::TextLoader&>(*src);
  const auto chats = data::read_chat_jsonl(d.paths[0]);
  const data::ChatTemplate tmpl = data::chat_template(d.chat_template);

  // Unmasked labels and the target mask, from the rendered text of each segment's conversation.
  const int64_t T = seq.size();
  std::vector<int32_t> full(T, -1);
  std::vector<uint8_t> target(T, 0);
  for (int64_t g = 0; g < seq.num_segments(); ++g) {
    const int64_t b = seq.cu_seqlens[g], e = seq.cu_seqlens[g + 1];
    const auto& s = seq.segments[g];
    const std::string text = data::render_chat_text(tmpl, chats[s.doc]);
    std::vector<uint8_t> is_target(text.size(), 0);
    for (size_t at = text.find("<a>"); at != std::string::npos; at = text.find("<a>", at + 1))
      for (size_t k = at + 3; k < text.find("</a>", at) + 4; ++k) is_target[k] = 1;
    ASSERT_EQ(loader.corpus().doc_len(s.doc), static_cast<int64_t>(text.size()));
    for (int64_t k = b; k + 1 < e; ++k) {
      full[k] = seq.tokens[k + 1];
      target[k] = is_target[s.offset + (k - b) + 1];
    }
  }
  // The loader's labels are exactly the unmasked ones where the next token is a target.
  int64_t n_target = 0, n_masked = 0;
  for (int64_t k = 0; k < T; ++k) {
    EXPECT_EQ(seq.labels[k], target[k] ? full[k] : -1) << "position " << k;
    (target[k] ? n_target : n_masked) += full[k] >= 0 ? 1 : 0;
  }
  ASSERT_GT(n_target, 10);
  ASSERT_GT(n_masked, n_target) << "too few masked labels: the test is not sharp";

  model::ModelConfig cfg;
  cfg.layers = 2;
  cfg.d_model = 32;
  cfg.heads = 4;
  cfg.kv_heads = 2;
  cfg.head_dim = 8;
  cfg.mlp_hidden = 64;
  cfg.vocab = 256;
  cfg.mlp = spec::MlpKind::kSwiGLU;
  cfg.tie_embeddings = false;
  cfg.rope_theta = 10000.f;
  cfg.norm_eps = 1e-5f;
  std::string err;
  auto backend = kernels::create_backend("cpu", 2, &err);
  ASSERT_TRUE(backend) << err;
  model::LocalAttention attention(backend.get());
  model::Model m(cfg, backend.get(), &attention);
  std::vector<float> params = m.initial_params(11);
  for (float& x : params) x *= 8.f;  // away from the near-uniform start: a sharper comparison
  m.set_params(params);
  auto run = [&](const std::vector<int32_t>& labels, int64_t valid) {
    m.zero_grads();
    model::Batch b{T, seq.tokens.data(), labels.data(), seq.positions.data(), seq.doc_ids.data()};
    model::LossResult r = m.forward_backward(b, valid);
    return std::make_pair(r, m.get_grads());
  };
  const auto [ours, grads] = run(seq.labels, seq.valid_labels());
  EXPECT_EQ(ours.valid, n_target);
  const auto [unmasked, grads_unmasked] = run(full, n_target + n_masked);
  EXPECT_GT(std::abs(unmasked.loss - ours.loss), 1e-3 * std::abs(ours.loss));

  // The reference.
  const model::ParamLayout& layout = m.layout();
  nlohmann::json j;
  j["layers"] = cfg.layers;
  j["d_model"] = cfg.d_model;
  j["heads"] = cfg.heads;
  j["kv_heads"] = cfg.kv_heads;
  j["head_dim"] = cfg.head_dim;
  j["mlp"] = "swiglu";
  j["tie_embeddings"] = cfg.tie_embeddings;
  j["rope_theta"] = cfg.rope_theta;
  j["norm_eps"] = cfg.norm_eps;
  j["global_valid"] = n_target;
  j["total"] = layout.total();
  for (const model::ParamView& v : layout.views())
    j["params"].push_back(
        {{"name", v.name}, {"shape", v.shape}, {"offset", v.offset}, {"size", v.size}});
  std::ofstream(dir / "config.json") << j.dump(1);
  write_raw(dir / "params.f32", params);
  write_raw(dir / "ids.i32", seq.tokens);
  write_raw(dir / "labels.i32", full);
  write_raw(dir / "target.u8", target);
  write_raw(dir / "docs.i32", seq.doc_ids);
  write_raw(dir / "pos.i64", seq.positions);
  const std::string cmd = "/usr/bin/python3 " RING_SOURCE_DIR "/tests/worker/chat_loss_ref.py " +
                          dir.string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << cmd << " failed; exit status 3: install python3-torch (scripts/install-deps.sh)";
  const auto ref_loss = read_f64(dir / "loss.f64", 1);
  const auto ref = read_f64(dir / "grads.f64", layout.total());
  const auto leak = read_f64(dir / "masked.f64", layout.total());
  ASSERT_EQ(ref_loss.size(), 1u);
  ASSERT_EQ(ref.size(), static_cast<size_t>(layout.total()));
  ASSERT_EQ(leak.size(), static_cast<size_t>(layout.total()));
  fs::remove_all(dir);

  EXPECT_NEAR(ours.loss, ref_loss[0], 1e-6 * std::abs(ref_loss[0]));
  double worst = 0, leak_min = INFINITY;
  for (const model::ParamView& v : layout.views()) {
    const double rel = rel_l2(grads, ref, v.offset, v.size);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-4) << v.name;
    // Ours plus the masked positions' gradient: what a leak would give. It must be far off.
    std::vector<float> leaked(grads);
    for (int64_t i = v.offset; i < v.offset + v.size; ++i) leaked[i] += static_cast<float>(leak[i]);
    leak_min = std::min(leak_min, rel_l2(leaked, ref, v.offset, v.size));
  }
  EXPECT_GT(leak_min, 1e-2) << "the masked positions' gradient is too small to tell a leak";
  std::printf(
      "chat batch: %lld targets, %lld masked labels; loss ours %.10f torch %.10f "
      "(rel %.2e); worst tensor rel L2 %.2e; a leak would be >= %.2e\n",
      static_cast<long long>(n_target), static_cast<long long>(n_masked), ours.loss, ref_loss[0],
      std::abs(ours.loss - ref_loss[0]) / ref_loss[0], worst, leak_min);
}
