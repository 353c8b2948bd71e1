// Scalar reference (de)quantization of the GGUF block formats (the f16/bf16 conversions under them are in
// test_quant_fp16.cpp).
//
// Layers: hand-built blocks with hand-computed values pin every bit layout; fixed inputs whose quantized
// bytes and dequantized floats must hash to the values the reference implementation's own row functions
// produce pin the algorithms bit for bit; the random-weight model files written by the reference quantizer
// are decoded (again hashed against the reference's decoder), compared with the F16 file within per-type
// error bounds, and re-quantized; round trips on random data bound the error of every type.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem {
namespace {

// ---- Helpers.

std::vector<float> dequant(DType t, const void* src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, src, out.data(), n);
  return out;
}

template <typename Block>
std::vector<float> dequant_block(DType t, const Block& b) {
  return dequant(t, &b, traits(t).block_size);
}

std::vector<uint8_t> quant(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> out(row_bytes(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

uint64_t fnv1a(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

// Deterministic inputs from integer arithmetic and exactly rounded float operations only, so they are the
// same on every IEEE platform (no library transcendental functions, every draw in its own statement).
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : state_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }  // [0, 1)
  float symmetric() {
    const float u = uniform();
    return 2.0f * u - 1.0f;
  }
  float bell() {  // sum of four uniforms, centred: bell-shaped on (-2, 2), sd 0.577
    float s = uniform();
    s += uniform();
    s += uniform();
    s += uniform();
    return s - 2.0f;
  }

 private:
  uint64_t state_;
};

// 8 kinds of data, 4096 values each (16 super-blocks): small bell-shaped, uniform, mostly positive, all
// negative, outliers, groups of 16 zeros, constant super-blocks beside tiny ones, and a grid of exact values
// (ties).
std::vector<float> reference_inputs() {
  constexpr int kPerKind = 4096;
  std::vector<float> x(8 * kPerKind);
  TestRng rng(20240611);
  for (int kind = 0; kind < 8; ++kind) {
    for (int i = 0; i < kPerKind; ++i) {
      float v = 0.0f;
      switch (kind) {
        case 0:
          v = rng.bell() * 0.02f;
          break;
        case 1:
          v = rng.symmetric();
          break;
        case 2:
          v = rng.symmetric() + 0.7f;
          break;
        case 3:
          v = rng.uniform() * -3.0f;
          break;
        case 4:
          v = i % 37 == 0 ? rng.bell() * 50.0f : rng.bell();
          break;
        case 5:
          v = (i / 16) % 3 == 0 ? 0.0f : rng.bell() * 1e-3f;
          break;
        case 6:
          v = (i / 256) % 2 == 1 ? 1.5f : rng.bell() * 1e-6f;
          break;
        default:
          v = static_cast<float>(static_cast<int>(rng.next() % 17) - 8) * 0.25f;
          break;
      }
      x[static_cast<size_t>(kind * kPerKind + i)] = v;
    }
  }
  return x;
}

const std::vector<DType> kBlockTypes = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                        DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                                        DType::Q5_K, DType::Q6_K, DType::Q8_K};

constexpr uint16_t kHalfOne = 0x3C00;      // 1.0
constexpr uint16_t kHalfHalf = 0x3800;     // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;  // 0.25

// ---- Hand-built blocks: the bit layouts.

TEST(QuantLayout, FloatFormats) {
  const float f32[3] = {1.5f, -0.0f, 3e38f};
  EXPECT_EQ(dequant(DType::F32, f32, 3), (std::vector<float>{1.5f, -0.0f, 3e38f}));
  const uint16_t f16[4] = {0x3C00, 0xC100, 0x0001, 0x7BFF};
  EXPECT_EQ(dequant(DType::F16, f16, 4), (std::vector<float>{1.0f, -2.5f, 0x1p-24f, 65504.0f}));
  const uint16_t bf16[4] = {0x3F80, 0xC020, 0x0001, 0x7F7F};
  EXPECT_EQ(dequant(DType::BF16, bf16, 4),
            (std::vector<float>{1.0f, -2.5f, bits_to_f32(0x00010000u), bits_to_f32(0x7F7F0000u)}));

  const std::vector<float> x = {1.0f, -2.5f, 0.1f, 65504.0f};
  std::vector<uint16_t> h(4);
  quantize_row(DType::F16, x.data(), h.data(), 4);
  EXPECT_EQ(h, (std::vector<uint16_t>{0x3C00, 0xC100, 0x2E66, 0x7BFF}));
  quantize_row(DType::BF16, x.data(), h.data(), 4);
  EXPECT_EQ(h, (std::vector<uint16_t>{0x3F80, 0xC020, 0x3DCD, 0x4780}));
  std::vector<float> same(4);
  quantize_row(DType::F32, x.data(), same.data(), 4);
  EXPECT_EQ(same, x);
}

// Byte j holds element j in its low nibble and element j + 16 in its high nibble.
TEST(QuantLayout, Q4_0) {
  BlockQ4_0 b{};
  b.d = kHalfHalf;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> expected = {-4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f,  //
                                       0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,   //
                                       3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,   //
                                       -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f};
  EXPECT_EQ(dequant_block(DType::Q4_0, b), expected);
}

TEST(QuantLayout, Q4_1) {
  BlockQ4_1 b{};
  b.d = kHalfQuarter;
  b.m = 0xBC00;  // -1
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> expected = {-1.0f, -0.75f, -0.5f, -0.25f, 0.0f,   0.25f, 0.5f,   0.75f,  //
                                       1.0f,  1.25f,  1.5f,  1.75f,  2.0f,   2.25f, 2.5f,   2.75f,  //
                                       2.75f, 2.5f,   2.25f, 2.0f,   1.75f,  1.5f,  1.25f,  1.0f,   //
                                       0.75f, 0.5f,   0.25f, 0.0f,   -0.25f, -0.5f, -0.75f, -1.0f};
  EXPECT_EQ(dequant_block(DType::Q4_1, b), expected);
}

// The fifth bit of element j is bit j of the little-endian word qh.
TEST(QuantLayout, Q5_0) {
  BlockQ5_0 b{};
  b.d = kHalfOne;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const uint8_t qh[4] = {0x0F, 0x00, 0xF0, 0xFF};  // elements 0-3 and 20-31
  std::memcpy(b.qh, qh, 4);
  const std::vector<float> expected = {0.0f,  1.0f,  2.0f,  3.0f,  -12.0f, -11.0f, -10.0f, -9.0f,  //
                                       -8.0f, -7.0f, -6.0f, -5.0f, -4.0f,  -3.0f,  -2.0f,  -1.0f,  //
                                       -1.0f, -2.0f, -3.0f, -4.0f, 11.0f,  10.0f,  9.0f,   8.0f,   //
                                       7.0f,  6.0f,  5.0f,  4.0f,  3.0f,   2.0f,   1.0f,   0.0f};
  EXPECT_EQ(dequant_block(DType::Q5_0, b), expected);
}

TEST(QuantLayout, Q5_1) {
  BlockQ5_1 b{};
  b.d = kHalfHalf;
  b.m = 0x4000;  // 2
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const uint8_t qh[4] = {0x0F, 0x00, 0xF0, 0xFF};
  std::memcpy(b.qh, qh, 4);
  // Codes: 16..19, 4..15, 15..12, 27..16.
  const std::vector<float> expected = {10.0f, 10.5f, 11.0f, 11.5f, 4.0f,  4.5f,  5.0f,  5.5f,   //
                                       6.0f,  6.5f,  7.0f,  7.5f,  8.0f,  8.5f,  9.0f,  9.5f,   //
                                       9.5f,  9.0f,  8.5f,  8.0f,  15.5f, 15.0f, 14.5f, 14.0f,  //
                                       13.5f, 13.0f, 12.5f, 12.0f, 11.5f, 11.0f, 10.5f, 10.0f};
  EXPECT_EQ(dequant_block(DType::Q5_1, b), expected);
}

TEST(QuantLayout, Q8_0) {
  BlockQ8_0 b{};
  b.d = kHalfQuarter;
  for (int j = 0; j < 32; ++j)
    b.qs[j] = static_cast<int8_t>(8 * j - 128);  // -128 decodes though never written
  const std::vector<float> y = dequant_block(DType::Q8_0, b);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], static_cast<float>(2 * j - 32)) << j;
}

