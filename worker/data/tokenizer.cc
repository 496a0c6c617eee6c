#include "worker/data/tokenizer.h"

#include <sentencepiece_processor.h>

#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->impl_ = std::make_unique<Impl>();
  t->path_ = path;
  auto st = t->impl_->sp.Load(path);
  if (!st.ok())
    throw DataError(fmt::format("data.tokenizer: cannot load SentencePiece model '{}': {}", path,
                                st.ToString()));
  return t;
}

int64_t Tokenizer::vocab_size() const {
  return impl_->sp.GetPieceSize();
}
int32_t Tokenizer::bos_id() const {
  return impl_->sp.bos_id();
}
int32_t Tokenizer::eos_id() const {
  return impl_->sp.eos_id();
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  auto st = impl_->sp.Encode(absl::string_view(text.data(), text.size()), &ids);
  if (!st.ok())
    throw DataError(fmt::format("data.tokenizer '{}': encoding failed: {}", path_, st.ToString()));
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::encode_document(std::string_view text) const {
  std::vector<int32_t> out;
  if (bos_id() >= 0) out.push_back(bos_id());
  encode(text, out);
  if (eos_id() >= 0) out.push_back(eos_id());
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  std::string text;
  auto st = impl_->sp.Decode(v, &text);
  if (!st.ok())
    throw DataError(fmt::format("data.tokenizer '{}': decoding failed: {}", path_, st.ToString()));
  return text;
}

}  // namespace ring::data
