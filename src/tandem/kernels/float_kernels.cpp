// Highway implementations of float_kernels.h; this file is compiled once per SIMD target (foreach_target).
#include "tandem/kernels/float_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <utility>

#include "tandem/tensor/fp16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tandem/kernels/float_kernels.cpp"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"  // after highway.h: per-target include guards
#include "tandem/kernels/exp_non_positive.h"  // likewise
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace tandem::kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

template <DType T>
HWY_INLINE hn::Vec<DF> load_w(DF df, const uint8_t* row, size_t i) {
  if constexpr (T == DType::F32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + i);
  } else if constexpr (T == DType::F16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + i));
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    return hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(row) + i));
  }
}

template <DType T>
HWY_INLINE float scalar_w(const uint8_t* row, size_t i) {
  if constexpr (T == DType::F32) {
    float v;
    std::memcpy(&v, row + 4 * i, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * i, 2);
    return T == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
  }
}

// NW weight rows (w_row_bytes apart) against NR activation rows, over the whole row: each weight vector
// loaded meets every activation row, and each activation vector every weight row, so the activations'
// cache traffic per weight row is 1/NW of one row at a time (one row at a time, a window's activation rows
// overflowed the L1 cache and each of their loads fed one multiply-add: 8 rows of F16 ran at a third of the
// multiply-add rate). Two accumulators per output (even and odd vectors), whole vectors, then a scalar tail:
// an output's operations and their order are the same in every tile shape, so its bits never depend on
// the rows beside it.
template <DType T, int NW, int NR>
HWY_INLINE void dot_tile(const uint8_t* w, size_t w_row_bytes, size_t k, const float* x, int64_t x_stride,
                         float* y, int64_t y_stride) {
  const DF df;
  const size_t n = hn::Lanes(df);
  hn::Vec<DF> acc0[NW][NR], acc1[NW][NR];
  for (int o = 0; o < NW; ++o)
    for (int r = 0; r < NR; ++r) acc0[o][r] = acc1[o][r] = hn::Zero(df);
  size_t i = 0;
  for (; i + 2 * n <= k; i += 2 * n) {
    hn::Vec<DF> x0[NR], x1[NR];
    for (int r = 0; r < NR; ++r) {
      x0[r] = hn::LoadU(df, x + r * x_stride + i);
      x1[r] = hn::LoadU(df, x + r * x_stride + i + n);
    }
    for (int o = 0; o < NW; ++o) {
      const uint8_t* row = w + static_cast<size_t>(o) * w_row_bytes;
      const auto w0 = load_w<T>(df, row, i), w1 = load_w<T>(df, row, i + n);
      for (int r = 0; r < NR; ++r) {
        acc0[o][r] = hn::MulAdd(w0, x0[r], acc0[o][r]);
        acc1[o][r] = hn::MulAdd(w1, x1[r], acc1[o][r]);
      }
    }
  }
  for (; i + n <= k; i += n) {
    for (int o = 0; o < NW; ++o) {
      const auto w0 = load_w<T>(df, w + static_cast<size_t>(o) * w_row_bytes, i);
      for (int r = 0; r < NR; ++r)
        acc0[o][r] = hn::MulAdd(w0, hn::LoadU(df, x + r * x_stride + i), acc0[o][r]);
    }
  }
  for (int o = 0; o < NW; ++o) {
    const uint8_t* row = w + static_cast<size_t>(o) * w_row_bytes;
    for (int r = 0; r < NR; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[o][r], acc1[o][r])));
      for (size_t j = i; j < k; ++j) s += scalar_w<T>(row, j) * x[r * x_stride + static_cast<int64_t>(j)];
      y[r * y_stride + o] = s;
    }
  }
}

// Weight rows per tile: four where the target has 32 vector registers (AVX-512, AArch64: 16 accumulators,
// four activation vectors and two weight vectors), two where it has 16.
#if HWY_ARCH_ARM_A64
constexpr int kFloatTileRows = 4;
#else
constexpr int kFloatTileRows = HWY_MAX_BYTES >= 64 ? 4 : 2;
#endif

// NW weight rows against every activation row, two activation rows at a time.
template <DType T, int NW>
HWY_INLINE void weight_tile(const uint8_t* w, size_t w_row_bytes, size_t k, const float* x, int64_t x_stride,
                            int64_t n_rows, float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2)
    dot_tile<T, NW, 2>(w, w_row_bytes, k, x + r * x_stride, x_stride, y + r * y_stride, y_stride);
  if (r < n_rows)
    dot_tile<T, NW, 1>(w, w_row_bytes, k, x + r * x_stride, x_stride, y + r * y_stride, y_stride);
}

