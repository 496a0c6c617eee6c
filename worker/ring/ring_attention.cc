#include "worker/ring/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "fmt/format.h"
#include "common/cp/ring_messages.h"

#include "common/contract/timeline.h"

namespace ring::cp {

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using model::check_status;
using Clock = std::chrono::steady_clock;
namespace timeline = contract::timeline;

namespace {

// Tags of the three kinds of ring traffic; messages of one kind between two ranks arrive in the
// order they were sent, and every step is sequential, so one tag per kind suffices.
constexpr uint32_t kTagForwardKv = 0x52410001;
constexpr uint32_t kTagBackwardKv = 0x52410002;
constexpr uint32_t kTagDkv = 0x52410003;

size_t align64(size_t x) { return (x + 63) & ~size_t{63}; }

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

RingTopology make_ring(int rank, int world, const std::vector<int>& order) {
  if (world >= 1 && static_cast<int>(order.size()) != world)
    throw std::invalid_argument(
        fmt::format("ring order has {} entries, the ring has {} ranks", order.size(), world));
  return make_sub_ring(rank, world, order);
}

RingTopology make_sub_ring(int rank, int comm_world, const std::vector<int>& order) {
  if (comm_world < 1 || rank < 0 || rank >= comm_world)
    throw std::invalid_argument(fmt::format("ring: rank {} of world {}", rank, comm_world));
  if (order.empty() || static_cast<int>(order.size()) > comm_world)
    throw std::invalid_argument(fmt::format(
        "ring order has {} entries, the communicator has {} ranks", order.size(), comm_world));
  std::vector<int> seen(comm_world, 0);
  for (int r : order) {
    if (r < 0 || r >= comm_world)
      throw std::invalid_argument(
          fmt::format("ring order names rank {}, not in 0..{}", r, comm_world - 1));
    if (seen[r]++)
      throw std::invalid_argument(fmt::format("ring order names rank {} twice", r));
  }
  if (!seen[rank])
    throw std::invalid_argument(fmt::format("ring order does not name rank {}", rank));
  const int world = static_cast<int>(order.size());
  RingTopology t;
  t.rank = rank;
  t.world = world;
  t.comm_world = comm_world;
  t.order = order;
  t.position = static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
  t.next = order[(t.position + 1) % world];
  t.prev = order[(t.position + world - 1) % world];
  return t;
}

std::vector<int> ring_order_from_spec(const spec::ParallelSection& p, int world,
                                      std::string* note) {
  std::vector<int> order(world);
  std::iota(order.begin(), order.end(), 0);
  if (note) note->clear();
  switch (p.ring_order) {
    case spec::RingOrder::kNatural: break;
    case spec::RingOrder::kList:
      order.assign(p.ring_order_list.begin(), p.ring_order_list.end());
      break;
    case spec::RingOrder::kTopology:
    case spec::RingOrder::kSlurm:
      if (note)
        *note = fmt::format(
            "parallel.ring_order {} is computed by the coordinator; without one the ring is in "
            "natural rank order",
            spec::to_string(p.ring_order));
      break;
  }
  return order;
}

RingAttention::RingAttention(kernels::Backend* backend, ProgressEngine* progress,
                             RingTopology ring, Options options)
    : backend_(backend), progress_(progress), ring_(std::move(ring)), options_(options) {}

void RingAttention::set_compute_only(BlockSource source, std::vector<int64_t> tokens) {
  compute_only_ = std::move(source);
  tokens_of_ = std::move(tokens);
  max_tokens_ = *std::max_element(tokens_of_.begin(), tokens_of_.end());
}

RingAttention::Offsets RingAttention::offsets(int64_t t) const {
  Offsets o;
  o.pos = align64(sizeof(Header));
  o.doc = o.pos + align64(static_cast<size_t>(t) * sizeof(int64_t));
  const size_t elem = kernels::dtype_size(options_.wire);
  o.k = o.doc + align64(static_cast<size_t>(t) * sizeof(int32_t));
  o.v = o.k + align64(static_cast<size_t>(t * kvd_) * elem);
  o.total = o.v + align64(static_cast<size_t>(t * kvd_) * elem);
  static_assert(sizeof(Header) <= kRingHeaderBytes);
  // ring_messages.h states the same size for the planner and the simulator.
  if (o.total != packed_block_bytes(t, kvd_, elem)) throw std::logic_error("ring: block layout");
  return o;
}

void RingAttention::exchange_token_counts(int64_t tokens) {
  std::vector<int64_t> by_rank(std::max(ring_.world, ring_.comm_world), 0);
  if (ring_.world > 1) {
    // A collective of the ring: in the timeline (and the flight recorder) as a wait on all.
    timeline::TimelineWriter* tl = timeline::active();
    const int64_t step_no = tl ? tl->step() : 0;
    if (tl) tl->wait_begin(timeline::Phase::kCollective, step_no, -1, -1, -1);
    const int64_t c0 = timeline::now_ns();
    progress_->collective([&](transport::TransportComm& c) {
      c.check(c.api().all_gather(c.get(), &tokens, by_rank.data(), sizeof(int64_t), 0),
              "ring attention: all_gather of token counts");
    });
    const int64_t c1 = timeline::now_ns();
    rstats_.recv_wait_s += (c1 - c0) * 1e-9;
    if (tl) {
      tl->wait_end();
      tl->record({.kind = timeline::Phase::kCollective, .step = step_no, .begin_ns = c0,
                  .end_ns = c1});
    }
  } else {
    by_rank[ring_.order[0]] = tokens;
  }
  tokens_of_.assign(ring_.world, 0);
  for (int p = 0; p < ring_.world; ++p) tokens_of_[p] = by_rank[ring_.order[p]];
  max_tokens_ = *std::max_element(tokens_of_.begin(), tokens_of_.end());
}

void RingAttention::prepare(const model::AttentionCall& call) {
  kvd_ = call.kv_heads * call.head_dim;
  // Token counts can change between steps; every rank runs layer 0's forward at the same point.
  if (!compute_only_ && (call.layer == 0 || tokens_of_.empty())) exchange_token_counts(call.tokens);
  if (tokens_of_[ring_.position] != call.tokens)
    throw model::ModelError(fmt::format(
        "ring attention: layer {} has {} tokens on rank {}, the ring agreed on {}", call.layer,
        call.tokens, ring_.rank, tokens_of_[ring_.position]));
  const int64_t tm = max_tokens_;
  const size_t cap = offsets(tm).total;
  for (auto& b : kv_buf_) b.resize(backend_, static_cast<int64_t>(cap));
  if (options_.wire != kernels::DType::kF32)
    for (auto& b : kv_wide_) b.resize(backend_, 2 * tm * kvd_);
  const int64_t dkv_cap = 64 + 2 * tm * kvd_ * static_cast<int64_t>(sizeof(float));
  for (auto& b : dkv_in_) b.resize(backend_, dkv_cap);
  for (auto& b : dkv_out_) b.resize(backend_, dkv_cap);
  if (options_.dkv_wire != kernels::DType::kF32) {
    dkv_wide_.resize(backend_, 2 * tm * kvd_);
    dkv_sum_.resize(backend_, 2 * tm * kvd_);
  }
  dkv_part_.resize(backend_, 2 * tm * kvd_);
  dkv_own_.resize(backend_, 2 * call.tokens * kvd_);
  part_out_.resize(backend_, call.tokens * call.heads * call.head_dim);
  part_lse_.resize(backend_, call.tokens * call.heads);
  delta_.resize(backend_, call.tokens * call.heads);
}

RingAttention::Block RingAttention::local_block(const model::AttentionCall& call) const {
  Block b;
  b.tokens = call.tokens;
  b.origin = ring_.position;
  b.pos = call.positions;
  b.doc = call.doc_ids;
  b.k = call.k;
  b.v = call.v;
  return b;
}

void RingAttention::pack_local(const model::AttentionCall& call) {
  const int64_t t = call.tokens;
  const Offsets o = offsets(t);
  char* dst = kv_buf_[0].data();
  Header h{t, ring_.position, call.layer, call.doc_ids != nullptr};
  std::memcpy(dst, &h, sizeof(h));
  std::memcpy(dst + o.pos, call.positions, t * sizeof(int64_t));
  if (call.doc_ids) std::memcpy(dst + o.doc, call.doc_ids, t * sizeof(int32_t));
  if (options_.wire == kernels::DType::kF32) {
    std::memcpy(dst + o.k, call.k, t * kvd_ * sizeof(float));
    std::memcpy(dst + o.v, call.v, t * kvd_ * sizeof(float));
    return;
  }
  model::check_status(backend_->convert(kernels::DType::kF32, options_.wire, t * kvd_, call.k,
                                        dst + o.k),
                      "convert (ring K)");
  model::check_status(backend_->convert(kernels::DType::kF32, options_.wire, t * kvd_, call.v,
                                        dst + o.v),
                      "convert (ring V)");
}

RingAttention::Block RingAttention::unpack(const char* buf, const model::AttentionCall& call,
                                           int origin, int step, size_t received,
                                           int buf_index) {
  Header h;
  std::memcpy(&h, buf, sizeof(h));
  const Offsets o = offsets(h.tokens);
  if (h.origin != origin || h.tokens != tokens_of_[origin] || h.layer != call.layer ||
      (h.has_docs != 0) != (call.doc_ids != nullptr) || received != o.total)
    throw model::ModelError(fmt::format(
        "ring attention: rank {} layer {} step {}: received block (origin {}, {} tokens, layer "
        "{}, {} bytes) but expected origin {} with {} tokens, layer {}, {} bytes",
        ring_.rank, call.layer, step, h.origin, h.tokens, h.layer, received, origin,
        tokens_of_[origin], call.layer, offsets(tokens_of_[origin]).total));
  Block b;
  b.tokens = h.tokens;
  b.origin = origin;
  b.pos = reinterpret_cast<const int64_t*>(buf + o.pos);
  b.doc = h.has_docs ? reinterpret_cast<const int32_t*>(buf + o.doc) : nullptr;
  if (options_.wire == kernels::DType::kF32) {
    b.k = reinterpret_cast<const float*>(buf + o.k);
    b.v = reinterpret_cast<const float*>(buf + o.v);
    return b;
  }
  // Widened once per received block (exact): the kernels read fp32 as for an fp32 wire.
  float* wide = kv_wide_[buf_index].data();
  const int64_t n = h.tokens * kvd_;
  model::check_status(backend_->convert(options_.wire, kernels::DType::kF32, n, buf + o.k, wide),
                      "convert (ring K)");
  model::check_status(
      backend_->convert(options_.wire, kernels::DType::kF32, n, buf + o.v, wide + n),
      "convert (ring V)");
  b.k = wide;
  b.v = wide + n;
  return b;
}

RingAttention::Block RingAttention::block_at(int step, const model::AttentionCall& call,
                                             int buf_index, size_t received) {
  const int origin = (ring_.position - step + ring_.world) % ring_.world;
  if (step == 0) return local_block(call);
  if (compute_only_) {
    BlockView v = compute_only_(call.layer, origin);
    Block b;
    b.tokens = v.tokens;
    b.origin = origin;
    b.pos = v.positions;
    b.doc = v.doc_ids;
    b.k = v.k;
    b.v = v.v;
    return b;
  }
  return unpack(kv_buf_[buf_index].data(), call, origin, step, received, buf_index);
}

bool RingAttention::any_allowed(const model::AttentionCall& call, const Block& b) const {
  const int64_t tq = call.tokens, tk = b.tokens;
  if (tq == 0 || tk == 0) return false;
  const int64_t* qp = call.positions;
  const int64_t* kp = b.pos;
  const int32_t* qd = call.doc_ids;
  const int32_t* kd = b.doc;
  const int64_t q_max = *std::max_element(qp, qp + tq);
  const int64_t k_min = *std::min_element(kp, kp + tk);
  if (k_min > q_max) return false;  // every key is later than every query
  if (!qd) return true;
  const auto [qd_lo, qd_hi] = std::minmax_element(qd, qd + tq);
  const auto [kd_lo, kd_hi] = std::minmax_element(kd, kd + tk);
  if (*qd_hi < *kd_lo || *kd_hi < *qd_lo) return false;  // no shared document
  // Exact when positions ascend and document ids do not decrease along them (packed sequences):
  // allowed iff some document d has min key position(d) <= max query position(d).
  auto sorted = [](const int64_t* p, const int32_t* d, int64_t n) {
    for (int64_t i = 1; i < n; ++i)
      if (p[i] <= p[i - 1] || d[i] < d[i - 1]) return false;
    return true;
  };
  if (!sorted(qp, qd, tq) || !sorted(kp, kd, tk)) return true;  // conservative
  int64_t i = 0, j = 0;
  while (i < tq && j < tk) {
    if (qd[i] < kd[j]) {
      ++i;
    } else if (kd[j] < qd[i]) {
      ++j;
    } else {
      const int32_t d = qd[i];
      const int64_t first_key = kp[j];  // keys ascend: the first key of d is its earliest
      while (i < tq && qd[i] == d) ++i;
      if (first_key <= qp[i - 1]) return true;  // the last query of d is its latest
      while (j < tk && kd[j] == d) ++j;
    }
  }
  return false;
}

std::pair<int64_t, int64_t> RingAttention::key_range(const model::AttentionCall& call,
                                                     const Block& b) const {
  if (!any_allowed(call, b)) return {0, 0};
  const int64_t tq = call.tokens, tk = b.tokens;
  const int64_t* qp = call.positions;
  const int64_t* kp = b.pos;
  const int32_t* qd = call.doc_ids;
  const int32_t* kd = b.doc;
  for (int64_t i = 1; i < tq; ++i)
    if (qp[i] <= qp[i - 1] || (qd && qd[i] < qd[i - 1])) return {0, tk};
  for (int64_t j = 1; j < tk; ++j)
    if (kp[j] <= kp[j - 1] || (kd && kd[j] < kd[j - 1])) return {0, tk};
  int64_t lo = -1, hi = -1;
  if (!qd) {  // causal only: keys up to the latest query
    for (int64_t j = 0; j < tk && kp[j] <= qp[tq - 1]; ++j) hi = j + 1, lo = lo < 0 ? j : lo;
  } else {
    // Walk both in document order; for each document the latest query position bounds its keys.
    int64_t i = 0;
    for (int64_t j = 0; j < tk; ++j) {
      while (i < tq && qd[i] < kd[j]) ++i;
      if (i == tq) break;
      if (qd[i] != kd[j]) continue;
      int64_t last = i;
      while (last + 1 < tq && qd[last + 1] == kd[j]) ++last;
      if (kp[j] <= qp[last]) {
        if (lo < 0) lo = j;
        hi = j + 1;
      }
    }
  }
  return lo < 0 ? std::pair<int64_t, int64_t>{0, 0} : std::pair<int64_t, int64_t>{lo, hi};
}

kernels::AttentionArgs RingAttention::args(const model::AttentionCall& call,
                                           const Block& b) const {
  kernels::AttentionArgs a;
  a.q_len = call.tokens;
  a.kv_len = b.tokens;
  a.heads = call.heads;
  a.kv_heads = call.kv_heads;
  a.head_dim = call.head_dim;
  a.scale = call.scale;
  a.causal = true;
  a.dtype = kernels::DType::kF32;
  a.q = call.q;
  a.k = b.k;
  a.v = b.v;
  a.q_pos = call.positions;
  a.k_pos = b.pos;
  a.q_doc = call.doc_ids;
  a.k_doc = call.doc_ids ? b.doc : nullptr;
  return a;
}

int RingAttention::send_kv(int buf_index, size_t bytes, uint32_t tag) {
  const auto not_before =
      Clock::now() + std::chrono::microseconds(options_.stagger_us * ring_.position);
  rstats_.hops++;
  rstats_.bytes_sent += static_cast<int64_t>(bytes);
  const int h = progress_->post_send(kv_buf_[buf_index].data(), bytes, ring_.next, tag,
                                     options_.stagger_us > 0 ? not_before : Clock::time_point{});
  posted(h);
  return h;
}

int RingAttention::recv_kv(int buf_index, uint32_t tag) {
  const int h = progress_->post_recv(kv_buf_[buf_index].data(), offsets(max_tokens_).total,
                                     ring_.prev, tag);
  posted(h);
  return h;
}

void RingAttention::posted(int handle) {
  if (handle >= 0 && handle < kMaxTracked) posted_ns_[handle] = timeline::now_ns();
}

size_t RingAttention::finish(int* handle, const char* what, int peer, int layer, int step,
                             bool recv) {
  if (*handle < 0) return 0;
  timeline::TimelineWriter* tl = timeline::active();
  const int64_t step_no = tl ? tl->step() : 0;
  // The flight recorder's "where": blocked on a receive from prev or on a send to next (a
  // large send completes only when the receiver takes it).
  if (tl)
    tl->wait_begin(recv ? timeline::Phase::kRingWait : timeline::Phase::kRingSend, step_no, layer,
                   static_cast<int16_t>(step), peer + options_.rank_offset);
  const int64_t w0 = timeline::now_ns();
  const double c0 = thread_cpu_seconds();
  ProgressEngine::Result r = progress_->wait(*handle, options_.timeout_ms);
  const int64_t w1 = timeline::now_ns();
  rstats_.wait_cpu_s += thread_cpu_seconds() - c0;
  const double waited = (w1 - w0) * 1e-9;
  rstats_.wait_s += waited;
  (recv ? rstats_.recv_wait_s : rstats_.send_wait_s) += waited;
  rstats_.stagger_s += r.held_back_s;
  if (tl) {
    tl->wait_end();
    const int64_t p0 = *handle < kMaxTracked ? posted_ns_[*handle] : w0;
    // Completed: when the progress engine saw the request finish (steady_clock is
    // CLOCK_MONOTONIC, the timeline's clock), not when this thread came to wait for it: a
    // transfer that finished during the block's compute would otherwise last as long as the
    // compute. The wait (ring_wait) is what the thread spent blocked.
    const int64_t done =
        r.done_at.time_since_epoch().count() != 0
            ? std::chrono::duration_cast<std::chrono::nanoseconds>(r.done_at.time_since_epoch())
                  .count()
            : w1;
    timeline::Event e{.kind = recv ? timeline::Phase::kRingRecv : timeline::Phase::kRingSend,
                      .step = step_no,
                      .layer = layer,
                      .hop = static_cast<int16_t>(step),
                      .peer = peer + options_.rank_offset,
                      .begin_ns = std::min(p0, w0),
                      .end_ns = std::clamp(done, std::min(p0, w0), w1),
                      .bytes = static_cast<int64_t>(r.bytes)};
    tl->record(e);
    if (recv) {
      e.kind = timeline::Phase::kRingWait;
      e.begin_ns = w0;
      e.end_ns = w1;
      tl->record(e);
    }
  }
  *handle = -1;
  if (r.status != RING_TRANSPORT_OK)
    throw transport::TransportError(
        r.status, fmt::format("ring attention: rank {} (ring position {} of {}), layer {}, step "
                              "{}: {} rank {} failed: {}: {}",
                              ring_.rank, ring_.position, ring_.world, layer, step, what, peer,
                              ring_transport_status_name(r.status), r.error));
  return r.bytes;
}

void RingAttention::forward(const model::AttentionCall& call, float* out, float* lse) {
  prepare(call);
  const int p = ring_.world;
  const bool comm = p > 1 && !compute_only_;
  const int64_t rows = call.tokens * call.heads;
  if (comm) pack_local(call);
  bool have_out = false;
  size_t received = 0;
  for (int s = 0; s < p; ++s) {
    const int cur = s % 2, nxt = (s + 1) % 2;
    Block b = block_at(s, call, cur, received);
    int hr = -1, hs = -1;
    if (comm && s + 1 < p) {
      hr = recv_kv(nxt, kTagForwardKv);
      hs = send_kv(cur, offsets(b.tokens).total, kTagForwardKv);
    }
    ++rstats_.blocks_total;
    const auto t0 = Clock::now();
    if (any_allowed(call, b)) {
      float* o = have_out ? part_out_.data() : out;
      float* l = have_out ? part_lse_.data() : lse;
      check_status(backend_->attention_forward(args(call, b), o, l, &kstats_), "attention_forward");
      if (have_out)
        check_status(backend_->attention_merge(call.tokens, call.heads, call.head_dim, out, lse,
                                               part_out_.data(), part_lse_.data()),
                     "attention_merge");
      have_out = true;
    } else {
      ++rstats_.blocks_skipped;
    }
    rstats_.compute_s += seconds_since(t0);
    received = finish(&hr, "receive of a K/V block from", ring_.prev, call.layer, s, true);
    finish(&hs, "send of a K/V block to", ring_.next, call.layer, s, false);
  }
  if (!have_out) {  // no key anywhere (only possible with no tokens)
    check_status(backend_->fill(rows * call.head_dim, 0.f, out), "fill");
    check_status(backend_->fill(rows, -std::numeric_limits<float>::infinity(), lse), "fill");
  }
}

void RingAttention::backward(const model::AttentionCall& call, const float* out, const float* lse,
                             const float* dout, float* dq, float* dk, float* dv) {
  prepare(call);
  const int p = ring_.world;
  const bool comm = p > 1 && !compute_only_;
  const int64_t t = call.tokens;
  check_status(backend_->attention_backward_prepare(kernels::DType::kF32, t, call.heads,
                                                    call.head_dim, out, dout, delta_.data()),
               "attention_backward_prepare");
  check_status(backend_->fill(t * call.heads * call.head_dim, 0.f, dq), "fill");
  if (comm) pack_local(call);

  int dkv_send[2] = {-1, -1};  // the accumulator send posted from dkv_out_[i]
  const kernels::DType dw = options_.dkv_wire;
  const size_t de = kernels::dtype_size(dw);
  // The fp32 rows of an accumulator message (rows x kvd, dK then dV): in place for an fp32
  // wire, widened into scratch for a bf16 one.
  auto rows_of = [&](const char* m, int64_t rows) -> const float* {
    if (dw == kernels::DType::kF32) return reinterpret_cast<const float*>(m + 64);
    check_status(backend_->convert(dw, kernels::DType::kF32, 2 * rows * kvd_, m + 64,
                                   dkv_wide_.data()),
                 "convert (dK/dV accumulator)");
    return dkv_wide_.data();
  };
  const size_t dkv_cap = static_cast<size_t>(dkv_in_[0].size());
  struct Range {
    int64_t lo = 0, hi = 0;
  };
  // Parses a received accumulator message of a block of bt tokens.
  auto parse = [&](const char* m, size_t bytes, int64_t bt, int step) {
    Range r;
    if (bytes == 0) return r;
    std::memcpy(&r, m, sizeof(r));
    if (bytes < 64 || r.lo < 0 || r.hi <= r.lo || r.hi > bt ||
        bytes != 64 + static_cast<size_t>(2 * (r.hi - r.lo) * kvd_) * de)
      throw model::ModelError(fmt::format(
          "ring attention: rank {} layer {} step {}: malformed dK/dV accumulator ({} bytes, "
          "rows [{}, {}) of a {}-token block)", ring_.rank, call.layer, step, bytes, r.lo, r.hi,
          bt));
    return r;
  };
  size_t received = 0;
  for (int s = 0; s < p; ++s) {
    const int cur = s % 2, nxt = (s + 1) % 2;
    Block b = block_at(s, call, cur, received);
    const int64_t bt = b.tokens;
    int hr = -1, hs = -1, hd = -1;
    if (comm && s + 1 < p) {
      hr = recv_kv(nxt, kTagBackwardKv);
      hs = send_kv(cur, offsets(bt).total, kTagBackwardKv);
    }
    // The accumulator of this block arrives from prev (it left there at step s-1).
    if (comm && s > 0) {
      hd = progress_->post_recv(dkv_in_[cur].data(), dkv_cap, ring_.prev, kTagDkv);
      posted(hd);
    }
    ++rstats_.blocks_total;
    auto t0 = Clock::now();
    const auto [plo, phi] = key_range(call, b);
    const bool allowed = phi > plo;
    // The own block's partial stays home (dkv_own_); foreign blocks' go to scratch.
    float* part = s == 0 ? dkv_own_.data() : dkv_part_.data();
    if (allowed || s == 0) check_status(backend_->fill(2 * bt * kvd_, 0.f, part), "fill");
    if (allowed) {
      check_status(backend_->attention_backward(args(call, b), dout, lse, delta_.data(), dq, part,
                                                part + bt * kvd_, &kstats_),
                   "attention_backward");
    } else {
      ++rstats_.blocks_skipped;
    }
    rstats_.compute_s += seconds_since(t0);
    if (!comm) continue;
    // Outgoing accumulator = incoming (+ this rank's partial rows [plo, phi)); the buffer's send
    // of step s-2 must be complete before it is rewritten.
    finish(&dkv_send[cur], "send of a dK/dV accumulator to", ring_.next, call.layer, s, false);
    char* out = dkv_out_[cur].data();
    size_t out_bytes = 0;
    if (s > 0) {
      const char* in = dkv_in_[cur].data();
      const size_t in_bytes =
          finish(&hd, "receive of a dK/dV accumulator from", ring_.prev, call.layer, s, true);
      const Range ir = parse(in, in_bytes, bt, s);
      t0 = Clock::now();
      if (!allowed) {
        std::memcpy(out, in, in_bytes);
        out_bytes = in_bytes;
      } else {
        Range o{plo, phi};
        if (in_bytes) o = {std::min(plo, ir.lo), std::max(phi, ir.hi)};
        const int64_t on = o.hi - o.lo, in_n = ir.hi - ir.lo;
        std::memcpy(out, &o, sizeof(o));
        float* od = dw == kernels::DType::kF32 ? reinterpret_cast<float*>(out + 64)
                                               : dkv_sum_.data();
        const float* id = in_bytes ? rows_of(in, in_n) : nullptr;
        for (int t = 0; t < 2; ++t) {  // dK, then dV
          float* dst = od + t * on * kvd_;
          check_status(backend_->fill(on * kvd_, 0.f, dst), "fill");
          check_status(backend_->axpy((phi - plo) * kvd_, 1.f, part + (t * bt + plo) * kvd_,
                                      dst + (plo - o.lo) * kvd_),
                       "axpy");
          if (in_bytes)
            check_status(backend_->axpy(in_n * kvd_, 1.f, id + t * in_n * kvd_,
                                        dst + (ir.lo - o.lo) * kvd_),
                         "axpy");
        }
        if (dw != kernels::DType::kF32)
          check_status(backend_->convert(kernels::DType::kF32, dw, 2 * on * kvd_, od, out + 64),
                       "convert (dK/dV accumulator)");
        out_bytes = dkv_message_bytes(on, kvd_, de);
      }
      rstats_.compute_s += seconds_since(t0);
    }
    rstats_.hops++;
    rstats_.bytes_sent += static_cast<int64_t>(out_bytes);
    dkv_send[cur] = progress_->post_send(out, out_bytes, ring_.next, kTagDkv);
    posted(dkv_send[cur]);
    received = finish(&hr, "receive of a K/V block from", ring_.prev, call.layer, s, true);
    finish(&hs, "send of a K/V block to", ring_.next, call.layer, s, false);
  }
  // The own block's accumulator comes home after its P-th hop: dK/dV = own partial + its rows.
  float* own = dkv_own_.data();
  if (comm) {
    const char* home = dkv_in_[p % 2].data();
    int hd = progress_->post_recv(dkv_in_[p % 2].data(), dkv_cap, ring_.prev, kTagDkv);
    posted(hd);
    const size_t got = finish(&hd, "receive of the own dK/dV accumulator from", ring_.prev,
                              call.layer, p, true);
    for (int& h : dkv_send)
      finish(&h, "send of a dK/dV accumulator to", ring_.next, call.layer, p, false);
    const Range r = parse(home, got, t, p);
    if (got) {
      const auto t0 = Clock::now();
      const int64_t n = r.hi - r.lo;
      const float* hd_rows = rows_of(home, n);
      for (int k = 0; k < 2; ++k)
        check_status(backend_->axpy(n * kvd_, 1.f, hd_rows + k * n * kvd_,
                                    own + (k * t + r.lo) * kvd_),
                     "axpy");
      rstats_.compute_s += seconds_since(t0);
    }
  }
  const size_t own_bytes = static_cast<size_t>(t * kvd_) * sizeof(float);
  std::memcpy(dk, own, own_bytes);
  std::memcpy(dv, own + t * kvd_, own_bytes);
}

}  // namespace ring::cp
