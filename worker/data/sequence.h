// One training sequence of seq_len tokens (bytes, or token ids with data.tokenizer or the tokens
// source) with its document structure.
//
// Every array has exactly seq_len entries (L):
//   tokens    [L] int32  byte values 0..255, or token ids 0..vocab-1 (kPadToken in padding)
//   labels    [L] int32  next token within the same segment; kIgnoreLabel (-1) at the last token
//                        of each segment and in padding. Labels are shifted here, before any
//                        split across ranks (worker/data/split.h), so a rank never needs its
//                        neighbour's first token.
//   positions [L] int64  global position in the sequence, 0..L-1 (RoPE and the causal mask use
//                        it; it is not reset at document boundaries)
//   doc_ids   [L] int32  segment index within the sequence, ascending from 0
//   cu_seqlens [S+1] int32  segment boundaries: segment s covers [cu_seqlens[s], cu_seqlens[s+1]);
//                        cu_seqlens[0] = 0, cu_seqlens[S] = L. Padding (pack: false) is its own
//                        last segment.
//   segments  [S]        where each segment came from (corpus document and byte offset); the
//                        padding segment has doc = -1.
// A segment is a whole document or the part of one that fits: a document that does not fit the
// rest of a sequence continues in the next one as a new segment there.
#pragma once

#include <cstdint>
#include <vector>

namespace ring::data {

inline constexpr int32_t kIgnoreLabel = -1;
// NUL never occurs in byte-level text (binary files are skipped); with token ids, 0 may be a real
// id (SentencePiece's <unk>): padding is told apart by its segment (doc -1) and label -1.
inline constexpr int32_t kPadToken = 0;

struct SegmentSource {
  int64_t doc = -1;    // corpus document index (passkey: sample index); -1 for padding
  int64_t offset = 0;  // offset of the segment's first token within that document
};

struct Sequence {
  std::vector<int32_t> tokens;
  std::vector<int32_t> labels;
  std::vector<int64_t> positions;
  std::vector<int32_t> doc_ids;
  std::vector<int32_t> cu_seqlens;
  std::vector<SegmentSource> segments;

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_segments() const { return static_cast<int64_t>(segments.size()); }
  // Tokens before the padding segment (size() when there is no padding).
  int64_t pad_begin() const;
  // Labels that are not kIgnoreLabel: the loss normaliser of this sequence.
  int64_t valid_labels() const;
};

// Checks every invariant listed above; throws DataError naming the first one broken. Cheap (one
// pass); used by tests and worth calling on sequences that crossed a process boundary. Tokens
// must be below `vocab` (256: byte-level).
void check_sequence(const Sequence& seq, int64_t vocab = 256);

}  // namespace ring::data
