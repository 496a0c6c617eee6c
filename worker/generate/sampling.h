// Next-token sampling from logits: greedy (temperature 0), temperature, top-p (nucleus), seeded.
// A Sampler is one deterministic stream: the same seed, stream and logits give the same tokens on
// every platform (own uniform from mt19937_64's top 53 bits; softmax in fp64; ties in the sort
// broken by lower id).
#pragma once

#include <cstdint>
#include <random>

namespace ring::gen {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax, lowest id on ties)
  double top_p = 1.0;        // (0, 1]: keep the smallest most-likely set with mass >= top_p
  uint64_t seed = 0;
  // Throws GenerateError naming the field.
  void check() const;
};

class Sampler {
 public:
  // stream: e.g. the prompt's index, so that each sequence of a batch has its own stream.
  Sampler(const SamplingParams& p, uint64_t stream);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace ring::gen
