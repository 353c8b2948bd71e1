// Internal layouts of the quantized matmul kernels (not a file format).
//
// Every quantized weight type is brought, 256 elements at a time, into one form: unsigned 8-bit codes u with
// a float scale a and offset b per 16 elements, so that weight = a * u + b. Activation rows are quantized
// once per matmul into 8-bit codes q with a float scale per 32 elements (as the reference's Q8_0 blocks),
// plus the sum of the codes per 16 elements (scaled, and as integer offset sums). A dot product over one
// 16-element group is then
//     sum(w * x) = dx * (a * sum(u * q) + b * sum(q)),
// an integer dot product of u8 by s8 (VNNI vpdpbusd; AVX2 vpmaddubsw + vpmaddwd) followed by one float
// scaling per group. (A target may also take weights with a fixed offset as signed codes s = u + b / a
// against the activation codes biased to unsigned, q + 128, starting each group sum at -128 * sum(s): the
// same integer sums, with the correction computed once per weight super-block instead of read per
// activation row.) Weight rows are unpacked once per matmul row pass (or, with direct kernels, decoded into
// registers super-block by super-block) and then applied to every activation row of a window, so a verify
// window reads (and decodes) its weights once. Where b is a fixed multiple of a (Q4_0: -8a, Q6_K: -32a, Q8_0
// stored unsigned: -128a), a target may fold the offset term into the integer sums instead
// (ActSuper::offset_sums); results then differ from the unfolded form only in rounding, and every row class
// of a target uses the same form.
//
// Codes are stored interleaved so that each 4-byte lane of a vector holds four elements that share their
// scales (weight and activation), and the integer sums of the four quarter vectors add up lane by lane before
// any float work. Lane L of each quarter belongs to one lane group of 16 elements throughout (32 in block
// lanes). Three orders:
//  - group order, for K-quant weights and their per-256 activations (16-element scale groups): position
//    64 * q + 4 * g + i holds element 16 * g + 4 * q + i (g < 16 the group, q < 4 the quarter, i < 4);
//  - block order, for the legacy 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and their per-32
//    activations: position 64 * q + 8 * j + i holds element 32 * j + 8 * q + i (j < 8 the block, q < 4, i <
//    8), a transpose of 8-byte units. Lane 2j holds elements 32j + {0..3, 8..11, 16..19, 24..27}, lane 2j + 1
//    the other 16 of block j. This is the order a Q4_0 or Q8_0 block decodes to with the fewest shuffles:
//    quarter q is byte half q % 2 of each block's codes (Q4_0: low nibbles for q < 2, high ones after);
//  - block lanes, the AVX2 target's form of the legacy types, of Q4_K and Q5_K (QuantKernels::k4_block_lanes)
//    and of their per-32 activations (QuantKernels::block_lanes): position 32 * v + 4 * L + i holds element
//    32 * kLaneBlock[L] + 4 * v + i (v < 8 the vector, L < 8 the lane, i < 4): each 32-bit lane holds one
//    block throughout, so the eight vectors' integer sums of a block add up lane by lane (in 16 bits for
//    codes below 32) before one float scaling per block instead of two. Lane L's block is kLaneBlock[L] = 0,
//    1, 4, 5, 2, 3, 6, 7: the order one 32-bit shuffle per vector pair gives from block order. Lane group L
//    is block kLaneBlock[L]; groups 8 to 15 of the arrays are zero.
// And one order over a pair of supers (512 elements), lane pairs, the AVX-512 target's form of Q4_0, Q4_K and
// Q8_0 rows whose width is a multiple of 512 (WeightForm::kLanePairs) and of their activations
// (ActForm::kLanePairs): vector v < 8 of the pair (vectors 0..3 in the first super, 4..7 in the second) holds
// element 32 * b + 4 * v
// + i of the pair at position 64 * (v % 4) + 4 * b + i (b < 16 the block, i < 4), so that 32-bit lane b holds
// block b throughout and a block's eight vectors' integer sums add up lane by lane before one float scaling
// per block. Lane group b is block b, kept in the first super's arrays; the second super's are zero. And
// natural order, the AMX target's activations for Q4_0 and Q8_0 rows in row tiles (ActForm::kNatural,
// repack.h): element e at position e, so that block b's 32 codes are one contiguous row of a tile; lane group
// b < 8 is block b, groups 8..15 zero. The per-group arrays below (a, b, d, bs, offset_sums) are indexed by
// lane group in each order.
#pragma once

