// The encoders' matrix product of float weights (F32, F16, BF16) with f32 activations, in outer-product form:
// a tile of activation rows by a panel of weight rows accumulates across the columns with broadcast fused
// multiply-adds, each output in one vector lane, so no output ends in a horizontal sum. The weight rows are
// converted to f32 and laid out column-major once per call and block of kGemmDepth columns (a panel that
// every activation row meets), not once per use. Written once with Highway and dispatched at run time (AVX2,
// AVX-512, NEON); targets without fused multiply-adds run the scalar reference.
//
// The sum order is part of the contract: an output is s_0 + s_1 + ... (added left to right), where s_b is the
// chain of fused multiply-adds, from +0 and in column order, over the b-th block of kGemmDepth columns. It
// depends on k alone, never on the rows beside a row, where a row sits, the range of outputs, the thread
// split or the target: every target gives float_gemm_reference's bits. The order differs from the row
// classes' dot products (float_kernels.h), so only rows that never meet another row class take it: an
// encoder's, which always runs whole sequences (matmul.h encoder_matmul_group).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/tensor/dtype.h"

namespace tandem::kernels {

// Columns per block of the sum order (and of the converted panels). Part of the contract: results depend on
// it.
constexpr int64_t kGemmDepth = 128;

// For each weight row o in [o0, o1) (row o at w + o * w_row_bytes, k elements of `type`: F32, F16 or BF16)
// and each activation row r < n_rows (x + r * x_stride, k floats): y[r * y_stride + o] = W[o] . x[r], in the
// order above. Writes no other output.
void float_gemm_rows(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                     const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride);

// Scalar reference: the same operations in the same order (std::fma), one output at a time.
void float_gemm_reference(DType type, const uint8_t* w, size_t w_row_bytes, int64_t o0, int64_t o1, int64_t k,
                          const float* x, int64_t x_stride, int64_t n_rows, float* y, int64_t y_stride);

}  // namespace tandem::kernels
