// Quantized dot products on AVX-512 with VNNI: vpdpbusd multiplies the unsigned weight codes by the signed
// activation codes, 64 elements per instruction. Up to 4 activation rows share each loaded weight vector
// (more would spill accumulators).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsic headers as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#include <immintrin.h>

namespace tandem::kernels {
namespace avx512_target {

inline float half_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}

// The two bit-level helpers quant_unpack.inc expects (compilers vectorize the plain loops poorly).
inline void nibbles32(const uint8_t* qs, uint8_t* u) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(u), _mm_and_si128(v, m));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 16), _mm_and_si128(_mm_srli_epi16(v, 4), m));
}

inline void fifth_bits32(const uint8_t* qh, uint8_t* u) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                           2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i high =
      _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
  __m256i* p = reinterpret_cast<__m256i*>(u);
  _mm256_storeu_si256(p, _mm256_or_si256(_mm256_loadu_si256(p), high));
}

#include "tandem/kernels/quant_unpack.inc"

// Each row keeps the same three accumulators and the same operation sequence whatever NR is, so its result
// does not depend on the rows beside it.
template <int NR>
void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
              int64_t y_stride) {
  __m512 acc0[NR], acc1[NR], acc_b[NR];
  for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = acc_b[r] = _mm512_setzero_ps();
  // Lane l of quarter q takes the scale of group 4q + l / 4.
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    const __m512 a16 = _mm512_load_ps(W.a);
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const __m512i u = _mm512_load_si512(W.u + 64 * q);
      const __m512 a = _mm512_permutexvar_ps(_mm512_add_epi32(spread, _mm512_set1_epi32(4 * q)), a16);
      for (int r = 0; r < NR; ++r) {
        const ActSuper& X = x[r * x_stride + s];
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_load_si512(X.q + 64 * q));
        const __m512 scale = _mm512_mul_ps(a, _mm512_load_ps(X.d + 16 * q));
        if (q % 2 == 0) {
          acc0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc0[r]);
        } else {
          acc1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc1[r]);
        }
      }
    }
    const __m512 b = _mm512_load_ps(W.b);
    for (int r = 0; r < NR; ++r)
      acc_b[r] = _mm512_fmadd_ps(b, _mm512_load_ps(x[r * x_stride + s].bs), acc_b[r]);
  }
  for (int r = 0; r < NR; ++r)
    y[r * y_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) + _mm512_reduce_add_ps(acc_b[r]);
}

void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
              bool /*signed_codes: never set on this target*/, float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4)
    dot_tile<4>(w, n_super, x + r * x_stride, x_stride, y + r * y_stride, y_stride);
  const ActSuper* xr = x + r * x_stride;
  float* yr = y + r * y_stride;
  switch (n_rows - r) {
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
  static const QuantKernels k{false, avx512_target::unpack_row_impl, avx512_target::quantize_row_impl,
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
