// Quantized dot products on AVX2: vpmaddubsw multiplies unsigned weight codes (at most 127, so pairs never
// saturate) by signed activation codes and vpmaddwd sums pairs into 32-bit lanes. Q8_0 codes stay signed and
// use the sign trick |w| * sign(x, w). Up to 4 activation rows share each unpacked weight vector, up to 8
// each directly decoded one. The legacy types and their activations are in block lanes (quant_layout.h), the
// K-quants in group order.
//
// Every helper that takes, fills or returns vectors is always inlined (here and in quant_kquants_avx2.inc):
// GCC 12 left the per-row work, the Q6_K and Q8_0 loaders and others as calls from the tiles, passing the
// vectors through memory with a vzeroupper per call; a one-row Q4_0 matmul in cache took 1.6-1.9x the time.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

namespace tandem::kernels {
namespace avx2_target {

#include "tandem/kernels/quant_x86_helpers.inc"

// Two 16-byte pieces into one vector (low half a, high half b); the insert takes its operand from memory.
[[gnu::always_inline]] inline __m256i load_pair(const uint8_t* a, const uint8_t* b) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}

// Eight groups (four pairs of groups 2m, 2m + 1 with m < 4) into the four quarter vectors that hold them,
// all in registers: p0 / h0 hold the first / second group of pairs 0 (low half) and 2 (high half), p1 / h1
// those of pairs 1 and 3. Dword unpacks give (group 2m, group 2m + 1) qwords per quarter, qword unpacks then
// line up pairs 0..3; no lane crossing, as the loads already split the pairs over the two halves. Quarter q
// goes to out[2 * q].
[[gnu::always_inline]] inline void transpose_groups(__m256i p0, __m256i h0, __m256i p1, __m256i h1,
                                                    __m256i* out) {
  const __m256i a0 = _mm256_unpacklo_epi32(p0, h0), b0 = _mm256_unpackhi_epi32(p0, h0);
  const __m256i a1 = _mm256_unpacklo_epi32(p1, h1), b1 = _mm256_unpackhi_epi32(p1, h1);
  out[0] = _mm256_unpacklo_epi64(a0, a1);
  out[2] = _mm256_unpackhi_epi64(a0, a1);
  out[4] = _mm256_unpacklo_epi64(b0, b1);
  out[6] = _mm256_unpackhi_epi64(b0, b1);
}

// Element order to group-interleaved order (quant_layout.h): vector 2q + h (32 bytes) holds quarter q of
// groups 8h..8h+7. Everything is loaded before anything is stored (in place), and the loads are 16 bytes,
// so each stays inside one earlier store of the codes and forwards from it.
inline void interleave_groups(uint8_t* codes) {
  __m256i v[8];
  for (int h = 0; h < 2; ++h) {
    const uint8_t* c = codes + 128 * h;  // pairs of groups 4h..4h+3, 32 bytes each
    transpose_groups(load_pair(c, c + 64), load_pair(c + 16, c + 80), load_pair(c + 32, c + 96),
                     load_pair(c + 48, c + 112), v + h);
  }
  for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * i), v[i]);
}

// Block order (quant_layout.h) from two vectors holding the same 16-byte half of four blocks: x02 of blocks 0
// (low half) and 2, x13 of blocks 1 and 3. Qword unpacks line up the four blocks' first and second qwords:
// quarters 2p and 2p + 1 of the half p, for out[0] and out[2].
[[gnu::always_inline]] inline void block_quarters(__m256i x02, __m256i x13, __m256i* out) {
  out[0] = _mm256_unpacklo_epi64(x02, x13);
  out[2] = _mm256_unpackhi_epi64(x02, x13);
}

// Block order to block lanes (quant_layout.h), in registers: vectors 2q and 2q + 1 of block order hold
// quarter q (8 bytes a block) of blocks 0..3 and 4..7; their even 32-bit lanes are the first 4 bytes of each
// block's quarter, the odd ones the last 4, and one shuffle per output picks them into lanes of blocks 0, 1,
// 4, 5 | 2, 3, 6, 7 (kLaneBlock).
[[gnu::always_inline]] inline void lanes_from_pair(__m256i lo, __m256i hi, __m256i& even, __m256i& odd) {
  const __m256 a = _mm256_castsi256_ps(lo), b = _mm256_castsi256_ps(hi);
  even = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88));
  odd = _mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD));
}

[[gnu::always_inline]] inline void block_lanes(__m256i* u) {
  for (int q = 0; q < 4; ++q) lanes_from_pair(u[2 * q], u[2 * q + 1], u[2 * q], u[2 * q + 1]);
}