// Q2_K and Q3_K share the 2-bit layout: element e in byte 32 * (e / 128) + e % 32 at bits 2 * ((e % 128) /
// 32). With every byte 0b11100100 the code of sub-block j (16 elements) is (j % 8) / 2.
TEST(QuantLayout, Q2_K) {
  BlockQ2_K b{};
  b.d = kHalfOne;
  b.dmin = kHalfHalf;
  for (int j = 0; j < 16; ++j)
    b.scales[j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // scale j, min 15 - j
  std::memset(b.qs, 0xE4, sizeof(b.qs));
  // value = 1 * j * code - 0.5 * (15 - j)
  const float per_sub[16] = {-7.5f, -7.0f, -4.5f, -3.0f, 2.5f,  5.0f,  13.5f, 17.0f,
                             -3.5f, -3.0f, 7.5f,  9.0f,  22.5f, 25.0f, 41.5f, 45.0f};
  std::vector<float> y = dequant_block(DType::Q2_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], per_sub[e / 16]) << e;

  // One code: byte 37 bits 2-3 is element 128 + 32 + 5 = 165 (sub-block 10: scale 10, min 5).
  std::memset(b.qs, 0, sizeof(b.qs));
  b.qs[37] = 0x0C;
  y = dequant_block(DType::Q2_K, b);
  for (int e = 0; e < 256; ++e) {
    const float base = -0.5f * static_cast<float>(15 - e / 16);
    EXPECT_EQ(y[e], e == 165 ? 27.5f : base) << e;
  }
}

