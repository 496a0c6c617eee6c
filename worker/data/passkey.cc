#include "worker/data/passkey.h"

#include <random>
#include <string_view>

#include "fmt/format.h"
#include "worker/data/errors.h"
#include "worker/data/shuffle.h"

namespace ring::data {
namespace {

constexpr uint64_t kPasskeyTag = 0x706173736b6579ull;  // "passkey"

constexpr std::string_view kFiller[] = {
    "The grass is green.",          "The sky is blue.",
    "The sun is yellow.",           "Here we go.",
    "There and back again.",        "The river runs to the sea.",
    "Birds sing in the morning.",   "The road is long and quiet.",
    "Clouds drift over the hills.", "A cat sleeps by the window.",
    "The wind moves the trees.",    "Rain falls on the old roof.",
};

std::string key_line(const std::string& k) {
  return fmt::format("\nThe pass key is {}. Remember it. {} is the pass key.\n", k, k);
}
std::string question(const std::string& k) {
  return fmt::format("\nWhat is the pass key? The pass key is {}", k);
}

// Appends exactly n bytes of filler sentences (the last one cut) to out.
void append_filler(std::string& out, size_t n, std::mt19937_64& rng) {
  const size_t end = out.size() + n;
  bool first = true;
  while (out.size() < end) {
    if (!first) out.push_back(' ');
    first = false;
    std::string_view s = kFiller[uniform_below(rng, std::size(kFiller))];
    out.append(s.substr(0, std::min(s.size(), end - std::min(end, out.size()))));
  }
  out.resize(end);
}

}  // namespace

int64_t passkey_min_seq_len(int64_t digits) {
  std::string k(static_cast<size_t>(digits), '0');
  return static_cast<int64_t>(key_line(k).size() + question(k).size());
}

PasskeySample make_passkey_sample(const PasskeyOptions& o, int64_t index) {
  if (o.digits < 1 || o.digits > 32)
    throw DataError(fmt::format("data.passkey_digits ({}) must be in 1..32", o.digits));
  const int64_t need = passkey_min_seq_len(o.digits);
  if (o.seq_len < need)
    throw DataError(
        fmt::format("data.seq_len ({}) is too short for a passkey with {} digits; "
                    "need at least {}",
                    o.seq_len, o.digits, need));
  std::mt19937_64 rng(
      derive_seed(static_cast<uint64_t>(o.seed), kPasskeyTag, static_cast<uint64_t>(index)));
  PasskeySample s;
  s.answer.resize(static_cast<size_t>(o.digits));
  for (auto& ch : s.answer) ch = static_cast<char>('0' + uniform_below(rng, 10));
  const std::string key = key_line(s.answer);
  const std::string q = question(s.answer);
  const int64_t L = o.seq_len;
  const auto klen = static_cast<int64_t>(key.size());
  const auto qlen = static_cast<int64_t>(q.size());
  // The key line starts in the first half and ends before the question.
  const int64_t max_start = std::min(L / 2 - 1, L - qlen - klen);
  const int64_t start =
      static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(max_start) + 1));

  std::string text;
  text.reserve(static_cast<size_t>(L));
  append_filler(text, static_cast<size_t>(start), rng);
  text += key;
  append_filler(text, static_cast<size_t>(L - qlen - klen - start), rng);
  text += q;

  s.key_start = start + 1;  // after the newline that opens the key line
  s.answer_len = o.digits;
  s.answer_start = L - o.digits;

  Sequence& seq = s.sequence;
  seq.tokens.resize(static_cast<size_t>(L));
  seq.labels.assign(static_cast<size_t>(L), kIgnoreLabel);
  seq.positions.resize(static_cast<size_t>(L));
  seq.doc_ids.assign(static_cast<size_t>(L), 0);
  for (int64_t i = 0; i < L; ++i) {
    seq.tokens[i] = static_cast<uint8_t>(text[i]);
    seq.positions[i] = i;
  }
  const int64_t first_label = o.labels == PasskeyLabels::kAll ? 0 : s.answer_start - 1;
  for (int64_t i = first_label; i + 1 < L; ++i) seq.labels[i] = seq.tokens[i + 1];
  seq.cu_seqlens = {0, static_cast<int32_t>(L)};
  seq.segments = {SegmentSource{index, 0}};
  return s;
}

}  // namespace ring::data
