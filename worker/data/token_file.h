// Pre-tokenized datasets (data.source: tokens): <name>.bin + <name>.idx, and <name>.mask when the
// dataset carries a loss mask (chat data written by `ringctl tokenize --chat-template`).
//
// <name>.bin: every document's token ids back to back, little-endian uint16 or uint32, no header
// (the same layout as nanoGPT's train.bin and Megatron's .bin with a fixed token width).
// <name>.idx, little-endian, 48-byte header then the offsets:
//   offset  size  field
//        0     8  magic "RINGTOK\0"
//        8     4  version: 2 (written); 1 (read: the format before loss masks)
//       12     4  token width in bytes: 2 (uint16) or 4 (uint32)
//       16     8  documents N
//       24     8  tokens T; the .bin is exactly T x width bytes
//       32     8  vocab: every id is below it (0: not recorded)
//       40     8  version 2: flags, bit 0 = a loss mask in <name>.mask, other bits 0;
//                  version 1: reserved, 0
//       48  8(N+1) document start offsets in tokens: offsets[0] = 0, non-decreasing,
//                  offsets[N] = T; document i is tokens [offsets[i], offsets[i+1])
// <name>.mask (flag bit 0): ceil(T / 8) bytes, one bit per token of the .bin, least significant
// bit first (token i is bit i % 8 of byte i / 8); 1: the token is a training target, 0: the label
// that predicts it is ignored. Padding bits of the last byte are 0.
// Unlike Megatron's .idx (sizes, pointers and document indices for sequences inside documents)
// there is one level: a document is a contiguous run of ids. See docs/data.md.
//
//   TokenFileWriter w("out", 2, /*vocab=*/8000);   // uint16 ids: out.bin, out.idx
//   w.add_document(ids);  ...  w.finish();
//   TokenFileWriter c("chat", 2, 8000, /*with_mask=*/true);     // + chat.mask
//   c.add_document(ids, mask);
//   auto f = TokenFile::open("out");   // or "out.bin" / "out.idx"; validates, memory-maps
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ring::data {

inline constexpr char kTokenIdxMagic[8] = {'R', 'I', 'N', 'G', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kTokenIdxVersion = 2;
inline constexpr uint64_t kTokenFlagMask = 1;  // flags bit 0: <prefix>.mask
inline constexpr int64_t kTokenIdxHeaderBytes = 48;

// "<prefix>" from "<prefix>", "<prefix>.bin" or "<prefix>.idx".
std::string token_file_prefix(const std::string& path);

// Writes <prefix>.bin and <prefix>.idx (and <prefix>.mask with_mask). All are written under private
// temporary names in the same directory (0600, O_EXCL|O_NOFOLLOW) and renamed into place by
// finish(), .bin first, .idx last: a
// dataset already there, perhaps mapped by a running job, is replaced whole or not at all, never
// truncated under it, and a link planted at either name is replaced, not followed.
class TokenFileWriter {
 public:
  // width 2 or 4. Throws DataError when the files cannot be created.
  TokenFileWriter(const std::string& prefix, int width, uint64_t vocab, bool with_mask = false);
  ~TokenFileWriter();  // unfinished: the temporaries go, the old dataset stays
  // Throws DataError when an id does not fit the width (or is >= vocab when vocab > 0), and when
  // `mask` (1: target) is not given exactly with_mask, one entry per id.
  void add_document(std::span<const int32_t> ids, std::span<const uint8_t> mask = {});
  // Writes the .idx, makes both durable and renames them into place; the dataset exists only
  // after this.
  void finish();
  int64_t documents() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t tokens() const { return offsets_.back(); }

 private:
  std::string prefix_;
  int width_;
  uint64_t vocab_;
  std::FILE* bin_ = nullptr;
  std::string bin_tmp_;  // the .bin being written
  std::FILE* mask_ = nullptr;
  std::string mask_tmp_;  // the .mask being written (with_mask)
  uint8_t mask_byte_ = 0;  // bits of the tokens since the last whole byte
  std::vector<uint8_t> mask_buf_;
  std::vector<uint64_t> offsets_{0};
  std::vector<uint8_t> buf_;
};

// Writes <prefix>.idx for an existing flat <prefix>.bin of `width`-byte ids without an index
// (nanoGPT's train.bin: uint16, documents separated by the GPT-2 EOT id 50256): a document ends
// after each `eot` id; ids after the last EOT form the last document. The .bin is not changed.
// Returns the number of documents. Throws DataError naming the file.
int64_t write_index_for_flat_bin(const std::string& path, int width, int64_t eot, uint64_t vocab);

// One memory-mapped .bin/.idx pair, every header field and offset checked.
class TokenFile {
 public:
  // Throws DataError naming the file and the field that is wrong.
  static std::shared_ptr<const TokenFile> open(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int width() const { return width_; }
  int64_t num_docs() const { return static_cast<int64_t>(num_docs_); }
  int64_t num_tokens() const { return static_cast<int64_t>(num_tokens_); }
  uint64_t vocab() const { return vocab_; }
  int64_t doc_begin(int64_t i) const { return static_cast<int64_t>(offsets_[i]); }
  int64_t doc_len(int64_t i) const { return static_cast<int64_t>(offsets_[i + 1] - offsets_[i]); }
  const uint8_t* data() const { return bin_; }          // [num_tokens x width]
  const uint64_t* offsets() const { return offsets_; }  // [num_docs + 1]
  // The loss mask bits ([ceil(num_tokens / 8)], see above), nullptr when the dataset has none.
  const uint8_t* mask() const { return mask_; }
  uint32_t version() const { return version_; }
  const std::string& prefix() const { return prefix_; }

 private:
  TokenFile() = default;
  std::string prefix_;
  int width_ = 0;
  uint64_t num_docs_ = 0, num_tokens_ = 0, vocab_ = 0;
  const uint8_t* bin_ = nullptr;
  size_t bin_size_ = 0;
  const uint8_t* idx_ = nullptr;
  size_t idx_size_ = 0;
  const uint64_t* offsets_ = nullptr;
  const uint8_t* mask_ = nullptr;
  size_t mask_size_ = 0;
  uint32_t version_ = 0;
};

}  // namespace ring::data
