#include "tandem/kernels/repack.h"

#include <array>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/tensor/blocks.h"
#include "tandem/util/error.h"

namespace tandem::kernels {
namespace {

// The repacked legacy forms (repack.h): per block of the file, its f16 scale (and minimum), its code bytes
// and, for Q5_0 and Q5_1, its fifth bits; in the repacked super-block the 8 scales, then the 8 minimums, then
// the fifth-bit plane, then the 64-byte code planes.
struct LegacyForm {
  size_t block;  // bytes of one block in the file
  size_t qs;     // offset of the code bytes in a file block
  size_t qh;     // offset of the fifth bits in a file block (Q5_0, Q5_1), else 0
  bool min;      // a minimum beside the scale (Q4_1, Q5_1), at byte 2 of a file block
  int units;     // 8-byte code units per block: 2 (4-bit codes) or 4 (Q8_0)
  size_t plane;  // offset of the fifth-bit plane (32 bytes) in the repacked super-block, else 0
  size_t codes;  // offset of the first code plane in the repacked super-block
};

LegacyForm legacy_form(DType type) {
  switch (type) {
    case DType::Q4_0:
      return {sizeof(BlockQ4_0), offsetof(BlockQ4_0, qs), 0, false, 2, 0, 16};
    case DType::Q4_1:
      return {sizeof(BlockQ4_1), offsetof(BlockQ4_1, qs), 0, true, 2, 0, 32};
    case DType::Q5_0:
      return {sizeof(BlockQ5_0), offsetof(BlockQ5_0, qs), offsetof(BlockQ5_0, qh), false, 2, 16, 48};
    case DType::Q5_1:
      return {sizeof(BlockQ5_1), offsetof(BlockQ5_1, qs), offsetof(BlockQ5_1, qh), true, 2, 32, 64};
    default:
      TANDEM_CHECK(type == DType::Q8_0, "no repacked legacy form for this type");
      return {sizeof(BlockQ8_0), offsetof(BlockQ8_0, qs), 0, false, 4, 0, 16};
  }
}

bool legacy_type(DType type) {
  return type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q5_0 || type == DType::Q5_1 ||
         type == DType::Q8_0;
}

}  // namespace

bool can_lane_pair(DType type, int64_t cols) {
  return (type == DType::Q4_0 || type == DType::Q4_K || type == DType::Q8_0) && cols > 0 &&
         cols % (2 * kSuper) == 0;
}

bool lane_pair_window_fits(DType type, int64_t cols) {
  // Per row and pair of super-blocks the kernels read the codes of both, the scales and one row of offset
  // sums (640 bytes), for up to 8 rows a pass (kDirectRows).
  constexpr int64_t kActBytes =
      2 * sizeof(ActSuper::q) + sizeof(ActSuper::d) + sizeof(ActSuper::offset_sums[0]);
  constexpr int64_t kWindowRows = 8;
  return type != DType::Q8_0 ||
         kWindowRows * (cols / (2 * kSuper)) * kActBytes <= l1_data_cache_bytes() / 4 * 3;
}

namespace {

static_assert(kLanePairBytes == 16 * sizeof(BlockQ4_0) && kLanePairBytes == 2 * sizeof(BlockQ4_K) &&
              kMaxLanePairBytes == 16 * sizeof(BlockQ8_0));

// The 16 code bytes of block b of a pair in lane pairs, in the order of a Q4_0 block's qs (byte l: element l
// in the low nibble, l + 16 in the high one), from the pair's codes, and back.
void lane_pair_block_codes(const uint8_t* codes, int b, uint8_t* qs) {
  for (int v = 0; v < 4; ++v) std::memcpy(qs + 4 * v, codes + 64 * v + 4 * b, 4);
}
void set_lane_pair_block_codes(const uint8_t* qs, int b, uint8_t* codes) {
  for (int v = 0; v < 4; ++v) std::memcpy(codes + 64 * v + 4 * b, qs + 4 * v, 4);
}

// Nibble n of qs byte 32c + l of a Q4_K super-block is element 64c + 32n + l: sub-block j = 2c + n.
uint8_t q4_k_code(const BlockQ4_K& blk, int j, int l) {
  return (blk.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
}

void q4_k_lane_pair_from_file(const uint8_t* in, uint8_t* out) {
  uint8_t* header = out + lane_pair_scales_offset(DType::Q4_K, out);
  uint8_t* codes = out + lane_pair_codes_offset(out);
  std::memset(header, 0, 32);
  for (int s = 0; s < 2; ++s) {
    BlockQ4_K blk;
    std::memcpy(&blk, in + s * sizeof(BlockQ4_K), sizeof(blk));
    std::memcpy(header + 4 * s, &blk.d, 2);
    std::memcpy(header + 4 * s + 2, &blk.dmin, 2);
    for (int j = 0; j < 8; ++j) {
      const int b = 8 * s + j;
      const ScaleMin sm = k4_scale_min(blk.scales, j);
      header[8 + b] = static_cast<uint8_t>((sm.scale & 15) | (sm.min & 15) << 4);
      header[24 + j] |= static_cast<uint8_t>(((sm.scale >> 4) | (sm.min >> 4) << 2) << (4 * s));
      uint8_t qs[16];
      for (int l = 0; l < 16; ++l)
        qs[l] = static_cast<uint8_t>(q4_k_code(blk, j, l) | q4_k_code(blk, j, l + 16) << 4);
      set_lane_pair_block_codes(qs, b, codes);
    }
  }
}

void q4_k_lane_pair_to_file(const uint8_t* in, uint8_t* out) {
  const uint8_t* header = in + lane_pair_scales_offset(DType::Q4_K, in);
  const uint8_t* codes = in + lane_pair_codes_offset(in);
  for (int s = 0; s < 2; ++s) {
    BlockQ4_K blk{};
    std::memcpy(&blk.d, header + 4 * s, 2);
    std::memcpy(&blk.dmin, header + 4 * s + 2, 2);
    for (int j = 0; j < 8; ++j) {
      const int b = 8 * s + j;
      const int high = header[24 + j] >> (4 * s);
      set_k4_scale_min(blk.scales, j, static_cast<uint8_t>((header[8 + b] & 15) | (high & 3) << 4),
                       static_cast<uint8_t>((header[8 + b] >> 4) | (high >> 2 & 3) << 4));
      uint8_t qs[16];
      lane_pair_block_codes(codes, b, qs);
      for (int l = 0; l < 32; ++l) {
        const int code = (qs[l % 16] >> (4 * (l / 16))) & 15;
        blk.qs[32 * (j / 2) + l] |= static_cast<uint8_t>(code << (4 * (j % 2)));
      }
    }
    std::memcpy(out + s * sizeof(BlockQ4_K), &blk, sizeof(blk));
  }
}

// Q8_0: code c of element 4v + i of block b at 64v + 4b + i, as c + 128. Four codes at a time, one way or
// the other (adding 128 is its own inverse on bytes).
void move_q8_0_codes(const uint8_t* from, uint8_t* to) {
  uint32_t four;
  std::memcpy(&four, from, 4);
  four ^= 0x80808080u;
  std::memcpy(to, &four, 4);
}

void q8_0_lane_pair_from_file(const uint8_t* in, uint8_t* out) {
  uint8_t* scales = out + lane_pair_scales_offset(DType::Q8_0, out);
  uint8_t* codes = out + lane_pair_codes_offset(out);
  for (int b = 0; b < 16; ++b) {
    const uint8_t* blk = in + b * sizeof(BlockQ8_0);
    std::memcpy(scales + 2 * b, blk + offsetof(BlockQ8_0, d), 2);
    for (int v = 0; v < 8; ++v)
      move_q8_0_codes(blk + offsetof(BlockQ8_0, qs) + 4 * v, codes + 64 * v + 4 * b);
  }
}

void q8_0_lane_pair_to_file(const uint8_t* in, uint8_t* out) {
  const uint8_t* scales = in + lane_pair_scales_offset(DType::Q8_0, in);
  const uint8_t* codes = in + lane_pair_codes_offset(in);
  for (int b = 0; b < 16; ++b) {
    uint8_t* blk = out + b * sizeof(BlockQ8_0);
    std::memcpy(blk + offsetof(BlockQ8_0, d), scales + 2 * b, 2);
    for (int v = 0; v < 8; ++v)
      move_q8_0_codes(codes + 64 * v + 4 * b, blk + offsetof(BlockQ8_0, qs) + 4 * v);
  }
}

}  // namespace

void lane_pair_from_file(DType type, const uint8_t* in, uint8_t* out) {
  if (type == DType::Q4_K) return q4_k_lane_pair_from_file(in, out);
  if (type == DType::Q8_0) return q8_0_lane_pair_from_file(in, out);
  uint8_t* scales = out + lane_pair_scales_offset(type, out);
  uint8_t* codes = out + lane_pair_codes_offset(out);
  for (int b = 0; b < 16; ++b) {
    const uint8_t* blk = in + b * sizeof(BlockQ4_0);
    std::memcpy(scales + 2 * b, blk + offsetof(BlockQ4_0, d), 2);
    set_lane_pair_block_codes(blk + offsetof(BlockQ4_0, qs), b, codes);
  }
}

void lane_pair_to_file(DType type, const uint8_t* in, uint8_t* out) {
  if (type == DType::Q4_K) return q4_k_lane_pair_to_file(in, out);
  if (type == DType::Q8_0) return q8_0_lane_pair_to_file(in, out);
  const uint8_t* scales = in + lane_pair_scales_offset(type, in);
  const uint8_t* codes = in + lane_pair_codes_offset(in);
  for (int b = 0; b < 16; ++b) {
    uint8_t* blk = out + b * sizeof(BlockQ4_0);
    std::memcpy(blk + offsetof(BlockQ4_0, d), scales + 2 * b, 2);
    lane_pair_block_codes(codes, b, blk + offsetof(BlockQ4_0, qs));
  }
}

bool can_interleave(DType type, int64_t cols) {
  const bool legacy = legacy_type(type);
  const bool k_quant = type == DType::Q2_K || type == DType::Q3_K || type == DType::Q4_K ||
                       type == DType::Q5_K || type == DType::Q6_K;
  if (legacy) return cols >= kSuper && cols % kQK == 0;
  return k_quant && cols > 0 && cols % kSuper == 0;
}

bool repack_pays(DType type, int64_t cols, Target target) {
  // Only the x86 targets decode the repacked forms in registers; the others would read them back through the
  // file form on every matmul.
  const bool avx512 = target == Target::kAVX512 || target == Target::kAVX512VBMI || target == Target::kAMX;
  // The forms of Q4_1, Q5_0 and Q5_1, and rows with a partial last super-block, have direct kernels under
  // AVX-512 only.
  const bool avx2 = (target == Target::kAVX2 || target == Target::kAVX2VNNI) &&
                    (type == DType::Q4_0 || type == DType::Q8_0 || !legacy_type(type)) && cols % kSuper == 0;
  return can_interleave(type, cols) && (avx2 || avx512);
}

WeightForm repack_form(DType type, int64_t rows, int64_t cols, const uint8_t* data, Target target) {
  if (!repack_pays(type, cols, target)) return WeightForm::kFile;
  const bool avx512 = target == Target::kAVX512 || target == Target::kAVX512VBMI || target == Target::kAMX;
  // (Off 32 bytes, lane pairs and row tiles would load their code vectors across cache lines.)
  const bool aligned = reinterpret_cast<uintptr_t>(data) % 32 == 0;
  if (target == Target::kAMX && aligned && can_row_tile(type, rows, cols)) return WeightForm::kRowTiles;
  return avx512 && aligned && can_lane_pair(type, cols) && lane_pair_window_fits(type, cols)
             ? WeightForm::kLanePairs
             : WeightForm::kInterleaved;
}

size_t interleave_super_bytes(DType type) {
  if (type == DType::Q2_K) return sizeof(BlockQ2_K);
  if (type == DType::Q3_K) return sizeof(BlockQ3_K);
  if (type == DType::Q4_K) return sizeof(BlockQ4_K);
  if (type == DType::Q5_K) return sizeof(BlockQ5_K);
  if (type == DType::Q6_K) return sizeof(BlockQ6_K);
  TANDEM_CHECK(legacy_type(type), "no interleaved form for this type");
  return 8 * legacy_form(type).block;
}

namespace {

// A bit field of one element's code: `bits` bits at bit `shift` of byte `byte` of the super-block.
struct Field {
  int byte, shift, bits;
};

// Where the K-quant forms keep element e's code (e = 128h + 32c + l, g = e / 16, q = (e % 16) / 4, i = e % 4,
// p = 4g + i). In the file: Q4_K and Q5_K nibble (e % 64) / 32 of qs[32 (e / 64) + e % 32] (qs at byte 16 or
// 48), Q5_K's fifth bit at bit e / 32 of qh[e % 32] (qh at byte 16); Q6_K the low 4 bits in nibble c / 2 of
// ql[64h + 32 (c % 2) + l] (ql at byte 0), the high 2 at bits 2c, 2c + 1 of qh[32h + l] (qh at byte 128);
// Q3_K the low 2 bits at bits 2c, 2c + 1 of qs[32h + l] (qs at byte 32), the third at bit 4h + c of
// hmask[l] (byte 0); Q2_K as Q3_K's low bits (qs at byte 16). In the interleaved forms (repack.h): the
// nibbles of Q4_K, Q5_K and Q6_K in byte 64 (q % 2) + p of the nibble planes, nibble q / 2; Q6_K's high bits
// at bits 2q, 2q + 1 of byte p of its qh plane, Q3_K's (Q2_K's) low bits at bits 2q, 2q + 1 of byte 32 + p
// (16 + p); the third (Q3_K) or fifth (Q5_K) bit at bit q + 4 (p / 32) of byte p % 32 of a 32-byte plane (at
// byte 0 or 16). fields() gives the low field first, then the high one.
int fields(DType type, int e, bool interleaved, Field* out) {
  const int g = e / 16, q = (e % 16) / 4, i = e % 4;
  if (type == DType::Q2_K) {
    constexpr int kQs = offsetof(BlockQ2_K, qs);
    const int h = e / 128, c = (e % 128) / 32, l = e % 32;
    out[0] = interleaved ? Field{kQs + 4 * g + i, 2 * q, 2} : Field{kQs + 32 * h + l, 2 * c, 2};
    return 1;
  }
  if (type == DType::Q3_K) {
    constexpr int kQs = offsetof(BlockQ3_K, qs), kHmask = offsetof(BlockQ3_K, hmask);
    static_assert(kHmask == 0 && kQs == 32);
    const int h = e / 128, c = (e % 128) / 32, l = e % 32, p = 4 * g + i;
    out[0] = interleaved ? Field{32 + p, 2 * q, 2} : Field{kQs + 32 * h + l, 2 * c, 2};
    out[1] = interleaved ? Field{p % 32, q + 4 * (p / 32), 1} : Field{kHmask + l, 4 * h + c, 1};
    return 2;
  }
  if (type == DType::Q5_K) {
    constexpr int kQs = offsetof(BlockQ5_K, qs), kQh = offsetof(BlockQ5_K, qh);
    static_assert(kQh == 16 && kQs == 48);
    const int p = 4 * g + i;
    out[0] = interleaved ? Field{kQs + 64 * (q % 2) + p, 4 * (q / 2), 4}
                         : Field{kQs + 32 * (e / 64) + e % 32, 4 * ((e % 64) / 32), 4};
    out[1] = interleaved ? Field{kQh + p % 32, q + 4 * (p / 32), 1} : Field{kQh + e % 32, e / 32, 1};
    return 2;
  }
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

// The moves of every code field from one form to the other, worked out once per type and direction.
struct Move {
  uint8_t src, src_shift, mask, dst, dst_shift;
};

struct MovePlan {
  std::array<Move, 2 * kSuper> moves;
  int size = 0;
};

MovePlan plan_moves(DType type, bool from_interleaved) {
  MovePlan p;
  for (int e = 0; e < kSuper; ++e) {
    Field from[2], to[2];
    const int n = fields(type, e, from_interleaved, from);
    fields(type, e, !from_interleaved, to);
    for (int f = 0; f < n; ++f)
      p.moves[static_cast<size_t>(p.size++)] = {
          static_cast<uint8_t>(from[f].byte), static_cast<uint8_t>(from[f].shift),
          static_cast<uint8_t>((1 << from[f].bits) - 1), static_cast<uint8_t>(to[f].byte),
          static_cast<uint8_t>(to[f].shift)};
  }
  return p;
}

// Index of a K-quant type with an interleaved form: Q2_K 0, Q3_K 1, Q4_K 2, Q5_K 3, Q6_K 4.
int k_index(DType type) {
  return type == DType::Q2_K   ? 0
         : type == DType::Q3_K ? 1
         : type == DType::Q4_K ? 2
         : type == DType::Q5_K ? 3
                               : 4;
}

// The bytes of a K-quant super-block that hold codes (in either form): [begin, end).
std::pair<size_t, size_t> code_bytes(DType type) {
  if (type == DType::Q2_K) return {offsetof(BlockQ2_K, qs), offsetof(BlockQ2_K, d)};
  if (type == DType::Q3_K) return {0, offsetof(BlockQ3_K, scales)};
  if (type == DType::Q4_K) return {offsetof(BlockQ4_K, qs), sizeof(BlockQ4_K)};
  if (type == DType::Q5_K) return {offsetof(BlockQ5_K, qh), sizeof(BlockQ5_K)};
  return {offsetof(BlockQ6_K, ql), offsetof(BlockQ6_K, scales)};
}

// A K-quant super-block from one form to the other by its move plan: the code fields move, every other
// byte (scales, d) stays.
void move_codes(DType type, const MovePlan& plan, const uint8_t* in, uint8_t* out) {
  const size_t bytes = interleave_super_bytes(type);
  const auto [codes_begin, codes_end] = code_bytes(type);
  std::memcpy(out, in, bytes);
  std::memset(out + codes_begin, 0, codes_end - codes_begin);
  for (int m = 0; m < plan.size; ++m) {
    const Move& mv = plan.moves[static_cast<size_t>(m)];
    out[mv.dst] =
        static_cast<uint8_t>(out[mv.dst] | (((in[mv.src] >> mv.src_shift) & mv.mask) << mv.dst_shift));
  }
}

// A K-quant super-block from the interleaved form back to the file's.
void unpack_k_planes(DType type, const uint8_t* in, uint8_t* out) {
  static const MovePlan plans[5] = {plan_moves(DType::Q2_K, true), plan_moves(DType::Q3_K, true),
                                    plan_moves(DType::Q4_K, true), plan_moves(DType::Q5_K, true),
                                    plan_moves(DType::Q6_K, true)};
  move_codes(type, plans[k_index(type)], in, out);
}

// A K-quant super-block to the interleaved form through this CPU's unpack kernel, its codes taken in group
// order (UnpackedSuper::u: position 64q + p, p = 4g + i, holds quarter q of position p), so the planes
// are plain byte loops over p: nibble plane A takes quarters 0 and 2, plane B quarters 1 and 3; the two-bit
// planes (Q2_K's and Q3_K's low bits, Q6_K's high ones) a field of each quarter; the 32-byte planes (Q3_K's
// third bits, Q5_K's fifth) one bit of each quarter of p and of p + 32. (With their move plans, element by
// element, loading a model whose K-quants are repacked took several times as long, most of it in the moves;
// performance.md.)
void pack_k_planes(DType type, const uint8_t* in, uint8_t* out) {
  static const QuantKernels& qk = quant_kernels(best_target());
  UnpackedSuper us;
  qk.unpack_row(type, WeightForm::kFile, in, kSuper, qk.signed_q8, &us);
  if (in_k4_block_lanes(qk, type)) {  // unpacked in block lanes
    const UnpackedSuper lanes = us;
    for (int e = 0; e < kSuper; ++e)
      us.u[code_position(e, CodeOrder::kGroup)] = lanes.u[code_position(e, CodeOrder::kBlockLanes)];
  }
  const uint8_t* u = us.u;
  std::memcpy(out, in, interleave_super_bytes(type));
  // The `bits` bits from bit `shift` of the code of each quarter q at position p, at bit bits * q of a byte.
  const auto quarter_bits = [&](int p, int shift, int bits) {
    const int mask = (1 << bits) - 1;
    int v = 0;
    for (int q = 0; q < 4; ++q) v |= ((u[64 * q + p] >> shift) & mask) << (bits * q);
    return static_cast<uint8_t>(v);
  };
  if (type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K) {
    uint8_t* planes = out + (type == DType::Q4_K   ? offsetof(BlockQ4_K, qs)
                             : type == DType::Q5_K ? offsetof(BlockQ5_K, qs)
                                                   : offsetof(BlockQ6_K, ql));
    for (int p = 0; p < 64; ++p) {
      planes[p] = static_cast<uint8_t>((u[p] & 0xF) | ((u[128 + p] & 0xF) << 4));
      planes[64 + p] = static_cast<uint8_t>((u[64 + p] & 0xF) | ((u[192 + p] & 0xF) << 4));
    }
  }
  if (type == DType::Q6_K)
    for (int p = 0; p < 64; ++p) out[offsetof(BlockQ6_K, qh) + p] = quarter_bits(p, 4, 2);
  if (type == DType::Q2_K || type == DType::Q3_K) {
    const size_t low = type == DType::Q2_K ? offsetof(BlockQ2_K, qs) : 32;
    for (int p = 0; p < 64; ++p) out[low + p] = quarter_bits(p, 0, 2);
  }
  if (type == DType::Q3_K || type == DType::Q5_K) {
    const int shift = type == DType::Q3_K ? 2 : 4;
    const size_t plane = type == DType::Q3_K ? 0 : 16;
    for (int p = 0; p < 32; ++p)
      out[plane + p] =
          static_cast<uint8_t>(quarter_bits(p, shift, 1) | (quarter_bits(32 + p, shift, 1) << 4));
  }
}

// The legacy types (repack.h): code byte i of block j to 8-byte unit i / 8 of the code planes, at
// position 8j + i % 8; a fifth bit, that of element 32j + t (bit t of the block's qh word), is quarter q = t
// / 8 of position p = 8j + t % 8 (block order, quant_layout.h), kept at bit q + 4 (p / 32) of byte p % 32 of
// the fifth-bit plane.
void pack_legacy(DType type, const uint8_t* in, uint8_t* out) {
  const LegacyForm f = legacy_form(type);
  if (f.plane) std::memset(out + f.plane, 0, 32);
  for (int j = 0; j < 8; ++j) {
    const uint8_t* b = in + static_cast<size_t>(j) * f.block;
    std::memcpy(out + 2 * j, b, 2);
    if (f.min) std::memcpy(out + 16 + 2 * j, b + 2, 2);
    for (int h = 0; h < f.units; ++h) std::memcpy(out + f.codes + 64 * h + 8 * j, b + f.qs + 8 * h, 8);
    if (!f.plane) continue;
    uint32_t qh;
    std::memcpy(&qh, b + f.qh, 4);
    for (int t = 0; t < 32; ++t) {
      const int q = t / 8, p = 8 * j + t % 8;
      out[f.plane + p % 32] |= static_cast<uint8_t>(((qh >> t) & 1) << (q + 4 * (p / 32)));
    }
  }
}

void unpack_legacy(DType type, const uint8_t* in, uint8_t* out) {
  const LegacyForm f = legacy_form(type);
  for (int j = 0; j < 8; ++j) {
    uint8_t* b = out + static_cast<size_t>(j) * f.block;
    std::memcpy(b, in + 2 * j, 2);
    if (f.min) std::memcpy(b + 2, in + 16 + 2 * j, 2);
    for (int h = 0; h < f.units; ++h) std::memcpy(b + f.qs + 8 * h, in + f.codes + 64 * h + 8 * j, 8);
    if (!f.plane) continue;
    uint32_t qh = 0;
    for (int t = 0; t < 32; ++t) {
      const int q = t / 8, p = 8 * j + t % 8;
      qh |= static_cast<uint32_t>((in[f.plane + p % 32] >> (q + 4 * (p / 32))) & 1) << t;
    }
    std::memcpy(b + f.qh, &qh, 4);
  }
}

// The fifth-bit plane's nibble of position p: quarters 0..3 at bits 0..3.
int fifth_nibble(const uint8_t* plane, int p) {
  return (plane[p % 32] >> (4 * (p / 32))) & 0xF;
}

// Offsets in a partial last super-block of n blocks (repack.h): its n scales, n minimums (Q4_1, Q5_1), the
// first 8n bytes of each code plane, then the fifth bits (Q5_0, Q5_1).
struct TailForm {
  size_t mins, codes, bits;
};

TailForm tail_form(const LegacyForm& f, size_t n) {
  const size_t codes = (f.min ? 4 : 2) * n;
  return {2 * n, codes, codes + 8 * n * static_cast<size_t>(f.units)};
}

// A whole repacked super-block whose blocks from `blocks` on are zero -> the partial form (repack.h).
void pack_tail(DType type, int blocks, const uint8_t* in, uint8_t* out) {
  const auto n = static_cast<size_t>(blocks);
  const LegacyForm f = legacy_form(type);
  const TailForm t = tail_form(f, n);
  std::memcpy(out, in, 2 * n);
  if (f.min) std::memcpy(out + t.mins, in + 16, 2 * n);
  for (int c = 0; c < f.units; ++c)
    std::memcpy(out + t.codes + 8 * n * static_cast<size_t>(c), in + f.codes + 64 * static_cast<size_t>(c),
                8 * n);
  if (!f.plane) return;
  uint8_t* bits = out + t.bits;
  for (int p = 0; p < 8 * blocks; p += 2)
    bits[p / 2] =
        static_cast<uint8_t>(fifth_nibble(in + f.plane, p) | (fifth_nibble(in + f.plane, p + 1) << 4));
}

}  // namespace

void expand_tail(DType type, int blocks, const uint8_t* tail, uint8_t* out) {
  const auto n = static_cast<size_t>(blocks);
  const LegacyForm f = legacy_form(type);
  const TailForm t = tail_form(f, n);
  std::memset(out, 0, interleave_super_bytes(type));
  std::memcpy(out, tail, 2 * n);
  if (f.min) std::memcpy(out + 16, tail + t.mins, 2 * n);
  for (int c = 0; c < f.units; ++c)
    std::memcpy(out + f.codes + 64 * static_cast<size_t>(c), tail + t.codes + 8 * n * static_cast<size_t>(c),
                8 * n);
  if (!f.plane) return;
  const uint8_t* bits = tail + t.bits;
  for (int p = 0; p < 8 * blocks; ++p)
    out[f.plane + p % 32] |= static_cast<uint8_t>(((bits[p / 2] >> (4 * (p % 2))) & 0xF) << (4 * (p / 32)));
}

void interleave_super(DType type, const uint8_t* in, uint8_t* out) {
  if (legacy_type(type)) return pack_legacy(type, in, out);
  pack_k_planes(type, in, out);
}

void deinterleave_super(DType type, const uint8_t* in, uint8_t* out) {
  if (legacy_type(type)) return unpack_legacy(type, in, out);
  unpack_k_planes(type, in, out);
}

void interleave_rows(DType type, int64_t cols, uint8_t* data, size_t bytes) {
  TANDEM_CHECK(can_interleave(type, cols), "interleave_rows: no interleaved form for this type and width");
  const size_t sb = interleave_super_bytes(type), rb = row_bytes(type, cols);
  const size_t whole = static_cast<size_t>(cols / kSuper) * sb;  // a partial last super-block stays
  TANDEM_CHECK(bytes % rb == 0, "interleave_rows: not whole rows");
  uint8_t tmp[8 * sizeof(BlockQ8_0)];
  static_assert(sizeof(tmp) >= sizeof(BlockQ6_K));
  uint8_t padded[8 * sizeof(BlockQ8_0)];
  const int tail_blocks = static_cast<int>(cols % kSuper / kQK);
  for (size_t r = 0; r < bytes; r += rb) {
    for (size_t o = r; o < r + whole; o += sb) {
      std::memcpy(tmp, data + o, sb);
      interleave_super(type, tmp, data + o);
    }
    if (tail_blocks == 0) continue;
    std::memset(tmp, 0, sb);
    std::memcpy(tmp, data + r + whole, rb - whole);
    interleave_super(type, tmp, padded);
    pack_tail(type, tail_blocks, padded, data + r + whole);
  }
}

void repack_rows(WeightForm form, DType type, int64_t cols, uint8_t* data, size_t bytes) {
  if (form == WeightForm::kInterleaved) return interleave_rows(type, cols, data, bytes);
  if (form == WeightForm::kRowTiles) {
    const size_t tile = row_bytes(type, cols) * kTileRows;
    TANDEM_CHECK(can_row_tile(type, kTileRows, cols) && bytes % tile == 0,
                 "repack_rows: no row tiles for this type and shape");
    std::vector<uint8_t> tmp(tile);
    for (size_t o = 0; o < bytes; o += tile) {
      std::memcpy(tmp.data(), data + o, tile);
      row_tile_from_file(type, cols, tmp.data(), data + o);
    }
    return;
  }
  TANDEM_CHECK(form == WeightForm::kLanePairs && can_lane_pair(type, cols),
               "repack_rows: no such repacked form for this type and width");
  const size_t pair = lane_pair_bytes(type);
  TANDEM_CHECK(bytes % pair == 0, "repack_rows: not whole rows");
  uint8_t tmp[kMaxLanePairBytes];
  for (size_t o = 0; o < bytes; o += pair) {
    std::memcpy(tmp, data + o, pair);
    lane_pair_from_file(type, tmp, data + o);
  }
}

void file_form_row(const MatrixView& w, int64_t r, uint8_t* out) {
  const uint8_t* row = w.row(r);
  if (w.form == WeightForm::kFile) {
    std::memcpy(out, row, w.row_bytes);
    return;
  }
  if (w.form == WeightForm::kRowTiles)
    return row_tile_row_to_file(w.type, w.cols, w.row(r - r % kTileRows), static_cast<int>(r % kTileRows),
                                out);
  if (w.form == WeightForm::kLanePairs) {
    const size_t pair = lane_pair_bytes(w.type);
    for (size_t o = 0; o < w.row_bytes; o += pair) lane_pair_to_file(w.type, row + o, out + o);
    return;
  }
  const size_t sb = interleave_super_bytes(w.type);
  const size_t whole = static_cast<size_t>(w.cols / kSuper) * sb;
  for (size_t o = 0; o < whole; o += sb) deinterleave_super(w.type, row + o, out + o);
  if (whole == w.row_bytes) return;
  uint8_t padded[8 * sizeof(BlockQ8_0)], file[8 * sizeof(BlockQ8_0)];
  expand_tail(w.type, static_cast<int>(w.cols % kSuper / kQK), row + whole, padded);
  deinterleave_super(w.type, padded, file);
  std::memcpy(out + whole, file, w.row_bytes - whole);
}

}  // namespace tandem::kernels
