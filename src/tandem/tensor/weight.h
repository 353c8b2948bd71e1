// Non-owning views of weight matrices and vectors stored in a GGUF file, in the file's own block format.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/tensor/dtype.h"

namespace tandem {

// The form of a matrix's bytes: the file's block format, or one of the kernels' repacked forms of it
// (kernels/repack.h), rearranged in place at load (the same size). Only the matmul kernels read a repacked
// matrix.
enum class WeightForm : uint8_t {
  kFile,
  kInterleaved,  // per super-block: the scales side by side, the codes in planes (every x86 target)
  kLanePairs,    // Q4_0 per pair of super-blocks, one 32-bit lane per block (the AVX-512 kernels)
  kRowTiles,     // Q4_0, Q8_0 per 16 rows and block, one 32-bit lane per row (the AMX kernels)
};

// A 2-D weight matrix W[rows][cols] (GGUF ne[1] = rows = output features, ne[0] = cols = input features),
// each row `row_bytes` bytes in `type`'s block format. Borrowed from the mapped file.
struct MatrixView {
  DType type = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;
  WeightForm form = WeightForm::kFile;

  bool empty() const { return data == nullptr; }
  // Where row r starts (in row tiles: the start of its tile of 16 rows when r is a multiple of 16).
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  size_t bytes() const { return static_cast<size_t>(rows) * row_bytes; }
  // Rows [r0, r0 + n) as a matrix of their own: a view of the same bytes, in the same form (no copy). In
  // row tiles r0 and n must be multiples of 16 (whole tiles; row_range_fits).
  MatrixView row_range(int64_t r0, int64_t n) const {
    MatrixView v = *this;
    v.data = row(r0);
    v.rows = n;
    return v;
  }
  bool row_range_fits(int64_t r0, int64_t n) const {
    return r0 >= 0 && n >= 0 && r0 + n <= rows &&
           (form != WeightForm::kRowTiles || (r0 % 16 == 0 && n % 16 == 0));
  }
};

// A 1-D f32 vector (norm weights, biases). Borrowed from the mapped file.
struct VectorView {
  const float* data = nullptr;
  int64_t size = 0;
  bool empty() const { return data == nullptr; }
};

}  // namespace tandem
