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
  const bool has_form =
      type == DType::Q4_0 || type == DType::Q8_0 || type == DType::Q4_K || type == DType::Q6_K;
  return has_form && cols > 0 && cols % kSuper == 0;
}

size_t interleave_super_bytes(DType type) {
  if (type == DType::Q4_K) return sizeof(BlockQ4_K);
  if (type == DType::Q6_K) return sizeof(BlockQ6_K);
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

// Q6_K: the low nibble planes as Q4_K's (ql at offset 0), and one plane of high bits: byte 4g + i of qh holds
// the two high bits of quarter q of group g (element 16g + 4q + i) at bits 2q, 2q + 1. The file holds element
// e = 128h + 32c + l in ql[64h + 32 (c % 2) + l], nibble c / 2, and qh[32h + l], bits 2c, 2c + 1.
void k6_file_place(int e, int& ql_byte, int& ql_nibble, int& qh_byte, int& qh_shift) {
  const int h = e / 128, c = (e % 128) / 32, l = e % 32;
  ql_byte = 64 * h + 32 * (c % 2) + l;
  ql_nibble = c / 2;
  qh_byte = 32 * h + l;
  qh_shift = 2 * c;
}

constexpr size_t kK6Qh = offsetof(BlockQ6_K, qh);

void interleave_k6(const uint8_t* in, uint8_t* out) {
  std::memcpy(out, in, sizeof(BlockQ6_K));
  std::memset(out, 0, kK6Qh + 64);
  for (int e = 0; e < 256; ++e) {
    int qb, qn, hb, hs;
    k6_file_place(e, qb, qn, hb, hs);
    const int g = e / 16, q = (e % 16) / 4, i = e % 4;
    const int low = (in[qb] >> (4 * qn)) & 0xF, high = (in[kK6Qh + hb] >> hs) & 3;
    out[64 * (q % 2) + 4 * g + i] |= static_cast<uint8_t>(low << (4 * (q / 2)));
    out[kK6Qh + 4 * g + i] |= static_cast<uint8_t>(high << (2 * q));
  }
}

void deinterleave_k6(const uint8_t* in, uint8_t* out) {
  std::memcpy(out, in, sizeof(BlockQ6_K));
  std::memset(out, 0, kK6Qh + 64);
  for (int e = 0; e < 256; ++e) {
    int qb, qn, hb, hs;
    k6_file_place(e, qb, qn, hb, hs);
    const int g = e / 16, q = (e % 16) / 4, i = e % 4;
    const int low = (in[64 * (q % 2) + 4 * g + i] >> (4 * (q / 2))) & 0xF;
    const int high = (in[kK6Qh + 4 * g + i] >> (2 * q)) & 3;
    out[qb] |= static_cast<uint8_t>(low << (4 * qn));
    out[kK6Qh + hb] |= static_cast<uint8_t>(high << hs);
  }
}
}  // namespace

// Code bytes move in 8-byte units: unit h of block j (bytes 8h..8h+7) sits at 16 + 64h + 8j.
void interleave_super(DType type, const uint8_t* in, uint8_t* out) {
  if (type == DType::Q4_K) return interleave_k4(in, out);
  if (type == DType::Q6_K) return interleave_k6(in, out);
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
  if (type == DType::Q6_K) return deinterleave_k6(in, out);
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
  static_assert(sizeof(tmp) >= sizeof(BlockQ6_K));
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