// Q3_K scales: low 4 bits of scale j in nibble j / 8 of byte j % 8, high 2 bits at bits 2 * (j / 4) of byte
// 8 + j % 4, biased by 32. The third code bit of element e is bit e / 32 of hmask[e % 32]; a clear bit
// subtracts 4.
TEST(QuantLayout, Q3_K) {
  BlockQ3_K b{};
  b.d = kHalfHalf;
  const uint8_t scales[12] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE, 0xE4, 0xE4, 0xE4, 0xE4};
  std::memcpy(b.scales, scales, 12);
  // Signed scales: -32 -30 -28 -26 -8 -6 -4 -2 1 3 5 7 25 27 29 31.
  std::memset(b.qs, 0xE4, sizeof(b.qs));
  std::memset(b.hmask, 0xFF, sizeof(b.hmask));
  const float high_set[16] = {0.0f, 0.0f, -14.0f, -13.0f, -8.0f, -6.0f, -6.0f, -3.0f,
                              0.0f, 0.0f, 2.5f,   3.5f,   25.0f, 27.0f, 43.5f, 46.5f};
  std::vector<float> y = dequant_block(DType::Q3_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], high_set[e / 16]) << e;

  std::memset(b.hmask, 0x00, sizeof(b.hmask));
  const float high_clear[16] = {64.0f, 60.0f, 42.0f, 39.0f,  8.0f,   6.0f,   2.0f,   1.0f,
                                -2.0f, -6.0f, -7.5f, -10.5f, -25.0f, -27.0f, -14.5f, -15.5f};
  y = dequant_block(DType::Q3_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], high_clear[e / 16]) << e;

  // Single bits: hmask[3] bit 5 cleared is element 163 (sub-block 10, scale 5); qs[39] bits 4-5 is element
  // 128 + 64 + 7 = 199 (sub-block 12, scale 25).
  std::memset(b.qs, 0, sizeof(b.qs));
  std::memset(b.hmask, 0xFF, sizeof(b.hmask));
  b.hmask[3] = static_cast<uint8_t>(~0x20);
  b.qs[39] = 0x30;
  y = dequant_block(DType::Q3_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], e == 163 ? -10.0f : e == 199 ? 37.5f : 0.0f) << e;
}

// Q4_K/Q5_K scales and mins: see the expected values computed beside each byte.
constexpr uint8_t kK4Scales[12] = {
    0xC1,  // scale0 = 1, top bits of scale4 = 3
    0x02,  // scale1 = 2
    0x43,  // scale2 = 3, top bits of scale6 = 1
    0x84,  // scale3 = 4, top bits of scale7 = 2
    0x45,  // min0 = 5, top bits of min4 = 1
    0x06,  // min1 = 6
    0xC7,  // min2 = 7, top bits of min6 = 3
    0x08,  // min3 = 8
    0x5A,  // scale4 = 0xA | 3 << 4 = 58, min4 = 5 | 1 << 4 = 21
    0x21,  // scale5 = 1, min5 = 2
    0x3F,  // scale6 = 15 | 1 << 4 = 31, min6 = 3 | 3 << 4 = 51
    0x00,  // scale7 = 0 | 2 << 4 = 32, min7 = 0
};
constexpr float kK4Mins[8] = {5, 6, 7, 8, 21, 2, 51, 0};

// Element e in byte 32 * (e / 64) + e % 32, low nibble for the first 32 of each 64: with bytes 0x71 the codes
// of the eight 32-element sub-blocks alternate 1, 7.
TEST(QuantLayout, Q4_K) {
  BlockQ4_K b{};
  b.d = kHalfOne;
  b.dmin = kHalfHalf;
  std::memcpy(b.scales, kK4Scales, 12);
  std::memset(b.qs, 0x71, sizeof(b.qs));
  const float per_sub[8] = {-1.5f, 11.0f, -0.5f, 24.0f, 47.5f, 6.0f, 5.5f, 224.0f};
  std::vector<float> y = dequant_block(DType::Q4_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], per_sub[e / 32]) << e;

  // High nibble of byte 64 + 9 is element 128 + 32 + 9 = 169 (sub-block 5: scale 1, min 2).
  std::memset(b.qs, 0, sizeof(b.qs));
  b.qs[73] = 0xF0;
  y = dequant_block(DType::Q4_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], e == 169 ? 14.0f : -0.5f * kK4Mins[e / 32]) << e;
}

