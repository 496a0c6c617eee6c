#include "worker/generate/generator.h"

#include <chrono>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "common/contract/timeline.h"
#include "worker/data/errors.h"
#include "worker/data/split.h"

namespace ring::gen {

namespace timeline = contract::timeline;
using model::check_status;

// The prefill's attention: hands each layer's K/V to the generator, then computes the attention
// with the wrapped executor. With a flight recorder (a generate rank under ringd), each layer's
// prefill (from the previous layer's attention to this one's end) is recorded as a `forward`
// phase: the rank's progress, and its time sets ringd's hang deadline.
class Generator::Capture final : public model::AttentionExecutor {
 public:
  using Sink = std::function<void(const model::AttentionCall&)>;
  explicit Capture(model::AttentionExecutor* inner) : inner_(inner) {}
  void set_sink(Sink s) {
    sink_ = std::move(s);
    last_ns_ = timeline::now_ns();
  }
  void forward(const model::AttentionCall& call, float* out, float* lse) override {
    if (sink_) sink_(call);
    inner_->forward(call, out, lse);
    if (timeline::TimelineWriter* tl = timeline::active()) {
      const int64_t now = timeline::now_ns();
      tl->record({.kind = timeline::Phase::kForward,
                  .step = tl->step(),
                  .layer = static_cast<int32_t>(call.layer),
                  .begin_ns = last_ns_,
                  .end_ns = now});
      last_ns_ = now;
    }
  }
  void backward(const model::AttentionCall&, const float*, const float*, const float*, float*,
                float*, float*) override {
    throw model::ModelError("generation runs the forward only");
  }
  kernels::AttentionStats stats() const override { return inner_->stats(); }