// Many rows: activation rows in chunks of kRowChunk (a chunk of the widest rows, 1536 floats, stays in a
// 1 MB L2 while the range's weight tiles go by; all rows at once streamed the whole activation matrix from
// L3 or memory once per tile), and F16/BF16 weight tiles converted to f32 once per chunk into a panel that
// every row of the chunk meets (converting per use cost one conversion per two multiply-adds, which bound
// the F16 prefill kernel). The conversion is exact and the panel runs the same tiles in the same order, so
// every output keeps the bits it has one row at a time.
constexpr int64_t kPanelMinRows = 8;
constexpr size_t kPanelMaxK = 4096;  // the panel lives on the stack: kFloatTileRows * 4096 floats, 64 KB
constexpr int64_t kRowChunk = 64;

template <DType T, int NW>
HWY_INLINE void to_panel(const uint8_t* w, size_t w_row_bytes, size_t k, float* panel) {
  const DF df;
  const size_t n = hn::Lanes(df);
  for (int o = 0; o < NW; ++o) {
    const uint8_t* row = w + static_cast<size_t>(o) * w_row_bytes;
    float* dst = panel + static_cast<size_t>(o) * k;
    size_t i = 0;
    for (; i + n <= k; i += n) hn::StoreU(load_w<T>(df, row, i), df, dst + i);
    for (; i < k; ++i) dst[i] = scalar_w<T>(row, i);
  }
}

template <DType T>
void matmul_many_rows(const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, size_t k, const float* x,
                      int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  constexpr bool kConvert = T != DType::F32;
  alignas(64) float panel[kConvert ? kFloatTileRows * kPanelMaxK : 1];
  const size_t panel_bytes = k * sizeof(float);
  const auto at = [&](int64_t o) { return w + static_cast<size_t>(o) * w_row_bytes; };
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRowChunk) {
    const int64_t nr = std::min(kRowChunk, n_rows - r0);
    const float* xc = x + r0 * x_stride;
    float* yc = y + r0 * y_stride;
    int64_t o = o0;
    for (; o + kFloatTileRows <= o1; o += kFloatTileRows) {
      if constexpr (kConvert) {
        to_panel<T, kFloatTileRows>(at(o), w_row_bytes, k, panel);
        weight_tile<DType::F32, kFloatTileRows>(reinterpret_cast<const uint8_t*>(panel), panel_bytes, k, xc,
                                                x_stride, nr, yc + o, y_stride);
      } else {
        weight_tile<T, kFloatTileRows>(at(o), w_row_bytes, k, xc, x_stride, nr, yc + o, y_stride);
      }
    }
    for (; o < o1; ++o) {
      if constexpr (kConvert) {
        to_panel<T, 1>(at(o), w_row_bytes, k, panel);
        weight_tile<DType::F32, 1>(reinterpret_cast<const uint8_t*>(panel), panel_bytes, k, xc, x_stride, nr,
                                   yc + o, y_stride);
      } else {
        weight_tile<T, 1>(at(o), w_row_bytes, k, xc, x_stride, nr, yc + o, y_stride);
      }
    }
  }
}

template <DType T>
void matmul_rows_t(const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k, const float* x,
                   int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  const size_t kk = static_cast<size_t>(k);
  if (n_rows >= kPanelMinRows && kk <= kPanelMaxK)
    return matmul_many_rows<T>(w, w_row_bytes, o0, o1, kk, x, x_stride, n_rows, y, y_stride);
  const auto at = [&](int64_t o) { return w + static_cast<size_t>(o) * w_row_bytes; };
  int64_t o = o0;
  if (n_rows > 1)
    for (; o + kFloatTileRows <= o1; o += kFloatTileRows)
      weight_tile<T, kFloatTileRows>(at(o), w_row_bytes, kk, x, x_stride, n_rows, y + o, y_stride);
  // Decode, and a range's last rows short of a whole tile: one weight row at a time. Decode so that the
  // weights stream in address order (with four rows at once, F16 decode read a much smaller share of the
  // probed bandwidth; performance.md).
  for (; o < o1; ++o) weight_tile<T, 1>(at(o), w_row_bytes, kk, x, x_stride, n_rows, y + o, y_stride);
}

void FloatMatmulRows(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                     const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  switch (type) {
    case DType::F16:
      return matmul_rows_t<DType::F16>(w, w_row_bytes, o0, o1, k, x, x_stride, n_rows, y, y_stride);
    case DType::BF16:
      return matmul_rows_t<DType::BF16>(w, w_row_bytes, o0, o1, k, x, x_stride, n_rows, y, y_stride);
    default:
      return matmul_rows_t<DType::F32>(w, w_row_bytes, o0, o1, k, x, x_stride, n_rows, y, y_stride);
  }
}

template <DType T>
HWY_INLINE float dot_q(const float* q, const uint8_t* krow, size_t dim) {
  const DF df;
  const size_t n = hn::Lanes(df);
  auto acc = hn::Zero(df);
  size_t i = 0;
  for (; i + n <= dim; i += n) acc = hn::MulAdd(hn::LoadU(df, q + i), load_w<T>(df, krow, i), acc);
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < dim; ++i) s += q[i] * scalar_w<T>(krow, i);
  return s;
}

