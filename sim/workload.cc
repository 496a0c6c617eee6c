#include "sim/workload.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/plan/plan.h"
#include "fmt/format.h"
#include "common/cp/ring_messages.h"

namespace ring::sim {

namespace {

// Pairs (q, k) with k <= q, q in [a, b), k in [c, d): the causal pairs of two ranges of one
// document.
double causal_pairs(int64_t a, int64_t b, int64_t c, int64_t d) {
  if (a >= b || c >= d) return 0;
  // sum over q in [a, b) of |[c, min(d, q + 1))|
  double total = 0;
  // q < c: none. q in [max(a, c), min(b, d)): q - c + 1. q >= d: d - c.
  const int64_t lo = std::max(a, c), hi = std::min(b, d);
  if (lo < hi) {
    const double n = static_cast<double>(hi - lo);
    const double first = static_cast<double>(lo - c + 1);
    total += n * first + n * (n - 1) / 2;
  }
  const int64_t full_lo = std::max(a, d);
  if (full_lo < b) total += static_cast<double>(b - full_lo) * static_cast<double>(d - c);
  return total;
}

// parallel.head_ranks U > 1: the ring positions become the R = P / U groups (their members'
// token ranges, merged in position order as head_attention.h orders a group's tokens), the
// rings the U head slots of every replica; the ring's blocks carry U T tokens of the slot's K/V
// heads; the all-to-all messages from common/cp/ring_messages.h, as `ringctl plan` sizes them.
void to_head_groups(const spec::JobSpec& s, Workload* w) {
  const int64_t U = w->head_ranks, P = w->P, T = w->tokens;
  if (P % U != 0 || w->heads % U != 0)
    throw std::invalid_argument(fmt::format(
        "simulate: parallel.head_ranks {} must divide context_ranks {} and model.heads {}", U, P,
        w->heads));
  const int64_t R = P / U, hq = w->heads / U, hkv = cp::head_slot_kv_heads(w->kv_heads, U);
  const auto b = static_cast<size_t>(spec::dtype_bytes(s.model.dtype));
  const double others = static_cast<double>(U - 1);
  const int64_t hd = w->head_dim;
  w->a2a_gather_fwd = others * static_cast<double>(cp::head_gather_bytes(T, hq, hkv, hd, b, true, false));
  w->a2a_return_fwd = others * static_cast<double>(cp::head_return_bytes(T, hq, hkv, hd, false));
  w->a2a_gather_bwd = others * static_cast<double>(cp::head_gather_bytes(T, hq, hkv, hd, b, true, true));
  w->a2a_return_bwd = others * static_cast<double>(cp::head_return_bytes(T, hq, hkv, hd, true));
  std::vector<std::vector<cp::TokenRange>> groups(R);
  w->tokens = 0;
  for (int64_t r = 0; r < R; ++r) {
    // The k-th range of every member (zigzag: the early chunks, then the late ones) are
    // consecutive chunks: one range each, so a group's ranges are a zigzag share over R.
    std::vector<cp::TokenRange> all;
    int64_t t = 0;
    for (size_t k = 0; k < w->ranges[r * U].size(); ++k) {
      std::vector<cp::TokenRange> part;
      for (int64_t a = 0; a < U; ++a)
        if (k < w->ranges[r * U + a].size()) part.push_back(w->ranges[r * U + a][k]);
      std::sort(part.begin(), part.end(),
                [](const cp::TokenRange& x, const cp::TokenRange& y) { return x.begin < y.begin; });
      for (const cp::TokenRange& x : part) {
        t += x.size();
        if (!all.empty() && all.back().end == x.begin && &x != &part.front())
          all.back().end = x.end;
        else
          all.push_back(x);
      }
    }
    std::sort(all.begin(), all.end(),
              [](const cp::TokenRange& x, const cp::TokenRange& y) { return x.begin < y.begin; });
    groups[r] = std::move(all);
    w->tokens = std::max(w->tokens, t);
  }
  w->ranges = std::move(groups);
  w->P = R;
  w->D = w->replicas * U;
  w->heads = hq;
  w->kv_heads = hkv;
  w->kvd = hkv * hd;
  w->kv_block_bytes = static_cast<double>(cp::packed_block_bytes(w->tokens, w->kvd, b));
}

}  // namespace

double Workload::pairs(int64_t q, int64_t origin) const {
  double total = 0;
  for (const auto& qr : ranges[q])
    for (const auto& kr : ranges[origin]) {
      if (doc_len >= seq_len) {
        total += causal_pairs(qr.begin, qr.end, kr.begin, kr.end);
        continue;
      }
      // Documents [m D, (m+1) D) meeting both ranges.
      const int64_t m0 = std::max(qr.begin, kr.begin) / doc_len;
      const int64_t m1 = (std::min(qr.end, kr.end) - 1) / doc_len;
      for (int64_t m = m0; m <= m1; ++m) {
        const int64_t ds = m * doc_len, de = std::min(seq_len, ds + doc_len);
        total += causal_pairs(std::max(qr.begin, ds), std::min(qr.end, de), std::max(kr.begin, ds),
                              std::min(kr.end, de));
      }
    }
  return total;
}

std::pair<int64_t, int64_t> Workload::key_rows(int64_t q, int64_t origin) const {
  // Row offsets of the block's ranges (ascending, concatenated).
  int64_t lo = -1, hi = -1, row = 0;
  for (const auto& kr : ranges[origin]) {
    // Allowed keys k in kr: exists query position p >= k in the same document.
    for (const auto& qr : ranges[q]) {
      if (qr.size() == 0) continue;
      // Within one document [ds, de): keys [max(kr.begin, ds), min(kr.end, de, latest q + 1)).
      const int64_t m0 = kr.begin / doc_len, m1 = (kr.end - 1) / doc_len;
      for (int64_t m = m0; m <= m1; ++m) {
        const int64_t ds = m * doc_len, de = std::min(seq_len, ds + doc_len);
        const int64_t qa = std::max(qr.begin, ds), qb = std::min(qr.end, de);
        if (qa >= qb) continue;
        const int64_t ka = std::max(kr.begin, ds), kb = std::min({kr.end, de, qb});
        if (ka >= kb) continue;
        const int64_t r0 = row + (ka - kr.begin), r1 = row + (kb - kr.begin);
        lo = lo < 0 ? r0 : std::min(lo, r0);
        hi = std::max(hi, r1);
      }
    }
    row += kr.size();
  }
  if (lo < 0) return {0, 0};
  return {lo, hi};
}

int64_t Workload::dkv_rows(int64_t origin, int64_t s) const {
  if (simple_causal_ && balance == spec::CausalBalance::kZigzag) {
    // Position q attends to the block's early chunk always and to its late chunk iff origin > q;
    // positions origin+1 .. origin+s include one below origin exactly when they wrap past P-1.
    const int64_t chunk = ranges[origin][0].size();
    return origin + s >= P ? ranges[origin][0].size() + ranges[origin][1].size() : chunk;
  }
  auto& c = hull_cache_[origin];
  if (c.empty()) {
    c.resize(P);
    int64_t lo = -1, hi = -1;
    for (int64_t k = 1; k < P; ++k) {
      auto [a, b] = key_rows((origin + k) % P, origin);
      if (b > a) {
        lo = lo < 0 ? a : std::min(lo, a);
        hi = std::max(hi, b);
      }
      c[k] = {lo < 0 ? 0 : lo, hi < 0 ? 0 : hi};
    }
  }
  return c[std::min<int64_t>(s, P - 1)].second - c[std::min<int64_t>(s, P - 1)].first;
}

double Workload::bucket_payload(size_t b) const {
  const int64_t n = bucket_floats[b];
  if (compression == spec::Compression::kTopk)
    return 8.0 * static_cast<double>(plan::bucket_topk(density, n));  // u32 index + fp32 value
  return 4.0 * static_cast<double>(n);
}

void Workload::finish() {
  simple_causal_ = doc_len >= seq_len;
  // Rotation invariance: every off-diagonal pair has the same work and every diagonal too.
  rotation_invariant_ = true;
  if (P > 1) {
    const double diag = pairs(0, 0), off = pairs(0, 1);
    const int64_t probe = std::min<int64_t>(P, 64);
    for (int64_t q = 0; q < probe && rotation_invariant_; ++q)
      for (int64_t o = 0; o < P && rotation_invariant_; o += std::max<int64_t>(1, P / 64))
        rotation_invariant_ = pairs(q, o) == (q == o ? diag : off);
  }
  if (!simple_causal_) hull_cache_.assign(P, {});
}

Workload make_workload(const spec::JobSpec& s) {
  Workload w;
  w.P = s.parallel.context_ranks;
  w.D = s.parallel.data_replicas;
  w.replicas = w.D;
  w.head_ranks = std::max<int64_t>(1, s.parallel.head_ranks);
  w.nodes = s.resources.nodes;
  w.workers_per_node = s.resources.workers_per_node;
  w.layers = s.model.layers;
  w.micro_batches = std::max<int64_t>(1, s.train.micro_batches);
  w.seq_len = s.data.seq_len;
  w.doc_len = (s.data.pack && s.data.max_doc_len > 0) ? std::min(s.data.max_doc_len, s.data.seq_len)
                                                       : s.data.seq_len;
  w.balance = s.parallel.causal_balance;
  w.recompute = s.model.recompute;
  w.selective = s.model.recompute && s.model.recompute_policy == spec::RecomputePolicy::kSelective;
  w.heads = s.model.heads;
  w.kv_heads = s.resolved.kv_heads;
  w.head_dim = s.resolved.head_dim;
  w.d_model = s.model.d_model;
  w.hidden = s.resolved.mlp_hidden;
  w.vocab = s.model.vocab;
  w.kvd = w.kv_heads * w.head_dim;
  w.ranges.resize(w.P);
  for (int64_t r = 0; r < w.P; ++r) {
    w.ranges[r] = cp::rank_ranges(w.seq_len, w.P, r, w.balance);
    int64_t t = 0;
    for (const auto& x : w.ranges[r]) t += x.size();
    w.tokens = std::max(w.tokens, t);
  }
  const double T = static_cast<double>(w.tokens);
  const double d = static_cast<double>(w.d_model), hd = static_cast<double>(w.head_dim);
  w.pre_fwd_flops = 2 * T * d * (static_cast<double>(w.heads + 2 * w.kv_heads) * hd);
  const double mlp_mats = s.model.mlp == spec::MlpKind::kSwiGLU ? 3 : 2;
  w.post_fwd_flops = 2 * T * (static_cast<double>(w.heads) * hd * d) +
                     2 * T * d * static_cast<double>(w.hidden) * mlp_mats;
  w.selective_flops = 2 * T * (static_cast<double>(w.heads) * hd * d) +
                      2 * T * d * static_cast<double>(w.hidden) * (mlp_mats - 1);
  w.head_fwd_flops = 2 * T * d * static_cast<double>(w.vocab);
  w.kv_block_bytes = static_cast<double>(
      cp::packed_block_bytes(w.tokens, w.kvd, static_cast<size_t>(spec::dtype_bytes(s.model.dtype))));
  if (w.head_ranks > 1) to_head_groups(s, &w);

  const plan::FlatLayout fl = plan::flat_layout(s);
  if (fl.bucket_sizes.empty())
    throw std::invalid_argument("simulate: the model's parameter count overflows the flat layout");
  w.bucket_floats = fl.bucket_sizes;
  w.params = fl.elements;
  w.compression = s.optimizer.compression;
  w.topk_at_owner = s.optimizer.compress_at == spec::CompressAt::kOwner;
  w.density = s.optimizer.density;
  w.shard = s.parallel.shard;
  if (w.shard == spec::ShardMode::kFull) w.full_shard = plan::full_shard_layout(s);
  w.grad_clip = s.train.grad_clip;
  w.checkpoint_every = s.checkpoint.every_steps;
  w.checkpoint_async = s.checkpoint.async;
  w.stagger_us = s.parallel.stagger_us;
  w.warmup_steps = s.optimizer.warmup_steps;
  w.finish();
  return w;
}

}  // namespace ring::sim