// The fifth bit of element e is bit e / 32 of qh[e % 32].
TEST(QuantLayout, Q5_K) {
  BlockQ5_K b{};
  b.d = kHalfOne;
  b.dmin = kHalfHalf;
  std::memcpy(b.scales, kK4Scales, 12);
  std::memset(b.qs, 0x71, sizeof(b.qs));
  std::memset(b.qh, 0xA5, sizeof(b.qh));  // sub-blocks 0, 2, 5, 7 get +16: codes 17 7 17 7 1 23 1 23
  const float per_sub[8] = {14.5f, 11.0f, 47.5f, 24.0f, 47.5f, 22.0f, 5.5f, 736.0f};
  std::vector<float> y = dequant_block(DType::Q5_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], per_sub[e / 32]) << e;

  std::memset(b.qs, 0, sizeof(b.qs));
  std::memset(b.qh, 0, sizeof(b.qh));
  b.qh[9] = 0x20;  // element 5 * 32 + 9 = 169
  y = dequant_block(DType::Q5_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], e == 169 ? 15.0f : -0.5f * kK4Mins[e / 32]) << e;
}

// Element e, with h = e / 128, g = (e % 128) / 32, l = e % 32: low 4 bits in ql[64 h + 32 (g % 2) + l]
// (nibble g / 2), high 2 bits in qh[32 h + l] at bits 2 g; value d * scale[e / 16] * (code - 32).
TEST(QuantLayout, Q6_K) {
  BlockQ6_K b{};
  b.d = kHalfQuarter;
  const int8_t scales[16] = {-128, 127, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7};
  std::memcpy(b.scales, scales, 16);
  std::vector<float> y = dequant_block(DType::Q6_K, b);  // all codes 0: value -8 * scale
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], -8.0f * static_cast<float>(scales[e / 16])) << e;

  std::memset(b.ql, 0xA5, sizeof(b.ql));
  std::memset(b.qh, 0xE4, sizeof(b.qh));  // codes by g: 5, 21, 42, 58 -> -27, -11, 10, 26
  const float per_sub[16] = {864.0f, -857.25f, -2.75f,  2.75f,  5.0f,  -5.0f,  19.5f, -19.5f,
                             -27.0f, 27.0f,    -13.75f, 13.75f, 15.0f, -15.0f, 45.5f, -45.5f};
  y = dequant_block(DType::Q6_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], per_sub[e / 16]) << e;

  // ql[64 + 32 + 3] high nibble is element 128 + 96 + 3 = 227 (scale 7); qh[32 + 10] bits 2-3 is element
  // 128 + 32 + 10 = 170 (scale 5).
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  b.ql[99] = 0xF0;
  b.qh[42] = 0x0C;
  y = dequant_block(DType::Q6_K, b);
  for (int e = 0; e < 256; ++e) {
    const float base = -8.0f * static_cast<float>(scales[e / 16]);
    EXPECT_EQ(y[e], e == 227 ? -29.75f : e == 170 ? 20.0f : base) << e;
  }
}

TEST(QuantLayout, Q8_K) {
  BlockQ8_K b{};
  b.d = 0.5f;
  for (int e = 0; e < 256; ++e) b.qs[e] = static_cast<int8_t>(e - 128);
  const std::vector<float> y = dequant_block(DType::Q8_K, b);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.5f * static_cast<float>(e - 128)) << e;
}

// ---- Quantizer rules on hand-picked blocks.

TEST(QuantRules, Q8_0ScaleIsAbsMaxOver127AndRoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = -0.5f;
  x[5] = 1.5f;
  x[6] = -126.6f;
  BlockQ8_0 b;
  quantize_row(DType::Q8_0, x.data(), &b, 32);
  EXPECT_EQ(b.d, kHalfOne);
  const int expected[7] = {127, 3, -3, 1, -1, 2, -127};
  for (int j = 0; j < 7; ++j) EXPECT_EQ(b.qs[j], expected[j]) << j;
  for (int j = 7; j < 32; ++j) EXPECT_EQ(b.qs[j], 0) << j;
}