// Eight per-block floats (block j in element j) in block lanes: lane L takes block kLaneBlock[L].
[[gnu::always_inline]] inline __m256 lane_order(__m256 d) {
  return _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

// Element order to block lanes: block order first (vector 2q + h holds quarter q of blocks 4h..4h+3), then
// block_lanes. Loaded before stored, in 16-byte pieces that each lie inside one earlier store.
inline void interleave_blocks(uint8_t* codes) {
  __m256i v[8];
  for (int h = 0; h < 2; ++h) {
    const uint8_t* c = codes + 128 * h;  // blocks 4h..4h+3, 32 bytes each
    block_quarters(load_pair(c, c + 64), load_pair(c + 32, c + 96), v + h);
    block_quarters(load_pair(c + 16, c + 80), load_pair(c + 48, c + 112), v + 4 + h);
  }
  block_lanes(v);
  for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 32 * i), v[i]);
}

constexpr bool kBlockLanes = true;  // the legacy types in block lanes (quant_layout.h)

#include "tandem/kernels/quant_unpack.inc"

// One super-block held in registers in the unpacked form: in group order vector 2q + h holds quarter q of
// groups 8h..8h+7 (UnpackedSuper::u) and a[h], b[h] the scales and offsets of groups 8h..8h+7; in block lanes
// (the legacy types) vector v holds elements 4v..4v+3 of each lane's block, a[0], b[0] their scales and
// offsets, and a[1], b[1] are zero.
struct SuperRegs {
  __m256i u[8];
  __m256 a[2], b[2];
};

[[gnu::always_inline]] inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

#include "tandem/kernels/quant_kquants_avx2.inc"
#include "tandem/kernels/quant_legacy_avx2.inc"

template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes>
inline void unpack_supers(const uint8_t* row, int64_t n_super, UnpackedSuper* out) {
  for (int64_t i = 0; i < n_super; ++i) {
    SuperRegs s;
    Load(row + i * kSuperBytes, s);
    for (int v = 0; v < 8; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(out[i].u + 32 * v), s.u[v]);
    for (int h = 0; h < 2; ++h) {
      _mm256_store_ps(out[i].a + 8 * h, s.a[h]);
      _mm256_store_ps(out[i].b + 8 * h, s.b[h]);
    }
  }
}

// Activation quantization, vectorized; the same bits as quantize_row_impl (test_kernels compares them).

[[gnu::always_inline]] inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

[[gnu::always_inline]] inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Round half away from zero, as round_away: truncate, then step by one where the exact remainder is at
// least one half (comparison masks are -1, so subtracting one adds one).
[[gnu::always_inline]] inline __m256i round_away8(__m256 v) {
  const __m256i t = _mm256_cvttps_epi32(v);
  const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
  const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ));
  const __m256i down = _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ));
  return _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
}

// 32 codes (four vectors of 8 int32 in element order, each in [-127, 127]) to s.q at e0, and the code sums of
// the block's two lane groups: 16 consecutive elements each (group order) or alternate 4-element runs (block
// order).
[[gnu::always_inline]] inline void store_codes32(ActSuper& s, int e0, const __m256i* c, bool block_order,
                                                 int32_t& sum0, int32_t& sum1) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.q + e0),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  if (block_order) {
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
    sum0 = hsum8(_mm256_blend_epi32(t, _mm256_setzero_si256(), 0xF0));
    sum1 = hsum8(_mm256_blend_epi32(t, _mm256_setzero_si256(), 0x0F));
  } else {
    sum0 = hsum8(_mm256_add_epi32(c[0], c[1]));
    sum1 = hsum8(_mm256_add_epi32(c[2], c[3]));
  }
}

