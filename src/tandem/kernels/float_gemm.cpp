// Highway implementation of float_gemm.h; this file is compiled once per SIMD target (foreach_target).
#include "tandem/kernels/float_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/tensor/fp16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tandem/kernels/float_gemm.cpp"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_NATIVE_FMA

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// A tile is kGemmTileRows activation rows by one panel of kGemmPanelVectors vectors of weight rows (one
// weight row per lane): its accumulators, the panel's vectors and one broadcast activation fill the
// registers. 32 vector registers (AVX-512, AArch64): 12 x 2 or 6 x 4, 24 accumulators; 16 (AVX2): 6 x 2, 12
// accumulators.
#if HWY_ARCH_ARM_A64
constexpr int kGemmTileRows = 6;
constexpr int kGemmPanelVectors = 4;
#elif HWY_MAX_BYTES >= 64
constexpr int kGemmTileRows = 12;
constexpr int kGemmPanelVectors = 2;
#else
constexpr int kGemmTileRows = 6;
constexpr int kGemmPanelVectors = 2;
#endif
// Weight rows converted at a time: their panels over kGemmDepth columns, 64 KB on the stack, stay in L2 while
// every activation row goes by. (A whole number of panels: at most the widest panel's rows more.)
constexpr int64_t kGemmBlockRows = 128;
constexpr size_t kGemmPanelFloats =
    std::max<size_t>(kGemmBlockRows, kGemmPanelVectors* HWY_MAX_BYTES / sizeof(float)) * kGemmDepth;

// n weight elements from column k0 of a row, as f32, into out.
template <DType T>
HWY_INLINE void convert_run(const uint8_t* row, size_t k0, size_t n, float* HWY_RESTRICT out) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  if constexpr (T == DType::F32) {
    std::memcpy(out, row + 4 * k0, 4 * n);
    return;
  } else if constexpr (T == DType::F16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* src = reinterpret_cast<const hwy::float16_t*>(row) + k0;
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, src + i)), df, out + i);
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    const auto* src = reinterpret_cast<const hwy::bfloat16_t*>(row) + k0;
    for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, src + i)), df, out + i);
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, row + 2 * (k0 + i), 2);
    out[i] = T == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
  }
}

// Weight rows [o, o + n), columns [k0, k0 + kc), as panels of `width` rows: panel p holds row o + p * width +
// c, column k0 + j at [p * kc * width + j * width + c]; a last panel's rows past n hold zeros (their outputs
// are never stored, and they meet no other output's sum). row_buf: kc floats.
template <DType T>
void pack_panels(const uint8_t* w, size_t w_row_bytes, int64_t o, int64_t n, size_t k0, size_t kc,
                 size_t width, float* HWY_RESTRICT panels, float* HWY_RESTRICT row_buf) {
  const auto panels_n = static_cast<int64_t>((static_cast<size_t>(n) + width - 1) / width);
  for (int64_t p = 0; p < panels_n; ++p) {
    float* dst = panels + static_cast<size_t>(p) * kc * width;
    for (size_t c = 0; c < width; ++c) {
      const int64_t row = p * static_cast<int64_t>(width) + static_cast<int64_t>(c);
      if (row < n) {
        convert_run<T>(w + static_cast<size_t>(o + row) * w_row_bytes, k0, kc, row_buf);
        for (size_t j = 0; j < kc; ++j) dst[j * width + c] = row_buf[j];
      } else {
        for (size_t j = 0; j < kc; ++j) dst[j * width + c] = 0.0f;
      }
    }
  }
}

// One tile of M activation rows (x at the block's first column, rows x_stride apart) by one panel over kc
// columns: each output's block sum s as one chain of fused multiply-adds from +0, then y = s (the first
// block) or y + s. Only the first `cols` outputs of the panel are stored (the rest through a buffer).
template <int M>
HWY_INLINE void gemm_tile(const float* HWY_RESTRICT x, int64_t x_stride, const float* HWY_RESTRICT panel,
                          size_t kc, float* HWY_RESTRICT y, int64_t y_stride, bool first, size_t cols) {
  constexpr int NV = kGemmPanelVectors;
  const DF df;
  const size_t lanes = hn::Lanes(df), width = NV * lanes;
  VF acc[M][NV];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = hn::Zero(df);
  for (size_t j = 0; j < kc; ++j) {
    VF b[NV];
    for (int v = 0; v < NV; ++v) b[v] = hn::Load(df, panel + j * width + static_cast<size_t>(v) * lanes);
    for (int m = 0; m < M; ++m) {
      const VF a = hn::Set(df, x[m * x_stride + static_cast<int64_t>(j)]);
      for (int v = 0; v < NV; ++v) acc[m][v] = hn::MulAdd(a, b[v], acc[m][v]);
    }
  }
  if (cols == width) {
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < NV; ++v) {
        float* out = y + m * y_stride + static_cast<int64_t>(v * lanes);
        hn::StoreU(first ? acc[m][v] : hn::Add(hn::LoadU(df, out), acc[m][v]), df, out);
      }
    return;
  }
  alignas(64) float buf[NV * HWY_MAX_BYTES / sizeof(float)];
  for (int m = 0; m < M; ++m) {
    for (int v = 0; v < NV; ++v) hn::Store(acc[m][v], df, buf + static_cast<size_t>(v) * lanes);
    float* out = y + m * y_stride;
    for (size_t c = 0; c < cols; ++c) out[c] = first ? buf[c] : out[c] + buf[c];
  }
}

