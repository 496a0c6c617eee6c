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

// "node 0: buckets 0-3 (head .. layers.1), 1234 floats; node 1: ..." for logs and --verify.
std::string describe(const ParamLayout& layout, const std::vector<NodeRange>& ranges);

}  // namespace ring::contract
