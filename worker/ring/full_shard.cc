#include "worker/ring/full_shard.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "common/contract/timeline.h"
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
                               kernels::Backend* stage)
    : layout_(layout), shards_(std::move(shards)), rank_(rank),
      world_(static_cast<int>(shards_.size())), per_node_(workers_per_node), engine_(engine),
      timeout_ms_(timeout_ms), stage_(stage) {
  if (rank_ < 0 || rank_ >= world_ || per_node_ < 1 || world_ % per_node_ != 0 ||
      (engine_ == nullptr && world_ > 1)) {
    throw std::invalid_argument(fmt::format(
        "FullShardStore: rank {} of {} shards with {} workers per node (and an engine)", rank_,
        world_, per_node_));
  }
  for (const contract::GradBucket& b : layout_.buckets())
    max_bucket_ = std::max(max_bucket_, b.end - b.begin);
  weights_.assign(static_cast<size_t>(shard().size()), 0.f);
  grad_.assign(static_cast<size_t>(shard().size()), 0.f);
}

FullShardStore::~FullShardStore() = default;

std::vector<float>* FullShardStore::take_buffer() {
  if (free_.empty()) {
    pool_.push_back(std::make_unique<std::vector<float>>(static_cast<size_t>(max_bucket_)));
    return pool_.back().get();
  }
  std::vector<float>* b = free_.back();
  free_.pop_back();
  return b;
}

void FullShardStore::give_back(std::vector<float>* buf) { free_.push_back(buf); }

float* FullShardStore::take_device_buffer() {
  if (dev_free_.empty()) {
    dev_pool_.push_back(std::make_unique<model::DeviceArray<float>>(stage_, max_bucket_));
    return dev_pool_.back()->data();
  }
  float* p = dev_free_.back();
  dev_free_.pop_back();
  return p;
}

void FullShardStore::give_back(const Block& b) {
  if (b.dev) dev_free_.push_back(b.dev);
  if (b.host) give_back(b.host);
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
  Gather g;
  g.bucket = b;
  g.buf = take_buffer();
  g.posted = Clock::now();
  const int64_t base = layout_.buckets()[b].begin;
  const auto [mlo, mhi] = part(b, rank_);
  // Receives first, then this rank's part to every other rank, then its own copy.
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    const auto [lo, hi] = part(b, q);
    if (hi > lo)
      g.handles.push_back(engine_->post_recv(g.buf->data() + (lo - base),
                                             static_cast<size_t>(hi - lo) * sizeof(float), q,
                                             kTagGather));
  }
  if (mhi > mlo) {
    const float* src = weights_.data() + (mlo - shard().begin);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      g.handles.push_back(engine_->post_send(src, static_cast<size_t>(mhi - mlo) * sizeof(float),
                                             q, kTagGather));
      stats_.bytes_sent += (mhi - mlo) * static_cast<int64_t>(sizeof(float));
    }
    std::memcpy(g.buf->data() + (mlo - base), src, static_cast<size_t>(mhi - mlo) * sizeof(float));
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
  Block blk{b, it->buf, nullptr};
  gathers_.erase(it);
  if (stage_) {  // into the backend's memory; the host buffer is free again
    const contract::GradBucket& bk = layout_.buckets()[b];
    blk.dev = take_device_buffer();
    check(stage_->copy_to_device(blk.dev, blk.host->data(),
                                 static_cast<size_t>(bk.end - bk.begin) * sizeof(float)),
          "copy to the device", b);
    give_back(blk.host);
    blk.host = nullptr;
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
  if (it != grads_.end()) return it->data();
  // One reduce-scatter in flight: it finishes before another block gradient is handed out.
  while (!scatters_.empty()) {
    finish_scatter(scatters_.front());
    scatters_.pop_front();
  }
  const contract::GradBucket& bk = layout_.buckets()[b];
  Block blk{b, nullptr, nullptr};
  if (stage_) {
    blk.dev = take_device_buffer();
    check(stage_->fill(bk.end - bk.begin, 0.f, blk.dev), "zeroing the gradient", b);
  } else {
    blk.host = take_buffer();
    std::fill(blk.host->begin(), blk.host->begin() + (bk.end - bk.begin), 0.f);
  }
  grads_.push_back(blk);
  return blk.data();
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
  std::vector<float>* buf = blk.host;
  if (stage_) {  // back to host memory for the transfers (after the backward's kernels)
    const contract::GradBucket& bk = layout_.buckets()[b];
    buf = take_buffer();
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
      s.handle[w] = engine_->post_recv(window_[w].data(), len * sizeof(float), s.from[s.posted],
                                       kTagScatter);
    }
  }
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) continue;
    const auto [lo, hi] = part(b, q);
    if (hi > lo) {
      s.sends.push_back(engine_->post_send(buf->data() + (lo - base),
                                           static_cast<size_t>(hi - lo) * sizeof(float), q,
                                           kTagScatter));
      stats_.bytes_sent += (hi - lo) * static_cast<int64_t>(sizeof(float));
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
        s.handle[w] = engine_->post_recv(window_[w].data(),
                                         static_cast<size_t>(len) * sizeof(float),
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
  give_back(s.buf);
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