#include <cstdint>

#include "tandem/tensor/dtype.h"
#include "tandem/tensor/weight.h"

namespace tandem::kernels {

constexpr int64_t kSuper = 256;  // elements per super-block
constexpr int kLanes = 64;       // 4-element lanes per super-block
constexpr int kGroups = 16;      // 16-element groups per super-block

// 256 weights of one row, unpacked. For Q8_0 on targets without an unsigned-by-signed multiply that tolerates
// 255 (AVX2's vpmaddubsw saturates), u holds the signed codes instead and b is zero (`signed_codes`).
struct alignas(64) UnpackedSuper {
  uint8_t u[kSuper];  // codes, interleaved (block or group order)
  float a[kGroups];   // scale of each lane group
  float b[kGroups];   // offset of each lane group
};

// 256 activations of one row, quantized.
struct alignas(64) ActSuper {
  int8_t q[kSuper];    // codes in [-127, 127], interleaved (block or group order)
  uint8_t qb[kSuper];  // the same codes plus 128 (unsigned), for kernels that take the weights signed
  float d[kGroups];    // scale of each lane group (the scale of its 32- or 256-element block)
  float bs[kGroups];   // sum of the 16 codes of each lane group times its scale
  // Minus the sum of the 16 codes of each lane group times 2^3, 2^5 and 2^7 (fold_index): the integer offset
  // terms of weights stored as unsigned codes with a fixed offset of -8 (Q4_0), -32 (Q6_K) or -128 (Q8_0)
  // times their scale, ready to start a group sum.
  int32_t offset_sums[3][kGroups];
};

static_assert(sizeof(UnpackedSuper) == 384 && sizeof(ActSuper) == 832);

// Row of ActSuper::offset_sums for a weight offset of -2^fold (fold 3, 5 or 7).
constexpr int fold_index(int fold) {
  return (fold - 3) / 2;
}

enum class CodeOrder { kGroup, kBlock, kBlockLanes };

// How a matmul's activation rows are quantized: per-32 scales in the target's legacy order (block order or
// block lanes), per-256 scales in group order (K-quant weights), or per-32 scales in lane pairs (Q4_0, Q4_K
// and Q8_0 rows in their lane-pair form, on targets that read it: QuantKernels::lane_pairs).
// kNatural: per-32 scales in natural order (Q4_0 and Q8_0 rows in row tiles, on targets that read them:
// QuantKernels::row_tiles). kSuperLanes: the codes and per-256 scales of kSupers in the legacy order, with
// the sums of each 32-element block (Q4_K and Q5_K rows on targets that read them in block lanes:
// QuantKernels::k4_block_lanes).
enum class ActForm : uint8_t { kBlocks, kSupers, kLanePairs, kNatural, kSuperLanes };

// Super (0 or 1) and position in its codes of element e < 512 of a pair of supers in lane pairs.
constexpr int lane_pair_super(int e) {
  return (e % 32) / 16;
}
constexpr int lane_pair_position(int e) {
  return 64 * ((e % 16) / 4) + 4 * (e / 32) + e % 4;
}

// The block of lane L in block lanes (its own inverse: also the lane of block L).
constexpr int kLaneBlock[8] = {0, 1, 4, 5, 2, 3, 6, 7};

// Position in UnpackedSuper::u and ActSuper::q of element e of a super-block in the given order.
constexpr int code_position(int e, CodeOrder order) {
  switch (order) {
    case CodeOrder::kGroup:
      return 64 * ((e % 16) / 4) + 4 * (e / 16) + e % 4;
    case CodeOrder::kBlock:
      return 64 * ((e % 32) / 8) + 8 * (e / 32) + e % 8;
    default:
      return 32 * ((e % 32) / 4) + 4 * kLaneBlock[e / 32] + e % 4;
  }
}

// Lane group of element e of a super-block (the index of its scales and sums).
constexpr int code_group(int e, CodeOrder order) {
  switch (order) {
    case CodeOrder::kGroup:
      return e / 16;
    case CodeOrder::kBlock:
      return 2 * (e / 32) + (e % 8) / 4;
    default:
      return kLaneBlock[e / 32];
  }
}

// A Q4_K or Q5_K super-block unpacked in group order -> block lanes (QuantKernels::k4_block_lanes): the codes
// moved, block j's scale and offset (those of its groups 2j and 2j + 1) to lane group kLaneBlock[j], groups 8
// to 15 zero.
inline void k4_group_to_block_lanes(UnpackedSuper& s) {
  UnpackedSuper g = s;
  for (int e = 0; e < kSuper; ++e)
    s.u[code_position(e, CodeOrder::kBlockLanes)] = g.u[code_position(e, CodeOrder::kGroup)];
  for (int j = 0; j < 8; ++j) {
    s.a[kLaneBlock[j]] = g.a[2 * j];
    s.b[kLaneBlock[j]] = g.b[2 * j];
  }
  for (int l = 8; l < kGroups; ++l) s.a[l] = s.b[l] = 0.0f;
}

inline int64_t super_count(int64_t k) {
  return (k + kSuper - 1) / kSuper;
}

// Whether activations for this weight type take one scale per 256 elements (K-quants) rather than per 32.
// Per-32 activations and the weights they meet use block order, per-256 ones group order. (Q4_K rows in lane
// pairs meet per-32 activations in lane pairs instead, and Q4_K and Q5_K rows on targets with k4_block_lanes
// per-256 ones in block lanes: matmul's activation form.)
bool per_super_activations(DType t);

// Whether matmul takes the quantized path for this weight type (else the float path: F32, F16, BF16).
bool is_quantized_weight(DType t);

// How far ahead of their reads the direct kernels of decode and two-row windows prefetch the weights: the
// target's measured distance, or a longer one where the target has one (AVX-512: twice as far into L2 for one
// row of every type but Q8_0, and for two rows of Q4_0 and the types without a fixed offset). Which is faster
// changes with the machine's memory state, so a PrefetchTuner (prefetch_tuner.h) picks it by measuring
// forwards (kNear or kFar). The L1 forms, which the x86 kernel tables take on Intel cores (with_near_l1,
// intel_cpu), are those reaches with the tiles of decode and short windows taking their first prefetch into
// L1 6 KB ahead instead (quant_prefetch_avx512.h, quant_avx2_kernels.h). Results never depend on the reach.
enum class PrefetchReach : uint8_t { kNear, kFar, kNearL1, kFarL1 };
constexpr bool is_far(PrefetchReach r) {
  return r == PrefetchReach::kFar || r == PrefetchReach::kFarL1;
}
constexpr bool near_into_l1(PrefetchReach r) {
  return r == PrefetchReach::kNearL1 || r == PrefetchReach::kFarL1;
}
constexpr PrefetchReach with_near_l1(PrefetchReach r) {
  return is_far(r) ? PrefetchReach::kFarL1 : PrefetchReach::kNearL1;
}

// One SIMD target's quantized kernels. The unpack and activation quantization give bit-identical results on
// every target with the same code orders (integer work and exactly rounded scalar float operations; between
// block order and block lanes the codes and scales only move, and the per-block sums are the same integers);
// dot results differ between targets only in float summation order, and for one target never depend on how
// many rows are processed together.
struct QuantKernels {
  bool signed_q8;    // Q8_0 codes stay signed (see UnpackedSuper)
  bool block_lanes;  // the legacy types and per-32 activations in block lanes, not block order
  // Unpacks one weight row of k elements (k a multiple of the type's block size) into super_count(k) supers;
  // the tail of the last super is zero.
  // form: the file's or a repacked form of repack.h (WeightForm).
  void (*unpack_row)(DType type, WeightForm form, const uint8_t* row, int64_t k, bool signed_q8,
                     UnpackedSuper* out);
  // Quantizes one activation row of k floats into super_count(k) supers (tail zero): one scale per 32
  // elements, or with ActForm::kSupers one per 256 (for K-quant weights, as the reference's Q8_K); in lane
  // pairs, k is a multiple of 512.
  void (*quantize_row)(const float* x, int64_t k, ActForm form, ActSuper* out);
  // y[r * y_stride] = dot(w, x + r * x_stride) for r < n_rows: w and each x row span n_super supers.
  // `type` is the weight type the row was unpacked from (a target may fold its fixed offset into the integer
  // sums).
  void (*dot_rows)(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride,
                   int64_t n_rows, DType type, bool signed_codes, float* y, int64_t y_stride);
  // Direct kernels (optional): the dot products of n_out weight rows (row_bytes apart) straight from their
  // file bytes, each super-block decoded into registers and never stored, for windows of up to
  // direct_max_rows rows (0: no direct kernel for this type and k): y[r * y_stride + o] for o < n_out, r <
  // n_rows. Each result is bit-identical to unpack_row + dot_rows. reach: the prefetch distance of the
  // one- and two-row kernels (PrefetchReach).
  int64_t (*direct_max_rows)(DType type, WeightForm form, int64_t k, bool signed_q8);
  // The most rows one pass of the direct kernels should take (at most direct_max_rows): fewer where the
  // activations of more rows would not stay in the L1 cache beside the weights (wider windows then run in
  // passes of near-equal size, matmul.cpp).
  int64_t (*direct_pass_rows)(DType type, WeightForm form, int64_t k, bool signed_q8);
  void (*direct_rows)(DType type, WeightForm form, const uint8_t* w, int64_t row_bytes, int64_t n_out,
                      int64_t k, const ActSuper* x, int64_t x_stride, int64_t n_rows, float* y,
                      int64_t y_stride, PrefetchReach reach);
  // The throughput probe (peak.h): kDotProbeChains independent integer accumulators, each adding the
  // products of the 64 unsigned codes u (each below 64) with its own 64 signed codes s + 64 * c, `iterations`
  // times, with the multiply-add instructions of this target's dot kernels; sums[c] = iterations * sum(u *
  // s_c) modulo 2^32 (dot_probe_reference).
  void (*dot_probe)(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums);
  // Whether matmuls of more rows than direct_pass_rows (prefill) take the direct kernels too, in passes, or
  // the unpacked path.
  bool direct_prefill = true;
  // Whether the direct kernels read Q4_0, Q4_K and Q8_0 rows in their lane-pair form (WeightForm::kLanePairs)
  // against activations in lane pairs; other targets read such rows through the file form (unpack_row).
  bool lane_pairs = false;
  // Whether the direct kernels read Q4_0 and Q8_0 rows in row tiles (WeightForm::kRowTiles) against
  // activations in natural order; other targets read such rows through the file form.
  bool row_tiles = false;
  // Whether Q4_K and Q5_K rows are unpacked in block lanes (k4_group_to_block_lanes) and meet their per-256
  // activations in block lanes (ActForm::kSuperLanes) rather than in group order: the AVX2 targets, whose
  // kernels then take them as the legacy types with an offset (one 32-element block a lane).
  bool k4_block_lanes = false;
};

// Whether a target takes rows of this type in block lanes (QuantKernels::k4_block_lanes).
inline bool in_k4_block_lanes(const QuantKernels& qk, DType t) {
  return qk.k4_block_lanes && (t == DType::Q4_K || t == DType::Q5_K);
}

constexpr int kDotProbeChains = 16;

// For targets without direct kernels.
inline int64_t no_direct_rows(DType, WeightForm, int64_t, bool) {
  return 0;
}

// Kernels of one target (Target values from cpu_target.h; a target not compiled in gives the scalar kernels).
const QuantKernels& quant_kernels_scalar();
const QuantKernels& quant_kernels_avx2();
const QuantKernels& quant_kernels_avx2_vnni();
const QuantKernels& quant_kernels_avx512();
const QuantKernels& quant_kernels_avx512_vbmi();
const QuantKernels& quant_kernels_amx();
const QuantKernels& quant_kernels_neon();
const QuantKernels& quant_kernels_neon_dot();

}  // namespace tandem::kernels
