#include "worker/data/split.h"

#include "worker/data/errors.h"

namespace ring::data {

SequenceShard shard_sequence(const Sequence& seq, int64_t ranks, int64_t rank,
                             spec::CausalBalance balance) {
  SequenceShard s;
  try {
    s.indices = cp::rank_token_indices(seq.size(), ranks, rank, balance);
  } catch (const std::invalid_argument& e) {
    throw DataError(e.what());
  }
  const size_t n = s.indices.size();
  s.tokens.resize(n);
  s.labels.resize(n);
  s.positions.resize(n);
  s.doc_ids.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const int64_t i = s.indices[k];
    s.tokens[k] = seq.tokens[i];
    s.labels[k] = seq.labels[i];
    s.positions[k] = seq.positions[i];
    s.doc_ids[k] = seq.doc_ids[i];
  }
  return s;
}

}  // namespace ring::data
