// The signed form of the AVX-512 kernels' super-blocks (Q4_0, Q6_K and Q8_0 in windows): the registers, their
// loaders, the per-row work and the window rows that take it. Static members of a template over the variant's
// Isa (Avx512Isa, quant_regs_avx512.h), which each AVX-512 variant instantiates inside its `#pragma GCC
// target` region.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_regs_avx512.h"
#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

template <Avx512Isa Isa>
struct Avx512SignedForm {
  using Regs = Avx512Regs<Isa>;
  using SuperRegs = typename Regs::SuperRegs;

  // The signed form of a super-block with a fixed offset (quant_layout.h): codes s = u - kOffset against the
  // biased activation codes qb = q + 128, each group sum started at -128 * sum(s), so that it ends at sum(s *
  // q), the same integer as the unsigned form's. Per activation row this reads the codes and scales only (the
  // unsigned form also reads the offset sums); the correction costs a few operations per weight super-block,
  // which pays in windows (signed_min_rows).
  struct SignedRegs {
    __m512i s[4];  // codes, quarter by quarter
    __m512i init;  // -128 times the lane sums of s
    __m512 a;      // group scales
  };

  // The signed form of super-block registers r whose codes give weight = a * (u - kOffset); kOffset 0 (Q8_0's
  // signed codes) or at most 32 with codes below 64 (Q4_0, Q6_K), whose four quarters then add up bytewise
  // without overflow.
  template <int kOffset>
  static void signed_regs(const SuperRegs& r, SignedRegs& s) {
    s.a = r.a;
    if constexpr (kOffset == 0) {
      const __m512i k128 = _mm512_set1_epi8(static_cast<char>(0x80));
      __m512i t = _mm512_setzero_si512();  // 128 times the lane sums
      for (int q = 0; q < 4; ++q) {
        s.s[q] = r.u[q];
        t = _mm512_dpbusd_epi32(t, k128, s.s[q]);
      }
      s.init = _mm512_sub_epi32(_mm512_setzero_si512(), t);
    } else {
      static_assert(kOffset > 0 && kOffset <= 32);
      const __m512i off = _mm512_set1_epi8(static_cast<char>(kOffset));
      for (int q = 0; q < 4; ++q) s.s[q] = _mm512_sub_epi8(r.u[q], off);
      const __m512i u_sum = _mm512_add_epi8(_mm512_add_epi8(r.u[0], r.u[1]), _mm512_add_epi8(r.u[2], r.u[3]));
      // -128 * (sum(u) - 16 * kOffset) over the 16 elements of each lane
      s.init = _mm512_dpbusd_epi32(_mm512_set1_epi32(128 * 16 * kOffset), u_sum,
                                   _mm512_set1_epi8(static_cast<char>(-128)));
    }
  }

  // The signed form of the super-block at sb, through Load's registers.
  template <void (*Load)(const uint8_t*, SuperRegs&), int kOffset>
  static void load_signed(const uint8_t* sb, SignedRegs& s) {
    SuperRegs r;
    Load(sb, r);
    signed_regs<kOffset>(r, s);
  }

  // The same for a repacked row's partial last super-block, in place (tail_loader).
  template <void (*TailLoad)(const uint8_t*, int, SuperRegs&), int kOffset>
  static void load_signed_tail(const uint8_t* p, int blocks, SignedRegs& s) {
    SuperRegs r;
    TailLoad(p, blocks, r);
    signed_regs<kOffset>(r, s);
  }

  // The per-row work of one super-block in the signed form for kW weight rows (1: direct_tile, 2: pair_tile),
  // one definition so that every tile computes the same bits: for each weight row, four vpdpbusd from the
  // weights' correction add the biased activation codes' products lane by lane into the 16 group sums, then
  // one convert and one scaling per group (as accumulate_super). The rows' instructions are interleaved (as
  // two separate calls they measured slower at 8 rows in cache; performance.md).
  template <int kW>
  static void accumulate_signed(const SignedRegs* w, const __m512i* qb, __m512 d, __m512* const* acc) {
    __m512i sum[kW];
    for (int i = 0; i < kW; ++i) sum[i] = w[i].init;
    for (int q = 0; q < 4; ++q)
      for (int i = 0; i < kW; ++i) sum[i] = _mm512_dpbusd_epi32(sum[i], qb[q], w[i].s[q]);
    for (int i = 0; i < kW; ++i)
      *acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i]), _mm512_mul_ps(w[i].a, d), *acc[i]);
  }

  // The biased activation codes of one super-block, quarter by quarter.
  static void load_biased_codes(const ActSuper& X, __m512i* qb) {
    for (int q = 0; q < 4; ++q) qb[q] = _mm512_load_si512(X.qb + 64 * q);
  }

  // Window rows from which the direct kernels take the signed form, by offset fold: from there it took less
  // time than the unsigned form over a token's matrices from memory. One row stays unsigned: in cache the
  // signed form costs more there, which binds when the machine's bandwidth is high. So do two rows of Q8_0,
  // whose correction (four vpdpbusd per weight super-block) the two rows share: in cache the signed form took
  // longer, from memory about the same, and two-row windows cost less unsigned (performance.md, signed form).
  static constexpr int signed_min_rows(int fold) {
    return fold == Regs::fold_of(DType::Q4_0) ? 4 : fold == Regs::fold_of(DType::Q8_0) ? 3 : 2;  // Q6_K: 2
  }
};

}  // namespace tandem::kernels
