// Deterministic shuffling: the same seed gives the same document order with every compiler and
// standard library.
//
// std::shuffle and std::uniform_int_distribution are not specified exactly by the standard (their
// results differ between libstdc++ and libc++), so neither is used: the generator is
// std::mt19937_64 (its output sequence is fixed by the standard), bounded integers use rejection
// sampling and the shuffle is a plain Fisher-Yates written here.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace ring::data {

// SplitMix64 finaliser: a bijection on 64 bits with good avalanche; used to derive seeds (the data
// order, the model's initial weights, sampling, the KV cache's page ids).
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A seed for stream `stream` (e.g. epoch, sample index) of a user seed; distinct tags keep the
// document shuffle and the passkey generator independent for the same data.seed.
uint64_t derive_seed(uint64_t seed, uint64_t tag, uint64_t stream);

// Uniform integer in [0, n), n >= 1, unbiased (rejection sampling).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n);

// The document order of one epoch: a permutation of 0..n-1 from (seed, epoch). n < 2^32.
std::vector<uint32_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace ring::data