// Q4_0 divides by the signed extreme over -8: that extreme gets code 0 and the other side of zero reaches +7
// (clamped), with halves rounding up.
TEST(QuantRules, Q4_0UsesSignedMaxOverMinus8) {
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;  // d = 1
  x[1] = 7.4f;
  x[2] = 0.5f;
  x[3] = -0.5f;
  x[4] = 7.6f;
  BlockQ4_0 b;
  quantize_row(DType::Q4_0, x.data(), &b, 32);
  EXPECT_EQ(b.d, kHalfOne);
  EXPECT_EQ(b.qs[0] & 0xF, 0);
  EXPECT_EQ(b.qs[1] & 0xF, 15);
  EXPECT_EQ(b.qs[2] & 0xF, 9);
  EXPECT_EQ(b.qs[3] & 0xF, 8);
  EXPECT_EQ(b.qs[4] & 0xF, 15);  // 15.6 + 0.5 truncates to 16, clamped
  EXPECT_EQ(b.qs[5] & 0xF, 8);

  x.assign(32, 0.0f);
  x[16] = 8.0f;  // positive extreme: d = -1, so it decodes as (0 - 8) * -1
  x[17] = -7.0f;
  quantize_row(DType::Q4_0, x.data(), &b, 32);
  EXPECT_EQ(b.d, 0xBC00);
  EXPECT_EQ(b.qs[0] >> 4, 0);
  EXPECT_EQ(b.qs[1] >> 4, 15);
  const std::vector<float> y = dequant(DType::Q4_0, &b, 32);
  EXPECT_EQ(y[16], 8.0f);
  EXPECT_EQ(y[17], -7.0f);
}

// Values already on a format's grid come back exactly.
TEST(QuantRules, LegacyGridValuesRoundTripExactly) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = 0.5f * static_cast<float>(j < 16 ? 8 * j - 127 : 127 - 8 * (j - 16));
  EXPECT_EQ(dequant(DType::Q8_0, quant(DType::Q8_0, x).data(), 32), x);
  for (int j = 0; j < 32; ++j) x[j] = 0.25f * static_cast<float>(j < 16 ? j - 8 : 7 - (j - 16));
  EXPECT_EQ(dequant(DType::Q4_0, quant(DType::Q4_0, x).data(), 32), x);
  for (int j = 0; j < 32; ++j) x[j] = 0.25f * static_cast<float>(j < 16 ? 2 * j - 16 : 15 - 2 * (j - 16));
  EXPECT_EQ(dequant(DType::Q5_0, quant(DType::Q5_0, x).data(), 32), x);
  for (int j = 0; j < 32; ++j) x[j] = -1.0f + 0.25f * static_cast<float>(j < 16 ? j : 31 - j);
  EXPECT_EQ(dequant(DType::Q4_1, quant(DType::Q4_1, x).data(), 32), x);
  for (int j = 0; j < 32; ++j) x[j] = 3.0f + 0.5f * static_cast<float>(j);
  EXPECT_EQ(dequant(DType::Q5_1, quant(DType::Q5_1, x).data(), 32), x);
}

