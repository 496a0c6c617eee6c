// A length curriculum for the passkey task: a few stages of short samples (cheap steps, where a
// small model first learns to find the key and copy it), then the full length.
//
//   auto stages = parse_passkey_curriculum("128:800:16,512:300:4");   // LEN:STEPS[:SEQS],...
//   PasskeyCurriculum c(options /* final seq_len, digits, seed, labels */, 1, stages);
//   for (int64_t s = 1; s <= steps; ++s) trainer.train_step(c.next_step(s));
//
// Stage i trains its `steps` optimizer steps on `seqs` samples of `seq_len` tokens each; after the
// last stage, every step is `final_seqs` samples of options.seq_len. One running sample index
// over all stages, so no sample repeats; without stages the samples are those of PasskeyLoader
// (index 0, 1, 2, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/passkey.h"
#include "worker/data/sequence.h"

namespace ring::train {

struct PasskeyStage {
  int64_t seq_len = 0;
  int64_t steps = 0;
  int64_t seqs = 0;  // samples per optimizer step; 0: the curriculum's final_seqs
};

// "128:800:16,512:300" -> {{128, 800, 16}, {512, 300, 0}}. Throws std::invalid_argument with a
// message naming the bad item (LEN 16..2^30, STEPS >= 1, SEQS 1..2^20).
std::vector<PasskeyStage> parse_passkey_curriculum(const std::string& text);

class PasskeyCurriculum {
 public:
  // Throws data::DataError when a stage (or options.seq_len) is too short for the key and
  // question, std::invalid_argument when final_seqs < 1.
  PasskeyCurriculum(const data::PasskeyOptions& options, int64_t final_seqs,
                    std::vector<PasskeyStage> stages);

  // The stage that optimizer step `step` (1-based) trains on; after the listed stages
  // {options.seq_len, 0, final_seqs}. seqs is never 0.
  PasskeyStage stage(int64_t step) const;
  // True when `step` starts a stage (step 1, or a change of length or samples per step).
  bool starts_stage(int64_t step) const;
  // The samples of optimizer step `step`; advances the sample index. Call with 1, 2, 3, ...
  std::vector<data::Sequence> next_step(int64_t step);

  int64_t samples_drawn() const { return index_; }

 private:
  data::PasskeyOptions options_;
  int64_t final_seqs_;
  std::vector<PasskeyStage> stages_;
  int64_t index_ = 0;
};

}  // namespace ring::train
