// The NEON quantized kernels' tiles, written once and compiled into two translation units: quant_neon.cpp
// (every AArch64 CPU) and quant_neon_dot.cpp (with the dot-product extension, ARMv8.2 sdot; Linux reports it
// as asimddp), each instantiating NeonTiles, NeonDirect (quant_neon_direct.h) and NeonKernels
// (quant_neon_kernels.h) with an Isa of its own (NeonIsa: Isa::kDotProduct), after <arm_neon.h> under its
// target options, so that each copy is compiled for its instruction set under names of its own that the
// linker never folds together. Decode and windows of up to four rows decode the weights' file bytes straight
// into registers, chunk by chunk (the direct kernels, quant_neon_direct.h); wider windows and prefill unpack
// each weight row once per matmul row pass, with the same decoders where a type has one, else with the shared
// plain C++ (quant_unpack.h, vectorized by the compiler). Both apply a weight row to up to kDotTileRows
// activation rows at a time with the same tiles, the codes multiplied as signed bytes, which every unpacked
// code fits (at most 63, or Q8_0's signed codes: signed_q8). A fixed offset (Q4_0, Q5_0, Q6_K) is taken out
// of the codes once per weight chunk, so it costs nothing per row; other offsets (Q4_1, Q5_1, the K-quants'
// mins) add b * sum(q) per group in float. Both variants (with and without sdot) compute the same integer
// sums and then the same float operations, so they give the same bits.
#pragma once

#include <arm_neon.h>

#include <concepts>
#include <cstdint>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_plain_ops.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

// What a NEON variant's Isa says: whether it has the dot-product extension (sdot; the same bits either way).
template <typename Isa>
concept NeonIsa = requires {
  { Isa::kDotProduct } -> std::convertible_to<bool>;
};

// The tiles of one NEON variant, instantiated for its Isa.
template <NeonIsa Isa>
struct NeonTiles {
  // Whether this variant has the dot-product extension (its Isa).
  static constexpr bool kDotProduct = Isa::kDotProduct;

  // The plain C++ helpers of the unpacking (quant_plain_ops.h), in this target's code orders.
  struct Ops : PlainOps<Ops> {
    static constexpr bool kBlockLanes = false;    // the legacy types in block order (quant_layout.h)
    static constexpr bool kK4BlockLanes = false;  // Q4_K and Q5_K in group order
  };
  using Unpack = QuantUnpack<Ops>;

  // Activation rows per tile: four accumulators per row (lane groups 4j..4j+3), 16 of the 32 vector registers
  // at 4 rows, beside one chunk of weight codes and its scales.
  static constexpr int64_t kDotTileRows = 4;

  // How a weight type's offset enters the sums: kOffset > 0, the offset is -kOffset times the scale in every
  // group (Q4_0: 8, Q5_0: 16, Q6_K: 32), so the codes minus kOffset (signed, exact) go into the integer sums
  // and the offset term vanishes; kOffset == 0, no offset (Q8_0's signed codes); kGeneralOffset, b times the
  // scaled code sums, added per group in float.
  static constexpr int kGeneralOffset = -1;

  static constexpr int offset_of(DType type, bool signed_codes) {
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

  // The integer sums of lane groups 4j..4j+3 from chunk j of the four quarters (u) and of the activation
  // codes (xq: the codes of chunk j of quarter 0; the other quarters 64 bytes apart). With the dot-product
  // extension, one sdot per quarter; without it, 8-bit multiplies into 16 bits (each product fits: |u| <=
  // 128, |q| <= 127) added pairwise into 32 bits, which leaves each group's sum in two lanes, then one
  // pairwise add. Both are exact, so both give the same integers.
  static int32x4_t chunk_sums(const int8x16_t* u, const int8_t* xq) {
    if constexpr (kDotProduct) {
      int32x4_t sum = vdupq_n_s32(0);
      for (int q = 0; q < 4; ++q) sum = vdotq_s32(sum, u[q], vld1q_s8(xq + 64 * q));
      return sum;
    } else {
      int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);  // groups 4j, 4j + 1; groups 4j + 2, 4j + 3
      for (int q = 0; q < 4; ++q) {
        const int8x16_t x = vld1q_s8(xq + 64 * q);
        lo = vpadalq_s16(lo, vmull_s8(vget_low_s8(u[q]), vget_low_s8(x)));
        hi = vpadalq_s16(hi, vmull_high_s8(u[q], x));
      }
      return vpaddq_s32(lo, hi);
    }
  }

  // Chunk j (< 4) of one weight super-block in registers: bytes 16j..16j+15 of each quarter (lanes 4j..4j+3,
  // that is lane groups 4j..4j+3: quant_layout.h) and those groups' scales a and offsets b.
  struct Chunk {
    int8x16_t u[4];
    float32x4_t a, b;
  };

