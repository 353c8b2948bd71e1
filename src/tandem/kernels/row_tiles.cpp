// Q4_0 in row tiles (repack.h): the AMX target's form.
#include <cstring>

#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"

namespace tandem::kernels {

bool can_row_tile(DType type, int64_t rows, int64_t cols) {
  return type == DType::Q4_0 && rows > 0 && rows % kTileRows == 0 && cols > 0 && cols % kQK == 0;
}

void row_tile_from_file(int64_t cols, const uint8_t* in, uint8_t* out) {
  const int64_t blocks = cols / kQK;
  const size_t rb = static_cast<size_t>(blocks) * sizeof(BlockQ4_0);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* tile = out + static_cast<size_t>(b) * kRowTileBlockBytes;
    uint8_t* scales = tile + row_tile_scales_offset(tile);
    uint8_t* codes = tile + row_tile_codes_offset(tile);
    for (int n = 0; n < kTileRows; ++n) {
      const uint8_t* blk = in + n * rb + static_cast<size_t>(b) * sizeof(BlockQ4_0);
      std::memcpy(scales + 2 * n, blk + offsetof(BlockQ4_0, d), 2);
      for (int v = 0; v < 4; ++v)
        std::memcpy(codes + 64 * v + 4 * n, blk + offsetof(BlockQ4_0, qs) + 4 * v, 4);
    }
  }
}

void row_tile_row_to_file(int64_t cols, const uint8_t* tile, int n, uint8_t* out) {
  for (int64_t b = 0; b < cols / kQK; ++b) {
    const uint8_t* block = tile + static_cast<size_t>(b) * kRowTileBlockBytes;
    const uint8_t* scales = block + row_tile_scales_offset(block);
    const uint8_t* codes = block + row_tile_codes_offset(block);
    uint8_t* blk = out + static_cast<size_t>(b) * sizeof(BlockQ4_0);
    std::memcpy(blk + offsetof(BlockQ4_0, d), scales + 2 * n, 2);
    for (int v = 0; v < 4; ++v) std::memcpy(blk + offsetof(BlockQ4_0, qs) + 4 * v, codes + 64 * v + 4 * n, 4);
  }
}

void row_tile_to_file(int64_t cols, const uint8_t* in, uint8_t* out) {
  const size_t rb = static_cast<size_t>(cols / kQK) * sizeof(BlockQ4_0);
  for (int n = 0; n < kTileRows; ++n) row_tile_row_to_file(cols, in, n, out + n * rb);
}

}  // namespace tandem::kernels
