#include "common/cp/split.h"

#include <fmt/format.h>

namespace ring::cp {

std::vector<TokenRange> rank_ranges(int64_t seq_len, int64_t ranks, int64_t rank,
                                    spec::CausalBalance balance) {
  const bool zig = balance == spec::CausalBalance::kZigzag;
  const int64_t chunks = zig ? 2 * ranks : ranks;
  if (ranks < 1 || rank < 0 || rank >= ranks || seq_len < chunks)
    throw std::invalid_argument(
        fmt::format("split: rank {} of {} ranks with {} chunks of a {}-token "
                    "sequence: need 0 <= rank < ranks and chunks <= seq_len",
                    rank, ranks, chunks, seq_len));
  auto chunk = [&](int64_t c) {
    return TokenRange{c * seq_len / chunks, (c + 1) * seq_len / chunks};
  };
  if (!zig) return {chunk(rank)};
  return {chunk(rank), chunk(2 * ranks - 1 - rank)};
}

std::vector<int64_t> rank_token_indices(int64_t seq_len, int64_t ranks, int64_t rank,
                                        spec::CausalBalance balance) {
  std::vector<int64_t> out;
  for (const TokenRange& r : rank_ranges(seq_len, ranks, rank, balance))
    for (int64_t i = r.begin; i < r.end; ++i) out.push_back(i);
  return out;
}

}  // namespace ring::cp
