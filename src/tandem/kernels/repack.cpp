#include "tandem/kernels/repack.h"

#include <cstddef>
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
  return (type == DType::Q4_0 || type == DType::Q8_0 || type == DType::Q4_K) && cols > 0 &&
         cols % kSuper == 0;
}

size_t interleave_super_bytes(DType type) {
  if (type == DType::Q4_K) return sizeof(BlockQ4_K);
  TANDEM_CHECK(type == DType::Q4_0 || type == DType::Q8_0, "no interleaved form for this type");
  return 8 * block_bytes(type);
}

namespace {

// Q4_K: byte p of the interleaved codes (p < 64: plane A, else plane B) and its nibble n hold the code of
// element k4_element(p, n); the file holds element e in qs[32 (e / 64) + e % 32], nibble (e % 64) / 32.
int k4_element(int p, int n) {
  const int pos = p % 64, g = pos / 4, i = pos % 4, q = p / 64 + 2 * n;
  return 16 * g + 4 * q + i;
}

int k4_file_byte(int e) {
  return 32 * (e / 64) + e % 32;
}

int k4_file_nibble(int e) {
  return (e % 64) / 32;
}

constexpr size_t kK4Header = offsetof(BlockQ4_K, qs);

void interleave_k4(const uint8_t* in, uint8_t* out) {
  std::memcpy(out, in, kK4Header);
  for (int p = 0; p < 128; ++p) {
    uint8_t b = 0;
    for (int n = 0; n < 2; ++n) {
      const int e = k4_element(p, n);
      b = static_cast<uint8_t>(
          b | (((in[kK4Header + k4_file_byte(e)] >> (4 * k4_file_nibble(e))) & 0xF) << (4 * n)));
    }
    out[kK4Header + p] = b;
  }
}

void deinterleave_k4(const uint8_t* in, uint8_t* out) {
  std::memcpy(out, in, kK4Header);
  std::memset(out + kK4Header, 0, 128);
  for (int p = 0; p < 128; ++p)
    for (int n = 0; n < 2; ++n) {
      const int e = k4_element(p, n);
      out[kK4Header + k4_file_byte(e)] |=
          static_cast<uint8_t>(((in[kK4Header + p] >> (4 * n)) & 0xF) << (4 * k4_file_nibble(e)));
    }
}

}  // namespace

// Code bytes move in 8-byte units: unit h of block j (bytes 8h..8h+7) sits at 16 + 64h + 8j.
void interleave_super(DType type, const uint8_t* in, uint8_t* out) {
  if (type == DType::Q4_K) return interleave_k4(in, out);
  const size_t bb = block_bytes(type);
  const int units = codes_per_block(type) / 8;
  for (int j = 0; j < 8; ++j) {
    const uint8_t* b = in + static_cast<size_t>(j) * bb;
    std::memcpy(out + 2 * j, b, 2);
    for (int h = 0; h < units; ++h) std::memcpy(out + code_offset(j, 8 * h), b + 2 + 8 * h, 8);
  }
}

void deinterleave_super(DType type, const uint8_t* in, uint8_t* out) {
  if (type == DType::Q4_K) return deinterleave_k4(in, out);
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
