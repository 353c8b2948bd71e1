// Q4_0, Q4_K and Q8_0 rows in lane pairs on AVX-512 (WeightForm::kLanePairs, repack.h), against activations
// in lane pairs (ActForm::kLanePairs, quant_layout.h): a pair's registers, their loaders, the per-row work
// and the window rows that take two weight rows a tile. Static members of a template over the variant's Isa
// (Avx512Isa, quant_regs_avx512.h), which each AVX-512 variant instantiates inside its `#pragma GCC target`
// region; its tiles and row driver (lane_pair_group, lane_pair_rows) are in quant_avx512_kernels.h.
//
// Per pair of super-blocks (288 bytes; Q8_0 544) and weight row: the 16 block scales converted at once (Q4_K:
// and its 16 minimums, decoded from the 24 header bytes), and four code vectors whose low and high nibbles
// are the pair's eight vectors, lane b block b (Q8_0: its eight code vectors as stored). Per activation row:
// eight vpdpbusd into one integer sum per block, then one convert, one multiply of the scales and one FMA
// (Q4_K: and one more for its minimums against the activation block sums), where the interleaved form
// (load_q4_0x_super) takes four vpdpbusd, a scale permute, two offset and scale loads, a multiply, a convert
// and an FMA per 256 elements, and Q4_K (load_q4_kx_super) 13 operations to decode each super-block's scales
// and two FMAs per 256 elements (Q8_0, load_q8_0x_super: as Q4_0's). Every row class (one weight row or two,
// unsigned or signed codes, whole rows or column chunks) does the same per-row work, so a row's result does
// not depend on the rows beside it. (The integer block sums are exact, so the signed and unsigned forms give
// the same ones.)
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_legacy_avx512.h"
#include "tandem/kernels/quant_regs_avx512.h"
#include "tandem/kernels/quant_signed_avx512.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

template <Avx512Isa Isa>
struct Avx512LanePairs {
  using Regs = Avx512Regs<Isa>;
  using Legacy = Avx512LegacyLoaders<Isa>;
  using SignedForm = Avx512SignedForm<Isa>;

  // Bytes of a pair of super-blocks of kType.
  template <DType kType>
  static constexpr int64_t kPairBytes = static_cast<int64_t>(lane_pair_bytes(kType));

  // Which tiles load their code vectors in 16-byte pieces (load_codes64) rather than as whole aligned
  // vectors: Q4_0's of one and three rows, which in cache run faster whole but from memory stream faster in
  // pieces (whatever the prefetch distance); two rows take less time whole. Q4_K, with more work per pair,
  // loads whole vectors at one row too. Q8_0 (eight code vectors a pair) loads pieces for one to three rows,
  // where whole vectors lost to the interleaved form. Figures: performance.md, lane pairs.
  static constexpr bool lane_pair_pieces(DType type, int rows) {
    if (type == DType::Q8_0) return rows <= 3;
    return type == DType::Q4_0 && (rows == 1 || rows == 3);
  }

  // One weight row's pair of super-blocks in registers, unsigned: weight = a * (u - 8).
  struct LanePairRegs {
    __m512i u[8];  // vector v: codes of elements 32b + 4v + i in lane b
    __m512 a;      // block scales
  };

  // The same signed (as SignedRegs): codes s = u - 8, and -128 times each block's sum of s to start its sums
  // against the biased activation codes.
  struct LanePairSigned {
    __m512i s[8];
    __m512i init;
    __m512 a;
  };

  // One weight row's Q8_0 pair in registers: weight = a * (u - 128), u as stored (repack.h).
  struct LanePairQ8Regs {
    __m512i u[8];  // vector v: codes of elements 32b + 4v + i in lane b
    __m512 a;      // block scales
  };

  // One weight row's Q4_K pair in registers: weight = a * u - m.
  struct LanePairK4Regs {
    __m512i u[8];  // as LanePairRegs
    __m512 a;      // block scales, d * scale
    __m512 m;      // block minimums, dmin * min
  };

