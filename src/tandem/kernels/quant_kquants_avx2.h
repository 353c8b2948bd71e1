// K-quant super-blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) straight from the file bytes into the AVX2 register
// form (SuperRegs), bit-identical to unpack_row_impl (the same codes, and scales computed by the same rounded
// float operations). Static members of a template over the target's Isa (Avx2Isa, quant_regs_avx2.h), which
// each AVX2 target instantiates inside its `#pragma GCC target` region; the loaders are always inlined into
// the tiles that name them.
//
// As in the AVX-512 loaders, the 16 elements of a group lie on 16 consecutive bytes of each bit plane, so
// lane j of vector 2q + h (group 8h + j, elements 16 (8h + j) + 4q..+3) is one dword of each plane. AVX2 has
// no two-source dword permute and no per-lane rotate, so the dwords are gathered differently: the nibble
// planes are loaded as 16-byte pieces, placed by the loads in the 128-bit half where they are needed, and
// lined up with in-lane dword/qword unpacks (a 4x4 transpose); the high-bit planes take one vpermd per
// quarter, shared by both halves, and a per-lane variable shift that brings the wanted bit of every byte to
// its place.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/quant_regs_avx2.h"
#include "tandem/tensor/blocks.h"

namespace tandem::kernels {

template <Avx2Isa Isa>
struct Avx2KQuantLoaders : Avx2Regs<Isa> {
  using Regs = Avx2Regs<Isa>;
  using Regs::block_lanes;
  using Regs::block_quarters;
  using Regs::half_to_float;
  using Regs::lane_order;
  using Regs::lanes_from_pair;
  using Regs::load32;
  using Regs::load_pair;
  using typename Regs::SuperRegs;

  // The repacked Q3_K and Q5_K keep one bit of each code in a 32-byte plane (repack.h): that of vector 2q + h
  // (positions 32h..32h + 31 of quarter q) at bit q + 4h of each byte. A 16-bit shift by a constant moves
  // vector 2 kQ + kH's bit to bit kTo of the same byte; the caller masks the bits it carries across bytes.
  template <int kQ, int kH, int kTo>
  [[gnu::always_inline]] static __m256i plane_bit(__m256i plane) {
    constexpr int kShift = kQ + 4 * kH - kTo;
    if constexpr (kShift > 0) return _mm256_srli_epi16(plane, kShift);
    if constexpr (kShift < 0) return _mm256_slli_epi16(plane, -kShift);
    return plane;
  }

