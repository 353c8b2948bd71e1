// GGUF block formats: scalar reference dequantization and quantization, bit-compatible with the reference
// layouts. These are the ground truth that every SIMD kernel is tested against; they are not the hot path.
#pragma once

#include <cstdint>

#include "tandem/tensor/dtype.h"

namespace tandem {

// Dequantizes n elements (a multiple of t's block size) from the blocks at `src` into `dst`.
// Supports every type whose traits say `computable`; throws tandem::Error for others.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes n floats (a multiple of t's block size) into blocks at `dst` (row_bytes(t, n) bytes), with the
// reference implementation's rounding rules, so its readers decode them. Throws for types it cannot write.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace tandem
