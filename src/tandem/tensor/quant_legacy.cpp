// Legacy 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): scalar reference dequantization and the
// reference quantizers used to write model files.
//
// Every expression keeps the reference's formula and operation order, so the floats are bit-identical to the
// reference's portable C path. Quantization codes are computed with the unrounded f32 scale; dequantization
// uses the f16 scale stored in the block.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

// Contracting a*b+c into a fused multiply-add (allowed by default in C++ when the target has FMA, e.g. with
// -march=native) would round differently from the reference formula; keep every product and sum separate.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tandem::quant_impl {

namespace {

// Element j of a 32-element block with 4-bit codes: j < 16 in the low nibble of qs[j], j >= 16 in the high
// nibble of qs[j - 16].
inline int nibble(const uint8_t* qs, int j) {
  return j < kQK / 2 ? qs[j] & 0x0F : qs[j - kQK / 2] >> 4;
}

// Fifth bit of element j (Q5_0/Q5_1): bit j of the little-endian 32-bit word qh.
inline int high_bit(const uint8_t* qh, int j) {
  return (qh[j / 8] >> (j % 8)) & 1;
}

// Packs 32 codes (0..15, or the low 4 bits of 0..31) into the nibble layout above.
inline void pack_nibbles(const uint8_t* codes, uint8_t* qs) {
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((codes[j] & 0x0F) | ((codes[j + kQK / 2] & 0x0F) << 4));
  }
}

// Packs the fifth bit of 32 codes (0..31) into qh, element j at bit j.
inline void pack_high_bits(const uint8_t* codes, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < kQK; ++j) bits |= static_cast<uint32_t>((codes[j] >> 4) & 1) << j;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(bits >> (8 * k));
}

// A code computed in float, truncated toward zero and clamped to [lo, hi]. For the finite arguments the
// quantizers produce this is the reference's plain conversion; NaN (from non-finite input) gives lo instead
// of undefined behaviour.
inline int to_code(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// The signed value of largest magnitude (the first one on ties); 0 for an all-zero block.
inline float signed_absmax(const float* x) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

inline void min_max(const float* x, float* min, float* max) {
  *min = std::numeric_limits<float>::max();
  *max = -std::numeric_limits<float>::max();
  for (int j = 0; j < kQK; ++j) {
    if (x[j] < *min) *min = x[j];
    if (x[j] > *max) *max = x[j];
  }
}

}  // namespace

// ---- Q4_0: value = (q - 8) * d, q in 0..15.

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(nibble(x[i].qs, j) - 8) * d;
  }
}

// d = max / -8 where max is the signed value of largest magnitude, so that value maps to code 0 exactly and
// the other side of zero gets the finer range up to +7.
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    uint8_t codes[kQK];
    for (int j = 0; j < kQK; ++j) {
      // Truncating v + 8.5 rounds v + 8 half up (the argument is never negative).
      codes[j] = static_cast<uint8_t>(to_code(x[j] * id + 8.5f, 0, 15));
    }
    pack_nibbles(codes, y[i].qs);
  }
}

// ---- Q4_1: value = q * d + m, q in 0..15.

void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(nibble(x[i].qs, j)) * d + m;
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    uint8_t codes[kQK];
    for (int j = 0; j < kQK; ++j) {
      codes[j] = static_cast<uint8_t>(to_code((x[j] - min) * id + 0.5f, 0, 15));
    }
    pack_nibbles(codes, y[i].qs);
  }
}

// ---- Q5_0: value = (q - 16) * d, q in 0..31 (low 4 bits in qs, fifth bit in qh).

void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(x[i].qs, j) | (high_bit(x[i].qh, j) << 4);
      y[j] = static_cast<float>(q - 16) * d;
    }
  }
}

void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    uint8_t codes[kQK];
    for (int j = 0; j < kQK; ++j) {
      codes[j] = static_cast<uint8_t>(to_code(x[j] * id + 16.5f, 0, 31));
    }
    pack_nibbles(codes, y[i].qs);
    pack_high_bits(codes, y[i].qh);
  }
}

// ---- Q5_1: value = q * d + m, q in 0..31.

void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (int j = 0; j < kQK; ++j) {
      const int q = nibble(x[i].qs, j) | (high_bit(x[i].qh, j) << 4);
      y[j] = static_cast<float>(q) * d + m;
    }
  }
}

void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min, max;
    min_max(x, &min, &max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    uint8_t codes[kQK];
    // The reference does not clamp here: (x - min) * id never exceeds 31 by the 0.5 it would take to
    // reach 32.
    for (int j = 0; j < kQK; ++j) codes[j] = static_cast<uint8_t>(to_code((x[j] - min) * id + 0.5f, 0, 31));
    pack_nibbles(codes, y[i].qs);
    pack_high_bits(codes, y[i].qh);
  }
}

// ---- Q8_0: value = q * d, q in -127..127.

void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// d = amax / 127; codes round half away from zero.
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(to_code(std::round(x[j] * id), -127, 127));
  }
}

}  // namespace tandem::quant_impl