TEST(QuantRules, ZerosStayZeroInEveryType) {
  for (const DType t : kBlockTypes) {
    const std::vector<float> x(512, 0.0f);
    const std::vector<float> y = dequant(t, quant(t, x).data(), 512);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(QuantRules, Q8_KBlockSumsAndScale) {
  const std::vector<float> x = reference_inputs();
  const std::vector<uint8_t> bytes = quant(DType::Q8_K, x);
  const auto* blocks = reinterpret_cast<const BlockQ8_K*>(bytes.data());
  for (size_t i = 0; i < x.size() / 256; ++i) {
    float amax = 0.0f;
    for (int e = 0; e < 256; ++e) amax = std::max(amax, std::fabs(x[256 * i + e]));
    EXPECT_NEAR(std::fabs(blocks[i].d) * 127.0f, amax, amax * 1e-6f) << i;
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += blocks[i].qs[16 * j + l];
      ASSERT_EQ(blocks[i].bsums[j], sum) << i << " " << j;
    }
  }
}

// ---- Bit-exact agreement with the reference implementation.

// FNV-1a hashes of the bytes quantize_row_*_ref (and the f16/bf16 row converters) of the reference
// implementation write for reference_inputs(), and of the floats its dequantize_row_* read back from them.
struct ReferenceHashes {
  DType type;
  uint64_t quantized;
  uint64_t dequantized;
};
const ReferenceHashes kReferenceHashes[] = {
    {DType::F16, 0xD500C9634FF0675Aull, 0x1757D4C29416F335ull},
    {DType::BF16, 0x6AF040EA40CB1AE8ull, 0xC4AFB2C1FCEDD918ull},
    {DType::Q4_0, 0x0FCD070C305A439Cull, 0xED38F8CE55489F98ull},
    {DType::Q4_1, 0x771FC51C307C9DC9ull, 0xBC318917B6720794ull},
    {DType::Q5_0, 0x784802F67294ACA5ull, 0xA573D63F61675953ull},
    {DType::Q5_1, 0x6E83A4646697BF7Bull, 0x8724F1B2A7DB736Bull},
    {DType::Q8_0, 0xF72E5400D714259Aull, 0xB92C7FEE14405A57ull},
    {DType::Q2_K, 0x4AFDD378CA29D81Dull, 0x36D1F4BA45ED763Bull},
    {DType::Q3_K, 0x121D5278FBFEA90Bull, 0x462B20EB83CF6B6Eull},
    {DType::Q4_K, 0x6511D606A41BCB02ull, 0x617F928F435CAB50ull},
    {DType::Q5_K, 0x53B39D799F97F6A8ull, 0x57EAA57145C908C1ull},
    {DType::Q6_K, 0x80FC9DD89EAB460Aull, 0xD05DD7A08610315Full},
    {DType::Q8_K, 0xCF6C478DABB6B4D0ull, 0x6433AF520193462Dull},
};

TEST(QuantReference, InputsAreTheOnesTheHashesWereMadeFrom) {
  const std::vector<float> x = reference_inputs();
  EXPECT_EQ(fnv1a(x.data(), x.size() * sizeof(float)), 0xAF411B6E72C7DC5Dull);
}

TEST(QuantReference, QuantizesAndDequantizesBitExactly) {
  const std::vector<float> x = reference_inputs();
  const auto n = static_cast<int64_t>(x.size());
  for (const ReferenceHashes& r : kReferenceHashes) {
    const std::vector<uint8_t> bytes = quant(r.type, x);
    EXPECT_EQ(fnv1a(bytes.data(), bytes.size()), r.quantized) << dtype_name(r.type);
    const std::vector<float> y = dequant(r.type, bytes.data(), n);
    EXPECT_EQ(fnv1a(y.data(), y.size() * sizeof(float)), r.dequantized) << dtype_name(r.type);
  }
}

// ---- The model files written by the reference quantizer.

const char* const kSynthFiles[] = {"F16",  "BF16", "Q8_0",   "Q4_0",   "Q4_1",   "Q5_0",
                                   "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K"};

std::string synth_path(const std::string& kind) {
  return testing::shared_path("models/synth/synth-llama-d256-" + kind + ".gguf");
}

// Hash over a file's tensors in file order (each tensor's dequantized floats hashed, the hashes folded with
// FNV-1a), from the reference implementation's decoders.
const std::map<std::string, uint64_t> kFileHashes = {
    {"F16", 0x0554982779CF8557ull},    {"BF16", 0x79A68603857B39CFull},   {"Q8_0", 0x3A77CD95EE68D541ull},
    {"Q4_0", 0x8F8C5B1128813CE5ull},   {"Q4_1", 0x263EC27CCF121FDEull},   {"Q5_0", 0x42993F7B6E42B25Cull},
    {"Q5_1", 0xD07E2CB18987C3D3ull},   {"Q2_K", 0x57102EF3D33DE322ull},   {"Q3_K_M", 0x012B7FEC2E3EB29Aull},
    {"Q4_K_M", 0xEFE527F84020F8B3ull}, {"Q5_K_M", 0x3408C56ACBE2E965ull}, {"Q6_K", 0x8A226D109B569025ull},
};

TEST(QuantFiles, DequantizeBitExactly) {
  for (const char* kind : kSynthFiles) {
    const gguf::File f = gguf::File::open(synth_path(kind));
    uint64_t h = 0xCBF29CE484222325ull;
    for (const gguf::TensorInfo& t : f.tensors()) {
      const std::vector<float> y = dequant(t.type, t.data, t.elements());
      h = (h ^ fnv1a(y.data(), y.size() * sizeof(float))) * 0x100000001B3ull;
    }
    EXPECT_EQ(h, kFileHashes.at(kind)) << kind;
  }
}

// Per block type over all files: RMS of (dequantized - F16 file) relative to the RMS of the F16 weights, and
// re-quantization of the dequantized values compared block by block with the file's bytes.
struct FileStats {
  double err2 = 0;
  double ref2 = 0;
  int64_t blocks = 0;
  int64_t same_blocks = 0;
};

std::map<DType, FileStats> measure_files() {
  const gguf::File f16 = gguf::File::open(synth_path("F16"));
  std::map<DType, FileStats> stats;
  for (const char* kind : kSynthFiles) {
    if (std::string(kind) == "F16") continue;
    const gguf::File f = gguf::File::open(synth_path(kind));
    for (const gguf::TensorInfo& t : f.tensors()) {
      if (t.type == DType::F32) continue;  // norms, kept in f32 by every file
      const gguf::TensorInfo* ref = f16.tensor(t.name);
      EXPECT_NE(ref, nullptr) << t.name;
      if (ref == nullptr) continue;
      EXPECT_EQ(ref->ne, t.ne) << t.name;
      const int64_t n = t.elements();
      const std::vector<float> y = dequant(t.type, t.data, n);
      const std::vector<float> w = dequant(ref->type, ref->data, n);
      FileStats& s = stats[t.type];
      for (int64_t i = 0; i < n; ++i) {
        s.err2 += (static_cast<double>(y[i]) - w[i]) * (static_cast<double>(y[i]) - w[i]);
        s.ref2 += static_cast<double>(w[i]) * w[i];
      }
      const std::vector<uint8_t> again = quant(t.type, y);
      const size_t block_bytes = traits(t.type).type_size;
      for (size_t off = 0; off < again.size(); off += block_bytes) {
        s.same_blocks += std::memcmp(again.data() + off, t.data + off, block_bytes) == 0;
        ++s.blocks;
      }
    }
  }
  return stats;
}

TEST(QuantFiles, MatchF16WeightsAndRequantize) {
  struct Expect {
    double max_rel_rms;        // measured value in the comment; bounds leave ~15% headroom
    double min_same_fraction;  // of blocks re-quantizing to the file's bytes
  };
  // The legacy formats re-quantize exactly: the extreme element decodes to exactly +-8d (+-16d, +-127d; for
  // the min formats the min and min + 15d or 31d), so the same f16 scale comes back and every other value
  // sits a whole number of steps away, far from a rounding boundary. The K-quant searches are not idempotent:
  // fitted again to already-quantized values they can settle on another scale; the reference quantizer
  // reproduces exactly the same counts on these values, so the fractions are properties of the algorithm.
  const std::map<DType, Expect> expect = {
      {DType::BF16, {0.0020, 1.0}},   // 0.00169
      {DType::Q8_0, {0.0062, 1.0}},   // 0.00536
      {DType::Q4_0, {0.099, 1.0}},    // 0.0859
      {DType::Q4_1, {0.090, 1.0}},    // 0.0783
      {DType::Q5_0, {0.049, 1.0}},    // 0.0427
      {DType::Q5_1, {0.044, 1.0}},    // 0.0378
      {DType::Q2_K, {0.34, 0.99}},    // 0.2965, 6223 of 6272 blocks
      {DType::Q3_K, {0.174, 0.50}},   // 0.1508, 5145 of 9728
      {DType::Q4_K, {0.082, 0.999}},  // 0.0714, 12031 of 12032
      {DType::Q5_K, {0.042, 0.92}},   // 0.0361, 8459 of 9088
      {DType::Q6_K, {0.0205, 0.79}},  // 0.0178, 13047 of 16128
  };
  const std::map<DType, FileStats> stats = measure_files();
  for (const auto& [type, e] : expect) {
    ASSERT_TRUE(stats.count(type)) << dtype_name(type);
    const FileStats& s = stats.at(type);
    const double rel_rms = std::sqrt(s.err2 / s.ref2);
    const double same = static_cast<double>(s.same_blocks) / static_cast<double>(s.blocks);
    EXPECT_LT(rel_rms, e.max_rel_rms) << dtype_name(type);
    EXPECT_GE(same, e.min_same_fraction) << dtype_name(type) << ": " << s.same_blocks << " of " << s.blocks;
    std::printf("%-5s relative RMS error vs F16 %.5f, re-quantized blocks identical %lld of %lld\n",
                std::string(dtype_name(type)).c_str(), rel_rms, static_cast<long long>(s.same_blocks),
                static_cast<long long>(s.blocks));
  }
}

// ---- Round trips on random data.

TEST(QuantRoundTrip, ErrorWithinEachFormatsBounds) {
  // Bell-shaped data with a different spread in each super-block, as weights rows have.
  TestRng rng(7);
  std::vector<float> x(256 * 256);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = rng.bell() * (0.01f + 0.002f * static_cast<float>((i / 256) % 16));
  // Bounds leave ~15% above the measured values in the comments (the step of each format over sqrt(12), in
  // units of the data's RMS, plus the f16 rounding of the scales).
  const std::map<DType, double> max_rel_rms = {
      {DType::F16, 0.00025},  // 0.00021
      {DType::BF16, 0.0019},  // 0.00164
      {DType::Q8_0, 0.0058},  // 0.00508
      {DType::Q8_K, 0.0072},  // 0.00621
      {DType::Q4_0, 0.094},   // 0.0814
      {DType::Q4_1, 0.087},   // 0.0758
      {DType::Q5_0, 0.047},   // 0.0405
      {DType::Q5_1, 0.042},   // 0.0367
      {DType::Q2_K, 0.33},    // 0.288
      {DType::Q3_K, 0.167},   // 0.1455
      {DType::Q4_K, 0.079},   // 0.0689
      {DType::Q5_K, 0.040},   // 0.0349
      {DType::Q6_K, 0.0196},  // 0.0170
  };
  double ref2 = 0;
  for (float v : x) ref2 += static_cast<double>(v) * v;
  for (const auto& [type, bound] : max_rel_rms) {
    const std::vector<float> y = dequant(type, quant(type, x).data(), static_cast<int64_t>(x.size()));
    double err2 = 0;
    for (size_t i = 0; i < x.size(); ++i)
      err2 += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    const double rel_rms = std::sqrt(err2 / ref2);
    EXPECT_LT(rel_rms, bound) << dtype_name(type);
    std::printf("%-5s round-trip relative RMS error %.5f\n", std::string(dtype_name(type)).c_str(), rel_rms);
  }
}

// Every element of a symmetric legacy block is within half a step (plus the f16 rounding of the scale) of its
// input.
TEST(QuantRoundTrip, LegacyElementErrorWithinHalfAStep) {
  TestRng rng(11);
  std::vector<float> x(32 * 512);
  for (float& v : x) v = rng.symmetric();
  struct Case {
    DType type;
    float steps;  // elements per step of the block's absolute max
  };
  for (const Case c : {Case{DType::Q8_0, 127}, Case{DType::Q5_0, 16}, Case{DType::Q4_0, 8}}) {
    const std::vector<float> y = dequant(c.type, quant(c.type, x).data(), static_cast<int64_t>(x.size()));
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      const float step = amax / c.steps;
      for (int j = 0; j < 32; ++j) {
        const size_t i = 32 * b + static_cast<size_t>(j);
        // Half a step, the scale's f16 rounding (2^-11 relative) times the largest code, and the clamp of the
        // top code of Q4_0/Q5_0 (values beyond +7d / +15d on the side opposite the extreme).
        const float clamp_slack = c.type == DType::Q8_0 ? 0.0f : step;
        ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * step + amax * 0x1p-10f + clamp_slack)
            << dtype_name(c.type) << " " << i;
      }
    }
  }
}