  // Codes, then scales: a pair on a cache line keeps its header after its codes (repack.h), so the loads run
  // in address order. Where the matrix starts on 32 bytes (the loader picks the form only there) each code
  // vector lies within one cache line, loaded whole or in pieces (lane_pair_pieces); before, every other
  // pair's vectors straddled two lines, and whole loads of them decoded slower than pieces.
  template <bool kPieces>
  static void load_lane_pair_codes(const uint8_t* p, __m512i* u) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const uint8_t* codes = p + lane_pair_codes_offset(p);
    for (int v = 0; v < 4; ++v) {
      const __m512i c = Legacy::template load_codes64<kPieces>(codes + 64 * v);
      u[v] = _mm512_and_si512(c, nib);
      u[4 + v] = _mm512_and_si512(_mm512_srli_epi16(c, 4), nib);
    }
  }

  template <bool kPieces = false>
  static void load_lane_pair(const uint8_t* p, LanePairRegs& r) {
    load_lane_pair_codes<kPieces>(p, r.u);
    r.a = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + lane_pair_scales_offset(DType::Q4_0, p))));
  }

  // A Q8_0 pair: its eight code vectors as stored, then the scales.
  template <bool kPieces = false>
  static void load_lane_pair(const uint8_t* p, LanePairQ8Regs& r) {
    const uint8_t* codes = p + lane_pair_codes_offset(p);
    for (int v = 0; v < 8; ++v) r.u[v] = Legacy::template load_codes64<kPieces>(codes + 64 * v);
    r.a = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + lane_pair_scales_offset(DType::Q8_0, p))));
  }

  // A Q4_K pair: the 6-bit scales and minimums of its 16 blocks from the header's nibble bytes (lane b: byte
  // 8
  // + b) and top bits (lane b: byte 24 + b % 8, shifted right by 4 for b >= 8), in about 15 operations for
  // the pair where the interleaved form's k4_scales takes 13 per super-block; the products d * scale and dmin
  // * min rounded once each, as the file form's.
  template <bool kPieces = false>
  static void load_lane_pair(const uint8_t* p, LanePairK4Regs& r) {
    load_lane_pair_codes<kPieces>(p, r.u);
    const uint8_t* h = p + lane_pair_scales_offset(DType::Q4_K, p);
    int64_t top_bytes;
    std::memcpy(&top_bytes, h + 24, 8);
    const __m512i low = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 8)));
    const __m512i top = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_set1_epi64x(top_bytes)),
                                          _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4));
    const __m512i bits45 = _mm512_set1_epi32(0x30);
    // scale = (low & 15) | (top << 4 & 0x30), min = low >> 4 | (top << 2 & 0x30)
    const __m512i scale = _mm512_ternarylogic_epi32(_mm512_and_si512(low, _mm512_set1_epi32(15)),
                                                    _mm512_slli_epi32(top, 4), bits45, 0xF8);
    const __m512i min =
        _mm512_ternarylogic_epi32(_mm512_srli_epi32(low, 4), _mm512_slli_epi32(top, 2), bits45, 0xF8);
    // d0, dmin0, d1, dmin1: lanes 0..7 take the first super-block's, 8..15 the second's.
    const __m512 dm =
        _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h))));
    r.a = _mm512_mul_ps(
        _mm512_cvtepi32_ps(scale),
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), dm));
    r.m = _mm512_mul_ps(
        _mm512_cvtepi32_ps(min),
        _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), dm));
  }

  static void load_lane_pair_signed(const uint8_t* p, LanePairSigned& s) {
    LanePairRegs r;
    load_lane_pair(p, r);
    s.a = r.a;
    const __m512i eight = _mm512_set1_epi8(8);
    __m512i u_sum = r.u[0];  // bytewise: at most 8 * 15
    for (int v = 1; v < 8; ++v) u_sum = _mm512_add_epi8(u_sum, r.u[v]);
    for (int v = 0; v < 8; ++v) s.s[v] = _mm512_sub_epi8(r.u[v], eight);
    // -128 * (sum(u) - 32 * 8) over the 32 elements of each block
    s.init = _mm512_dpbusd_epi32(_mm512_set1_epi32(128 * 32 * 8), u_sum,
                                 _mm512_set1_epi8(static_cast<char>(-128)));
  }

  // The float half of the per-row work: each weight row's two chains of block sums added, then one convert
  // and one scaling per block into *acc[i].
  template <int kW, typename W>
  static void scale_block_sums(const __m512i* sum, const __m512i* half, const W* w, const ActSuper* X,
                               __m512* const* acc) {
    const __m512 d = _mm512_load_ps(X[0].d);
    for (int i = 0; i < kW; ++i)
      *acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum[i], half[i])),
                                _mm512_mul_ps(w[i].a, d), *acc[i]);
  }

  // An activation vector that kW weight rows use: loaded once into a register where more than one uses it
  // (the compiler folded it into each use, one load per weight row), which made Q8_0's and Q4_K_M's window
  // products faster. Q4_0's signed form, faster so in cache but slower in whole forwards, keeps plain loads
  // (performance.md, lane pairs).
  template <int kW>
  static __m512i act_load(const void* p) {
    if constexpr (kW > 1) {
      return Regs::load_once(p);
    } else {
      return _mm512_load_si512(p);
    }
  }

  // The per-row work, one definition for every tile of unsigned codes: kW weight rows against the activation
  // pair X (X[0], X[1]), each row's block sums started at the offset sums of fold kFold (codes with a fixed
  // offset: Q4_0 -8, Q8_0 -128) or at zero (kFold 0: Q4_K), then one convert and one scaling per block into
  // *acc[i]. (The signed form, below, starts them at its correction.)
  template <int kW, int kFold, typename W>
  static void lane_pair_row_unsigned(const W* w, const ActSuper* X, __m512* const* acc) {
    __m512i sum[kW], half[kW];
    __m512i init = _mm512_setzero_si512();
    if constexpr (kFold != 0) init = _mm512_load_si512(X[0].offset_sums[fold_index(kFold)]);
    for (int i = 0; i < kW; ++i) sum[i] = init, half[i] = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      const __m512i q = act_load<kW>(X[0].q + 64 * v), q4 = act_load<kW>(X[1].q + 64 * v);
      for (int i = 0; i < kW; ++i) {
        sum[i] = _mm512_dpbusd_epi32(sum[i], w[i].u[v], q);
        half[i] = _mm512_dpbusd_epi32(half[i], w[i].u[4 + v], q4);
      }
    }
    scale_block_sums<kW>(sum, half, w, X, acc);
  }

  template <int kW>
  static void lane_pair_row(const LanePairRegs* w, const ActSuper* X, __m512* const* acc) {
    lane_pair_row_unsigned<kW, Regs::fold_of(DType::Q4_0)>(w, X, acc);
  }

  template <int kW>
  static void lane_pair_row(const LanePairQ8Regs* w, const ActSuper* X, __m512* const* acc) {
    lane_pair_row_unsigned<kW, Regs::fold_of(DType::Q8_0)>(w, X, acc);
  }

  template <int kW>
  static void lane_pair_row(const LanePairSigned* w, const ActSuper* X, __m512* const* acc) {
    __m512i sum[kW], half[kW];
    for (int i = 0; i < kW; ++i) sum[i] = w[i].init, half[i] = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      const __m512i qb = _mm512_load_si512(X[0].qb + 64 * v), qb4 = _mm512_load_si512(X[1].qb + 64 * v);
      for (int i = 0; i < kW; ++i) {
        sum[i] = _mm512_dpbusd_epi32(sum[i], qb, w[i].s[v]);
        half[i] = _mm512_dpbusd_epi32(half[i], qb4, w[i].s[4 + v]);
      }
    }
    scale_block_sums<kW>(sum, half, w, X, acc);
  }

  // Q4_K: the block sums from zero, then the scaling as Q4_0's and one FMA of the minimums against the
  // activation block sums (ActSuper::bs: each block's code sum times its scale).
  template <int kW>
  static void lane_pair_row(const LanePairK4Regs* w, const ActSuper* X, __m512* const* acc) {
    lane_pair_row_unsigned<kW, 0>(w, X, acc);
    const __m512 bs = _mm512_load_ps(X[0].bs);
    for (int i = 0; i < kW; ++i) *acc[i] = _mm512_fnmadd_ps(w[i].m, bs, *acc[i]);
  }

  // Window rows from which lane pairs take two weight rows a tile (one at a time below): from 4 rows Q4_0's
  // window products took less time so in either memory state. In cache two rows a tile lose at 4 to 6 rows:
  // their 20 registers of weights (eight code vectors, the correction and the scales per row) leave too few
  // for the accumulators.
  static constexpr int kLanePairMinRows = 4;
  // Q4_K (whose two rows hold their minimums where Q4_0's hold the correction) takes two weight rows a tile
  // at 4 to 6 rows only: faster at 4, even at 5 and 6, slower at 3, 7 and 8. Q8_0 takes two weight rows a
  // tile from 7 rows: below, one row at a time beats both two a tile and the interleaved form. Figures:
  // performance.md, lane pairs.
  static constexpr bool lane_pair_two_rows(DType type, int64_t rows) {
    if (type == DType::Q8_0) return rows >= 7;
    return rows >= kLanePairMinRows && (type != DType::Q4_K || rows <= 6);
  }
};

}  // namespace tandem::kernels
