#include "common/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/cp/ring_messages.h"
#include "common/cp/shard_messages.h"
#include "common/cp/split.h"
#include "common/contract/layout_rules.h"
#include "common/contract/shm.h"

namespace ring::plan {

using spec::Backend;
using spec::Compression;
using spec::JobSpec;
using spec::MlpKind;
using spec::Offload;
using spec::ShardMode;

const std::vector<GpuModel>& gpu_models() {
  // Total memory as the driver reports it (nvidia-smi "FB Memory Usage: Total").
  static const std::vector<GpuModel> m = {
      {spec::GpuType::kA100_80G, "A100-80G", 81920.0 * (1 << 20)},
      {spec::GpuType::kH100_80G, "H100-80G", 81559.0 * (1 << 20)},
      {spec::GpuType::kH200_141G, "H200-141G", 143771.0 * (1 << 20)},
  };
  return m;
}

namespace {

double sum(const std::vector<Item>& items) {
  double s = 0;
  for (const auto& i : items) s += i.bytes;
  return s;
}

}  // namespace

std::string human_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (std::fabs(b) >= 1000.0 && u < 5) b /= 1000.0, ++u;
  if (u == 0) return fmt::format("{:.0f} B", b);
  return fmt::format("{:.{}f} {}", b, b >= 100 ? 1 : 3, units[u]);
}

std::string human_count(double n) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  // Step up where the value would round to 1000: 999,999 reads "1.00 M", not "1000 K".
  while (u < 4 && std::fabs(n) >= 999.5) n /= 1000.0, ++u;
  if (u == 0) return fmt::format("{:.0f}", n);
  const double a = std::fabs(n);
  return fmt::format("{:.{}f}{}", n, a >= 99.95 ? 0 : a >= 9.995 ? 1 : 2, units[u]);
}

// The layout's rules (common/contract/layout_rules.h) in __int128: a spec's largest shapes
// (d_model, vocab, layers at their key maxima) overflow int64 only in products we then saturate.
FlatLayout flat_layout(const JobSpec& s) {
  using I = __int128;
  const auto& m = s.model;
  const contract::LayoutShape<I> shape{I{m.d_model},
                                       I{m.heads} * s.resolved.head_dim,
                                       I{s.resolved.kv_heads} * s.resolved.head_dim,
                                       I{s.resolved.mlp_hidden},
                                       I{m.vocab},
                                       m.tie_embeddings,
                                       m.mlp == spec::MlpKind::kSwiGLU};
  auto head_of = [](const auto& sh, auto&& v) { contract::head_tensors(sh, v); };
  auto block_of = [](const auto& sh, auto&& v) { contract::block_tensors(sh, v); };
  auto embedding_of = [](const auto& sh, auto&& v) { contract::embedding_tensors(sh, v); };
  const I head = contract::bucket_span(shape, head_of);
  const I block = contract::bucket_span(shape, block_of);  // every block has the same shape
  const I embedding = contract::bucket_span(shape, embedding_of);
  const I total = head + block * I{m.layers} + embedding;
  I largest = head;
  std::string largest_name = "head";
  if (m.layers > 0 && block > largest) largest = block, largest_name = "layers.N (each block)";
  if (embedding > largest) largest = embedding, largest_name = "embedding";
  const I cap = std::numeric_limits<int64_t>::max();
  FlatLayout f;
  f.elements = static_cast<int64_t>(std::min(total, cap));
  f.largest_bucket = static_cast<int64_t>(std::min(largest, cap));
  f.largest_bucket_name = largest_name;
  if (total < cap) {
    f.bucket_sizes.reserve(static_cast<size_t>(m.layers) + 2);
    f.bucket_sizes.push_back(static_cast<int64_t>(head));
    for (int64_t l = 0; l < m.layers; ++l) f.bucket_sizes.push_back(static_cast<int64_t>(block));
    f.bucket_sizes.push_back(static_cast<int64_t>(embedding));
  }
  return f;
}

std::vector<size_t> shard_first_buckets(const std::vector<int64_t>& b, int64_t nodes) {
  return contract::first_buckets(b, nodes);
}

std::vector<int64_t> shard_range_sizes(const std::vector<int64_t>& b, int64_t nodes) {
  const auto first = shard_first_buckets(b, nodes);
  std::vector<int64_t> out(first.size() - 1, 0);
  for (size_t k = 0; k + 1 < first.size(); ++k)
    for (size_t i = first[k]; i < first[k + 1]; ++i) out[k] += b[i];
  return out;
}

int64_t FullShardLayout::part(size_t b, int64_t g) const {
  const int64_t lo = std::max(bucket_begin[b], shard_begin[static_cast<size_t>(g)]);
  const int64_t hi = std::min(bucket_begin[b + 1], shard_end[static_cast<size_t>(g)]);
  return std::max<int64_t>(0, hi - lo);
}

double FullShardLayout::gather_message_bytes(size_t b, int64_t q) const {
  return static_cast<double>(cp::shard_gather_bytes(part(b, q), gather_elem_bytes));
}

double FullShardLayout::scatter_message_bytes(size_t b, int64_t q) const {
  return static_cast<double>(cp::shard_scatter_bytes(part(b, q)));
}

// A bucket's parts lie on its owner node's workers only (a range is whole buckets): rank g
// receives (gathers) or sends (reduce-scatters) one message per other rank there.
double FullShardLayout::gathered_bytes(int64_t g) const {
  double bytes = 0;
  for (size_t b = 0; b < gathers.size(); ++b)
    for (int64_t q = owner[b] * workers_per_node; q < (owner[b] + 1) * workers_per_node; ++q)
      if (q != g) bytes += gathers[b] * gather_message_bytes(b, q);
  return bytes;
}

double FullShardLayout::scattered_bytes(int64_t g) const {
  double bytes = 0;
  for (size_t b = 0; b < gathers.size(); ++b)
    for (int64_t q = owner[b] * workers_per_node; q < (owner[b] + 1) * workers_per_node; ++q)
      if (q != g) bytes += scatter_message_bytes(b, q);
  return bytes;
}

FullShardLayout full_shard_layout(const JobSpec& s) {
  FullShardLayout f;
  const FlatLayout flat = flat_layout(s);
  if (flat.bucket_sizes.empty()) return f;
  const std::vector<int64_t>& bs = flat.bucket_sizes;
  const int64_t nodes = std::max<int64_t>(s.resources.nodes, 1);
  const int64_t wpn = std::max<int64_t>(s.resources.workers_per_node, 1);
  f.workers_per_node = wpn;
  f.gather_elem_bytes =
      cp::shard_gather_elem_bytes(static_cast<size_t>(spec::dtype_bytes(s.model.dtype)));
  f.bucket_begin.assign(bs.size() + 1, 0);
  for (size_t b = 0; b < bs.size(); ++b) f.bucket_begin[b + 1] = f.bucket_begin[b] + bs[b];
  // Per micro-batch (Model::forward_backward): head once, layers twice, the embedding once
  // (twice when tied: acquired again beside the head).
  f.gathers.assign(bs.size(), 2);
  f.gathers.front() = 1;
  f.gathers.back() = s.model.tie_embeddings ? 2 : 1;
  const std::vector<size_t> first = shard_first_buckets(bs, nodes);
  f.owner.assign(bs.size(), 0);
  f.shard_begin.reserve(static_cast<size_t>(nodes * wpn));
  f.shard_end.reserve(static_cast<size_t>(nodes * wpn));
  for (int64_t k = 0; k < nodes; ++k) {
    const int64_t begin = f.bucket_begin[first[static_cast<size_t>(k)]];
    const int64_t end = f.bucket_begin[first[static_cast<size_t>(k) + 1]];
    for (size_t b = first[static_cast<size_t>(k)]; b < first[static_cast<size_t>(k) + 1]; ++b)
      f.owner[b] = static_cast<int>(k);
    const int64_t per = ((end - begin + wpn - 1) / wpn + 15) / 16 * 16;
    for (int64_t l = 0; l < wpn; ++l) {
      const int64_t lo = std::min(end, begin + l * per);
      f.shard_begin.push_back(lo);
      f.shard_end.push_back(std::min(end, lo + per));
    }
  }
  return f;
}

