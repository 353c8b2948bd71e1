// Highway implementation of key_blocks.h; this file is compiled once per SIMD target (foreach_target).
#include "tandem/kernels/key_blocks.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "tandem/tensor/fp16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tandem/kernels/key_blocks.cpp"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR && HWY_NATIVE_FMA
// Queries per pass over a block: two accumulators each, 16 vector registers at 8.
constexpr int kPassQueries = 8;

// Floats of keys converted from f16 for the passes of a window (dims_pass on floats): each key vector is
// converted once for all of a window's queries instead of once per pass of kPassQueries. 8 KB: one vector of
// positions of a head of up to 128 dimensions (64-byte vectors; 256 on 32-byte), read from L1 by every pass.
constexpr int64_t kConvertedFloats = 2048;

// One vector of key elements: f16 converted, or f32 already converted (the exact same values).
template <typename K>
HWY_INLINE hn::Vec<DF> load_keys(const K* k) {
  const DF df;
  if constexpr (std::is_same_v<K, float>) {
    return hn::LoadU(df, k);
  } else {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), k));
  }
}

// NQ queries against the N positions of k (element i of position j at k[i * B + j]); lanes [lo, hi) of the
// scores are stored, to s (position lo first).
template <int NQ, typename K>
void dims_pass(const float* q, int64_t q_stride, const K* k, int64_t B, int64_t dim, size_t lo, size_t hi,
               float* s, int64_t s_stride) {
  const DF df;
  // The accumulators stay in registers: every index into them is a constant once the loops over the
  // queries are unrolled (GCC otherwise keeps them in memory around the loop, zeroed and reloaded each call).
  hn::Vec<DF> even[NQ], odd[NQ];
#pragma GCC unroll 16
  for (int h = 0; h < NQ; ++h) even[h] = odd[h] = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 <= dim; i += 2) {
    const auto k0 = load_keys(k + i * B);
    const auto k1 = load_keys(k + (i + 1) * B);
#pragma GCC unroll 16
    for (int h = 0; h < NQ; ++h) {
      even[h] = hn::MulAdd(hn::Set(df, q[h * q_stride + i]), k0, even[h]);
      odd[h] = hn::MulAdd(hn::Set(df, q[h * q_stride + i + 1]), k1, odd[h]);
    }
  }
  if (i < dim) {
    const auto k0 = load_keys(k + i * B);
#pragma GCC unroll 16
    for (int h = 0; h < NQ; ++h) even[h] = hn::MulAdd(hn::Set(df, q[h * q_stride + i]), k0, even[h]);
  }
  const size_t N = hn::Lanes(df);
  if (lo == 0 && hi == N) {
#pragma GCC unroll 16
    for (int h = 0; h < NQ; ++h) hn::StoreU(hn::Add(even[h], odd[h]), df, s + h * s_stride);
    return;
  }
  HWY_ALIGN float lanes[hn::MaxLanes(DF())];
#pragma GCC unroll 16
  for (int h = 0; h < NQ; ++h) {
    hn::Store(hn::Add(even[h], odd[h]), df, lanes);
    std::copy(lanes + lo, lanes + hi, s + h * s_stride);
  }
}

template <typename K, size_t... I>
constexpr auto dims_passes(std::index_sequence<I...>) {
  using Pass = void (*)(const float*, int64_t, const K*, int64_t, int64_t, size_t, size_t, float*, int64_t);
  return std::array<Pass, sizeof...(I)>{&dims_pass<static_cast<int>(I) + 1, K>...};
}

// G queries in passes of kPassQueries against the N positions of k.
template <typename K>
void dims_passes_over(const float* q, int64_t G, int64_t q_stride, const K* k, int64_t B, int64_t dim,
                      size_t lo, size_t hi, float* s, int64_t s_stride) {
  static constexpr auto passes = dims_passes<K>(std::make_index_sequence<kPassQueries>());
  for (int64_t h0 = 0; h0 < G; h0 += kPassQueries) {
    const int64_t nq = std::min<int64_t>(kPassQueries, G - h0);
    passes[static_cast<size_t>(nq - 1)](q + h0 * q_stride, q_stride, k, B, dim, lo, hi, s + h0 * s_stride,
                                        s_stride);
  }
}
#endif

void DotsDimMajorF16(const float* q, int64_t G, int64_t q_stride, const uint16_t* block, int64_t B,
                     int64_t off, int64_t n, int64_t dim, float* s, int64_t s_stride) {
#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR && HWY_NATIVE_FMA
  const auto N = static_cast<int64_t>(hn::Lanes(DF()));
  if (B % N == 0) {
    const auto* keys = reinterpret_cast<const hwy::float16_t*>(block);
    // More than one pass: each vector of positions is converted once, where the head fits kConvertedFloats.
    const bool converted = G > kPassQueries && dim * N <= kConvertedFloats;
    HWY_ALIGN float kf[kConvertedFloats];
    for (int64_t p0 = off / N * N; p0 < off + n; p0 += N) {
      const int64_t lo = std::max(off, p0), hi = std::min(off + n, p0 + N);
      const auto l = static_cast<size_t>(lo - p0), h = static_cast<size_t>(hi - p0);
      float* sp = s + (lo - off);
      if (converted) {
        for (int64_t i = 0; i < dim; ++i) hn::Store(load_keys(keys + i * B + p0), DF(), kf + i * N);
        dims_passes_over(q, G, q_stride, kf, N, dim, l, h, sp, s_stride);
      } else {
        dims_passes_over(q, G, q_stride, keys + p0, B, dim, l, h, sp, s_stride);
      }
    }
    return;
  }
#endif
  dots_dim_major_f16_reference(q, G, q_stride, block, B, off, n, dim, s, s_stride);
}

}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::kernels {

HWY_EXPORT(DotsDimMajorF16);

void dots_dim_major_f16(const float* q, int64_t G, int64_t q_stride, const uint16_t* block, int64_t B,
                        int64_t off, int64_t n, int64_t dim, float* s, int64_t s_stride) {
  HWY_DYNAMIC_DISPATCH(DotsDimMajorF16)(q, G, q_stride, block, B, off, n, dim, s, s_stride);
}

void dots_dim_major_f16_reference(const float* q, int64_t G, int64_t q_stride, const uint16_t* block,
                                  int64_t B, int64_t off, int64_t n, int64_t dim, float* s,
                                  int64_t s_stride) {
  for (int64_t h = 0; h < G; ++h)
    for (int64_t j = 0; j < n; ++j) {
      const float* qh = q + h * q_stride;
      const uint16_t* k = block + off + j;
      float even = 0.0f, odd = 0.0f;
      int64_t i = 0;
      for (; i + 2 <= dim; i += 2) {
        even = std::fma(qh[i], fp16_to_f32(k[i * B]), even);
        odd = std::fma(qh[i + 1], fp16_to_f32(k[(i + 1) * B]), odd);
      }
      if (i < dim) even = std::fma(qh[i], fp16_to_f32(k[i * B]), even);
      s[h * s_stride + j] = even + odd;
    }
}

}  // namespace tandem::kernels
#endif