template <DType T>
HWY_INLINE void axpy(float p, const uint8_t* vrow, float* out, size_t dim) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const auto pv = hn::Set(df, p);
  size_t i = 0;
  for (; i + n <= dim; i += n)
    hn::StoreU(hn::MulAdd(pv, load_w<T>(df, vrow, i), hn::LoadU(df, out + i)), df, out + i);
  for (; i < dim; ++i) out[i] += p * scalar_w<T>(vrow, i);
}

template <DType T>
void dots_group_t(const float* q, int64_t G, int64_t q_stride, const uint8_t* rows, int64_t n, int64_t dim,
                  float* s, int64_t s_stride);

// Scores of a query against n key rows: the grouped form with one query, so a score has the same bits alone
// or in a group.
template <DType T>
void dots_t(const float* q, const uint8_t* rows, int64_t n, int64_t dim, float* s) {
  dots_group_t<T>(q, 1, 0, rows, n, dim, s, 0);
}
template <DType T>
void accumulate_t(const float* p, const uint8_t* rows, int64_t n, int64_t dim, float* acc) {
  constexpr size_t es = T == DType::F32 ? 4 : 2;
  for (int64_t j = 0; j < n; ++j)
    axpy<T>(p[j], rows + static_cast<size_t>(j * dim) * es, acc, static_cast<size_t>(dim));
}
// The grouped forms: G queries (q_stride apart) over the same rows, each row loaded and converted once for
// all of them, each query's result bit-identical to a call of its own. Targets with scalable vectors (no
// arrays of vectors) make the separate calls.

#if !HWY_HAVE_SCALABLE && HWY_TARGET != HWY_SCALAR
// Lane j of the result is the sum of the lanes of v[j] (j < Lanes), added in a fixed tree (adjacent lanes,
// then adjacent pairs of those, and so on) whatever the other vectors hold. Transposing as it adds, it costs
// about three operations per vector instead of a full horizontal reduction each. v is overwritten.
HWY_INLINE hn::Vec<DF> lane_sums(DF df, hn::Vec<DF>* v) {
  for (size_t m = hn::Lanes(df); m > 1; m /= 2)
    for (size_t i = 0; i < m / 2; ++i)
      v[i] = hn::Add(hn::ConcatEven(df, v[2 * i + 1], v[2 * i]), hn::ConcatOdd(df, v[2 * i + 1], v[2 * i]));
  return v[0];
}

// Largest head size whose key rows dots_group_t converts into its stack buffer (larger ones take the
// per-query path).
constexpr size_t kMaxConvertedDim = 512;
// The key row read past the last row of a block.
alignas(64) constexpr float kZeroRow[kMaxConvertedDim] = {};
#endif

// Each score by dot_q, one query and row at a time.
template <DType T>
void dots_each(const float* q, int64_t G, int64_t q_stride, const uint8_t* rows, int64_t n, int64_t dim,
               float* s, int64_t s_stride) {
  constexpr size_t es = T == DType::F32 ? 4 : 2;
  for (int64_t h = 0; h < G; ++h)
    for (int64_t j = 0; j < n; ++j)
      s[h * s_stride + j] =
          dot_q<T>(q + h * q_stride, rows + static_cast<size_t>(j * dim) * es, static_cast<size_t>(dim));
}

// Key rows Lanes at a time: each query's partial products of a row accumulate in one vector (the same
// MulAdd sequence as dot_q), the block's vectors are summed by lane_sums, then the dims past the last whole
// vector are added one by one as in dot_q. A score depends only on its query and key row, never on the rows
// or queries beside it. F16 and BF16 rows are converted to f32 once per block for all queries.
template <DType T>
void dots_group_t(const float* q, int64_t G, int64_t q_stride, const uint8_t* rows, int64_t n, int64_t dim,
                  float* s, int64_t s_stride) {
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
  dots_each<T>(q, G, q_stride, rows, n, dim, s, s_stride);
#else
  constexpr size_t es = T == DType::F32 ? 4 : 2;
  const DF df;
  constexpr size_t N = hn::MaxLanes(DF());
  const size_t d = static_cast<size_t>(dim), vd = d / N * N;
  HWY_ALIGN float converted[T == DType::F32 ? 1 : N * kMaxConvertedDim];
  HWY_ALIGN float sums[N];
  if (vd > kMaxConvertedDim) {  // past the buffer and the zero row; no supported model has such heads
    dots_each<T>(q, G, q_stride, rows, n, dim, s, s_stride);
    return;
  }
  for (int64_t j0 = 0; j0 < n; j0 += static_cast<int64_t>(N)) {
    const size_t nj = std::min(N, static_cast<size_t>(n - j0));
    const uint8_t* block = rows + static_cast<size_t>(j0) * d * es;
    // The block's key rows as f32 (a zero row past the last one).
    const float* keys[N];
    for (size_t jj = 0; jj < N; ++jj) {
      if (jj >= nj) {
        keys[jj] = kZeroRow;
      } else if constexpr (T == DType::F32) {
        keys[jj] = reinterpret_cast<const float*>(block + jj * d * es);
      } else {
        float* row = converted + jj * vd;
        for (size_t i = 0; i < vd; i += N) hn::Store(load_w<T>(df, block + jj * d * es, i), df, row + i);
        keys[jj] = row;
      }
    }
    for (int64_t h = 0; h < G; ++h) {
      const float* qh = q + h * q_stride;
      hn::Vec<DF> parts[N];
      for (size_t jj = 0; jj < N; ++jj) parts[jj] = hn::Zero(df);
      for (size_t i = 0; i < vd; i += N) {
        const auto qv = hn::LoadU(df, qh + i);
        for (size_t jj = 0; jj < N; ++jj) parts[jj] = hn::MulAdd(qv, hn::LoadU(df, keys[jj] + i), parts[jj]);
      }
      float* out = s + h * s_stride + j0;
      if (nj == N && vd == d) {  // a whole block and no dims past the vectors: the sums are the scores
        hn::StoreU(lane_sums(df, parts), df, out);
        continue;
      }
      hn::Store(lane_sums(df, parts), df, sums);
      for (size_t jj = 0; jj < nj; ++jj) {
        float v = sums[jj];
        for (size_t i = vd; i < d; ++i) v += qh[i] * scalar_w<T>(block + jj * d * es, i);
        out[jj] = v;
      }
    }
  }
#endif
}

