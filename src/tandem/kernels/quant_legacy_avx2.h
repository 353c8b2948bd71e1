// The legacy block types' super-block loaders on AVX2 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 in their file forms, Q4_0
// and Q8_0 also in their repacked forms of repack.h): 8 blocks of 32 elements into SuperRegs in block lanes
// (quant_layout.h). Static members of a template over the target's Isa (Avx2Isa, quant_regs_avx2.h), which
// each AVX2 target instantiates inside its `#pragma GCC target` region.
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
struct Avx2LegacyLoaders : Avx2Regs<Isa> {
  using Regs = Avx2Regs<Isa>;
  using Regs::block_lanes;
  using Regs::block_quarters;
  using Regs::half_to_float;
  using Regs::lane_order;
  using Regs::lanes_from_pair;
  using Regs::load32;
  using Regs::load_pair;
  using typename Regs::SuperRegs;

  // The f16 words at the start of 8 legacy blocks of kBlock bytes from p, as floats in block lanes. Inserted
  // word by word: storing them to a buffer and loading it as one vector would stall on store forwarding.
  template <int64_t kBlock>
  [[gnu::always_inline]] static __m256 block_scales8(const uint8_t* p) {
    const auto half = [p](int j) {
      uint16_t h;
      std::memcpy(&h, p + j * kBlock, 2);
      return static_cast<int>(h);
    };
    __m128i h = _mm_cvtsi32_si128(half(0));
    h = _mm_insert_epi16(h, half(1), 1);
    h = _mm_insert_epi16(h, half(2), 2);
    h = _mm_insert_epi16(h, half(3), 3);
    h = _mm_insert_epi16(h, half(4), 4);
    h = _mm_insert_epi16(h, half(5), 5);
    h = _mm_insert_epi16(h, half(6), 6);
    h = _mm_insert_epi16(h, half(7), 7);
    return lane_order(_mm256_cvtph_ps(h));
  }

  static constexpr int64_t kQ4_0Block = sizeof(BlockQ4_0), kQ8_0Block = sizeof(BlockQ8_0);

