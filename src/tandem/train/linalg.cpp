#include "tandem/train/linalg.h"

#include <algorithm>

#include "tandem/kernels/float_kernels.h"

namespace tandem::train {
namespace {

// Output columns per chunk: enough work per chunk to amortize a wake-up, and a multiple of the kernels'
// weight tiles.
constexpr int64_t kColumnGrain = 16;

// y[r][o] for o in [0, N) over rows of x, split across the team by output column.
void rows_times_wt(const float* x, int64_t x_stride, int64_t rows, int64_t K, const float* w, int64_t N,
                   float* y, int64_t y_stride, ThreadPool& pool) {
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const size_t row_bytes = static_cast<size_t>(K) * sizeof(float);
  pool.parallel_for(N, kColumnGrain, [&](int64_t o0, int64_t o1, int) {
    kernels::float_matmul_rows(DType::F32, wb, row_bytes, o0, o1, K, x, x_stride, rows, y, y_stride);
  });
}

void add_into(float* dst, const float* src, int64_t n, ThreadPool& pool) {
  pool.parallel_for(n, 4096, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) dst[i] += src[i];
  });
}

}  // namespace

void transpose(const float* a, int64_t rows, int64_t cols, float* at, ThreadPool& pool) {
  constexpr int64_t kTile = 32;
  pool.parallel_for(cols, kTile, [&](int64_t j0, int64_t j1, int) {
    for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
      const int64_t i1 = std::min(rows, i0 + kTile);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) at[j * rows + i] = a[i * cols + j];
    }
  });
}

void matmul_xwt(const float* x, int64_t rows, int64_t K, const float* w, int64_t N, float* y, Compute& c) {
  if (rows == 0 || N == 0) return;
  rows_times_wt(x, K, rows, K, w, N, y, N, c.pool);
}

void matmul_dyw(const float* dy, int64_t rows, int64_t N, const float* w, int64_t K, float* dx,
                bool accumulate, Compute& c) {
  if (rows == 0 || K == 0) return;
  float* wt = c.scratch.get(0, N * K);  // [K, N]
  transpose(w, N, K, wt, c.pool);
  float* out = accumulate ? c.scratch.get(1, rows * K) : dx;
  rows_times_wt(dy, N, rows, N, wt, K, out, K, c.pool);
  if (accumulate) add_into(dx, out, rows * K, c.pool);
}

void matmul_dyt_x(const float* dy, int64_t rows, int64_t N, const float* x, int64_t K, float* dw,
                  Compute& c) {
  if (rows == 0 || N == 0 || K == 0) return;
  float* dyt = c.scratch.get(0, N * rows);  // [N, rows]
  float* xt = c.scratch.get(1, K * rows);   // [K, rows]
  float* out = c.scratch.get(2, N * K);     // [N, K]
  transpose(dy, rows, N, dyt, c.pool);
  transpose(x, rows, K, xt, c.pool);
  rows_times_wt(dyt, rows, N, rows, xt, K, out, K, c.pool);
  add_into(dw, out, N * K, c.pool);
}

}  // namespace tandem::train
