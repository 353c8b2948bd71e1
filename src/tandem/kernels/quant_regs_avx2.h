// The AVX2 targets' register form of a weight super-block (SuperRegs) and the register helpers their loaders
// share: an ordinary header of templates over a target's Isa (Avx2Isa), so that each target instantiates its
// own copy, compiled for its instruction set (its includer's `#pragma GCC target` region, after
// <immintrin.h>), under names of its own that the linker never folds together.
//
// Every helper that takes, fills or returns vectors is always inlined: GCC 12 left some of them as calls from
// the tiles, passing the vectors through memory with a vzeroupper per call (performance.md, AVX2 code
// generation).
#pragma once

#include <immintrin.h>

#include <concepts>
#include <cstdint>

namespace tandem::kernels {

// What an AVX2 target's Isa says: whether it uses AVX-VNNI's vpdpbusd (the same bits either way).
template <typename Isa>
concept Avx2Isa = requires {
  { Isa::kVnni } -> std::convertible_to<bool>;
};

template <Avx2Isa Isa>
struct Avx2Regs {
  // Two 16-byte pieces into one vector (low half a, high half b); the insert takes its operand from memory.
  [[gnu::always_inline]] static __m256i load_pair(const uint8_t* a, const uint8_t* b) {
    return _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  }

  // Block order (quant_layout.h) from two vectors holding the same 16-byte half of four blocks: x02 of blocks
  // 0 (low half) and 2, x13 of blocks 1 and 3. Qword unpacks line up the four blocks' first and second
  // qwords: quarters 2p and 2p + 1 of the half p, for out[0] and out[2].
  [[gnu::always_inline]] static void block_quarters(__m256i x02, __m256i x13, __m256i* out) {
    out[0] = _mm256_unpacklo_epi64(x02, x13);
    out[2] = _mm256_unpackhi_epi64(x02, x13);
  }

  // Block order to block lanes (quant_layout.h), in registers: vectors 2q and 2q + 1 of block order hold
  // quarter q (8 bytes a block) of blocks 0..3 and 4..7; their even 32-bit lanes are the first 4 bytes of
  // each block's quarter, the odd ones the last 4, and one shuffle per output picks them into lanes of blocks
  // 0, 1, 4, 5 | 2, 3, 6, 7 (kLaneBlock).
  [[gnu::always_inline]] static void lanes_from_pair(__m256i lo, __m256i hi, __m256i& even, __m256i& odd) {
    const __m256 a = _mm256_castsi256_ps(lo), b = _mm256_castsi256_ps(hi);
    even = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88));
    odd = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD));
  }

  [[gnu::always_inline]] static void block_lanes(__m256i* u) {
    for (int q = 0; q < 4; ++q) lanes_from_pair(u[2 * q], u[2 * q + 1], u[2 * q], u[2 * q + 1]);
  }

  // Eight per-block floats (block j in element j) in block lanes: lane L takes block kLaneBlock[L].
  [[gnu::always_inline]] static __m256 lane_order(__m256 d) {
    return _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
  }

  // One super-block held in registers in the unpacked form: in group order vector 2q + h holds quarter q of
  // groups 8h..8h+7 (UnpackedSuper::u) and a[h], b[h] the scales and offsets of groups 8h..8h+7; in block
  // lanes (the legacy types) vector v holds elements 4v..4v+3 of each lane's block, a[0], b[0] their scales
  // and offsets, and a[1], b[1] are zero.
  struct SuperRegs {
    __m256i u[8];
    __m256 a[2], b[2];
  };

  [[gnu::always_inline]] static __m256i load32(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }

  static float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
};

}  // namespace tandem::kernels
