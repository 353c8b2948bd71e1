// Counter-based randomness for sampling: every random number is a pure function of its key
// (seed, sequence, position, draw index). A seeded run therefore repeats exactly, and a token's randomness
// does not depend on which other sequences shared its batch or in which order they were processed. No state,
// so every function here is safe to call from any thread.
#pragma once

#include <cstdint>

namespace tandem::sampling {

// SplitMix64's output function: a bijection on 64-bit words with full avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 64 random bits for a key. Each key part is folded in by xor followed by a full mix, so for a fixed prefix
// the map from the next part to the state is injective: keys that differ in one part never collide by
// construction.
constexpr uint64_t random_bits(uint64_t seed, uint64_t sequence, uint64_t position, uint32_t draw) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ sequence);
  h = mix64(h ^ position);
  return mix64(h ^ draw);
}

// Uniform double in [0, 1) with 53 random bits: k / 2^53 for k in [0, 2^53).
constexpr double uniform(uint64_t seed, uint64_t sequence, uint64_t position, uint32_t draw) {
  return static_cast<double>(random_bits(seed, sequence, position, draw) >> 11) * 0x1.0p-53;
}

}  // namespace tandem::sampling
