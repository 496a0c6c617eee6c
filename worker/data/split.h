// Rank r's share of one sequence: the arrays of sequence.h gathered at the token indices the
// context-parallel cut gives it (common/cp/split.h: zigzag or contiguous). Labels are already
// shifted (sequence.h) and positions are global, so a rank needs nothing from its neighbours'
// tokens to compute its loss.
#pragma once

#include <cstdint>
#include <vector>

#include "common/cp/split.h"
#include "common/spec/spec.h"
#include "worker/data/sequence.h"

namespace ring::data {

// Rank `rank`'s part of a sequence: the arrays of sequence.h gathered at its token indices.
// cu_seqlens are not local (segments cross chunks); use doc_ids and positions for masking.
struct SequenceShard {
  std::vector<int64_t> indices;    // [local] positions in the full sequence, ascending
  std::vector<int32_t> tokens;     // [local]
  std::vector<int32_t> labels;     // [local]
  std::vector<int64_t> positions;  // [local] global positions (== indices)
  std::vector<int32_t> doc_ids;    // [local]
};

SequenceShard shard_sequence(const Sequence& seq, int64_t ranks, int64_t rank,
                             spec::CausalBalance balance);

}  // namespace ring::data