// ---- Errors.

TEST(QuantErrors, UnsupportedTypesNameTheType) {
  float out[256];
  uint8_t block[512] = {};
  for (const DType t : {DType::IQ2_XXS, DType::Q8_1, DType::I8, DType::F64, DType::MXFP4}) {
    const std::string name(dtype_name(t));
    try {
      dequantize_row(t, block, out, traits(t).block_size);
      ADD_FAILURE() << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    try {
      quantize_row(t, out, block, traits(t).block_size);
      ADD_FAILURE() << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(dequantize_row(static_cast<DType>(4), block, out, 32), Error);  // an id the format removed
}

TEST(QuantErrors, PartialBlocksAreRejected) {
  float out[256] = {};
  uint8_t block[512] = {};
  EXPECT_THROW(dequantize_row(DType::Q4_0, block, out, 31), Error);
  EXPECT_THROW(quantize_row(DType::Q4_K, out, block, 128), Error);
  EXPECT_THROW(quantize_row(DType::Q8_0, out, block, -32), Error);
  EXPECT_NO_THROW(dequantize_row(DType::Q4_K, block, out, 0));
}

}  // namespace
}  // namespace tandem

// tandem quantize on a model whose feed-forward rows (172 wide) fit no 32-element block: those matrices are
// written as F16 (with a note), the others in the asked type, and the file loads and generates.
TEST(QuantizeCommand, RowsThatFitNoBlockFallBackToF16) {
  const std::string out = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-tandem-quantize-q8.gguf";
  std::remove(out.c_str());
  const std::string tandem(TANDEM_BINARY);
  const auto [log, rc] = tandem::testing::run_command(
      tandem + " quantize '" + tandem::testing::shared_path("models/stories260K.gguf") + "' '" + out +
      "' Q8_0 2>&1");
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("written as F16"), std::string::npos) << log;
  {
    const tandem::gguf::File f = tandem::gguf::File::open(out);
    const tandem::gguf::TensorInfo* down = f.tensor("blk.0.ffn_down.weight");
    const tandem::gguf::TensorInfo* up = f.tensor("blk.0.ffn_up.weight");
    ASSERT_NE(down, nullptr);
    ASSERT_NE(up, nullptr);
    EXPECT_EQ(down->ne[0], 172);
    EXPECT_EQ(down->type, tandem::DType::F16);
    EXPECT_EQ(up->type, tandem::DType::Q8_0);
  }
  const auto [text, run_rc] =
      tandem::testing::run_command(tandem + " run -m '" + out + "' -t 1 --temp 0 -n 8 -p 'Once' 2>/dev/null");
  EXPECT_EQ(run_rc, 0);
  EXPECT_FALSE(text.empty());
  std::remove(out.c_str());
}
