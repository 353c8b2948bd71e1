// K-quant super-blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) straight from the file bytes into the group-interleaved
// form of quant_layout.h, in registers (SuperRegs), bit-identical to unpack_row_impl (the same codes, and
// scales computed by the same rounded float operations). Static members of a template over the variant's Isa
// (Avx512Isa, quant_regs_avx512.h), which each AVX-512 variant instantiates inside its `#pragma GCC target`
// region.
//
// In these layouts the 16 elements of a group always lie on 16 consecutive bytes of each bit plane (a nibble
// plane, a plane of high bits), so lane g of quarter q (elements 16g + 4q..+3) is one dword of each plane, at
// a dword index that depends only on g, plus q. A dword permute per plane gathers the 16 lanes of a quarter,
// and a per-lane shift or rotate then brings each group's bits of that plane to their place in the code. This
// avoids building codes in element order and transposing them (interleave_groups), which costs more shuffles.
// Vector permutes only, no VBMI byte permutes (every AVX-512 VNNI machine runs them), but for the Q4_K and
// Q5_K scales in the VBMI variant (k4_scales).
#pragma once

#include <immintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/quant_regs_avx512.h"
#include "tandem/tensor/blocks.h"

namespace tandem::kernels {

template <Avx512Isa Isa>
struct Avx512KQuantLoaders : Avx512Regs<Isa> {
  using Base = Avx512Regs<Isa>;
  using Base::broadcast_once;
  using Base::half_to_float;
  using Base::kVbmi;
  using Base::load_once;
  using typename Base::SuperRegs;

  // Index vector {base[g] + q}: the same lane pattern shifted to quarter q.
  static __m512i quarter_index(__m512i base, int q) { return _mm512_add_epi32(base, _mm512_set1_epi32(q)); }

  // The repacked Q3_K and Q5_K keep one bit of each code in a 32-byte plane (repack.h): that of quarter q of
  // position p at bit q + 4 (p / 32) of byte p % 32. With the plane loaded into both halves of a vector, a
  // dword rotate left by kTo - kQ (positions below 32) or kTo - 4 - kQ (the others), mod 32, brings quarter
  // kQ's bit of every position to bit kTo of its byte; the caller masks the other bits.
  template <int kQ, int kTo>
  static __m512i plane_bit(__m512i plane) {
    // The counts as one constant vector (a blend of two broadcasts was computed in the loop, per quarter).
    constexpr int kLo = (kTo - kQ) & 31, kHi = (kTo - 4 - kQ) & 31;
    return _mm512_rolv_epi32(plane, _mm512_setr_epi32(kLo, kLo, kLo, kLo, kLo, kLo, kLo, kLo, kHi, kHi, kHi,
                                                      kHi, kHi, kHi, kHi, kHi));
  }