void quantize_row(const float* x, int64_t k, ActForm form, ActSuper* out) {
  // (This target never reads natural order: QuantKernels::row_tiles.)
  if (form == ActForm::kNatural) return quantize_row_impl(x, k, form, out);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  int64_t j = 0;  // 32-element blocks done
  if (form == ActForm::kSupers) {
    for (; (j + 8) * 32 <= k; j += 8) {
      ActSuper& s = out[j / 8];
      const float* xs = x + j * 32;
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < 32; ++i) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xs + 8 * i), abs_mask));
      const float amax = hmax8(m);
      float max = 0.0f;  // the first element of largest magnitude, with its sign
      if (amax != 0.0f) {
        for (int i = 0; i < 32; ++i) {
          const int hit = _mm256_movemask_ps(_mm256_cmp_ps(
              _mm256_and_ps(_mm256_loadu_ps(xs + 8 * i), abs_mask), _mm256_set1_ps(amax), _CMP_EQ_OQ));
          if (hit != 0) {
            max = xs[8 * i + __builtin_ctz(static_cast<unsigned>(hit))];
            break;
          }
        }
      }
      const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
      const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
      const __m256 vs = _mm256_set1_ps(iscale);
      for (int b = 0; b < 8; ++b) {
        __m256i c[4];
        for (int i = 0; i < 4; ++i) {
          // round_even: the float adder rounds to nearest even at 2^23 + 2^22.
          const __m256 shifted = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(xs + 32 * b + 8 * i)),
                                               _mm256_set1_ps(12582912.0f));
          c[i] =
              _mm256_min_epi32(_mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x4B400000)),
                               _mm256_set1_epi32(127));
        }
        int32_t sum0, sum1;
        store_codes32(s, 32 * b, c, false, sum0, sum1);
        set_block(s, 32 * b, d, sum0, sum1);
      }
      interleave_groups(reinterpret_cast<uint8_t*>(s.q));
    }
  }
  const int64_t nb = k / 32;
  for (; j < nb; ++j) {
    ActSuper& s = out[j / 8];
    const int e0 = static_cast<int>(j % 8) * 32;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + j * 32 + 8 * i);
      m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
    }
    const float d = hmax8(m) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i c[4];
    for (int i = 0; i < 4; ++i) c[i] = round_away8(_mm256_mul_ps(v[i], id));
    int32_t sum0, sum1;
    store_codes32(s, e0, c, true, sum0, sum1);
    set_legacy_block(s, e0, half_to_float(f32_to_fp16(d)), sum0, sum1);
    if (j % 8 == 7) interleave_blocks(reinterpret_cast<uint8_t*>(s.q));
  }
  if (nb % 8 != 0) finish_partial_super(out[nb / 8], static_cast<int>(nb % 8) * 32);
  if (form == ActForm::kLanePairs)  // (this target never reads them: QuantKernels::lane_pairs)
    for (int64_t i = 0; i + 1 < super_count(k); i += 2) to_lane_pairs(out + i);
  bias_codes(out, super_count(k));
}

// How a weight type's offsets enter the sums. kFold > 0: the offset is -2^kFold times the scale in every
// group (Q4_0: -8, Q6_K: -32), so it is folded into the integer sums (minus 2^kFold times the activation code
// sums, exact) and the offset term vanishes. kNoOffset: signed Q8_0 codes, whose offset is zero. 0: b times
// the scaled code sums, accumulated apart.
// The legacy types are in block lanes: Q4_0 (fold 3) and signed Q8_0 (kNoOffset) as above; kLanes4 (Q4_1)
// and kLanes5 (Q5_0, Q5_1) with the offset term, their codes below 16 and 32; kLanes8 (Q8_0 stored unsigned,
// which these kernels never take: vpmaddubsw would saturate) likewise, vector by vector.
constexpr int kNoOffset = -1, kLanes4 = -2, kLanes5 = -3, kLanes8 = -4;

constexpr int fold_of(DType type, bool signed_codes) {
  if (type == DType::Q8_0) return signed_codes ? kNoOffset : kLanes8;
  switch (type) {
    case DType::Q4_0:
      return 3;
    case DType::Q6_K:
      return 5;
    case DType::Q4_1:
      return kLanes4;
    case DType::Q5_0:
    case DType::Q5_1:
      return kLanes5;
    default:
      return 0;
  }
}

constexpr bool in_block_lanes(int fold) {
  return fold == 3 || fold == kNoOffset || fold == kLanes4 || fold == kLanes5 || fold == kLanes8;
}

