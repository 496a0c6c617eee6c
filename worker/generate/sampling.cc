#include "worker/generate/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "worker/data/shuffle.h"
#include "worker/generate/kv_cache.h"

namespace ring::gen {
namespace {

using data::mix64;

}  // namespace

void SamplingParams::check() const {
  if (!(temperature >= 0.0) || !std::isfinite(temperature))
    throw GenerateError(fmt::format("temperature {} must be a finite number >= 0", temperature));
  if (!(top_p > 0.0 && top_p <= 1.0))
    throw GenerateError(fmt::format("top_p {} must be in (0, 1]", top_p));
}

Sampler::Sampler(const SamplingParams& p, uint64_t stream)
    : p_(p), rng_(mix64(p.seed ^ mix64(stream + 1))) {
  p_.check();
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (p_.temperature == 0.0) {
    int64_t best = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  std::vector<double> prob(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    prob[i] = std::exp((static_cast<double>(logits[i]) - mx) / p_.temperature);
    sum += prob[i];
  }
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
  // The nucleus: the most likely tokens until their mass reaches top_p (at least one).
  size_t keep = 0;
  double mass = 0;
  while (keep < order.size()) {
    mass += prob[order[keep]] / sum;
    ++keep;
    if (mass >= p_.top_p) break;
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += prob[order[i]];
  const double u = (static_cast<double>(rng_() >> 11) + 0.5) * (1.0 / 9007199254740992.0) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += prob[order[i]];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

}  // namespace ring::gen