  // The 4-bit codes of 8 legacy blocks of kB bytes from sb, each block's 16 code bytes at kQs, in block
  // order: quarters 0 and 1 are the low nibbles of each block's bytes 0..7 and 8..15, quarters 2 and 3 the
  // high ones.
  template <int64_t kB, int64_t kQs>
  [[gnu::always_inline]] static void legacy_nibbles(const uint8_t* sb, __m256i* u) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const auto qs = [sb](int j) { return sb + j * kB + kQs; };
    for (int h = 0; h < 2; ++h) {
      const __m256i x02 = load_pair(qs(4 * h), qs(4 * h + 2)), x13 = load_pair(qs(4 * h + 1), qs(4 * h + 3));
      block_quarters(_mm256_and_si256(x02, nib), _mm256_and_si256(x13, nib), u + h);
      block_quarters(_mm256_and_si256(_mm256_srli_epi16(x02, 4), nib),
                     _mm256_and_si256(_mm256_srli_epi16(x13, 4), nib), u + 4 + h);
    }
  }

  // Q4_0 (8 blocks from sb) in block lanes; b = -8a.
  [[gnu::always_inline]] static void load_q4_0_super(const uint8_t* sb, SuperRegs& s) {
    legacy_nibbles<kQ4_0Block, offsetof(BlockQ4_0, qs)>(sb, s.u);
    block_lanes(s.u);
    s.a[0] = block_scales8<kQ4_0Block>(sb);
    s.b[0] = _mm256_mul_ps(_mm256_set1_ps(-8.0f), s.a[0]);
    s.a[1] = s.b[1] = _mm256_setzero_ps();
  }

  // Adds 16 to the codes whose fifth bit is set (Q5_0, Q5_1): in vector 2q + h, byte i of qword k is element
  // 8q
  // + i of block 4h + k, whose fifth bit is bit i of byte q of the block's 32-bit qh word at kQh: byte q is
  // spread over the qword's 8 bytes and compared with the bit pattern 1, 2, 4, ... 128.
  template <int64_t kB, int64_t kQh>
  [[gnu::always_inline]] static void legacy_fifth_bits(const uint8_t* sb, __m256i* u) {
    const auto qh = [sb](int j) {
      uint32_t w;
      std::memcpy(&w, sb + j * kB + kQh, 4);
      return static_cast<int>(w);
    };
    const __m256i bits = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int h = 0; h < 2; ++h) {
      // Inserted dword by dword (through memory, the vector load would stall on store forwarding).
      const int j = 4 * h;
      const __m128i w = _mm_insert_epi32(
          _mm_insert_epi32(_mm_insert_epi32(_mm_cvtsi32_si128(qh(j)), qh(j + 1), 1), qh(j + 2), 2), qh(j + 3),
          3);
      const __m256i words = _mm256_cvtepu32_epi64(w);  // qword k: block 4h + k's qh
      for (int q = 0; q < 4; ++q) {
        const long long lo = 0x0101010101010101LL * q, hi = 0x0101010101010101LL * (8 + q);
        const __m256i spread = _mm256_shuffle_epi8(words, _mm256_setr_epi64x(lo, hi, lo, hi));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
        u[2 * q + h] = _mm256_or_si256(u[2 * q + h], _mm256_and_si256(set, sixteen));
      }
    }
  }

  // Q4_1, Q5_0 and Q5_1 (8 blocks from sb) in block lanes: 4-bit codes, plus the fifth bits for Q5_*; a = d,
  // b = m (Q4_1, Q5_1) or -16 * d (Q5_0), as unpack_row_impl.
  template <typename Block, bool kMin, bool kFifth>
  [[gnu::always_inline]] static void load_legacy_super(const uint8_t* sb, SuperRegs& s) {
    constexpr int64_t kB = sizeof(Block);
    legacy_nibbles<kB, offsetof(Block, qs)>(sb, s.u);
    if constexpr (kFifth) legacy_fifth_bits<kB, offsetof(Block, qh)>(sb, s.u);
    block_lanes(s.u);
    s.a[0] = block_scales8<kB>(sb + offsetof(Block, d));
    if constexpr (kMin) {
      s.b[0] = block_scales8<kB>(sb + offsetof(Block, m));
    } else {
      s.b[0] = _mm256_mul_ps(_mm256_set1_ps(-16.0f), s.a[0]);
    }
    s.a[1] = s.b[1] = _mm256_setzero_ps();
  }

  // Q8_0 with signed codes (8 blocks from sb) in block lanes (from block order: quarter q holds bytes
  // 8q..8q+7 of each block); b = 0.
  [[gnu::always_inline]] static void load_q8_0_super(const uint8_t* sb, SuperRegs& s) {
    const auto qs = [sb](int j) { return sb + j * kQ8_0Block + 2; };
    for (int h = 0; h < 2; ++h) {
      const int j = 4 * h;
      block_quarters(load_pair(qs(j), qs(j + 2)), load_pair(qs(j + 1), qs(j + 3)), s.u + h);
      block_quarters(load_pair(qs(j) + 16, qs(j + 2) + 16), load_pair(qs(j + 1) + 16, qs(j + 3) + 16),
                     s.u + 4 + h);
    }
    block_lanes(s.u);
    s.a[0] = block_scales8<kQ8_0Block>(sb);
    s.a[1] = s.b[0] = s.b[1] = _mm256_setzero_ps();
  }

  // The repacked forms (repack.h): the 8 scales side by side at the head, in block lanes.
  [[gnu::always_inline]] static void interleaved_scales8(const uint8_t* sb, SuperRegs& s) {
    s.a[0] = lane_order(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb))));
    s.a[1] = _mm256_setzero_ps();
  }

  // Repacked Q4_0: code bytes 0..7 of the 8 blocks (blocks 0..3, then 4..7), then bytes 8..15. One shuffle
  // per vector pair puts byte runs 0..3, 4..7, 8..11 and 12..15 of each lane's block side by side; their low
  // nibbles are elements 4v..4v+3 (v < 4), the high ones 16 on.
  [[gnu::always_inline]] static void load_q4_0x_super(const uint8_t* sb, SuperRegs& s) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256i y[4];
    lanes_from_pair(load32(sb + 16), load32(sb + 48), y[0], y[1]);
    lanes_from_pair(load32(sb + 80), load32(sb + 112), y[2], y[3]);
    for (int v = 0; v < 4; ++v) {
      s.u[v] = _mm256_and_si256(y[v], nib);
      s.u[4 + v] = _mm256_and_si256(_mm256_srli_epi16(y[v], 4), nib);
    }
    interleaved_scales8(sb, s);
    s.b[0] = _mm256_mul_ps(_mm256_set1_ps(-8.0f), s.a[0]);
    s.b[1] = _mm256_setzero_ps();
  }

  // Repacked Q8_0 with signed codes: the quarters (block order) into block lanes.
  [[gnu::always_inline]] static void load_q8_0x_super(const uint8_t* sb, SuperRegs& s) {
    for (int v = 0; v < 8; ++v) s.u[v] = load32(sb + 16 + 32 * v);
    block_lanes(s.u);
    interleaved_scales8(sb, s);
    s.b[0] = s.b[1] = _mm256_setzero_ps();
  }
};

}  // namespace tandem::kernels