 private:
  model::AttentionExecutor* inner_;
  Sink sink_;
  int64_t last_ns_ = 0;
};

Generator::Generator(const model::ModelConfig& config, const float* params,
                     kernels::Backend* backend, const GeneratorOptions& options)
    : config_(config), backend_(backend), options_(options) {
  config_.recompute = true;  // prefill keeps one layer's activations
  config_.check();
  if (config_.dtype != spec::DType::kFp32 && config_.dtype != spec::DType::kBf16)
    throw GenerateError(fmt::format(
        "model.dtype {}: generation computes in fp32 or bf16 (docs/precision.md)",
        spec::to_string(config_.dtype)));
  bf16_ = config_.dtype == spec::DType::kBf16;
  // The pages hold K/V as the model computes them: bf16 values in bf16 pages (half the bytes).
  options_.cache.dtype = bf16_ ? kernels::DType::kBF16 : kernels::DType::kF32;
  if (!(options_.approximate >= 0.0 && options_.approximate < 1.0))
    throw GenerateError(fmt::format("approximate threshold {} must be in [0, 1) (0: exact)",
                                    options_.approximate));
  // Where the fast tier and the decode step's dense ops live: options_.device when given (a
  // sharded generation on a device: the ring's prefill runs on the cpu backend `backend`, whose
  // buffers the transports move), else `backend` itself.
  kernels::Backend* dev = options_.device != nullptr ? options_.device : backend_;
  const bool host_backend = std::string(backend_->name()) == "cpu";
  const bool split = dev != backend_;
  const bool dev_is_cpu = std::string(dev->name()) == "cpu";
  if (split && !host_backend)
    throw GenerateError(fmt::format(
        "a fast tier on another backend ('{}') needs the prefill on the cpu backend (asked for "
        "'{}')",
        dev->name(), backend_->name()));
  // A backend other than cpu always holds the fast tier; a cpu one when asked (fast_on_backend,
  // or given as the device: the same code path, for tests and comparisons).
  const bool device_tier = !dev_is_cpu || options_.fast_on_backend || split;
  if (device_tier && !dev->supports(kernels::Op::kPagedDecode, options_.cache.dtype))
    throw GenerateError(fmt::format(
        "generation on the '{}' backend needs its paged decode attention over {} pages for the "
        "fast tier, which it does not implement",
        dev->name(), bf16_ ? "bf16" : "fp32"));
  if (!host_backend && options_.shard.ranks > 1)
    throw GenerateError(fmt::format(
        "generation over {} ranks prefills on the cpu backend (asked for '{}': the ring's "
        "transports move host buffers); the device goes in as the fast tier's backend "
        "(GeneratorOptions::device)",
        options_.shard.ranks, backend_->name()));
  if (dev_is_cpu) {
    // One row per sequence: splitting a one-row product over threads costs more in joins than
    // it saves, so the decode step has a one-thread cpu backend of its own.
    std::string err;
    step_backend_ = kernels::create_backend("cpu", 1, &err);
    if (!step_backend_) throw GenerateError("cannot create the cpu backend: " + err);
    step_ = step_backend_.get();
  } else {
    step_ = dev;  // the device: the dense step runs where the weights are
  }
  if (bf16_ && !step_->supports(kernels::Op::kGemm, kernels::DType::kBF16))
    throw GenerateError(fmt::format(
        "model.dtype bf16: the decode step's backend '{}' has no bf16 GEMM", step_->name()));
  cache_ = std::make_unique<KvCache>(options_.cache, static_cast<int>(config_.layers),
                                     static_cast<int>(config_.kv_heads), config_.head_dim,
                                     device_tier ? dev : nullptr);
  pool_ = std::make_unique<ThreadPool>(options_.threads);
  attention_ = std::make_unique<DecodeAttention>(cache_.get(), pool_.get(), config_.heads,
                                                 config_.kv_heads, config_.head_dim);
  check_shard();
  local_ = std::make_unique<model::LocalAttention>(backend_);
  capture_ = std::make_unique<Capture>(sharded() ? options_.shard.prefill_attention : local_.get());
  model_ = std::make_unique<model::Model>(config_, backend_, capture_.get());
  model_->set_params(params, model_->layout().total());
  const int64_t total = model_->layout().total();
  step_params_ = model_->params();
  if (bf16_ || (step_ == dev && split)) {
    // The decode step's fp32 weights of its own: on the device when the step runs there (the
    // model's are the prefill's, in host memory); for bf16 (whose model holds only bf16
    // weights) rounded once here, the values the prefill reads.
    dev_params_.resize(step_, total);
    check_status(step_->copy_to_device(dev_params_.data(), params, dev_params_.bytes()),
                 "copy_to_device");
    if (bf16_) check_status(step_->round_to_bf16(total, dev_params_.data()), "round_to_bf16");
    step_params_ = dev_params_.data();
  }
  if (bf16_) {
    // The GEMMs' bf16 copy of the (rounded) weights, where the decode step runs: exact.
    step_bf16_.resize(step_, total);
    check_status(step_->convert(kernels::DType::kF32, kernels::DType::kBF16, total, step_params_,
                                step_bf16_.data()),
                 "convert");
  }
  rope_ = model_->rope();  // the same positions as the model's prefill
  const auto& layout = model_->layout();
  const bool swiglu = config_.mlp == spec::MlpKind::kSwiGLU;
  for (int l = 0; l < config_.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    off_.push_back(Off{layout.offset(p + "attn_norm.gain"), layout.offset(p + "attn.wq"),
                       layout.offset(p + "attn.wk"), layout.offset(p + "attn.wv"),
                       layout.offset(p + "attn.wo"), layout.offset(p + "mlp_norm.gain"),
                       swiglu ? layout.offset(p + "mlp.w_gate") : -1,
                       layout.offset(p + "mlp.w_up"), layout.offset(p + "mlp.w_down")});
  }
  off_final_norm_ = layout.offset("final_norm.gain");
  off_embedding_ = layout.offset("embedding.weight");
  off_head_ = config_.tie_embeddings ? off_embedding_ : layout.offset("lm_head.weight");
}

void Generator::check_shard() const {
  const ShardOptions& sh = options_.shard;
  if (sh.ranks < 1 || sh.rank < 0 || sh.rank >= sh.ranks)
    throw GenerateError(fmt::format("shard: rank {} of {} ranks (0 <= rank < ranks)", sh.rank,
                                    sh.ranks));
  if (sh.ranks > 1 && (sh.prefill_attention == nullptr || !sh.all_gather))
    throw GenerateError(fmt::format(
        "shard: {} ranks need the ring's attention executor and an all_gather", sh.ranks));
}

Generator::~Generator() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (seqs_[i].live) release(static_cast<int>(i));
}

