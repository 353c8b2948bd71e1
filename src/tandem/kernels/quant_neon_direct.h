// The NEON decoders: weight rows decoded from the file's bytes straight into the chunks that an unpacked
// row's loads give (UnpackedSource), chunk by chunk. They serve the direct kernels
// (QuantKernels::direct_rows: one to four activation rows, the chunks applied by the same tiles as they are
// decoded, never stored) and unpack_row (the chunks stored for wider windows and prefill), so each result
// keeps the bits of the plain unpack_row_impl + dot_rows: the codes are the same integers, and the scales and
// offsets come from the same exact conversions and products (quant_unpack.h). They take the file forms of
// the legacy types (any whole number of 32-element blocks) and of the K-quants; the repacked forms (repack.h)
// are the x86 targets' only.
//
// Chunk j of a legacy super-block is its blocks 2j and 2j + 1: in block order (quant_layout.h) quarter q of a
// block holds its elements 8q..8q+7, which for the 4- and 5-bit types are the low nibbles of code bytes 0..7
// (q = 0) and 8..15 (q = 1), then the high nibbles of the same bytes (q = 2, 3), and for Q8_0 its code bytes
// 8q..8q+7. Chunk j of a K-quant super-block is its elements 64j..64j+63: lane s of quarter q holds elements
// 64j + 16s + 4q + i (i < 4) in group order. Static members of a template over the variant's Isa (NeonIsa,
// quant_neon_tiles.h), beside its tiles, which apply the chunks.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_neon_tiles.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

// One NEON variant's decoders and direct kernels, instantiated for its Isa.
template <NeonIsa Isa>
struct NeonDirect {
  // This variant's tiles (quant_neon_tiles.h): the chunk registers, the unpacking and the row tiles.
  using Tiles = NeonTiles<Isa>;
  using Chunk = Tiles::Chunk;
  using Unpack = Tiles::Unpack;
  static constexpr int kGeneralOffset = Tiles::kGeneralOffset;

