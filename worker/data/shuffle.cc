#include "worker/data/shuffle.h"

#include <numeric>
#include <utility>

#include "worker/data/errors.h"

namespace ring::data {

namespace {
constexpr uint64_t kShuffleTag = 0x73687566666c65ull;  // "shuffle"
}

uint64_t derive_seed(uint64_t seed, uint64_t tag, uint64_t stream) {
  return mix64(mix64(mix64(seed) ^ tag) ^ stream);
}

uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  // Values below 2^64 mod n would make small results more likely: reject them.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

std::vector<uint32_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  if (n < 0 || n > int64_t{0xffffffff})
    throw DataError("epoch_permutation: document count out of range (0 .. 2^32-1)");
  std::vector<uint32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), uint32_t{0});
  std::mt19937_64 rng(derive_seed(seed, kShuffleTag, static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i + 1)));
    std::swap(order[i], order[j]);
  }
  return order;
}

}  // namespace ring::data