void Generator::ingest_layer(Sequence& s, const std::vector<PageKey>& keys, int layer,
                             const float* k, const float* v) {
  // k, v: host [T, kv_heads, head_dim].
  const int64_t t = static_cast<int64_t>(s.ids.size()), pt = cache_->page_tokens();
  const int64_t kvh = config_.kv_heads, hd = config_.head_dim;
  const int64_t npages = (t + pt - 1) / pt;
  for (int64_t h = 0; h < kvh; ++h) {
    auto& list = s.pages[static_cast<size_t>(layer)][static_cast<size_t>(h)];
    for (int64_t p = 0; p < npages; ++p) {
      const int64_t lo = p * pt, hi = std::min(t, lo + pt);
      const bool full = hi - lo == pt;
      const PageKey key = full ? keys[static_cast<size_t>(p * kvh + h)] : PageKey{};
      if (full) {
        const PageId shared = cache_->acquire(key);
        if (shared >= 0) {
          list.push_back(shared);
          continue;
        }
      }
      const PageId id = cache_->create(layer, static_cast<int>(h));
      list.push_back(id);
      for (int64_t i = lo; i < hi; ++i)
        cache_->write_row(id, i - lo, k + (i * kvh + h) * hd, v + (i * kvh + h) * hd,
                          s.docs[static_cast<size_t>(i)]);
      if (full) cache_->seal(id, key);
    }
  }
}

int Generator::open_sequence(const std::vector<int32_t>& ids, const std::vector<int32_t>& docs,
                             std::vector<std::vector<PageKey>>* keys,
                             const std::vector<int64_t>* local) {
  const int64_t t = static_cast<int64_t>(ids.size());
  if (t < 1) throw GenerateError("a prompt needs at least one token");
  if (!docs.empty() && docs.size() != ids.size())
    throw GenerateError("prompt document ids must be one per token");
  for (int32_t id : ids)
    if (id < 0 || id >= config_.vocab)
      throw GenerateError(fmt::format("token id {} is outside the model's vocabulary [0, {})", id,
                                      config_.vocab));
  int handle = -1;
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) handle = static_cast<int>(i);
  if (handle < 0) {
    handle = static_cast<int>(seqs_.size());
    seqs_.emplace_back();
  }
  Sequence& s = seqs_[static_cast<size_t>(handle)];
  s = Sequence{};
  s.live = true;
  const std::vector<int32_t> all_docs =
      docs.empty() ? std::vector<int32_t>(ids.size(), 0) : docs;
  s.total = t;
  s.last_doc = all_docs.back();
  if (local == nullptr) {
    s.ids = ids;
    s.docs = all_docs;
  } else {
    for (int64_t g : *local) {
      s.ids.push_back(ids[static_cast<size_t>(g)]);
      s.docs.push_back(all_docs[static_cast<size_t>(g)]);
    }
  }
  s.pages.assign(static_cast<size_t>(config_.layers),
                 std::vector<std::vector<PageId>>(static_cast<size_t>(config_.kv_heads)));
  const int64_t pt = cache_->page_tokens(), kvh = config_.kv_heads;
  keys->assign(static_cast<size_t>(config_.layers), {});
  auto page_keys = [&] {
    for (int l = 0; l < config_.layers; ++l)
      for (int64_t h = 0; h < kvh; ++h)
        (*keys)[static_cast<size_t>(l)].push_back(s.hash.key(l, static_cast<int>(h)));
  };
  if (local == nullptr) {
    for (int64_t i = 0; i < t; ++i) {
      s.hash.add(s.ids[static_cast<size_t>(i)], s.docs[static_cast<size_t>(i)]);
      if ((i + 1) % pt == 0) page_keys();
    }
  } else {
    // This rank's tokens are keyed by the whole prefix up to each and its position.
    size_t next = 0;
    for (int64_t g = 0; g < t; ++g) {
      s.prefix.add(ids[static_cast<size_t>(g)], all_docs[static_cast<size_t>(g)]);
      if (next < local->size() && (*local)[next] == g) {
        s.hash.add(s.prefix, g);
        ++next;
        if (next % static_cast<size_t>(pt) == 0) page_keys();
      }
    }
  }
  return handle;
}

