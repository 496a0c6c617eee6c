#include "worker/data/sequence.h"

#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {

int64_t Sequence::pad_begin() const {
  if (!segments.empty() && segments.back().doc < 0) return cu_seqlens[cu_seqlens.size() - 2];
  return size();
}

int64_t Sequence::valid_labels() const {
  int64_t n = 0;
  for (int32_t l : labels) n += l != kIgnoreLabel;
  return n;
}

void check_sequence(const Sequence& s, int64_t vocab) {
  auto fail = [](const std::string& m) { throw DataError("invalid sequence: " + m); };
  const size_t L = s.tokens.size();
  if (L == 0) fail("no tokens");
  if (s.labels.size() != L || s.positions.size() != L || s.doc_ids.size() != L)
    fail(fmt::format("array sizes differ: tokens {}, labels {}, positions {}, doc_ids {}", L,
                     s.labels.size(), s.positions.size(), s.doc_ids.size()));
  if (s.cu_seqlens.size() != s.segments.size() + 1)
    fail(fmt::format("cu_seqlens has {} entries for {} segments", s.cu_seqlens.size(),
                     s.segments.size()));
  if (s.cu_seqlens.front() != 0 || s.cu_seqlens.back() != static_cast<int32_t>(L))
    fail(fmt::format("cu_seqlens must run from 0 to {}", L));
  for (size_t seg = 0; seg + 1 < s.cu_seqlens.size(); ++seg) {
    const int64_t b = s.cu_seqlens[seg], e = s.cu_seqlens[seg + 1];
    if (e <= b) fail(fmt::format("segment {} is empty or reversed ({}..{})", seg, b, e));
    const bool pad = s.segments[seg].doc < 0;
    if (pad && seg + 1 != s.segments.size()) fail("padding is not the last segment");
    for (int64_t i = b; i < e; ++i) {
      if (s.positions[i] != i) fail(fmt::format("positions[{}] = {}", i, s.positions[i]));
      if (s.doc_ids[i] != static_cast<int32_t>(seg))
        fail(fmt::format("doc_ids[{}] = {}, expected segment {}", i, s.doc_ids[i], seg));
      if (s.tokens[i] < 0 || s.tokens[i] >= vocab)
        fail(vocab == 256 ? fmt::format("tokens[{}] = {} is not a byte", i, s.tokens[i])
                          : fmt::format("tokens[{}] = {} is outside the vocab 0..{}", i,
                                        s.tokens[i], vocab - 1));
      const int32_t want_if_set = i + 1 < e ? s.tokens[i + 1] : kIgnoreLabel;
      if (s.labels[i] != kIgnoreLabel && (pad || s.labels[i] != want_if_set))
        fail(fmt::format("labels[{}] = {}, expected {} or -1", i, s.labels[i],
                         pad ? kIgnoreLabel : want_if_set));
    }
  }
}

}  // namespace ring::data