int64_t bucket_topk(double density, int64_t floats) {
  const auto k = static_cast<int64_t>(std::ceil(density * static_cast<double>(floats)));
  return std::clamp<int64_t>(k, floats > 0 ? 1 : 0, floats);
}

int64_t reduce_window_floats(int64_t nodes) {
  if (nodes < 2) return int64_t{1} << 24;
  const int64_t w = kReduceStageBudgetBytes / (2 * (nodes - 1) * int64_t{4});
  return std::clamp<int64_t>(w, int64_t{1} << 18, int64_t{1} << 24);  // 1 MiB to 64 MiB
}

double reduce_stage_bytes(int64_t nodes, int64_t floats) {
  if (nodes < 2 || floats <= 0) return 0.0;
  const int64_t w = reduce_window_floats(nodes);
  const double sets = floats > w ? 2.0 : 1.0;
  return sets * static_cast<double>(nodes - 1) * 4.0 * static_cast<double>(std::min(floats, w));
}

double shm_bytes(int64_t n, int64_t workers) {
  // The whole model's segment (contract::ShmShape::whole), in doubles.
  const double N = static_cast<double>(n);
  return contract::shm_offsets<double>(N, N, N, static_cast<double>(workers)).total_bytes;
}

namespace {

// Ring and all-to-all traffic of `s` with head_ranks u (1: one ring over the context ranks):
// the sizes common/cp/ring_messages.h gives the code that sends them.
struct RingTraffic {
  double hop = 0, dkv = 0;    // one K/V block and one whole dK/dV accumulator (one layer)
  double per_rank = 0;        // ring bytes one rank sends per step
  double a2a_per_rank = 0;    // all-to-all bytes one rank sends to its group per step
  double inter_node_per_node = 0;  // ring bytes leaving the busiest node per step
};

// Bytes of dK/dV accumulators one rank sends in one layer's backward, the mean over the ring's
// P positions (worker/ring/ring_attention.cc RingAttention::backward; with head groups u > 1,
// the ring over the context_ranks / u groups, each rank its slot's). Block o's accumulator leaves
// its owner empty (0 bytes); at hop s = 1..P-1 it carries the rows [lo, hi) of the block that
// positions o+1..o+s (mod P) attended to, the hull of their key ranges, as
// dkv_message_bytes(hi - lo), or 0 bytes while none did. Key k of block o is attended by
// position q when a query of q at or after k is in k's document: causal, and with packed
// documents modelled as data.max_doc_len-token documents back to back (ringctl simulate's model,
// sim/workload.cc). Real documents are shorter and start anywhere: on the tiny example's packed
// text the accumulators carried 1.7x this model's bytes (docs/precision.md "Memory"); with one
// document per sequence the model is what the ring sends. Positions differ (zigzag P = 4: 1.5
// to 3 whole blocks per layer without documents); the plan gives their mean.
double dkv_sent_per_layer(const JobSpec& s, int64_t u, int64_t kvd) {
  const int64_t N = s.data.seq_len, P = s.parallel.context_ranks / u;
  // No sequence to cut (a generate job's spec has no data.seq_len): no ring traffic to count.
  const int64_t chunks = (s.parallel.causal_balance == spec::CausalBalance::kZigzag ? 2 : 1) *
                         s.parallel.context_ranks;
  if (P < 2 || N < chunks) return 0;
  const int64_t doc =
      s.data.pack && s.data.max_doc_len > 0 ? std::min(s.data.max_doc_len, N) : N;
  // A ring position's tokens: its rank's chunks, or with head groups (u > 1) its u members',
  // in position order (worker/ring/head_attention.cc gathers the group's block sorted).
  std::vector<std::vector<cp::TokenRange>> ranges(P);
  for (int64_t g = 0; g < P; ++g) {
    std::vector<cp::TokenRange> all;
    for (int64_t a = 0; a < u; ++a)
      for (const cp::TokenRange& r :
           cp::rank_ranges(N, P * u, g * u + a, s.parallel.causal_balance))
        all.push_back(r);
    std::sort(all.begin(), all.end(),
              [](const cp::TokenRange& x, const cp::TokenRange& y) { return x.begin < y.begin; });
    for (const cp::TokenRange& r : all) {
      if (!ranges[g].empty() && ranges[g].back().end == r.begin)
        ranges[g].back().end = r.end;
      else
        ranges[g].push_back(r);
    }
  }
  // Rows [lo, hi) of block o (its ranges concatenated) attended by position q; lo = hi if none.
  auto attended = [&](int64_t q, int64_t o, int64_t* lo, int64_t* hi) {
    int64_t row = 0;
    for (const cp::TokenRange& kr : ranges[o]) {
      for (const cp::TokenRange& qr : ranges[q]) {
        for (int64_t ds = kr.begin / doc * doc; ds < kr.end; ds += doc) {
          const int64_t de = std::min(N, ds + doc);
          const int64_t qb = std::min(qr.end, de);  // past q's last query in this document
          if (std::max(qr.begin, ds) >= qb) continue;
          const int64_t ka = std::max(kr.begin, ds), kb = std::min({kr.end, de, qb});
          if (ka >= kb) continue;
          *lo = *lo < *hi ? std::min(*lo, row + ka - kr.begin) : row + ka - kr.begin;
          *hi = std::max(*hi, row + kb - kr.begin);
        }
      }
      row += kr.size();
    }
  };
  double bytes = 0;
  for (int64_t o = 0; o < P; ++o) {
    int64_t lo = 0, hi = 0;
    for (int64_t hop = 1; hop < P; ++hop) {
      attended((o + hop) % P, o, &lo, &hi);
      if (hi > lo) bytes += static_cast<double>(cp::dkv_message_bytes(hi - lo, kvd));
    }
  }
  return bytes / static_cast<double>(P);  // every block's P-1 sends, spread over P senders
}

RingTraffic ring_traffic(const JobSpec& s, int64_t u) {
  RingTraffic r;
  const int64_t P = s.parallel.context_ranks, D = s.parallel.data_replicas;
  const int64_t T = s.data.seq_len / P, R = P / u, tg = u * T;
  const int64_t K = s.resolved.kv_heads, hd = s.resolved.head_dim, hq = s.model.heads / u;
  const int64_t hkv = cp::head_slot_kv_heads(K, u);
  const size_t b = static_cast<size_t>(spec::dtype_bytes(s.model.dtype));
  const double L = static_cast<double>(s.model.layers);
  r.hop = static_cast<double>(cp::packed_block_bytes(tg, hkv * hd, b));
  r.dkv = static_cast<double>(cp::dkv_message_bytes(tg, hkv * hd));
  if (R > 1) {
    const double Rm1 = static_cast<double>(R - 1);
    // Forward: R-1 K/V hops per layer. Backward: R-1 K/V hops plus the dK/dV accumulators,
    // which carry only the rows attended so far (dkv_sent_per_layer: at most R-1 whole blocks,
    // the last one bringing an accumulator home). Full recompute replays the forward ring;
    // selective never re-runs the attention.
    double per_layer = 2.0 * Rm1 * r.hop + dkv_sent_per_layer(s, u, hkv * hd);
    if (spec::full_recompute(s.model)) per_layer += Rm1 * r.hop;
    r.per_rank = L * per_layer;
  }
  if (u > 1) {
    // To each of the u - 1 other members, per layer: the forward's gather and return, the
    // backward's, and with full recompute the forward's again (document ids counted).
    auto fwd = static_cast<double>(cp::head_gather_bytes(T, hq, hkv, hd, b, true, false) +
                                   cp::head_return_bytes(T, hq, hkv, hd, false));
    auto bwd = static_cast<double>(cp::head_gather_bytes(T, hq, hkv, hd, b, true, true) +
                                   cp::head_return_bytes(T, hq, hkv, hd, true));
    r.a2a_per_rank =
        L * static_cast<double>(u - 1) * (fwd + bwd + (spec::full_recompute(s.model) ? fwd : 0));
  }
  // Global rank g = d P + r u + a sits on node g / workers_per_node; its ring neighbour is the
  // same slot a of the next group.
  const int64_t wpn = std::max<int64_t>(s.resources.workers_per_node, 1);
  std::vector<double> leaving(static_cast<size_t>((P * D + wpn - 1) / wpn), 0.0);
  if (R > 1)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t g = 0; g < R; ++g)
        for (int64_t a = 0; a < u; ++a) {
          const int64_t from = d * P + g * u + a, to = d * P + ((g + 1) % R) * u + a;
          if (from / wpn != to / wpn) leaving[static_cast<size_t>(from / wpn)] += r.per_rank;
        }
  for (double x : leaving) r.inter_node_per_node = std::max(r.inter_node_per_node, x);
  return r;
}