int Generator::attach(const std::vector<int32_t>& ids, const std::vector<int32_t>& docs,
                      const std::function<void(int layer, float* k, float* v)>& fill) {
  if (sharded())
    throw GenerateError("attach: a sharded generator's pages come from its prefill only");
  std::vector<std::vector<PageKey>> keys;
  const int handle = open_sequence(ids, docs, &keys);
  Sequence& s = seqs_[static_cast<size_t>(handle)];
  const size_t n = ids.size() * static_cast<size_t>(config_.kv_dim());
  std::vector<float> k(n), v(n);
  try {
    for (int l = 0; l < config_.layers; ++l) {
      fill(l, k.data(), v.data());
      ingest_layer(s, keys[static_cast<size_t>(l)], l, k.data(), v.data());
    }
  } catch (...) {
    release(handle);
    throw;
  }
  return handle;
}

int Generator::prefill(const std::vector<int32_t>& ids, const std::vector<int32_t>& docs,
                       std::vector<float>* last_logits) {
  std::vector<std::vector<PageKey>> keys;
  const int64_t t = static_cast<int64_t>(ids.size());
  const ShardOptions& sh = options_.shard;
  // Sharded: this rank's tokens (global indices), cut as training cuts a sequence.
  std::vector<int64_t> local;
  if (sharded()) {
    const bool zigzag = sh.balance == spec::CausalBalance::kZigzag;
    const int64_t need = zigzag ? 2LL * sh.ranks : sh.ranks;
    if (t < need)
      throw GenerateError(fmt::format(
          "a prompt of {} tokens cannot be cut over {} ranks (the {} split needs at least {})", t,
          sh.ranks, spec::to_string(sh.balance), need));
    try {
      local = cp::rank_token_indices(t, sh.ranks, sh.rank, sh.balance);
    } catch (const data::DataError& e) {
      throw GenerateError(fmt::format("prompt of {} tokens over {} ranks: {}", t, sh.ranks,
                                      e.what()));
    }
  }
  const int handle = open_sequence(ids, docs, &keys, sharded() ? &local : nullptr);
  Sequence& s = seqs_[static_cast<size_t>(handle)];
  const int64_t lt = static_cast<int64_t>(s.ids.size());  // this rank's tokens
  std::vector<float> kh, vh;
  capture_->set_sink([&](const model::AttentionCall& c) {
    const size_t n = static_cast<size_t>(c.tokens * c.kv_heads * c.head_dim);
    kh.resize(n);
    vh.resize(n);
    check_status(backend_->copy_to_host(kh.data(), c.k, n * sizeof(float)), "copy_to_host");
    check_status(backend_->copy_to_host(vh.data(), c.v, n * sizeof(float)), "copy_to_host");
    ingest_layer(s, keys[static_cast<size_t>(c.layer)], c.layer, kh.data(), vh.data());
  });
  std::vector<int32_t> labels(s.ids.size(), -1);
  std::vector<int64_t> pos(s.ids.size());
  for (int64_t i = 0; i < lt; ++i)
    pos[static_cast<size_t>(i)] = sharded() ? local[static_cast<size_t>(i)] : i;
  model::Batch b;
  b.tokens = lt;
  b.ids = s.ids.data();
  b.labels = labels.data();
  b.positions = pos.data();
  b.doc_ids = docs.empty() ? nullptr : s.docs.data();
  try {
    model_->forward(b, 1);
  } catch (...) {
    capture_->set_sink({});
    release(handle);
    throw;
  }
  capture_->set_sink({});
  if (sharded()) {
    // The last token's logits, from the rank holding it: [flag, logits] per rank.
    const int64_t vocab = config_.vocab;
    std::vector<float> mine(static_cast<size_t>(vocab + 1), 0.f);
    std::vector<float> all(static_cast<size_t>(sh.ranks * (vocab + 1)));
    if (local.back() == t - 1) {
      mine[0] = 1.f;
      check_status(backend_->copy_to_host(mine.data() + 1, model_->logits() + (lt - 1) * vocab,
                                          static_cast<size_t>(vocab) * sizeof(float)),
                   "copy_to_host");
    }
    sh.all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
    for (int r = 0; r < sh.ranks; ++r) {
      const float* row = all.data() + static_cast<int64_t>(r) * (vocab + 1);
      if (row[0] == 1.f && last_logits != nullptr) last_logits->assign(row + 1, row + 1 + vocab);
    }
  } else if (last_logits != nullptr) {
    last_logits->resize(static_cast<size_t>(config_.vocab));
    check_status(backend_->copy_to_host(last_logits->data(),
                                        model_->logits() + (t - 1) * config_.vocab,
                                        static_cast<size_t>(config_.vocab) * sizeof(float)),
                 "copy_to_host");
  }
  return handle;
}