// The per-row work of a legacy super-block in block lanes (quant_layout.h): lane L of all eight vectors
// holds one block, so its integer sum is complete after the vectors are added (in 16 bits where codes below
// 16 allow all eight: 8 * 2 * 15 * 127 = 30480; four at a time below 32), and each row takes one convert,
// one scale product and one FMA per super-block (two per half in group order). The tiles take vectors 0, 1,
// 4 and 5 for all their rows, then 2, 3, 6 and 7 (a repacked Q4_0 super-block decodes them from two pairs of
// its code vectors), so that fewer weight vectors need registers beside each row's accumulator and partial
// sum; the integer sums do not depend on the split. Against group order: synthetic TinyLlama Q4_0 decode
// 1.03-1.09x faster (5 of 6 alternating pairs in each of two sets), cost(4) / cost(5) 1.72-1.90 / 2.15-2.40
// against 1.90-2.00 / 2.30-2.46 (three pairs); windows of 4 to 64 rows in cache 0.86-0.95x the time, Q4_1 /
// Q5_0 / Q5_1 windows 0.84-0.97x.
//
// lanes_part: the partial sum of vectors v0, v0 + 1, v0 + 4 and v0 + 5 (16-bit for codes below 16).
template <int kFold>
[[gnu::always_inline]] inline __m256i lanes_part(const __m256i* u, int v0, const ActSuper& X) {
  const __m256i ones = _mm256_set1_epi16(1);
  const auto xq = [&X](int v) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(X.q + 32 * v)); };
  const auto m = [&](int v) { return _mm256_maddubs_epi16(u[v], xq(v)); };
  if constexpr (kFold == 3 || kFold == kLanes4 || kFold == kLanes5) {
    const __m256i quad =
        _mm256_add_epi16(_mm256_add_epi16(m(v0), m(v0 + 1)), _mm256_add_epi16(m(v0 + 4), m(v0 + 5)));
    return kFold == kLanes5 ? _mm256_madd_epi16(quad, ones) : quad;
  } else {
    __m256i sum = _mm256_setzero_si256();
    for (int v : {v0, v0 + 1, v0 + 4, v0 + 5}) {
      __m256i x = xq(v), w = u[v];
      if constexpr (kFold == kNoOffset) {
        x = _mm256_sign_epi8(x, w);
        w = _mm256_sign_epi8(w, w);  // |w|, 128 for -128: vpmaddubsw reads it unsigned
      }
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
    }
    return sum;
  }
}

// The row's super-block from its two partial sums: the block sums, then the float work.
template <int kFold>
[[gnu::always_inline]] inline void lanes_finish(__m256i p0, __m256i p1, __m256 a, __m256 b, const ActSuper& X,
                                                __m256& acc) {
  __m256i sum;
  if constexpr (kFold == 3 || kFold == kLanes4) {
    sum = _mm256_madd_epi16(_mm256_add_epi16(p0, p1), _mm256_set1_epi16(1));
    if constexpr (kFold == 3)
      sum = _mm256_add_epi32(sum, _mm256_load_si256(reinterpret_cast<const __m256i*>(X.offset_sums[0])));
  } else {
    sum = _mm256_add_epi32(p0, p1);
  }
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(a, _mm256_load_ps(X.d)), acc);
  if constexpr (kFold == kLanes4 || kFold == kLanes5 || kFold == kLanes8)
    acc = _mm256_fmadd_ps(b, _mm256_load_ps(X.bs), acc);
}

// The per-row work of half h of one K-quant super-block (groups 8h..8h+7), shared by the unpacked and the
// direct kernels so that both compute the same bits, whatever number of rows runs beside it. Vector v holds
// quarter v / 2 of groups 8 * (v % 2)..+7, one group per 32-bit lane: half h reads u[h], u[2 + h], u[4 + h]
// and u[6 + h]. The tiles take half 0 for all their rows, then half 1, so that only one half's weight vectors
// need registers beside the rows' accumulators (all halves at once left 4-row tiles spilling their
// accumulators to the stack); each accumulator still takes its terms in the order h = 0, 1.
//
// The offset term of fold 0 (b times the scaled code sums) goes into the same accumulator, after the integer
// term: a second accumulator per row (as before) left 4-row tiles of Q4_K and the other fold-0 types
// spilling to the stack.
template <int kFold>
[[gnu::always_inline]] inline void accumulate_half(const __m256i* u, int h, __m256 a, __m256 b,
                                                   const ActSuper& X, __m256& acc) {
  // The K-quants' group order only: fold 0, or Q6_K's fold 5 (the legacy types are in block lanes).
  static_assert(kFold == 0 || kFold == 5);
  const __m256i ones = _mm256_set1_epi16(1);
  const auto m = [&](int q) {
    return _mm256_maddubs_epi16(u[2 * q + h],
                                _mm256_load_si256(reinterpret_cast<const __m256i*>(X.q + 32 * (2 * q + h))));
  };
  // The products are added in 16 bits before widening, as far as the codes allow: a vpmaddubsw sum is at most
  // 2 * 127 * (the largest code), so the 4-bit to 5-bit codes of fold 0 (Q2_K to Q5_K, below 32) take all
  // four quarters (4 * 7874 = 31496), Q6_K's 6-bit codes two at a time (2 * 16002 = 32004). The sums are
  // exact either way, so the bits do not change: 8 and 9 operations per row and half instead of 12. Against
  // widening each product: 2048 x 5632 Q4_K matmuls at 4 / 8 rows 0.81-0.83x / 0.87-0.94x the time (fastest
  // / median of 5 alternating runs), Q6_K at 8 rows 0.85-0.94x; synthetic TinyLlama Q4_K_M decode 36.2-37.2
  // tok/s against 29.1-32.0, prefill512 66.4-78.0 against 57.9-64.8 (three alternating pairs).
  __m256i sum;
  if constexpr (kFold == 0) {
    sum =
        _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3))), ones);
  } else {
    sum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(m(0), m(1)), ones),
                           _mm256_madd_epi16(_mm256_add_epi16(m(2), m(3)), ones));
    sum = _mm256_add_epi32(
        sum, _mm256_load_si256(reinterpret_cast<const __m256i*>(X.offset_sums[fold_index(kFold)] + 8 * h)));
  }
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(a, _mm256_load_ps(X.d + 8 * h)), acc);
  if (kFold == 0) acc = _mm256_fmadd_ps(b, _mm256_load_ps(X.bs + 8 * h), acc);
}

