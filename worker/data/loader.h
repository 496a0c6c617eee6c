// Sequence sources: what the training loop pulls one sequence at a time from.
//
//   auto src = ring::data::make_source(spec.data);      // text or passkey, from the job spec
//   Sequence s = src->next_sequence();                   // [seq_len] arrays, see sequence.h
//   nlohmann::json saved = src->cursor();                // at a checkpoint
//   src->seek(saved.get<ring::data::Cursor>());          // on resume: the same next sequences
//
// TextLoader, pack true: documents in the epoch's shuffled order are concatenated into sequences
// of exactly seq_len tokens; a document that does not fit the rest of a sequence continues in the
// next one (a new segment there). The last sequence of an epoch continues with the first
// documents of the next epoch, so no token is dropped and every sequence is full.
// pack false: one document (or the part of one that fits) per sequence; the rest is padding
// (kPadToken, label -1, its own doc id). A document longer than seq_len (max_doc_len > seq_len)
// continues in the next sequence.
// Epoch e uses the permutation epoch_permutation(num_docs, data.seed, e) (shuffle.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/spec/spec.h"
#include "worker/data/corpus.h"
#include "worker/data/cursor.h"
#include "worker/data/documents.h"
#include "worker/data/passkey.h"
#include "worker/data/sequence.h"

namespace ring::data {

class SequenceSource {
 public:
  virtual ~SequenceSource() = default;
  // The next sequence; advances the cursor.
  virtual Sequence next_sequence() = 0;
  // Where the next sequence starts, with the identity of the data.
  virtual Cursor cursor() const = 0;
  // Continues from a saved cursor. Throws DataError when it was taken on other data or points
  // outside it; the source is unchanged then.
  virtual void seek(const Cursor& cursor) = 0;
  virtual DataIdentity identity() const = 0;
  virtual int64_t seq_len() const = 0;
  // The largest token id the source can produce (byte-level: 255).
  virtual int64_t max_token() const { return 255; }
};

// Throws DataError when `vocab` (model.vocab) is not above source.max_token(): an id outside the
// embedding table would be read out of bounds.
void check_vocab(const SequenceSource& source, int64_t vocab);

struct TextLoaderOptions {
  int64_t seq_len = 0;
  bool pack = true;
  int64_t seed = 0;
};

class TextLoader final : public SequenceSource {
 public:
  // The documents are shared (read-only) so several loaders, e.g. one per data replica, hold one
  // copy. Byte-level text (TextCorpus) or token ids (TokenCorpus): packing, masks, shuffle and
  // the cursor are the same for both.
  TextLoader(std::shared_ptr<const Documents> corpus, const TextLoaderOptions& options);

  Sequence next_sequence() override;
  Cursor cursor() const override;
  void seek(const Cursor& cursor) override;
  DataIdentity identity() const override;
  int64_t seq_len() const override { return o_.seq_len; }
  int64_t max_token() const override { return corpus_->max_token(); }

  const Documents& corpus() const { return *corpus_; }
  // For more loaders on the same corpus (one per data replica) without another copy.
  std::shared_ptr<const Documents> shared_corpus() const { return corpus_; }
  // The document order of the current epoch: [num_docs] corpus document indices.
  const std::vector<uint32_t>& epoch_order() const { return order_; }

 private:
  // Emits one segment of up to `room` tokens at seq[pos...]; advances the cursor.
  int64_t emit_segment(Sequence& seq, int64_t pos, int64_t room);
  void advance_document();

  std::shared_ptr<const Documents> corpus_;
  TextLoaderOptions o_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int64_t offset_ = 0;
  std::vector<uint32_t> order_;  // [num_docs] order of epoch_
  std::vector<uint8_t> mask_;    // [segment] scratch for the loss mask
};

class PasskeyLoader final : public SequenceSource {
 public:
  explicit PasskeyLoader(const PasskeyOptions& options);

  Sequence next_sequence() override { return next_sample().sequence; }
  // The next sample with its answer (for evaluation); advances the cursor like next_sequence().
  PasskeySample next_sample();
  Cursor cursor() const override;
  void seek(const Cursor& cursor) override;
  DataIdentity identity() const override;
  int64_t seq_len() const override { return o_.seq_len; }

 private:
  PasskeyOptions o_;
  int64_t index_ = 0;
};

// The source the spec asks for. Text: loads the corpus (max_doc_len 0 -> seq_len), encoded with
// data.tokenizer when set (token_corpus.h); tokens: memory-maps the .bin/.idx files in data.paths
// (with their loss mask when they have one); chat: reads the JSONL files in data.paths, renders
// them with data.chat_template and encodes them with data.tokenizer (bytes without), each
// conversation one document with its loss mask (chat.h).
// Throws DataError. `corpus_options` overrides the byte cap, binary threshold and encoding threads
// (lengths come from the spec).
std::unique_ptr<SequenceSource> make_source(const spec::DataSection& data,
                                            PasskeyLabels passkey_labels = PasskeyLabels::kAll,
                                            const CorpusOptions& corpus_options = {});

}  // namespace ring::data
