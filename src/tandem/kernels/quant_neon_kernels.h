// The NEON quantized kernels' table and throughput probe, over the tiles (quant_neon_tiles.h) and the
// decoders and direct kernels (quant_neon_direct.h) of one variant: static members of a template over its Isa
// (NeonIsa), which quant_neon.cpp and quant_neon_dot.cpp each instantiate with an Isa of its own after
// <arm_neon.h> under their target options. Their includers include <algorithm>, <cmath> and <cstring> before
// those options, so that the standard library is compiled for the baseline.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_neon_direct.h"
#include "tandem/kernels/quant_neon_tiles.h"

namespace tandem::kernels {

// One NEON variant's kernels (its QuantKernels table: table()), instantiated for its Isa.
template <NeonIsa Isa>
struct NeonKernels {
  static constexpr bool kDotProduct = Isa::kDotProduct;
  using Tiles = NeonTiles<Isa>;
  using Direct = NeonDirect<Isa>;

  // The throughput probe (QuantKernels::dot_probe), with the multiply-adds of dot_rows: four sdot per chain
  // and step, or without the dot-product extension a widening multiply and a pairwise add per half vector.
  static void dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums);

  // This variant's kernel table.
  static const QuantKernels& table();
};

// The members that are not inline are defined out of the class, so that the compiler weighs inlining them
// as it would plain functions and function templates.

template <NeonIsa Isa>
void NeonKernels<Isa>::dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums) {
  int8x16_t uv[4];
  for (int q = 0; q < 4; ++q) uv[q] = vld1q_s8(reinterpret_cast<const int8_t*>(u) + 16 * q);  // codes < 64
  int32x4_t acc[kDotProbeChains];
  for (int32x4_t& a : acc) a = vdupq_n_s32(0);
  for (int64_t i = 0; i < iterations; ++i) {
    // Opaque to the optimizer, so that products of the same operands every step are not computed once,
    // before the loop (the widening multiplies of the form without dot products have no chain).
    for (int8x16_t& v : uv) __asm__("" : "+w"(v));
    for (int c = 0; c < kDotProbeChains; ++c)
      for (int q = 0; q < 4; ++q) {
        const int8x16_t x = vld1q_s8(s + 64 * c + 16 * q);
        if constexpr (kDotProduct) {
          acc[c] = vdotq_s32(acc[c], uv[q], x);
        } else {
          acc[c] = vpadalq_s16(acc[c], vmull_s8(vget_low_s8(uv[q]), vget_low_s8(x)));
          acc[c] = vpadalq_s16(acc[c], vmull_high_s8(uv[q], x));
        }
      }
  }
  for (int c = 0; c < kDotProbeChains; ++c)
    sums[c] = vaddvq_u32(vreinterpretq_u32_s32(acc[c]));  // modulo 2^32
}

template <NeonIsa Isa>
const QuantKernels& NeonKernels<Isa>::table() {
  static const QuantKernels k{true,  // Q8_0 codes stay signed: the kernels read every code as a signed byte
                              false,
                              Direct::unpack_row,
                              Tiles::Unpack::quantize_row_impl,
                              Tiles::dot_rows,
                              Direct::direct_max_rows,
                              Direct::direct_pass_rows,
                              Direct::direct_rows,
                              dot_probe,
                              false};  // prefill: the unpacked path (quant_neon_direct.h)
  return k;
}

}  // namespace tandem::kernels
