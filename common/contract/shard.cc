#include "common/contract/shard.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace ring::contract {

// layout_rules.h's division, on the layout's bucket sizes.
std::vector<NodeRange> shard_ranges(const ParamLayout& layout, int nodes) {
  if (nodes < 1) throw std::invalid_argument(fmt::format("shard_ranges: nodes must be >= 1, got {}", nodes));
  const std::vector<GradBucket>& b = layout.buckets();
  std::vector<int64_t> sizes;
  sizes.reserve(b.size());
  for (const GradBucket& x : b) sizes.push_back(x.end - x.begin);
  const std::vector<size_t> first = first_buckets(sizes, nodes);
  std::vector<NodeRange> out(static_cast<size_t>(nodes));
  for (int k = 0; k < nodes; ++k) {
    NodeRange& r = out[static_cast<size_t>(k)];
    r.node = k;
    r.first_bucket = static_cast<int>(first[static_cast<size_t>(k)]);
    r.end_bucket = static_cast<int>(first[static_cast<size_t>(k) + 1]);
    // A node past the last used one owns nothing: an empty range at the end of the layout.
    if (r.first_bucket == r.end_bucket) r.first_bucket = r.end_bucket = static_cast<int>(b.size());
    r.begin = r.first_bucket < static_cast<int>(b.size()) ? b[r.first_bucket].begin : layout.total();
    r.end = r.end_bucket > r.first_bucket ? b[r.end_bucket - 1].end : layout.total();
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
