// The trainers' random numbers: splitmix64, a portable stream of 64-bit values, so that initial weights and
// the choices of training (sequences, anchors) are the same bits with every standard library (whose
// distributions differ).
#pragma once

#include <cstdint>

namespace tandem::train {

// The next value of the stream `state` advances.
inline uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1): the next value's top 53 bits.
inline double uniform_pm1(uint64_t& state) {
  return 2.0 * static_cast<double>(next_random(state) >> 11) * 0x1.0p-53 - 1.0;
}

}  // namespace tandem::train
