#include "worker/ring/full_shard.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "common/contract/timeline.h"
#include "common/cp/shard_messages.h"
#include "common/numeric/bf16.h"
#include "plugins/transport/loader.h"

namespace ring::cp {
namespace {

// Point-to-point tags of the block gathers and gradient reduce-scatters (the ring's K/V tags
// are 0x5241000x). Every rank posts them in the same order and a pair's messages of one tag
// arrive in the order sent, so one tag per kind suffices.
constexpr uint32_t kTagGather = 0x52460001;
constexpr uint32_t kTagScatter = 0x52460002;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

FullShardStore::FullShardStore(const contract::ParamLayout& layout,
                               std::vector<contract::WorkerShard> shards, int rank,
                               int workers_per_node, ProgressEngine* engine, int timeout_ms,
                               kernels::Backend* stage, kernels::DType gather)
    : layout_(layout), shards_(std::move(shards)), rank_(rank),
      world_(static_cast<int>(shards_.size())), per_node_(workers_per_node), engine_(engine),
      timeout_ms_(timeout_ms), stage_(stage), gather_(gather) {
  if (rank_ < 0 || rank_ >= world_ || per_node_ < 1 || world_ % per_node_ != 0 ||
      (engine_ == nullptr && world_ > 1)) {
    throw std::invalid_argument(fmt::format(
        "FullShardStore: rank {} of {} shards with {} workers per node (and an engine)", rank_,
        world_, per_node_));
  }
  if (gather_ != kernels::DType::kF32 && gather_ != kernels::DType::kBF16)
    throw std::invalid_argument("FullShardStore: the weight gathers carry fp32 or bf16");
  for (const contract::GradBucket& b : layout_.buckets())
    max_bucket_ = std::max(max_bucket_, b.end - b.begin);
  const auto n = static_cast<size_t>(shard().size());
  if (gather_ == kernels::DType::kBF16) {
    weights_bf16_.assign(n, 0);
  } else {
    weights_.assign(n, 0.f);
  }
  grad_.assign(n, 0.f);
}

void FullShardStore::set_shard_weights(const float* w) {
  if (gather_ == kernels::DType::kBF16) {  // the one rounding, once per step
    for (size_t i = 0; i < weights_bf16_.size(); ++i) weights_bf16_[i] = numeric::f32_to_bf16(w[i]);
  } else {
    std::copy(w, w + weights_.size(), weights_.begin());
  }
}

FullShardStore::~FullShardStore() = default;

template <typename T>
std::vector<T>* FullShardStore::Pool<T>::take(int64_t size) {
  if (free.empty()) {
    all.push_back(std::make_unique<std::vector<T>>(static_cast<size_t>(size)));
    return all.back().get();
  }
  std::vector<T>* b = free.back();
  free.pop_back();
  return b;
}

size_t FullShardStore::gather_elem() const { return kernels::dtype_size(gather_); }

FullShardStore::HostBlock FullShardStore::take_block() {
  HostBlock h;
  if (gather_ == kernels::DType::kBF16) {
    h.bf16 = pool_bf16_.take(max_bucket_);
  } else {
    h.f32 = pool_.take(max_bucket_);
  }
  return h;
}

void FullShardStore::give_back(const HostBlock& h) {
  if (h.f32) pool_.give_back(h.f32);
  if (h.bf16) pool_bf16_.give_back(h.bf16);
}

void* FullShardStore::take_device_buffer(bool bf16) {
  std::vector<void*>& free = bf16 ? dev_free_bf16_ : dev_free_;
  if (!free.empty()) {
    void* p = free.back();
    free.pop_back();
    return p;
  }
  if (bf16) {
    dev_pool_bf16_.push_back(std::make_unique<model::DeviceArray<uint16_t>>(stage_, max_bucket_));
    return dev_pool_bf16_.back()->data();
  }
  dev_pool_.push_back(std::make_unique<model::DeviceArray<float>>(stage_, max_bucket_));
  return dev_pool_.back()->data();
}

// A device buffer of a weight block has the gather's dtype, a gradient's is fp32.
void FullShardStore::give_back(const Block& b) {
  if (b.dev) {
    const bool bf16 = !b.grad && gather_ == kernels::DType::kBF16;
    (bf16 ? dev_free_bf16_ : dev_free_).push_back(b.dev);
  }
  give_back(b.host);
  if (b.grad) pool_.give_back(b.grad);
}

void FullShardStore::check(kernels::Status st, const char* what, int b) const {
  if (st != kernels::Status::kOk)
    throw std::runtime_error(fmt::format("shard full: {} of bucket {} on backend {}: {} {}", what,
                                         layout_.buckets()[b].name, stage_->name(),
                                         kernels::status_string(st), stage_->last_error()));
}

std::pair<int64_t, int64_t> FullShardStore::part(int b, int q) const {
  const contract::GradBucket& bk = layout_.buckets()[b];
  const int64_t lo = std::max(bk.begin, shards_[q].begin);
  const int64_t hi = std::min(bk.end, shards_[q].end);
  return lo < hi ? std::make_pair(lo, hi) : std::make_pair(lo, lo);
}

ProgressEngine::Clock::time_point FullShardStore::wait(int handle, const char* what, int peer,
                                                       int b) {
  const ProgressEngine::Result r = engine_->wait(handle, timeout_ms_);
  if (r.status != RING_TRANSPORT_OK) {
    throw transport::TransportError(
        r.status, fmt::format("shard full: {} of bucket {} with rank {}: {}", what,
                              layout_.buckets()[b].name, peer, r.error));
  }
  return r.done_at;
}

void FullShardStore::begin_batch(bool first, bool last, DeliverFn deliver) {
  first_ = first;
  last_ = last;
  deliver_ = std::move(deliver);
}

// ---- weights ---------------------------------------------------------------------------------

void FullShardStore::start_gather(int b) {
  const bool bf16 = gather_ == kernels::DType::kBF16;
  Gather g;
  g.bucket = b;
  g.buf = take_block();
  g.posted = Clock::now();
  const size_t elem = gather_elem();
  auto* dst = static_cast<unsigned char*>(g.buf.data());
  const int64_t base = layout_.buckets()[b].begin;
  const auto [mlo, mhi] = part(b, rank_);
  // Receives first, then this rank's part to every other rank, then its own copy.
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    const auto [lo, hi] = part(b, q);
    if (hi > lo)
      g.handles.push_back(engine_->post_recv(dst + (lo - base) * elem,
                                             cp::shard_gather_bytes(hi - lo, elem), q, kTagGather));
  }
  if (mhi > mlo) {
    const int64_t at = mlo - shard().begin;
    const void* src = bf16 ? static_cast<const void*>(weights_bf16_.data() + at)
                           : static_cast<const void*>(weights_.data() + at);
    const size_t bytes = cp::shard_gather_bytes(mhi - mlo, elem);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      g.handles.push_back(engine_->post_send(src, bytes, q, kTagGather));
      stats_.gather_bytes_sent += static_cast<int64_t>(bytes);
      stats_.bytes_sent += static_cast<int64_t>(bytes);
    }
    std::memcpy(dst + (mlo - base) * elem, src, bytes);
  }
  ++stats_.gathers;
  gathers_.push_back(std::move(g));
}

