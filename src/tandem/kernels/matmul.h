// Matrix multiplication of activations by a weight matrix in its file format, for any number of rows.
// Every row's result depends only on that row (fixed reduction order per output element), so a row computes the
// same bits alone, inside a verify window or in a batch: the basis of exact speculative and batched decoding.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/tensor/weight.h"
#include "tandem/util/thread_pool.h"

namespace tandem::kernels {

// Per-thread scratch for matmul, sized once for the widest matrix (no allocation per call).
class MatmulScratch {
 public:
  MatmulScratch() = default;
  MatmulScratch(int n_threads, int64_t max_cols);
  float* dequant_buffer(int thread) { return buf_.data() + static_cast<size_t>(thread) * stride_; }
  int64_t max_cols() const { return max_cols_; }

 private:
  std::vector<float> buf_;
  size_t stride_ = 0;
  int64_t max_cols_ = 0;
};

// y[r][o] = sum_k W[o][k] * x[r][k]
//   w: [rows = N, cols = K] in its block format; x: [n_rows, K] f32 (row stride K); y: [n_rows, N] f32 (stride N).
void matmul(const MatrixView& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
            MatmulScratch& scratch);

// Scalar reference: dequantizes each weight row and accumulates in double. Tests compare kernels with it.
void matmul_reference(const MatrixView& w, const float* x, int64_t n_rows, float* y);

// Dot product of two f32 vectors with a fixed reduction order (8 interleaved partial sums, combined pairwise).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace tandem::kernels
