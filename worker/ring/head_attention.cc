#include "worker/ring/head_attention.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "common/contract/timeline.h"
#include "common/cp/ring_messages.h"

namespace ring::cp {

using model::check_status;
namespace timeline = contract::timeline;

namespace {

size_t align64(size_t x) { return (x + 63) & ~size_t{63}; }

// The parts of one member's message, in order, as (bytes) each 64-byte aligned.
struct Parts {
  std::vector<size_t> offset;  // [n] offsets inside the message
  size_t total = 0;
  void add(size_t bytes) {
    offset.push_back(total);
    total += align64(bytes);
  }
};

}  // namespace

HeadLayout make_head_layout(int rank, int world, int head_ranks, const std::vector<int>& order) {
  if (head_ranks < 1 || world % head_ranks != 0)
    throw std::invalid_argument(fmt::format(
        "parallel.head_ranks ({}) must divide the ranks of the sequence ({})", head_ranks, world));
  if (static_cast<int>(order.size()) != world)
    throw std::invalid_argument(
        fmt::format("ring order has {} entries, the ring has {} ranks", order.size(), world));
  HeadLayout l;
  l.head_ranks = head_ranks;
  l.slot = rank % head_ranks;
  const int first = rank - l.slot;
  for (int i = 0; i < head_ranks; ++i) l.group.push_back(first + i);
  // Groups in the order their ranks first appear in the ring order.
  std::vector<int> groups;
  std::vector<char> seen(static_cast<size_t>(world / head_ranks), 0);
  for (int r : order) {
    if (r < 0 || r >= world)
      throw std::invalid_argument(fmt::format("ring order names rank {}, not in 0..{}", r,
                                              world - 1));
    if (!seen[r / head_ranks]++) groups.push_back(r / head_ranks);
  }
  std::vector<int> ring_order;
  for (int g : groups) ring_order.push_back(g * head_ranks + l.slot);
  l.ring = make_sub_ring(rank, world, ring_order);
  return l;
}

int64_t HeadParallelAttention::Heads::kv0(int slot) const {
  if (kv_heads % u == 0) return slot * hkv;
  return (slot * hq) / (heads / kv_heads);  // replicated: the K/V head of the slot's queries
}

HeadParallelAttention::HeadParallelAttention(kernels::Backend* backend, ProgressEngine* progress,
                                             HeadLayout layout, RingAttention::Options options)
    : backend_(backend),
      progress_(progress),
      layout_(std::move(layout)),
      options_(options),
      ring_(backend, progress, layout_.ring, options) {
  if (!progress_->comm().api().all_to_all)
    throw std::invalid_argument(fmt::format(
        "parallel.head_ranks {}: the transport '{}' has no all_to_all (transport.h); use "
        "head_ranks 1 or a transport that has it (ucx, nccl)",
        layout_.head_ranks, progress_->comm().api().name));
}

RingStats HeadParallelAttention::ring_stats() const {
  RingStats s = ring_.ring_stats();
  s.a2a_calls = a2a_calls_;
  s.a2a_bytes_sent = a2a_bytes_;
  s.a2a_s = a2a_s_;
  return s;
}

HeadParallelAttention::Heads HeadParallelAttention::heads_of(
    const model::AttentionCall& call) const {
  Heads h;
  h.u = layout_.head_ranks;
  h.heads = call.heads;
  h.kv_heads = call.kv_heads;
  h.hd = call.head_dim;
  if (call.heads % h.u != 0 || (call.kv_heads % h.u != 0 && h.u % call.kv_heads != 0))
    throw model::ModelError(fmt::format(
        "head-parallel attention: {} heads and {} K/V heads cannot be split over head_ranks {} "
        "(it must divide the heads, and divide the K/V heads or be a multiple of them)",
        call.heads, call.kv_heads, h.u));
  h.hq = call.heads / h.u;
  h.hkv = head_slot_kv_heads(call.kv_heads, h.u);
  return h;
}

void HeadParallelAttention::all_to_all(const char* what, int layer,
                                       const std::vector<size_t>& send_bytes,
                                       const std::vector<size_t>& recv_bytes) {
  const int u = layout_.head_ranks;
  timeline::TimelineWriter* tl = timeline::active();
  const int64_t step_no = tl ? tl->step() : 0;
  // In the flight recorder as the level it is (a hang inside the group names the group).
  const int first = layout_.group.front() + options_.rank_offset;
  if (tl) tl->wait_begin(timeline::Phase::kHeadAllToAll, step_no, layer, static_cast<int16_t>(u), first);
  const int64_t t0 = timeline::now_ns();
  progress_->collective([&](transport::TransportComm& c) {
    const ring_transport_status_t st = c.api().all_to_all(
        c.get(), layout_.group.data(), u, send_.data(), send_off_.data(), send_bytes.data(),
        recv_.data(), recv_off_.data(), recv_bytes.data(), options_.timeout_ms);
    if (st != RING_TRANSPORT_OK)
      throw transport::TransportError(
          st, fmt::format("head-parallel attention: rank {} (slot {} of the head group {}..{}), "
                          "layer {}: all-to-all of {} inside the group failed: {}: {}",
                          layout_.ring.rank + options_.rank_offset, layout_.slot,
                          layout_.group.front() + options_.rank_offset,
                          layout_.group.back() + options_.rank_offset, layer, what,
                          ring_transport_status_name(st), c.api().last_error(c.get())));
  });
  const int64_t t1 = timeline::now_ns();
  if (tl) {
    tl->wait_end();
    tl->record({.kind = timeline::Phase::kHeadAllToAll, .step = step_no, .layer = layer,
                .hop = static_cast<int16_t>(u), .peer = first, .begin_ns = t0, .end_ns = t1});
  }
  a2a_s_ += (t1 - t0) * 1e-9;
  ++a2a_calls_;
  for (int b = 0; b < u; ++b)
    if (b != layout_.slot) a2a_bytes_ += static_cast<int64_t>(send_bytes[b]);
}

void HeadParallelAttention::exchange_counts(int64_t tokens, int layer) {
  const int u = layout_.head_ranks;
  std::vector<size_t> bytes(u, sizeof(int64_t));
  send_off_.resize(u);
  recv_off_.resize(u);
  for (int b = 0; b < u; ++b) send_off_[b] = recv_off_[b] = b * sizeof(int64_t);
  send_.resize(backend_, static_cast<int64_t>(u * sizeof(int64_t)));
  recv_.resize(backend_, static_cast<int64_t>(u * sizeof(int64_t)));
  for (int b = 0; b < u; ++b) std::memcpy(send_.data() + send_off_[b], &tokens, sizeof(tokens));
  all_to_all("the token counts", layer, bytes, bytes);
  tokens_of_.assign(u, 0);
  offset_of_.assign(u + 1, 0);
  for (int a = 0; a < u; ++a) {
    std::memcpy(&tokens_of_[a], recv_.data() + recv_off_[a], sizeof(int64_t));
    if (tokens_of_[a] < 0)
      throw model::ModelError(fmt::format("head-parallel attention: member {} reports {} tokens",
                                          layout_.group[a], tokens_of_[a]));
    offset_of_[a + 1] = offset_of_[a] + tokens_of_[a];
  }
}

model::AttentionCall HeadParallelAttention::gather(const model::AttentionCall& call,
                                                   const Heads& h, bool backward,
                                                   const float* out, const float* lse,
                                                   const float* dout) {
  const int u = layout_.head_ranks;
  const bool docs = call.doc_ids != nullptr;
  const kernels::DType wire = options_.wire;
  const size_t e = kernels::dtype_size(wire);
  const int64_t wq = h.hq * h.hd, wkv = h.hkv * h.hd;
  // The parts of a message of T tokens: pos, doc, q, k, v [, out, lse, dout].
  auto parts = [&](int64_t t) {
    Parts p;
    p.add(t * sizeof(int64_t));
    p.add(docs ? t * sizeof(int32_t) : 0);
    p.add(t * wq * e);
    p.add(t * wkv * e);
    p.add(t * wkv * e);
    if (backward) {
      p.add(t * wq * sizeof(float));
      p.add(t * h.hq * sizeof(float));
      p.add(t * wq * sizeof(float));
    }
    return p;
  };
  const int64_t t = call.tokens;
  const Parts mine = parts(t);
  // common/cp/ring_messages.h states the same size for the planner.
  if (mine.total != head_gather_bytes(t, h.hq, h.hkv, h.hd, e, docs, backward))
    throw std::logic_error("head-parallel attention: gather message layout");
  std::vector<size_t> send_bytes(u), recv_bytes(u);
  send_off_.assign(u, 0);
  recv_off_.assign(u, 0);
  size_t st = 0, rt = 0;
  for (int b = 0; b < u; ++b) {
    send_off_[b] = st;
    send_bytes[b] = mine.total;
    st += mine.total;
    recv_off_[b] = rt;
    recv_bytes[b] = parts(tokens_of_[b]).total;
    rt += recv_bytes[b];
  }
  send_.resize(backend_, static_cast<int64_t>(st));
  recv_.resize(backend_, static_cast<int64_t>(rt));

  // Pack: for member b, the columns [col, col + width) of each of this rank's T rows.
  std::vector<float> rows;
  auto pack = [&](const float* src, int64_t stride, int64_t col, int64_t width, char* dst,
                  kernels::DType as) {
    float* d = as == kernels::DType::kF32 ? reinterpret_cast<float*>(dst) : nullptr;
    if (!d) {
      rows.resize(static_cast<size_t>(t * width));
      d = rows.data();
    }
    for (int64_t i = 0; i < t; ++i)
      std::memcpy(d + i * width, src + i * stride + col, width * sizeof(float));
    if (as != kernels::DType::kF32)
      check_status(backend_->convert(kernels::DType::kF32, as, t * width, d, dst),
                   "convert (head all-to-all)");
  };
  for (int b = 0; b < u; ++b) {
    char* m = send_.data() + send_off_[b];
    std::memcpy(m + mine.offset[0], call.positions, t * sizeof(int64_t));
    if (docs) std::memcpy(m + mine.offset[1], call.doc_ids, t * sizeof(int32_t));
    pack(call.q, h.heads * h.hd, b * wq, wq, m + mine.offset[2], wire);
    pack(call.k, h.kv_heads * h.hd, h.kv0(b) * h.hd, wkv, m + mine.offset[3], wire);
    pack(call.v, h.kv_heads * h.hd, h.kv0(b) * h.hd, wkv, m + mine.offset[4], wire);
    if (backward) {
      pack(out, h.heads * h.hd, b * wq, wq, m + mine.offset[5], kernels::DType::kF32);
      pack(lse, h.heads, b * h.hq, h.hq, m + mine.offset[6], kernels::DType::kF32);
      pack(dout, h.heads * h.hd, b * wq, wq, m + mine.offset[7], kernels::DType::kF32);
    }
  }
  all_to_all(backward ? "q, k, v, o, lse and dout" : "q, k and v", call.layer, send_bytes,
             recv_bytes);

  // The group's tokens in position order.
  const int64_t tg = offset_of_[u];
  std::vector<int64_t> concat_pos(static_cast<size_t>(tg));
  for (int a = 0; a < u; ++a)
    std::memcpy(concat_pos.data() + offset_of_[a],
                recv_.data() + recv_off_[a] + parts(tokens_of_[a]).offset[0],
                tokens_of_[a] * sizeof(int64_t));
  perm_.resize(static_cast<size_t>(tg));
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  std::stable_sort(perm_.begin(), perm_.end(),
                   [&](int64_t x, int64_t y) { return concat_pos[x] < concat_pos[y]; });
  g_pos_.resize(backend_, tg);
  for (int64_t i = 0; i < tg; ++i) g_pos_.data()[i] = concat_pos[perm_[i]];
  if (docs) {
    std::vector<int32_t> concat_doc(static_cast<size_t>(tg));
    for (int a = 0; a < u; ++a)
      std::memcpy(concat_doc.data() + offset_of_[a],
                  recv_.data() + recv_off_[a] + parts(tokens_of_[a]).offset[1],
                  tokens_of_[a] * sizeof(int32_t));
    g_doc_.resize(backend_, tg);
    for (int64_t i = 0; i < tg; ++i) g_doc_.data()[i] = concat_doc[perm_[i]];
  }
  // Unpack part k of every member (width floats per token) into dst in position order.
  auto unpack = [&](int k, int64_t width, kernels::DType as, model::DeviceArray<float>* dst) {
    stage_.resize(backend_, tg * width);
    for (int a = 0; a < u; ++a) {
      const char* src = recv_.data() + recv_off_[a] + parts(tokens_of_[a]).offset[k];
      float* s = stage_.data() + offset_of_[a] * width;
      const int64_t n = tokens_of_[a] * width;
      if (as == kernels::DType::kF32)
        std::memcpy(s, src, n * sizeof(float));
      else
        check_status(backend_->convert(as, kernels::DType::kF32, n, src, s),
                     "convert (head all-to-all)");
    }
    dst->resize(backend_, tg * width);
    for (int64_t i = 0; i < tg; ++i)
      std::memcpy(dst->data() + i * width, stage_.data() + perm_[i] * width,
                  width * sizeof(float));
  };
  unpack(2, wq, wire, &g_q_);
  unpack(3, wkv, wire, &g_k_);
  unpack(4, wkv, wire, &g_v_);
  if (backward) {
    unpack(5, wq, kernels::DType::kF32, &g_out_);
    unpack(6, h.hq, kernels::DType::kF32, &g_lse_);
    unpack(7, wq, kernels::DType::kF32, &g_dout_);
  }
  model::AttentionCall g;
  g.layer = call.layer;
  g.tokens = tg;
  g.heads = h.hq;
  g.kv_heads = h.hkv;
  g.head_dim = h.hd;
  g.scale = call.scale;
  g.positions = g_pos_.data();
  g.doc_ids = docs ? g_doc_.data() : nullptr;
  g.q = g_q_.data();
  g.k = g_k_.data();
  g.v = g_v_.data();
  return g;
}

void HeadParallelAttention::scatter(
    int layer, const std::vector<const float*>& parts, const std::vector<int64_t>& widths,
    const std::function<void(int slot, int part, const float* rows)>& place) {
  const int u = layout_.head_ranks;
  const int64_t tg = offset_of_[u];
  std::vector<int64_t> inv(static_cast<size_t>(tg));
  for (int64_t i = 0; i < tg; ++i) inv[perm_[i]] = i;
  auto layout = [&](int64_t t) {
    Parts p;
    for (int64_t w : widths) p.add(t * w * sizeof(float));
    return p;
  };
  std::vector<size_t> send_bytes(u), recv_bytes(u);
  send_off_.assign(u, 0);
  recv_off_.assign(u, 0);
  size_t st = 0, rt = 0;
  const Parts mine = layout(tokens_of_[layout_.slot]);
  const int64_t hd = widths.size() == 2 ? widths[0] / widths[1] : 0;  // forward: (hq hd, hq)
  if (widths.size() == 2 &&
      mine.total != head_return_bytes(tokens_of_[layout_.slot], widths[1], 0, hd, false))
    throw std::logic_error("head-parallel attention: return message layout");
  for (int a = 0; a < u; ++a) {
    send_off_[a] = st;
    send_bytes[a] = layout(tokens_of_[a]).total;
    st += send_bytes[a];
    recv_off_[a] = rt;
    recv_bytes[a] = mine.total;
    rt += mine.total;
  }
  send_.resize(backend_, static_cast<int64_t>(st));
  recv_.resize(backend_, static_cast<int64_t>(rt));
  for (int a = 0; a < u; ++a) {
    const Parts p = layout(tokens_of_[a]);
    char* m = send_.data() + send_off_[a];
    for (size_t k = 0; k < parts.size(); ++k) {
      float* d = reinterpret_cast<float*>(m + p.offset[k]);
      const int64_t w = widths[k];
      for (int64_t t = 0; t < tokens_of_[a]; ++t)
        std::memcpy(d + t * w, parts[k] + inv[offset_of_[a] + t] * w, w * sizeof(float));
    }
  }
  all_to_all(parts.size() == 2 ? "the attention output" : "dq, dk and dv", layer, send_bytes,
             recv_bytes);
  for (int b = 0; b < u; ++b)
    for (size_t k = 0; k < parts.size(); ++k)
      place(b, static_cast<int>(k),
            reinterpret_cast<const float*>(recv_.data() + recv_off_[b] + mine.offset[k]));
}

void HeadParallelAttention::forward(const model::AttentionCall& call, float* out, float* lse) {
  const Heads h = heads_of(call);
  if (call.layer == 0 || tokens_of_.empty()) exchange_counts(call.tokens, call.layer);
  if (tokens_of_[layout_.slot] != call.tokens)
    throw model::ModelError(fmt::format(
        "head-parallel attention: layer {} has {} tokens on slot {}, the group agreed on {}",
        call.layer, call.tokens, layout_.slot, tokens_of_[layout_.slot]));
  const model::AttentionCall g = gather(call, h, false, nullptr, nullptr, nullptr);
  g_out_.resize(backend_, g.tokens * h.hq * h.hd);
  g_lse_.resize(backend_, g.tokens * h.hq);
  ring_.forward(g, g_out_.data(), g_lse_.data());
  const int64_t t = call.tokens, wq = h.hq * h.hd;
  scatter(call.layer, {g_out_.data(), g_lse_.data()}, {wq, h.hq},
          [&](int b, int k, const float* rows) {
            for (int64_t i = 0; i < t; ++i) {
              if (k == 0)
                std::memcpy(out + (i * h.heads + b * h.hq) * h.hd, rows + i * wq,
                            wq * sizeof(float));
              else
                std::memcpy(lse + i * h.heads + b * h.hq, rows + i * h.hq,
                            h.hq * sizeof(float));
            }
          });
}

void HeadParallelAttention::backward(const model::AttentionCall& call, const float* out,
                                     const float* lse, const float* dout, float* dq, float* dk,
                                     float* dv) {
  const Heads h = heads_of(call);
  if (tokens_of_.empty() || tokens_of_[layout_.slot] != call.tokens)
    throw model::ModelError(fmt::format(
        "head-parallel attention: backward of layer {} with {} tokens on slot {}, but the "
        "forward's group agreed on {}",
        call.layer, call.tokens, layout_.slot,
        tokens_of_.empty() ? int64_t{-1} : tokens_of_[layout_.slot]));
  const model::AttentionCall g = gather(call, h, true, out, lse, dout);
  const int64_t tg = g.tokens, wq = h.hq * h.hd, wkv = h.hkv * h.hd;
  g_dq_.resize(backend_, tg * wq);
  g_dk_.resize(backend_, tg * wkv);
  g_dv_.resize(backend_, tg * wkv);
  ring_.backward(g, g_out_.data(), g_lse_.data(), g_dout_.data(), g_dq_.data(), g_dk_.data(),
                 g_dv_.data());
  const int64_t t = call.tokens, kvw = h.kv_heads * h.hd;
  const bool replicated = h.kv_heads % h.u != 0;
  // A replicated K/V head gets the sum of its slots' dK/dV, in slot order.
  if (replicated) {
    check_status(backend_->fill(t * kvw, 0.f, dk), "fill");
    check_status(backend_->fill(t * kvw, 0.f, dv), "fill");
  }
  scatter(call.layer, {g_dq_.data(), g_dk_.data(), g_dv_.data()}, {wq, wkv, wkv},
          [&](int b, int k, const float* rows) {
            if (k == 0) {
              for (int64_t i = 0; i < t; ++i)
                std::memcpy(dq + (i * h.heads + b * h.hq) * h.hd, rows + i * wq,
                            wq * sizeof(float));
              return;
            }
            float* dst = k == 1 ? dk : dv;
            const int64_t col = h.kv0(b) * h.hd;
            for (int64_t i = 0; i < t; ++i) {
              float* d = dst + i * kvw + col;
              const float* s = rows + i * wkv;
              if (!replicated) {
                std::memcpy(d, s, wkv * sizeof(float));
              } else {
                for (int64_t j = 0; j < wkv; ++j) d[j] += s[j];
              }
            }
          });
}

std::unique_ptr<ContextAttention> make_context_attention(kernels::Backend* backend,
                                                         ProgressEngine* progress,
                                                         const RingTopology& ring,
                                                         int head_ranks,
                                                         RingAttention::Options options) {
  if (head_ranks <= 1) return std::make_unique<RingAttention>(backend, progress, ring, options);
  return std::make_unique<HeadParallelAttention>(
      backend, progress, make_head_layout(ring.rank, ring.world, head_ranks, ring.order),
      options);
}

}  // namespace ring::cp
