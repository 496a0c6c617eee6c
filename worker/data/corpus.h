// The text corpus: documents read from files and directories, as byte tokens (vocab 256).
//
//   CorpusOptions o{.max_doc_len = 2048, .min_doc_len = 16};
//   auto corpus = TextCorpus::load({"/usr/share/common-licenses", "/usr/share/doc"}, o);
//   std::span<const uint8_t> d = corpus.doc(0);
//
// Paths are read in the order given; directories recursively, entries sorted by name (byte order)
// so the corpus is the same on every machine with the same files. Symlinks are followed; each
// directory and each file (by device and inode) is read once, so symlink loops and links to the
// same file neither hang nor duplicate documents. Only regular files are opened (never a FIFO or
// a device). Files starting with the gzip magic (Debian ships many docs as .gz) are decompressed
// with zlib. Each text file is one document; empty files and binary files (a NUL byte, or more
// than max_invalid_utf8_fraction of bytes not valid UTF-8) are skipped. A document longer than
// max_doc_len is cut into pieces of max_doc_len; pieces shorter than min_doc_len are dropped.
//
// Memory: one flat byte buffer plus document offsets; no other copy is kept. Loading stops at
// max_total_bytes (default 256 MiB: /usr/share/doc on Debian is ~140 MB plain + compressed and
// decompresses to more; a worker also needs room for the model), cutting the last file there.
//
// Errors (DataError): a path given in `paths` that does not exist or cannot be read (the message
// names it and the OS reason), and a corpus with no document at all (the message lists every path
// with what was skipped there). Unreadable entries inside a directory (permissions, corrupt .gz,
// broken symlinks) are skipped and counted in stats(), with the first few named.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "worker/data/documents.h"

namespace ring::data {

inline constexpr int64_t kDefaultMaxTotalBytes = int64_t{256} << 20;

struct CorpusOptions {
  int64_t max_doc_len = 0;  // tokens; 0: no cut (the loader passes data.seq_len for 0)
  int64_t min_doc_len = 1;  // tokens
  int64_t max_total_bytes = kDefaultMaxTotalBytes;
  double max_invalid_utf8_fraction = 0.1;
  // Threads that encode the text with data.tokenizer (token_corpus.h); 0: every core. A worker
  // passes its own thread count so that the ranks of a node do not oversubscribe it.
  int encode_threads = 0;
};

struct CorpusStats {
  int64_t files_found = 0;  // regular files reached (after de-duplication)
  int64_t files_used = 0;   // files that gave at least one document
  int64_t files_binary = 0;
  int64_t files_empty = 0;
  int64_t files_too_short = 0;   // non-empty text, every piece shorter than min_doc_len
  int64_t entries_skipped = 0;   // unreadable files or dirs, broken symlinks, FIFOs, corrupt .gz
  int64_t files_duplicate = 0;   // the same inode reached again (symlinks, hard links)
  int64_t files_not_loaded = 0;  // after the byte cap was reached
  int64_t bytes_dropped = 0;     // tails of documents shorter than min_doc_len
  bool capped = false;           // loading stopped at max_total_bytes
  std::vector<std::string> skipped_examples;  // "path: reason" for the first few skipped entries
};

class TextCorpus final : public Documents {
 public:
  // Reads the paths as described above. Throws DataError.
  static TextCorpus load(const std::vector<std::string>& paths, const CorpusOptions& options);
  // The same documents in the same order, handed to `sink` file by file instead of kept: memory
  // is one file's bytes (a document's span is valid during the call only). max_total_bytes still
  // caps what is read. For corpora larger than memory (`ringctl tokenize`). `estimate`, when
  // given, is told once, before the first document, about how many bytes the files hold (sizes
  // on disk, a gzip file's recorded uncompressed size; binary files included). Throws DataError
  // as load, and whatever the sink throws.
  using DocumentSink = std::function<void(std::span<const uint8_t>)>;
  static CorpusStats stream(const std::vector<std::string>& paths, const CorpusOptions& options,
                            const DocumentSink& sink,
                            const std::function<void(int64_t)>& estimate = {});
  // Builds a corpus from in-memory documents (same cutting and dropping rules; no binary check).
  static TextCorpus from_documents(const std::vector<std::string>& docs,
                                   const CorpusOptions& options);

  int64_t num_docs() const override { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t doc_len(int64_t i) const override { return offsets_[i + 1] - offsets_[i]; }
  void copy_tokens(int64_t doc, int64_t offset, int64_t n, int32_t* out) const override {
    const uint8_t* p = bytes_.data() + offsets_[doc] + offset;
    for (int64_t k = 0; k < n; ++k) out[k] = p[k];
  }
  const char* source_name() const override { return "text"; }
  int64_t max_token() const override { return 255; }
  // Bytes of document i; valid as long as the corpus lives.
  std::span<const uint8_t> doc(int64_t i) const {
    return {bytes_.data() + offsets_[i], static_cast<size_t>(doc_len(i))};
  }
  int64_t total_tokens() const override { return static_cast<int64_t>(bytes_.size()); }
  // A 64-bit hash of every byte and every document boundary: a cursor saved against one corpus
  // is refused against another (worker/data/cursor.h).
  uint64_t content_hash() const override { return content_hash_; }
  const CorpusStats& stats() const { return stats_; }

 private:
  TextCorpus() = default;
  class Builder;

  std::vector<uint8_t> bytes_;    // [total_tokens] every document back to back
  std::vector<int64_t> offsets_;  // [num_docs + 1] document i is bytes_[offsets_[i], offsets_[i+1])
  uint64_t content_hash_ = 0;
  CorpusStats stats_;
};

// Folds n bytes into the running hash h (content_hash of corpora; not cryptographic).
uint64_t hash_bytes(uint64_t h, const uint8_t* p, size_t n);

// Fraction of bytes in `bytes` that are not part of a valid UTF-8 sequence (0 for empty input).
double invalid_utf8_fraction(std::span<const uint8_t> bytes);

}  // namespace ring::data
