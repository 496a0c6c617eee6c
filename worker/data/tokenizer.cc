#include "worker/data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <cctype>
#include <fstream>

#include "fmt/format.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/errors.h"

namespace ring::data {
namespace {

// A SentencePiece model (Debian's libsentencepiece).
class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : Tokenizer(path) {
    auto st = sp_.Load(path);
    if (!st.ok())
      throw DataError(fmt::format("data.tokenizer: cannot load SentencePiece model '{}': {}", path,
                                  st.ToString()));
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  const char* format() const override { return "sentencepiece"; }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
    if (!st.ok())
      throw DataError(
          fmt::format("data.tokenizer '{}': encoding failed: {}", path(), st.ToString()));
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    std::string text;
    auto st = sp_.Decode(v, &text);
    if (!st.ok())
      throw DataError(
          fmt::format("data.tokenizer '{}': decoding failed: {}", path(), st.ToString()));
    return text;
  }

  int32_t special_token_id(std::string_view content) const override {
    if (content.empty()) return -1;
    const int id = sp_.PieceToId(absl::string_view(content.data(), content.size()));
    if (id < 0 || id >= sp_.GetPieceSize() || sp_.IdToPiece(id) != content) return -1;
    // Control pieces (<s>, </s>) and user-defined ones; the API does not tell a user-defined
    // piece from a learned one, so any whole piece of that spelling is accepted.
    return sp_.IsUnknown(id) || sp_.IsByte(id) ? -1 : id;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

Tokenizer::~Tokenizer() = default;

bool is_tokenizer_json(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return true;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("data.tokenizer: cannot read '{}'", path));
  // A SentencePiece model is a protobuf: its first byte is a field tag (0x0a), never '{'.
  char c;
  while (in.get(c))
    if (!std::isspace(static_cast<unsigned char>(c))) return c == '{';
  return false;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  if (is_tokenizer_json(path)) return BpeTokenizer::load(path);
  return std::make_unique<SentencePieceTokenizer>(path);
}

std::vector<int32_t> Tokenizer::encode_document(std::string_view text) const {
  std::vector<int32_t> out;
  if (bos_id() >= 0) out.push_back(bos_id());
  encode(text, out);
  if (eos_id() >= 0) out.push_back(eos_id());
  return out;
}

}  // namespace ring::data
