// Q4_0 and Q8_0 in row tiles (repack.h): the AMX target's form.
#include <cstring>

#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"

namespace tandem::kernels {
namespace {

// Code bytes of one 32-element block in the file (after its 2-byte f16 scale).
size_t code_bytes(DType type) {
  return type == DType::Q8_0 ? sizeof(BlockQ8_0::qs) : sizeof(BlockQ4_0::qs);
}

// Where row n's scale, and its code bytes 4v..4v+3, lie in a block of a tile.
size_t scale_at(DType type, const uint8_t* block, int n) {
  return row_tile_scales_offset(type, block) + 2 * static_cast<size_t>(n);
}
size_t codes_at(const uint8_t* block, int n, int v) {
  return row_tile_codes_offset(block) + 64 * static_cast<size_t>(v) + 4 * static_cast<size_t>(n);
}

}  // namespace

static_assert(row_tile_block_bytes(DType::Q4_0) == kTileRows * sizeof(BlockQ4_0));
static_assert(row_tile_block_bytes(DType::Q8_0) == kTileRows * sizeof(BlockQ8_0));

bool can_row_tile(DType type, int64_t rows, int64_t cols) {
  return (type == DType::Q4_0 || type == DType::Q8_0) && rows > 0 && rows % kTileRows == 0 && cols > 0 &&
         cols % kQK == 0;
}

void row_tile_from_file(DType type, int64_t cols, const uint8_t* in, uint8_t* out) {
  const size_t bb = 2 + code_bytes(type), rb = static_cast<size_t>(cols / kQK) * bb;
  const int vectors = static_cast<int>(code_bytes(type) / 4);
  for (int64_t b = 0; b < cols / kQK; ++b) {
    uint8_t* block = out + static_cast<size_t>(b) * row_tile_block_bytes(type);
    for (int n = 0; n < kTileRows; ++n) {
      const uint8_t* blk = in + n * rb + static_cast<size_t>(b) * bb;
      std::memcpy(block + scale_at(type, block, n), blk, 2);
      for (int v = 0; v < vectors; ++v) std::memcpy(block + codes_at(block, n, v), blk + 2 + 4 * v, 4);
    }
  }
}

void row_tile_row_to_file(DType type, int64_t cols, const uint8_t* tile, int n, uint8_t* out) {
  const size_t bb = 2 + code_bytes(type);
  const int vectors = static_cast<int>(code_bytes(type) / 4);
  for (int64_t b = 0; b < cols / kQK; ++b) {
    const uint8_t* block = tile + static_cast<size_t>(b) * row_tile_block_bytes(type);
    uint8_t* blk = out + static_cast<size_t>(b) * bb;
    std::memcpy(blk, block + scale_at(type, block, n), 2);
    for (int v = 0; v < vectors; ++v) std::memcpy(blk + 2 + 4 * v, block + codes_at(block, n, v), 4);
  }
}

void row_tile_to_file(DType type, int64_t cols, const uint8_t* in, uint8_t* out) {
  const size_t rb = row_bytes(type, cols);
  for (int n = 0; n < kTileRows; ++n) row_tile_row_to_file(type, cols, in, n, out + n * rb);
}

}  // namespace tandem::kernels
