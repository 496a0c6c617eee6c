// Synthetic passkey retrieval: a long-range test that a model can only pass by attending far back.
//
// A sample is seq_len byte tokens, one document:
//   [filler ...]\nThe pass key is 12345. Remember it. 12345 is the pass key.\n[filler ...]
//   \nWhat is the pass key? The pass key is 12345
// The key line starts at a random depth in the first half of the sequence; the digits of the
// answer are the last passkey_digits tokens. Filler is plain sentences chosen at random from a
// fixed list (no digits), so the key is the only number before the question. Everything is
// deterministic from (seed, sample index).
#pragma once

#include <cstdint>
#include <string>

#include "worker/data/sequence.h"

namespace ring::data {

enum class PasskeyLabels {
  kAll,     // next-token labels on every position (language modelling on the whole sample)
  kAnswer,  // labels only at the positions that predict the answer digits, -1 elsewhere
};

struct PasskeyOptions {
  int64_t seq_len = 0;
  int64_t digits = 5;
  int64_t seed = 0;
  PasskeyLabels labels = PasskeyLabels::kAll;
};

struct PasskeySample {
  Sequence sequence;         // one segment (doc id 0), segments[0].doc = sample index
  std::string answer;        // the digits, e.g. "12345"
  int64_t answer_start = 0;  // token index of the first answer digit (= seq_len - digits)
  int64_t answer_len = 0;    // = digits
  int64_t key_start = 0;     // token index where the key line ("The pass key is") starts

  // Positions whose label is an answer digit: [answer_start - 1, answer_start + answer_len - 1).
  // An evaluator takes argmax of the logits there and compares with the answer.
  int64_t first_predicting_position() const { return answer_start - 1; }
};

// Shortest seq_len that holds the key line and the question for `digits` digits.
int64_t passkey_min_seq_len(int64_t digits);

// Sample `index` of the stream. Throws DataError when seq_len is below passkey_min_seq_len or
// digits is outside 1..32.
PasskeySample make_passkey_sample(const PasskeyOptions& options, int64_t index);

}  // namespace ring::data
