// Documents: what the packing loader (loader.h) reads tokens from, whatever stores them.
//
//   TextCorpus   byte tokens (0..255) read from text files (corpus.h)
//   TokenCorpus  token ids: text encoded with a SentencePiece model, or pre-tokenized .bin/.idx
//                files memory-mapped (token_corpus.h)
//
// Document i has doc_len(i) >= 1 tokens; copy_tokens widens them to int32. content_hash() covers
// every token and every document boundary, so a loader cursor saved on one set of documents is
// refused on another (cursor.h).
#pragma once

#include <cstdint>

namespace ring::data {

class Documents {
 public:
  virtual ~Documents() = default;
  virtual int64_t num_docs() const = 0;
  virtual int64_t doc_len(int64_t i) const = 0;
  // out[k] = token (offset + k) of document `doc`, k < n; offset + n <= doc_len(doc).
  virtual void copy_tokens(int64_t doc, int64_t offset, int64_t n, int32_t* out) const = 0;
  virtual int64_t total_tokens() const = 0;
  virtual uint64_t content_hash() const = 0;
  // The largest id in any document (bytes: 255); model.vocab must be above it.
  virtual int64_t max_token() const = 0;
  // "text" | "tokens": the loader cursor's data.source.
  virtual const char* source_name() const = 0;
};

}  // namespace ring::data
