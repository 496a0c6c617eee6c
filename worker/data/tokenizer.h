// The tokenizer of the text source (data.tokenizer), `ringctl tokenize` and `ringctl generate`:
// one interface, two formats.
//
//   auto tok = Tokenizer::load("tok.model");      // or ".../tokenizer.json"; throws DataError
//   std::vector<int32_t> ids = tok->encode_document(text);   // [bos] pieces... [eos]
//   std::string back = tok->decode(ids);
//
// Format detection (load): a file whose name ends in ".json", or whose first non-blank byte is
// '{', is a Hugging Face tokenizer.json (worker/data/bpe_tokenizer.h: byte-level BPE or BPE with
// byte fallback); anything else is a SentencePiece model (Debian's libsentencepiece; ids are
// those of SentencePieceProcessor::Encode, the same as Python's sentencepiece.encode(text)).
//
// Document framing: when the tokenizer defines a BOS id every document starts with it; when it
// defines an EOS id every document ends with it. A SentencePiece model trained with
// --bos_id=-1 / --eos_id=-1 gets no such token; for tokenizer.json see bpe_tokenizer.h.
//
// Thread safety: every const method may be called from many threads at once (ringctl tokenize
// and TokenCorpus::encode do).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ring::data {

class Tokenizer {
 public:
  // Throws DataError: the file cannot be read, or is neither a SentencePiece model nor a
  // supported tokenizer.json (the message names the file and, for JSON, the field).
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  virtual ~Tokenizer();

  virtual int64_t vocab_size() const = 0;  // ids are 0..vocab_size()-1
  virtual int32_t bos_id() const = 0;      // -1 when there is none
  virtual int32_t eos_id() const = 0;      // -1 when there is none
  // "sentencepiece" or "tokenizer.json": for messages.
  virtual const char* format() const = 0;
  const std::string& path() const { return path_; }

  // The piece ids of `text` (no BOS/EOS), appended to `out`.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // BOS (if any), the piece ids, EOS (if any).
  std::vector<int32_t> encode_document(std::string_view text) const;
  // The bytes of `ids`; control ids (SentencePiece's bos, eos) decode to nothing.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The id of the added / special token spelled `content` (tokenizer.json: added_tokens;
  // SentencePiece: a control or user-defined piece), -1 when there is none. Chat templates look
  // their special tokens up here (worker/data/chat.h).
  virtual int32_t special_token_id(std::string_view content) const = 0;

 protected:
  explicit Tokenizer(std::string path) : path_(std::move(path)) {}

 private:
  std::string path_;
};

// True when `path` is read as a tokenizer.json (the rule above). Throws DataError when the file
// cannot be read.
bool is_tokenizer_json(const std::string& path);

}  // namespace ring::data
