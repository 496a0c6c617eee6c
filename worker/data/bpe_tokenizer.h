// A Hugging Face tokenizer.json with a BPE model: byte-level BPE (GPT-2, GPT-4, Llama 3, Qwen2
// without NFC) and BPE with byte fallback (Llama 2, Mistral). Implements Tokenizer
// (worker/data/tokenizer.h); `Tokenizer::load` picks it for a ".json" file or one that starts
// with '{'.
//
// What is read, in the order Hugging Face's tokenizers applies it:
//   added_tokens  split out of the text first (leftmost, longest match): tokens with
//                 normalized=false on the raw text, those with normalized=true after the
//                 normaliser; lstrip/rstrip take the neighbouring Unicode whitespace with them.
//   normalizer    null, Prepend, Replace (a String pattern), or a Sequence of them.
//   pre_tokenizer null, Split (a Regex or String pattern, behavior Isolated or Removed, invert
//                 false), ByteLevel (add_prefix_space, use_regex: GPT-2's pattern), or a Sequence
//                 of them with ByteLevel last. Regexes are Oniguruma syntax as the Rust crate
//                 reads them, run with PCRE2 (UTF, UCP, JIT); \s \S \d \w are rewritten to the
//                 Unicode sets Oniguruma gives them (\s: White_Space).
//   model         type BPE: vocab, merges ("a b" strings or ["a", "b"] pairs; rank = position),
//                 byte_fallback (<0xXX> tokens for characters not in vocab), unk_token, fuse_unk,
//                 ignore_merges.
//   decoder       ByteLevel, or Replace (String) / ByteFallback / Fuse / Strip, alone or in a
//                 Sequence; null joins the tokens with spaces.
//   post_processor TemplateProcessing / ByteLevel / Sequence: only read for BOS/EOS (below).
// Anything else (another normaliser such as NFC, another model type such as WordPiece or
// Unigram, an unknown pre-tokenizer or decoder, a Split with invert or another behavior, BPE
// dropout or word suffixes, a single_word added token) is refused: DataError naming the file,
// the JSON field path and the value.
//
// BOS/EOS (document framing): tokenizer_config.json in the same directory wins when it names
// bos_token / eos_token (a string, or an object with "content"); otherwise the post_processor's
// TemplateProcessing "single" template gives BOS when it starts with a SpecialToken and EOS when
// it ends with one; otherwise none. add_bos_token / add_eos_token are not read: a document is
// framed with every one of the two that is defined, as for SentencePiece.
//
// Text that is not valid UTF-8 is encoded as if every maximal invalid subsequence were U+FFFD
// (the WHATWG decoder's rule, which node's TextDecoder follows; the Rust crate accepts only
// strings). decode returns the bytes the tokens stand for: byte-level and <0xXX> bytes are
// passed through as they are (no U+FFFD for an incomplete sequence, so pieces can be joined).
//
// Speed: BPE merges run per pre-token on a linked list with a priority queue of (rank, position);
// pre-tokens of up to 255 bytes are cached per thread (bounded, cleared when full).
#pragma once

#include <memory>
#include <string>

#include "worker/data/tokenizer.h"

namespace ring::data {

class BpeTokenizer {
 public:
  // Reads `path` (tokenizer.json) and, when present, tokenizer_config.json beside it. Throws
  // DataError naming the file and field.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
};

}  // namespace ring::data