  // Every tile's one operation sequence: each row keeps the same four accumulators (one per chunk) and adds
  // the same operations whatever NR is and wherever the chunk came from (an unpacked row or the file's
  // bytes), so its result depends on neither. Source (an UnpackedSource or a decoder of quant_neon_direct.h)
  // gives super-block s (source.super(s)) and its chunks (source.chunk(super, j, chunk)).
  template <int NR, int kOffset, typename Source>
  static void tile(Source& source, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
                   int64_t y_stride);

  // n_rows activation rows against one weight row in tiles of at most kDotTileRows rows, of near-equal sizes
  // (9 rows: 3 + 3 + 3, not 4 + 4 + 1, which would give a tile too few rows to share its decoded chunks).
  template <int kOffset, typename Source>
  static void tile_rows(Source& source, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
                        float* y, int64_t y_stride);

  // An unpacked weight row (UnpackedSuper) as a tile's source.
  struct UnpackedSource {
    const UnpackedSuper* w;
    const UnpackedSuper* super(int64_t s) const { return w + s; }
    static void chunk(const UnpackedSuper* W, int j, Chunk& c) {
      for (int q = 0; q < 4; ++q) c.u[q] = vreinterpretq_s8_u8(vld1q_u8(W->u + 64 * q + 16 * j));
      c.a = vld1q_f32(W->a + 4 * j);
      c.b = vld1q_f32(W->b + 4 * j);
    }
  };

  template <int kOffset>
  static void dot_rows_t(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                         int64_t n_rows, float* y, int64_t y_stride);

  static void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                       int64_t n_rows, DType type, bool signed_codes, float* y, int64_t y_stride);
};

// The members that are not inline are defined out of the class, so that the compiler weighs inlining them
// as it would plain functions and function templates.

template <NeonIsa Isa>
template <int NR, int kOffset, typename Source>
void NeonTiles<Isa>::tile(Source& source, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
                          int64_t y_stride) {
  float32x4_t acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  for (int64_t s = 0; s < n_super; ++s) {
    const auto super = source.super(s);
    for (int j = 0; j < 4; ++j) {
      Chunk c;
      source.chunk(super, j, c);
      if (kOffset > 0)
        for (int8x16_t& u : c.u) u = vsubq_s8(u, vdupq_n_s8(static_cast<int8_t>(kOffset)));
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        const int32x4_t sum = chunk_sums(c.u, X.q + 16 * j);
        acc[r][j] = vfmaq_f32(acc[r][j], vcvtq_f32_s32(sum), vmulq_f32(c.a, vld1q_f32(X.d + 4 * j)));
        if (kOffset == kGeneralOffset) acc[r][j] = vfmaq_f32(acc[r][j], c.b, vld1q_f32(X.bs + 4 * j));
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    y[r * y_stride] = vaddvq_f32(vaddq_f32(vaddq_f32(acc[r][0], acc[r][1]), vaddq_f32(acc[r][2], acc[r][3])));
}

template <NeonIsa Isa>
template <int kOffset, typename Source>
void NeonTiles<Isa>::tile_rows(Source& source, int64_t n_super, const ActSuper* x, int64_t x_stride,
                               int64_t n_rows, float* y, int64_t y_stride) {
  const int64_t tiles = (n_rows + kDotTileRows - 1) / kDotTileRows;
  for (int64_t t = 0, r = 0; t < tiles; ++t) {
    const int64_t nr = (n_rows - r) / (tiles - t);
    const ActSuper* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    switch (nr) {
      case 1:
        tile<1, kOffset>(source, n_super, xr, x_stride, yr, y_stride);
        break;
      case 2:
        tile<2, kOffset>(source, n_super, xr, x_stride, yr, y_stride);
        break;
      case 3:
        tile<3, kOffset>(source, n_super, xr, x_stride, yr, y_stride);
        break;
      default:
        tile<4, kOffset>(source, n_super, xr, x_stride, yr, y_stride);
        break;
    }
    r += nr;
  }
}

template <NeonIsa Isa>
template <int kOffset>
void NeonTiles<Isa>::dot_rows_t(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                                int64_t n_rows, float* y, int64_t y_stride) {
  UnpackedSource source{w};
  tile_rows<kOffset>(source, n_super, x, x_stride, n_rows, y, y_stride);
}

template <NeonIsa Isa>
void NeonTiles<Isa>::dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                              int64_t n_rows, DType type, bool signed_codes, float* y, int64_t y_stride) {
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

}  // namespace tandem::kernels
