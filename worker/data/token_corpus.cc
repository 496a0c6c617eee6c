#include "worker/data/token_corpus.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "fmt/format.h"
#include "worker/data/errors.h"

namespace ring::data {

namespace {

// Runs make(i) for i < n on `threads` threads (0: hardware concurrency); results in order.
// Thread t makes items t, t + threads, ...; the first exception is rethrown.
template <class T, class F>
std::vector<T> parallel_map(int64_t n, int threads, F make) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(n, 1)));
  std::vector<T> out(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto work = [&](int t) {
    try {
      for (int64_t i = t; i < n; i += threads) out[i] = make(i);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

bool mask_bit(const uint8_t* bits, int64_t i) { return ((bits[i >> 3] >> (i & 7)) & 1) != 0; }

}  // namespace

void TokenCorpus::add_document(const uint8_t* data, int64_t len, int32_t width, int64_t max_doc_len,
                               int64_t min_doc_len, const uint8_t* mask, int64_t mask_bit0) {
  const int64_t piece = max_doc_len > 0 ? max_doc_len : std::max<int64_t>(len, 1);
  for (int64_t s = 0; s < len; s += piece) {
    const int64_t e = std::min(len, s + piece);
    if (e - s < min_doc_len) continue;
    pieces_.push_back(Piece{data + s * width, e - s, width, mask, mask_bit0 + s});
  }
}

void TokenCorpus::copy_mask(int64_t doc, int64_t offset, int64_t n, uint8_t* out) const {
  const Piece& p = pieces_[doc];
  if (p.mask == nullptr) {
    std::fill(out, out + n, uint8_t{1});
    return;
  }
  for (int64_t k = 0; k < n; ++k) out[k] = mask_bit(p.mask, p.mask_bit + offset + k) ? 1 : 0;
}

std::vector<uint8_t> TokenCorpus::doc_mask(int64_t i) const {
  std::vector<uint8_t> out(static_cast<size_t>(doc_len(i)));
  copy_mask(i, 0, doc_len(i), out.data());
  return out;
}

void TokenCorpus::finish() {
  // Hashes the ids widened to uint32, so the same documents hash the same in either width.
  uint64_t h = 0x746f'6b65'6e73'0001ull;
  int64_t total = 0;
  uint32_t mx = 0;
  bool any = false;
  std::vector<uint32_t> chunk(4096);
  for (const Piece& p : pieces_) {
    for (int64_t s = 0; s < p.len; s += 4096) {
      const int64_t n = std::min<int64_t>(4096, p.len - s);
      if (p.width == 4) {
        std::memcpy(chunk.data(), p.data + 4 * s, static_cast<size_t>(4 * n));
      } else {
        for (int64_t k = 0; k < n; ++k) {
          uint16_t v;
          std::memcpy(&v, p.data + 2 * (s + k), 2);
          chunk[k] = v;
        }
      }
      for (int64_t k = 0; k < n; ++k) mx = std::max(mx, chunk[k]);
      h = hash_bytes(h, reinterpret_cast<const uint8_t*>(chunk.data()), static_cast<size_t>(4 * n));
      if (has_mask_) {  // the mask as 0/1 bytes; a corpus without one hashes as before
        uint8_t m[4096];
        copy_mask(&p - pieces_.data(), s, n, m);
        h = hash_bytes(h, m, static_cast<size_t>(n));
      }
    }
    const uint64_t len = static_cast<uint64_t>(p.len);
    h = hash_bytes(h, reinterpret_cast<const uint8_t*>(&len), 8);
    total += p.len;
    any = any || p.len > 0;
  }
  total_tokens_ = total;
  max_token_ = any ? static_cast<int64_t>(mx) : -1;
  content_hash_ = h;
}

void TokenCorpus::copy_tokens(int64_t doc, int64_t offset, int64_t n, int32_t* out) const {
  const Piece& p = pieces_[doc];
  const uint8_t* src = p.data + offset * p.width;
  if (p.width == 2) {
    for (int64_t k = 0; k < n; ++k) {
      uint16_t v;
      std::memcpy(&v, src + 2 * k, 2);
      out[k] = v;
    }
  } else {
    for (int64_t k = 0; k < n; ++k) {
      uint32_t v;
      std::memcpy(&v, src + 4 * k, 4);
      out[k] = static_cast<int32_t>(v);
    }
  }
}

std::vector<int32_t> TokenCorpus::doc(int64_t i) const {
  std::vector<int32_t> out(static_cast<size_t>(doc_len(i)));
  copy_tokens(i, 0, doc_len(i), out.data());
  return out;
}

std::shared_ptr<const TokenCorpus> TokenCorpus::encode(const TextCorpus& text, const Tokenizer& tok,
                                                       int64_t max_doc_len, int64_t min_doc_len,
                                                       int threads) {
  const int64_t n = text.num_docs();
  std::vector<std::vector<int32_t>> docs =
      parallel_map<std::vector<int32_t>>(n, threads, [&](int64_t i) {
        auto d = text.doc(i);
        return tok.encode_document(
            std::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
      });
  auto c = std::make_shared<TokenCorpus>();
  c->source_ = "text";
  size_t total = 0;
  for (const auto& d : docs) total += d.size();
  c->owned_.reserve(total);
  std::vector<std::pair<size_t, size_t>> spans;  // (begin, len) in owned_, in document order
  spans.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto& d = docs[i];
    spans.emplace_back(c->owned_.size(), d.size());
    c->owned_.insert(c->owned_.end(), d.begin(), d.end());
    std::vector<int32_t>().swap(d);
  }
  const auto* base = reinterpret_cast<const uint8_t*>(c->owned_.data());
  for (auto [b, len] : spans)
    c->add_document(base + 4 * b, static_cast<int64_t>(len), 4, max_doc_len, min_doc_len);
  if (c->pieces_.empty())
    throw DataError(fmt::format(
        "data.tokenizer: after encoding with '{}' no document is at least min_doc_len ({}) "
        "tokens long",
        tok.path(), min_doc_len));
  c->finish();
  return c;
}

std::shared_ptr<const TokenCorpus> TokenCorpus::encode_chat(const std::vector<Conversation>& chats,
                                                            const ChatEncoder& encoder,
                                                            int64_t max_doc_len,
                                                            int64_t min_doc_len, int threads) {
  const int64_t n = static_cast<int64_t>(chats.size());
  std::vector<EncodedChat> enc =
      parallel_map<EncodedChat>(n, threads, [&](int64_t i) { return encoder.encode(chats[i]); });
  auto c = std::make_shared<TokenCorpus>();
  c->source_ = "chat";
  c->has_mask_ = true;
  size_t total = 0;
  for (const auto& e : enc) total += e.ids.size();
  c->owned_.reserve(total);
  c->owned_mask_.assign((total + 7) / 8, 0);
  std::vector<std::pair<size_t, size_t>> spans;  // (begin, len) in owned_, in document order
  for (auto& e : enc) {
    const size_t b = c->owned_.size();
    spans.emplace_back(b, e.ids.size());
    c->owned_.insert(c->owned_.end(), e.ids.begin(), e.ids.end());
    for (size_t k = 0; k < e.mask.size(); ++k)
      if (e.mask[k] != 0) c->owned_mask_[(b + k) >> 3] |= static_cast<uint8_t>(1u << ((b + k) & 7));
    std::vector<int32_t>().swap(e.ids);
    std::vector<uint8_t>().swap(e.mask);
  }
  const auto* base = reinterpret_cast<const uint8_t*>(c->owned_.data());
  for (auto [b, len] : spans)
    c->add_document(base + 4 * b, static_cast<int64_t>(len), 4, max_doc_len, min_doc_len,
                    c->owned_mask_.data(), static_cast<int64_t>(b));
  if (c->pieces_.empty())
    throw DataError(fmt::format(
        "data.paths: after rendering and encoding no conversation is at least min_doc_len ({}) "
        "tokens long",
        min_doc_len));
  c->finish();
  return c;
}

std::shared_ptr<const TokenCorpus> TokenCorpus::open(const std::vector<std::string>& paths,
                                                     int64_t max_doc_len, int64_t min_doc_len) {
  if (paths.empty()) throw DataError("data.paths: no token dataset given for the tokens source");
  auto c = std::make_shared<TokenCorpus>();
  c->source_ = "tokens";
  for (const auto& path : paths) {
    auto f = TokenFile::open(path);
    c->has_mask_ = c->has_mask_ || f->mask() != nullptr;
    for (int64_t i = 0; i < f->num_docs(); ++i)
      c->add_document(f->data() + f->doc_begin(i) * f->width(), f->doc_len(i), f->width(),
                      max_doc_len, min_doc_len, f->mask(), f->doc_begin(i));
    c->files_.push_back(std::move(f));
  }
  if (c->pieces_.empty())
    throw DataError(fmt::format(
        "data.paths: the token datasets hold no document of at least min_doc_len ({}) tokens",
        min_doc_len));
  c->finish();
  return c;
}

}  // namespace ring::data
