// Activation rows quantized on AVX-512 into ActSuper (quant_layout.h), vectorized; the same bits as
// quantize_row_impl. Static members of a template over a variant's unpacking helpers (UnpackOps,
// quant_unpack.h), which each AVX-512 variant instantiates with its own Ops inside its `#pragma GCC target`
// region.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/tensor/fp16.h"

namespace tandem::kernels {

template <UnpackOps Ops>
struct Avx512ActQuant {
  using Unpack = QuantUnpack<Ops>;

  // Round half away from zero, as round_away: truncate, then step by one where the exact remainder is at
  // least one half.
  static __m512i round_away16(__m512 v) {
    const __m512i t = _mm512_cvttps_epi32(v);
    const __m512 frac = _mm512_sub_ps(v, _mm512_cvtepi32_ps(t));
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i up =
        _mm512_mask_add_epi32(t, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ), t, one);
    return _mm512_mask_sub_epi32(up, _mm512_cmp_ps_mask(frac, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), up, one);
  }

  // Codes of 16 elements (int32 lanes) to s.q at e.
  static void store_codes16(ActSuper& s, int e, __m512i c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(s.q + e), _mm512_cvtepi32_epi8(c));
  }

  // to_lane_pairs (quant_unpack.h) from block order, in registers: dword 2j + h of quarter q of super s holds
  // dword 2q + h of its block j (elements 8q + 4h..), which lane pairs put in lane 8s + j of vector 2q + h,
  // so each vector of the pair is one two-source dword permute of the two supers' quarters; the block scales
  // and offset sums gather the same way, with the two groups' sums of each block added.
  static void block_order_to_lane_pairs(ActSuper* pair) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __m512i quarter[2][4];
    for (int s = 0; s < 2; ++s)
      for (int q = 0; q < 4; ++q) quarter[s][q] = _mm512_load_si512(pair[s].q + 64 * q);
    const __m512 d = _mm512_permutex2var_ps(_mm512_load_ps(pair[0].d), even, _mm512_load_ps(pair[1].d));
    __m512i sums[3];
    for (int f = 0; f < 3; ++f) {
      const __m512i a = _mm512_load_si512(pair[0].offset_sums[f]),
                    b = _mm512_load_si512(pair[1].offset_sums[f]);
      sums[f] = _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
    }
    for (int v = 0; v < 8; ++v)
      _mm512_store_si512(pair[v / 4].q + 64 * (v % 4),
                         _mm512_permutex2var_epi32(quarter[0][v / 2], v % 2 ? odd : even, quarter[1][v / 2]));
    _mm512_store_ps(pair[0].d, d);
    // The block's code sum is minus its -8 fold's offset sum over 8, exactly.
    _mm512_store_ps(
        pair[0].bs,
        _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_srai_epi32(sums[0], 3))), d));
    for (int f = 0; f < 3; ++f) _mm512_store_si512(pair[0].offset_sums[f], sums[f]);
    _mm512_store_ps(pair[1].d, _mm512_setzero_ps());
    _mm512_store_ps(pair[1].bs, _mm512_setzero_ps());
    for (int f = 0; f < 3; ++f) _mm512_store_si512(pair[1].offset_sums[f], _mm512_setzero_si512());
  }

  // The activation row x of k floats in the given form, as quantize_row_impl quantizes it (test_kernels
  // compares them).
  static void quantize_row(const float* x, int64_t k, ActForm form, ActSuper* out) {
    // (This target never reads per-256 activations in the legacy order: QuantKernels::k4_block_lanes.)
    if (form == ActForm::kSuperLanes) return Unpack::quantize_row_impl(x, k, form, out);
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    int64_t j = 0;  // 32-element blocks done
    if (form == ActForm::kSupers) {
      for (; (j + 8) * 32 <= k; j += 8) {
        ActSuper& s = out[j / 8];
        const float* xs = x + j * 32;
        __m512 v[16];
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < 16; ++i) {
          v[i] = _mm512_loadu_ps(xs + 16 * i);
          m = _mm512_max_ps(m, _mm512_and_ps(v[i], abs_mask));
        }
        const float amax = _mm512_reduce_max_ps(m);
        float max = 0.0f;  // the first element of largest magnitude, with its sign
        if (amax != 0.0f) {
          for (int i = 0; i < 16; ++i) {
            const __mmask16 hit =
                _mm512_cmp_ps_mask(_mm512_and_ps(v[i], abs_mask), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (hit != 0) {
              max = xs[16 * i + __builtin_ctz(hit)];
              break;
            }
          }
        }
        const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
        const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
        const __m512 vs = _mm512_set1_ps(iscale);
        int32_t sums[16];
        for (int i = 0; i < 16; ++i) {
          // round_even: the float adder rounds to nearest even at 2^23 + 2^22.
          const __m512 shifted = _mm512_add_ps(_mm512_mul_ps(vs, v[i]), _mm512_set1_ps(12582912.0f));
          const __m512i c = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(0x4B400000));
          const __m512i code = _mm512_min_epi32(c, _mm512_set1_epi32(127));
          store_codes16(s, 16 * i, code);
          sums[i] = _mm512_reduce_add_epi32(code);  // group order: a lane group is 16 consecutive elements
        }
        for (int b = 0; b < 8; ++b) Unpack::set_block(s, 32 * b, d, sums[2 * b], sums[2 * b + 1]);
        Ops::interleave_groups(reinterpret_cast<uint8_t*>(s.q));
      }
    }
    const int64_t nb = k / 32;
    const bool natural = form == ActForm::kNatural;
    for (; j < nb; ++j) {
      ActSuper& s = out[j / 8];
      const int e0 = static_cast<int>(j % 8) * 32;
      const __m512 x0 = _mm512_loadu_ps(x + j * 32), x1 = _mm512_loadu_ps(x + j * 32 + 16);
      const float amax =
          _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_and_ps(x1, abs_mask)));
      const float d = amax / 127.0f;
      const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
      const __m512i c0 = round_away16(_mm512_mul_ps(x0, id)), c1 = round_away16(_mm512_mul_ps(x1, id));
      store_codes16(s, e0, c0);
      store_codes16(s, e0 + 16, c1);
      const __m512i c = _mm512_add_epi32(c0, c1);
      if (natural) {
        Unpack::set_act_group(s, e0 / 32, Ops::half_to_float(f32_to_fp16(d)), _mm512_reduce_add_epi32(c));
        if (j % 8 == 7) Unpack::finish_natural_super(s, 8);
        continue;
      }
      // Block order: lane group 2j takes the even 4-element runs of the block, 2j + 1 the odd ones.
      Unpack::set_legacy_block(s, e0, Ops::half_to_float(f32_to_fp16(d)),
                               _mm512_mask_reduce_add_epi32(0x0F0F, c),
                               _mm512_mask_reduce_add_epi32(0xF0F0, c));
      if (j % 8 == 7) Ops::interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
    }
    if (nb % 8 != 0 && natural) Unpack::finish_natural_super(out[nb / 8], static_cast<int>(nb % 8));
    if (nb % 8 != 0 && !natural) Unpack::finish_partial_super(out[nb / 8], static_cast<int>(nb % 8) * 32);
    if (form == ActForm::kLanePairs)
      for (int64_t i = 0; i + 1 < super_count(k); i += 2) block_order_to_lane_pairs(out + i);
    Unpack::bias_codes(out, super_count(k));
  }
};

}  // namespace tandem::kernels
