// Pre-tokenized datasets (data.source: tokens): a pair of files <name>.bin + <name>.idx.
//
// <name>.bin: every document's token ids back to back, little-endian uint16 or uint32, no header
// (the same layout as nanoGPT's train.bin and Megatron's .bin with a fixed token width).
// <name>.idx, little-endian, 48-byte header then the offsets:
//   offset  size  field
//        0     8  magic "RINGTOK\0"
//        8     4  version (1)
//       12     4  token width in bytes: 2 (uint16) or 4 (uint32)
//       16     8  documents N
//       24     8  tokens T; the .bin is exactly T x width bytes
//       32     8  vocab: every id is below it (0: not recorded)
//       40     8  reserved, 0
//       48  8(N+1) document start offsets in tokens: offsets[0] = 0, non-decreasing,
//                  offsets[N] = T; document i is tokens [offsets[i], offsets[i+1])
// Unlike Megatron's .idx (sizes, pointers and document indices for sequences inside documents)
// there is one level: a document is a contiguous run of ids. See docs/data.md.
//
//   TokenFileWriter w("out", TokenWidth::kU16, /*vocab=*/8000);   // out.bin, out.idx
//   w.add_document(ids);  ...  w.finish();
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
inline constexpr uint32_t kTokenIdxVersion = 1;
inline constexpr int64_t kTokenIdxHeaderBytes = 48;

// "<prefix>" from "<prefix>", "<prefix>.bin" or "<prefix>.idx".
std::string token_file_prefix(const std::string& path);

// Writes <prefix>.bin and <prefix>.idx. Both are written under private temporary names in the
// same directory (0600, O_EXCL|O_NOFOLLOW) and renamed into place by finish(), .bin first: a
// dataset already there, perhaps mapped by a running job, is replaced whole or not at all, never
// truncated under it, and a link planted at either name is replaced, not followed.
class TokenFileWriter {
 public:
  // width 2 or 4. Throws DataError when the files cannot be created.
  TokenFileWriter(const std::string& prefix, int width, uint64_t vocab);
  ~TokenFileWriter();  // unfinished: the temporaries go, the old dataset stays
  // Throws DataError when an id does not fit the width (or is >= vocab when vocab > 0).
  void add_document(std::span<const int32_t> ids);
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
};

}  // namespace ring::data