// kQ queries by kC vectors of dims from c0, over every row of the runs in order: the accumulators stay in
// registers, loaded once and stored once across all the runs (a call per 16-row cache block took longer than
// a call per four; performance.md). All sizes fixed at compile time: with the counts at run time GCC kept a
// branch and a flag store per query inside the row loop.
template <DType T, int kQ, int kC>
HWY_INLINE void accumulate_tile(const float* p, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                                size_t row_bytes, size_t c0, float* acc, int64_t acc_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  hn::Vec<DF> a[kQ][kC];
  for (int h = 0; h < kQ; ++h)
    for (int c = 0; c < kC; ++c) a[h][c] = hn::LoadU(df, acc + h * acc_stride + c0 + c * lanes);
  for (int64_t k = 0; k < n_runs; ++k) {
    const uint8_t* rows = runs[k].rows;
    const float* pk = p + runs[k].p_offset;
    for (int64_t j = 0; j < runs[k].n; ++j) {
      const uint8_t* vrow = rows + static_cast<size_t>(j) * row_bytes;
      hn::Vec<DF> v[kC];
      for (int c = 0; c < kC; ++c) v[c] = load_w<T>(df, vrow, c0 + c * lanes);
      for (int h = 0; h < kQ; ++h) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
        // The weight broadcast inside each FMA's memory operand ({1to16}), where GCC broadcasts it once
        // into a register for the kC FMAs: the same products and sums, but no broadcast instructions beside
        // the FMAs, and less time for one query's value sums and for 8 (performance.md).
        for (int c = 0; c < kC; ++c)
          __asm__("vfmadd231ps %[p]%{1to16%}, %[v], %[acc]"
                  : [acc] "+v"(a[h][c].raw)
                  : [v] "v"(v[c].raw), [p] "m"(pk[h * p_stride + j]));
#else
        const auto pj = hn::Set(df, pk[h * p_stride + j]);
        for (int c = 0; c < kC; ++c) a[h][c] = hn::MulAdd(pj, v[c], a[h][c]);
#endif
      }
    }
  }
  for (int h = 0; h < kQ; ++h)
    for (int c = 0; c < kC; ++c) hn::StoreU(a[h][c], df, acc + h * acc_stride + c0 + c * lanes);
}

// The last nh < kQ queries of a group by kC vectors: accumulate_tile<T, nh, kC> for nh in R.
template <DType T, int kC, int... R>
HWY_INLINE void accumulate_rest(std::integer_sequence<int, R...>, int nh, const float* p, int64_t p_stride,
                                const ValueRun* runs, int64_t n_runs, size_t row_bytes, size_t c0, float* acc,
                                int64_t acc_stride) {
  ((nh == R + 1 ? accumulate_tile<T, R + 1, kC>(p, p_stride, runs, n_runs, row_bytes, c0, acc, acc_stride)
                : void()),
   ...);
}

