#include "common/contract/shard.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace ring::contract {
namespace {

// Greedy: fill each node up to `bound` floats with whole buckets; how many nodes that takes.
int nodes_needed(const std::vector<GradBucket>& b, int64_t bound) {
  int used = 1;
  int64_t fill = 0;
  for (const GradBucket& x : b) {
    const int64_t s = x.end - x.begin;
    if (fill + s > bound && fill > 0) {
      ++used;
      fill = 0;
    }
    fill += s;
  }
  return used;
}

}  // namespace

std::vector<NodeRange> shard_ranges(const ParamLayout& layout, int nodes) {
  if (nodes < 1) throw std::invalid_argument(fmt::format("shard_ranges: nodes must be >= 1, got {}", nodes));
  const std::vector<GradBucket>& b = layout.buckets();
  int64_t lo = 0, hi = layout.total();
  for (const GradBucket& x : b) lo = std::max(lo, x.end - x.begin);
  // Smallest bound for which the greedy fill needs at most `nodes` nodes.
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (nodes_needed(b, mid) <= nodes) hi = mid;
    else lo = mid + 1;
  }
  const int64_t bound = lo;
  std::vector<NodeRange> out(static_cast<size_t>(nodes));
  int k = 0;
  int64_t fill = 0;
  out[0].node = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const int64_t s = b[i].end - b[i].begin;
    // Move to the next node when this bucket would overflow it, or when the buckets left are
    // just enough to give every remaining node one (so no node is left empty needlessly).
    const int left_buckets = static_cast<int>(b.size() - i);
    const int left_nodes = nodes - 1 - k;
    if (k + 1 < nodes && fill > 0 && (fill + s > bound || left_buckets <= left_nodes)) {
      ++k;
      fill = 0;
      out[k].first_bucket = static_cast<int>(i);
      out[k].begin = b[i].begin;
    }
    fill += s;
    out[k].end_bucket = static_cast<int>(i) + 1;
    out[k].end = b[i].end;
  }
  // Nodes past the last used one own nothing: an empty range at the end of the layout.
  for (int j = 0; j < nodes; ++j) {
    out[j].node = j;
    if (j > k) {
      out[j].first_bucket = out[j].end_bucket = static_cast<int>(b.size());
      out[j].begin = out[j].end = layout.total();
    }
  }
  return out;
}

int bucket_owner(const std::vector<NodeRange>& ranges, int bucket) {
  for (const NodeRange& r : ranges)
    if (bucket >= r.first_bucket && bucket < r.end_bucket) return r.node;
  throw std::invalid_argument(fmt::format("bucket_owner: bucket {} is in no range", bucket));
}

std::vector<WorkerShard> worker_shards(const ParamLayout& layout, int nodes,
                                       int workers_per_node) {
  if (workers_per_node < 1)
    throw std::invalid_argument(
        fmt::format("worker_shards: workers_per_node must be >= 1, got {}", workers_per_node));
  std::vector<WorkerShard> out;
  out.reserve(static_cast<size_t>(nodes) * workers_per_node);
  for (const NodeRange& r : shard_ranges(layout, nodes)) {
    const int64_t per = ((r.size() + workers_per_node - 1) / workers_per_node + kParamAlign - 1) /
                        kParamAlign * kParamAlign;
    for (int l = 0; l < workers_per_node; ++l) {
      const int64_t b = std::min(r.end, r.begin + l * per);
      out.push_back({b, std::min(r.end, b + per)});
    }
  }
  return out;
}

int64_t largest_worker_shard(const ParamLayout& layout, int nodes, int workers_per_node) {
  int64_t m = 0;
  for (const WorkerShard& w : worker_shards(layout, nodes, workers_per_node))
    m = std::max(m, w.size());
  return m;
}

std::string describe(const ParamLayout& layout, const std::vector<NodeRange>& ranges) {
  std::string s;
  const auto& b = layout.buckets();
  for (const NodeRange& r : ranges) {
    if (!s.empty()) s += "; ";
    if (r.empty())
      s += fmt::format("node {}: nothing", r.node);
    else if (r.end_bucket - r.first_bucket == 1)
      s += fmt::format("node {}: bucket {} ({}), {} floats", r.node, r.first_bucket,
                       b[r.first_bucket].name, r.size());
    else
      s += fmt::format("node {}: buckets {}-{} ({} .. {}), {} floats", r.node, r.first_bucket,
                       r.end_bucket - 1, b[r.first_bucket].name, b[r.end_bucket - 1].name,
                       r.size());
  }
  return s;
}

}  // namespace ring::contract
