// The full model against an independent PyTorch 1.13 implementation (tests/worker/torch_model.py,
// float64): loss and EVERY parameter gradient, on packed documents with their block-diagonal
// causal mask, GQA / MQA / MHA, swiglu and gelu, tied and untied embeddings; recompute on and off
// must give bit-identical gradients.
//
// Tolerance: for each parameter tensor, ||g - g_ref||_2 / ||g_ref||_2 <= 1e-4 (relative L2 /
// Frobenius norm per tensor, ours in fp32 vs torch in fp64); the loss to 1e-5 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "worker/model/attention.h"
#include "worker/model/config.h"
#include "worker/model/model.h"

namespace ring::model {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  spec::MlpKind mlp;
  bool tied;
  int64_t heads, kv_heads;
  bool zigzag_positions;  // positions of a zigzag shard (two runs) instead of 0..T-1
  spec::RopeScaling rope_scaling = spec::RopeScaling::kNone;  // factor 4, original context 64
  bool bf16 = false;  // model.dtype bf16 (docs/precision.md); torch applies the same roundings
};

ModelConfig make_config(const Case& c) {
  ModelConfig m;
  m.layers = 2;
  m.d_model = 48;
  m.heads = c.heads;
  m.kv_heads = c.kv_heads;
  m.head_dim = 12;
  m.mlp_hidden = c.mlp == spec::MlpKind::kSwiGLU ? 80 : 96;
  m.vocab = 61;
  m.mlp = c.mlp;
  m.tie_embeddings = c.tied;
  m.rope_theta = 500.f;  // small base: positions up to ~200 turn many times
  m.norm_eps = 1e-5f;
  m.rope_scaling = c.rope_scaling;
  m.rope_scaling_factor = c.rope_scaling == spec::RopeScaling::kNone ? 1.0 : 4.0;
  m.rope_original_context = 64.0;
  m.dtype = c.bf16 ? spec::DType::kBf16 : spec::DType::kFp32;
  return m;
}

// Packed documents of random lengths with their shifted labels (-1 at each document's last token
// and at a few random places), like worker/data/sequence.h.
struct HostBatch {
  std::vector<int32_t> ids, labels, docs;
  std::vector<int64_t> pos;
  int64_t valid = 0;
  Batch batch() const {
    return Batch{static_cast<int64_t>(ids.size()), ids.data(), labels.data(), pos.data(),
                 docs.data()};
  }
};

HostBatch make_batch(int64_t t, int64_t vocab, bool zigzag, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostBatch b;
  const int lens[] = {37, 5, 1, 60, 22, 300};
  int doc = 0, left = lens[0];
  for (int64_t i = 0; i < t; ++i) {
    if (left == 0) left = lens[++doc];
    b.ids.push_back(static_cast<int32_t>(rng() % vocab));
    b.docs.push_back(doc);
    --left;
  }
  for (int64_t i = 0; i < t; ++i) {
    bool last = i + 1 == t || b.docs[i + 1] != b.docs[i];
    bool drop = rng() % 11 == 0;
    b.labels.push_back(last || drop ? -1 : b.ids[i + 1]);
    if (b.labels.back() >= 0) ++b.valid;
  }
  for (int64_t i = 0; i < t; ++i) {
    // zigzag: rank 0 of 2 owns chunks 0 and 3 of 4 -> positions [0, t/2) and [3t/2, 2t).
    b.pos.push_back(zigzag && i >= t / 2 ? i + t : i);
  }
  return b;
}

template <typename T>
void write_raw(const fs::path& p, const std::vector<T>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  ASSERT_TRUE(f.good()) << p;
}

std::vector<double> read_f64(const fs::path& p, size_t n) {
  std::vector<double> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(double)));
  if (!f.good()) v.clear();
  return v;
}

std::unique_ptr<kernels::Backend> cpu_backend() {
  std::string err;
  auto b = kernels::create_backend("cpu", 2, &err);
  EXPECT_TRUE(b) << err;
  return b;
}

struct ModelRun {
  LossResult loss;
  std::vector<float> grads;
};

// LocalAttention that counts its forward calls: selective recompute must never re-run the
// attention in the backward (full recompute does, layers - 1 times).
class CountingAttention final : public AttentionExecutor {
 public:
  explicit CountingAttention(kernels::Backend* backend) : inner_(backend) {}
  void forward(const AttentionCall& call, float* out, float* lse) override {
    ++forwards;
    inner_.forward(call, out, lse);
  }
  void backward(const AttentionCall& call, const float* out, const float* lse, const float* dout,
                float* dq, float* dk, float* dv) override {
    inner_.backward(call, out, lse, dout, dq, dk, dv);
  }
  kernels::AttentionStats stats() const override { return inner_.stats(); }
  int forwards = 0;