// Blocks of kQ queries by kC vectors of dims (accumulate_tile), the last queries of the group in one smaller
// block. Element by element the additions run in row order, as axpy's, whatever the blocking and however
// the rows are split into runs.
template <DType T, int kQ, int kC>
void accumulate_blocked(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                        int64_t dim, float* acc, int64_t acc_stride) {
  constexpr size_t es = T == DType::F32 ? 4 : 2;
  const DF df;
  const size_t lanes = hn::Lanes(df), d = static_cast<size_t>(dim), full = d / lanes * lanes;
  const size_t tiled = full / (kC * lanes) * (kC * lanes), row_bytes = d * es;
  const int64_t tiled_q = G / kQ * kQ;
  for (size_t c0 = 0; c0 < tiled; c0 += kC * lanes) {
    for (int64_t h0 = 0; h0 < tiled_q; h0 += kQ)
      accumulate_tile<T, kQ, kC>(p + h0 * p_stride, p_stride, runs, n_runs, row_bytes, c0,
                                 acc + h0 * acc_stride, acc_stride);
    accumulate_rest<T, kC>(std::make_integer_sequence<int, kQ - 1>(), static_cast<int>(G - tiled_q),
                           p + tiled_q * p_stride, p_stride, runs, n_runs, row_bytes, c0,
                           acc + tiled_q * acc_stride, acc_stride);
  }
  for (size_t c0 = tiled; c0 < full; c0 += lanes)  // vectors past the blocks of kC
    for (int64_t h = 0; h < G; ++h)
      accumulate_tile<T, 1, 1>(p + h * p_stride, p_stride, runs, n_runs, row_bytes, c0, acc + h * acc_stride,
                               acc_stride);
  if (full < d)
    for (int64_t k = 0; k < n_runs; ++k)
      for (int64_t j = 0; j < runs[k].n; ++j) {
        const uint8_t* vrow = runs[k].rows + static_cast<size_t>(j) * row_bytes;
        const float* pk = p + runs[k].p_offset;
        for (size_t i = full; i < d; ++i)
          for (int64_t h = 0; h < G; ++h)
            acc[h * acc_stride + static_cast<int64_t>(i)] += pk[h * p_stride + j] * scalar_w<T>(vrow, i);
      }
}

template <DType T>
void accumulate_runs_t(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                       int64_t dim, float* acc, int64_t acc_stride);

// Floats of value rows converted from f16 at a time for groups of more than 8 queries (16 KB: four 16-row
// cache blocks at head size 64), and the runs they may come from.
constexpr int64_t kConvertedValueFloats = 4096, kConvertedRuns = 16;

// The f16 runs' rows converted to f32, kConvertedValueFloats at a time, and weighed by the f32 kernel: every
// vector of a row is converted once for all the group's queries instead of once per block of queries, and
// the sums are the same bits (the conversion is exact; each element's additions run in row order across
// the pieces as within one call).
void accumulate_runs_converted(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs,
                               int64_t n_runs, int64_t dim, float* acc, int64_t acc_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df), d = static_cast<size_t>(dim), full = d / lanes * lanes;
  const int64_t chunk_rows = kConvertedValueFloats / dim;
  HWY_ALIGN float rows[kConvertedValueFloats];
  ValueRun out[kConvertedRuns];
  int64_t n_out = 0, used = 0;  // runs and rows of the piece so far
  const auto flush = [&] {
    accumulate_runs_t<DType::F32>(p, G, p_stride, out, n_out, dim, acc, acc_stride);
    n_out = used = 0;
  };
  for (int64_t k = 0; k < n_runs; ++k) {
    for (int64_t j = 0; j < runs[k].n;) {
      if (used == chunk_rows || n_out == kConvertedRuns) flush();
      const int64_t take = std::min(runs[k].n - j, chunk_rows - used);
      float* to = rows + used * dim;
      for (int64_t t = 0; t < take; ++t) {
        const uint8_t* from = runs[k].rows + static_cast<size_t>(j + t) * d * 2;
        float* row = to + t * dim;
        for (size_t i = 0; i < full; i += lanes) hn::StoreU(load_w<DType::F16>(df, from, i), df, row + i);
        for (size_t i = full; i < d; ++i) row[i] = scalar_w<DType::F16>(from, i);
      }
      out[n_out++] = {reinterpret_cast<const uint8_t*>(to), take, runs[k].p_offset + j};
      used += take, j += take;
    }
  }
  if (n_out > 0) flush();
}

// Groups of 8 queries or more take 8 queries by 2 vectors of 64 bytes (each value row converted once per 8
// queries), smaller ones 4 by 4 (more independent chains); narrower vectors the same bytes in more vectors.
// On 32-byte vectors (AVX2, 16 registers) every group takes 4 queries by 2 vectors, faster there than 8 by 1
// (performance.md). Groups of more than 8 queries (a window's) weigh f16 rows converted once
// (accumulate_runs_converted).
template <DType T>
void accumulate_runs_t(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                       int64_t dim, float* acc, int64_t acc_stride) {
#if HWY_HAVE_SCALABLE
  for (int64_t k = 0; k < n_runs; ++k)
    for (int64_t h = 0; h < G; ++h)
      accumulate_t<T>(p + runs[k].p_offset + h * p_stride, runs[k].rows, runs[k].n, dim,
                      acc + h * acc_stride);
#else
  constexpr int kWide = HWY_MAX_BYTES >= 64 ? 1 : 2;  // 64-byte vectors: 1, else the same bytes in 2
  if (T == DType::F16 && G > 8 && dim <= kConvertedValueFloats) {
    accumulate_runs_converted(p, G, p_stride, runs, n_runs, dim, acc, acc_stride);
  } else if (G >= 8 && HWY_MAX_BYTES != 32) {
    accumulate_blocked<T, 8, 2 / kWide>(p, G, p_stride, runs, n_runs, dim, acc, acc_stride);
  } else {
    accumulate_blocked<T, 4, 4 / kWide>(p, G, p_stride, runs, n_runs, dim, acc, acc_stride);
  }
#endif
}

