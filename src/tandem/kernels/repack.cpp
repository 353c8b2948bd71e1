#include "tandem/kernels/repack.h"

#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/blocks.h"
#include "tandem/util/error.h"

namespace tandem::kernels {
namespace {

constexpr size_t kScaleBytes = 16;  // the 8 f16 scales at the head of an interleaved super-block

// Block size in the file and the offset of code byte i of block j in the interleaved form.
size_t block_bytes(DType type) {
  return type == DType::Q4_0 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
}

size_t code_offset(int j, int i) {
  // Q4_0: byte halves i / 8 (64 bytes each); Q8_0: quarters i / 8. Both: 8 bytes per block within.
  return kScaleBytes + 64 * static_cast<size_t>(i / 8) + 8 * static_cast<size_t>(j) +
         static_cast<size_t>(i % 8);
}

int codes_per_block(DType type) {
  return type == DType::Q4_0 ? kQK / 2 : kQK;
}

}  // namespace

bool can_interleave(DType type, int64_t cols) {
  return (type == DType::Q4_0 || type == DType::Q8_0) && cols > 0 && cols % kSuper == 0;
}

size_t interleave_super_bytes(DType type) {
  TANDEM_CHECK(type == DType::Q4_0 || type == DType::Q8_0, "no interleaved form for this type");
  return 8 * block_bytes(type);
}

// Code bytes move in 8-byte units: unit h of block j (bytes 8h..8h+7) sits at 16 + 64h + 8j.
void interleave_super(DType type, const uint8_t* in, uint8_t* out) {
  const size_t bb = block_bytes(type);
  const int units = codes_per_block(type) / 8;
  for (int j = 0; j < 8; ++j) {
    const uint8_t* b = in + static_cast<size_t>(j) * bb;
    std::memcpy(out + 2 * j, b, 2);
    for (int h = 0; h < units; ++h) std::memcpy(out + code_offset(j, 8 * h), b + 2 + 8 * h, 8);
  }
}

void deinterleave_super(DType type, const uint8_t* in, uint8_t* out) {
  const size_t bb = block_bytes(type);
  const int units = codes_per_block(type) / 8;
  for (int j = 0; j < 8; ++j) {
    uint8_t* b = out + static_cast<size_t>(j) * bb;
    std::memcpy(b, in + 2 * j, 2);
    for (int h = 0; h < units; ++h) std::memcpy(b + 2 + 8 * h, in + code_offset(j, 8 * h), 8);
  }
}

void interleave_rows(DType type, uint8_t* data, size_t bytes) {
  const size_t sb = interleave_super_bytes(type);
  TANDEM_CHECK(bytes % sb == 0, "interleave_rows: not whole super-blocks");
  uint8_t tmp[8 * sizeof(BlockQ8_0)];
  for (size_t o = 0; o < bytes; o += sb) {
    std::memcpy(tmp, data + o, sb);
    interleave_super(type, tmp, data + o);
  }
}

void file_form_row(const MatrixView& w, int64_t r, uint8_t* out) {
  const uint8_t* row = w.row(r);
  if (!w.interleaved) {
    std::memcpy(out, row, w.row_bytes);
    return;
  }
  const size_t sb = interleave_super_bytes(w.type);
  for (size_t o = 0; o < w.row_bytes; o += sb) deinterleave_super(w.type, row + o, out + o);
}

}  // namespace tandem::kernels