// The plan of `s` with parallel.shard = `mode` (the spec's own, or another for the comparison).
namespace {

// plan_for in parts: the spec's shapes, the flat layout and the shard mode worked out once
// (members, named as in the formulas of docs/planning.md), then each part of the plan.
struct PlanBuilder {
  PlanBuilder(const JobSpec& spec, ShardMode shard_mode, Plan& plan);
  void worker_memory();  // per worker: buffers, activations, ring buffers
  void ringd_memory();   // per node (offload cpu): ringd's optimizer and exchange, the shm segment
  void host_totals();
  void communication();  // per step: the ring, the gradient exchange, shard full's transfers
  void fit();

  const JobSpec& s;
  const spec::ModelSection& m;
  ShardMode mode;
  Plan& p;
  FlatLayout flat;
  double d = 0, H = 0, K = 0, hd = 0, h = 0, L = 0, V = 0, b = 0, T = 0, N = 0, Pn = 0, n = 0, R = 0, S = 0, B = 0, kv_block = 0, dkv_block = 0, nodes = 0, wpn = 0;
  int64_t P = 0, nodes_i = 0, wpn_i = 0, G = 0;
  bool full = false, offload = false, topk = false, ef = false, at_owner = false, host_backend = false;
};

PlanBuilder::PlanBuilder(const JobSpec& spec, ShardMode shard_mode, Plan& plan)
    : s(spec), m(spec.model), mode(shard_mode), p(plan) {
  d = static_cast<double>(m.d_model);
  H = static_cast<double>(m.heads);
  K = static_cast<double>(s.resolved.kv_heads);
  hd = static_cast<double>(s.resolved.head_dim);
  h = static_cast<double>(s.resolved.mlp_hidden);
  L = static_cast<double>(m.layers);
  V = static_cast<double>(m.vocab);
  P = s.parallel.context_ranks;
  b = spec::dtype_bytes(m.dtype);
  p.storage_bytes = spec::dtype_bytes(m.dtype);
  p.ranks = P;
  p.tokens_per_rank = s.data.seq_len / P;
  T = static_cast<double>(p.tokens_per_rank);
  N = static_cast<double>(s.data.seq_len);

  // ---- parameters
  const double mlp_params = (m.mlp == MlpKind::kSwiGLU ? 3.0 : 2.0) * d * h;
  const double attn_params = d * H * hd + 2.0 * d * K * hd + H * hd * d;
  p.params_per_layer = static_cast<int64_t>(attn_params + mlp_params + 2.0 * d);
  p.params_embedding = static_cast<int64_t>(V * d * (m.tie_embeddings ? 1.0 : 2.0));
  p.params = p.params_embedding + m.layers * p.params_per_layer + m.d_model;
  Pn = static_cast<double>(p.params);

  // ---- the flat layout every buffer below is a copy of, and its division over the nodes
  flat = flat_layout(s);
  nodes_i = std::max<int64_t>(s.resources.nodes, 1);
  wpn_i = std::max<int64_t>(s.resources.workers_per_node, 1);
  G = nodes_i * wpn_i;
  p.shard = mode;
  p.flat_floats = flat.elements;
  p.largest_bucket = flat.largest_bucket;
  p.largest_range = flat.elements;
  if (mode != ShardMode::kNone && !flat.bucket_sizes.empty()) {
    const auto ranges = shard_range_sizes(flat.bucket_sizes, nodes_i);
    p.largest_range = *std::max_element(ranges.begin(), ranges.end());
  }
  // Shard full: each node's range cut among its workers (contract::worker_shards), the largest
  // piece ceil(range / workers_per_node) rounded up to 16 floats (64 bytes).
  if (mode == ShardMode::kFull) {
    const int64_t per = ((p.largest_range + wpn_i - 1) / wpn_i + 15) / 16 * 16;
    p.worker_shard = std::min(per, p.largest_range);
  } else {
    p.worker_shard = flat.elements;
  }
  n = static_cast<double>(flat.elements);
  R = static_cast<double>(p.largest_range);
  S = static_cast<double>(p.worker_shard);
  B = static_cast<double>(flat.largest_bucket);
  full = mode == ShardMode::kFull;
  offload = s.optimizer.offload == Offload::kCpu;
  topk = s.optimizer.compression == Compression::kTopk;
  ef = topk && s.optimizer.error_feedback;
  // Where top-k selects (docs/architecture.md): at each range's owner from the nodes' summed
  // gradient (compress_at owner; shard full always), or at each sender.
  at_owner = topk && (full || s.optimizer.compress_at == spec::CompressAt::kOwner);
  p.topk_at_owner = at_owner;
  // The owners' ranges whatever the shard mode (shard none's owner-side top-k uses them too).
  int64_t owner_range = flat.elements;
  if (!flat.bucket_sizes.empty()) {
    const auto ranges = shard_range_sizes(flat.bucket_sizes, nodes_i);
    owner_range = *std::max_element(ranges.begin(), ranges.end());
  }
  if (ef) p.residual_floats = at_owner ? owner_range : flat.elements;
  host_backend = s.resources.backend == Backend::kCpu;

  // One K/V block of the ring as it travels (positions, document ids, K and V in the storage
  // dtype) and one dK/dV accumulator (fp32): the sizes the ring sends (common/cp/ring_messages.h);
  // with head_ranks U the ring's blocks hold the group's U T tokens and K / U heads.
  const RingTraffic ring = ring_traffic(s, std::max<int64_t>(s.parallel.head_ranks, 1));
  kv_block = ring.hop;
  dkv_block = ring.dkv;
  p.topk_k = static_cast<int64_t>(std::ceil(s.optimizer.density * Pn));
  nodes = static_cast<double>(nodes_i);
  wpn = static_cast<double>(wpn_i);
}

void PlanBuilder::worker_memory() {
  // ---- activations saved for backward, per layer per local token, as worker/model/model.h
  // keeps them (docs/precision.md): the layer input and the attention residual (2d, the fp32
  // residual stream), both norm outputs (2d), q and the attention output (2 H hd), k and v
  // (2 K hd), the MLP intermediates (swiglu: gate, up, product = 3h; gelu: 2h; fp32 GEMM
  // outputs), fp32 lse per head and two fp32 RMS statistics. The six bf16 values (norm outputs,
  // q, o, k, v) take b bytes; bf16 (b < 4) adds one layer's fp32 work set of them, where the
  // model computes each layer's before keeping the bf16 copies.
  const double mlp_act = (m.mlp == MlpKind::kSwiGLU ? 3.0 : 2.0) * h;
  const double six = 2.0 * d + 2.0 * H * hd + 2.0 * K * hd;
  auto per_token_layer = [&](double bytes) {
    return 4.0 * (2.0 * d + mlp_act) + bytes * six + 4.0 * H + 8.0;
  };
  p.activations_no_recompute = L * T * per_token_layer(b) + (b < 4.0 ? T * 4.0 * six : 0.0);
  // Recompute keeps each layer's input (fp32), plus one layer's full set, fp32 in both dtypes,
  // while it is recomputed.
  p.activations_recompute = L * T * 4.0 * d + T * per_token_layer(4.0);
  // Selective recompute keeps per layer the input x (fp32), q, o, k, v (b bytes) and lse (fp32),
  // plus one layer's x_mid, MLP intermediates, norm outputs (b bytes) and RMS statistics, which
  // the backward recomputes, and bf16's fp32 work set.
  const double attn = 2.0 * H * hd + 2.0 * K * hd;
  p.activations_selective = L * T * (4.0 * d + b * attn + 4.0 * H) +
                            T * (4.0 * (d + mlp_act) + b * 2.0 * d + 8.0) +
                            (b < 4.0 ? T * 4.0 * six : 0.0);
  const bool selective = m.recompute && m.recompute_policy == spec::RecomputePolicy::kSelective;
  const double activations = !m.recompute ? p.activations_no_recompute
                             : selective  ? p.activations_selective
                                          : p.activations_recompute;

  p.kv_local_per_layer = 2.0 * T * K * hd * b;
  p.kv_local_total = L * p.kv_local_per_layer;
  p.kv_sequence_per_layer = 2.0 * N * K * hd * b;
  p.kv_sequence_total = L * p.kv_sequence_per_layer;

  // ---- per worker (the model's flat buffers: worker/model/model.h; run_offloaded_rank)
  auto& w = p.worker;
  if (!full) {
    w.push_back({"weights", n * b, "n x b (the flat layout, whole model)"});
    w.push_back({"weight gradients (fp32)", n * 4.0, "n x 4"});
  } else {
    // worker/ring/full_shard.h: the shard, and block buffers of the largest bucket each at the
    // peak (tied embeddings: the embedding's weights beside the head, and its gradient held
    // through the backward). The shard and the gathered blocks are held as the gathers carry
    // them, b bytes a value (a bf16 store keeps only its shard rounded to bf16); gradients fp32.
    // The shard and the transfers' buffers are host memory; a device worker (staged blocks)
    // keeps them in host memory and only the blocks the model uses, and the gradient it writes,
    // on the device.
    const double tied = m.tie_embeddings ? 1.0 : 0.0;
    auto& hw = host_backend ? w : p.worker_host;
    hw.push_back({"weight shard", S * b, "shard x b, shard = ceil(range / workers_per_node)"});
    hw.push_back({"gradient shard (fp32)", S * 4.0, "shard x 4"});
    if (host_backend) {
      w.push_back({m.tie_embeddings ? "gathered blocks (in use + prefetch + tied embedding)"
                                    : "gathered blocks (in use + prefetch)",
                   (2.0 + tied) * B * b, m.tie_embeddings ? "3 x largest bucket x b"
                                                          : "2 x largest bucket x b"});
      w.push_back({m.tie_embeddings ? "block gradients (fp32: being written + tied embedding)"
                                    : "block gradient (fp32, being written or reduce-scattered)",
                   (1.0 + tied) * B * 4.0, m.tie_embeddings ? "2 x largest bucket x 4"
                                                            : "largest bucket x 4"});
    } else {
      w.push_back({m.tie_embeddings ? "staged blocks (in use + tied embedding)"
                                    : "staged block (in use)",
                   (1.0 + tied) * B * b, m.tie_embeddings ? "2 x largest bucket x b"
                                                          : "largest bucket x b"});
      w.push_back({m.tie_embeddings ? "staged block gradients (fp32: being written + tied embedding)"
                                    : "staged block gradient (fp32, being written)",
                   (1.0 + tied) * B * 4.0, m.tie_embeddings ? "2 x largest bucket x 4"
                                                            : "largest bucket x 4"});
      p.worker_host.push_back({"block buffers (prefetched gather, b; reduce-scatter, fp32)",
                               B * (b + 4.0), "largest bucket x (b + 4)"});
    }
    if (G > 1) {
      const double parts = static_cast<double>(std::min<int64_t>(2, G - 1)) + 1.0 +
                           (nodes_i > 1 ? 1.0 : 0.0);
      hw.push_back({"reduce-scatter window and sums (fp32, at most)", parts * 4.0 * std::min(S, B),
                    "(min(2, G - 1) + 1 + [nodes > 1]) x 4 x min(shard, largest bucket)"});
    }
  }
  if (!offload) {
    w.push_back({"AdamW moments (fp32)", n * 8.0, "n x 8 (m, v)"});
    if (b != 4.0) w.push_back({"master weights (fp32)", n * 4.0, "n x 4"});
  }
  w.push_back({selective      ? "activations (selective recompute)"
                : m.recompute ? "activations (recompute)"
                              : "activations",
               activations,
               selective ? "layers x T x (4d + b (2H hd + 2K hd) + 4H) + T x (4 (d + mlp) + b 2d + 8)"
                           " (+ T x 4 (2d + 2H hd + 2K hd) in bf16)"
               : m.recompute ? "layers x T x d x 4 + one layer's full set (fp32)"
               : b < 4.0 ? "layers x T x (4 (2d + mlp) + b (2d + 2H hd + 2K hd) + 4H + 8)"
                           " + T x 4 (2d + 2H hd + 2K hd)"
                         : "layers x T x (4 (2d + mlp) + b (2d + 2H hd + 2K hd) + 4H + 8)"});
  // bf16: the GEMMs' bf16 operands the model converts (worker/model/model.h a_bf16_, b_bf16_:
  // the gradient or input [T, x] of the widest GEMM each).
  if (b < 4.0)
    w.push_back({"bf16 GEMM operands",
                 T * 2.0 * (std::max({h, V, d, H * hd}) + std::max({h, d, H * hd})),
                 "T x 2 (max(h, V, d, H hd) + max(h, d, H hd))"});
  // Ring buffers at the peak (backward): K/V block in flight and in use (2 x 2 T K hd b) plus
  // the travelling dK/dV accumulators, double-buffered, and the local ones (3 x 2 T K hd 4); a
  // bf16 wire widens each received block to fp32 for the kernels (2 x 2 T K hd 4 more).
  if (P > s.parallel.head_ranks)
    w.push_back({"ring buffers (K/V, dK/dV)",
                 2.0 * kv_block + 3.0 * dkv_block + (b < 4.0 ? 2.0 * 2.0 * T * K * hd * 4.0 : 0.0),
                 b < 4.0 ? "2 x (2 T K hd b) + 3 x (2 T K hd 4) + 2 x (2 T K hd 4) widened"
                         : "2 x (2 T K hd b) + 3 x (2 T K hd 4)"});
  // Head-parallel attention (worker/ring/head_attention.h): the backward's send and receive
  // buffers of U members each, and the group's tokens for the slot's heads in fp32 (q, o, dout,
  // dq and a staging copy; k, v, dk, dv), about 4 T H hd 4 + 4 T K hd 4 at U T tokens and
  // H / U heads.
  if (s.parallel.head_ranks > 1) {
    const int64_t u = s.parallel.head_ranks, hq = m.heads / u;
    const int64_t hkv = cp::head_slot_kv_heads(s.resolved.kv_heads, u);
    const double msg = static_cast<double>(cp::head_gather_bytes(
        p.tokens_per_rank, hq, hkv, s.resolved.head_dim, static_cast<size_t>(b), true, true));
    const double group = static_cast<double>(u) * T *
                         (5.0 * hq * hd + 4.0 * hkv * hd + 2.0 * hq) * 4.0;
    w.push_back({"head all-to-all buffers", 2.0 * static_cast<double>(u) * msg + group,
                 "2 U x message + U T (5 H/U hd + 4 K/U hd + 2 H/U) 4"});
  }
  // fp32 accumulators of attention: output and lse being merged, dQ in the backward.
  w.push_back({"attention accumulators (fp32)", 2.0 * T * H * hd * 4.0 + T * H * 4.0,
               "2 T H hd 4 + T H 4"});
  w.push_back({"logits and their gradient (fp32)", 2.0 * T * V * 4.0, "2 T V 4"});
  // What a CPU worker process holds besides its buffers: code and shared libraries (UCX,
  // OpenBLAS, oneDNN), thread stacks, the allocator's slack. Measured by bench/shard_memory.sh
  // (VmHWM less shared memory less the buffers above: 38-73 MB, median 48 MB, one thread per
  // worker). A device worker's process lives in host memory beside its GPU and is not counted.
  if (host_backend)
    w.push_back({"process (code, libraries, stacks)", 48e6, "48 MB, measured (bench/shard_memory.sh)"});

  // The offloaded rank's host-side buffers (worker/ring/rank_offloaded.cc run_offloaded_rank):
  // the CPU backend's weights are its host memory (copied in from the shared memory); a device
  // backend uploads the weights straight from the shared memory and copies each finished
  // gradient bucket straight into its slot, so it has none, except with shard full (the shard
  // and the transfers' buffers, above).
  auto& wh = p.worker_host;
  p.worker_host_total = sum(wh);
  p.worker_total = sum(w);

}

void PlanBuilder::ringd_memory() {
  if (offload) {
    auto& r = p.host_ringd;
    const bool sharded = mode != ShardMode::kNone;
    const bool lazy = topk && s.optimizer.update == spec::UpdateMode::kLazy;
    // Dense exchanges happen with compression none and in top-k's dense warm-up steps.
    const bool dense_steps = !topk || s.optimizer.warmup_steps > 0;
    const auto& bs = flat.bucket_sizes;
    // What each node owns (shard none: every node holds every bucket, but with top-k at the
    // owner each bucket is still summed and compressed at its range's owner).
    std::vector<size_t> first = {0, bs.size()};
    if (sharded || at_owner) first = shard_first_buckets(bs, nodes_i);
    // Per bucket: the most entries of its sparse gradient: the owner's k, or at the sender the
    // union of the nodes' sets.
    auto union_bound = [&](size_t i) {
      const double k = static_cast<double>(bucket_topk(s.optimizer.density, bs[i]));
      return at_owner ? k : std::min(nodes * k, static_cast<double>(bs[i]));
    };
    double u_all = 0;
    int64_t kmax = 0;
    for (size_t i = 0; i < bs.size(); ++i) {
      u_all += union_bound(i);
      kmax = std::max(kmax, bucket_topk(s.optimizer.density, bs[i]));
    }
    // The lines that depend on what the node owns: each the largest over the nodes (so the
    // total bounds every node's).
    struct NodeLines {
      double state = 0, reduce_stage = 0, summed = 0, lazy_lists = 0;
    };
    NodeLines worst;
    for (size_t k = 0; k + 1 < first.size(); ++k) {
      NodeLines l;
      double floats = 0, biggest = 0, u_own = 0;
      for (size_t i = first[k]; i < first[k + 1]; ++i) {
        floats += static_cast<double>(bs[i]);
        biggest = std::max(biggest, static_cast<double>(bs[i]));
        u_own += union_bound(i);
      }
      l.state = 12.0 * (sharded ? floats : n);
      // ringd's TransportExchange::reduce_sum: the owner receives every other node's bucket
      // in windows into staging vectors kept (and grown) for the attempt. Shard optimizer's
      // dense steps, and every top-k step at the owner (shard none too).
      const bool reduces = (mode == ShardMode::kOptimizer && dense_steps) || (at_owner && !full);
      if (nodes_i > 1 && reduces)
        l.reduce_stage = reduce_stage_bytes(nodes_i, static_cast<int64_t>(biggest));
      if (topk) {
        // At the owner: one set of k per bucket (shard none: every owner's set, all-gathered).
        l.summed = 8.0 * (sharded ? u_own : u_all);
      }
      // Lazy: the changed coordinates (int64); sharded, also this node's own list and its
      // (uint64, float) payload, and every node's pairs as the all-gather returns them.
      // Shard full publishes its range densely: no lists.
      if (lazy && !full) l.lazy_lists = sharded ? 20.0 * u_own + 20.0 * u_all : 8.0 * u_all;
      worst.state = std::max(worst.state, l.state);
      worst.reduce_stage = std::max(worst.reduce_stage, l.reduce_stage);
      worst.summed = std::max(worst.summed, l.summed);
      worst.lazy_lists = std::max(worst.lazy_lists, l.lazy_lists);
    }
    if (bs.empty()) worst.state = 12.0 * R;

    // daemon/optim/node_optimizer.cc: master, adam_m, adam_v of what the node owns.
    r.push_back({"optimizer master + AdamW m, v (fp32)", worst.state,
                 sharded ? "3 x 4 x range (the largest node)" : "3 x 4 x n"});
    // Error feedback: per sender (every node keeps a residual of all it sent) with shard none
    // and optimizer; with shard full the gradient reaches the owner already summed, and top-k
    // runs there, so the residual is the owner's, of its range (docs/architecture.md).
    if (ef)
      r.push_back({"error-feedback residual (fp32, this node's)",
                   4.0 * static_cast<double>(p.residual_floats),
                   at_owner ? "4 x range (at the owner)" : "4 x n (per sender: full size)"});
    // daemon/ringd/step_driver.h: the node's gradient, summed over its workers' slots. With
    // shard full the workers reduce-scatter to the owners: the node receives its range only.
    r.push_back({"node gradient (fp32)", 4.0 * (full ? R : n), full ? "4 x range" : "4 x n"});
    if (worst.reduce_stage > 0)
      r.push_back({"dense reduce staging at the owner", worst.reduce_stage,
                   "(nodes - 1) x 4 x min(largest bucket, window), x 2 past one window"});
    if (topk) {
      p.topk_bucket_k = kmax;
      const double K8 = 8.0 * static_cast<double>(kmax);
      r.push_back({"top-k scratch (index, value)", K8, "8 x k of the largest bucket"});
      // Sparse sets cross nodes at the sender, and at the owner with shard none (all-gathered).
      if (nodes_i > 1 && !full && !(at_owner && sharded))
        r.push_back({"top-k exchange of one bucket (at most)", (2.0 * nodes + 2.0) * (4.0 + K8),
                     "(2 nodes + 2) x (4 + 8 k): payload, transport buffers, every node's set"});
      r.push_back({"summed sparse gradient (at most)", worst.summed,
                   at_owner ? (sharded ? "8 x sum over its buckets of k"
                                       : "8 x sum over buckets of k")
                   : sharded ? "8 x sum over its buckets of min(nodes x k, floats)"
                             : "8 x sum over buckets of min(nodes x k, floats)"});
      if (lazy && !full)
        r.push_back({"lazy changed coordinates (at most)", worst.lazy_lists,
                     sharded ? "20 x (its + all buckets') union bound" : "8 x union bound"});
    }
    // Shard optimizer's weight all-gather writes straight into the shared segment's weights
    // (NodeOptimizer::set_weights_buffer): no receive buffer of its own.
    if (!s.checkpoint.dir.empty())
      r.push_back({"checkpoint staging (at most)", kCheckpointStagingBytes,
                   "ckpt::Options::staging_bytes, 16 MiB"});

    // common/contract/shm.cc: one segment per node, mapped by ringd and every worker.
    auto& sh = p.host_shm;
    const int64_t pub = full ? p.largest_range : flat.elements;  // floats ringd publishes
    const int64_t slot = full ? p.worker_shard : flat.elements;  // floats per gradient slot
    auto a64 = [](double x) { return std::ceil(x / 64.0) * 64.0; };
    sh.push_back({"shm header", 128.0, "128 B"});
    sh.push_back({"shm weights (fp32)", a64(4.0 * static_cast<double>(pub)),
                  full ? "4 x range" : "4 x n"});
    // Shard full has no lazy index: the workers copy their whole shard each step.
    if (!full)
      sh.push_back({"shm lazy index (uint64)", a64(8.0 * static_cast<double>(pub)), "8 x n"});
    sh.push_back({fmt::format("shm gradient slots ({} workers)", wpn_i),
                  wpn * a64(4.0 * static_cast<double>(slot)),
                  full ? "workers_per_node x 4 x shard" : "workers_per_node x 4 x n"});
  }
}

void PlanBuilder::host_totals() {
  if (host_backend)
    p.host_workers.push_back({fmt::format("workers ({} x worker total)", wpn_i),
                              wpn * p.worker_total, "workers_per_node x worker total"});
  else if (!p.worker_host.empty())
    p.host_workers.push_back({fmt::format("workers' host buffers ({} x {})", wpn_i,
                                          human_bytes(p.worker_host_total)),
                              wpn * p.worker_host_total, "workers_per_node x worker host total"});
  p.host_ringd_total = sum(p.host_ringd);
  p.host_shm_total = sum(p.host_shm);
  p.host_workers_total = sum(p.host_workers);
  for (const auto* part : {&p.host_ringd, &p.host_shm, &p.host_workers})
    p.host.insert(p.host.end(), part->begin(), part->end());
  p.host_total = sum(p.host);

}

void PlanBuilder::communication() {
  // ---- communication per step, per rank: the ring that runs (over the head groups with
  // head_ranks > 1), the group's all-to-alls, and the single ring for comparison
  const int64_t u = std::max<int64_t>(s.parallel.head_ranks, 1);
  const RingTraffic ring = ring_traffic(s, u);
  const RingTraffic single = u == 1 ? ring : ring_traffic(s, 1);
  p.head_ranks = u;
  p.ring_groups = P / u;
  p.ring_bytes_per_hop = ring.hop;
  p.ring_bytes_per_step = ring.per_rank;
  p.a2a_bytes_per_step = ring.a2a_per_rank;
  p.inter_node_ring_bytes_per_node = ring.inter_node_per_node;
  p.single_ring_bytes_per_step = single.per_rank;
  p.single_inter_node_ring_bytes_per_node = single.inter_node_per_node;
  p.grad_payload_dense = Pn * 4.0;
  p.grad_payload_topk = static_cast<double>(p.topk_k) * 8.0;  // u32 index + fp32 value
  p.grad_sent_dense_per_node = 2.0 * (nodes - 1.0) / nodes * p.grad_payload_dense;
  p.grad_sent_topk_per_node = (nodes - 1.0) * p.grad_payload_topk;
  if (at_owner && !full) {
    // The dense gradient of the ranges a node does not own goes to their owners (a
    // reduce-scatter, bounded by the smallest range's node: n - range, about n (nodes-1)/nodes),
    // then with shard none each owner's sparse sets go to every other node (about k / nodes
    // each); shard optimizer's owners publish weights instead (as with dense steps).
    p.grad_topk_reduce_scatter_per_node = (nodes - 1.0) / nodes * p.grad_payload_dense;
    p.grad_topk_sparse_per_node =
        mode == ShardMode::kNone ? (nodes - 1.0) / nodes * p.grad_payload_topk : 0.0;
    p.grad_sent_topk_per_node = p.grad_topk_reduce_scatter_per_node + p.grad_topk_sparse_per_node;
  }
  if (full) {
    const double mb = static_cast<double>(std::max<int64_t>(s.train.micro_batches, 1));
    // The rank that moves the most (the one with the smallest parts).
    const FullShardLayout fs = full_shard_layout(s);
    double g = 0, r = 0;
    for (int64_t q = 0; q < fs.ranks(); ++q) {
      g = std::max(g, fs.gathered_bytes(q));
      r = std::max(r, fs.scattered_bytes(q));
    }
    p.shard_gathered_per_rank = mb * g;
    p.shard_scattered_per_rank = mb * r;
    p.grad_sent_dense_per_node = 0;  // the workers' reduce-scatter already summed the job's
    p.grad_sent_topk_per_node = 0;
  }

}

void PlanBuilder::fit() {
  // ---- fit
  p.host_capacity = s.resources.host_memory_gb * 1e9;
  p.fits_host = p.host_total <= p.host_capacity;
  if (s.resources.backend == Backend::kCuda) {
    for (const auto& g : gpu_models())
      if (g.type == s.resources.gpu_type) {
        p.device_name = g.name;
        p.device_capacity = g.capacity_bytes;
        p.device_usable = g.capacity_bytes - kGpuReserveBytes;
      }
    p.fits_device = p.worker_total <= p.device_usable;
  } else {
    p.device_name = "host";
    p.device_capacity = p.host_capacity;
    p.device_usable = p.host_capacity;
    p.fits_device = p.fits_host;  // workers are counted in host_total
  }
}

}  // namespace