void Generator::release(int seq) {
  Sequence& s = seqs_[static_cast<size_t>(seq)];
  if (!s.live) return;
  for (auto& layer : s.pages)
    for (auto& head : layer)
      for (PageId id : head) cache_->release(id);
  s = Sequence{};
}

std::vector<PageId> Generator::window_pages() const {
  std::vector<PageId> out;
  const int64_t w = cache_->config().window_tokens(), pt = cache_->page_tokens();
  if (w == 0) return out;
  for (const Sequence& s : seqs_) {
    if (!s.live) continue;
    const int64_t n = static_cast<int64_t>(s.ids.size());
    const int64_t first = std::max<int64_t>(0, n - w) / pt, last = (n - 1) / pt;
    for (const auto& layer : s.pages)
      for (const auto& head : layer)
        for (int64_t p = first; p <= last && p < static_cast<int64_t>(head.size()); ++p)
          out.push_back(head[static_cast<size_t>(p)]);
  }
  return out;
}

void Generator::linear(int64_t rows, const float* x, int64_t off_w, int64_t out, int64_t in,
                       float* y) {
  if (bf16_) {
    // As the model's bf16 GEMM: the input rounded once (the one rounding), bf16 x bf16 with fp32
    // accumulation into fp32.
    x_bf16_.resize(step_, rows * in);
    check_status(step_->convert(kernels::DType::kF32, kernels::DType::kBF16, rows * in, x,
                                x_bf16_.data()),
                 "convert");
    check_status(step_->gemm_mixed(kernels::DType::kBF16, kernels::DType::kF32, false, true, rows,
                                   out, in, 1.f, x_bf16_.data(), in, step_bf16_.data() + off_w,
                                   in, 0.f, y, out),
                 "gemm (bf16)");
    return;
  }
  check_status(step_->gemm(kernels::DType::kF32, false, true, rows, out, in, 1.f, x, in, w(off_w),
                           in, 0.f, y, out),
               "gemm");
}

