// Scalar conversions between f32 and the 16-bit float formats stored in GGUF files (IEEE half, bfloat16).
// Round-to-nearest-even, NaN and infinity preserved, subnormals handled. These are the reference conversions;
// kernels may use hardware instructions that give identical results.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem {

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) {
    // Infinity, or NaN with its payload kept and the quiet bit set (as F16C and the reference convert it).
    return bits_to_f32(sign | 0x7F800000 | (mant << 13) | (mant != 0 ? 0x00400000u : 0u));
  }
  return bits_to_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_fp16(float f) {
  uint32_t x = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7FFFFFFF;
  if (x >= 0x7F800000) return static_cast<uint16_t>(sign | (x > 0x7F800000 ? 0x7E00 : 0x7C00));
  if (x >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to infinity
  if (x < 0x38800000) {
    // Result is subnormal (or zero) in half precision: round mant * 2^-24 to an integer, nearest even.
    if (x < 0x33000000) return sign;  // below half the smallest subnormal
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24 + ...
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, nearest even (a carry may bump the
  // exponent).
  uint32_t h = ((x >> 13) - (112u << 10));
  const uint32_t rem = x & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_f32(uint16_t h) {
  return bits_to_f32(static_cast<uint32_t>(h) << 16);
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_to_bits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace tandem
