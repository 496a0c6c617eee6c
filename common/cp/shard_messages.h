// Sizes of the messages parallel.shard full sends (worker/ring/full_shard.h), for the store that
// sends them and for `ringctl plan` (common/plan FullShardLayout) and `ringctl simulate` (sim/),
// which must count the same bytes. Both are point to point with no header: a message is one
// rank's part of one bucket, `values` values.
//
// Block all-gather: the weights travel in the dtype the model computes with, `elem_bytes` each:
// 4 for fp32, 2 for bf16 (the owner rounds its fp32 shard once with the one rounding; the model
// would round the block to the same bf16 values as it acquires it, docs/precision.md).
// Gradient reduce-scatter: fp32 whatever the dtype. The parts are summed at the owner in fp32 in
// shard none's order, which is what makes shard full's gradients the bits of shard none's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ring::cp {

// Bytes of the element a gather carries for a model of element size `model_elem_bytes` (the
// model.dtype's storage size: 4 fp32, 2 bf16).
inline constexpr size_t shard_gather_elem_bytes(size_t model_elem_bytes) {
  return model_elem_bytes == 2 ? 2 : sizeof(float);
}

inline constexpr size_t shard_gather_bytes(int64_t values, size_t elem_bytes) {
  return values <= 0 ? 0 : static_cast<size_t>(values) * elem_bytes;
}

inline constexpr size_t shard_scatter_bytes(int64_t values) {
  return values <= 0 ? 0 : static_cast<size_t>(values) * sizeof(float);
}

}  // namespace ring::cp