void DotsGroupF16(const float* q, int64_t G, int64_t q_stride, const uint16_t* rows, int64_t n, int64_t dim,
                  float* s, int64_t s_stride) {
  dots_group_t<DType::F16>(q, G, q_stride, reinterpret_cast<const uint8_t*>(rows), n, dim, s, s_stride);
}
void DotsGroupF32(const float* q, int64_t G, int64_t q_stride, const float* rows, int64_t n, int64_t dim,
                  float* s, int64_t s_stride) {
  dots_group_t<DType::F32>(q, G, q_stride, reinterpret_cast<const uint8_t*>(rows), n, dim, s, s_stride);
}
void AccumulateRunsF16(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                       int64_t dim, float* acc, int64_t acc_stride) {
  accumulate_runs_t<DType::F16>(p, G, p_stride, runs, n_runs, dim, acc, acc_stride);
}
void AccumulateRunsF32(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                       int64_t dim, float* acc, int64_t acc_stride) {
  accumulate_runs_t<DType::F32>(p, G, p_stride, runs, n_runs, dim, acc, acc_stride);
}

void DotsF16(const float* q, const uint16_t* rows, int64_t n, int64_t dim, float* s) {
  dots_t<DType::F16>(q, reinterpret_cast<const uint8_t*>(rows), n, dim, s);
}
void DotsF32(const float* q, const float* rows, int64_t n, int64_t dim, float* s) {
  dots_t<DType::F32>(q, reinterpret_cast<const uint8_t*>(rows), n, dim, s);
}
void AccumulateF16(const float* p, const uint16_t* rows, int64_t n, int64_t dim, float* acc) {
  accumulate_t<DType::F16>(p, reinterpret_cast<const uint8_t*>(rows), n, dim, acc);
}
void AccumulateF32(const float* p, const float* rows, int64_t n, int64_t dim, float* acc) {
  accumulate_t<DType::F32>(p, reinterpret_cast<const uint8_t*>(rows), n, dim, acc);
}

void F32ToF16(const float* HWY_RESTRICT x, int64_t n, uint8_t* HWY_RESTRICT out) {
  int64_t i = 0;
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)) || \
    (HWY_TARGET == HWY_NEON && (__ARM_FP & 2))
  // Highway's conversion for targets without these instructions truncates, so only these take it.
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto sign = hn::Set(du, 0x80000000u), quiet_nan = hn::Set(du, 0x7FC00000u);
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df, x + i);
    // A NaN as the default quiet one with its sign, which converts to the sign and 0x7E00 (the hardware
    // would keep part of another NaN's payload).
    const auto canonical = hn::IfThenElse(
        hn::IsNaN(v), hn::BitCast(df, hn::Or(hn::And(hn::BitCast(du, v), sign), quiet_nan)), v);
    hn::StoreU(hn::DemoteTo(dh, canonical), dh, reinterpret_cast<hwy::float16_t*>(out + 2 * i));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t h = f32_to_fp16(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto one = hn::Set(df, 1.0f), cap = hn::Set(df, 88.0f);
  size_t i = 0;
  for (; i + lanes <= static_cast<size_t>(n); i += lanes) {
    const auto g = hn::LoadU(df, gate + i);
    const auto e = hn::Exp(df, hn::Min(hn::Neg(g), cap));
    hn::StoreU(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::LoadU(df, up + i)), df, out + i);
  }
  // The tail through one masked-out vector pass keeps every element on the same code path.
  if (i < static_cast<size_t>(n)) {
    alignas(64) float g_buf[HWY_MAX_BYTES / sizeof(float)] = {}, u_buf[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t rest = static_cast<size_t>(n) - i;
    std::memcpy(g_buf, gate + i, rest * 4);
    std::memcpy(u_buf, up + i, rest * 4);
    const auto g = hn::Load(df, g_buf);
    const auto e = hn::Exp(df, hn::Min(hn::Neg(g), cap));
    hn::Store(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::Load(df, u_buf)), df, g_buf);
    std::memcpy(out + i, g_buf, rest * 4);
  }
}

// gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3), with hn::Exp;
// -2u is capped at 88, where the result is already 0 to single precision.
void GeluTanh(float* x, int64_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto one = hn::Set(df, 1.0f), cap = hn::Set(df, 88.0f);
  const auto k2 = hn::Set(df, -2.0f * 0.79788456080286535588f),
             k3 = hn::Set(df, -2.0f * 0.79788456080286535588f * 0.044715f);
  const auto gelu = [&](auto v) {
    const auto minus_2u = hn::Mul(v, hn::MulAdd(hn::Mul(v, v), k3, k2));
    return hn::Div(v, hn::Add(one, hn::Exp(df, hn::Min(minus_2u, cap))));
  };
  size_t i = 0;
  for (; i + lanes <= static_cast<size_t>(n); i += lanes) hn::StoreU(gelu(hn::LoadU(df, x + i)), df, x + i);
  if (i < static_cast<size_t>(n)) {
    alignas(64) float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t rest = static_cast<size_t>(n) - i;
    std::memcpy(buf, x + i, rest * 4);
    hn::Store(gelu(hn::Load(df, buf)), df, buf);
    std::memcpy(x + i, buf, rest * 4);
  }
}

// The exponentials of x less max and their sum (the softmax's second pass), each exponent x * scale - max in
// one rounding (kScaleInside) or x - max (x already scaled). The tail runs through one padded vector.
template <bool kScaleInside>
float exponentials(float* x, size_t full, size_t rest, float scale, hn::Vec<DF> max) {
  const DF df;
  using V = hn::Vec<DF>;
  const size_t lanes = hn::Lanes(df);
  const V vscale = hn::Set(df, scale);
  // (Scaled inside, the exponent at the max is the product's rounding residual, which may lie above zero: it
  // is held at zero.)
  const auto exponent = [&](V v) {
    return kScaleInside ? hn::Min(hn::MulSub(v, vscale, max), hn::Zero(df)) : hn::Sub(v, max);
  };
  alignas(64) float buf[HWY_MAX_BYTES / sizeof(float)];
  V sum = hn::Zero(df);
  for (size_t i = 0; i < full; i += lanes) {
    const V e = ExpNonPositive(df, exponent(hn::LoadU(df, x + i)));
    hn::StoreU(e, df, x + i);
    sum = hn::Add(sum, e);
  }
  if (rest > 0) {
    std::fill_n(buf, lanes, 0.0f);
    std::memcpy(buf, x + full, rest * 4);
    const V e = hn::IfThenElseZero(hn::FirstN(df, rest), ExpNonPositive(df, exponent(hn::Load(df, buf))));
    hn::Store(e, df, buf);
    std::memcpy(x + full, buf, rest * 4);
    sum = hn::Add(sum, e);
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// Softmax in three passes over x: the scores' max; exponentials and their sum; normalization. Plain scores
// (no soft cap and a positive scale, as attention's) are scaled inside the exponent, and their max is taken
// of the raw scores (a positive scale keeps their order, so max(x) * scale rounded is the max of the scaled
// scores), so the first pass only reads. Where that max exceeds 2^20 in magnitude the exponent's single
// rounding could leave it far from zero at the max itself (half a unit in the last place of the product: more
// than 87 beyond 2^31, every exponential zero), so such scores, and soft-capped ones, are scaled (and capped)
// and stored first, and the exponents are differences of the stored scores. Every element takes the same code
// path: tails run through one padded vector. (Faster than hn::Exp, a first pass that scaled and stored and a
// scalar last pass: performance.md.)
void Softmax(float* x, int64_t n, float scale, float softcap) {
  const DF df;
  using V = hn::Vec<DF>;
  const size_t lanes = hn::Lanes(df), full = static_cast<size_t>(n) / lanes * lanes,
               rest = static_cast<size_t>(n) - full;
  const V vscale = hn::Set(df, scale), vcap = hn::Set(df, softcap), low = hn::Set(df, -HUGE_VALF);
  alignas(64) float buf[HWY_MAX_BYTES / sizeof(float)];
  // The max of the scores as f gives them, over x in place (f's result stored when store).
  const auto max_of = [&](auto f, bool store) {
    V vmax = low;
    for (size_t i = 0; i < full; i += lanes) {
      const V v = f(hn::LoadU(df, x + i));
      if (store) hn::StoreU(v, df, x + i);
      vmax = hn::Max(vmax, v);
    }
    if (rest > 0) {
      std::fill_n(buf, lanes, 0.0f);
      std::memcpy(buf, x + full, rest * 4);
      const V v = f(hn::Load(df, buf));
      if (store) {
        hn::Store(v, df, buf);
        std::memcpy(x + full, buf, rest * 4);
      }
      vmax = hn::Max(vmax, hn::IfThenElse(hn::FirstN(df, rest), v, low));
    }
    return hn::MaxOfLanes(df, vmax);
  };
  const auto scaled = [&](V v) {
    v = hn::Mul(v, vscale);
    return softcap > 0 ? hn::Mul(vcap, hn::Tanh(df, hn::Div(v, vcap))) : v;
  };
  // Plain scores: the max of the raw ones, scaled; it decides whether the scaling goes inside the exponent.
  V max = hn::Zero(df);
  bool scale_inside = softcap <= 0 && scale > 0;
  if (scale_inside) {
    max = hn::Mul(max_of([](V v) { return v; }, false), vscale);
    scale_inside = std::fabs(hn::GetLane(max)) <= 1048576.0f;
  }
  if (!scale_inside) max = max_of(scaled, true);
  const float sum = scale_inside ? exponentials<true>(x, full, rest, scale, max)
                                 : exponentials<false>(x, full, rest, scale, max);
  const float inv = 1.0f / sum;
  const V vinv = hn::Set(df, inv);
  for (size_t i = 0; i < full; i += lanes) hn::StoreU(hn::Mul(hn::LoadU(df, x + i), vinv), df, x + i);
  for (size_t i = full; i < static_cast<size_t>(n); ++i) x[i] *= inv;
}

}  // namespace HWY_NAMESPACE
}  // namespace tandem::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::kernels {

