// Dispatch of the scalar reference (de)quantizers by type, and the plain float formats. The block formats
// live in quant_legacy.cpp (32-element blocks) and quant_kquants.cpp (256-element super-blocks).
#include "tandem/tensor/quant.h"

#include <cstring>
#include <string>

#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"
#include "tandem/util/error.h"

namespace tandem {

namespace quant_impl {
// Each converts nb whole blocks.
void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t nb);
void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t nb);
void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t nb);
void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t nb);
void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t nb);
void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t nb);
void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t nb);
void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t nb);
void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t nb);
void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t nb);
void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t nb);

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb);
void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb);
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb);
void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb);
void quantize_q2_k(const float* x, BlockQ2_K* y, int64_t nb);
void quantize_q3_k(const float* x, BlockQ3_K* y, int64_t nb);
void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nb);
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nb);
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nb);
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t nb);
}  // namespace quant_impl

namespace {

std::string type_name(DType t) {
  const auto tr = dtype_traits(static_cast<uint32_t>(t));
  return tr ? std::string(tr->name) : "id " + std::to_string(static_cast<uint32_t>(t));
}

// Number of blocks in n elements of t; throws for an unknown type or a count that is not whole blocks.
int64_t block_count(const char* what, DType t, int64_t n) {
  const auto tr = dtype_traits(static_cast<uint32_t>(t));
  if (!tr) throw Error(std::string(what) + ": unknown tensor type " + type_name(t));
  if (n < 0 || n % tr->block_size != 0) {
    throw Error(std::string(what) + ": " + std::to_string(n) + " elements is not a whole number of " +
                std::string(tr->name) + " blocks of " + std::to_string(tr->block_size));
  }
  return n / tr->block_size;
}

[[noreturn]] void unsupported(const char* what, DType t) {
  throw Error(std::string(what) + ": tensor type " + type_name(t) + " is not supported");
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  using namespace quant_impl;
  const int64_t nb = block_count("dequantize_row", t, n);
  switch (t) {
    case DType::F32:
      if (nb > 0) std::memcpy(dst, src, static_cast<size_t>(nb) * sizeof(float));
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < nb; ++i) dst[i] = fp16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < nb; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q4_0:
      return dequantize_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::Q4_1:
      return dequantize_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case DType::Q5_0:
      return dequantize_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case DType::Q5_1:
      return dequantize_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case DType::Q8_0:
      return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::Q2_K:
      return dequantize_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
    case DType::Q3_K:
      return dequantize_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb);
    case DType::Q4_K:
      return dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::Q5_K:
      return dequantize_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case DType::Q6_K:
      return dequantize_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::Q8_K:
      return dequantize_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb);
    default:
      unsupported("dequantize_row", t);
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  using namespace quant_impl;
  const int64_t nb = block_count("quantize_row", t, n);
  switch (t) {
    case DType::F32:
      if (nb > 0) std::memcpy(dst, src, static_cast<size_t>(nb) * sizeof(float));
      return;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < nb; ++i) h[i] = f32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < nb; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q4_0:
      return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::Q4_1:
      return quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case DType::Q5_0:
      return quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::Q5_1:
      return quantize_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case DType::Q8_0:
      return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::Q2_K:
      return quantize_q2_k(src, static_cast<BlockQ2_K*>(dst), nb);
    case DType::Q3_K:
      return quantize_q3_k(src, static_cast<BlockQ3_K*>(dst), nb);
    case DType::Q4_K:
      return quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case DType::Q5_K:
      return quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
    case DType::Q6_K:
      return quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    case DType::Q8_K:
      return quantize_q8_k(src, static_cast<BlockQ8_K*>(dst), nb);
    default:
      unsupported("quantize_row", t);
  }
}

}  // namespace tandem
