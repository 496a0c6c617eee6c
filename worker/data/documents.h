// Documents: what the packing loader (loader.h) reads tokens from, whatever stores them.
//
//   TextCorpus   byte tokens (0..255) read from text files (corpus.h)
//   TokenCorpus  token ids: text encoded with a tokenizer, chat conversations rendered with a
//                template (chat.h), or pre-tokenized .bin/.idx files memory-mapped
//                (token_corpus.h)
//
// Document i has doc_len(i) >= 1 tokens; copy_tokens widens them to int32. A document may carry a
// loss mask (chat data): copy_mask says which tokens are training targets; the loader sets the
// label that predicts a non-target token to -1. content_hash() covers every token, every
// document boundary and the mask, so a loader cursor saved on one set of documents is refused on
// another (cursor.h).
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
  // False: every token is a target (text), copy_mask need not be called.
  virtual bool has_mask() const { return false; }
  // out[k] = 1 when token (offset + k) of `doc` is a training target, else 0; k < n.
  virtual void copy_mask(int64_t doc, int64_t offset, int64_t n, uint8_t* out) const {
    (void)doc;
    (void)offset;
    for (int64_t k = 0; k < n; ++k) out[k] = 1;
  }
  virtual int64_t total_tokens() const = 0;
  virtual uint64_t content_hash() const = 0;
  // The largest id in any document (bytes: 255); model.vocab must be above it.
  virtual int64_t max_token() const = 0;
  // "text" | "tokens" | "chat": the loader cursor's data.source.
  virtual const char* source_name() const = 0;
};

}  // namespace ring::data