void FullShardStore::finish_gather(Gather& g) {
  Clock::time_point last = g.posted;
  for (int h : g.handles) last = std::max(last, wait(h, "all-gather", -1, g.bucket));
  if (!g.handles.empty())
    stats_.gather_flight_s += std::chrono::duration<double>(last - g.posted).count();
  g.handles.clear();
}

const float* FullShardStore::acquire(int b, int next) {
  if (gather_ != kernels::DType::kF32)
    throw std::logic_error(fmt::format(
        "FullShardStore: bucket {}: the gathers carry bf16 (a bf16 model takes acquire_bf16)",
        layout_.buckets()[b].name));
  return static_cast<const float*>(acquire_block(b, next));
}

const uint16_t* FullShardStore::acquire_bf16(int b, int next) {
  if (gather_ != kernels::DType::kBF16) return nullptr;
  return static_cast<const uint16_t*>(acquire_block(b, next));
}

const void* FullShardStore::acquire_block(int b, int next) {
  namespace tl = contract::timeline;
  auto it = std::find_if(gathers_.begin(), gathers_.end(),
                         [b](const Gather& g) { return g.bucket == b; });
  if (it == gathers_.end()) {
    start_gather(b);
    it = gathers_.end() - 1;
  }
  const auto t0 = Clock::now();
  const int64_t n0 = tl::now_ns();
  finish_gather(*it);
  stats_.gather_wait_s += since(t0);
  if (tl::TimelineWriter* w = tl::active())
    w->record({.kind = tl::Phase::kCollective, .step = w->step(), .layer = b, .begin_ns = n0,
               .end_ns = tl::now_ns()});
  Block blk;
  blk.bucket = b;
  blk.host = it->buf;
  gathers_.erase(it);
  if (stage_) {  // into the backend's memory; the host buffer is free again
    const contract::GradBucket& bk = layout_.buckets()[b];
    blk.dev = take_device_buffer(gather_ == kernels::DType::kBF16);
    check(stage_->copy_to_device(blk.dev, blk.host.data(),
                                 static_cast<size_t>(bk.end - bk.begin) * gather_elem()),
          "copy to the device", b);
    give_back(blk.host);
    blk.host = {};
  }
  held_.push_back(blk);
  // The next block travels while this one computes.
  if (next >= 0 &&
      std::none_of(gathers_.begin(), gathers_.end(), [next](const Gather& g) { return g.bucket == next; }) &&
      std::none_of(held_.begin(), held_.end(), [next](const Block& h) { return h.bucket == next; }))
    start_gather(next);
  return blk.data();
}