  // Bytes 0..7 of a then of b (low_halves), or bytes 8..15 of each (high_halves).
  static uint8x16_t low_halves(uint8x16_t a, uint8x16_t b) {
    return vreinterpretq_u8_u64(vtrn1q_u64(vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b)));
  }
  static uint8x16_t high_halves(uint8x16_t a, uint8x16_t b) {
    return vreinterpretq_u8_u64(vtrn2q_u64(vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b)));
  }

  // 32-bit lanes 0 of a and b, then lanes 1 (zip_low); lanes 2 and 3 the same (zip_high).
  static uint8x16_t zip_low(uint8x16_t a, uint8x16_t b) {
    return vreinterpretq_u8_u32(vzip1q_u32(vreinterpretq_u32_u8(a), vreinterpretq_u32_u8(b)));
  }
  static uint8x16_t zip_high(uint8x16_t a, uint8x16_t b) {
    return vreinterpretq_u8_u32(vzip2q_u32(vreinterpretq_u32_u8(a), vreinterpretq_u32_u8(b)));
  }

  static uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }

  // {h0, h0, h1, h1} from f16 bits to f32 (exact, as half_to_float): the lane groups of two legacy blocks.
  static float32x4_t block_pair(uint16_t h0, uint16_t h1) {
    const uint64_t bits = h0 * 0x0000000000010001ull | h1 * 0x0001000100000000ull;
    return vcvt_f32_f16(vreinterpret_f16_u16(vcreate_u16(bits)));
  }

  // Where a legacy block's fields sit: its f16 scale at 0, then its f16 minimum (Q4_1, Q5_1), its 32 fifth
  // bits (Q5_0, Q5_1) and its codes (16 bytes of nibbles, or Q8_0's 32 signed bytes).
  struct LegacyLayout {
    int bytes;  // of one block
    int min;    // offset of the minimum, or 0 for none (a fixed offset: kOffset)
    int qh;     // offset of the fifth bits, or 0 for none
    int codes;  // offset of the codes
  };

  static constexpr LegacyLayout legacy_layout(DType type) {
    switch (type) {
      case DType::Q4_0:
        return {18, 0, 0, 2};
      case DType::Q4_1:
        return {20, 2, 0, 4};
      case DType::Q5_0:
        return {22, 0, 2, 6};
      case DType::Q5_1:
        return {24, 2, 4, 8};
      default:
        return {34, 0, 0, 2};  // Q8_0
    }
  }

  // A legacy row's super-blocks of 8 blocks. A partial last one (a width that is not a multiple of 256) is
  // read from a copy padded with zero blocks, whose codes and scales are zero as the unpacked form's tail is.
  template <DType kType>
  class LegacyDecoder {
   public:
    static constexpr LegacyLayout kLayout = legacy_layout(kType);
    static constexpr int64_t kSuperBytes = 8 * kLayout.bytes;

    explicit LegacyDecoder(int64_t k) : whole_(k / kSuper), tail_bytes_((k % kSuper) / 32 * kLayout.bytes) {
      if (tail_bytes_ > 0) std::memset(tail_, 0, sizeof(tail_));
    }

    void set_row(const uint8_t* row) {
      row_ = row;
      if (tail_bytes_ > 0) std::memcpy(tail_, row + whole_ * kSuperBytes, static_cast<size_t>(tail_bytes_));
    }

    const uint8_t* super(int64_t s) const { return s < whole_ ? row_ + s * kSuperBytes : tail_; }

    static void chunk(const uint8_t* p, int j, Chunk& c) {
      const uint8_t* b0 = p + 2 * j * kLayout.bytes;
      const uint8_t* b1 = b0 + kLayout.bytes;
      c.a = block_pair(load_u16(b0), load_u16(b1));
      c.b = kLayout.min != 0 ? block_pair(load_u16(b0 + kLayout.min), load_u16(b1 + kLayout.min))
                             : vdupq_n_f32(0.0f);
      if constexpr (kType == DType::Q8_0) {
        const uint8x16_t lo0 = vld1q_u8(b0 + kLayout.codes), hi0 = vld1q_u8(b0 + kLayout.codes + 16);
        const uint8x16_t lo1 = vld1q_u8(b1 + kLayout.codes), hi1 = vld1q_u8(b1 + kLayout.codes + 16);
        c.u[0] = vreinterpretq_s8_u8(low_halves(lo0, lo1));
        c.u[1] = vreinterpretq_s8_u8(high_halves(lo0, lo1));
        c.u[2] = vreinterpretq_s8_u8(low_halves(hi0, hi1));
        c.u[3] = vreinterpretq_s8_u8(high_halves(hi0, hi1));
      } else {
        const uint8x16_t n0 = vld1q_u8(b0 + kLayout.codes), n1 = vld1q_u8(b1 + kLayout.codes);
        const uint8x16_t lo = low_halves(n0, n1), hi = high_halves(n0, n1), mask = vdupq_n_u8(0x0F);
        uint8x16_t u[4] = {vandq_u8(lo, mask), vandq_u8(hi, mask), vshrq_n_u8(lo, 4), vshrq_n_u8(hi, 4)};
        if constexpr (kLayout.qh != 0) {
          // Fifth bit of element 8q + i: bit i of byte q of the block's qh (block 0 in bytes 0..3 of `bits`,
          // block 1 in bytes 4..7), spread to byte i (block 1: 8 + i) of quarter q and set as 16.
          uint32_t h0, h1;
          std::memcpy(&h0, b0 + kLayout.qh, 4);
          std::memcpy(&h1, b1 + kLayout.qh, 4);
          const uint8x16_t bits = vreinterpretq_u8_u64(vdupq_n_u64(h0 | static_cast<uint64_t>(h1) << 32));
          const uint8x16_t bit_of_lane = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
          const uint8x16_t sixteen = vdupq_n_u8(16);
          for (int q = 0; q < 4; ++q) {
            const uint8x16_t index =
                vcombine_u8(vdup_n_u8(static_cast<uint8_t>(q)), vdup_n_u8(static_cast<uint8_t>(4 + q)));
            const uint8x16_t spread = vqtbl1q_u8(bits, index);
            u[q] = vorrq_u8(u[q], vandq_u8(vtstq_u8(spread, bit_of_lane), sixteen));
          }
        }
        for (int q = 0; q < 4; ++q) c.u[q] = vreinterpretq_s8_u8(u[q]);
      }
    }

   private:
    const uint8_t* row_ = nullptr;
    int64_t whole_, tail_bytes_;
    alignas(16) uint8_t tail_[kSuperBytes];  // zeroed where the row has a partial super-block
  };

  // A K-quant super-block's codes and its 16 lane groups' scales and offsets, decoded once per super-block.
  struct KSuper {
    const uint8_t* codes;  // qs; Q6_K: ql
    const uint8_t* high;   // Q3_K: hmask; Q5_K: qh (fifth bits); Q6_K: qh (two high bits); else unused
    float a[kGroups], b[kGroups];
  };

  // Bits (x >> shift) & (mask >> 4), moved to bit 4 up: (x << (4 - shift)) & mask, a negative count shifting
  // right.
  static uint8x16_t high_bits(uint8x16_t x, int shift, uint8_t mask) {
    return vandq_u8(vshlq_u8(x, vdupq_n_s8(static_cast<int8_t>(4 - shift))), vdupq_n_u8(mask));
  }

  // Q4_K and Q5_K. Chunk j is the 32 code bytes qs[32j..32j+31], C0 and C1: elements 64j + m take the low
  // nibble of byte m (m < 32) or the high nibble of byte m - 32, so lane s of quarter q takes 32-bit lane q
  // of C0 (s = 0, 2) or C1 (s = 1, 3), low nibbles for s < 2. Q5_K adds bit 2j (low nibbles) or 2j + 1 (high)
  // of qh[m % 32] as 16.
  template <DType kType>
  struct K4Decoder {
    const uint8_t* row = nullptr;
    void set_row(const uint8_t* r) { row = r; }
    KSuper super(int64_t s) const {
      KSuper S;
      if constexpr (kType == DType::Q5_K) {
        const auto& b = reinterpret_cast<const BlockQ5_K*>(row)[s];
        Unpack::k4_groups(b.d, b.dmin, b.scales, S.a, S.b);
        S.codes = b.qs;
        S.high = b.qh;
      } else {
        const auto& b = reinterpret_cast<const BlockQ4_K*>(row)[s];
        Unpack::k4_groups(b.d, b.dmin, b.scales, S.a, S.b);
        S.codes = b.qs;
        S.high = nullptr;
      }
      return S;
    }
    static void chunk(const KSuper& S, int j, Chunk& c) {
      const uint8x16_t c0 = vld1q_u8(S.codes + 32 * j), c1 = vld1q_u8(S.codes + 32 * j + 16);
      const uint8x16_t z0 = zip_low(c0, c1), z1 = zip_high(c0, c1), mask = vdupq_n_u8(0x0F);
      uint8x16_t lo0 = vandq_u8(z0, mask), hi0 = vshrq_n_u8(z0, 4);
      uint8x16_t lo1 = vandq_u8(z1, mask), hi1 = vshrq_n_u8(z1, 4);
      if constexpr (kType == DType::Q5_K) {
        const uint8x16_t h0 = vld1q_u8(S.high), h1 = vld1q_u8(S.high + 16);
        const uint8x16_t hz0 = zip_low(h0, h1), hz1 = zip_high(h0, h1);
        lo0 = vorrq_u8(lo0, high_bits(hz0, 2 * j, 0x10));
        hi0 = vorrq_u8(hi0, high_bits(hz0, 2 * j + 1, 0x10));
        lo1 = vorrq_u8(lo1, high_bits(hz1, 2 * j, 0x10));
        hi1 = vorrq_u8(hi1, high_bits(hz1, 2 * j + 1, 0x10));
      }
      c.u[0] = vreinterpretq_s8_u8(low_halves(lo0, hi0));
      c.u[1] = vreinterpretq_s8_u8(high_halves(lo0, hi0));
      c.u[2] = vreinterpretq_s8_u8(low_halves(lo1, hi1));
      c.u[3] = vreinterpretq_s8_u8(high_halves(lo1, hi1));
      c.a = vld1q_f32(S.a + 4 * j);
      c.b = vld1q_f32(S.b + 4 * j);
    }
  };

  // Quarter q of a chunk from its four lanes built whole (v_s holding lane s of quarters 0..3 in its 32-bit
  // lanes 0..3): a 4 x 4 transpose of 32-bit units.
  static void transpose_lanes(uint8x16_t v0, uint8x16_t v1, uint8x16_t v2, uint8x16_t v3, Chunk& c) {
    const uint32x4_t t0 = vtrn1q_u32(vreinterpretq_u32_u8(v0), vreinterpretq_u32_u8(v1));
    const uint32x4_t t1 = vtrn2q_u32(vreinterpretq_u32_u8(v0), vreinterpretq_u32_u8(v1));
    const uint32x4_t t2 = vtrn1q_u32(vreinterpretq_u32_u8(v2), vreinterpretq_u32_u8(v3));
    const uint32x4_t t3 = vtrn2q_u32(vreinterpretq_u32_u8(v2), vreinterpretq_u32_u8(v3));
    c.u[0] = vreinterpretq_s8_u64(vtrn1q_u64(vreinterpretq_u64_u32(t0), vreinterpretq_u64_u32(t2)));
    c.u[1] = vreinterpretq_s8_u64(vtrn1q_u64(vreinterpretq_u64_u32(t1), vreinterpretq_u64_u32(t3)));
    c.u[2] = vreinterpretq_s8_u64(vtrn2q_u64(vreinterpretq_u64_u32(t0), vreinterpretq_u64_u32(t2)));
    c.u[3] = vreinterpretq_s8_u64(vtrn2q_u64(vreinterpretq_u64_u32(t1), vreinterpretq_u64_u32(t3)));
  }

  // x >> shift, a negative count shifting left.
  static uint8x16_t shift_right(uint8x16_t x, int shift) {
    return vshlq_u8(x, vdupq_n_s8(static_cast<int8_t>(-shift)));
  }

  // Q2_K and Q3_K. Chunk j = 2h + t is elements 128h + 64t + m: bits 2g and 2g + 1 of qs[32h + m % 32] with g
  // = 2t
  // + m / 32, and for Q3_K bit 4h + g of hmask[m % 32] as 4. Lane s of quarter q (m = 16s + 4q + i) takes
  // byte 4q
  // + i of qs[32h..32h+15] (s = 0, 2) or of the next 16 bytes (s = 1, 3), at g = 2t (s < 2) or 2t + 1; each
  // lane is built whole, then transposed as Q6_K's.
  template <DType kType>
  struct K23Decoder {
    const uint8_t* row = nullptr;
    void set_row(const uint8_t* r) { row = r; }
    KSuper super(int64_t s) const {
      KSuper S;
      if constexpr (kType == DType::Q3_K) {
        const auto& b = reinterpret_cast<const BlockQ3_K*>(row)[s];
        Unpack::k3_groups(b.d, b.scales, S.a, S.b);
        S.codes = b.qs;
        S.high = b.hmask;
      } else {
        const auto& b = reinterpret_cast<const BlockQ2_K*>(row)[s];
        Unpack::k2_groups(b.d, b.dmin, b.scales, S.a, S.b);
        S.codes = b.qs;
        S.high = nullptr;
      }
      return S;
    }
    static void chunk(const KSuper& S, int j, Chunk& c) {
      const int h = j / 2, t = j % 2;
      const uint8x16_t qa = vld1q_u8(S.codes + 32 * h), qb = vld1q_u8(S.codes + 32 * h + 16);
      const uint8x16_t three = vdupq_n_u8(3);
      uint8x16_t v0 = vandq_u8(shift_right(qa, 4 * t), three), v1 = vandq_u8(shift_right(qb, 4 * t), three);
      uint8x16_t v2 = vandq_u8(shift_right(qa, 4 * t + 2), three),
                 v3 = vandq_u8(shift_right(qb, 4 * t + 2), three);
      if constexpr (kType == DType::Q3_K) {
        const uint8x16_t ha = vld1q_u8(S.high), hb = vld1q_u8(S.high + 16), four = vdupq_n_u8(4);
        const int bit = 4 * h + 2 * t;  // of g = 2t; g = 2t + 1 the next
        v0 = vorrq_u8(v0, vandq_u8(shift_right(ha, bit - 2), four));
        v1 = vorrq_u8(v1, vandq_u8(shift_right(hb, bit - 2), four));
        v2 = vorrq_u8(v2, vandq_u8(shift_right(ha, bit - 1), four));
        v3 = vorrq_u8(v3, vandq_u8(shift_right(hb, bit - 1), four));
      }
      transpose_lanes(v0, v1, v2, v3, c);
      c.a = vld1q_f32(S.a + 4 * j);
      c.b = vld1q_f32(S.b + 4 * j);
    }
  };

  // Q6_K. Chunk j = 2h + t is elements 128h + 64t + m: the low (t = 0) or high (t = 1) nibbles of ql[64h + m]
  // (m < 32) or ql[64h + m] (m >= 32, the next 32 bytes), with bits 4t (m < 32) or 4t + 2 of qh[32h + m % 32]
  // as their two high bits. Lane s of the chunk's quarters is built whole (elements 16s + 4q + i for all q),
  // then the four are transposed in 32-bit units.
  struct K6Decoder {
    const uint8_t* row = nullptr;
    void set_row(const uint8_t* r) { row = r; }
    KSuper super(int64_t s) const {
      const auto& b = reinterpret_cast<const BlockQ6_K*>(row)[s];
      KSuper S;
      Unpack::k6_scales(b.d, b.scales,
                        S.a);  // S.b unused: the fixed offset, -32a, is taken out of the codes (kOffset)
      S.codes = b.ql;
      S.high = b.qh;
      return S;
    }
    static void chunk(const KSuper& S, int j, Chunk& c) {
      const int h = j / 2, t = j % 2;
      const uint8_t* ql = S.codes + 64 * h;
      const uint8x16_t qa = vld1q_u8(S.high + 32 * h), qb = vld1q_u8(S.high + 32 * h + 16);
      const auto nibbles = [t](uint8x16_t v) {
        return t == 0 ? vandq_u8(v, vdupq_n_u8(0x0F)) : vshrq_n_u8(v, 4);
      };
      const uint8x16_t v0 = vorrq_u8(nibbles(vld1q_u8(ql)), high_bits(qa, 4 * t, 0x30));
      const uint8x16_t v1 = vorrq_u8(nibbles(vld1q_u8(ql + 16)), high_bits(qb, 4 * t, 0x30));
      const uint8x16_t v2 = vorrq_u8(nibbles(vld1q_u8(ql + 32)), high_bits(qa, 4 * t + 2, 0x30));
      const uint8x16_t v3 = vorrq_u8(nibbles(vld1q_u8(ql + 48)), high_bits(qb, 4 * t + 2, 0x30));
      transpose_lanes(v0, v1, v2, v3, c);
      c.a = vld1q_f32(S.a + 4 * j);
      c.b = vdupq_n_f32(0.0f);
    }
  };

  // The most activation rows the direct kernels take in one call: one tile. Wider windows and prefill take
  // the unpacked path (QuantKernels::direct_prefill), whose rows unpack_row decodes with the same decoders
  // once for all tiles: a direct kernel would decode every chunk again for each tile of four rows, and for
  // the K-quants also their scales. Instructions per weight super-block and matmul (k = 2048, one thread,
  // counted under emulation with the dot-product extension; not timed, for want of an ARM machine), the
  // direct kernels / the unpacked path through these decoders / the unpacked path through the plain C++
  // unpack (before them), at one row: Q4_0 162 / 235 / 439, Q8_0 144 / 214 / 374, Q5_0 241 / 316 / 658, Q2_K
  // 210 / 285 / 549, Q3_K 312 / 385 / 695; Q4_0 at 4 rows 399 direct, at 16 rows 1528 / 1730 unpacked through
  // the decoders / the plain unpack. Counted when these kernels were first written, the direct kernels cost
  // more than the decoders' unpack at 8 rows for Q6_K (912 / 802) and at 16 rows for Q4_0 (1396 / 1368).
  static constexpr int64_t kDirectRows = Tiles::kDotTileRows;

  // The decoder of a type's file form and the fixed offset its tiles take out (offset_of), handed to fn as
  // template arguments; false for the types without one (the float types).
  template <typename Fn>
  static bool with_decoder(DType type, int64_t k, Fn&& fn);

  // Whether a row of k elements of this type and form has a decoder: the file form, with Q8_0's codes signed,
  // at any whole number of 32-element blocks for the legacy types and of super-blocks for the K-quants.
  static bool decodes(DType type, WeightForm form, int64_t k, bool signed_q8) {
    if (form != WeightForm::kFile || (type == DType::Q8_0 && !signed_q8)) return false;
    switch (type) {
      case DType::Q4_0:
      case DType::Q4_1:
      case DType::Q5_0:
      case DType::Q5_1:
      case DType::Q8_0:
        return k % 32 == 0;
      case DType::Q2_K:
      case DType::Q3_K:
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K:
        return k % kSuper == 0;
      default:
        return false;
    }
  }

  static int64_t direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8);

  static int64_t direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8);

  // QuantKernels::unpack_row: the decoders' chunks stored as they are, with the offsets the plain unpack
  // gives (a fixed one as -kOffset * a, exact; Q8_0's signed codes 0), so the form is bit-identical to
  // unpack_row_impl's; a partial last super-block, and the rows without a decoder, through unpack_row_impl.
  static void unpack_row(DType type, WeightForm form, const uint8_t* row, int64_t k, bool signed_q8,
                         UnpackedSuper* out);

  template <int kOffset, typename Decoder>
  static void direct_rows_t(Decoder& decoder, const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k,
                            const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride);

  static void direct_rows(DType type, WeightForm /*form: the file's only, direct_max_rows*/, const uint8_t* w,
                          int64_t row_bytes, int64_t n_out, int64_t k, const ActSuper* x, int64_t x_stride,
                          int64_t n_rows, float* y, int64_t y_stride, PrefetchReach /*reach: one distance*/);
};