  // Scale a and offset b of the 16 groups of a Q4_K or Q5_K super-block, from its first 16 bytes (d, dmin and
  // the 12 bytes of packed 6-bit scales and mins): a = d * scale, b = -(dmin * min), each repeated for the
  // two groups of its 32-element block. The 8 scales and 8 mins are decoded side by side in one vector of
  // dwords from the 12 scale bytes sc[i] (header byte 4 + i), 128-bit lane k holding the scales of blocks 2k
  // and 2k + 1 and then their mins, so that an in-lane unpack repeats each for its two groups; with VBMI,
  // byte permutes take each lane's header byte straight from the header. (The 8 scales in lanes 0..7 and the
  // mins in 8..15, spread to their groups by two cross-lane permutes, from dwords widened out of the header,
  // took a little longer; performance.md, tried and dropped.)
  static void k4_scales(const uint8_t* block, SuperRegs& s) {
    const __m128i hdr = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
    const __m512i low_shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 0, 0, 4, 4);
    const __m512i low_mask =
        _mm512_setr_epi32(63, 63, 63, 63, 63, 63, 63, 63, 15, 15, 15, 15, 15, 15, 15, 15);
    __m512i low_bytes, high_bytes;
    if constexpr (kVbmi) {
      // Each dword lane's header byte by a byte permute, the lane's other bytes zeroed.
      const __m512i hdr512 = _mm512_castsi128_si512(hdr);
      const __m512i low_idx = _mm512_setr_epi32(4, 5, 8, 9, 6, 7, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
      const __m512i high_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 5, 8, 9, 6, 7, 10, 11);
      low_bytes = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, low_idx, hdr512);
      high_bytes = _mm512_maskz_permutexvar_epi8(0x1111111100000000ull, high_idx, hdr512);
    } else {
      const __m512i bytes = _mm512_cvtepu8_epi32(hdr);
      low_bytes = _mm512_permutexvar_epi32(
          _mm512_setr_epi32(4, 5, 8, 9, 6, 7, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15), bytes);
      high_bytes = _mm512_maskz_permutexvar_epi32(
          0xFF00, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 5, 8, 9, 6, 7, 10, 11), bytes);
    }
    // Low bits: blocks j < 4 take sc[j] & 63 (scale) and sc[j + 4] & 63 (min); blocks j >= 4 take sc[j + 4] &
    // 15 (scale) and sc[j + 4] >> 4 (min).
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(low_bytes, low_shift), low_mask);
    // High two bits of blocks j >= 4: the top bits of sc[j - 4] (scale) and of sc[j] (min), as bits 4..5:
    // low | ((high >> 2) & 0x30).
    const __m512i sm =
        _mm512_ternarylogic_epi32(low, _mm512_srli_epi32(high_bytes, 2), _mm512_set1_epi32(0x30), 0xF8);
    // Times d (the scales, lanes 0 and 1 of each 128-bit lane) or dmin (the mins, lanes 2 and 3): the
    // products d * scale and dmin * min, rounded once each; then each repeated for its two groups. Negation
    // flips the sign bit only, as the scalar unary minus.
    const __m512 dm = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1),
                                            _mm512_castps128_ps512(_mm_cvtph_ps(hdr)));
    const __m512 prod = _mm512_mul_ps(_mm512_cvtepi32_ps(sm), dm);
    s.a = _mm512_unpacklo_ps(prod, prod);
    s.b = _mm512_xor_ps(_mm512_unpackhi_ps(prod, prod), _mm512_set1_ps(-0.0f));
  }

  // Q4_K and Q5_K codes. Element 64c + 32n + l is nibble n of qs[32c + l], so group g = 4c + 2n + l / 16
  // reads qs dword 8 (g / 4) + 4 (g % 2) + q, nibble (g / 2) % 2. For Q5_K its fifth bit is bit (g / 2) of
  // qh[l], qh dword 4 (g % 2) + q, rotated to bit 4 of its byte (rotating a dword by 4 - c moves bit c of
  // every byte to bit 4 of the same byte, for c < 8).
  template <bool kFive>
  static void load_k4_super(const uint8_t* blk, SuperRegs& s) {
    using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
    const __m512i qs_idx = _mm512_setr_epi32(0, 4, 0, 4, 8, 12, 8, 12, 16, 20, 16, 20, 24, 28, 24, 28);
    const __m512i qs_shift = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
    const __m512i qh_idx = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m512i qh_rot = _mm512_setr_epi32(4, 4, 3, 3, 2, 2, 1, 1, 0, 0, 31, 31, 30, 30, 29, 29);
    const __m512i nib = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
    const uint8_t* qs = blk + offsetof(Block, qs);
    const __m512i q0 = load_once(qs), q1 = load_once(qs + 64);
    __m512i qh = _mm512_setzero_si512();
    if constexpr (kFive) qh = broadcast_once(blk + offsetof(BlockQ5_K, qh));
    for (int q = 0; q < 4; ++q) {
      const __m512i lo =
          _mm512_srlv_epi32(_mm512_permutex2var_epi32(q0, quarter_index(qs_idx, q), q1), qs_shift);
      if constexpr (kFive) {
        const __m512i hb = _mm512_rolv_epi32(_mm512_permutexvar_epi32(quarter_index(qh_idx, q), qh), qh_rot);
        // (lo & 0x0F) | (hb & 0x10)
        s.u[q] = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, nib), hb, fifth, 0xF8);
      } else {
        s.u[q] = _mm512_and_si512(lo, nib);
      }
    }
    k4_scales(blk, s);
  }

  static void load_q4_k_super(const uint8_t* blk, SuperRegs& s) { load_k4_super<false>(blk, s); }

  static void load_q5_k_super(const uint8_t* blk, SuperRegs& s) { load_k4_super<true>(blk, s); }

  // The four quarters of two 64-byte nibble planes (the repacked forms' code planes): the low nibbles of lo
  // and hi are quarters 0 and 1, their high ones quarters 2 and 3.
  static void nibble_quarters(__m512i lo, __m512i hi, __m512i* u) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    u[0] = _mm512_and_si512(lo, nib);
    u[1] = _mm512_and_si512(hi, nib);
    u[2] = _mm512_and_si512(_mm512_srli_epi16(lo, 4), nib);
    u[3] = _mm512_and_si512(_mm512_srli_epi16(hi, 4), nib);
  }

  // Repacked Q4_K (repack.h): the two code planes already in group order (nibble_quarters).
  static void load_q4_kx_super(const uint8_t* blk, SuperRegs& s) {
    const uint8_t* qs = blk + offsetof(BlockQ4_K, qs);
    nibble_quarters(load_once(qs), load_once(qs + 64), s.u);
    k4_scales(blk, s);
  }

  // Repacked Q5_K (repack.h): the nibble planes of repacked Q4_K at byte 48 and the fifth bits in a 32-byte
  // plane at byte 16 (plane_bit).
  template <int kQ>
  static __m512i q5_kx_quarter(__m512i low, __m512i hm) {
    // (low & 0x0F) | (hb & 0x10)
    return _mm512_ternarylogic_epi32(_mm512_and_si512(low, _mm512_set1_epi8(0x0F)), plane_bit<kQ, 4>(hm),
                                     _mm512_set1_epi8(0x10), 0xF8);
  }

  // The four 5-bit quarters of two nibble planes (as nibble_quarters) and the 32-byte fifth-bit plane hm,
  // repeated in both halves.
  static void fifth_quarters(__m512i lo, __m512i hi, __m512i hm, __m512i* u) {
    u[0] = q5_kx_quarter<0>(lo, hm);
    u[1] = q5_kx_quarter<1>(hi, hm);
    u[2] = q5_kx_quarter<2>(_mm512_srli_epi16(lo, 4), hm);
    u[3] = q5_kx_quarter<3>(_mm512_srli_epi16(hi, 4), hm);
  }

  static void load_q5_kx_super(const uint8_t* blk, SuperRegs& s) {
    const uint8_t* qs = blk + 48;
    fifth_quarters(load_once(qs), load_once(qs + 64), broadcast_once(blk + 16), s.u);
    k4_scales(blk, s);
  }

  // Scales of a Q6_K super-block (signed bytes): a = d * scale, b = -32 * a.
  static void q6_k_scales(const uint8_t* blk, SuperRegs& s) {
    uint16_t dh;
    std::memcpy(&dh, blk + offsetof(BlockQ6_K, d), 2);
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ6_K, scales)))));
    s.a = _mm512_mul_ps(_mm512_set1_ps(half_to_float(dh)), sc);
    s.b = _mm512_mul_ps(_mm512_set1_ps(-32.0f), s.a);
  }

  // Repacked Q6_K (repack.h): the low nibble planes as repacked Q4_K's, and the high bits of quarter q at
  // bits 2q, 2q + 1 of one plane, shifted to bits 4..5 (16-bit shifts: the bits they carry across bytes are
  // masked).
  static void load_q6_kx_super(const uint8_t* blk, SuperRegs& s) {
    const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const uint8_t* ql = blk + offsetof(BlockQ6_K, ql);
    const __m512i a = load_once(ql), b = load_once(ql + 64), h = load_once(blk + offsetof(BlockQ6_K, qh));
    const __m512i low[4] = {a, b, _mm512_srli_epi16(a, 4), _mm512_srli_epi16(b, 4)};
    const __m512i high[4] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2), h, _mm512_srli_epi16(h, 2)};
    // (low & 0x0F) | (high & 0x30)
    for (int q = 0; q < 4; ++q)
      s.u[q] = _mm512_ternarylogic_epi32(_mm512_and_si512(low[q], nib), high[q], top, 0xF8);
    q6_k_scales(blk, s);
  }

  // Q6_K. Element 128h + 32c + l takes nibble c / 2 of ql[64h + 32 (c % 2) + l] and bits 2c..2c+1 of
  // qh[32h + l] as bits 4..5. Group g = 8h + 2c + l / 16 thus reads ql dword 16 (g / 8) + 8 ((g / 2) % 2) +
  // 4 (g % 2) + q, nibble (g / 4) % 2, and qh dword 8 (g / 8) + 4 (g % 2) + q, rotated by 4 - 2c (mod 32) to
  // bring bits 2c..2c+1 of every byte to bits 4..5. Scales are signed bytes: a = d * scale, b = -32 * a.
  static void load_q6_k_super(const uint8_t* blk, SuperRegs& s) {
    const __m512i ql_idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28);
    const __m512i ql_shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    const __m512i qh_idx = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12);
    const __m512i qh_rot = _mm512_setr_epi32(4, 4, 2, 2, 0, 0, 30, 30, 4, 4, 2, 2, 0, 0, 30, 30);
    const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const uint8_t* ql = blk + offsetof(BlockQ6_K, ql);
    const __m512i l0 = load_once(ql), l1 = load_once(ql + 64), qh = load_once(blk + offsetof(BlockQ6_K, qh));
    for (int q = 0; q < 4; ++q) {
      const __m512i lo =
          _mm512_srlv_epi32(_mm512_permutex2var_epi32(l0, quarter_index(ql_idx, q), l1), ql_shift);
      const __m512i hb = _mm512_rolv_epi32(_mm512_permutexvar_epi32(quarter_index(qh_idx, q), qh), qh_rot);
      // (lo & 0x0F) | (hb & 0x30)
      s.u[q] = _mm512_ternarylogic_epi32(_mm512_and_si512(lo, nib), hb, top, 0xF8);
    }
    q6_k_scales(blk, s);
  }

  // Q2_K and Q3_K share their 2-bit planes: element 128h + 32c + l takes bits 2c..2c+1 of qs[32h + l], so
  // group g = 8h + 2c + l / 16 reads qs dword 8 (g / 8) + 4 (g % 2) + q, shifted right by 2c = 2 ((g % 8) /
  // 2).
  static __m512i k2_low_bits(__m512i qs, int q) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12);
    const __m512i shift = _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 0, 0, 2, 2, 4, 4, 6, 6);
    return _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(quarter_index(idx, q), qs), shift),
                            _mm512_set1_epi8(3));
  }

  // Scales of a Q2_K super-block, in either form: group g's scale byte holds the 4-bit scale (low) and min
  // (high): a = d * scale, b = -(dmin * min).
  static void q2_k_scales(const uint8_t* blk, SuperRegs& s) {
    const __m512i sc = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ2_K, scales))));
    uint16_t dh, mh;
    std::memcpy(&dh, blk + offsetof(BlockQ2_K, d), 2);
    std::memcpy(&mh, blk + offsetof(BlockQ2_K, dmin), 2);
    const __m512i fifteen = _mm512_set1_epi32(15);
    s.a = _mm512_mul_ps(_mm512_set1_ps(half_to_float(dh)), _mm512_cvtepi32_ps(_mm512_and_si512(sc, fifteen)));
    // Negation flips the sign bit only, as the scalar unary minus.
    s.b = _mm512_xor_ps(
        _mm512_mul_ps(_mm512_set1_ps(half_to_float(mh)), _mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4))),
        _mm512_set1_ps(-0.0f));
  }

  // Q2_K: codes 0..3, the 2-bit planes (k2_low_bits).
  static void load_q2_k_super(const uint8_t* blk, SuperRegs& s) {
    const __m512i qs = load_once(blk + offsetof(BlockQ2_K, qs));
    for (int q = 0; q < 4; ++q) s.u[q] = k2_low_bits(qs, q);
    q2_k_scales(blk, s);
  }

  // Repacked Q2_K (repack.h): the codes of quarter q at bits 2q, 2q + 1 of a 64-byte plane in lane order (a
  // 16-bit shift right by 2q; the bits it carries across bytes are masked).
  static void load_q2_kx_super(const uint8_t* blk, SuperRegs& s) {
    const __m512i plane = load_once(blk + offsetof(BlockQ2_K, qs)), three = _mm512_set1_epi8(3);
    s.u[0] = _mm512_and_si512(plane, three);
    s.u[1] = _mm512_and_si512(_mm512_srli_epi16(plane, 2), three);
    s.u[2] = _mm512_and_si512(_mm512_srli_epi16(plane, 4), three);
    s.u[3] = _mm512_and_si512(_mm512_srli_epi16(plane, 6), three);
    q2_k_scales(blk, s);
  }

  // Scales of a Q3_K super-block, in either form: 16 6-bit values, the low 4 bits of group g at bits 4 (g /
  // 8) of scales[g % 8], the high 2 at bits 2 (g / 4) of scales[8 + g % 4]: a = d * (scale - 32), b = -4 * a.
  static void q3_k_scales(const uint8_t* blk, SuperRegs& s) {
    // The 12 scale bytes (a masked load: the block ends 2 bytes after them).
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(0x0FFF, blk + offsetof(BlockQ3_K, scales)));
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i lo_shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    const __m512i hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11);
    const __m512i hi_shift = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(lo_idx, bytes), lo_shift),
                                         _mm512_set1_epi32(15));
    const __m512i high = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_permutexvar_epi32(hi_idx, bytes), hi_shift), _mm512_set1_epi32(3));
    const __m512i sc =
        _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)), _mm512_set1_epi32(32));
    uint16_t dh;
    std::memcpy(&dh, blk + offsetof(BlockQ3_K, d), 2);
    s.a = _mm512_mul_ps(_mm512_set1_ps(half_to_float(dh)), _mm512_cvtepi32_ps(sc));
    s.b = _mm512_mul_ps(_mm512_set1_ps(-4.0f), s.a);
  }

  // Q3_K: codes 0..7, the 2-bit planes of Q2_K plus a third bit from hmask: element 128h + 32c + l takes bit
  // 4h + c of hmask[l], so group g reads hmask dword 4 (g % 2) + q, rotated left by 2 - (4h + c) (mod 32) to
  // bring that bit of every byte to bit 2.
  static void load_q3_k_super(const uint8_t* blk, SuperRegs& s) {
    const __m512i hm_idx = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m512i hm_rot = _mm512_setr_epi32(2, 2, 1, 1, 0, 0, 31, 31, 30, 30, 29, 29, 28, 28, 27, 27);
    const __m512i qs = load_once(blk + offsetof(BlockQ3_K, qs)),
                  hm = broadcast_once(blk + offsetof(BlockQ3_K, hmask));
    for (int q = 0; q < 4; ++q) {
      const __m512i hb = _mm512_rolv_epi32(_mm512_permutexvar_epi32(quarter_index(hm_idx, q), hm), hm_rot);
      // low | (hb & 4)
      s.u[q] = _mm512_ternarylogic_epi32(k2_low_bits(qs, q), hb, _mm512_set1_epi8(4), 0xF8);
    }
    q3_k_scales(blk, s);
  }

  // Repacked Q3_K (repack.h): the low two bits of quarter q at bits 2q, 2q + 1 of a 64-byte plane (a 16-bit
  // shift right by 2q; the bits it carries across bytes are masked), the third bits in a 32-byte plane at
  // byte 0 (plane_bit).
  template <int kQ>
  static __m512i q3_kx_quarter(__m512i low, __m512i hm) {
    const __m512i lo = kQ == 0 ? low : _mm512_srli_epi16(low, 2 * kQ);
    // (lo & 3) | (hb & 4)
    return _mm512_ternarylogic_epi32(_mm512_and_si512(lo, _mm512_set1_epi8(3)), plane_bit<kQ, 2>(hm),
                                     _mm512_set1_epi8(4), 0xF8);
  }

  static void load_q3_kx_super(const uint8_t* blk, SuperRegs& s) {
    const __m512i low = load_once(blk + 32), hm = broadcast_once(blk);
    s.u[0] = q3_kx_quarter<0>(low, hm);
    s.u[1] = q3_kx_quarter<1>(low, hm);
    s.u[2] = q3_kx_quarter<2>(low, hm);
    s.u[3] = q3_kx_quarter<3>(low, hm);
    q3_k_scales(blk, s);
  }
};

}  // namespace tandem::kernels
