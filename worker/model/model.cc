#include "worker/model/model.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "common/contract/timeline.h"
#include "worker/data/shuffle.h"

namespace ring::model {
namespace timeline = contract::timeline;
namespace {

// Uniform in (0, 1) from the top 53 bits; never 0 so log() is finite.
double uniform_open(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// n normal values with standard deviation `std` (Box-Muller, both outputs used).
void fill_normal(uint64_t seed, float std, int64_t n, float* out) {
  std::mt19937_64 rng(seed);
  constexpr double kTwoPi = 6.283185307179586476925;
  for (int64_t i = 0; i < n; i += 2) {
    double r = std::sqrt(-2.0 * std::log(uniform_open(rng)));
    double t = kTwoPi * uniform_open(rng);
    out[i] = static_cast<float>(std * r * std::cos(t));
    if (i + 1 < n) out[i + 1] = static_cast<float>(std * r * std::sin(t));
  }
}

// bf16 weights: host fp32 goes through staging_ in chunks, so the model never holds an fp32 copy
// of the whole model, on the host or the device: n / 16 floats, at least 1 MiB and at most 64 MiB
// (a device copies a 7B model in about 400 chunks).
int64_t staging_floats(int64_t n) {
  return std::clamp<int64_t>(n / 16, int64_t{1} << 18, int64_t{1} << 24);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Model::Model(const ModelConfig& config, kernels::Backend* backend, AttentionExecutor* attention,
             BlockStore* store)
    : config_(config), layout_(config), backend_(backend), attention_(attention), store_(store) {
  rope_.theta = static_cast<double>(config_.rope_theta);
  rope_.scaling = static_cast<kernels::RopeScaling>(config_.rope_scaling);
  rope_.factor = config_.rope_scaling_factor;
  rope_.original_context = config_.rope_original_context;
  rope_.low_freq_factor = config_.rope_low_freq_factor;
  rope_.high_freq_factor = config_.rope_high_freq_factor;
  rope_.beta_fast = config_.rope_beta_fast;
  rope_.beta_slow = config_.rope_beta_slow;
  if (!kernels::rope_params_valid(rope_))
    throw ModelError("model config: invalid RoPE scaling parameters (see model.rope_*)");
  const std::string mlp_gate = config_.mlp == spec::MlpKind::kSwiGLU ? "mlp.w_gate" : "";
  off_.resize(config_.layers);
  for (int l = 0; l < config_.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerOffsets& o = off_[l];
    const int64_t b = layout_.layer_bucket(l).begin;
    o.attn_norm = layout_.offset(p + "attn_norm.gain") - b;
    o.wq = layout_.offset(p + "attn.wq") - b;
    o.wk = layout_.offset(p + "attn.wk") - b;
    o.wv = layout_.offset(p + "attn.wv") - b;
    o.wo = layout_.offset(p + "attn.wo") - b;
    o.mlp_norm = layout_.offset(p + "mlp_norm.gain") - b;
    o.w_gate = mlp_gate.empty() ? -1 : layout_.offset(p + mlp_gate) - b;
    o.w_up = layout_.offset(p + "mlp.w_up") - b;
    o.w_down = layout_.offset(p + "mlp.w_down") - b;
  }
  const int64_t head_b = layout_.head_bucket().begin, emb_b = layout_.embedding_bucket().begin;
  off_final_norm_ = layout_.offset("final_norm.gain") - head_b;
  off_embedding_ = layout_.offset("embedding.weight") - emb_b;
  off_head_ = config_.tie_embeddings ? off_embedding_ : layout_.offset("lm_head.weight") - head_b;
  bf16_ = config_.dtype == spec::DType::kBf16;
  if (config_.dtype != spec::DType::kFp32 && !bf16_)
    throw ModelError(std::string("model.dtype ") + spec::to_string(config_.dtype) +
                     ": the model computes fp32 or bf16");
  if (bf16_ && store_) bf16_slots_.resize(4);  // the model holds at most 3 blocks at once
  if (bf16_ && !backend_->supports(kernels::Op::kGemm, kernels::DType::kBF16))
    throw ModelError(std::string("model.dtype bf16: backend ") + backend_->name() +
                     " has no bf16 GEMM");
  if (!store_) {
    if (bf16_) {  // the weights only in bf16 (see the top of model.h)
      params_bf16_.resize(backend_, layout_.total());
      for (int l = 0; l < config_.layers; ++l) {
        const int64_t b = layout_.layer_bucket(l).begin;
        gain_offsets_.push_back(b + off_[l].attn_norm);
        gain_offsets_.push_back(b + off_[l].mlp_norm);
      }
      gain_offsets_.push_back(head_b + off_final_norm_);
      gains_.resize(backend_, static_cast<int64_t>(gain_offsets_.size()) * config_.d_model);
      // Zeros, as an fp32 model starts, without a host vector of the whole model.
      const int64_t n = layout_.total(), chunk = staging_floats(n);
      staging_.resize(backend_, std::min(n, chunk));
      check_status(backend_->fill(staging_.size(), 0.f, staging_.data()), "fill");
      for (int64_t i = 0; i < n; i += chunk)
        check_status(backend_->convert(kernels::DType::kF32, kernels::DType::kBF16,
                                       std::min(chunk, n - i), staging_.data(),
                                       params_bf16_.data() + i),
                     "convert");
      widen_gains();
    } else {
      params_.resize(backend_, layout_.total());
      check_status(backend_->fill(layout_.total(), 0.f, params_.data()), "fill");
    }
    grads_.resize(backend_, layout_.total());
    zero_grads();
  }
  xs_.resize(config_.layers + 1);
  full_recompute_ =
      config_.recompute && config_.recompute_policy == spec::RecomputePolicy::kFull;
  selective_ =
      config_.recompute && config_.recompute_policy == spec::RecomputePolicy::kSelective;
  acts_.resize(full_recompute_ ? 1 : config_.layers);
  compact_ = bf16_ && !full_recompute_;
}

void Model::require_flat(const char* what) const {
  if (store_) {
    throw ModelError(std::string(what) +
                     ": this model has no flat weight or gradient buffer (its blocks come from a "
                     "block store, parallel.shard full)");
  }
}

void Model::init_params(uint64_t seed) {
  require_flat("init_params");
  set_params(initial_params(seed));
}

std::vector<float> Model::initial_params(uint64_t seed) const {
  std::vector<float> host(layout_.total(), 0.f);
  initial_params(seed, 0, layout_.total(), host.data());
  return host;
}

void Model::initial_params(uint64_t seed, int64_t begin, int64_t end, float* out) const {
  if (begin < 0 || end < begin || end > layout_.total()) {
    throw ModelError("initial_params: range [" + std::to_string(begin) + ", " +
                     std::to_string(end) + ") is outside the " + std::to_string(layout_.total()) +
                     " floats of the layout");
  }
  std::fill(out, out + (end - begin), 0.f);  // the alignment gaps
  const float kStd = 0.02f;
  const float out_std = kStd / std::sqrt(2.f * static_cast<float>(config_.layers));
  const auto& views = layout_.views();
  std::vector<float> whole;  // a tensor cut by the range: drawn whole, then its part copied
  for (size_t i = 0; i < views.size(); ++i) {
    const ParamView& v = views[i];
    const int64_t lo = std::max(begin, v.offset), hi = std::min(end, v.offset + v.size);
    if (lo >= hi) continue;
    float* dst = out + (lo - begin);
    if (ends_with(v.name, ".gain")) {
      std::fill(dst, dst + (hi - lo), 1.f);
      continue;
    }
    const bool residual_out = ends_with(v.name, ".wo") || ends_with(v.name, ".w_down");
    const uint64_t stream = data::mix64(seed ^ data::mix64(i + 1));
    const float sd = residual_out ? out_std : kStd;
    if (lo == v.offset && hi == v.offset + v.size) {
      fill_normal(stream, sd, v.size, dst);
    } else {
      whole.resize(static_cast<size_t>(v.size));
      fill_normal(stream, sd, v.size, whole.data());
      std::copy(whole.begin() + (lo - v.offset), whole.begin() + (hi - v.offset), dst);
    }
  }
}

void Model::set_params(const std::vector<float>& host) {
  require_flat("set_params");
  if (static_cast<int64_t>(host.size()) != layout_.total()) {
    throw ModelError("set_params: expected " + std::to_string(layout_.total()) + " floats, got " +
                     std::to_string(host.size()));
  }
  set_params(host.data(), layout_.total());
}

void Model::set_params(const float* host, int64_t n) {
  require_flat("set_params");
  if (n != layout_.total()) {
    throw ModelError("set_params: expected " + std::to_string(layout_.total()) + " floats, got " +
                     std::to_string(n));
  }
  if (bf16_) {
    round_into_params(host, n, false);
    return;
  }
  check_status(backend_->copy_to_device(params_.data(), host, params_.bytes()), "copy_to_device");
}

void Model::set_params_from_device(const float* src, int64_t n) {
  require_flat("set_params_from_device");
  if (n != layout_.total()) {
    throw ModelError("set_params_from_device: expected " + std::to_string(layout_.total()) +
                     " floats, got " + std::to_string(n));
  }
  if (bf16_) {
    round_into_params(src, n, true);
    return;
  }
  check_status(backend_->convert(kernels::DType::kF32, kernels::DType::kF32, n, src,
                                 params_.data()),
               "convert");
}

void Model::round_into_params(const float* src, int64_t n, bool on_device) {
  if (on_device) {
    check_status(backend_->convert(kernels::DType::kF32, kernels::DType::kBF16, n, src,
                                   params_bf16_.data()),
                 "convert");
  } else {
    const int64_t chunk = staging_floats(n);
    staging_.resize(backend_, std::min(n, chunk));
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t c = std::min(chunk, n - i);
      check_status(backend_->copy_to_device(staging_.data(), src + i,
                                            static_cast<size_t>(c) * sizeof(float)),
                   "copy_to_device");
      check_status(backend_->convert(kernels::DType::kF32, kernels::DType::kBF16, c,
                                     staging_.data(), params_bf16_.data() + i),
                   "convert");
    }
  }
  widen_gains();
}

void Model::widen_gains() {
  const int64_t d = config_.d_model;
  for (size_t i = 0; i < gain_offsets_.size(); ++i) {
    check_status(backend_->convert(kernels::DType::kBF16, kernels::DType::kF32, d,
                                   params_bf16_.data() + gain_offsets_[i],
                                   gains_.data() + static_cast<int64_t>(i) * d),
                 "convert");
  }
}

void Model::copy_grads_to_host(int64_t begin, int64_t end, float* dst) const {
  require_flat("copy_grads_to_host");
  if (begin < 0 || end < begin || end > layout_.total()) {
    throw ModelError("copy_grads_to_host: range [" + std::to_string(begin) + ", " +
                     std::to_string(end) + ") is outside the " + std::to_string(layout_.total()) +
                     " floats of the gradient buffer");
  }
  check_status(backend_->copy_to_host(dst, grads_.data() + begin,
                                      static_cast<size_t>(end - begin) * sizeof(float)),
               "copy_to_host");
}

std::vector<float> Model::get_params() const {
  require_flat("get_params");
  std::vector<float> host(layout_.total());
  if (!bf16_) {
    check_status(backend_->copy_to_host(host.data(), params_.data(), params_.bytes()),
                 "copy_to_host");
    return host;
  }
  // bf16: widened (exact) chunk by chunk through a staging buffer of its own (a const call).
  const int64_t n = layout_.total(), chunk = staging_floats(n);
  DeviceArray<float> st(backend_, std::min(n, chunk));
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t c = std::min(chunk, n - i);
    check_status(backend_->convert(kernels::DType::kBF16, kernels::DType::kF32, c,
                                   params_bf16_.data() + i, st.data()),
                 "convert");
    check_status(backend_->copy_to_host(host.data() + i, st.data(),
                                        static_cast<size_t>(c) * sizeof(float)),
                 "copy_to_host");
  }
  return host;
}

std::vector<float> Model::get_grads() const {
  require_flat("get_grads");
  std::vector<float> host(layout_.total());
  check_status(backend_->copy_to_host(host.data(), grads_.data(), grads_.bytes()),
               "copy_to_host");
  return host;
}

void Model::zero_grads() {
  if (store_) return;  // the store hands out zeroed block gradients
  check_status(backend_->fill(layout_.total(), 0.f, grads_.data()), "fill");
}

void Model::begin_pass(const Batch& batch, int64_t global_valid, const char* what) {
  if (global_valid < 1) throw ModelError(std::string(what) + ": global_valid must be >= 1");
  prepare(batch);
}

const float* Model::gain(const Weights& w, int64_t off) const {
  if (w.f32) return w.f32 + off;
  const int64_t at = w.begin + off;
  for (size_t i = 0; i < gain_offsets_.size(); ++i)
    if (gain_offsets_[i] == at) return gains_.data() + static_cast<int64_t>(i) * config_.d_model;
  throw ModelError("bf16: no fp32 copy of the gain at float " + std::to_string(at));
}

const void* Model::gemm_weight(const Weights& w, int64_t off) const {
  if (bf16_) return w.bf16 + off;
  return w.f32 + off;
}

const uint16_t* Model::to_bf16(const float* x, int64_t n, DeviceArray<uint16_t>& scratch) {
  scratch.resize(backend_, n);
  check_status(backend_->convert(kernels::DType::kF32, kernels::DType::kBF16, n, x,
                                 scratch.data()),
               "convert");
  return scratch.data();
}

void Model::linear(const float* x, const uint16_t* xb, const Weights& w, int64_t off,
                   int64_t out, int64_t in, float* y) {
  if (bf16_) {
    check_status(backend_->gemm_mixed(kernels::DType::kBF16, kernels::DType::kF32, false, true, t_,
                                      out, in, 1.f, xb ? xb : to_bf16(x, t_ * in, a_bf16_), in,
                                      gemm_weight(w, off), in, 0.f, y, out),
                 "gemm (bf16)");
    return;
  }
  check_status(backend_->gemm(kernels::DType::kF32, false, true, t_, out, in, 1.f, x, in,
                              gemm_weight(w, off), in, 0.f, y, out),
               "gemm");
}

void Model::linear_dx(const float* dy, const Weights& w, int64_t off, int64_t out, int64_t in,
                      float beta, float* dx) {
  if (bf16_) {
    check_status(backend_->gemm_mixed(kernels::DType::kBF16, kernels::DType::kF32, false, false,
                                      t_, in, out, 1.f, to_bf16(dy, t_ * out, a_bf16_), out,
                                      gemm_weight(w, off), in, beta, dx, in),
                 "gemm (bf16)");
    return;
  }
  check_status(backend_->gemm(kernels::DType::kF32, false, false, t_, in, out, 1.f, dy, out,
                              gemm_weight(w, off), in, beta, dx, in),
               "gemm");
}

void Model::linear_dw(const float* dy, const float* x, const uint16_t* xb, int64_t out,
                      int64_t in, float* dw) {
  if (bf16_) {
    check_status(backend_->gemm_mixed(kernels::DType::kBF16, kernels::DType::kF32, true, false,
                                      out, in, t_, 1.f, to_bf16(dy, t_ * out, a_bf16_), out,
                                      xb ? xb : to_bf16(x, t_ * in, b_bf16_), in, 1.f, dw, in),
                 "gemm (bf16)");
    return;
  }
  check_status(backend_->gemm(kernels::DType::kF32, true, false, out, in, t_, 1.f, dy, out, x, in,
                              1.f, dw, in),
               "gemm");
}

void Model::ensure(LayerActs& a, ActsKind kind) {
  const int64_t t = t_, d = config_.d_model, f = config_.mlp_hidden;
  const int64_t qd = config_.q_dim(), kvd = config_.kv_dim();
  // attn: q, k, v, o (and lse unless the work set); norms: h1, h2 (and the rest likewise).
  const bool attn = kind != ActsKind::kMidFp32 && kind != ActsKind::kMidBf16;
  const bool norms = kind != ActsKind::kAttnFp32 && kind != ActsKind::kAttnBf16;
  const bool b16 = kind == ActsKind::kBf16Saved || kind == ActsKind::kAttnBf16 ||
                   kind == ActsKind::kMidBf16;
  if (norms && b16) {
    a.h1_b.resize(backend_, t * d);
    a.h2_b.resize(backend_, t * d);
  } else if (norms) {
    a.h1.resize(backend_, t * d);
    a.h2.resize(backend_, t * d);
  }
  if (attn && b16) {
    a.q_b.resize(backend_, t * qd);
    a.k_b.resize(backend_, t * kvd);
    a.v_b.resize(backend_, t * kvd);
    a.o_b.resize(backend_, t * qd);
  } else if (attn) {
    a.q.resize(backend_, t * qd);
    a.k.resize(backend_, t * kvd);
    a.v.resize(backend_, t * kvd);
    a.o.resize(backend_, t * qd);
  }
  if (kind == ActsKind::kWork) return;
  if (attn) a.lse.resize(backend_, t * config_.heads);
  if (!norms) return;
  a.x_mid.resize(backend_, t * d);
  if (config_.mlp == spec::MlpKind::kSwiGLU) a.gate.resize(backend_, t * f);
  a.up.resize(backend_, t * f);
  a.rstd1.resize(backend_, t);
  a.rstd2.resize(backend_, t);
}

int64_t Model::activation_bytes() const {
  int64_t n = 0;
  auto add = [&n](const LayerActs& a) {
    for (const DeviceArray<float>* x : {&a.h1, &a.q, &a.k, &a.v, &a.o, &a.lse, &a.x_mid, &a.h2,
                                        &a.gate, &a.up, &a.rstd1, &a.rstd2})
      n += static_cast<int64_t>(x->bytes());
    for (const DeviceArray<uint16_t>* x : {&a.h1_b, &a.q_b, &a.k_b, &a.v_b, &a.o_b, &a.h2_b})
      n += static_cast<int64_t>(x->bytes());
  };
  for (const LayerActs& a : acts_) add(a);
  add(work_);
  add(sel_);
  for (const DeviceArray<float>& x : xs_) n += static_cast<int64_t>(x.bytes());
  return n;
}

void Model::prepare(const Batch& b) {
  if (b.tokens < 1 || b.ids == nullptr || b.labels == nullptr || b.positions == nullptr) {
    throw ModelError("batch: tokens >= 1 and ids, labels, positions are required");
  }
  t_ = b.tokens;
  host_ids_ = b.ids;
  const int64_t t = t_, d = config_.d_model, f = config_.mlp_hidden;
  ids_.resize(backend_, t);
  labels_.resize(backend_, t);
  pos_.resize(backend_, t);
  has_docs_ = b.doc_ids != nullptr;
  check_status(backend_->copy_to_device(ids_.data(), b.ids, ids_.bytes()), "copy_to_device");
  check_status(backend_->copy_to_device(labels_.data(), b.labels, labels_.bytes()),
               "copy_to_device");
  check_status(backend_->copy_to_device(pos_.data(), b.positions, pos_.bytes()),
               "copy_to_device");
  if (has_docs_) {
    docs_.resize(backend_, t);
    check_status(backend_->copy_to_device(docs_.data(), b.doc_ids, docs_.bytes()),
                 "copy_to_device");
  }
  for (auto& x : xs_) x.resize(backend_, t * d);
  const ActsKind per_layer = selective_ ? (compact_ ? ActsKind::kAttnBf16 : ActsKind::kAttnFp32)
                                        : (compact_ ? ActsKind::kBf16Saved : ActsKind::kFp32);
  for (auto& a : acts_) ensure(a, per_layer);
  if (selective_) ensure(sel_, compact_ ? ActsKind::kMidBf16 : ActsKind::kMidFp32);
  if (compact_) ensure(work_, ActsKind::kWork);
  xf_.resize(backend_, t * d);
  rstd_f_.resize(backend_, t);
  logits_.resize(backend_, t * config_.vocab);
  dx_.resize(backend_, t * d);
  dtmp_.resize(backend_, t * d);
  dh_.resize(backend_, t * d);
  act_.resize(backend_, t * f);
  dact_.resize(backend_, t * f);
  dup_.resize(backend_, t * f);
  if (config_.mlp == spec::MlpKind::kSwiGLU) dgate_.resize(backend_, t * f);
  dq_.resize(backend_, t * config_.q_dim());
  do_.resize(backend_, t * config_.q_dim());
  dk_.resize(backend_, t * config_.kv_dim());
  dv_.resize(backend_, t * config_.kv_dim());
}

AttentionCall Model::attention_call(int l, LayerActs& a) const {
  AttentionCall c;
  c.layer = l;
  c.tokens = t_;
  c.heads = config_.heads;
  c.kv_heads = config_.kv_heads;
  c.head_dim = config_.head_dim;
  c.scale = 1.f / std::sqrt(static_cast<float>(config_.head_dim));
  c.positions = pos_.data();
  c.doc_ids = has_docs_ ? docs_.data() : nullptr;
  c.q = a.q.data();
  c.k = a.k.data();
  c.v = a.v.data();
  return c;
}

Model::Weights Model::acquire(const GradBucket& b, int next) {
  if (!store_) {
    if (bf16_) return {.begin = b.begin, .bf16 = params_bf16_.data() + b.begin};
    return {.begin = b.begin, .f32 = params_.data() + b.begin};
  }
  // A bf16 block (shard full's bf16 gathers) is widened, exactly; an fp32 one rounded below.
  const uint16_t* bits = bf16_ ? store_->acquire_bf16(b.index, next) : nullptr;
  const float* w = bits ? nullptr : store_->acquire(b.index, next);
  if (!bf16_) return {.begin = b.begin, .f32 = w};
  auto free_slot = std::find_if(bf16_slots_.begin(), bf16_slots_.end(),
                                [](const Bf16Slot& x) { return x.bucket < 0; });
  if (free_slot == bf16_slots_.end())
    throw ModelError("bf16: more blocks held at once than the model's slots");
  Bf16Slot& k = *free_slot;
  k.bucket = b.index;
  k.n = b.end - b.begin;
  k.rounded.resize(backend_, k.n);
  k.bits.resize(backend_, k.n);
  if (bits) {
    check_status(backend_->convert(kernels::DType::kBF16, kernels::DType::kBF16, k.n, bits,
                                   k.bits.data()),
                 "convert");
    check_status(backend_->convert(kernels::DType::kBF16, kernels::DType::kF32, k.n, bits,
                                   k.rounded.data()),
                 "convert");
    return {.begin = b.begin, .f32 = k.rounded.data(), .bf16 = k.bits.data()};
  }
  check_status(backend_->convert(kernels::DType::kF32, kernels::DType::kF32, k.n, w,
                                 k.rounded.data()),
               "convert");
  check_status(backend_->round_to_bf16(k.n, k.rounded.data()), "round_to_bf16");
  check_status(backend_->convert(kernels::DType::kF32, kernels::DType::kBF16, k.n,
                                 k.rounded.data(), k.bits.data()),
               "convert");
  return {.begin = b.begin, .f32 = k.rounded.data(), .bf16 = k.bits.data()};
}
void Model::release(const GradBucket& b) {
  if (!store_) return;
  store_->release(b.index);
  for (Bf16Slot& k : bf16_slots_)
    if (k.bucket == b.index) k.bucket = -1;
}
float* Model::block_grads(const GradBucket& b) {
  return store_ ? store_->grads(b.index) : grads_.data() + b.begin;
}
void Model::grads_done(const GradBucket& b) {
  if (store_) store_->grads_done(b.index);
}

void Model::embed_forward(const Weights& we) {
  const int64_t t = t_, d = config_.d_model, v = config_.vocab;
  if (we.f32) {
    check_status(backend_->embedding_forward(t, v, d, ids_.data(), we.f32 + off_embedding_,
                                             xs_[0].data()),
                 "embedding_forward");
    return;
  }
  // bf16 weights only: the rows gathered as bf16, then widened (exact). With d even (and the
  // table at an even offset: the layout aligns every tensor) a bf16 row is d / 2 fp32-sized
  // words, which the backend's gather copies bit for bit (out[i, :] = table[ids[i], :]). The
  // rows go through a_bf16_ (GEMM operand scratch, free at this point of the pass).
  const uint16_t* table = we.bf16 + off_embedding_;
  DeviceArray<uint16_t>& rows = a_bf16_;
  rows.resize(backend_, t * d);
  if (d % 2 == 0 && (we.begin + off_embedding_) % 2 == 0) {
    check_status(backend_->embedding_forward(t, v, d / 2, ids_.data(),
                                             reinterpret_cast<const float*>(table),
                                             reinterpret_cast<float*>(rows.data())),
                 "embedding_forward");
  } else {  // odd d: one row at a time, from the batch's host ids
    for (int64_t i = 0; i < t; ++i) {
      const int32_t id = host_ids_[i];
      if (id < 0 || id >= v)
        throw ModelError("batch: token id " + std::to_string(id) + " at " + std::to_string(i) +
                         " is outside [0, vocab " + std::to_string(v) + ")");
      check_status(backend_->convert(kernels::DType::kBF16, kernels::DType::kBF16, d,
                                     table + static_cast<int64_t>(id) * d,
                                     rows.data() + i * d),
                   "convert");
    }
  }
  check_status(backend_->convert(kernels::DType::kBF16, kernels::DType::kF32, t * d,
                                 rows.data(), xs_[0].data()),
               "convert");
}

void Model::norm1_forward(int l, LayerActs& a, const Weights& w) {
  const int64_t t = t_, d = config_.d_model;
  LayerActs& m = mid(a);
  LayerActs& h = norms(a);
  check_status(backend_->rmsnorm_forward(t, d, config_.norm_eps, xs_[l].data(),
                                         gain(w, off_[l].attn_norm), h.h1.data(),
                                         m.rstd1.data()),
               "rmsnorm_forward");
  if (compact_) to_bf16(h.h1.data(), t * d, m.h1_b);
}

void Model::post_attention_forward(int l, LayerActs& a, const Weights& w, const uint16_t* ob) {
  const LayerOffsets& o = off_[l];
  const int64_t t = t_, d = config_.d_model, f = config_.mlp_hidden, qd = config_.q_dim();
  LayerActs& m = mid(a);
  LayerActs& h = norms(a);
  // o: fp32 in the layer's set, or (compact) its bf16 copy ob.
  linear(compact_ ? nullptr : a.o.data(), ob, w, o.wo, d, qd, m.x_mid.data());
  check_status(backend_->add(t * d, xs_[l].data(), m.x_mid.data(), m.x_mid.data()), "add");
  check_status(backend_->rmsnorm_forward(t, d, config_.norm_eps, m.x_mid.data(),
                                         gain(w, o.mlp_norm), h.h2.data(), m.rstd2.data()),
               "rmsnorm_forward");
  const uint16_t* h2b = compact_ ? to_bf16(h.h2.data(), t * d, m.h2_b) : nullptr;
  if (config_.mlp == spec::MlpKind::kSwiGLU)
    linear(h.h2.data(), h2b, w, o.w_gate, f, d, m.gate.data());
  linear(h.h2.data(), h2b, w, o.w_up, f, d, m.up.data());
}

void Model::mlp_out_forward(int l, LayerActs& a, const Weights& w) {
  const int64_t t = t_, d = config_.d_model, f = config_.mlp_hidden;
  LayerActs& m = mid(a);
  if (config_.mlp == spec::MlpKind::kSwiGLU) {
    check_status(backend_->swiglu_forward(t * f, m.gate.data(), m.up.data(), act_.data()),
                 "swiglu_forward");
  } else {
    check_status(backend_->gelu_forward(t * f, m.up.data(), act_.data()), "gelu_forward");
  }
  linear(act_.data(), nullptr, w, off_[l].w_down, d, f, xs_[l + 1].data());
  check_status(backend_->add(t * d, m.x_mid.data(), xs_[l + 1].data(), xs_[l + 1].data()), "add");
}

void Model::layer_recompute(int l, LayerActs& a, const Weights& w) {
  norm1_forward(l, a, w);
  post_attention_forward(l, a, w, compact_ ? a.o_b.data() : nullptr);
}

void Model::layer_forward(int l, LayerActs& a, const Weights& w) {
  const LayerOffsets& o = off_[l];
  const int64_t t = t_, d = config_.d_model;
  const int64_t qd = config_.q_dim(), kvd = config_.kv_dim();
  // h1, q, k, v, o, h2 are computed in fp32 in `c` (q, k, v, o) and norms(a) (h1, h2): the
  // layer's own set (selective: h1, h2 in the shared one), or (compact) the work set shared by
  // all layers, whose values the layer keeps as bf16 copies (a.*_b, mid(a).h1_b / h2_b). GEMMs
  // read the kept copy of their input where there is one.
  LayerActs& c = compact_ ? work_ : a;
  norm1_forward(l, a, w);
  const float* h1 = norms(a).h1.data();
  const uint16_t* h1b = compact_ ? mid(a).h1_b.data() : nullptr;
  linear(h1, h1b, w, o.wq, qd, d, c.q.data());
  linear(h1, h1b, w, o.wk, kvd, d, c.k.data());
  linear(h1, h1b, w, o.wv, kvd, d, c.v.data());
  check_status(
      backend_->rope(t, config_.heads, config_.head_dim, rope_, pos_.data(), false, c.q.data()),
      "rope");
  check_status(
      backend_->rope(t, config_.kv_heads, config_.head_dim, rope_, pos_.data(), false, c.k.data()),
      "rope");
  if (bf16_) {
    // Q, K, V as bf16 holds them: what attention reads and what the ring sends.
    check_status(backend_->round_to_bf16(t * qd, c.q.data()), "round_to_bf16");
    check_status(backend_->round_to_bf16(t * kvd, c.k.data()), "round_to_bf16");
    check_status(backend_->round_to_bf16(t * kvd, c.v.data()), "round_to_bf16");
  }
  if (compact_) {  // exact: the values are bf16 already
    to_bf16(c.q.data(), t * qd, a.q_b);
    to_bf16(c.k.data(), t * kvd, a.k_b);
    to_bf16(c.v.data(), t * kvd, a.v_b);
  }
  attention_->forward(attention_call(l, c), c.o.data(), a.lse.data());
  // bf16: o rounded once, what the wo GEMM reads and what the backward uses (kept as bf16).
  const uint16_t* ob = compact_ ? to_bf16(c.o.data(), t * qd, a.o_b) : nullptr;
  if (bf16_ && !compact_)
    check_status(backend_->round_to_bf16(t * qd, c.o.data()), "round_to_bf16");
  post_attention_forward(l, a, w, ob);
  mlp_out_forward(l, a, w);
}

void Model::layer_backward(int l, LayerActs& a, const Weights& w, float* gr) {
  // In: dx_ = dL/d(block output) [T, d]. Out: dx_ = dL/d(block input).
  const LayerOffsets& o = off_[l];
  const int64_t t = t_, d = config_.d_model, f = config_.mlp_hidden;
  const int64_t qd = config_.q_dim(), kvd = config_.kv_dim();
  // The saved GEMM inputs h1, h2, o: fp32 in the layer's set, or (compact) their bf16 copies,
  // which the bf16 GEMMs read as they are.
  // Selective: h1, h2, x_mid, gate/up and rstd are in the shared set (layer_recompute's).
  LayerActs& m = mid(a);
  const float* h1 = compact_ ? nullptr : m.h1.data();
  const float* h2 = compact_ ? nullptr : m.h2.data();
  const uint16_t* h1b = compact_ ? m.h1_b.data() : nullptr;
  const uint16_t* h2b = compact_ ? m.h2_b.data() : nullptr;
  const uint16_t* ob = compact_ ? a.o_b.data() : nullptr;

  // MLP. act = silu(gate) * up or gelu(up) is recomputed (cheap) rather than kept per layer.
  if (config_.mlp == spec::MlpKind::kSwiGLU) {
    check_status(backend_->swiglu_forward(t * f, m.gate.data(), m.up.data(), act_.data()),
                 "swiglu_forward");
  } else {
    check_status(backend_->gelu_forward(t * f, m.up.data(), act_.data()), "gelu_forward");
  }
  linear_dw(dx_.data(), act_.data(), nullptr, d, f, gr + o.w_down);
  linear_dx(dx_.data(), w, o.w_down, d, f, 0.f, dact_.data());  // [T, f]
  if (config_.mlp == spec::MlpKind::kSwiGLU) {
    check_status(backend_->swiglu_backward(t * f, m.gate.data(), m.up.data(), dact_.data(),
                                           dgate_.data(), dup_.data()),
                 "swiglu_backward");
    linear_dw(dgate_.data(), h2, h2b, f, d, gr + o.w_gate);
    linear_dw(dup_.data(), h2, h2b, f, d, gr + o.w_up);
    linear_dx(dgate_.data(), w, o.w_gate, f, d, 0.f, dh_.data());
    linear_dx(dup_.data(), w, o.w_up, f, d, 1.f, dh_.data());
  } else {
    check_status(backend_->gelu_backward(t * f, m.up.data(), dact_.data(), dup_.data()),
                 "gelu_backward");
    linear_dw(dup_.data(), h2, h2b, f, d, gr + o.w_up);
    linear_dx(dup_.data(), w, o.w_up, f, d, 0.f, dh_.data());
  }
  check_status(backend_->rmsnorm_backward(t, d, m.x_mid.data(), gain(w, o.mlp_norm),
                                          m.rstd2.data(), dh_.data(), dtmp_.data(),
                                          gr + o.mlp_norm),
               "rmsnorm_backward");
  check_status(backend_->add(t * d, dx_.data(), dtmp_.data(), dx_.data()), "add");  // dL/dx_mid

  // Attention. Compact: q, k, v, o widened into the work set (exact) for the executor.
  LayerActs& c = compact_ ? work_ : a;
  if (compact_) {
    auto widen = [&](const DeviceArray<uint16_t>& from, int64_t n, DeviceArray<float>& to) {
      check_status(backend_->convert(kernels::DType::kBF16, kernels::DType::kF32, n, from.data(),
                                     to.data()),
                   "convert");
    };
    widen(a.q_b, t * qd, c.q);
    widen(a.k_b, t * kvd, c.k);
    widen(a.v_b, t * kvd, c.v);
    widen(a.o_b, t * qd, c.o);
  }
  linear_dw(dx_.data(), compact_ ? nullptr : a.o.data(), ob, d, qd, gr + o.wo);
  linear_dx(dx_.data(), w, o.wo, d, qd, 0.f, do_.data());  // [T, H, hd]
  attention_->backward(attention_call(l, c), c.o.data(), a.lse.data(), do_.data(), dq_.data(),
                       dk_.data(), dv_.data());
  // RoPE is a rotation (times yarn's attention factor): its backward is the transpose.
  check_status(
      backend_->rope(t, config_.heads, config_.head_dim, rope_, pos_.data(), true, dq_.data()),
      "rope");
  check_status(
      backend_->rope(t, config_.kv_heads, config_.head_dim, rope_, pos_.data(), true, dk_.data()),
      "rope");
  linear_dw(dq_.data(), h1, h1b, qd, d, gr + o.wq);
  linear_dw(dk_.data(), h1, h1b, kvd, d, gr + o.wk);
  linear_dw(dv_.data(), h1, h1b, kvd, d, gr + o.wv);
  linear_dx(dq_.data(), w, o.wq, qd, d, 0.f, dh_.data());
  linear_dx(dk_.data(), w, o.wk, kvd, d, 1.f, dh_.data());
  linear_dx(dv_.data(), w, o.wv, kvd, d, 1.f, dh_.data());
  check_status(backend_->rmsnorm_backward(t, d, xs_[l].data(), gain(w, o.attn_norm),
                                          m.rstd1.data(), dh_.data(), dtmp_.data(),
                                          gr + o.attn_norm),
               "rmsnorm_backward");
  check_status(backend_->add(t * d, dx_.data(), dtmp_.data(), dx_.data()), "add");
}

LossResult Model::head_forward(int64_t global_valid, bool with_grad, const Weights& wh,
                               const Weights& we) {
  const int64_t t = t_, d = config_.d_model, v = config_.vocab;
  check_status(backend_->rmsnorm_forward(t, d, config_.norm_eps, xs_[config_.layers].data(),
                                         gain(wh, off_final_norm_), xf_.data(), rstd_f_.data()),
               "rmsnorm_forward");
  linear(xf_.data(), nullptr, config_.tie_embeddings ? we : wh, off_head_, v, d, logits_.data());
  LossResult r;
  const float scale = 1.f / static_cast<float>(global_valid);
  check_status(backend_->cross_entropy(t, v, logits_.data(), labels_.data(), scale, &r.loss_sum,
                                       &r.valid, with_grad ? logits_.data() : nullptr),
               "cross_entropy");
  r.loss = r.loss_sum / static_cast<double>(global_valid);
  return r;
}

void Model::head_backward(const Weights& wh, const Weights& we, float* gh, float* ge) {
  // logits_ holds dL/dlogits [T, vocab].
  const int64_t t = t_, d = config_.d_model, v = config_.vocab;
  const bool tied = config_.tie_embeddings;
  linear_dw(logits_.data(), xf_.data(), nullptr, v, d, (tied ? ge : gh) + off_head_);
  linear_dx(logits_.data(), tied ? we : wh, off_head_, v, d, 0.f, dh_.data());
  check_status(backend_->rmsnorm_backward(t, d, xs_[config_.layers].data(),
                                          gain(wh, off_final_norm_),
                                          rstd_f_.data(), dh_.data(), dx_.data(),
                                          gh + off_final_norm_),
               "rmsnorm_backward");
}

LossResult Model::forward(const Batch& batch, int64_t global_valid) {
  begin_pass(batch, global_valid, "forward");
  const int layers = static_cast<int>(config_.layers);
  const bool tied = config_.tie_embeddings;
  const GradBucket& eb = layout_.embedding_bucket();
  const GradBucket& hb = layout_.head_bucket();
  embed_forward(acquire(eb, layers > 0 ? layout_.layer_bucket(0).index : hb.index));
  release(eb);
  for (int l = 0; l < layers; ++l) {
    const GradBucket& lb = layout_.layer_bucket(l);
    layer_forward(l, acts_[full_recompute_ ? 0 : l],
                  acquire(lb, l + 1 < layers ? layout_.layer_bucket(l + 1).index : hb.index));
    release(lb);
  }
  const Weights wh = acquire(hb, tied ? eb.index : -1);
  const Weights we = tied ? acquire(eb, -1) : Weights{};
  LossResult r = head_forward(global_valid, false, wh, we);
  release(hb);
  if (tied) release(eb);
  if (store_) store_->end_pass();
  return r;
}

LossResult Model::forward_backward(const Batch& batch, int64_t global_valid,
                                   const BucketReadyFn& on_bucket) {
  begin_pass(batch, global_valid, "forward_backward");
  const int layers = static_cast<int>(config_.layers);
  const bool tied = config_.tie_embeddings;
  const GradBucket& eb = layout_.embedding_bucket();
  const GradBucket& hb = layout_.head_bucket();
  // Each layer's forward and backward into the process's timeline (contract/timeline.h), when
  // there is one; the ring hops inside them are recorded by the attention executor.
  timeline::TimelineWriter* tl = timeline::active();
  auto phase = [tl](timeline::Phase kind, int l, int64_t t0) {
    if (tl)
      tl->record({.kind = kind, .step = tl->step(), .layer = l, .begin_ns = t0,
                  .end_ns = timeline::now_ns()});
  };
  auto layer_index = [&](int l) { return l >= 0 && l < layers ? layout_.layer_bucket(l).index : -1; };
  // Blocks with a store: the weights are acquired just before use (and the next block's
  // fetched meanwhile), released after.
  embed_forward(acquire(eb, layers > 0 ? layer_index(0) : hb.index));
  release(eb);
  for (int l = 0; l < layers; ++l) {
    const int64_t t0 = tl ? timeline::now_ns() : 0;
    const GradBucket& lb = layout_.layer_bucket(l);
    layer_forward(l, acts_[full_recompute_ ? 0 : l],
                  acquire(lb, l + 1 < layers ? layer_index(l + 1) : hb.index));
    release(lb);
    phase(timeline::Phase::kForward, l, t0);
  }
  const Weights wh = acquire(hb, tied ? eb.index : layer_index(layers - 1));
  const Weights we = tied ? acquire(eb, layer_index(layers - 1)) : Weights{};
  LossResult r = head_forward(global_valid, true, wh, we);
  // Tied embeddings: the LM head's gradient goes into the embedding's, complete only after the
  // embedding backward at the end.
  float* ge = tied ? block_grads(eb) : nullptr;
  head_backward(wh, we, block_grads(hb), ge);
  release(hb);
  if (tied) release(eb);
  grads_done(hb);
  if (on_bucket) on_bucket(hb);
  for (int l = layers - 1; l >= 0; --l) {
    const int64_t t0 = tl ? timeline::now_ns() : 0;
    LayerActs& a = acts_[full_recompute_ ? 0 : l];
    const GradBucket& lb = layout_.layer_bucket(l);
    const Weights w = acquire(lb, layer_index(l - 1));
    // With recompute the shared activations still hold the last block's forward. Selective
    // re-runs only the block's norms, output projection and gate/up: never the attention.
    if (full_recompute_ && l != layers - 1) layer_forward(l, a, w);
    if (selective_ && l != layers - 1) layer_recompute(l, a, w);
    layer_backward(l, a, w, block_grads(lb));
    release(lb);
    grads_done(lb);
    phase(timeline::Phase::kBackward, l, t0);
    if (on_bucket) on_bucket(lb);
  }
  if (!tied) ge = block_grads(eb);
  check_status(backend_->embedding_backward(t_, config_.vocab, config_.d_model, ids_.data(),
                                            dx_.data(), ge + off_embedding_),
               "embedding_backward");
  grads_done(eb);
  if (on_bucket) on_bucket(eb);
  if (store_) store_->end_pass();
  return r;
}

}  // namespace ring::model
