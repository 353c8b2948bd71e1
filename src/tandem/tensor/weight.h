// Non-owning views of weight matrices and vectors stored in a GGUF file, in the file's own block format.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/tensor/dtype.h"

namespace tandem {

// A 2-D weight matrix W[rows][cols] (GGUF ne[1] = rows = output features, ne[0] = cols = input features),
// each row `row_bytes` bytes in `type`'s block format. Borrowed from the mapped file.
struct MatrixView {
  DType type = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;
  // The rows were repacked in place at load into the kernels' interleaved form of `type` (same size;
  // kernels/repack.h). Only the matmul kernels read such a matrix.
  bool interleaved = false;

  bool empty() const { return data == nullptr; }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  size_t bytes() const { return static_cast<size_t>(rows) * row_bytes; }
};

// A 1-D f32 vector (norm weights, biases). Borrowed from the mapped file.
struct VectorView {
  const float* data = nullptr;
  int64_t size = 0;
  bool empty() const { return data == nullptr; }
};

}  // namespace tandem