 private:
  LocalAttention inner_;
};

ModelRun run_model(const ModelConfig& cfg, const std::vector<float>& params, const HostBatch& hb,
                   int64_t global_valid, kernels::Backend* backend,
                   int* attention_forwards = nullptr) {
  CountingAttention attention(backend);
  Model model(cfg, backend, &attention);
  model.set_params(params);
  model.zero_grads();
  ModelRun r;
  r.loss = model.forward_backward(hb.batch(), global_valid);
  r.grads = model.get_grads();
  if (attention_forwards) *attention_forwards = attention.forwards;
  return r;
}

class ModelVsTorch : public ::testing::TestWithParam<Case> {};

TEST_P(ModelVsTorch, LossAndEveryGradient) {
  const Case c = GetParam();
  ModelConfig cfg = make_config(c);
  auto backend = cpu_backend();
  ASSERT_TRUE(backend);
  ParamLayout layout(cfg);

  // Larger than the GPT-2 init so the attention is far from uniform and the test is sharp.
  LocalAttention attention(backend.get());
  Model init_model(cfg, backend.get(), &attention);
  // fp32 as drawn (a bf16 model's get_params would give them rounded).
  std::vector<float> params = init_model.initial_params(1234);
  for (const ParamView& v : layout.views()) {
    for (int64_t i = 0; i < v.size; ++i) {
      float& x = params[v.offset + i];
      x = v.name.find(".gain") != std::string::npos ? 1.f + 0.1f * std::sin(float(i)) : x * 10.f;
    }
  }
  const int64_t t = 192;
  HostBatch hb = make_batch(t, cfg.vocab, c.zigzag_positions, 99);
  const int64_t global_valid = hb.valid + 41;  // as if other ranks held more valid labels

  ModelRun ours = run_model(cfg, params, hb, global_valid, backend.get());
  EXPECT_EQ(ours.loss.valid, hb.valid);

  // Recompute must not change a single bit.
  ModelConfig cfg_rc = cfg;
  cfg_rc.recompute = true;
  int full_forwards = 0;
  ModelRun rc = run_model(cfg_rc, params, hb, global_valid, backend.get(), &full_forwards);
  EXPECT_EQ(rc.loss.loss_sum, ours.loss.loss_sum);
  ASSERT_EQ(rc.grads.size(), ours.grads.size());
  EXPECT_EQ(0, std::memcmp(rc.grads.data(), ours.grads.data(), rc.grads.size() * sizeof(float)))
      << "recompute changed the gradients";
  EXPECT_EQ(full_forwards, 2 * cfg.layers - 1);  // the last layer's forward is still there
  // Selective recompute: the same bits, and the attention runs once per layer.
  cfg_rc.recompute_policy = spec::RecomputePolicy::kSelective;
  int sel_forwards = 0;
  ModelRun sel = run_model(cfg_rc, params, hb, global_valid, backend.get(), &sel_forwards);
  EXPECT_EQ(sel.loss.loss_sum, ours.loss.loss_sum);
  ASSERT_EQ(sel.grads.size(), ours.grads.size());
  EXPECT_EQ(0, std::memcmp(sel.grads.data(), ours.grads.data(), sel.grads.size() * sizeof(float)))
      << "selective recompute changed the gradients";
  EXPECT_EQ(sel_forwards, cfg.layers) << "selective recompute re-ran the attention";

  // PyTorch reference in float64.
  fs::path dir = fs::temp_directory_path() /
                 ("ring_model_test_" + std::string(c.name) + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json j;
  j["layers"] = cfg.layers;
  j["d_model"] = cfg.d_model;
  j["heads"] = cfg.heads;
  j["kv_heads"] = cfg.kv_heads;
  j["head_dim"] = cfg.head_dim;
  j["mlp"] = spec::to_string(cfg.mlp);
  j["tie_embeddings"] = cfg.tie_embeddings;
  j["rope_theta"] = cfg.rope_theta;
  j["norm_eps"] = cfg.norm_eps;
  if (cfg.rope_scaling != spec::RopeScaling::kNone)
    j["rope_scaling"] = {{"type", spec::to_string(cfg.rope_scaling)},
                         {"factor", cfg.rope_scaling_factor},
                         {"original", cfg.rope_original_context},
                         {"beta_fast", cfg.rope_beta_fast},
                         {"beta_slow", cfg.rope_beta_slow}};
  j["global_valid"] = global_valid;
  j["bf16"] = c.bf16;
  j["total"] = layout.total();
  for (const ParamView& v : layout.views()) {
    j["params"].push_back({{"name", v.name}, {"shape", v.shape}, {"offset", v.offset},
                           {"size", v.size}});
  }
  std::ofstream(dir / "config.json") << j.dump(1);
  write_raw(dir / "params.f32", params);
  write_raw(dir / "ids.i32", hb.ids);
  write_raw(dir / "labels.i32", hb.labels);
  write_raw(dir / "docs.i32", hb.docs);
  write_raw(dir / "pos.i64", hb.pos);
  std::string cmd = "/usr/bin/python3 " RING_SOURCE_DIR "/tests/worker/torch_model.py " +
                    dir.string() + " float64 2>&1";
  int rc_py = std::system(cmd.c_str());
  ASSERT_EQ(rc_py, 0) << "the PyTorch reference failed (" << cmd
                      << "); exit status 3 means torch could not be imported: install "
                         "python3-torch (scripts/install-deps.sh)";
  std::vector<double> ref_loss = read_f64(dir / "loss.f64", 1);
  std::vector<double> ref = read_f64(dir / "grads.f64", layout.total());
  ASSERT_EQ(ref_loss.size(), 1u);
  ASSERT_EQ(ref.size(), static_cast<size_t>(layout.total()));
  fs::remove_all(dir);

  // fp32: ours accumulates in fp32, torch in fp64. bf16: between the same rounding points the two
  // differ by fp32 vs fp64 rounding (~1e-6 relative), which flips some bf16 roundings by one bf16
  // step (2^-8 relative) each, and the flips add up through the backward: measured 1e-3 to
  // 3.6e-3 per tensor (mean 2.5e-3), the loss 5e-5. Against a torch WITHOUT the rounding points
  // (plain fp64) the same run is off by 7.4e-3 to 3.6e-2 per tensor (mean 2.8e-2): a missing or
  // extra rounding point shows there. Bounds: the loss 1e-3 relative (the issue's), each tensor
  // 1.5e-2, and the mean over tensors 8e-3 (3x from both sides).
  const double loss_tol = c.bf16 ? 1e-3 : 1e-5, grad_tol = c.bf16 ? 1.5e-2 : 1e-4;
  const double mean_tol = c.bf16 ? 8e-3 : 1e-4;
  double sum_rel = 0;
  EXPECT_NEAR(ours.loss.loss, ref_loss[0], loss_tol * std::abs(ref_loss[0]));
  double worst = 0;
  for (const ParamView& v : layout.views()) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < v.size; ++i) {
      double a = ours.grads[v.offset + i], b = ref[v.offset + i];
      diff += (a - b) * (a - b);
      norm += b * b;
    }
    ASSERT_GT(norm, 0) << v.name << ": reference gradient is zero (test not sharp)";
    double rel = std::sqrt(diff / norm);
    worst = std::max(worst, rel);
    sum_rel += rel;
    EXPECT_LE(rel, grad_tol) << v.name << " relative L2 error " << rel;
  }
  EXPECT_LE(sum_rel / static_cast<double>(layout.views().size()), mean_tol)
      << "mean per-tensor relative L2 error";
  std::printf("[%s] loss ours %.9f torch %.9f; worst per-tensor relative L2 gradient error %.3g\n",
              c.name, ours.loss.loss, ref_loss[0], worst);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModelVsTorch,
    ::testing::Values(Case{"swiglu_tied_gqa", spec::MlpKind::kSwiGLU, true, 4, 2, false},
                      Case{"gelu_untied_mha", spec::MlpKind::kGelu, false, 4, 4, false},
                      Case{"swiglu_untied_mqa_zigzag", spec::MlpKind::kSwiGLU, false, 4, 1, true},
                      Case{"gelu_tied_gqa_zigzag", spec::MlpKind::kGelu, true, 4, 2, true},
                      Case{"swiglu_tied_gqa_zigzag_yarn", spec::MlpKind::kSwiGLU, true, 4, 2,
                           true, spec::RopeScaling::kYarn},
                      Case{"gelu_untied_mha_linear", spec::MlpKind::kGelu, false, 4, 4, false,
                           spec::RopeScaling::kLinear},
                      Case{"bf16_swiglu_tied_gqa_zigzag", spec::MlpKind::kSwiGLU, true, 4, 2,
                           true, spec::RopeScaling::kNone, true},
                      Case{"bf16_gelu_untied_mha", spec::MlpKind::kGelu, false, 4, 4, false,
                           spec::RopeScaling::kNone, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(ParamLayout, BucketsArePrefixesInBackwardOrder) {
  ModelConfig cfg = make_config(Case{"x", spec::MlpKind::kSwiGLU, false, 4, 2, false});
  cfg.layers = 3;
  ParamLayout layout(cfg);
  const auto& b = layout.buckets();
  ASSERT_EQ(b.size(), 5u);  // head, layers 2, 1, 0, embedding
  EXPECT_EQ(b[0].name, "head");
  EXPECT_EQ(b[1].name, "layers.2");
  EXPECT_EQ(b[3].name, "layers.0");
  EXPECT_EQ(b[4].name, "embedding");
  EXPECT_EQ(b[0].begin, 0);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_EQ(b[i].begin, b[i - 1].end);
  EXPECT_EQ(b.back().end, layout.total());
  for (const ParamView& v : layout.views()) {
    EXPECT_EQ(v.offset % kParamAlign, 0) << v.name;
    EXPECT_EQ(v.decay, v.name.find(".gain") == std::string::npos) << v.name;
    const GradBucket& bucket = v.layer >= 0 ? layout.layer_bucket(v.layer)
                               : v.name == "embedding.weight" ? layout.embedding_bucket()
                                                              : layout.head_bucket();
    EXPECT_GE(v.offset, bucket.begin) << v.name;
    EXPECT_LE(v.offset + v.size, bucket.end) << v.name;
  }
  EXPECT_THROW(layout.view("nope"), ModelError);
}

TEST(Model, BucketCallbacksComeInLayoutOrderAndAreFinal) {
  ModelConfig cfg = make_config(Case{"x", spec::MlpKind::kSwiGLU, true, 4, 2, false});
  cfg.layers = 3;
  auto backend = cpu_backend();
  LocalAttention attention(backend.get());
  Model model(cfg, backend.get(), &attention);
  model.init_params(7);
  HostBatch hb = make_batch(64, cfg.vocab, false, 5);
  std::vector<int> order;
  std::vector<float> snapshot(model.layout().total());
  model.zero_grads();
  model.forward_backward(hb.batch(), hb.valid, [&](const GradBucket& b) {
    order.push_back(b.index);
    std::memcpy(snapshot.data() + b.begin, model.grads() + b.begin,
                (b.end - b.begin) * sizeof(float));
  });
  ASSERT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  std::vector<float> final_grads = model.get_grads();
  EXPECT_EQ(0, std::memcmp(snapshot.data(), final_grads.data(), snapshot.size() * sizeof(float)))
      << "a bucket changed after it was reported final";
}

// What the model keeps for the backward (docs/precision.md "Where each tensor lives"), counted
// by hand per tensor: fp32 stores everything in 4 bytes; bf16 without recompute keeps h1, h2, q,
// k, v, o in 2 bytes plus one layer's fp32 work set of the six, and x, x_mid, lse, rstd, gate/up
// in 4; with recompute the one layer's set stays fp32 in both dtypes. Selective recompute keeps
// per layer q, k, v, o (2 bytes in bf16) and lse, plus one shared set of h1, h2 (2 bytes in
// bf16), x_mid, gate/up, rstd (and bf16's work set). The layouts' gradients are the same bits
// (ModelVsTorch's recompute checks).
TEST(Model, Bf16KeepsSavedActivationsInTwoBytes) {
  for (spec::MlpKind mlp : {spec::MlpKind::kSwiGLU, spec::MlpKind::kGelu}) {
    ModelConfig cfg = make_config(Case{"x", mlp, false, 4, 2, false});
    cfg.layers = 3;
    const int64_t t = 64, L = cfg.layers, d = cfg.d_model, f = cfg.mlp_hidden;
    const int64_t qd = cfg.q_dim(), kvd = cfg.kv_dim();
    const int64_t mlp_n = mlp == spec::MlpKind::kSwiGLU ? 2 : 1;  // gate and up, or up
    const int64_t six = 2 * d + 2 * qd + 2 * kvd;                     // h1 h2 q o k v
    const int64_t rest = d + cfg.heads + mlp_n * f + 2;               // x_mid lse gate/up rstd
    const int64_t xs = (L + 1) * d * 4;                               // block inputs, fp32
    const int64_t want_fp32 = t * (xs + L * 4 * (six + rest));
    const int64_t want_bf16 = t * (xs + L * (2 * six + 4 * rest) + 4 * six);
    const int64_t want_recompute = t * (xs + 4 * (six + rest));
    const int64_t attn = 2 * qd + 2 * kvd;                   // q o k v
    const int64_t mid = d + mlp_n * f + 2;                   // x_mid gate/up rstd
    const int64_t want_sel_fp32 = t * (xs + L * 4 * (attn + cfg.heads) + 4 * (2 * d + mid));
    const int64_t want_sel_bf16 =
        t * (xs + L * (2 * attn + 4 * cfg.heads) + 2 * 2 * d + 4 * mid + 4 * six);
    auto backend = cpu_backend();
    LocalAttention attention(backend.get());
    HostBatch hb = make_batch(t, cfg.vocab, false, 5);
    auto bytes = [&](spec::DType dtype, bool recompute,
                     spec::RecomputePolicy policy = spec::RecomputePolicy::kFull) {
      ModelConfig c = cfg;
      c.dtype = dtype;
      c.recompute = recompute;
      c.recompute_policy = policy;
      Model model(c, backend.get(), &attention);
      model.init_params(7);
      model.forward_backward(hb.batch(), hb.valid);
      return model.activation_bytes();
    };
    const int64_t fp32 = bytes(spec::DType::kFp32, false), bf16 = bytes(spec::DType::kBf16, false);
    EXPECT_EQ(fp32, want_fp32);
    EXPECT_EQ(bf16, want_bf16);
    EXPECT_EQ(bytes(spec::DType::kBf16, true), want_recompute);
    EXPECT_EQ(bytes(spec::DType::kFp32, true), want_recompute);
    EXPECT_EQ(bytes(spec::DType::kFp32, true, spec::RecomputePolicy::kSelective), want_sel_fp32);
    EXPECT_EQ(bytes(spec::DType::kBf16, true, spec::RecomputePolicy::kSelective), want_sel_bf16);
    std::printf("[%s] saved activations: fp32 %lld bytes, bf16 %lld (%.3fx)\n",
                spec::to_string(mlp), static_cast<long long>(fp32),
                static_cast<long long>(bf16), static_cast<double>(bf16) / fp32);
  }
}

// bf16 rounding by value (nearest, ties to the even mantissa), independent of the kernels'
// integer trick: the two bf16 neighbours of x compared in double. Finite x only.
float round_bf16_by_value(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t lo_bits = bits & 0xFFFF0000u, hi_bits = lo_bits + 0x10000u;
  float lo, hi;
  std::memcpy(&lo, &lo_bits, 4);
  std::memcpy(&hi, &hi_bits, 4);
  const double dl = std::abs(double(x) - lo), dh = std::abs(double(hi) - x);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo_bits & 0x10000u) == 0 ? lo : hi;
}

// A block store over one host fp32 buffer: what the bf16 model did before it dropped its fp32
// weights (each block rounded into a slot, the embedding gathered in fp32).
class HostStore final : public BlockStore {
 public:
  HostStore(const ParamLayout& layout, const std::vector<float>& params)
      : layout_(layout), params_(params), grads_(params.size(), 0.f) {}
  const float* acquire(int b, int) override { return params_.data() + layout_.buckets()[b].begin; }
  void release(int) override {}
  float* grads(int b) override { return grads_.data() + layout_.buckets()[b].begin; }
  void grads_done(int) override {}
  void end_pass() override {}
  const std::vector<float>& all_grads() const { return grads_; }

 private:
  const ParamLayout& layout_;
  std::vector<float> params_, grads_;
};

// issue 33: a bf16 model without a store holds its weights only in bf16 (params() null): what
// set_params and set_params_from_device keep is each value rounded to nearest even (checked by
// value), get_params widens it back, and loss and gradients are the bits of the same model fed
// the same fp32 weights through a store (rounded per block as before), for an even d_model (the
// embedding rows gathered as bf16 pairs) and an odd one (row by row).
TEST(Model, Bf16HoldsItsWeightsOnlyInBf16) {
  for (int64_t d : {48, 47}) {
    ModelConfig cfg = make_config(Case{"x", spec::MlpKind::kSwiGLU, true, 4, 2, true});
    cfg.dtype = spec::DType::kBf16;
    cfg.d_model = d;
    auto backend = cpu_backend();
    LocalAttention attention(backend.get());
    Model flat(cfg, backend.get(), &attention);
    EXPECT_EQ(flat.params(), nullptr);
    ASSERT_NE(flat.params_bf16(), nullptr);
    std::vector<float> params = flat.initial_params(9);
    for (float& x : params) x *= 10.f;  // sharper attention, as ModelVsTorch
    for (size_t i = 0; i < params.size(); i += 7) params[i] += 1e-3f;  // off the bf16 grid
    flat.set_params(params);
    std::vector<float> want(params.size());
    for (size_t i = 0; i < params.size(); ++i) want[i] = round_bf16_by_value(params[i]);
    std::vector<float> got = flat.get_params();
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float))) << "d " << d;
    // The same from backend memory (the trainer's master), after other weights.
    flat.set_params(std::vector<float>(params.size(), 0.5f));
    flat.set_params_from_device(params.data(), static_cast<int64_t>(params.size()));
    got = flat.get_params();
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float))) << "d " << d;

    HostBatch hb = make_batch(96, cfg.vocab, true, 3);
    flat.zero_grads();
    const LossResult a = flat.forward_backward(hb.batch(), hb.valid);
    const std::vector<float> ga = flat.get_grads();
    ParamLayout layout(cfg);
    HostStore store(layout, params);
    Model blocks(cfg, backend.get(), &attention, &store);
    const LossResult b = blocks.forward_backward(hb.batch(), hb.valid);
    EXPECT_EQ(a.loss_sum, b.loss_sum) << "d " << d;
    ASSERT_EQ(ga.size(), store.all_grads().size());
    EXPECT_EQ(0, std::memcmp(ga.data(), store.all_grads().data(), ga.size() * sizeof(float)))
        << "d " << d;
    EXPECT_TRUE(std::isfinite(a.loss_sum) && a.loss_sum > 0);
  }
}