// One super-block of NR activation rows against one weight super-block in registers: in block lanes in two
// passes of four vectors, in group order half by half.
template <int NR, int kFold>
[[gnu::always_inline]] inline void accumulate_rows(const __m256i* u, const __m256* a, const __m256* b,
                                                   const ActSuper* x, int64_t x_stride, __m256* acc) {
  if constexpr (in_block_lanes(kFold)) {
    __m256i part[NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      part[r] = lanes_part<kFold>(u, 0, x[r * x_stride]);
      // Opaque to the optimizer: otherwise GCC reassociates each row's sums into one and computes all the
      // products of all rows first, spilling them (Q4_0 4-row windows 1.3x the time).
      __asm__("" : "+x"(part[r]));
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const ActSuper& X = x[r * x_stride];
      lanes_finish<kFold>(part[r], lanes_part<kFold>(u, 2, X), a[0], b[0], X, acc[r]);
    }
  } else {
    // Both loops unrolled: as a loop over h, GCC kept the weight vectors on the stack and indexed
    // them (Q6_K windows of 6 / 8 / 64 rows took 1.3-1.5x the time).
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) accumulate_half<kFold>(u, h, a[h], b[h], x[r * x_stride], acc[r]);
  }
}

[[gnu::always_inline]] inline float finish_row(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

template <int NR, int kFold>
void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
              int64_t y_stride) {
  __m256 acc[NR];
#pragma GCC unroll 8  // (a loop here becomes a memset: direct_tile)
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    __m256i u[8];
    for (int v = 0; v < 8; ++v) u[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(W.u + 32 * v));
    const __m256 a[2] = {_mm256_load_ps(W.a), _mm256_load_ps(W.a + 8)};
    const __m256 b[2] = {_mm256_load_ps(W.b), _mm256_load_ps(W.b + 8)};
    accumulate_rows<NR, kFold>(u, a, b, x + s, x_stride, acc);
  }
  for (int r = 0; r < NR; ++r) y[r * y_stride] = finish_row(acc[r]);
}

// Every tile prefetches into L1, kPrefetchBytes ahead. On a Zen 2 core one row streamed from memory fastest
// at 1 KB (MatmulCold, one thread, three alternating rounds, against 3 KB: Q4_0 1.11-1.14x the rate, Q8_0
// 1.12x, Q6_K 1.04-1.07x, Q4_K 0.98x; 512 bytes and 2 KB slower than 1 KB; windows alike; into L2 at 1-6
// KB no faster; synthetic TinyLlama decode 1.08x for Q4_0 and 1.10x for Q8_0, Q4_K_M alike, alternating
// runs). On a Zen 3 core 1.5, 3 and 6 KB had measured alike.
constexpr int64_t kPrefetchBytes = 1024;
constexpr bool l2_prefetch(int, int64_t) {
  return false;
}
constexpr int64_t kL2PrefetchBytes = kPrefetchBytes;
// One distance (PrefetchReach::kFar is kNear): no longer one measured on an AVX2 machine.
constexpr int64_t far_prefetch_bytes(int, int64_t) {
  return 0;
}
// No second prefetch (TilePart::again): measured only under AVX-512 (quant_avx512.inc).
constexpr int64_t again_prefetch_bytes(int, int64_t, int64_t) {
  return 0;
}

// Direct kernels: weight rows straight from their file bytes, each super-block decoded into registers and
// applied to up to kDirectRows activation rows, with no unpack buffer (decode and small verify windows).
// 8 measured a little faster than 4 for 8-row windows in cache (Q4_0 and Q8_0), though not every weight
// vector stays in a register at 8 rows.
constexpr int64_t kDirectRows = 8;

