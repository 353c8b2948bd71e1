// Quantized dot products on AVX-512 with VNNI: vpdpbusd multiplies the unsigned weight codes by the signed
// activation codes, 64 elements per instruction. Up to 8 activation rows share each loaded weight vector.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as
// (maybe-)uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#include <immintrin.h>

namespace tandem::kernels {
namespace avx512_target {

#include "tandem/kernels/quant_x86_helpers.inc"

// Element order to group-interleaved order (quant_layout.h): a transpose of 4-byte units, 16 groups by 4
// quarters. Each 64-byte vector (groups 4j..4j+3) is reordered quarter-major, then the 128-bit pieces are
// transposed.
inline void interleave_groups(uint8_t* codes) {
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512i p[4];
  for (int j = 0; j < 4; ++j) p[j] = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(codes + 64 * j));
  const __m512i t0 = _mm512_shuffle_i32x4(p[0], p[1], 0x44), t1 = _mm512_shuffle_i32x4(p[0], p[1], 0xEE);
  const __m512i t2 = _mm512_shuffle_i32x4(p[2], p[3], 0x44), t3 = _mm512_shuffle_i32x4(p[2], p[3], 0xEE);
  _mm512_storeu_si512(codes, _mm512_shuffle_i32x4(t0, t2, 0x88));
  _mm512_storeu_si512(codes + 64, _mm512_shuffle_i32x4(t0, t2, 0xDD));
  _mm512_storeu_si512(codes + 128, _mm512_shuffle_i32x4(t1, t3, 0x88));
  _mm512_storeu_si512(codes + 192, _mm512_shuffle_i32x4(t1, t3, 0xDD));
}

#include "tandem/kernels/quant_unpack.inc"

// Scales of the 8 blocks of one super (f16 at a stride of `stride` bytes), each repeated for its two groups.
inline __m512 block_scales8(const uint8_t* d, int64_t stride) {
  uint16_t h[8];
  for (int j = 0; j < 8; ++j) std::memcpy(&h[j], d + stride * j, 2);
  const __m512 f =
      _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), f);
}

// Whole super-blocks of Q4_0 straight into the interleaved form (the same bits as unpack_row_impl): quarter
// q, lane 2j takes the low nibbles of bytes 4q..4q+3 of block j, lane 2j + 1 their high nibbles.
inline void unpack_q4_0_supers(const uint8_t* row, int64_t n_super, UnpackedSuper* out) {
  constexpr int64_t kB = sizeof(BlockQ4_0);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int64_t i = 0; i < n_super; ++i) {
    const uint8_t* sb = row + i * 8 * kB;
    const __m512i lo = _mm512_inserti32x4(
        _mm512_inserti32x4(
            _mm512_inserti32x4(
                _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 2))),
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kB + 2)), 1),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 2 * kB + 2)), 2),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 3 * kB + 2)), 3);
    const __m512i hi = _mm512_inserti32x4(
        _mm512_inserti32x4(
            _mm512_inserti32x4(
                _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 4 * kB + 2))),
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 5 * kB + 2)), 1),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 6 * kB + 2)), 2),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 7 * kB + 2)), 3);
    UnpackedSuper& s = out[i];
    for (int q = 0; q < 4; ++q) {
      const __m512i idx = _mm512_setr_epi32(q, q, 4 + q, 4 + q, 8 + q, 8 + q, 12 + q, 12 + q, 16 + q, 16 + q,
                                            20 + q, 20 + q, 24 + q, 24 + q, 28 + q, 28 + q);
      const __m512i t = _mm512_permutex2var_epi32(lo, idx, hi);
      const __m512i u = _mm512_and_si512(_mm512_mask_blend_epi32(0xAAAA, t, _mm512_srli_epi16(t, 4)), nib);
      _mm512_store_si512(s.u + 64 * q, u);
    }
    const __m512 a = block_scales8(sb, kB);
    _mm512_store_ps(s.a, a);
    _mm512_store_ps(s.b, _mm512_mul_ps(_mm512_set1_ps(-8.0f), a));
  }
}

