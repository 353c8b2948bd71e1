// Quantized dot products on ARM NEON with the dot-product extension (ARMv8.2 sdot; Linux reports it as
// asimddp). Weight rows are unpacked once per matmul row pass by the shared plain C++ (quant_unpack.inc,
// vectorized by the compiler), then applied to up to kDotTileRows activation rows: sdot multiplies the codes
// as signed bytes, 16 per instruction, which every unpacked code fits (at most 63, or Q8_0's signed codes:
// signed_q8). A fixed offset (Q4_0, Q5_0, Q6_K) is taken out of the codes once per weight super-block, so it
// costs nothing per row; other offsets (Q4_1, Q5_1, the K-quants' mins) add b * sum(q) per group in float.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__aarch64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#include <arm_neon.h>

namespace tandem::kernels {
namespace neon_target {

inline float half_to_float(uint16_t h) {
  return fp16_to_f32(h);
}

#include "tandem/kernels/quant_plain_helpers.inc"
#include "tandem/kernels/quant_unpack.inc"

// Activation rows per tile: four accumulators per row (lane groups 4j..4j+3), 16 of the 32 vector registers
// at 4 rows, beside one chunk of weight codes and its scales.
constexpr int64_t kDotTileRows = 4;

// How a weight type's offset enters the sums: kOffset > 0, the offset is -kOffset times the scale in every
// group (Q4_0: 8, Q5_0: 16, Q6_K: 32), so the codes minus kOffset (signed, exact) go into the integer sums
// and the offset term vanishes; kOffset == 0, no offset (Q8_0's signed codes); kGeneralOffset, b times the
// scaled code sums, added per group in float.
constexpr int kGeneralOffset = -1;

constexpr int offset_of(DType type, bool signed_codes) {
  switch (type) {
    case DType::Q4_0:
      return 8;
    case DType::Q5_0:
      return 16;
    case DType::Q6_K:
      return 32;
    case DType::Q8_0:
      return signed_codes ? 0 : kGeneralOffset;
    default:
      return kGeneralOffset;
  }
}

// Each row keeps the same four accumulators and the same operation sequence whatever NR is, so its result
// does not depend on the rows beside it. Chunk j of a super-block is bytes 16j..16j+15 of each quarter: lanes
// 4j..4j+3, that is lane groups 4j..4j+3 (quant_layout.h).
template <int NR, int kOffset>
void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
              int64_t y_stride) {
  float32x4_t acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    for (int j = 0; j < 4; ++j) {
      int8x16_t u[4];
      for (int q = 0; q < 4; ++q) {
        u[q] = vreinterpretq_s8_u8(vld1q_u8(W.u + 64 * q + 16 * j));
        if (kOffset > 0) u[q] = vsubq_s8(u[q], vdupq_n_s8(static_cast<int8_t>(kOffset)));
      }
      const float32x4_t a = vld1q_f32(W.a + 4 * j), b = vld1q_f32(W.b + 4 * j);
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        int32x4_t sum = vdupq_n_s32(0);
        for (int q = 0; q < 4; ++q) sum = vdotq_s32(sum, u[q], vld1q_s8(X.q + 64 * q + 16 * j));
        acc[r][j] = vfmaq_f32(acc[r][j], vcvtq_f32_s32(sum), vmulq_f32(a, vld1q_f32(X.d + 4 * j)));
        if (kOffset == kGeneralOffset) acc[r][j] = vfmaq_f32(acc[r][j], b, vld1q_f32(X.bs + 4 * j));
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    y[r * y_stride] = vaddvq_f32(vaddq_f32(vaddq_f32(acc[r][0], acc[r][1]), vaddq_f32(acc[r][2], acc[r][3])));
}

template <int kOffset>
void dot_rows_t(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
                float* y, int64_t y_stride) {
  using Tile = void (*)(const UnpackedSuper*, int64_t, const ActSuper*, int64_t, float*, int64_t);
  static constexpr Tile tiles[kDotTileRows] = {&dot_tile<1, kOffset>, &dot_tile<2, kOffset>,
                                               &dot_tile<3, kOffset>, &dot_tile<4, kOffset>};
  for (int64_t r = 0; r < n_rows; r += kDotTileRows)
    tiles[std::min(kDotTileRows, n_rows - r) - 1](w, n_super, x + r * x_stride, x_stride, y + r * y_stride,
                                                  y_stride);
}

void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
              DType type, bool signed_codes, float* y, int64_t y_stride) {
  switch (offset_of(type, signed_codes)) {
    case 0:
      return dot_rows_t<0>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case 8:
      return dot_rows_t<8>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case 16:
      return dot_rows_t<16>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case 32:
      return dot_rows_t<32>(w, n_super, x, x_stride, n_rows, y, y_stride);
    default:
      return dot_rows_t<kGeneralOffset>(w, n_super, x, x_stride, n_rows, y, y_stride);
  }
}

}  // namespace neon_target

const QuantKernels& quant_kernels_neon() {
  static const QuantKernels k{true,  // Q8_0 codes stay signed: sdot reads every code as a signed byte
                              neon_target::unpack_row_impl,
                              neon_target::quantize_row_impl,
                              neon_target::dot_rows,
                              no_direct_rows,
                              nullptr};
  return k;
}

}  // namespace tandem::kernels
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_neon() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
