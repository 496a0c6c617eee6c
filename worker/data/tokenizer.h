// A SentencePiece tokenizer (Debian's libsentencepiece) for the text source (data.tokenizer).
//
//   auto tok = Tokenizer::load("tok.model");     // throws DataError naming the file
//   std::vector<int32_t> ids = tok->encode_document(text);   // [bos] pieces... [eos]
//   std::string back = tok->decode(ids);          // control ids (bos, eos) decode to nothing
//
// Document framing: when the model defines a BOS id (spm_train's default: 1) every document
// starts with it; when it defines an EOS id (default: 2) every document ends with it. A model
// trained with --bos_id=-1 / --eos_id=-1 gets no such token. Ids are those of
// SentencePieceProcessor::Encode, the same as Python's sentencepiece.encode(text).
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
  // Throws DataError: the file cannot be read or is not a SentencePiece model.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  ~Tokenizer();

  int64_t vocab_size() const;  // pieces in the model: ids are 0..vocab_size()-1
  int32_t bos_id() const;      // -1 when the model has none
  int32_t eos_id() const;      // -1 when the model has none
  const std::string& path() const { return path_; }

  // The piece ids of `text` (no BOS/EOS), appended to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // BOS (if any), the piece ids, EOS (if any).
  std::vector<int32_t> encode_document(std::string_view text) const;
  std::string decode(std::span<const int32_t> ids) const;

 private:
  Tokenizer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace ring::data
