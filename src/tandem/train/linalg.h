// Dense f32 matrix products for the trainer's forward and backward, on the project's float kernels and
// thread pool. Every output element is one dot product reduced in a fixed order (kernels::float_matmul_rows)
// and the threads split the outputs, never a reduction: results are bit-identical for any thread count.
#pragma once

#include <cstdint>

#include "tandem/train/param.h"

namespace tandem::train {

// y[r][o] = sum_k x[r][k] * w[o][k]
//   x: [rows, K]; w: [N, K]; y: [rows, N] (overwritten)
void matmul_xwt(const float* x, int64_t rows, int64_t K, const float* w, int64_t N, float* y, Compute& c);

// dx[r][k] = sum_o dy[r][o] * w[o][k], added to dx when accumulate, else stored
//   dy: [rows, N]; w: [N, K]; dx: [rows, K]
void matmul_dyw(const float* dy, int64_t rows, int64_t N, const float* w, int64_t K, float* dx,
                bool accumulate, Compute& c);

// dw[o][k] += sum_r dy[r][o] * x[r][k] (r in order)
//   dy: [rows, N]; x: [rows, K]; dw: [N, K]
void matmul_dyt_x(const float* dy, int64_t rows, int64_t N, const float* x, int64_t K, float* dw, Compute& c);

// at[j][i] = a[i][j]   a: [rows, cols]; at: [cols, rows]
void transpose(const float* a, int64_t rows, int64_t cols, float* at, ThreadPool& pool);

}  // namespace tandem::train
