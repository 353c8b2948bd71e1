// Weights repacked once at load into the kernels' interleaved form: the same bytes per super-block as the
// file, rearranged in place (no second copy) so that a super-block decodes into registers with a few loads
// and no gathering or permuting. Only the matmul kernels read a repacked matrix (MatrixView::form); each
// result of the interleaved forms is bit-identical to the file form's (lane pairs sum each block in one lane,
// so their results differ from it in rounding, and Q4_K's also meet activations with one scale per 32
// elements rather than per 256).
//
// Per super-block. Rows of the K-quants are whole super-blocks (cols % 256 == 0); those of the legacy types
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) may end in a partial super-block (any whole number of 32-element blocks from
// 256 on): of n < 8 blocks, in the same bytes as in the file, laid out as the repacked super-block that has
// those blocks and zero ones after them, cut short: its n scales (2n bytes), for Q4_1 and Q5_1 its n
// minimums (2n bytes), then the first 8n bytes of each 64-byte code plane in order, then for Q5_0 and Q5_1
// the fifth bits of positions 0..8n-1 (4n bytes, position p at bit 4 (p % 2) + q of byte p / 2 for quarter
// q), so that masked loads read it as that super-block (expand_tail).
//   Q4_0 (144 bytes)
//     [0, 16)    the 8 f16 scales, block j at 2j
//     [16, 80)   code bytes 0..7 of block j at 16 + 8j: quarters 0 (low nibbles) and 2 (high) of block order
//                (quant_layout.h)
//     [80, 144)  code bytes 8..15 of block j at 80 + 8j: quarters 1 and 3
//   Q4_1 (160 bytes)
//     [0, 16)    the 8 f16 scales
//     [16, 32)   the 8 f16 minimums, block j at 16 + 2j
//     [32, 160)  the code bytes as Q4_0's [16, 144)
//   Q5_0 (176 bytes)
//     [0, 16)    the 8 f16 scales
//     [16, 48)   the fifth bits: that of quarter q of position p = 8j + i (element 32j + 8q + i, block order)
//                at bit q + 4 (p / 32) of byte 16 + p % 32 (as Q5_K's plane)
//     [48, 176)  the code bytes' nibbles as Q4_0's [16, 144)
//   Q5_1 (192 bytes)
//     [0, 32)    the scales and minimums as Q4_1's
//     [32, 64)   the fifth bits as Q5_0's [16, 48)
//     [64, 192)  the code bytes as Q4_0's [16, 144)
//   Q8_0 (272 bytes)
//     [0, 16)    the 8 f16 scales
//     [16, 272)  quarter q (codes 8q..8q+7 of block j, signed as in the file) at 16 + 64q + 8j
//   Q2_K (84 bytes)
//     [0, 16)    the scales, as in the file
//     [16, 80)   the codes: those of quarter q of position p = 4g + i (element 16g + 4q + i) at bits 2q,
//                2q + 1 of byte 16 + p
//     [80, 84)   d and dmin, as in the file
//   Q3_K (110 bytes)
//     [0, 32)    the third bits: that of quarter q of position p = 4g + i (element 16g + 4q + i) at bit
//                q + 4 (p / 32) of byte p % 32
//     [32, 96)   the low two bits: those of quarter q of position p at bits 2q, 2q + 1 of byte 32 + p
//     [96, 110)  the scales and d, as in the file
//   Q4_K (144 bytes)
//     [0, 16)    d, dmin and the packed scales, as in the file
//     [16, 144)  two planes of 64 bytes, A then B, in group order (quant_layout.h): byte 4g + i of A holds
//                quarter 0 of group g (element 16g + i) in its low nibble and quarter 2 (element 16g + 8 + i)
//                in its high one; B holds quarters 1 and 3 the same way
//   Q5_K (176 bytes)
//     [0, 16)    d, dmin and the packed scales, as in the file
//     [16, 48)   the fifth bits: that of quarter q of position p = 4g + i at bit q + 4 (p / 32) of byte
//                16 + p % 32
//     [48, 176)  the low 4 bits in two planes, as Q4_K's codes
//   Q6_K (210 bytes)
//     [0, 128)   the low 4 bits in two planes, as Q4_K's codes
//     [128, 192) the high 2 bits: byte 4g + i holds those of quarter q of group g (element 16g + 4q + i) at
//                bits 2q and 2q + 1
//     [192, 210) the scales and d, as in the file
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/kernels/cpu_target.h"
#include "tandem/tensor/weight.h"

namespace tandem::kernels {

// Q4_0, Q4_K and Q8_0 in lane pairs (WeightForm::kLanePairs; quant_layout.h), per pair of super-blocks (as
// many bytes as in the file: 288 for Q4_0 and Q4_K, 544 for Q8_0): a 32-byte header and the code vectors, 64
// bytes each, lane b (bytes 4b..4b+3) of each holding four codes of block b (b < 8: block b of the first
// super-block; the others of the second).
//   Q4_0, Q4_K: four code vectors, bytes 4v..4v+3 of block b at 64v + 4b, whose low nibbles are elements
//         4v..4v+3 of the 32-element block and the high ones elements 16 + 4v..16 + 4v + 3.
//   Q8_0: eight code vectors, elements 4v..4v+3 of block b at 64v + 4b, each code plus 128 (unsigned).
// The header:
//   Q4_0, Q8_0: the 16 f16 scales, block b at 2b.
//   Q4_K: [0, 8) the f16 d and dmin of the first super-block, then of the second; [8, 24) byte b: the low 4
//         bits of block b's 6-bit scale (low nibble) and minimum (high nibble); [24, 32) byte j: the top two
//         bits of block j's scale at bits 0-1 and minimum at 2-3, those of block j + 8 at 4-5 and 6-7.
// Where they lie depends on the pair's address, so that each code vector is one aligned 64-byte load wherever
// the matrix starts on 32 bytes (pairs alternate between the two cases; every pair size is 32 mod 64):
//     pair 32 bytes past a 64-byte boundary: [0, 32) the header, then the codes
//     pair on a 64-byte boundary:            the codes, then the header
// So a repacked matrix is read at the address it was repacked at (the loader repacks in place). Rows are
// whole pairs (cols % 512 == 0).
constexpr size_t kLanePairBytes = 16 * 18;     // Q4_0, Q4_K
constexpr size_t kMaxLanePairBytes = 16 * 34;  // Q8_0
constexpr size_t lane_pair_bytes(DType type) {
  return type == DType::Q8_0 ? kMaxLanePairBytes : kLanePairBytes;
}
inline size_t lane_pair_codes_offset(const uint8_t* pair) {
  return reinterpret_cast<uintptr_t>(pair) & 32;
}
inline size_t lane_pair_scales_offset(DType type, const uint8_t* pair) {
  return lane_pair_codes_offset(pair) != 0 ? 0 : lane_pair_bytes(type) - 32;
}
bool can_lane_pair(DType type, int64_t cols);
// Whether the loader takes lane pairs for such rows (repack_form): Q8_0 only where the activations of a
// window of 8 rows in lane pairs fill at most 3/4 of the L1 data cache (2048 columns on a 32 KiB L1). Wider
// rows keep the interleaved form, whose windows there take three weight rows a tile (pair_width): Q8_0's FFN
// down projection (5632 columns) in lane pairs took much longer in windows and no less at one and two rows
// (performance.md, lane pairs).
bool lane_pair_window_fits(DType type, int64_t cols);
// One pair of `type`: two super-blocks in the file's form -> lane pairs at out, and back from lane pairs at
// in (in != out).
void lane_pair_from_file(DType type, const uint8_t* in, uint8_t* out);
void lane_pair_to_file(DType type, const uint8_t* in, uint8_t* out);

// Q4_0 and Q8_0 in row tiles (WeightForm::kRowTiles), the AMX target's form: per tile of 16 consecutive
// rows (16 x row_bytes bytes, in row order) and per 32-element block b of those rows, in block order, as many
// bytes as in the file (row_tile_block_bytes: 288 for Q4_0, 544 for Q8_0): a 32-byte header of the 16 rows'
// f16 scales, row n at 2n, and the code vectors, 64 bytes each, vector v's bytes 4n..4n+3 holding row n's
// file code bytes 4v..4v+3:
//   Q4_0: four vectors, whose low nibbles are elements 4v..4v+3 and high ones 16 + 4v..16 + 4v + 3;
//   Q8_0: eight vectors, elements 4v..4v+3 (signed codes, as in the file).
// A vector (Q4_0: its low or its high nibbles) is then one row of a tile in the layout the AMX multiply-adds
// take (four consecutive elements of each of 16 columns), and each lane is four elements of one output row.
// As lane pairs, the header comes first in a block 32 bytes past a 64-byte boundary and last in one on a
// boundary (every block is 32 mod 64 bytes), so that each code vector is one aligned load wherever the matrix
// starts on 32 bytes. Rows are whole tiles (rows % 16 == 0).
constexpr int64_t kTileRows = 16;
// (Inline: the kernels find each block's scales through it, and a call there cost a register spill and a
// vzeroupper every other block.)
constexpr size_t row_tile_block_bytes(DType type) {
  return kTileRows * (type == DType::Q8_0 ? 34 : 18);
}
inline size_t row_tile_codes_offset(const uint8_t* block) {
  return reinterpret_cast<uintptr_t>(block) & 32;
}
inline size_t row_tile_scales_offset(DType type, const uint8_t* block) {
  return row_tile_codes_offset(block) != 0 ? 0 : row_tile_block_bytes(type) - 32;
}
bool can_row_tile(DType type, int64_t rows, int64_t cols);
// One tile of 16 rows of `cols` elements: the file's form (16 rows end to end) at in -> row tiles at out,
// and back (in != out).
void row_tile_from_file(DType type, int64_t cols, const uint8_t* in, uint8_t* out);
void row_tile_to_file(DType type, int64_t cols, const uint8_t* in, uint8_t* out);
// Row n < 16 of the tile at `tile` in the file's form (out [row bytes]).
void row_tile_row_to_file(DType type, int64_t cols, const uint8_t* tile, int n, uint8_t* out);

// Whether a matrix of this type and width has an interleaved form.
bool can_interleave(DType type, int64_t cols);
// Whether the loader repacks such a matrix for the kernels of `target` (by default the best this CPU runs,
// which the loader takes): never for the scalar and NEON kernels (they would read the repacked form through
// the file's, super-block by super-block); every type with a form under AVX-512, and under AVX2 every type
// but Q4_1, Q5_0 and Q5_1 and rows with a partial last super-block, which its kernels would read through the
// file form. (Q4_0 under AVX-512 kept the file form while weights were read from a file mapping, where one
// row measured slower repacked; with the weights copied into 2 MB pages (gguf/mapped_file.h) decode and
// windows take less time repacked, under AVX2 too; performance.md, repacked forms.)
// Lane pairs take the place of the interleaved form for Q4_0, Q4_K and Q8_0 rows that have them
// (can_lane_pair, lane_pair_window_fits) under AVX-512, where the matrix starts on 32 bytes (repack_form).
bool repack_pays(DType type, int64_t cols, Target target = best_target());
// The form the loader repacks a matrix of this type and shape, starting at data, into for the kernels of
// `target` (by default this CPU's best; kFile: none). Row tiles take the place of every other form for Q4_0
// and Q8_0 where the AMX target runs (can_row_tile, the matrix on 32 bytes).
WeightForm repack_form(DType type, int64_t rows, int64_t cols, const uint8_t* data,
                       Target target = best_target());
// Bytes of one super-block of `type` (84 to 272).
size_t interleave_super_bytes(DType type);

// One super-block, file form -> interleaved form and back (in != out).
void interleave_super(DType type, const uint8_t* in, uint8_t* out);
void deinterleave_super(DType type, const uint8_t* in, uint8_t* out);
// A repacked row's partial last super-block of `blocks` blocks -> the whole repacked super-block with zero
// blocks after them (out [interleave_super_bytes(type)]).
void expand_tail(DType type, int blocks, const uint8_t* tail, uint8_t* out);

// Every whole super-block of the `bytes` bytes at data (whole rows of `cols` elements), in place.
void interleave_rows(DType type, int64_t cols, uint8_t* data, size_t bytes);
// The same into any repacked form (kInterleaved: interleave_rows; kLanePairs: every pair; kRowTiles: every
// tile of 16 rows).
void repack_rows(WeightForm form, DType type, int64_t cols, uint8_t* data, size_t bytes);
// One row of a matrix (in any form) in the file's form: out [w.row_bytes].
void file_form_row(const MatrixView& w, int64_t r, uint8_t* out);

}  // namespace tandem::kernels