void FullShardStore::release(int b) {
  auto it = std::find_if(held_.begin(), held_.end(), [b](const Block& h) { return h.bucket == b; });
  if (it == held_.end())
    throw std::logic_error(fmt::format("FullShardStore: release of bucket {} not acquired", b));
  give_back(*it);
  held_.erase(it);
}

// ---- gradients -------------------------------------------------------------------------------

float* FullShardStore::grads(int b) {
  auto it = std::find_if(grads_.begin(), grads_.end(), [b](const Block& h) { return h.bucket == b; });
  if (it != grads_.end()) return static_cast<float*>(it->data());
  // One reduce-scatter in flight: it finishes before another block gradient is handed out.
  while (!scatters_.empty()) {
    finish_scatter(scatters_.front());
    scatters_.pop_front();
  }
  const contract::GradBucket& bk = layout_.buckets()[b];
  Block blk;
  blk.bucket = b;
  if (stage_) {
    blk.dev = take_device_buffer(false);
    check(stage_->fill(bk.end - bk.begin, 0.f, static_cast<float*>(blk.dev)),
          "zeroing the gradient", b);
  } else {
    blk.grad = pool_.take(max_bucket_);
    std::fill(blk.grad->begin(), blk.grad->begin() + (bk.end - bk.begin), 0.f);
  }
  grads_.push_back(blk);
  return static_cast<float*>(blk.data());
}

void FullShardStore::grads_done(int b) {
  auto it = std::find_if(grads_.begin(), grads_.end(), [b](const Block& h) { return h.bucket == b; });
  if (it == grads_.end())
    throw std::logic_error(fmt::format("FullShardStore: grads_done of bucket {} not handed out", b));
  const Block blk = *it;
  grads_.erase(it);
  // One reduce-scatter in flight (they share the receive window): with tied embeddings the
  // embedding's gradient was handed out before the layers', so the last layer's may still be.
  while (!scatters_.empty()) {
    finish_scatter(scatters_.front());
    scatters_.pop_front();
  }
  std::vector<float>* buf = blk.grad;
  if (stage_) {  // back to host memory for the transfers (after the backward's kernels)
    const contract::GradBucket& bk = layout_.buckets()[b];
    buf = pool_.take(max_bucket_);
    check(stage_->copy_to_host(buf->data(), blk.dev,
                               static_cast<size_t>(bk.end - bk.begin) * sizeof(float)),
          "copy to the host", b);
    dev_free_.push_back(blk.dev);
  }
  start_scatter(b, buf);
}

void FullShardStore::start_scatter(int b, std::vector<float>* buf) {
  Scatter s;
  s.bucket = b;
  s.buf = buf;
  s.posted_at = s.last_done = Clock::now();
  const int64_t base = layout_.buckets()[b].begin;
  const auto [mlo, mhi] = part(b, rank_);
  const size_t len = static_cast<size_t>(mhi - mlo);
  s.handle.assign(kWindow, -1);
  if (len > 0) {
    for (int q = 0; q < world_; ++q)
      if (q != rank_) s.from.push_back(q);
    if (window_.empty()) window_.resize(kWindow);
    for (int w = 0; w < kWindow && s.posted < s.from.size(); ++w, ++s.posted) {
      if (window_[w].size() < len) window_[w].resize(len);
      s.handle[w] = engine_->post_recv(window_[w].data(), cp::shard_scatter_bytes(mhi - mlo),
                                       s.from[s.posted], kTagScatter);
    }
  }
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    const auto [lo, hi] = part(b, q);
    if (hi > lo) {  // fp32 whatever the gathers carry (shard_messages.h)
      const size_t bytes = cp::shard_scatter_bytes(hi - lo);
      s.sends.push_back(engine_->post_send(buf->data() + (lo - base), bytes, q, kTagScatter));
      stats_.scatter_bytes_sent += static_cast<int64_t>(bytes);
      stats_.bytes_sent += static_cast<int64_t>(bytes);
    }
  }
  ++stats_.scatters;
  scatters_.push_back(std::move(s));
}