StepTiming Generator::step(const std::vector<int>& seqs, const std::vector<int32_t>& tokens,
                           std::vector<float>* logits) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  StepTiming timing;
  kernels::Backend* sb = step_;
  const int64_t B = static_cast<int64_t>(seqs.size());
  if (B < 1 || tokens.size() != seqs.size())
    throw GenerateError("a decode step needs one token per sequence");
  for (int64_t b = 0; b < B; ++b) {
    const int sq = seqs[static_cast<size_t>(b)];
    if (sq < 0 || sq >= static_cast<int>(seqs_.size()) || !seqs_[static_cast<size_t>(sq)].live)
      throw GenerateError(fmt::format("no sequence {}", sq));
    for (int64_t c = 0; c < b; ++c)
      if (seqs[static_cast<size_t>(c)] == sq)
        throw GenerateError(fmt::format("sequence {} appears twice in one step", sq));
    const int32_t id = tokens[static_cast<size_t>(b)];
    if (id < 0 || id >= config_.vocab)
      throw GenerateError(fmt::format("token id {} is outside the model's vocabulary [0, {})", id,
                                      config_.vocab));
  }
  const int64_t d = config_.d_model, f = config_.mlp_hidden, qd = config_.q_dim();
  const int64_t kvd = config_.kv_dim(), hd = config_.head_dim, kvh = config_.kv_heads;
  const int64_t pt = cache_->page_tokens();
  const ShardOptions& sh = options_.shard;
  // The new tokens' places: a fresh page per (layer, head) when a page boundary is crossed.
  // Sharded, only the rank holding position n stores it: rank (n / page_tokens) mod P.
  std::vector<int64_t> pos(static_cast<size_t>(B));
  std::vector<int64_t> row_of(static_cast<size_t>(B), -1);  // row in its page; -1: not here
  for (int64_t b = 0; b < B; ++b) {
    Sequence& s = seqs_[static_cast<size_t>(seqs[static_cast<size_t>(b)])];
    const int64_t n = s.total;
    const int32_t tok = tokens[static_cast<size_t>(b)];
    pos[static_cast<size_t>(b)] = n;
    s.total = n + 1;
    if (sharded()) s.prefix.add(tok, s.last_doc);
    if (sharded() && (n / pt) % sh.ranks != sh.rank) continue;
    const int64_t ln = static_cast<int64_t>(s.ids.size());
    row_of[static_cast<size_t>(b)] = ln % pt;
    s.ids.push_back(tok);
    s.docs.push_back(s.last_doc);
    if (sharded()) {
      s.hash.add(s.prefix, n);
    } else {
      s.hash.add(s.ids.back(), s.docs.back());
    }
    if (ln % pt == 0)
      for (int l = 0; l < config_.layers; ++l)
        for (int64_t h = 0; h < kvh; ++h)
          s.pages[static_cast<size_t>(l)][static_cast<size_t>(h)].push_back(
              cache_->create(l, static_cast<int>(h)));
  }
  // Placement from the statistics of the steps so far (the new tokens' pages are in the window).
  cache_->place(window_pages(), options_.max_promotions_per_step);
  cache_->decay_mass();

  ids_.resize(sb, B);
  pos_.resize(sb, B);
  x_.resize(sb, B * d);
  h_.resize(sb, B * d);
  tmp_.resize(sb, B * d);
  q_.resize(sb, B * qd);
  o_.resize(sb, B * qd);
  k_.resize(sb, B * kvd);
  v_.resize(sb, B * kvd);
  rstd_.resize(sb, B);
  gate_.resize(sb, B * f);
  up_.resize(sb, B * f);
  act_.resize(sb, B * f);
  logits_.resize(sb, B * config_.vocab);
  check_status(sb->copy_to_device(ids_.data(), tokens.data(), ids_.bytes()),
               "copy_to_device");
  check_status(sb->copy_to_device(pos_.data(), pos.data(), pos_.bytes()), "copy_to_device");
  check_status(sb->embedding_forward(B, config_.vocab, d, ids_.data(), w(off_embedding_),
                                           x_.data()),
               "embedding_forward");
  std::vector<float> qh(static_cast<size_t>(B * qd)), kh(static_cast<size_t>(B * kvd)),
      vh(static_cast<size_t>(B * kvd)), oh(static_cast<size_t>(B * qd)),
      lse(static_cast<size_t>(B * config_.heads));
  std::vector<SeqView> views(static_cast<size_t>(B));
  std::vector<float> bound(static_cast<size_t>(B * config_.heads), 0.f);
  timing.skipped_mass_bound.assign(static_cast<size_t>(B), 0.0);
  for (int l = 0; l < config_.layers; ++l) {
    const Off& o = off_[static_cast<size_t>(l)];
    check_status(sb->rmsnorm_forward(B, d, config_.norm_eps, x_.data(), w(o.attn_norm),
                                           h_.data(), rstd_.data()),
                 "rmsnorm_forward");
    linear(B, h_.data(), o.wq, qd, d, q_.data());
    linear(B, h_.data(), o.wk, kvd, d, k_.data());
    linear(B, h_.data(), o.wv, kvd, d, v_.data());
    check_status(sb->rope(B, config_.heads, hd, rope_, pos_.data(), false, q_.data()),
                 "rope");
    check_status(sb->rope(B, kvh, hd, rope_, pos_.data(), false, k_.data()), "rope");
    if (bf16_) {
      // Q, K, V as the model's bf16 forward holds them: rounded once after RoPE.
      check_status(sb->round_to_bf16(B * qd, q_.data()), "round_to_bf16");
      check_status(sb->round_to_bf16(B * kvd, k_.data()), "round_to_bf16");
      check_status(sb->round_to_bf16(B * kvd, v_.data()), "round_to_bf16");
    }
    check_status(sb->copy_to_host(qh.data(), q_.data(), q_.bytes()), "copy_to_host");
    check_status(sb->copy_to_host(kh.data(), k_.data(), k_.bytes()), "copy_to_host");
    check_status(sb->copy_to_host(vh.data(), v_.data(), v_.bytes()), "copy_to_host");
    for (int64_t b = 0; b < B; ++b) {
      Sequence& s = seqs_[static_cast<size_t>(seqs[static_cast<size_t>(b)])];
      const int64_t row = row_of[static_cast<size_t>(b)];
      for (int64_t h = 0; h < kvh && row >= 0; ++h) {
        const PageId id = s.pages[static_cast<size_t>(l)][static_cast<size_t>(h)].back();
        cache_->write_row(id, row, kh.data() + (b * kvh + h) * hd, vh.data() + (b * kvh + h) * hd,
                          s.last_doc);
        if (row == pt - 1) cache_->seal(id, s.hash.key(l, static_cast<int>(h)));
      }
      views[static_cast<size_t>(b)] = SeqView{&s.pages[static_cast<size_t>(l)], s.last_doc};
    }
    const auto a0 = Clock::now();
    attention_->forward(views, qh.data(), oh.data(), lse.data(), &dstats_, options_.approximate,
                        bound.data());
    if (sharded()) {
      // Only the partials cross ranks: [o B x heads x head_dim | lse B x heads | bound B x
      // heads] per rank, merged in rank order (the same on every rank).
      const auto e0 = Clock::now();
      const int64_t bh = B * config_.heads, per = bh * hd + 2 * bh;
      std::vector<float> mine(static_cast<size_t>(per));
      std::copy(oh.begin(), oh.end(), mine.begin());
      std::copy(lse.begin(), lse.end(), mine.begin() + bh * hd);
      std::copy(bound.begin(), bound.end(), mine.begin() + bh * hd + bh);
      std::vector<float> all(static_cast<size_t>(per * sh.ranks));
      sh.all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
      const float* r0 = all.data();
      std::copy(r0, r0 + bh * hd, oh.begin());
      std::copy(r0 + bh * hd, r0 + bh * hd + bh, lse.begin());
      std::copy(r0 + bh * hd + bh, r0 + per, bound.begin());
      for (int r = 1; r < sh.ranks; ++r) {
        const float* part = all.data() + static_cast<int64_t>(r) * per;
        for (int64_t i = 0; i < bh; ++i) {
          merge_partial(hd, oh.data() + i * hd, lse.data() + i, part + i * hd, part[bh * hd + i]);
          bound[static_cast<size_t>(i)] += part[bh * hd + bh + i];
        }
      }
      timing.exchange_seconds += std::chrono::duration<double>(Clock::now() - e0).count();
    }
    for (int64_t b = 0; b < B && options_.approximate > 0; ++b)
      for (int64_t h = 0; h < config_.heads; ++h)
        timing.skipped_mass_bound[static_cast<size_t>(b)] =
            std::max(timing.skipped_mass_bound[static_cast<size_t>(b)],
                     static_cast<double>(bound[static_cast<size_t>(b * config_.heads + h)]));
    timing.attention_seconds += std::chrono::duration<double>(Clock::now() - a0).count();
    check_status(sb->copy_to_device(o_.data(), oh.data(), o_.bytes()), "copy_to_device");
    linear(B, o_.data(), o.wo, d, qd, tmp_.data());
    check_status(sb->add(B * d, x_.data(), tmp_.data(), x_.data()), "add");  // x_mid
    check_status(sb->rmsnorm_forward(B, d, config_.norm_eps, x_.data(), w(o.mlp_norm),
                                           h_.data(), rstd_.data()),
                 "rmsnorm_forward");
    if (config_.mlp == spec::MlpKind::kSwiGLU) {
      linear(B, h_.data(), o.w_gate, f, d, gate_.data());
      linear(B, h_.data(), o.w_up, f, d, up_.data());
      check_status(sb->swiglu_forward(B * f, gate_.data(), up_.data(), act_.data()),
                   "swiglu_forward");
    } else {
      linear(B, h_.data(), o.w_up, f, d, up_.data());
      check_status(sb->gelu_forward(B * f, up_.data(), act_.data()), "gelu_forward");
    }
    linear(B, act_.data(), o.w_down, d, f, tmp_.data());
    check_status(sb->add(B * d, x_.data(), tmp_.data(), x_.data()), "add");
  }
  check_status(sb->rmsnorm_forward(B, d, config_.norm_eps, x_.data(), w(off_final_norm_),
                                         h_.data(), rstd_.data()),
               "rmsnorm_forward");
  linear(B, h_.data(), off_head_, config_.vocab, d, logits_.data());
  if (logits != nullptr) {
    logits->resize(static_cast<size_t>(B * config_.vocab));
    check_status(sb->copy_to_host(logits->data(), logits_.data(), logits_.bytes()),
                 "copy_to_host");
  }
  timing.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return timing;
}

}  // namespace ring::gen