// The tile for the m <= M rows left.
template <int M>
HWY_INLINE void gemm_rows_tile(int m, const float* x, int64_t x_stride, const float* panel, size_t kc,
                               float* y, int64_t y_stride, bool first, size_t cols) {
  if constexpr (M > 1) {
    if (m < M) return gemm_rows_tile<M - 1>(m, x, x_stride, panel, kc, y, y_stride, first, cols);
  }
  gemm_tile<M>(x, x_stride, panel, kc, y, y_stride, first, cols);
}

// Blocks of kGemmBlockRows weight rows, each over blocks of kGemmDepth columns: the block's panels converted
// once, then every tile of activation rows against every panel. The panels and a tile's activations
// (kGemmTileRows x kGemmDepth floats, in L1) are all a tile reads.
template <DType T>
void gemm_t(const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, size_t k, const float* x,
            int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  const DF df;
  const size_t width = kGemmPanelVectors * hn::Lanes(df);
  const auto block_rows = static_cast<int64_t>(std::max<size_t>(1, kGemmBlockRows / width) * width);
  alignas(64) float panels[kGemmPanelFloats];
  alignas(64) float row_buf[kGemmDepth];
  for (int64_t b0 = o0; b0 < o1; b0 += block_rows) {
    const int64_t nb = std::min(block_rows, o1 - b0);
    const auto panels_n = static_cast<int64_t>((static_cast<size_t>(nb) + width - 1) / width);
    for (size_t k0 = 0; k0 < k; k0 += kGemmDepth) {
      const size_t kc = std::min<size_t>(kGemmDepth, k - k0);
      pack_panels<T>(w, w_row_bytes, b0, nb, k0, kc, width, panels, row_buf);
      const bool first = k0 == 0;
      for (int64_t r = 0; r < n_rows; r += kGemmTileRows) {
        const int m = static_cast<int>(std::min<int64_t>(kGemmTileRows, n_rows - r));
        for (int64_t p = 0; p < panels_n; ++p) {
          const auto cols = static_cast<size_t>(
              std::min<int64_t>(static_cast<int64_t>(width), nb - p * static_cast<int64_t>(width)));
          gemm_rows_tile<kGemmTileRows>(m, x + r * x_stride + static_cast<int64_t>(k0), x_stride,
                                        panels + static_cast<size_t>(p) * kc * width, kc,
                                        y + r * y_stride + b0 + p * static_cast<int64_t>(width), y_stride,
                                        first, cols);
        }
      }
    }
  }
}

#endif  // HWY_NATIVE_FMA

void FloatGemmRows(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                   const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
#if HWY_NATIVE_FMA
  if (k <= 0) {
    for (int64_t r = 0; r < n_rows; ++r) std::fill(y + r * y_stride + o0, y + r * y_stride + o1, 0.0f);
    return;
  }
  const auto kk = static_cast<size_t>(k);
  switch (type) {
    case DType::F16:
      return gemm_t<DType::F16>(w, w_row_bytes, o0, o1, kk, x, x_stride, n_rows, y, y_stride);
    case DType::BF16:
      return gemm_t<DType::BF16>(w, w_row_bytes, o0, o1, kk, x, x_stride, n_rows, y, y_stride);
    default:
      return gemm_t<DType::F32>(w, w_row_bytes, o0, o1, kk, x, x_stride, n_rows, y, y_stride);
  }
#else
  // Without fused multiply-adds in hardware the reference's std::fma gives the contract's bits.
  float_gemm_reference(type, w, w_row_bytes, o0, o1, k, x, x_stride, n_rows, y, y_stride);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::kernels {

HWY_EXPORT(FloatGemmRows);

void float_gemm_rows(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                     const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  if (n_rows <= 0 || o1 <= o0) return;
  HWY_DYNAMIC_DISPATCH(FloatGemmRows)(type, w, w_row_bytes, o0, o1, k, x, x_stride, n_rows, y, y_stride);
}

void float_gemm_reference(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                          const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  const auto weight = [type](const uint8_t* row, int64_t i) {
    if (type == DType::F32) {
      float v;
      std::memcpy(&v, row + 4 * i, 4);
      return v;
    }
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    return type == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
  };
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * x_stride;
    for (int64_t o = o0; o < o1; ++o) {
      const uint8_t* row = w + static_cast<size_t>(o) * w_row_bytes;
      float sum = 0.0f;
      for (int64_t k0 = 0; k0 < k; k0 += kGemmDepth) {
        float s = 0.0f;
        for (int64_t i = k0; i < std::min(k, k0 + kGemmDepth); ++i) s = std::fma(xr[i], weight(row, i), s);
        sum = k0 == 0 ? s : sum + s;
      }
      y[r * y_stride + o] = sum;
    }
  }
}

}  // namespace tandem::kernels
#endif
