// Token-id documents for the packing loader: text encoded with a tokenizer (data.tokenizer), chat
// conversations rendered and encoded with their loss mask (data.source: chat, chat.h), or
// pre-tokenized .bin/.idx files (data.source: tokens, token_file.h; with their .mask if any).
//
//   auto text = TextCorpus::load(paths, {.max_doc_len = 0, .min_doc_len = 1});  // whole files
//   auto c = TokenCorpus::encode(text, *Tokenizer::load("tok.model"), 4096, 16);
//   auto h = TokenCorpus::encode_chat(read_chat_paths(paths), ChatEncoder(t, tok), 4096, 16);
//   auto d = TokenCorpus::open({"/data/web.bin", "/data/books"}, 4096, 16);
//
// Documents are cut into pieces of at most max_doc_len tokens (0: no cut) and pieces shorter than
// min_doc_len are dropped, the rules of the text corpus applied to ids instead of bytes. Encoded
// text: each document is framed by the tokenizer's BOS/EOS (tokenizer.h) before cutting, so BOS
// only starts the first piece and EOS only ends the last one. A conversation is one document (its
// pieces keep their part of the loss mask). Files are read in the order given, documents in file
// order; nothing is copied (pieces point into the mapping). Opening hashes every token and mask
// bit once (content_hash) and finds the largest id (max_token).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/data/chat.h"
#include "worker/data/corpus.h"
#include "worker/data/documents.h"
#include "worker/data/token_file.h"
#include "worker/data/tokenizer.h"

namespace ring::data {

class TokenCorpus final : public Documents {
 public:
  // Encodes every document of `text` with `threads` threads (0: hardware concurrency).
  static std::shared_ptr<const TokenCorpus> encode(const TextCorpus& text, const Tokenizer& tok,
                                                   int64_t max_doc_len, int64_t min_doc_len,
                                                   int threads = 0);
  // Each conversation becomes one document with its loss mask (source "chat"). Throws DataError
  // when no piece is left.
  static std::shared_ptr<const TokenCorpus> encode_chat(const std::vector<Conversation>& chats,
                                                        const ChatEncoder& encoder,
                                                        int64_t max_doc_len, int64_t min_doc_len,
                                                        int threads = 0);
  // Throws DataError naming the file for a missing or malformed file, and when no piece is left.
  static std::shared_ptr<const TokenCorpus> open(const std::vector<std::string>& paths,
                                                 int64_t max_doc_len, int64_t min_doc_len);

  int64_t num_docs() const override { return static_cast<int64_t>(pieces_.size()); }
  int64_t doc_len(int64_t i) const override { return pieces_[i].len; }
  void copy_tokens(int64_t doc, int64_t offset, int64_t n, int32_t* out) const override;
  bool has_mask() const override { return has_mask_; }
  void copy_mask(int64_t doc, int64_t offset, int64_t n, uint8_t* out) const override;
  int64_t total_tokens() const override { return total_tokens_; }
  uint64_t content_hash() const override { return content_hash_; }
  const char* source_name() const override { return source_; }
  int64_t max_token() const override { return max_token_; }
  std::vector<int32_t> doc(int64_t i) const;
  std::vector<uint8_t> doc_mask(int64_t i) const;  // [doc_len(i)] 1: target

  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;
  TokenCorpus() = default;

 private:
  struct Piece {
    const uint8_t* data;  // first token
    int64_t len;          // tokens
    int32_t width;        // bytes per token: 2 or 4
    const uint8_t* mask;  // loss mask bits (token_file.h layout), nullptr: all targets
    int64_t mask_bit;     // bit of the piece's first token in `mask`
  };
  void add_document(const uint8_t* data, int64_t len, int32_t width, int64_t max_doc_len,
                    int64_t min_doc_len, const uint8_t* mask = nullptr, int64_t mask_bit = 0);
  void finish();

  const char* source_ = "tokens";
  std::vector<std::shared_ptr<const TokenFile>> files_;
  std::vector<uint32_t> owned_;      // encoded text
  std::vector<uint8_t> owned_mask_;  // encoded chat: mask bits of owned_
  std::vector<Piece> pieces_;
  bool has_mask_ = false;
  int64_t total_tokens_ = 0;
  int64_t max_token_ = -1;
  uint64_t content_hash_ = 0;
};

}  // namespace ring::data