Plan plan_for(const JobSpec& s, ShardMode mode) {
  Plan p;
  PlanBuilder pb(s, mode, p);
  pb.worker_memory();
  pb.ringd_memory();
  pb.host_totals();
  pb.communication();
  pb.fit();
  return p;
}

}  // namespace

StepFlops step_flops(const JobSpec& s, int64_t params) {
  StepFlops f;
  const double N = static_cast<double>(s.data.seq_len);
  const double Pn = static_cast<double>(params);
  const double Ld = static_cast<double>(s.model.layers) * static_cast<double>(s.model.d_model);
  f.sequences = std::max<int64_t>(1, s.parallel.data_replicas) * std::max<int64_t>(1, s.train.micro_batches);
  f.dense_per_sequence = 6 * Pn * N;
  f.attention_per_sequence = 6 * Ld * N * N;
  const double seqs = static_cast<double>(f.sequences);
  f.model_per_step = seqs * (f.dense_per_sequence + f.attention_per_sequence);
  // Selective re-runs per layer and token only the output projection and the MLP's gate/up:
  // 2 x d_model x (heads x head_dim + mlp_hidden x (2 swiglu, 1 gelu)).
  const double d = static_cast<double>(s.model.d_model);
  const double qd = static_cast<double>(s.model.heads * s.resolved.head_dim);
  const double in = (s.model.mlp == MlpKind::kSwiGLU ? 2.0 : 1.0) *
                    static_cast<double>(s.resolved.mlp_hidden);
  const double L = static_cast<double>(s.model.layers);
  f.recompute_per_step = !s.model.recompute ? 0.0
                         : spec::full_recompute(s.model)
                             ? seqs * (2 * Pn * N + 2 * Ld * N * N)
                             : seqs * N * L * 2 * d * (qd + in);
  f.hardware_per_step = f.model_per_step + f.recompute_per_step;
  return f;
}

