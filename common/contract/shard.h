// How the optimizer state is divided between the nodes of a job (parallel.shard): node k owns a
// contiguous, bucket-aligned range of the flat parameter layout (layout.h), buckets
// [first_bucket, end_bucket), floats [begin, end). The ranges cover the layout in node order,
// with no gap and no overlap; a node may own nothing (more nodes than buckets). Because a bucket
// holds whole tensors, every tensor has exactly one owner.
//
//   shard none       every ringd keeps the whole optimizer state; checkpoints are still written
//                    in these ranges (node k writes the tensors it owns), so any checkpoint
//                    resumes on any node count and shard mode
//   shard optimizer  node k's ringd keeps master weights and AdamW moments of its range only
//   shard full       as optimizer, and node k's range is split further among its workers
//                    (worker_shards): each worker keeps only its shard of the working weights and
//                    of the gradient; a block's weights are all-gathered over all workers of the
//                    job before use and its gradient reduce-scattered back to the shards
//
// The division is a pure function of (layout, nodes): every node computes the same ranges, and
// ringctl plan uses it to size the largest node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/contract/layout.h"

namespace ring::contract {

struct NodeRange {
  int node = 0;
  int first_bucket = 0;  // buckets [first_bucket, end_bucket)
  int end_bucket = 0;
  int64_t begin = 0;     // floats [begin, end) of the flat layout
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end == begin; }
  bool contains(int64_t offset) const { return offset >= begin && offset < end; }
};

// The ranges of `nodes` nodes (>= 1): contiguous runs of buckets that minimise the largest
// range (exact: binary search on the bound, greedy fill), ties broken toward earlier nodes
// taking more. Throws std::invalid_argument for nodes < 1.
std::vector<NodeRange> shard_ranges(const ParamLayout& layout, int nodes);

// The node owning bucket b under `ranges`.
int bucket_owner(const std::vector<NodeRange>& ranges, int bucket);

// One worker's shard under shard full: floats [begin, end) of the flat layout.
struct WorkerShard {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The shards of all nodes x workers_per_node workers, in global rank order (rank g = node
// g / workers_per_node, local rank g % workers_per_node): node k's range (shard_ranges) cut
// into workers_per_node consecutive pieces of ceil(range / workers_per_node) floats rounded up
// to kParamAlign (64 bytes), the last ones shorter or empty. Throws std::invalid_argument for
// nodes < 1 or workers_per_node < 1.
std::vector<WorkerShard> worker_shards(const ParamLayout& layout, int nodes, int workers_per_node);
// The largest shard of worker_shards: ceil(largest range / workers_per_node) rounded up to
// kParamAlign, or less when the largest range is smaller than that.
int64_t largest_worker_shard(const ParamLayout& layout, int nodes, int workers_per_node);

// "node 0: buckets 0-3 (head .. layers.1), 1234 floats; node 1: ..." for logs and --verify.
std::string describe(const ParamLayout& layout, const std::vector<NodeRange>& ranges);

}  // namespace ring::contract