// Column chunks (quant_direct_x86.inc) for every window whose activations pass the footprint (decode, memory
// bound, keeps its one stream per weight row). The passes here have a fixed size (direct_pass_rows) and the
// L1 cache is often 32 KiB: the FFN down projection's 4- and 5-row passes read 34-42 KB of activations for
// every weight row, from L2. Chunked, 2048 weight rows of 5632 elements on one thread (MatmulK, fastest /
// median of 8 alternating runs): Q4_0 4 rows 0.69x / 0.74x the time, 5 rows 0.65x / 0.71x; Q8_0 0.77x / 0.89x
// and 0.83x / 0.92x. Synthetic TinyLlama Q4_0 prefill64 100.6-117.6 tok/s against 82.2-101.1, prefill512
// 88.5-97.2 against 78.8-87.4 (four alternating pairs).
constexpr int64_t kChunkMinRows = 2;
// Every window takes column chunks here, whatever its activations' size.
constexpr bool chunks_small_window(int64_t, int64_t) {
  return false;
}

// Q8_0 codes of this target's unpacked form and loaders: signed (vpmaddubsw saturates at 255 unsigned).
constexpr bool kSignedQ8 = true;
// The fold-0 and block-lane types with an offset term (Q4_K, Q5_K, Q4_1, Q5_0, ...) also hold a half's
// offsets b beside its scales, and 8 rows spill. Since the K-quant sums stay in 16 bits (accumulate_half),
// 5 rows in one pass beat 2 + 3 (passes of 4, before): 2048 x 5632 matmuls of 5 rows (fastest / median of 4
// alternating runs) Q4_K 0.68x / 0.79x the time, Q5_K 0.82x / 0.77x, Q4_1 0.68x / 0.74x, Q5_0 0.65x / 0.68x.
constexpr int64_t kDirectRowsOffset = 5;

// No tiles of two weight rows on this target (quant_direct_x86.inc). Not measured here: with 16 vector
// registers, two weight rows' codes and accumulators would leave few for the activations.
template <void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
          auto TailLoad = nullptr, auto TailSigned = nullptr>
int64_t pair_rows(const uint8_t*, int64_t, int64_t, int64_t, const ActSuper*, int64_t, int64_t, float*,
                  int64_t, int = 0) {
  return 0;
}

// Activation rows per unpacked-kernel tile (quant_direct_x86.inc).
constexpr size_t kDotTileRows = 4;

// Accumulator state per activation row between column chunks (quant_direct_x86.inc): acc.
constexpr int64_t kStateFloats = 8;
alignas(64) constexpr float kZeroState[kDirectRows * kStateFloats] = {};

// Signed: nullptr (this target has no signed form; see quant_layout.h).
// With a TailLoad (tail_loader), the last of the n_super super-blocks is read from part.tail by it.
template <int NR, void (*Load)(const uint8_t*, SuperRegs&), int64_t kSuperBytes, int kFold, auto Signed,
          auto TailLoad = nullptr, auto /*TailSigned: no signed forms here*/ = nullptr>
void direct_tile(const uint8_t* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
                 int64_t y_stride, const TilePart& part) {
  // The accumulators start from the state, or from a zero state on a row's first part: one form of start.
  // As a ?: of zero and a load, GCC made the arrays of tiles of 3 or more rows a memset on the stack, a rep
  // stos per weight row: 12% of a 4-row Q4_0 window's time in cache. Without it Q4_0 and Q8_0 windows of 4
  // to 64 rows in cache (MatmulHot) take 0.72-0.85x the time (fastest of 5 alternating runs).
  const float* init = part.first ? kZeroState : part.state;
  __m256 acc[NR];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_load_ps(init + kStateFloats * r);
  for (int64_t s = 0; s < n_super; ++s) {
    const uint8_t* row_s = w + s * kSuperBytes;
    prefetch_ahead<kSuperBytes>(row_s, part.prefetch);
    constexpr bool kTail = !std::is_null_pointer_v<decltype(TailLoad)>;
    const uint8_t* ws = kTail && s == n_super - 1 ? part.tail : row_s;
    SuperRegs wr;
    if constexpr (kTail && TailLoad != Load) {
      if (ws == part.tail) {
        TailLoad(ws, wr);
      } else {
        Load(ws, wr);
      }
    } else {
      Load(ws, wr);
    }
    accumulate_rows<NR, kFold>(wr.u, wr.a, wr.b, x + s, x_stride, acc);
  }
  if (part.last) {
    for (int r = 0; r < NR; ++r) y[r * y_stride] = finish_row(acc[r]);
  } else {
    for (int r = 0; r < NR; ++r) _mm256_store_ps(part.state + kStateFloats * r, acc[r]);
  }
}