// The members that are not inline are defined out of the class, so that the compiler weighs inlining them
// as it would plain functions and function templates.

template <NeonIsa Isa>
template <typename Fn>
bool NeonDirect<Isa>::with_decoder(DType type, int64_t k, Fn&& fn) {
  switch (type) {
    case DType::Q4_0: {
      LegacyDecoder<DType::Q4_0> d(k);
      fn.template operator()<8>(d);
      return true;
    }
    case DType::Q4_1: {
      LegacyDecoder<DType::Q4_1> d(k);
      fn.template operator()<kGeneralOffset>(d);
      return true;
    }
    case DType::Q5_0: {
      LegacyDecoder<DType::Q5_0> d(k);
      fn.template operator()<16>(d);
      return true;
    }
    case DType::Q5_1: {
      LegacyDecoder<DType::Q5_1> d(k);
      fn.template operator()<kGeneralOffset>(d);
      return true;
    }
    case DType::Q8_0: {
      LegacyDecoder<DType::Q8_0> d(k);
      fn.template operator()<0>(d);
      return true;
    }
    case DType::Q4_K: {
      K4Decoder<DType::Q4_K> d;
      fn.template operator()<kGeneralOffset>(d);
      return true;
    }
    case DType::Q5_K: {
      K4Decoder<DType::Q5_K> d;
      fn.template operator()<kGeneralOffset>(d);
      return true;
    }
    case DType::Q6_K: {
      K6Decoder d;
      fn.template operator()<32>(d);
      return true;
    }
    case DType::Q2_K: {
      K23Decoder<DType::Q2_K> d;
      fn.template operator()<kGeneralOffset>(d);
      return true;
    }
    case DType::Q3_K: {
      K23Decoder<DType::Q3_K> d;
      fn.template operator()<kGeneralOffset>(d);
      return true;
    }
    default:
      return false;
  }
}