HWY_EXPORT(FloatMatmulRows);
HWY_EXPORT(DotsF16);
HWY_EXPORT(DotsF32);
HWY_EXPORT(AccumulateF16);
HWY_EXPORT(AccumulateF32);
HWY_EXPORT(SiluMul);
HWY_EXPORT(GeluTanh);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(Softmax);
HWY_EXPORT(DotsGroupF16);
HWY_EXPORT(DotsGroupF32);
HWY_EXPORT(AccumulateRunsF16);
HWY_EXPORT(AccumulateRunsF32);

void dots_f16(const float* q, const uint16_t* rows, int64_t n, int64_t dim, float* s) {
  HWY_DYNAMIC_DISPATCH(DotsF16)(q, rows, n, dim, s);
}
void dots_f32(const float* q, const float* rows, int64_t n, int64_t dim, float* s) {
  HWY_DYNAMIC_DISPATCH(DotsF32)(q, rows, n, dim, s);
}
void accumulate_f16(const float* p, const uint16_t* rows, int64_t n, int64_t dim, float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumulateF16)(p, rows, n, dim, acc);
}
void accumulate_f32(const float* p, const float* rows, int64_t n, int64_t dim, float* acc) {
  HWY_DYNAMIC_DISPATCH(AccumulateF32)(p, rows, n, dim, acc);
}

void dots_group_f16(const float* q, int64_t G, int64_t q_stride, const uint16_t* rows, int64_t n, int64_t dim,
                    float* s, int64_t s_stride) {
  HWY_DYNAMIC_DISPATCH(DotsGroupF16)(q, G, q_stride, rows, n, dim, s, s_stride);
}
void dots_group_f32(const float* q, int64_t G, int64_t q_stride, const float* rows, int64_t n, int64_t dim,
                    float* s, int64_t s_stride) {
  HWY_DYNAMIC_DISPATCH(DotsGroupF32)(q, G, q_stride, rows, n, dim, s, s_stride);
}
// The grouped forms as one run.
void accumulate_group_f16(const float* p, int64_t G, int64_t p_stride, const uint16_t* rows, int64_t n,
                          int64_t dim, float* acc, int64_t acc_stride) {
  const ValueRun run{reinterpret_cast<const uint8_t*>(rows), n, 0};
  accumulate_runs_f16(p, G, p_stride, &run, 1, dim, acc, acc_stride);
}
void accumulate_group_f32(const float* p, int64_t G, int64_t p_stride, const float* rows, int64_t n,
                          int64_t dim, float* acc, int64_t acc_stride) {
  const ValueRun run{reinterpret_cast<const uint8_t*>(rows), n, 0};
  accumulate_runs_f32(p, G, p_stride, &run, 1, dim, acc, acc_stride);
}

void accumulate_runs_f16(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                         int64_t dim, float* acc, int64_t acc_stride) {
  HWY_DYNAMIC_DISPATCH(AccumulateRunsF16)(p, G, p_stride, runs, n_runs, dim, acc, acc_stride);
}
void accumulate_runs_f32(const float* p, int64_t G, int64_t p_stride, const ValueRun* runs, int64_t n_runs,
                         int64_t dim, float* acc, int64_t acc_stride) {
  HWY_DYNAMIC_DISPATCH(AccumulateRunsF32)(p, G, p_stride, runs, n_runs, dim, acc, acc_stride);
}

void f32_to_f16(const float* x, int64_t n, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(F32ToF16)(x, n, out);
}

void gelu_tanh(float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluTanh)(x, n);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMul)(gate, up, out, n);
}

void softmax(float* x, int64_t n, float scale, float softcap) {
  HWY_DYNAMIC_DISPATCH(Softmax)(x, n, scale, softcap);
}

void float_matmul_rows(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                       const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride) {
  HWY_DYNAMIC_DISPATCH(FloatMatmulRows)(type, w, w_row_bytes, o0, o1, k, x, x_stride, n_rows, y, y_stride);
}

}  // namespace tandem::kernels
#endif