// The register loader of a weight type in its file or repacked form (repack.h), with its super-block size and
// offset fold, handed to fn (call_with); false for a type this target does not decode in registers. Q8_0 is
// decoded to signed codes.
template <typename Fn>
bool with_loader(DType type, bool interleaved, Fn&& fn) {
  switch (type) {
    case DType::Q4_0:
      return interleaved ? call_with<load_q4_0x_super, kQ4_0Super, fold_of(DType::Q4_0, false)>(fn)
                         : call_with<load_q4_0_super, kQ4_0Super, fold_of(DType::Q4_0, false)>(fn);
    case DType::Q8_0:
      return interleaved ? call_with<load_q8_0x_super, kQ8_0Super, kNoOffset>(fn)
                         : call_with<load_q8_0_super, kQ8_0Super, kNoOffset>(fn);
    case DType::Q4_1:
      return !interleaved && call_with<load_legacy_super<BlockQ4_1, true, false>, 8 * sizeof(BlockQ4_1),
                                       fold_of(DType::Q4_1, false)>(fn);
    case DType::Q5_0:
      return !interleaved && call_with<load_legacy_super<BlockQ5_0, false, true>, 8 * sizeof(BlockQ5_0),
                                       fold_of(DType::Q5_0, false)>(fn);
    case DType::Q5_1:
      return !interleaved && call_with<load_legacy_super<BlockQ5_1, true, true>, 8 * sizeof(BlockQ5_1),
                                       fold_of(DType::Q5_1, false)>(fn);
    case DType::Q2_K:
      return interleaved ? call_with<load_q2_kx_super, sizeof(BlockQ2_K), fold_of(DType::Q2_K, false)>(fn)
                         : call_with<load_q2_k_super, sizeof(BlockQ2_K), fold_of(DType::Q2_K, false)>(fn);
    case DType::Q3_K:
      return interleaved ? call_with<load_q3_kx_super, sizeof(BlockQ3_K), fold_of(DType::Q3_K, false)>(fn)
                         : call_with<load_q3_k_super, sizeof(BlockQ3_K), fold_of(DType::Q3_K, false)>(fn);
    case DType::Q4_K:
      return interleaved ? call_with<load_q4_kx_super, sizeof(BlockQ4_K), fold_of(DType::Q4_K, false)>(fn)
                         : call_with<load_q4_k_super, sizeof(BlockQ4_K), fold_of(DType::Q4_K, false)>(fn);
    case DType::Q5_K:
      return interleaved ? call_with<load_q5_kx_super, sizeof(BlockQ5_K), fold_of(DType::Q5_K, false)>(fn)
                         : call_with<load_q5_k_super, sizeof(BlockQ5_K), fold_of(DType::Q5_K, false)>(fn);
    case DType::Q6_K:
      return interleaved ? call_with<load_q6_kx_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K, false)>(fn)
                         : call_with<load_q6_k_super, sizeof(BlockQ6_K), fold_of(DType::Q6_K, false)>(fn);
    default:
      return false;
  }
}

// The loader that tiles of rows whose last super-block is partial (direct_width) read that super-block with,
// from its copy padded with zero blocks (quant_direct_x86.inc): a legacy type's file-form loader itself;
// nullptr for the others (repacked rows with a partial last super-block take the unpacked path here:
// direct_max_rows). tail_signed: the same for a signed form (none here).
template <auto Load>
constexpr auto tail_loader() {
  if constexpr (Load == &load_q4_0_super || Load == &load_q8_0_super ||
                Load == &load_legacy_super<BlockQ4_1, true, false> ||
                Load == &load_legacy_super<BlockQ5_0, false, true> ||
                Load == &load_legacy_super<BlockQ5_1, true, true>) {
    return Load;
  } else {
    return nullptr;
  }
}

template <auto Signed>
constexpr auto tail_signed() {
  return Signed;
}

#include "tandem/kernels/quant_direct_x86.inc"

int64_t direct_max_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  if (form == WeightForm::kLanePairs) return 0;  // read through the file form (unpack_row)
  const bool interleaved = form == WeightForm::kInterleaved;
  // Repacked Q4_1, Q5_0 and Q5_1, and repacked rows with a partial last super-block (repacked where the
  // AVX-512 kernels run), have no loader here: they take the unpacked path.
  const bool no_form = type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 || k % kSuper != 0;
  if (!direct_width(type, k) || (interleaved && no_form)) return 0;
  if (type == DType::Q4_0 || (type == DType::Q8_0 && signed_q8)) return kDirectRows;
  if (type == DType::Q6_K) return kDirectRows;
  if (type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 || type == DType::Q2_K ||
      type == DType::Q3_K || type == DType::Q4_K || type == DType::Q5_K)
    return kDirectRowsOffset;
  return 0;
}

