#include "tandem/train/linalg.h"

#include <algorithm>

#include "tandem/kernels/float_kernels.h"

namespace tandem::train {
namespace {

// Output columns per chunk: enough work per chunk to amortize a wake-up, and a multiple of the kernels'
// weight tiles.
constexpr int64_t kColumnGrain = 16;
constexpr int64_t kTile = 32;

// y[r][o] (= or +=) sum_k x[r][k] w[o][k] for o in [0, N) over rows of x, split across the team by output
// column. To accumulate (tmp not null, [rows, N]), each thread computes its columns into tmp and adds them
// within the same parallel region.
void rows_times_wt(const float* x, int64_t x_stride, int64_t rows, int64_t K, const float* w, int64_t N,
                   float* y, int64_t y_stride, float* tmp, ThreadPool& pool) {
  const auto* wb = reinterpret_cast<const uint8_t*>(w);
  const size_t row_bytes = static_cast<size_t>(K) * sizeof(float);
  pool.parallel_for(N, kColumnGrain, [&](int64_t o0, int64_t o1, int) {
    if (tmp == nullptr) {
      kernels::float_matmul_rows(DType::F32, wb, row_bytes, o0, o1, K, x, x_stride, rows, y, y_stride);
      return;
    }
    kernels::float_matmul_rows(DType::F32, wb, row_bytes, o0, o1, K, x, x_stride, rows, tmp, N);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = o0; o < o1; ++o) y[r * y_stride + o] += tmp[r * N + o];
  });
}

// Columns [j0, j1) of a ([rows, cols]) as rows of at ([cols, rows]).
void transpose_columns(const float* a, int64_t rows, int64_t cols, float* at, int64_t j0, int64_t j1) {
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t i = i0; i < i1; ++i) at[j * rows + i] = a[i * cols + j];
  }
}

}  // namespace

void transpose(const float* a, int64_t rows, int64_t cols, float* at, ThreadPool& pool) {
  pool.parallel_for(cols, kTile,
                    [&](int64_t j0, int64_t j1, int) { transpose_columns(a, rows, cols, at, j0, j1); });
}

void matmul_xwt(const float* x, int64_t rows, int64_t K, const float* w, int64_t N, float* y, Compute& c) {
  if (rows == 0 || N == 0) return;
  rows_times_wt(x, K, rows, K, w, N, y, N, nullptr, c.pool);
}

void matmul_dyw(const float* dy, int64_t rows, int64_t N, const float* w, int64_t K, float* dx,
                bool accumulate, Compute& c) {
  if (rows == 0 || K == 0) return;
  float* wt = c.scratch.get(0, N * K);  // [K, N]
  transpose(w, N, K, wt, c.pool);
  rows_times_wt(dy, N, rows, N, wt, K, dx, K, accumulate ? c.scratch.get(1, rows * K) : nullptr, c.pool);
}

void matmul_dyt_x(const float* dy, int64_t rows, int64_t N, const float* x, int64_t K, float* dw,
                  Compute& c) {
  if (rows == 0 || N == 0 || K == 0) return;
  float* dyt = c.scratch.get(0, N * rows);  // [N, rows]
  float* xt = c.scratch.get(1, K * rows);   // [K, rows]
  float* tmp = c.scratch.get(2, N * K);     // [N, K]
  // Both transposes in one region: columns [0, N) are dy's, [N, N + K) x's.
  c.pool.parallel_for(N + K, kTile, [&](int64_t j0, int64_t j1, int) {
    if (j0 < N) transpose_columns(dy, rows, N, dyt, j0, std::min(j1, N));
    if (j1 > N) transpose_columns(x, rows, K, xt, std::max(j0, N) - N, j1 - N);
  });
  rows_times_wt(dyt, rows, N, rows, xt, K, dw, K, tmp, c.pool);
}

}  // namespace tandem::train