// Whole super-blocks of Q8_0 (unsigned codes, offset -128) straight into the interleaved form: quarter q,
// lane 2j + h takes bytes 16h + 4q..+3 of block j.
inline void unpack_q8_0_supers(const uint8_t* row, int64_t n_super, UnpackedSuper* out) {
  constexpr int64_t kB = sizeof(BlockQ8_0);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < n_super; ++i) {
    const uint8_t* sb = row + i * 8 * kB;
    __m512i z[4];  // blocks 2m, 2m + 1
    for (int m = 0; m < 4; ++m)
      z[m] = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 2 * m * kB + 2))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + (2 * m + 1) * kB + 2)), 1);
    UnpackedSuper& s = out[i];
    for (int q = 0; q < 4; ++q) {
      // Lane 2j + h of blocks j = 0..3 from z[0], z[1]; of blocks 4..7 from z[2], z[3] (same indices).
      const __m512i idx = _mm512_setr_epi32(q, 4 + q, 8 + q, 12 + q, 16 + q, 20 + q, 24 + q, 28 + q, q, 4 + q,
                                            8 + q, 12 + q, 16 + q, 20 + q, 24 + q, 28 + q);
      const __m512i t0 = _mm512_permutex2var_epi32(z[0], idx, z[1]);
      const __m512i t1 = _mm512_permutex2var_epi32(z[2], idx, z[3]);
      _mm512_store_si512(s.u + 64 * q, _mm512_xor_si512(_mm512_mask_blend_epi32(0xFF00, t0, t1), flip));
    }
    const __m512 a = block_scales8(sb, kB);
    _mm512_store_ps(s.a, a);
    _mm512_store_ps(s.b, _mm512_mul_ps(_mm512_set1_ps(-128.0f), a));
  }
}

void unpack_row(DType type, const uint8_t* row, int64_t k, bool signed_q8, UnpackedSuper* out) {
  if (k % kSuper == 0 && type == DType::Q4_0) return unpack_q4_0_supers(row, k / kSuper, out);
  if (k % kSuper == 0 && type == DType::Q8_0 && !signed_q8) return unpack_q8_0_supers(row, k / kSuper, out);
  unpack_row_impl(type, row, k, signed_q8, out);
}

// Each row keeps the same two accumulators and the same operation sequence whatever NR is, so its result does
// not depend on the rows beside it. Per super-block and row: four vpdpbusd add the quarters' products lane by
// lane into the 16 group sums, then one convert and one scaling per group.
template <int NR>
void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
              int64_t y_stride) {
  __m512 acc[NR], acc_b[NR];
  for (int r = 0; r < NR; ++r) acc[r] = acc_b[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    const __m512i u0 = _mm512_load_si512(W.u), u1 = _mm512_load_si512(W.u + 64);
    const __m512i u2 = _mm512_load_si512(W.u + 128), u3 = _mm512_load_si512(W.u + 192);
    const __m512 a = _mm512_load_ps(W.a), b = _mm512_load_ps(W.b);
    for (int r = 0; r < NR; ++r) {
      const ActSuper& X = x[r * x_stride + s];
      __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, _mm512_load_si512(X.q));
      sum = _mm512_dpbusd_epi32(sum, u1, _mm512_load_si512(X.q + 64));
      sum = _mm512_dpbusd_epi32(sum, u2, _mm512_load_si512(X.q + 128));
      sum = _mm512_dpbusd_epi32(sum, u3, _mm512_load_si512(X.q + 192));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(a, _mm512_load_ps(X.d)), acc[r]);
      acc_b[r] = _mm512_fmadd_ps(b, _mm512_load_ps(X.bs), acc_b[r]);
    }
  }
  for (int r = 0; r < NR; ++r) y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc_b[r]));
}

void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
              bool /*signed_codes: never set on this target*/, float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + 8 <= n_rows; r += 8)
    dot_tile<8>(w, n_super, x + r * x_stride, x_stride, y + r * y_stride, y_stride);
  const ActSuper* xr = x + r * x_stride;
  float* yr = y + r * y_stride;
  switch (n_rows - r) {
    case 7:
      return dot_tile<7>(w, n_super, xr, x_stride, yr, y_stride);
    case 6:
      return dot_tile<6>(w, n_super, xr, x_stride, yr, y_stride);
    case 5:
      return dot_tile<5>(w, n_super, xr, x_stride, yr, y_stride);
    case 4:
      return dot_tile<4>(w, n_super, xr, x_stride, yr, y_stride);
    case 3:
      return dot_tile<3>(w, n_super, xr, x_stride, yr, y_stride);
    case 2:
      return dot_tile<2>(w, n_super, xr, x_stride, yr, y_stride);
    case 1:
      return dot_tile<1>(w, n_super, xr, x_stride, yr, y_stride);
    default:
      return;
  }
}

}  // namespace avx512_target

const QuantKernels& quant_kernels_avx512() {
  static const QuantKernels k{false, avx512_target::unpack_row, avx512_target::quantize_row_impl,
                              avx512_target::dot_rows};
  return k;
}

}  // namespace tandem::kernels
#pragma GCC diagnostic pop
#pragma GCC pop_options

#else
namespace tandem::kernels {
const QuantKernels& quant_kernels_avx512() {
  return quant_kernels_scalar();
}
}  // namespace tandem::kernels
#endif