TEST(Model, InitIsDeterministicAndSeedDependent) {
  ModelConfig cfg = make_config(Case{"x", spec::MlpKind::kGelu, false, 4, 2, false});
  auto backend = cpu_backend();
  LocalAttention attention(backend.get());
  Model a(cfg, backend.get(), &attention), b(cfg, backend.get(), &attention);
  a.init_params(3);
  b.init_params(3);
  EXPECT_EQ(a.get_params(), b.get_params());
  b.init_params(4);
  EXPECT_NE(a.get_params(), b.get_params());
  // Spread: embedding std ~0.02, norm gains exactly 1.
  std::vector<float> p = a.get_params();
  const ParamView& e = a.layout().view("embedding.weight");
  double ss = 0;
  for (int64_t i = 0; i < e.size; ++i) ss += double(p[e.offset + i]) * p[e.offset + i];
  EXPECT_NEAR(std::sqrt(ss / e.size), 0.02, 0.002);
  EXPECT_EQ(p[a.layout().offset("final_norm.gain")], 1.f);
}

// Any range of the initial weights (shard full initialises one node's range, cutting tensors
// anywhere) is that slice of the whole.
TEST(Model, InitialParamsOfARangeAreTheSlice) {
  ModelConfig cfg = make_config(Case{"x", spec::MlpKind::kGelu, false, 4, 2, false});
  auto backend = cpu_backend();
  LocalAttention attention(backend.get());
  Model m(cfg, backend.get(), &attention);
  const std::vector<float> whole = m.initial_params(7);
  const int64_t n = m.layout().total();
  for (const auto& [b, e] : std::vector<std::pair<int64_t, int64_t>>{
           {0, n}, {0, 1}, {5, 37}, {n / 3, 2 * n / 3}, {n - 3, n}, {n, n}}) {
    std::vector<float> part(static_cast<size_t>(e - b) + 1, -9.f);
    m.initial_params(7, b, e, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end() - 1, whole.begin() + b)) << b << ", " << e;
    EXPECT_EQ(part.back(), -9.f);  // nothing written past the range
  }
  std::vector<float> one(1);
  EXPECT_THROW(m.initial_params(7, n, n + 1, one.data()), ModelError);
}

TEST(Model, RejectsBadTokenIds) {
  ModelConfig cfg = make_config(Case{"x", spec::MlpKind::kGelu, false, 4, 2, false});
  auto backend = cpu_backend();
  LocalAttention attention(backend.get());
  Model model(cfg, backend.get(), &attention);
  HostBatch hb = make_batch(16, cfg.vocab, false, 1);
  hb.ids[3] = static_cast<int32_t>(cfg.vocab);
  EXPECT_THROW(model.forward_backward(hb.batch(), 10), ModelError);
}

}  // namespace
}  // namespace ring::model