Plan make_plan(const JobSpec& s) {
  Plan p = plan_for(s, s.parallel.shard);
  p.flops = step_flops(s, p.params);
  if (s.optimizer.offload == Offload::kCpu) {
    for (ShardMode mode : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kFull}) {
      const Plan q = mode == s.parallel.shard ? p : plan_for(s, mode);
      // Every mode runs with every backend; shard full on a device stages its blocks (full_shard.h).
      p.modes.push_back({mode, q.worker_total, q.host_total, q.fits_device, q.fits_host});
    }
  }
  return p;
}

namespace {

nlohmann::json items_json(const std::vector<Item>& items) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& i : items) a.push_back({{"name", i.name}, {"bytes", i.bytes},
                                           {"formula", i.formula}});
  return a;
}

nlohmann::json modes_json(const std::vector<ModeTotals>& modes) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& m : modes)
    a.push_back({{"mode", spec::to_string(m.mode)},
                 {"worker_total_bytes", m.worker_total},
                 {"host_total_bytes", m.host_total},
                 {"fits_device", m.fits_device},
                 {"fits_host", m.fits_host},
                 {"fits", m.fits_device && m.fits_host}});
  return a;
}

}  // namespace

nlohmann::json to_json(const Plan& p, const JobSpec& s) {
  return {
      {"job", s.job.name},
      {"model",
       {{"params", p.params},
        {"params_per_layer", p.params_per_layer},
        {"params_embedding", p.params_embedding},
        {"layers", s.model.layers},
        {"d_model", s.model.d_model},
        {"heads", s.model.heads},
        {"kv_heads", s.resolved.kv_heads},
        {"head_dim", s.resolved.head_dim},
        {"mlp_hidden", s.resolved.mlp_hidden},
        {"dtype", spec::to_string(s.model.dtype)},
        {"recompute", s.model.recompute},
        {"recompute_policy", spec::to_string(s.model.recompute_policy)}}},
      {"flops",
       {{"sequences_per_step", p.flops.sequences},
        {"dense_per_sequence", p.flops.dense_per_sequence},
        {"attention_per_sequence", p.flops.attention_per_sequence},
        {"recompute_per_step", p.flops.recompute_per_step}}},
      {"model_flops_per_step", p.flops.model_per_step},
      {"hardware_flops_per_step", p.flops.hardware_per_step},
      {"sequence",
       {{"seq_len", s.data.seq_len},
        {"context_ranks", p.ranks},
        {"tokens_per_rank", p.tokens_per_rank},
        {"kv_bytes_per_layer", p.kv_sequence_per_layer},
        {"kv_bytes_total", p.kv_sequence_total}}},
      {"worker",
       {{"items", items_json(p.worker)},
        {"total_bytes", p.worker_total},
        {"activations_no_recompute_bytes", p.activations_no_recompute},
        {"activations_recompute_bytes", p.activations_recompute},
        {"activations_selective_bytes", p.activations_selective},
        {"kv_local_per_layer_bytes", p.kv_local_per_layer},
        {"kv_local_total_bytes", p.kv_local_total}}},
      {"worker_host",
       {{"items", items_json(p.worker_host)}, {"total_bytes", p.worker_host_total}}},
      {"host",
       {{"items", items_json(p.host)},
        {"total_bytes", p.host_total},
        {"ringd", {{"items", items_json(p.host_ringd)}, {"total_bytes", p.host_ringd_total}}},
        {"shm", {{"items", items_json(p.host_shm)}, {"total_bytes", p.host_shm_total}}},
        {"workers",
         {{"items", items_json(p.host_workers)}, {"total_bytes", p.host_workers_total}}}}},
      {"shard",
       {{"mode", spec::to_string(p.shard)},
        {"nodes", s.resources.nodes},
        {"workers_per_node", s.resources.workers_per_node},
        {"flat_floats", p.flat_floats},
        {"largest_bucket_floats", p.largest_bucket},
        {"largest_range_floats", p.largest_range},
        {"worker_shard_floats", p.worker_shard},
        {"topk_bucket_k", p.topk_bucket_k},
        {"modes", modes_json(p.modes)}}},
      {"communication",
       {{"head_ranks", p.head_ranks},
        {"ring_groups", p.ring_groups},
        {"ring_bytes_per_hop", p.ring_bytes_per_hop},
        {"ring_bytes_per_step_per_rank", p.ring_bytes_per_step},
        {"head_all_to_all_bytes_per_step_per_rank", p.a2a_bytes_per_step},
        {"inter_node_ring_bytes_per_step_per_node", p.inter_node_ring_bytes_per_node},
        {"single_ring_bytes_per_step_per_rank", p.single_ring_bytes_per_step},
        {"single_ring_inter_node_bytes_per_step_per_node",
         p.single_inter_node_ring_bytes_per_node},
        {"grad_payload_dense_bytes", p.grad_payload_dense},
        {"grad_payload_topk_bytes", p.grad_payload_topk},
        {"topk_k", p.topk_k},
        {"grad_sent_dense_per_node_bytes", p.grad_sent_dense_per_node},
        {"grad_sent_topk_per_node_bytes", p.grad_sent_topk_per_node},
        {"topk_at_owner", p.topk_at_owner},
        {"grad_topk_reduce_scatter_per_node_bytes", p.grad_topk_reduce_scatter_per_node},
        {"grad_topk_sparse_per_node_bytes", p.grad_topk_sparse_per_node},
        {"shard_gathered_per_rank_bytes", p.shard_gathered_per_rank},
        {"shard_scattered_per_rank_bytes", p.shard_scattered_per_rank}}},
      {"fit",
       {{"device", p.device_name},
        {"device_capacity_bytes", p.device_capacity},
        {"device_usable_bytes", p.device_usable},
        {"fits_device", p.fits_device},
        {"host_capacity_bytes", p.host_capacity},
        {"fits_host", p.fits_host},
        {"fits", p.fits()}}},
  };
}

