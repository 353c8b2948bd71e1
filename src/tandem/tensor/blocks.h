// Block structs of the GGUF quantized formats (byte layouts are the file format's; sizes are asserted).
#pragma once

#include <cstdint>

namespace tandem {

constexpr int kQK = 32;    // elements per legacy block
constexpr int kQKK = 256;  // elements per K-quant super-block
constexpr int kKScaleBytes = 12;

struct BlockQ4_0 {
  uint16_t d;           // f16 scale
  uint8_t qs[kQK / 2];  // low nibbles: elements 0..15, high nibbles: 16..31
};
struct BlockQ4_1 {
  uint16_t d, m;  // f16 scale and minimum
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // 5th bits, element j at bit j
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];  // 4-bit scale (low) and 4-bit min (high) per 16 elements
  uint8_t qs[kQKK / 4];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[kKScaleBytes];  // 16 6-bit scales
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleBytes];  // 8 6-bit scales and 8 6-bit mins
  uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
struct BlockQ8_K {  // activation blocks for K-quant dot products
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};

// Q4_K/Q5_K: eight 6-bit scales and eight 6-bit mins in 12 bytes. Sub-blocks 0..3 keep scale and min in the
// low 6 bits of bytes j and j + 4; sub-blocks 4..7 keep their low 4 bits in the nibbles of byte j + 4 (scale
// low, min high) and their top 2 bits in the top 2 bits of bytes j - 4 (scale) and j (min).
struct ScaleMin {
  uint8_t scale;
  uint8_t min;
};
inline ScaleMin k4_scale_min(const uint8_t* q, int j) {
  if (j < 4) return {static_cast<uint8_t>(q[j] & 63), static_cast<uint8_t>(q[j + 4] & 63)};
  return {static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)),
          static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4))};
}
// Stores scale ls and min lm (0..63) into zeroed scale bytes.
inline void set_k4_scale_min(uint8_t* q, int j, uint8_t ls, uint8_t lm) {
  if (j < 4) {
    q[j] |= ls;
    q[j + 4] |= lm;
  } else {
    q[j + 4] |= static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
    q[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
    q[j] |= static_cast<uint8_t>((lm >> 4) << 6);
  }
}

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace tandem
