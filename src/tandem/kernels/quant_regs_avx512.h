// The AVX-512 targets' register form of a weight super-block (SuperRegs) and the register helpers their
// loaders share: an ordinary header of templates over a variant's Isa (Avx512Isa), so that each variant
// instantiates its own copy, compiled for its instruction set (its includer's `#pragma GCC target` region,
// after <immintrin.h>), under names of its own that the linker never folds together.
#pragma once

#include <immintrin.h>

#include <concepts>
#include <cstdint>

#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

// What an AVX-512 variant's Isa says: whether it may use VBMI byte permutes. The VBMI decoders are members
// of both variants' loaders and are instantiated only where kVbmi names them.
template <typename Isa>
concept Avx512Isa = requires {
  { Isa::kVbmi } -> std::convertible_to<bool>;
};

template <Avx512Isa Isa>
struct Avx512Regs {
  static constexpr bool kVbmi = Isa::kVbmi;

  // Four quarter vectors in block order from four vectors z[m] that each hold two blocks' 32 bytes (blocks
  // 2m, 2m + 1; four qwords each): a transpose of qwords, 8 blocks by 4 quarters.
  static void block_quarters(const __m512i* z, __m512i* out) {
    const __m512i lo = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13),
                  hi = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i p01 = _mm512_permutex2var_epi64(z[0], lo, z[1]);  // quarters 0, 1 of blocks 0..3
    const __m512i p23 = _mm512_permutex2var_epi64(z[0], hi, z[1]);  // quarters 2, 3 of blocks 0..3
    const __m512i r01 = _mm512_permutex2var_epi64(z[2], lo, z[3]);  // the same of blocks 4..7
    const __m512i r23 = _mm512_permutex2var_epi64(z[2], hi, z[3]);
    out[0] = _mm512_shuffle_i64x2(p01, r01, 0x44);
    out[1] = _mm512_shuffle_i64x2(p01, r01, 0xEE);
    out[2] = _mm512_shuffle_i64x2(p23, r23, 0x44);
    out[3] = _mm512_shuffle_i64x2(p23, r23, 0xEE);
  }

  // One super-block held in registers in the unpacked form: the four quarter vectors of codes, the group
  // scales a and offsets b (the same bits unpack_row_impl stores).
  struct SuperRegs {
    __m512i u[4];
    __m512 a, b;
  };

  // 64 bytes loaded into a register once. A loaded vector that the decoding uses more than once (a nibble
  // plane: its low nibbles and, shifted, its high ones) was otherwise folded by the compiler into each use as
  // a memory operand, the same bytes read again from the cache for each use, across a line boundary where the
  // super-block straddles one: repacked Q6_K's one-row tile read its three 64-byte vectors eight times per
  // super-block. The empty asm keeps the value in a register: less time in cache for Q6_K most, Q2_K and
  // Q4_1, and from memory a Q6_K row streams faster (performance.md). (Q4_0's and Q8_0's whole code loads,
  // used once each or measured no faster with it, keep plain loads.)
  static __m512i load_once(const void* p) {
    __m512i v = _mm512_loadu_si512(p);
    asm("" : "+v"(v));
    return v;
  }

  // The same for 32 bytes broadcast to both halves of a vector.
  static __m512i broadcast_once(const void* p) {
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    asm("" : "+v"(v));
    return v;
  }

  static float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

  // The fold of a weight type (accumulate_super in quant_avx512_kernels.h), or 0.
  static constexpr int fold_of(DType type) {
    return type == DType::Q4_0 ? 3 : type == DType::Q6_K ? 5 : type == DType::Q8_0 ? 7 : 0;
  }
};

}  // namespace tandem::kernels
