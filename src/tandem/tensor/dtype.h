// GGML tensor types as stored in GGUF files: ids, block sizes and byte sizes.
// The numbering is the file format's; it must never change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct DTypeTraits {
  std::string_view name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
  bool computable;      // Tandem has kernels for it (dequantize + matmul)
};

// Traits of a type id read from a file; nullopt for ids the format does not define (or that were removed).
std::optional<DTypeTraits> dtype_traits(uint32_t id);
const DTypeTraits& traits(DType t);
inline std::string_view dtype_name(DType t) {
  return traits(t).name;
}
std::optional<DType> dtype_from_name(std::string_view name);  // case-insensitive, e.g. "q4_0", "Q4_K"

// Bytes of one row of n elements; n must be a multiple of the block size (checked by callers).
inline size_t row_bytes(DType t, int64_t n) {
  const DTypeTraits& tr = traits(t);
  return static_cast<size_t>(n / tr.block_size) * tr.type_size;
}

}  // namespace tandem
