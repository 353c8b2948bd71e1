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

// One block of one row between the file's form (blk) and the tile's block (block), either way.
template <bool kToTile>
void move_block(DType type, int n, uint8_t* blk, uint8_t* block) {
  uint8_t* scales = block + row_tile_scales_offset(type, block);
  uint8_t* codes = block + row_tile_codes_offset(block);
  const int vectors = static_cast<int>(code_bytes(type) / 4);
  if (kToTile) {
    std::memcpy(scales + 2 * n, blk, 2);
    for (int v = 0; v < vectors; ++v) std::memcpy(codes + 64 * v + 4 * n, blk + 2 + 4 * v, 4);
  } else {
    std::memcpy(blk, scales + 2 * n, 2);
    for (int v = 0; v < vectors; ++v) std::memcpy(blk + 2 + 4 * v, codes + 64 * v + 4 * n, 4);
  }
}

}  // namespace

bool can_row_tile(DType type, int64_t rows, int64_t cols) {
  return (type == DType::Q4_0 || type == DType::Q8_0) && rows > 0 && rows % kTileRows == 0 && cols > 0 &&
         cols % kQK == 0;
}

size_t row_tile_block_bytes(DType type) {
  return kTileRows * (2 + code_bytes(type));
}

void row_tile_from_file(DType type, int64_t cols, const uint8_t* in, uint8_t* out) {
  const size_t bb = 2 + code_bytes(type), rb = static_cast<size_t>(cols / kQK) * bb;
  for (int64_t b = 0; b < cols / kQK; ++b)
    for (int n = 0; n < kTileRows; ++n)
      move_block<true>(type, n, const_cast<uint8_t*>(in) + n * rb + static_cast<size_t>(b) * bb,
                       out + static_cast<size_t>(b) * row_tile_block_bytes(type));
}

void row_tile_row_to_file(DType type, int64_t cols, const uint8_t* tile, int n, uint8_t* out) {
  const size_t bb = 2 + code_bytes(type);
  for (int64_t b = 0; b < cols / kQK; ++b)
    move_block<false>(type, n, out + static_cast<size_t>(b) * bb,
                      const_cast<uint8_t*>(tile) + static_cast<size_t>(b) * row_tile_block_bytes(type));
}

void row_tile_to_file(DType type, int64_t cols, const uint8_t* in, uint8_t* out) {
  const size_t rb = static_cast<size_t>(cols / kQK) * (2 + code_bytes(type));
  for (int n = 0; n < kTileRows; ++n) row_tile_row_to_file(type, cols, in, n, out + n * rb);
}

}  // namespace tandem::kernels
