// The rules of the flat parameter layout (layout.h) and of its division over nodes (shard.h) as
// arithmetic alone, header-only, for every part that needs them: ParamLayout and shard_ranges
// build on them, and the planner (common/plan) applies them to shapes too large to allocate, in a
// wider integer (__int128), so the plan and the run can never disagree.
//
//   LayoutShape<I> s{d, q_dim, kv_dim, hidden, vocab, tied, swiglu};
//   block_tensors(s, [&](const char* name, I rows, I cols, bool decay) { ... });  // cols 0: [rows]
//   auto first = first_buckets(bucket_sizes, nodes);  // node k owns buckets [first[k], first[k+1])
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ring::contract {

inline constexpr int64_t kParamAlign = 16;  // floats: every tensor and bucket starts aligned

template <class I>
constexpr I align_up(I x) {
  return (x + I{kParamAlign} - 1) / I{kParamAlign} * I{kParamAlign};
}

// What fixes the tensors' sizes.
template <class I>
struct LayoutShape {
  I d_model = 0, q_dim = 0, kv_dim = 0, mlp_hidden = 0, vocab = 0;
  bool tie_embeddings = false;
  bool swiglu = true;
};

// The tensors of each bucket in layout order: visit(name, rows, cols, decay), cols 0 for a
// vector [rows]. Projections are [out, in].
template <class I, class Visit>
void head_tensors(const LayoutShape<I>& s, Visit&& visit) {
  visit("final_norm.gain", s.d_model, I{0}, false);
  if (!s.tie_embeddings) visit("lm_head.weight", s.vocab, s.d_model, true);
}
template <class I, class Visit>
void block_tensors(const LayoutShape<I>& s, Visit&& visit) {
  visit("attn_norm.gain", s.d_model, I{0}, false);
  visit("attn.wq", s.q_dim, s.d_model, true);
  visit("attn.wk", s.kv_dim, s.d_model, true);
  visit("attn.wv", s.kv_dim, s.d_model, true);
  visit("attn.wo", s.d_model, s.q_dim, true);
  visit("mlp_norm.gain", s.d_model, I{0}, false);
  if (s.swiglu) visit("mlp.w_gate", s.mlp_hidden, s.d_model, true);
  visit("mlp.w_up", s.mlp_hidden, s.d_model, true);
  visit("mlp.w_down", s.d_model, s.mlp_hidden, true);
}
template <class I, class Visit>
void embedding_tensors(const LayoutShape<I>& s, Visit&& visit) {
  visit("embedding.weight", s.vocab, s.d_model, true);
}

// The floats one bucket of tensors spans, from an aligned start to its aligned end.
template <class I, class Tensors>
I bucket_span(const LayoutShape<I>& s, Tensors&& tensors) {
  I end = 0;
  tensors(s, [&](const char*, I rows, I cols, bool) {
    end = align_up(end) + rows * (cols == I{0} ? I{1} : cols);
  });
  return align_up(end);
}

// Buckets to nodes (shard.h): each node owns a run of whole buckets, the largest run as small as
// a greedy fill allows; a node moves on early when the buckets left just give every remaining
// node one. first[k] is node k's first bucket, first[nodes] == size; a node past the last used
// one owns nothing (first[k] == first[k+1] == size).
template <class Size>
std::vector<size_t> first_buckets(const std::vector<Size>& b, int64_t nodes) {
  nodes = std::max<int64_t>(nodes, 1);
  auto needed = [&](Size bound) {
    int64_t used = 1;
    Size fill = 0;
    for (Size x : b) {
      if (fill + x > bound && fill > 0) ++used, fill = 0;
      fill += x;
    }
    return used;
  };
  Size lo = 0, hi = 0;
  for (Size x : b) lo = std::max(lo, x), hi += x;
  hi = std::max(hi, lo);
  // The smallest bound for which the greedy fill needs at most `nodes` nodes.
  while (lo < hi) {
    const Size mid = lo + (hi - lo) / 2;
    if (needed(mid) <= nodes) hi = mid;
    else lo = mid + 1;
  }
  std::vector<size_t> first(static_cast<size_t>(nodes) + 1, b.size());
  first[0] = 0;
  int64_t k = 0;
  Size fill = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const int64_t left_buckets = static_cast<int64_t>(b.size() - i);
    const int64_t left_nodes = nodes - 1 - k;
    if (k + 1 < nodes && fill > 0 && (fill + b[i] > lo || left_buckets <= left_nodes)) {
      ++k;
      fill = 0;
      first[static_cast<size_t>(k)] = i;
    }
    fill += b[i];
  }
  return first;
}

}  // namespace ring::contract
