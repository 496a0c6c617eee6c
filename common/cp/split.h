// How one sequence is cut across the P ranks of an attention ring (context parallelism): the
// workers' data pipeline (worker/data/split.h) and the step simulator (sim/) use the same cut.
//
// zigzag: the sequence is cut into 2P chunks; rank r owns chunks r and 2P-1-r, so every rank has
// one early and one late chunk and the causal work (keys before each query) is balanced.
// contiguous: P chunks; rank r owns chunk r (the last rank does most causal work).
// Chunk c of n covers [c*L/n, (c+1)*L/n) (integer division), so any L works; the spec validator
// requires L divisible by 2P (zigzag) or P (contiguous), which makes every chunk the same size.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "common/spec/spec.h"

namespace ring::cp {

struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;  // exclusive
  int64_t size() const { return end - begin; }
};

// The chunks rank `rank` owns, ascending. Throws std::invalid_argument unless
// 0 <= rank < ranks <= seq_len (zigzag: 2 x ranks <= seq_len).
std::vector<TokenRange> rank_ranges(int64_t seq_len, int64_t ranks, int64_t rank,
                                    spec::CausalBalance balance);

// The same as token indices, ascending: [local tokens].
std::vector<int64_t> rank_token_indices(int64_t seq_len, int64_t ranks, int64_t rank,
                                        spec::CausalBalance balance);

}  // namespace ring::cp