// Rows per direct pass, for every type: at most kPassRows. Tiles of more rows no longer keep their
// accumulators and one half's weight vectors in the 16 registers, and passes over the same block of weight
// rows (the later ones from the cache) measured faster. 5, not 4: a window of 4 drafts and its last token in
// one pass instead of 2 + 3.
//  - Q4_0 / Q8_0 against single passes of 8: Q8_0 matmul 2048 x 2048 on one thread 0.78x / 0.78x / 0.83x the
//    time at 8 / 12 / 16 rows (passes of 4, medians of 5 alternating runs); synthetic TinyLlama Q4_0 windows
//    (calibrate, 2 threads, two alternating pairs) cost(6) 2.48 / 2.95 against 3.14 / 2.94, cost(8) 3.52 /
//    3.97 against 4.18 / 3.94, cost(9) 3.93 / 4.29 against 4.82 / 4.61; single passes of 6 and 8 stayed
//    slower than 3 + 3 and 4 + 4 (cost(6) 2.59 / 2.59 against 2.42 / 2.41, cost(8) 3.47 / 3.56 against 2.95 /
//    3.19).
//  - 5 against 4 (four alternating pairs): Q4_0 (group order then) cost(5) 2.22 / 2.30 / 2.53 / 2.36 against
//    2.52 / 2.44 / 2.84 / 2.33, cost(9) (4 + 5) 3.41 / 4.01 / 4.42 / 4.65 against 4.06 / 4.66 / 4.49 / 4.66;
//    Q8_0 (block lanes) cost(5) 1.95 / 1.75 / 1.76 / 1.89 against 2.17 / 2.13 / 2.08 / 2.30.
//  - Q6_K kept passes of 8 while its sums were widened product by product; with them in 16 bits two at a time
//    (accumulate_half) passes of 5 take 0.90x / 0.95x the time at 8 rows (2048 x 5632, fastest / median of
//    4).
//  - The offset types: kDirectRowsOffset.
constexpr int64_t kPassRows = 5;

int64_t direct_pass_rows(DType type, WeightForm form, int64_t k, bool signed_q8) {
  return std::min(kPassRows, direct_max_rows(type, form, k, signed_q8));
}

void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
              DType type, bool signed_codes, float* y, int64_t y_stride) {
  switch (fold_of(type, signed_codes)) {
    case kNoOffset:
      return dot_rows_t<kNoOffset>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case fold_of(DType::Q4_0, false):
      return dot_rows_t<fold_of(DType::Q4_0, false)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case fold_of(DType::Q6_K, false):
      return dot_rows_t<fold_of(DType::Q6_K, false)>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case kLanes4:
      return dot_rows_t<kLanes4>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case kLanes5:
      return dot_rows_t<kLanes5>(w, n_super, x, x_stride, n_rows, y, y_stride);
    case kLanes8:
      return dot_rows_t<kLanes8>(w, n_super, x, x_stride, n_rows, y, y_stride);
    default:
      return dot_rows_t<0>(w, n_super, x, x_stride, n_rows, y, y_stride);
  }
}

// The throughput probe (QuantKernels::dot_probe), with the sequence of the group sums above: two vpmaddubsw
// added in 16 bits (codes below 64 cannot overflow), one vpmaddwd and one add per chain and step.
void dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums) {
  __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u));
  __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 32));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[kDotProbeChains];
  for (__m256i& a : acc) a = _mm256_setzero_si256();
  for (int64_t i = 0; i < iterations; ++i) {
    // Opaque to the optimizer: with the same operands every step, GCC computed the products once, before
    // the loop, and the probe timed the adds alone (it read about three times this target's peak).
    __asm__("" : "+x"(u0), "+x"(u1));
    for (int c = 0; c < kDotProbeChains; ++c) {
      const auto* sc = reinterpret_cast<const __m256i*>(s + 64 * c);
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, _mm256_loadu_si256(sc)),
                                         _mm256_maddubs_epi16(u1, _mm256_loadu_si256(sc + 1)));
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, ones));
    }
  }
  for (int c = 0; c < kDotProbeChains; ++c) {
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[c]);
    uint32_t t = 0;
    for (uint32_t v : lanes) t += v;
    sums[c] = t;
  }
}

}  // namespace avx2_target

const QuantKernels& quant_kernels_avx2() {
  static const QuantKernels k{true,
                              true,
                              avx2_target::unpack_row,
                              avx2_target::quantize_row,
                              avx2_target::dot_rows,
                              avx2_target::direct_max_rows,
                              avx2_target::direct_pass_rows,
                              avx2_target::direct_rows,
                              avx2_target::dot_probe};
  return k;
}

}  // namespace tandem::kernels
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_avx2() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