std::string to_text(const Plan& p, const JobSpec& s) {
  std::string o;
  auto line = [&](const std::string& name, double bytes, const std::string& note = "") {
    o += fmt::format("  {:<48} {:>12}{}\n", name, human_bytes(bytes),
                     note.empty() ? "" : "   " + note);
  };
  o += fmt::format("plan for job '{}'\n\n", s.job.name);
  o += fmt::format(
      "model: {} params ({} layers, d_model {}, heads {}/{} kv, head_dim {}, {} "
      "hidden {}, vocab {}), {}\n",
      human_count(static_cast<double>(p.params)), s.model.layers, s.model.d_model, s.model.heads,
      s.resolved.kv_heads, s.resolved.head_dim, spec::to_string(s.model.mlp), s.resolved.mlp_hidden,
      s.model.vocab, spec::to_string(s.model.dtype));
  o += fmt::format("sequence: {} tokens over {} ranks ({}): {} tokens per rank; {} x {} nodes "
                   "= {} workers, {} replica(s)\n\n",
                   s.data.seq_len, p.ranks, spec::to_string(s.parallel.causal_balance),
                   p.tokens_per_rank, s.resources.workers_per_node, s.resources.nodes,
                   s.resolved.total_workers, s.parallel.data_replicas);
  o += fmt::format("FLOPs per step ({} sequence(s) of {} tokens: data_replicas x micro_batches):\n"
                   "  model       {:.4g}   6 x params x N + 6 x layers x d_model x N^2 per sequence "
                   "({:.4g} + {:.4g})\n"
                   "  hardware    {:.4g}   {}\n\n",
                   p.flops.sequences, s.data.seq_len, p.flops.model_per_step,
                   p.flops.dense_per_sequence, p.flops.attention_per_sequence,
                   p.flops.hardware_per_step,
                   !s.model.recompute ? "no recompute: the model FLOPs"
                   : spec::full_recompute(s.model)
                       ? "with recompute: one more forward, 2 x params x N + 2 x layers x d_model "
                         "x N^2 per sequence"
                       : "with selective recompute: the output projection and MLP gate/up again, "
                         "2 x layers x d_model x (H hd + mlp_in) x N per sequence");
  o += fmt::format("memory per worker ({}):\n",
                   s.resources.backend == Backend::kCuda ? "GPU" : "host");
  for (const auto& i : p.worker) line(i.name, i.bytes);
  line("total", p.worker_total);
  o += fmt::format("  (activations: {} without recompute, {} with recompute, {} with selective)\n",
                   human_bytes(p.activations_no_recompute),
                   human_bytes(p.activations_recompute), human_bytes(p.activations_selective));
  o += "\nK/V (K+V, storage dtype):\n";
  line("per layer, this rank", p.kv_local_per_layer);
  line("all layers, this rank", p.kv_local_total);
  line("per layer, whole sequence", p.kv_sequence_per_layer);
  line("all layers, whole sequence", p.kv_sequence_total);
  if (!p.worker_host.empty() && s.resources.backend != Backend::kCpu) {
    o += "\nhost memory per worker (its host-side buffers):\n";
    for (const auto& i : p.worker_host) line(i.name, i.bytes, i.formula);
    line("total", p.worker_host_total);
  }
  o += fmt::format("\nhost memory per node (shard {}, {} node(s); n = {} floats, largest node's "
                   "range {} floats):\n",
                   spec::to_string(p.shard), s.resources.nodes, p.flat_floats, p.largest_range);
  if (p.host.empty()) o += "  (nothing: optimizer on the workers)\n";
  auto part = [&](const char* title, const std::vector<Item>& items, double total) {
    if (items.empty()) return;
    o += fmt::format("  {}:\n", title);
    for (const auto& i : items)
      o += fmt::format("    {:<46} {:>12}   {}\n", i.name, human_bytes(i.bytes), i.formula);
    o += fmt::format("    {:<46} {:>12}\n", "subtotal", human_bytes(total));
  };
  part("ringd", p.host_ringd, p.host_ringd_total);
  part("shared memory (once per node)", p.host_shm, p.host_shm_total);
  part("workers", p.host_workers, p.host_workers_total);
  line("total", p.host_total);
  if (!p.modes.empty()) {
    o += "\nshard modes (the rest of the spec unchanged):\n";
    o += fmt::format("  {:<10} {:>14} {:>14}   {}\n", "mode", "per worker", "per node", "fit");
    for (const auto& md : p.modes)
      o += fmt::format("  {:<10} {:>14} {:>14}   {}{}\n", spec::to_string(md.mode),
                       human_bytes(md.worker_total), human_bytes(md.host_total),
                       md.fits_device && md.fits_host ? "fits"
                       : !md.fits_device && s.resources.backend == Backend::kCuda
                           ? "does not fit the GPU"
                           : "does not fit host memory",
                       md.mode == p.shard ? "   <- this spec" : "");
  }
  o += "\ncommunication per step:\n";
  if (p.head_ranks > 1)
    o += fmt::format("  two levels: {} ranks per head group (all-to-all inside a node), the ring "
                     "over {} groups\n",
                     p.head_ranks, p.ring_groups);
  line("ring K/V per hop (one layer)", p.ring_bytes_per_hop);
  line("ring sent per rank (fwd + bwd)", p.ring_bytes_per_step,
       p.head_ranks > 1 ? fmt::format("single ring: {}", human_bytes(p.single_ring_bytes_per_step))
                        : "");
  if (p.head_ranks > 1)
    line("head all-to-all per rank (in node)", p.a2a_bytes_per_step,
         "q, k, v, (o, lse), dout and gradients to the group");
  line("ring leaving a node (between nodes)", p.inter_node_ring_bytes_per_node,
       p.head_ranks > 1
           ? fmt::format("single ring: {}", human_bytes(p.single_inter_node_ring_bytes_per_node))
           : "the busiest node");
  line("node gradient, dense (fp32)", p.grad_payload_dense);
  line(fmt::format("node gradient, top-k {:g} (k={})", s.optimizer.density, p.topk_k),
       p.grad_payload_topk,
       p.grad_payload_topk > 0
           ? fmt::format("{:.0f}x smaller", p.grad_payload_dense / p.grad_payload_topk)
           : "");
  if (p.shard == ShardMode::kFull) {
    line("weights gathered per rank (fwd + bwd)", p.shard_gathered_per_rank,
         "about 2 x (n - shard) x 4 (fp32), every micro-batch");
    line("gradient reduce-scattered per rank", p.shard_scattered_per_rank,
         "about (n - shard) x 4; nothing between the nodes' ringd");
  } else {
    line("sent per node, dense all-reduce", p.grad_sent_dense_per_node);
    if (p.topk_at_owner) {
      line("sent per node, top-k at the owners", p.grad_sent_topk_per_node,
           p.shard == ShardMode::kNone ? "dense reduce-scatter + owners' sparse sets all-gathered"
                                       : "dense reduce-scatter to the owners");
      line("  dense reduce-scatter", p.grad_topk_reduce_scatter_per_node,
           "(nodes - 1) / nodes x 4 x params");
      if (p.shard == ShardMode::kNone)
        line("  sparse sets all-gathered", p.grad_topk_sparse_per_node,
             "(nodes - 1) / nodes x 8 x k");
    } else {
      line("sent per node, top-k all-gather", p.grad_sent_topk_per_node,
           p.grad_sent_topk_per_node > 0 && s.optimizer.compression == Compression::kTopk
               ? "at each sender (compress_at: sender)"
               : "");
    }
  }
  o += "\nfit:\n";
  if (s.resources.backend == Backend::kCuda) {
    o += fmt::format("  GPU {}: {} needed, {} usable ({} less {} reserve): {}\n", p.device_name,
                     human_bytes(p.worker_total), human_bytes(p.device_usable),
                     human_bytes(p.device_capacity), human_bytes(kGpuReserveBytes),
                     p.fits_device ? "fits" : "DOES NOT FIT");
  }
  o += fmt::format("  host: {} needed per node, {} given (resources.host_memory_gb): {}\n",
                   human_bytes(p.host_total), human_bytes(p.host_capacity),
                   p.fits_host ? "fits" : "DOES NOT FIT");
  o += fmt::format("  verdict: {}\n", p.fits() ? "fits" : "does not fit");
  return o;
}

}  // namespace ring::plan
