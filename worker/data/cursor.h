// The loader cursor: where the next sequence starts, saved in checkpoints so training resumes on
// exactly the sequences it would have seen.
//
//   nlohmann::json j = loader.cursor();          // into the checkpoint manifest
//   loader.seek(j.get<ring::data::Cursor>());    // after a restart: same following sequences
//
// Text source: (epoch, index into that epoch's shuffled order, token offset within that
// document). Passkey source: index = the next sample, epoch = offset = 0. The cursor also carries
// the identity of the data it was taken on (source, seed, seq_len, pack, document count, content
// hash) so that resuming against other data is refused with a message naming what differs,
// instead of silently training on different sequences.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ring::data {

inline constexpr int kCursorVersion = 1;

struct DataIdentity {
  std::string source;  // "text" | "passkey"
  int64_t seed = 0;
  int64_t seq_len = 0;
  bool pack = true;
  int64_t num_docs = 0;       // text: documents (pieces) in the corpus; passkey: 0
  int64_t total_tokens = 0;   // text: tokens in the corpus; passkey: 0
  uint64_t content_hash = 0;  // text: TextCorpus::content_hash(); passkey: digits and label mode

  bool operator==(const DataIdentity&) const = default;
};

struct Cursor {
  int64_t epoch = 0;
  int64_t index = 0;   // text: position in the epoch order, 0 <= index < num_docs
  int64_t offset = 0;  // text: tokens of that document already consumed, 0 <= offset < doc_len
  DataIdentity identity;

  bool operator==(const Cursor&) const = default;
};

// JSON form: {"version":1,"epoch":..,"index":..,"offset":..,"data":{"source":..,"seed":..,
// "seq_len":..,"pack":..,"num_docs":..,"total_tokens":..,"content_hash":"<16 hex digits>"}}.
void to_json(nlohmann::json& j, const Cursor& c);
// Throws DataError naming the missing or malformed field (never nlohmann's own exception).
void from_json(const nlohmann::json& j, Cursor& c);

// Throws DataError when `saved` was taken on other data than `expected`, naming each field that
// differs ("data.seed: the cursor was saved with 3, this loader has 4").
void check_identity(const DataIdentity& saved, const DataIdentity& expected);

}  // namespace ring::data