  // Q4_K and Q5_K are taken in block lanes (QuantKernels::k4_block_lanes), as the legacy types with an
  // offset: a 32-element block a lane, its scale and offset applied once to the sum of its eight vectors.
  //
  // Scale a and offset b of the 8 blocks of a Q4_K or Q5_K super-block in block lanes (lane L: block
  // kLaneBlock[L]) from its first 16 bytes (d, dmin and the 12 bytes of packed 6-bit scales and mins sc[i] =
  // byte 4 + i): a = d * scale, b = -(dmin * min), each product rounded once as in k4_groups; a[1] and b[1]
  // zero. The scales and mins are built side by side as bytes by two byte shuffles of the header, then
  // widened.
  [[gnu::always_inline]] static void k4_lane_scales(const uint8_t* block, SuperRegs& s) {
    const __m128i hdr = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
    // Bytes 0..7 the scales and 8..15 the mins of blocks 0, 1, 4, 5, 2, 3, 6, 7. Low bits: blocks j < 4 take
    // sc[j] & 63 (scale) and sc[j + 4] & 63 (min); blocks j >= 4 take sc[j + 4] & 15 (scale) and sc[j + 4] >>
    // 4 (min).
    const __m128i low_src =
        _mm_shuffle_epi8(hdr, _mm_setr_epi8(4, 5, 12, 13, 6, 7, 14, 15, 8, 9, 12, 13, 10, 11, 14, 15));
    const __m128i low = _mm_or_si128(
        _mm_and_si128(low_src, _mm_setr_epi8(63, 63, 15, 15, 63, 63, 15, 15, 63, 63, 0, 0, 63, 63, 0, 0)),
        _mm_and_si128(_mm_srli_epi16(low_src, 4),
                      _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 0, 0, 15, 15)));
    // High two bits of blocks j >= 4: the top bits of sc[j - 4] (scale) and of sc[j] (min), moved to
    // bits 4..5 (the 16-bit shift carries bits of the next byte only into bits 6..7, masked off).
    const __m128i high_src =
        _mm_shuffle_epi8(hdr, _mm_setr_epi8(-1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1, -1, 10, 11));
    const __m128i sm = _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(high_src, 2), _mm_set1_epi8(0x30)));
    // d and dmin are halves 0 and 1 of the header.
    const __m128 dm = _mm_cvtph_ps(hdr);
    s.a[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)), _mm256_broadcastss_ps(dm));
    // Negation flips the sign bit only, as the scalar unary minus.
    s.b[0] = _mm256_xor_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))),
                                         _mm256_broadcastss_ps(_mm_movehdup_ps(dm))),
                           _mm256_set1_ps(-0.0f));
    s.a[1] = s.b[1] = _mm256_setzero_ps();
  }

  // Index vector {q, 4 + q, q, 4 + q, ...}: the high-bit dwords of quarter q of groups with l / 16 = 0 and 1.
  [[gnu::always_inline]] static __m256i quarter_pairs(int q) {
    return _mm256_setr_epi32(q, 4 + q, q, 4 + q, q, 4 + q, q, 4 + q);
  }

  // Group order to block lanes, in registers: vectors 2q and 2q + 1 hold quarter q of groups 0..7 and 8..15,
  // the two groups of a block side by side; their even lanes line up elements 4q..4q+3 of every block (vector
  // q), the odd ones 16 + 4q.. (vector 4 + q), in the lane order of lanes_from_pair.
  [[gnu::always_inline]] static void group_to_lanes(__m256i* u) {
    __m256i even[4], odd[4];
    for (int q = 0; q < 4; ++q) lanes_from_pair(u[2 * q], u[2 * q + 1], even[q], odd[q]);
    for (int q = 0; q < 4; ++q) {
      u[q] = even[q];
      u[4 + q] = odd[q];
    }
  }

  // Q4_K and Q5_K codes. Element 64c + 32n + l is nibble n of qs[32c + l], so lane j of half h (group g = 8h
  // + j = 4c + 2n + m, m = l / 16) reads nibble n of qs dword 8c + 4m + q, c = 2h + j / 4. With the 16-byte
  // pieces P_i = qs[64h + 16i..] loaded as (P0, P2) and (P1, P3), one dword unpack puts (P0[q], P1[q]) in the
  // low half and (P2[q], P3[q]) in the high one, and a qword unpack of the low and high nibbles gives the
  // quarter. For Q5_K the fifth bit is bit g / 2 = 4h + j / 2 of qh[l], qh dword 4m + q; shifting a dword
  // left by 4 - c (right by c - 4) moves bit c of every byte to bit 4 of the same byte.
  template <bool kFive>
  [[gnu::always_inline]] static void load_k4_super(const uint8_t* blk, SuperRegs& s) {
    using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
    const __m256i nib = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* qs = blk + offsetof(Block, qs) + 64 * h;
      const __m256i p02 = load_pair(qs, qs + 32), p13 = load_pair(qs + 16, qs + 48);
      const __m256i pairs[2] = {_mm256_unpacklo_epi32(p02, p13), _mm256_unpackhi_epi32(p02, p13)};
      for (int i = 0; i < 2; ++i) {
        const __m256i lo = _mm256_and_si256(pairs[i], nib);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(pairs[i], 4), nib);
        s.u[2 * (2 * i) + h] = _mm256_unpacklo_epi64(lo, hi);
        s.u[2 * (2 * i + 1) + h] = _mm256_unpackhi_epi64(lo, hi);
      }
    }
    if constexpr (kFive) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ5_K, qh)));
      const __m256i up = _mm256_setr_epi32(4, 4, 3, 3, 2, 2, 1, 1),
                    down = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
      const __m256i fifth = _mm256_set1_epi8(0x10);
      for (int q = 0; q < 4; ++q) {
        const __m256i bits = _mm256_permutevar8x32_epi32(qh, quarter_pairs(q));
        s.u[2 * q] = _mm256_or_si256(s.u[2 * q], _mm256_and_si256(_mm256_sllv_epi32(bits, up), fifth));
        s.u[2 * q + 1] =
            _mm256_or_si256(s.u[2 * q + 1], _mm256_and_si256(_mm256_srlv_epi32(bits, down), fifth));
      }
    }
    group_to_lanes(s.u);
    k4_lane_scales(blk, s);
  }

  [[gnu::always_inline]] static void load_q4_k_lanes(const uint8_t* blk, SuperRegs& s) {
    load_k4_super<false>(blk, s);
  }

  [[gnu::always_inline]] static void load_q5_k_lanes(const uint8_t* blk, SuperRegs& s) {
    load_k4_super<true>(blk, s);
  }

  // Repacked Q4_K (repack.h): two code planes in group order (plane A: quarters 0 and 2, B: 1 and 3; 32 bytes
  // per half of the groups), taken into block lanes before the nibbles are split (as group_to_lanes).
  [[gnu::always_inline]] static void load_q4_kx_lanes(const uint8_t* blk, SuperRegs& s) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const uint8_t* qs = blk + offsetof(BlockQ4_K, qs);
    for (int plane = 0; plane < 2; ++plane) {
      __m256i even, odd;
      lanes_from_pair(load32(qs + 64 * plane), load32(qs + 64 * plane + 32), even, odd);
      s.u[plane] = _mm256_and_si256(even, nib);
      s.u[plane + 2] = _mm256_and_si256(_mm256_srli_epi16(even, 4), nib);
      s.u[4 + plane] = _mm256_and_si256(odd, nib);
      s.u[4 + plane + 2] = _mm256_and_si256(_mm256_srli_epi16(odd, 4), nib);
    }
    k4_lane_scales(blk, s);
  }

  // Repacked Q5_K (repack.h): the nibble planes of repacked Q4_K at byte 48 and the fifth bits in a 32-byte
  // plane at byte 16 (plane_bit).
  template <int kQ, int kH>
  [[gnu::always_inline]] static __m256i q5_kx_vector(__m256i low, __m256i hm) {
    return _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi8(0x0F)),
                           _mm256_and_si256(plane_bit<kQ, kH, 4>(hm), _mm256_set1_epi8(0x10)));
  }

  template <int kH>
  [[gnu::always_inline]] static void q5_kx_half(const uint8_t* blk, __m256i hm, SuperRegs& s) {
    const __m256i a = load32(blk + 48 + 32 * kH), b = load32(blk + 112 + 32 * kH);
    s.u[kH] = q5_kx_vector<0, kH>(a, hm);
    s.u[2 + kH] = q5_kx_vector<1, kH>(b, hm);
    s.u[4 + kH] = q5_kx_vector<2, kH>(_mm256_srli_epi16(a, 4), hm);
    s.u[6 + kH] = q5_kx_vector<3, kH>(_mm256_srli_epi16(b, 4), hm);
  }

  [[gnu::always_inline]] static void load_q5_kx_lanes(const uint8_t* blk, SuperRegs& s) {
    const __m256i hm = load32(blk + 16);
    q5_kx_half<0>(blk, hm, s);
    q5_kx_half<1>(blk, hm, s);
    group_to_lanes(s.u);
    k4_lane_scales(blk, s);
  }

  // Scales of a Q6_K super-block (signed bytes): a = d * scale, b = -32 * a.
  [[gnu::always_inline]] static void q6_k_scales(const uint8_t* blk, SuperRegs& s) {
    uint16_t dh;
    std::memcpy(&dh, blk + offsetof(BlockQ6_K, d), 2);
    const __m256 d = _mm256_set1_ps(half_to_float(dh));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ6_K, scales)));
    s.a[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    s.a[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    const __m256 m32 = _mm256_set1_ps(-32.0f);
    s.b[0] = _mm256_mul_ps(m32, s.a[0]);
    s.b[1] = _mm256_mul_ps(m32, s.a[1]);
  }

  // Q6_K. Element 128h + 32c + l takes nibble c / 2 of ql[64h + 32 (c % 2) + l] and bits 2c..2c+1 of
  // qh[32h + l] as bits 4..5. Lane j = 2c + m of half h (m = l / 16) thus reads ql dword 8 (c % 2) + 4m + q
  // of the half's 64 bytes, that is dword q of the 16-byte piece P_j%4, its low nibble in lanes 0..3 and its
  // high nibble in lanes 4..7: each piece is broadcast to both halves, its nibble selected per half, and a
  // 4x4 dword transpose gives the four quarters. The high bits are qh dword 4m + q of the half's 32 bytes,
  // shifted right by 2c and then left by 4 to bring bits 2c..2c+1 of every byte to bits 4..5 of the same
  // byte. Scales are signed bytes: a = d * scale, b = -32 * a.
  [[gnu::always_inline]] static void load_q6_k_super(const uint8_t* blk, SuperRegs& s) {
    const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    const __m256i nib_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i qh_shift = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + offsetof(BlockQ6_K, ql) + 64 * h;
      __m256i p[4];
      for (int i = 0; i < 4; ++i)
        p[i] = _mm256_and_si256(
            _mm256_srlv_epi32(
                _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * i))),
                nib_shift),
            nib);
      const __m256i t01lo = _mm256_unpacklo_epi32(p[0], p[1]), t23lo = _mm256_unpacklo_epi32(p[2], p[3]);
      const __m256i t01hi = _mm256_unpackhi_epi32(p[0], p[1]), t23hi = _mm256_unpackhi_epi32(p[2], p[3]);
      const __m256i codes[4] = {_mm256_unpacklo_epi64(t01lo, t23lo), _mm256_unpackhi_epi64(t01lo, t23lo),
                                _mm256_unpacklo_epi64(t01hi, t23hi), _mm256_unpackhi_epi64(t01hi, t23hi)};
      const __m256i qh =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ6_K, qh) + 32 * h));
      for (int q = 0; q < 4; ++q) {
        const __m256i bits = _mm256_permutevar8x32_epi32(qh, quarter_pairs(q));
        const __m256i hb = _mm256_slli_epi32(_mm256_srlv_epi32(bits, qh_shift), 4);
        s.u[2 * q + h] = _mm256_or_si256(codes[q], _mm256_and_si256(hb, top));
      }
    }
    q6_k_scales(blk, s);
  }

  // Repacked Q6_K (repack.h): the low nibble planes as repacked Q4_K's, and the high bits of quarter q at
  // bits 2q, 2q + 1 of one plane, shifted to bits 4..5 (16-bit shifts: the bits they carry across bytes are
  // masked).
  [[gnu::always_inline]] static void load_q6_kx_super(const uint8_t* blk, SuperRegs& s) {
    const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    const uint8_t* ql = blk + offsetof(BlockQ6_K, ql);
    const uint8_t* qh = blk + offsetof(BlockQ6_K, qh);
    for (int h = 0; h < 2; ++h) {
      const __m256i a = load32(ql + 32 * h), b = load32(ql + 64 + 32 * h), hb = load32(qh + 32 * h);
      const __m256i low[4] = {a, b, _mm256_srli_epi16(a, 4), _mm256_srli_epi16(b, 4)};
      const __m256i high[4] = {_mm256_slli_epi16(hb, 4), _mm256_slli_epi16(hb, 2), hb,
                               _mm256_srli_epi16(hb, 2)};
      for (int q = 0; q < 4; ++q)
        s.u[2 * q + h] = _mm256_or_si256(_mm256_and_si256(low[q], nib), _mm256_and_si256(high[q], top));
    }
    q6_k_scales(blk, s);
  }

  // Q2_K and Q3_K share their 2-bit planes: element 128h + 32c + l takes bits 2c..2c+1 of qs[32h + l], so
  // lane j of half h (group 8h + j, c = j / 2, l / 16 = j % 2) reads dword 4 (j % 2) + q of qs[32h..],
  // shifted right by 2c.
  [[gnu::always_inline]] static __m256i k2_low_bits(__m256i qs_half, int q) {
    const __m256i shift = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(qs_half, quarter_pairs(q)), shift),
                            _mm256_set1_epi8(3));
  }

  // Scales of a Q2_K super-block, in either form: group g's scale byte holds the 4-bit scale (low) and min
  // (high): a = d * scale, b = -(dmin * min).
  [[gnu::always_inline]] static void q2_k_scales(const uint8_t* blk, SuperRegs& s) {
    uint16_t dh, mh;
    std::memcpy(&dh, blk + offsetof(BlockQ2_K, d), 2);
    std::memcpy(&mh, blk + offsetof(BlockQ2_K, dmin), 2);
    const __m256 d = _mm256_set1_ps(half_to_float(dh)), dmin = _mm256_set1_ps(half_to_float(mh));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ2_K, scales)));
    const __m256i fifteen = _mm256_set1_epi32(15);
    // Negation flips the sign bit only, as the scalar unary minus.
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int h = 0; h < 2; ++h) {
      const __m256i b = _mm256_cvtepu8_epi32(h == 0 ? sc : _mm_srli_si128(sc, 8));
      s.a[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b, fifteen)));
      s.b[h] = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))), sign);
    }
  }

  // Q2_K: codes 0..3, the 2-bit planes (k2_low_bits).
  [[gnu::always_inline]] static void load_q2_k_super(const uint8_t* blk, SuperRegs& s) {
    const uint8_t* qs = blk + offsetof(BlockQ2_K, qs);
    for (int h = 0; h < 2; ++h) {
      const __m256i half = load32(qs + 32 * h);
      for (int q = 0; q < 4; ++q) s.u[2 * q + h] = k2_low_bits(half, q);
    }
    q2_k_scales(blk, s);
  }

  // Repacked Q2_K (repack.h): vector 2q + h holds bits 2q, 2q + 1 of the plane's half h, shifted down by a
  // 16-bit shift (the bits it carries across bytes are masked).
  [[gnu::always_inline]] static void load_q2_kx_super(const uint8_t* blk, SuperRegs& s) {
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i x = load32(blk + offsetof(BlockQ2_K, qs) + 32 * h);
      s.u[h] = _mm256_and_si256(x, three);
      s.u[2 + h] = _mm256_and_si256(_mm256_srli_epi16(x, 2), three);
      s.u[4 + h] = _mm256_and_si256(_mm256_srli_epi16(x, 4), three);
      s.u[6 + h] = _mm256_and_si256(_mm256_srli_epi16(x, 6), three);
    }
    q2_k_scales(blk, s);
  }

  // Scales of a Q3_K super-block, in either form: 16 6-bit values, the low 4 bits of group g at bits 4 (g /
  // 8) of scales[g % 8], the high 2 at bits 2 (g / 4) of scales[8 + g % 4]: a = d * (scale - 32), b = -4 * a.
  [[gnu::always_inline]] static void q3_k_scales(const uint8_t* blk, SuperRegs& s) {
    // The 16 bytes ending with d (the block's last 2 bytes): scale byte i at i + 2.
    const __m128i tail = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + sizeof(BlockQ3_K) - 16));
    static_assert(offsetof(BlockQ3_K, scales) == sizeof(BlockQ3_K) - 14);
    const __m256i low_src = _mm256_cvtepu8_epi32(_mm_srli_si128(tail, 2));  // scales[j]
    const __m256i high_src =
        _mm256_cvtepu8_epi32(_mm_shuffle_epi8(tail, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, -1, -1, -1,
                                                                  -1, -1, -1, -1, -1)));  // scales[8 + j % 4]
    uint16_t dh;
    std::memcpy(&dh, blk + offsetof(BlockQ3_K, d), 2);
    const __m256 d = _mm256_set1_ps(half_to_float(dh)), m4 = _mm256_set1_ps(-4.0f);
    for (int h = 0; h < 2; ++h) {
      const __m256i low = _mm256_and_si256(_mm256_srli_epi32(low_src, 4 * h), _mm256_set1_epi32(15));
      const __m256i high = _mm256_and_si256(
          _mm256_srlv_epi32(high_src, _mm256_setr_epi32(4 * h, 4 * h, 4 * h, 4 * h, 4 * h + 2, 4 * h + 2,
                                                        4 * h + 2, 4 * h + 2)),
          _mm256_set1_epi32(3));
      const __m256i sc =
          _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
      s.a[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
      s.b[h] = _mm256_mul_ps(m4, s.a[h]);
    }
  }

  // Q3_K: codes 0..7, the 2-bit planes of Q2_K plus a third bit from hmask: element 128h + 32c + l takes bit
  // 4h + c of hmask[l], hmask dword 4 (j % 2) + q for lane j, moved to bit 2 of its byte by a left shift of 2
  // - (4h + c) or a right shift of (4h + c) - 2 (a shift count of 32 gives zero).
  [[gnu::always_inline]] static void load_q3_k_super(const uint8_t* blk, SuperRegs& s) {
    const __m256i hm = load32(blk + offsetof(BlockQ3_K, hmask));
    const __m256i left[2] = {_mm256_setr_epi32(2, 2, 1, 1, 0, 0, 32, 32), _mm256_set1_epi32(32)};
    const __m256i right[2] = {_mm256_setr_epi32(32, 32, 32, 32, 32, 32, 1, 1),
                              _mm256_setr_epi32(2, 2, 3, 3, 4, 4, 5, 5)};
    const __m256i four = _mm256_set1_epi8(4);
    const uint8_t* qs = blk + offsetof(BlockQ3_K, qs);
    const __m256i halves[2] = {load32(qs), load32(qs + 32)};
    for (int q = 0; q < 4; ++q) {
      const __m256i bits = _mm256_permutevar8x32_epi32(hm, quarter_pairs(q));
      for (int h = 0; h < 2; ++h) {
        const __m256i hb =
            _mm256_or_si256(_mm256_sllv_epi32(bits, left[h]), _mm256_srlv_epi32(bits, right[h]));
        s.u[2 * q + h] = _mm256_or_si256(k2_low_bits(halves[h], q), _mm256_and_si256(hb, four));
      }
    }
    q3_k_scales(blk, s);
  }

  // Repacked Q3_K (repack.h): vector 2q + h holds positions 32h..32h + 31 of quarter q, whose low two bits
  // sit at bits 2q, 2q + 1 of the 64-byte plane's half h (a 16-bit shift right by 2q; the bits it carries
  // across bytes are masked), and the third bits in a 32-byte plane at byte 0 (plane_bit).
  template <int kQ, int kH>
  [[gnu::always_inline]] static __m256i q3_kx_vector(__m256i low, __m256i hm) {
    const __m256i lo = kQ == 0 ? low : _mm256_srli_epi16(low, 2 * kQ);
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi8(3)),
                           _mm256_and_si256(plane_bit<kQ, kH, 2>(hm), _mm256_set1_epi8(4)));
  }

  template <int kH>
  [[gnu::always_inline]] static void q3_kx_half(const uint8_t* blk, __m256i hm, SuperRegs& s) {
    const __m256i low = load32(blk + 32 + 32 * kH);
    s.u[kH] = q3_kx_vector<0, kH>(low, hm);
    s.u[2 + kH] = q3_kx_vector<1, kH>(low, hm);
    s.u[4 + kH] = q3_kx_vector<2, kH>(low, hm);
    s.u[6 + kH] = q3_kx_vector<3, kH>(low, hm);
  }

  [[gnu::always_inline]] static void load_q3_kx_super(const uint8_t* blk, SuperRegs& s) {
    const __m256i hm = load32(blk);
    q3_kx_half<0>(blk, hm, s);
    q3_kx_half<1>(blk, hm, s);
    q3_k_scales(blk, s);
  }
};

}  // namespace tandem::kernels
