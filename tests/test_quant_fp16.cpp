// Scalar f32 <-> f16/bf16 conversions under the F16/BF16 tensor types and every block format's scales: every
// half value, every rounding midpoint, subnormals, infinities and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "tandem/tensor/fp16.h"

namespace tandem {
namespace {

TEST(Fp16, DecodesKnownValues) {
  EXPECT_EQ(fp16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_f32(0x0400), 0x1p-14f);            // smallest normal
  EXPECT_EQ(fp16_to_f32(0x03FF), 1023.0f * 0x1p-24f);  // largest subnormal
  EXPECT_EQ(fp16_to_f32(0x0001), 0x1p-24f);            // smallest subnormal
  EXPECT_EQ(fp16_to_f32(0x8001), -0x1p-24f);
  EXPECT_EQ(f32_to_bits(fp16_to_f32(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(fp16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  // NaN payloads are kept and come out quiet, as the hardware conversion and the reference do it.
  EXPECT_EQ(f32_to_bits(fp16_to_f32(0x7C01)), 0x7FC02000u);
  EXPECT_EQ(f32_to_bits(fp16_to_f32(0xFE00)), 0xFFC00000u);
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    const uint16_t back = f32_to_fp16(f);
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
      EXPECT_EQ(back & 0x7C00, 0x7C00) << std::hex << h;
      EXPECT_NE(back & 0x3FF, 0) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
  // Decoding is monotonic over the positive finite halves.
  for (uint16_t h = 0; h < 0x7BFF; ++h) ASSERT_LT(fp16_to_f32(h), fp16_to_f32(h + 1)) << std::hex << h;
}

// Every midpoint between adjacent finite halves (subnormals, the subnormal/normal boundary and the overflow
// threshold included) rounds to the even one; one float ulp either side rounds to the nearer one.
TEST(Fp16, RoundsToNearestEven) {
  for (uint16_t h = 0; h < 0x7C00; ++h) {
    for (const uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const uint16_t lo = static_cast<uint16_t>(sign | h);
      const uint16_t hi = static_cast<uint16_t>(sign | (h + 1));
      // h + 1 == 0x7C00 is infinity: the midpoint 65520 is where rounding overflows.
      const double a = fp16_to_f32(lo);
      const double b = h + 1 == 0x7C00 ? (sign ? -65536.0 : 65536.0) : fp16_to_f32(hi);
      const float mid = static_cast<float>((a + b) / 2);  // exact: 12 significant bits
      ASSERT_EQ(static_cast<double>(mid), (a + b) / 2);
      const uint16_t even = (h & 1) == 0 ? lo : hi;
      ASSERT_EQ(f32_to_fp16(mid), even) << std::hex << lo;
      const float toward_zero = std::nextafter(mid, 0.0f);
      const float away = std::nextafter(mid, sign ? -1e30f : 1e30f);
      ASSERT_EQ(f32_to_fp16(toward_zero), lo) << std::hex << lo;
      ASSERT_EQ(f32_to_fp16(away), hi) << std::hex << lo;
    }
  }
}

TEST(Fp16, EncodesSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_fp16(inf), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-inf), 0xFC00);
  EXPECT_EQ(f32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_fp16(-std::numeric_limits<float>::max()), 0xFC00);
  EXPECT_EQ(f32_to_fp16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_fp16(0x1p-25f), 0x0000);  // half the smallest subnormal: tie to even (zero)
  EXPECT_EQ(f32_to_fp16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(f32_to_fp16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_fp16(-1e-10f), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(f32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  const uint16_t qnan = f32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(qnan & 0x7C00, 0x7C00);
  EXPECT_NE(qnan & 0x03FF, 0);
  const uint16_t snan = f32_to_fp16(bits_to_f32(0xFF800001u));  // payload only in bits the half drops
  EXPECT_EQ(snan & 0xFC00, 0xFC00);
  EXPECT_NE(snan & 0x03FF, 0);
}

TEST(Bf16, RoundTripsAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(f32_to_bits(f), h << 16);
    if ((h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0) {
      ASSERT_EQ(f32_to_bf16(f), h | 0x40) << std::hex << h;  // NaN: made quiet, payload kept
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;  // subnormals are kept, not flushed
    if ((h & 0x7FFF) >= 0x7F80) continue;           // infinity has no upper neighbour
    // The f32 values between h and h + 1: the midpoint ties to even, one ulp either side goes to the nearer.
    const uint32_t mid = (h << 16) | 0x8000;
    ASSERT_EQ(f32_to_bf16(bits_to_f32(mid)), (h & 1) ? h + 1 : h) << std::hex << h;
    ASSERT_EQ(f32_to_bf16(bits_to_f32(mid - 1)), h) << std::hex << h;
    ASSERT_EQ(f32_to_bf16(bits_to_f32(mid + 1)), h + 1) << std::hex << h;
  }
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x7F800001u)), 0x7FC0);  // signalling NaN comes out quiet
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x7F7FFFFFu)), 0x7F80);  // rounds up to infinity
}

}  // namespace
}  // namespace tandem