template <NeonIsa Isa>
int64_t NeonDirect<Isa>::direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  return decodes(type, form, k, signed_q8) ? kDirectRows : 0;
}

template <NeonIsa Isa>
int64_t NeonDirect<Isa>::direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  return direct_max_rows(type, form, k, signed_q8);
}

template <NeonIsa Isa>
void NeonDirect<Isa>::unpack_row(DType type, WeightForm form, const uint8_t* row, int64_t k, bool signed_q8,
                                 UnpackedSuper* out) {
  const int64_t whole = k / kSuper;
  const auto unpack = [&]<int kOffset>(auto& decoder) {
    decoder.set_row(row);
    for (int64_t s = 0; s < whole; ++s) {
      const auto super = decoder.super(s);
      UnpackedSuper& U = out[s];
      for (int j = 0; j < 4; ++j) {
        Chunk c;
        decoder.chunk(super, j, c);
        for (int q = 0; q < 4; ++q) vst1q_s8(reinterpret_cast<int8_t*>(U.u) + 64 * q + 16 * j, c.u[q]);
        vst1q_f32(U.a + 4 * j, c.a);
        if (kOffset > 0) c.b = vmulq_n_f32(c.a, -static_cast<float>(kOffset));
        vst1q_f32(U.b + 4 * j, c.b);
      }
    }
  };
  if (!decodes(type, form, k, signed_q8) || !with_decoder(type, whole * kSuper, unpack))
    return Unpack::unpack_row_impl(type, form, row, k, signed_q8, out);
  if (k % kSuper != 0)
    Unpack::unpack_file_row(type, row + whole * static_cast<int64_t>(row_bytes(type, kSuper)), k % kSuper,
                            signed_q8, out + whole);
}

template <NeonIsa Isa>
template <int kOffset, typename Decoder>
void NeonDirect<Isa>::direct_rows_t(Decoder& decoder, const uint8_t* w, int64_t row_bytes, int64_t n_out,
                                    int64_t k, const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                                    int64_t y_stride) {
  const int64_t n_super = super_count(k);
  for (int64_t o = 0; o < n_out; ++o) {
    decoder.set_row(w + o * row_bytes);
    Tiles::template tile_rows<kOffset>(decoder, n_super, x, x_stride, n_rows, y + o, y_stride);
  }
}

template <NeonIsa Isa>
void NeonDirect<Isa>::direct_rows(DType type, WeightForm /*form: the file's only, direct_max_rows*/,
                                  const uint8_t* w, int64_t row_bytes, int64_t n_out, int64_t k,
                                  const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                                  int64_t y_stride, PrefetchReach /*reach: one distance*/) {
  with_decoder(type, k, [&]<int kOffset>(auto& decoder) {
    direct_rows_t<kOffset>(decoder, w, row_bytes, n_out, k, x, x_stride, n_rows, y, y_stride);
  });
}

}  // namespace tandem::kernels
