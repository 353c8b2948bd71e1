// The bit-level helpers of QuantUnpack (quant_unpack.h) in plain C++: the scalar target's, and the NEON
// targets', whose compiler vectorizes them well enough. A target derives its Ops from PlainOps<Ops> (so that
// each target's copies have names of their own) and adds its code orders.
#pragma once

#include <cstdint>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/fp16.h"

namespace tandem::kernels {

template <class Target>
struct PlainOps {
  static float half_to_float(uint16_t h) { return fp16_to_f32(h); }

  static void nibbles32(const uint8_t* __restrict qs, uint8_t* __restrict u) {
    for (int l = 0; l < 16; ++l) {
      u[l] = qs[l] & 0x0F;
      u[l + 16] = qs[l] >> 4;
    }
  }

  static void fifth_bits32(const uint8_t* qh, uint8_t* __restrict u) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    for (int l = 0; l < 32; ++l) u[l] |= static_cast<uint8_t>(((bits >> l) & 1) << 4);
  }

  // Element order to group order (quant_layout.h), as a transpose of 4-byte units.
  static void interleave_groups(uint8_t* codes) {
    uint8_t tmp[kSuper];
    for (int g = 0; g < kGroups; ++g)
      for (int q = 0; q < 4; ++q) std::memcpy(tmp + 64 * q + 4 * g, codes + 16 * g + 4 * q, 4);
    std::memcpy(codes, tmp, kSuper);
  }

  // Element order to block order (quant_layout.h), as a transpose of 8-byte units.
  static void interleave_blocks(uint8_t* codes) {
    uint8_t tmp[kSuper];
    for (int j = 0; j < 8; ++j)
      for (int q = 0; q < 4; ++q) std::memcpy(tmp + 64 * q + 8 * j, codes + 32 * j + 8 * q, 8);
    std::memcpy(codes, tmp, kSuper);
  }
};

}  // namespace tandem::kernels
