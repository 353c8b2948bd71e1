// Quantized dot products on AVX2: vpmaddubsw multiplies unsigned weight codes (at most 127, so pairs never
// saturate) by signed activation codes and vpmaddwd sums pairs into 32-bit lanes. Q8_0 codes stay signed and
// use the sign trick |w| * sign(x, w). Up to 4 activation rows share each loaded weight vector.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

namespace tandem::kernels {
namespace avx2_target {

#include "tandem/kernels/quant_x86_helpers.inc"

// Element order to group-interleaved order (quant_layout.h): a transpose of 4-byte units, 16 groups by 4
// quarters.
inline void interleave_groups(uint8_t* codes) {
  __m256i v[8];
  for (int j = 0; j < 8; ++j) v[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * j));
  // v[j] holds groups 2j, 2j + 1, quarters 0..3 each. Gather each 128-bit half as quarters in dword order.
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  uint32_t out[64];
  for (int j = 0; j < 8; ++j) {
    // Dwords (g, q) for g = 2j, 2j + 1: index 4 * (g - 2j) + q; reorder to q-major: (q, g).
    const __m256i t = _mm256_permutevar8x32_epi32(v[j], perm);
    uint32_t d[8];
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), t);
    for (int q = 0; q < 4; ++q) {
      out[16 * q + 2 * j] = d[2 * q];
      out[16 * q + 2 * j + 1] = d[2 * q + 1];
    }
  }
  std::memcpy(codes, out, kSuper);
}

#include "tandem/kernels/quant_unpack.inc"

// Same accumulators and operation sequence for every row whatever NR is (batch invariance). Vector v of a
// super (32 bytes) holds quarter v / 2 of groups 8 * (v % 2)..+7, one group per 32-bit lane: the integer sums
// of the even vectors give groups 0..7, of the odd ones groups 8..15.
template <int NR, bool kSigned>
void dot_tile(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, float* y,
              int64_t y_stride) {
  __m256 acc[NR], acc_b[NR];
  for (int r = 0; r < NR; ++r) acc[r] = acc_b[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    __m256i u[8], u_abs[8];
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      u[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(W.u + 32 * v));
      u_abs[v] = kSigned ? _mm256_sign_epi8(u[v], u[v]) : u[v];
    }
    const __m256 a0 = _mm256_load_ps(W.a), a1 = _mm256_load_ps(W.a + 8);
    const __m256 b0 = _mm256_load_ps(W.b), b1 = _mm256_load_ps(W.b + 8);
    for (int r = 0; r < NR; ++r) {
      const ActSuper& X = x[r * x_stride + s];
      __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(X.q + 32 * v));
        if (kSigned) xq = _mm256_sign_epi8(xq, u[v]);
        sum[v % 2] =
            _mm256_add_epi32(sum[v % 2], _mm256_madd_epi16(_mm256_maddubs_epi16(u_abs[v], xq), ones));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[0]), _mm256_mul_ps(a0, _mm256_load_ps(X.d)), acc[r]);
      acc[r] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[1]), _mm256_mul_ps(a1, _mm256_load_ps(X.d + 8)), acc[r]);
      acc_b[r] = _mm256_fmadd_ps(b0, _mm256_load_ps(X.bs), acc_b[r]);
      acc_b[r] = _mm256_fmadd_ps(b1, _mm256_load_ps(X.bs + 8), acc_b[r]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    const __m256 v = _mm256_add_ps(acc[r], acc_b[r]);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    y[r * y_stride] = _mm_cvtss_f32(h);
  }
}

template <bool kSigned>
void dot_rows_t(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
                float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4)
    dot_tile<4, kSigned>(w, n_super, x + r * x_stride, x_stride, y + r * y_stride, y_stride);
  const ActSuper* xr = x + r * x_stride;
  float* yr = y + r * y_stride;
  switch (n_rows - r) {
    case 3:
      return dot_tile<3, kSigned>(w, n_super, xr, x_stride, yr, y_stride);
    case 2:
      return dot_tile<2, kSigned>(w, n_super, xr, x_stride, yr, y_stride);
    case 1:
      return dot_tile<1, kSigned>(w, n_super, xr, x_stride, yr, y_stride);
    default:
      return;
  }
}

void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
              DType /*type*/, bool signed_codes, float* y, int64_t y_stride) {
  if (signed_codes) return dot_rows_t<true>(w, n_super, x, x_stride, n_rows, y, y_stride);
  dot_rows_t<false>(w, n_super, x, x_stride, n_rows, y, y_stride);
}

}  // namespace avx2_target

const QuantKernels& quant_kernels_avx2() {
  static const QuantKernels k{true,
                              avx2_target::unpack_row_impl,
                              avx2_target::quantize_row_impl,
                              avx2_target::dot_rows,
                              no_direct_rows,
                              nullptr};
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