void FullShardStore::finish_scatter(Scatter& s) {
  namespace tl = contract::timeline;
  const auto t0 = Clock::now();
  const int64_t n0 = tl::now_ns();
  const int64_t base = layout_.buckets()[s.bucket].begin;
  const auto [mlo, mhi] = part(s.bucket, rank_);
  const int64_t len = mhi - mlo;
  if (len > 0 && world_ == 1) {
    // One rank: its block gradient is the sum.
    const float* x = s.buf->data() + (mlo - base);
    float* g = grad_.data() + (mlo - shard().begin);
    if (first_) {
      std::memcpy(g, x, static_cast<size_t>(len) * sizeof(float));
    } else {
      for (int64_t i = 0; i < len; ++i) g[i] += x[i];
    }
  } else if (len > 0) {
    // shard none's order: per node its workers left to right, then the nodes left to right,
    // each a left fold; the parts are taken in rank order as they arrive.
    sum_.resize(static_cast<size_t>(len));
    if (world_ > per_node_) node_sum_.resize(static_cast<size_t>(len));
    size_t next = 0;  // index into s.from of the next part to arrive
    for (int q = 0; q < world_; ++q) {
      const float* x = nullptr;
      int w = -1;
      if (q == rank_) {
        x = s.buf->data() + (mlo - base);
      } else {
        w = static_cast<int>(next % kWindow);
        s.last_done = std::max(s.last_done, wait(s.handle[w], "reduce-scatter", q, s.bucket));
        x = window_[w].data();
        ++next;
      }
      const int l = q % per_node_, k = q / per_node_;
      float* acc = k == 0 ? sum_.data() : node_sum_.data();
      if (l == 0) {
        std::memcpy(acc, x, static_cast<size_t>(len) * sizeof(float));
      } else {
        for (int64_t i = 0; i < len; ++i) acc[i] += x[i];
      }
      if (w >= 0 && s.posted < s.from.size()) {  // the window buffer is free again
        s.handle[w] = engine_->post_recv(window_[w].data(), cp::shard_scatter_bytes(len),
                                         s.from[s.posted], kTagScatter);
        ++s.posted;
      }
      if (k > 0 && l == per_node_ - 1)
        for (int64_t i = 0; i < len; ++i) sum_[i] += node_sum_[i];
    }
    float* g = grad_.data() + (mlo - shard().begin);
    if (first_) {
      std::memcpy(g, sum_.data(), static_cast<size_t>(len) * sizeof(float));
    } else {
      for (int64_t i = 0; i < len; ++i) g[i] += sum_[i];
    }
  }
  for (int h : s.sends) s.last_done = std::max(s.last_done, wait(h, "reduce-scatter", -1, s.bucket));
  stats_.scatter_wait_s += since(t0);
  stats_.scatter_flight_s += std::chrono::duration<double>(s.last_done - s.posted_at).count();
  if (tl::TimelineWriter* w = tl::active())
    w->record({.kind = tl::Phase::kCollective, .step = w->step(), .layer = s.bucket,
               .begin_ns = n0, .end_ns = tl::now_ns()});
  pool_.give_back(s.buf);
  s.buf = nullptr;
  if (last_ && deliver_)
    deliver_(s.bucket, mlo, mhi, len > 0 ? grad_.data() + (mlo - shard().begin) : nullptr);
}

void FullShardStore::end_pass() {
  while (!scatters_.empty()) {
    finish_scatter(scatters_.front());
    scatters_.pop_front();
  }
  // Nothing may stay posted past the pass: the world communicator's collectives follow.
  for (Gather& g : gathers_) {
    finish_gather(g);
    give_back(g.buf);
  }
  gathers_.clear();
  if (!held_.empty() || !grads_.empty())
    throw std::logic_error("FullShardStore: a block is still acquired at the end of the pass");
}

}  // namespace ring::cp
