#include "tandem/kernels/matmul.h"

#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"

namespace tandem::kernels {

MatmulScratch::MatmulScratch(int n_threads, int64_t max_cols)
    : stride_(static_cast<size_t>((max_cols + 15) / 16 * 16)), max_cols_(max_cols) {
  buf_.resize(stride_ * static_cast<size_t>(n_threads));
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  for (int j = 0; k < n; ++k, ++j) acc[j] += a[k] * b[k];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void matmul(const MatrixView& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool,
            MatmulScratch& scratch) {
  TANDEM_CHECK(w.cols <= scratch.max_cols() || w.type == DType::F32, "matmul scratch too small");
  const int64_t N = w.rows, K = w.cols;
  // Output features are split across threads; each thread dequantizes one weight row at a time into its buffer
  // and applies it to every activation row, so the weights are read once for all rows.
  pool.parallel_for(N, 16, [&](int64_t o0, int64_t o1, int thread) {
    for (int64_t o = o0; o < o1; ++o) {
      const float* wrow;
      float* buf = nullptr;
      if (w.type == DType::F32) {
        wrow = reinterpret_cast<const float*>(w.row(o));
      } else {
        buf = scratch.dequant_buffer(thread);
        dequantize_row(w.type, w.row(o), buf, K);
        wrow = buf;
      }
      for (int64_t r = 0; r < n_rows; ++r) y[r * N + o] = dot_f32(wrow, x + r * K, K);
    }
  });
}

void matmul_reference(const MatrixView& w, const float* x, int64_t n_rows, float* y) {
  std::vector<float> buf(static_cast<size_t>(w.cols));
  for (int64_t o = 0; o < w.rows; ++o) {
    dequantize_row(w.type, w.row(o), buf.data(), w.cols);
    for (int64_t r = 0; r < n_rows; ++r) {
      double acc = 0;
      for (int64_t k = 0; k < w.cols; ++k) acc += static_cast<double>(buf[k]) * x[r * w.cols + k];
      y[r * w.rows + o] = static_cast<float>(acc);
    }
  }
}

}  // namespace tandem::kernels
