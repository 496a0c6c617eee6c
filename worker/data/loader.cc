#include "worker/data/loader.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "fmt/format.h"
#include "worker/data/errors.h"
#include "worker/data/shuffle.h"
#include "worker/data/token_corpus.h"

namespace ring::data {
namespace {

void check_seq_len(int64_t seq_len) {
  if (seq_len < 2 || seq_len > std::numeric_limits<int32_t>::max())
    throw DataError(fmt::format("data.seq_len ({}) must be in 2..2^31-1", seq_len));
}

Sequence empty_sequence(int64_t seq_len) {
  Sequence s;
  const auto n = static_cast<size_t>(seq_len);
  s.tokens.resize(n);
  s.labels.resize(n);
  s.positions.resize(n);
  s.doc_ids.resize(n);
  for (int64_t i = 0; i < seq_len; ++i) s.positions[i] = i;
  s.cu_seqlens.push_back(0);
  return s;
}

}  // namespace

// ---- TextLoader ------------------------------------------------------------------------------

TextLoader::TextLoader(std::shared_ptr<const Documents> corpus, const TextLoaderOptions& o)
    : corpus_(std::move(corpus)), o_(o) {
  if (!corpus_ || corpus_->num_docs() == 0) throw DataError("text loader: the corpus is empty");
  check_seq_len(o_.seq_len);
  order_ = epoch_permutation(corpus_->num_docs(), static_cast<uint64_t>(o_.seed), 0);
}

DataIdentity TextLoader::identity() const {
  return DataIdentity{.source = corpus_->source_name(),
                      .seed = o_.seed,
                      .seq_len = o_.seq_len,
                      .pack = o_.pack,
                      .num_docs = corpus_->num_docs(),
                      .total_tokens = corpus_->total_tokens(),
                      .content_hash = corpus_->content_hash()};
}

Cursor TextLoader::cursor() const {
  return Cursor{.epoch = epoch_, .index = index_, .offset = offset_, .identity = identity()};
}

void TextLoader::seek(const Cursor& c) {
  check_identity(c.identity, identity());
  const int64_t n = corpus_->num_docs();
  if (c.epoch < 0 || c.index < 0 || c.index >= n)
    throw DataError(
        fmt::format("loader cursor: epoch {} index {} is outside the corpus ({} "
                    "documents)",
                    c.epoch, c.index, n));
  std::vector<uint32_t> order =
      c.epoch == epoch_ ? order_ : epoch_permutation(n, static_cast<uint64_t>(o_.seed), c.epoch);
  const int64_t len = corpus_->doc_len(order[c.index]);
  if (c.offset < 0 || c.offset >= len)
    throw DataError(
        fmt::format("loader cursor: offset {} is outside document {} of epoch {} "
                    "(index {}, {} tokens)",
                    c.offset, order[c.index], c.epoch, c.index, len));
  order_ = std::move(order);
  epoch_ = c.epoch;
  index_ = c.index;
  offset_ = c.offset;
}

void TextLoader::advance_document() {
  offset_ = 0;
  if (++index_ == corpus_->num_docs()) {
    index_ = 0;
    ++epoch_;
    order_ = epoch_permutation(corpus_->num_docs(), static_cast<uint64_t>(o_.seed), epoch_);
  }
}

int64_t TextLoader::emit_segment(Sequence& seq, int64_t pos, int64_t room) {
  const uint32_t doc = order_[index_];
  const int64_t len = corpus_->doc_len(doc);
  const int64_t take = std::min(len - offset_, room);
  const auto seg = static_cast<int32_t>(seq.segments.size());
  corpus_->copy_tokens(doc, offset_, take, seq.tokens.data() + pos);
  for (int64_t k = 0; k < take; ++k) seq.doc_ids[pos + k] = seg;
  // Shifted labels within the segment; the last token has no next token here. With a loss mask
  // (chat), the label predicting a token that is not a target is ignored.
  for (int64_t k = 0; k + 1 < take; ++k) seq.labels[pos + k] = seq.tokens[pos + k + 1];
  seq.labels[pos + take - 1] = kIgnoreLabel;
  if (corpus_->has_mask()) {
    mask_.resize(static_cast<size_t>(take));
    corpus_->copy_mask(doc, offset_, take, mask_.data());
    for (int64_t k = 0; k + 1 < take; ++k)
      if (mask_[k + 1] == 0) seq.labels[pos + k] = kIgnoreLabel;
  }
  seq.segments.push_back(SegmentSource{doc, offset_});
  seq.cu_seqlens.push_back(static_cast<int32_t>(pos + take));
  offset_ += take;
  if (offset_ == len) advance_document();
  return take;
}

Sequence TextLoader::next_sequence() {
  const int64_t L = o_.seq_len;
  Sequence seq = empty_sequence(L);
  int64_t pos = 0;
  if (o_.pack) {
    while (pos < L) pos += emit_segment(seq, pos, L - pos);
  } else {
    pos = emit_segment(seq, 0, L);
    if (pos < L) {  // padding: its own segment, never a label
      const auto seg = static_cast<int32_t>(seq.segments.size());
      std::fill(seq.tokens.begin() + pos, seq.tokens.end(), kPadToken);
      std::fill(seq.labels.begin() + pos, seq.labels.end(), kIgnoreLabel);
      std::fill(seq.doc_ids.begin() + pos, seq.doc_ids.end(), seg);
      seq.segments.push_back(SegmentSource{-1, 0});
      seq.cu_seqlens.push_back(static_cast<int32_t>(L));
    }
  }
  return seq;
}

// ---- PasskeyLoader ---------------------------------------------------------------------------

namespace {
constexpr uint64_t kPasskeyIdentity = 0x706b000000000000ull;
}

PasskeyLoader::PasskeyLoader(const PasskeyOptions& o) : o_(o) {
  check_seq_len(o_.seq_len);
  (void)make_passkey_sample(o_, 0);  // checks seq_len against digits now, not at the first step
}

PasskeySample PasskeyLoader::next_sample() {
  return make_passkey_sample(o_, index_++);
}

DataIdentity PasskeyLoader::identity() const {
  return DataIdentity{.source = "passkey",
                      .seed = o_.seed,
                      .seq_len = o_.seq_len,
                      .pack = false,
                      .num_docs = 0,
                      .total_tokens = 0,
                      .content_hash = kPasskeyIdentity | static_cast<uint64_t>(o_.digits) << 8 |
                                      static_cast<uint64_t>(o_.labels)};
}

Cursor PasskeyLoader::cursor() const {
  return Cursor{.epoch = 0, .index = index_, .offset = 0, .identity = identity()};
}

void PasskeyLoader::seek(const Cursor& c) {
  check_identity(c.identity, identity());
  if (c.epoch != 0 || c.offset != 0 || c.index < 0)
    throw DataError(
        fmt::format("loader cursor: a passkey cursor has epoch 0, offset 0 and a "
                    "sample index >= 0; got epoch {}, index {}, offset {}",
                    c.epoch, c.index, c.offset));
  index_ = c.index;
}

void check_vocab(const SequenceSource& source, int64_t vocab) {
  if (source.max_token() >= vocab)
    throw DataError(fmt::format(
        "model.vocab ({}) is not above the largest token id in the data ({}, data.source {}): "
        "raise model.vocab or use data made with a smaller tokenizer",
        vocab, source.max_token(), source.identity().source));
}

// ---- make_source -----------------------------------------------------------------------------

std::unique_ptr<SequenceSource> make_source(const spec::DataSection& d, PasskeyLabels labels,
                                            const CorpusOptions& corpus_options) {
  if (d.source == spec::DataSource::kPasskey) {
    return std::make_unique<PasskeyLoader>(PasskeyOptions{
        .seq_len = d.seq_len, .digits = d.passkey_digits, .seed = d.seed, .labels = labels});
  }
  check_seq_len(d.seq_len);
  CorpusOptions co = corpus_options;
  co.max_doc_len = d.max_doc_len == 0 ? d.seq_len : d.max_doc_len;
  co.min_doc_len = d.min_doc_len;
  std::shared_ptr<const Documents> corpus;
  if (d.source == spec::DataSource::kTokens) {
    corpus = TokenCorpus::open(d.paths, co.max_doc_len, co.min_doc_len);
  } else if (d.source == spec::DataSource::kChat) {
    std::unique_ptr<Tokenizer> tok;
    if (!d.tokenizer.empty()) tok = Tokenizer::load(d.tokenizer);
    const ChatEncoder encoder(chat_template(d.chat_template), tok.get());
    corpus = TokenCorpus::encode_chat(read_chat_paths(d.paths), encoder, co.max_doc_len,
                                      co.min_doc_len, co.encode_threads);
  } else if (!d.tokenizer.empty()) {
    auto tok = Tokenizer::load(d.tokenizer);
    // Whole files first: lengths and the min/max cut apply to ids, not bytes.
    CorpusOptions whole = co;
    whole.max_doc_len = 0;
    whole.min_doc_len = 1;
    TextCorpus text = TextCorpus::load(d.paths, whole);
    corpus = TokenCorpus::encode(text, *tok, co.max_doc_len, co.min_doc_len, co.encode_threads);
  } else {
    corpus = std::make_shared<const TextCorpus>(TextCorpus::load(d.paths, co));
  }
  return std::make_unique<TextLoader>(
      std::move(corpus), TextLoaderOptions{.seq_len = d.seq_len, .pack = d.pack, .seed = d.seed});
}

}  // namespace ring::data
