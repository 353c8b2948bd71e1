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

bool repack_pays(DType type, int64_t cols) {
  return can_interleave(type, cols) && (type != DType::Q4_0 || best_target() != Target::kAVX512);
}

size_t interleave_super_bytes(DType type) {
  if (type == DType::Q4_K) return sizeof(BlockQ4_K);
  if (type == DType::Q6_K) return sizeof(BlockQ6_K);
  TANDEM_CHECK(type == DType::Q4_0 || type == DType::Q8_0, "no interleaved form for this type");
  return 8 * block_bytes(type);
}

namespace {

// A bit field of one element's code: `bits` bits at bit `shift` of byte `byte` of the super-block.
struct Field {
  int byte, shift, bits;
};

// Where the K-quant forms keep element e's code. Q4_K: the file holds it in qs[32 (e / 64) + e % 32] (qs at
// byte 16), nibble (e % 64) / 32. Q6_K: the low 4 bits in ql[64h + 32 (c % 2) + l] (ql at byte 0), nibble
// c / 2, the high 2 bits in qh[32h + l] (qh at byte 128), bits 2c, 2c + 1, for e = 128h + 32c + l. The
// interleaved forms (repack.h) keep quarter q of group g (element 16g + 4q + i) in byte 64 (q % 2) + 4g + i
// of the nibble planes, nibble q / 2, and for Q6_K its high bits at bits 2q, 2q + 1 of byte 4g + i of the qh
// plane. fields() gives the low field first, then the high one (Q6_K).
int fields(DType type, int e, bool interleaved, Field* out) {
  const int g = e / 16, q = (e % 16) / 4, i = e % 4;
  if (type == DType::Q4_K) {
    constexpr int kQs = offsetof(BlockQ4_K, qs);
    out[0] = interleaved ? Field{kQs + 64 * (q % 2) + 4 * g + i, 4 * (q / 2), 4}
                         : Field{kQs + 32 * (e / 64) + e % 32, 4 * ((e % 64) / 32), 4};
    return 1;
  }
  constexpr int kQl = offsetof(BlockQ6_K, ql), kQh = offsetof(BlockQ6_K, qh);
  const int h = e / 128, c = (e % 128) / 32, l = e % 32;
  out[0] = interleaved ? Field{kQl + 64 * (q % 2) + 4 * g + i, 4 * (q / 2), 4}
                       : Field{kQl + 64 * h + 32 * (c % 2) + l, 4 * (c / 2), 4};
  out[1] = interleaved ? Field{kQh + 4 * g + i, 2 * q, 2} : Field{kQh + 32 * h + l, 2 * c, 2};
  return 2;
}

// One K-quant super-block from one form to the other: the code fields move, every other byte (scales, d)
// stays.
void move_k_codes(DType type, const uint8_t* in, bool in_interleaved, uint8_t* out) {
  const size_t bytes = interleave_super_bytes(type);
  const size_t codes_begin = type == DType::Q4_K ? offsetof(BlockQ4_K, qs) : offsetof(BlockQ6_K, ql);
  const size_t codes_end = type == DType::Q4_K ? sizeof(BlockQ4_K) : offsetof(BlockQ6_K, scales);
  std::memcpy(out, in, bytes);
  std::memset(out + codes_begin, 0, codes_end - codes_begin);
  for (int e = 0; e < kSuper; ++e) {
    Field from[2], to[2];
    const int n = fields(type, e, in_interleaved, from);
    fields(type, e, !in_interleaved, to);
    for (int f = 0; f < n; ++f) {
      const int v = (in[from[f].byte] >> from[f].shift) & ((1 << from[f].bits) - 1);
      out[to[f].byte] = static_cast<uint8_t>(out[to[f].byte] | (v << to[f].shift));
    }
  }
}

}  // namespace

// Code bytes move in 8-byte units: unit h of block j (bytes 8h..8h+7) sits at 16 + 64h + 8j.
void interleave_super(DType type, const uint8_t* in, uint8_t* out) {
  if (type == DType::Q4_K || type == DType::Q6_K) return move_k_codes(type, in, false, out);
  const size_t bb = block_bytes(type);
  const int units = codes_per_block(type) / 8;
  for (int j = 0; j < 8; ++j) {
    const uint8_t* b = in + static_cast<size_t>(j) * bb;
    std::memcpy(out + 2 * j, b, 2);
    for (int h = 0; h < units; ++h) std::memcpy(out + code_offset(j, 8 * h), b + 2 + 8 * h, 8);
  }
}

void deinterleave_super(DType type, const uint8_t* in, uint8_t* out) {
  if (type == DType::Q4_K || type == DType::Q6_K) return move_k_codes(type, in, true, out);
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
