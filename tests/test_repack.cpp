// Weights repacked at load (kernels/repack.h): the repacked forms round-trip to the file bytes, every element
// lands where the header says, and a matmul over an interleaved matrix has the bits of the file form's on
// every target and row class (decode, windows, prefill chunks), over lane pairs the same within the
// float-order tolerance.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <utility>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/kernels/repack.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/quant.h"
#include "test_util.h"

namespace {

using namespace tandem;
using namespace tandem::kernels;
using tandem::testing::normal_floats;

std::vector<uint8_t> quantized_rows(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  const size_t rb = row_bytes(t, cols);
  std::vector<uint8_t> bytes(rb * static_cast<size_t>(rows));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t o = 0; o < rows; ++o) {
    for (auto& v : row) v = dist(rng);
    quantize_row(t, row.data(), bytes.data() + static_cast<size_t>(o) * rb, cols);
  }
  return bytes;
}

TEST(Repack, WholeSuperBlocksOfTheTypesWithARepackedForm) {
  EXPECT_TRUE(can_interleave(DType::Q4_0, 2048));
  EXPECT_TRUE(can_interleave(DType::Q8_0, 256));
  // The legacy types at any whole number of blocks from one super-block on (a partial last super-block keeps
  // the file's form), the K-quants at whole super-blocks only.
  EXPECT_TRUE(can_interleave(DType::Q4_0, 2080));
  EXPECT_TRUE(can_interleave(DType::Q5_0, 896));
  EXPECT_FALSE(can_interleave(DType::Q8_0, 224));   // under one super-block
  EXPECT_FALSE(can_interleave(DType::Q4_0, 2056));  // not whole blocks
  EXPECT_FALSE(can_interleave(DType::Q4_K, 2304 + 32));
  EXPECT_TRUE(can_interleave(DType::Q4_1, 2048));
  EXPECT_TRUE(can_interleave(DType::Q5_1, 896));
  EXPECT_FALSE(can_interleave(DType::Q4_1, 2056));
  EXPECT_TRUE(can_interleave(DType::Q4_K, 2048));
  EXPECT_TRUE(can_interleave(DType::Q6_K, 2048));
  EXPECT_TRUE(can_interleave(DType::Q3_K, 2048));
  EXPECT_TRUE(can_interleave(DType::Q5_K, 2048));
  EXPECT_TRUE(can_interleave(DType::Q2_K, 2048));
  EXPECT_TRUE(can_interleave(DType::Q5_0, 2048));
  EXPECT_TRUE(can_interleave(DType::Q5_1, 2048));
  EXPECT_FALSE(can_interleave(DType::F16, 2048));
  EXPECT_EQ(interleave_super_bytes(DType::Q3_K), sizeof(BlockQ3_K));
  EXPECT_EQ(interleave_super_bytes(DType::Q5_K), sizeof(BlockQ5_K));
  EXPECT_EQ(interleave_super_bytes(DType::Q4_0), 8 * sizeof(BlockQ4_0));
  EXPECT_EQ(interleave_super_bytes(DType::Q8_0), 8 * sizeof(BlockQ8_0));
  EXPECT_EQ(interleave_super_bytes(DType::Q5_0), 8 * sizeof(BlockQ5_0));
  EXPECT_EQ(interleave_super_bytes(DType::Q4_1), 8 * sizeof(BlockQ4_1));
  EXPECT_EQ(interleave_super_bytes(DType::Q5_1), 8 * sizeof(BlockQ5_1));
}

TEST(Repack, RoundTripsAndPlacesEveryByte) {
  for (DType t : {DType::Q4_0, DType::Q8_0}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const size_t sb = interleave_super_bytes(t), bb = sb / 8;
    // Distinct bytes, so a misplaced one shows.
    std::vector<uint8_t> file(3 * sb);
    for (size_t i = 0; i < file.size(); ++i) file[i] = static_cast<uint8_t>(i * 131 + 7);
    std::vector<uint8_t> packed = file;
    interleave_rows(t, 3 * 256, packed.data(), packed.size());
    for (size_t s = 0; s < 3; ++s) {
      const uint8_t* f = file.data() + s * sb;
      const uint8_t* p = packed.data() + s * sb;
      for (int j = 0; j < 8; ++j) {
        EXPECT_EQ(0, std::memcmp(p + 2 * j, f + j * bb, 2)) << "scale of block " << j;
        for (size_t i = 0; i + 2 < bb; ++i)
          EXPECT_EQ(p[16 + 64 * (i / 8) + 8 * static_cast<size_t>(j) + i % 8], f[j * bb + 2 + i])
              << "code byte " << i << " of block " << j;
      }
    }
    const MatrixView view{t, 1, 3 * 256, 3 * sb, packed.data(), WeightForm::kInterleaved};
    std::vector<uint8_t> back(file.size());
    file_form_row(view, 0, back.data());
    EXPECT_EQ(file, back);
  }
}

// Two super-blocks (one row of 512) of random bytes, and their interleaved form.
struct Packed {
  std::vector<uint8_t> file, packed;
};

Packed random_pair_packed(DType t, uint32_t seed) {
  Packed p{std::vector<uint8_t>(2 * interleave_super_bytes(t)), {}};
  std::mt19937 rng(seed);
  for (auto& b : p.file) b = static_cast<uint8_t>(rng());
  p.packed = p.file;
  interleave_rows(t, 512, p.packed.data(), p.packed.size());
  return p;
}

// file_form_row gives the file's bytes back.
void expect_round_trip(DType t, const Packed& p) {
  const MatrixView view{t, 1, 512, p.file.size(), p.packed.data(), WeightForm::kInterleaved};
  std::vector<uint8_t> back(p.file.size());
  file_form_row(view, 0, back.data());
  EXPECT_EQ(p.file, back);
}

// Q4_1, Q5_0 and Q5_1: every element's code (four low bits and the fifth) and every block's scale and minimum
// where the header says, and the way back.
template <typename Block, bool kMin, bool kFifth>
void expect_legacy_codes_where_documented(DType t) {
  SCOPED_TRACE(std::string(dtype_name(t)));
  const size_t bytes = interleave_super_bytes(t);
  const size_t plane = kMin ? 32 : 16, codes = kMin ? (kFifth ? 64 : 32) : 48;
  const Packed pk = random_pair_packed(t, 13);
  for (size_t s = 0; s < 2; ++s) {
    const uint8_t* f = pk.file.data() + s * bytes;
    const uint8_t* p = pk.packed.data() + s * bytes;
    for (int j = 0; j < 8; ++j) {
      const uint8_t* blk = f + static_cast<size_t>(j) * sizeof(Block);
      EXPECT_EQ(0, std::memcmp(p + 2 * j, blk + offsetof(Block, d), 2)) << "scale of block " << j;
      if constexpr (kMin) {
        EXPECT_EQ(0, std::memcmp(p + 16 + 2 * j, blk + offsetof(Block, m), 2)) << "minimum of block " << j;
      }
      for (int e = 0; e < 32; ++e) {
        int file_code = (blk[offsetof(Block, qs) + e % 16] >> (4 * (e / 16))) & 0xF;
        const int q = e / 8, pos = 8 * j + e % 8;
        int packed_code = (p[codes + 64 * (q % 2) + pos] >> (4 * (q / 2))) & 0xF;
        if constexpr (kFifth) {
          file_code |= ((blk[offsetof(Block, qh) + e / 8] >> (e % 8)) & 1) << 4;
          packed_code |= ((p[plane + pos % 32] >> (q + 4 * (pos / 32))) & 1) << 4;
        }
        EXPECT_EQ(file_code, packed_code) << "element " << e << " of block " << j;
      }
    }
  }
  expect_round_trip(t, pk);
}

TEST(Repack, LegacyCodesSitAtTheirDocumentedPositions) {
  expect_legacy_codes_where_documented<BlockQ4_1, true, false>(DType::Q4_1);
  expect_legacy_codes_where_documented<BlockQ5_0, false, true>(DType::Q5_0);
  expect_legacy_codes_where_documented<BlockQ5_1, true, true>(DType::Q5_1);
}

// Element e's code in a K-quant super-block of the file's form and of the interleaved one (as repack.h
// documents it), and the bytes that hold no codes.
int file_code(DType t, const uint8_t* b, int e) {
  if (t == DType::Q2_K) {
    const int h = e / 128, c = (e % 128) / 32, l = e % 32;
    return (b[offsetof(BlockQ2_K, qs) + 32 * h + l] >> (2 * c)) & 3;
  }
  if (t == DType::Q3_K) {
    const int h = e / 128, c = (e % 128) / 32, l = e % 32;
    return ((b[offsetof(BlockQ3_K, qs) + 32 * h + l] >> (2 * c)) & 3) |
           (((b[offsetof(BlockQ3_K, hmask) + l] >> (4 * h + c)) & 1) << 2);
  }
  if (t == DType::Q4_K || t == DType::Q5_K) {
    const size_t qs = t == DType::Q4_K ? offsetof(BlockQ4_K, qs) : offsetof(BlockQ5_K, qs);
    const int low = (b[qs + 32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 0xF;
    if (t == DType::Q4_K) return low;
    return low | (((b[offsetof(BlockQ5_K, qh) + e % 32] >> (e / 32)) & 1) << 4);
  }
  const int h = e / 128, c = (e % 128) / 32, l = e % 32;
  return ((b[64 * h + 32 * (c % 2) + l] >> (4 * (c / 2))) & 0xF) |
         (((b[offsetof(BlockQ6_K, qh) + 32 * h + l] >> (2 * c)) & 3) << 4);
}

int packed_code(DType t, const uint8_t* b, int e) {
  const int g = e / 16, q = (e % 16) / 4, i = e % 4;
  if (t == DType::Q2_K) return (b[offsetof(BlockQ2_K, qs) + 4 * g + i] >> (2 * q)) & 3;
  if (t == DType::Q3_K) {
    const int p = 4 * g + i;
    return ((b[32 + p] >> (2 * q)) & 3) | (((b[p % 32] >> (q + 4 * (p / 32))) & 1) << 2);
  }
  const size_t planes = t == DType::Q4_K ? offsetof(BlockQ4_K, qs) : t == DType::Q5_K ? 48 : 0;
  const int low = (b[planes + 64 * (q % 2) + 4 * g + i] >> (4 * (q / 2))) & 0xF;
  if (t == DType::Q4_K) return low;
  if (t == DType::Q5_K) {
    const int p = 4 * g + i;
    return low | (((b[16 + p % 32] >> (q + 4 * (p / 32))) & 1) << 4);
  }
  return low | (((b[offsetof(BlockQ6_K, qh) + 4 * g + i] >> (2 * q)) & 3) << 4);
}

std::pair<size_t, size_t> code_bytes(DType t) {
  if (t == DType::Q2_K) return {offsetof(BlockQ2_K, qs), offsetof(BlockQ2_K, d)};
  if (t == DType::Q3_K) return {0, offsetof(BlockQ3_K, scales)};
  if (t == DType::Q5_K) return {offsetof(BlockQ5_K, qh), sizeof(BlockQ5_K)};
  return t == DType::Q4_K ? std::pair<size_t, size_t>{offsetof(BlockQ4_K, qs), sizeof(BlockQ4_K)}
                          : std::pair<size_t, size_t>{0, offsetof(BlockQ6_K, scales)};
}

// The K-quants: every element's code where the header says, every other byte untouched, and the way back.
TEST(Repack, KQuantCodesSitAtTheirDocumentedPositions) {
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const size_t bytes = interleave_super_bytes(t);
    const auto [codes_begin, codes_end] = code_bytes(t);
    const Packed pk = random_pair_packed(t, 11);
    for (size_t s = 0; s < 2; ++s) {
      const uint8_t* f = pk.file.data() + s * bytes;
      const uint8_t* p = pk.packed.data() + s * bytes;
      for (size_t b = 0; b < bytes; ++b) {
        const bool code = b >= codes_begin && b < codes_end;
        EXPECT_TRUE(code || f[b] == p[b]) << "byte " << b;
      }
      for (int e = 0; e < 256; ++e) EXPECT_EQ(file_code(t, f, e), packed_code(t, p, e)) << "element " << e;
    }
    expect_round_trip(t, pk);
  }
}

TEST(Repack, MatmulIsBitIdenticalToTheFileFormOnEveryTarget) {
  ThreadPool pool(2);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    for (int64_t k : {256, 480, 896, 2048, 5632, 5664}) {
      if (!can_interleave(t, k)) continue;  // 480, 896, 5664: the legacy types' partial last super-blocks
      const int64_t n = 45;
      const std::vector<uint8_t> file = quantized_rows(t, n, k, 3);
      std::vector<uint8_t> packed = file;
      interleave_rows(t, k, packed.data(), packed.size());
      const size_t rb = row_bytes(t, k);
      const MatrixView a{t, n, k, rb, file.data()}, b{t, n, k, rb, packed.data(), WeightForm::kInterleaved};
      std::vector<uint8_t> back(rb);
      for (int64_t r : {int64_t{0}, n - 1}) {
        file_form_row(b, r, back.data());
        EXPECT_EQ(0, std::memcmp(back.data(), file.data() + static_cast<size_t>(r) * rb, rb)) << "row " << r;
      }
      const std::vector<float> x = normal_floats(70 * k, 5);
      for (Target target : runnable_targets()) {
        MatmulScratch scratch(pool.size(), k, 70, target);
        for (int64_t rows : {1, 2, 3, 5, 8, 9, 16, 70}) {
          SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(t)) +
                       " k=" + std::to_string(k) + " rows=" + std::to_string(rows));
          std::vector<float> ya(static_cast<size_t>(rows * n)), yb(ya.size());
          matmul(a, x.data(), rows, ya.data(), pool, scratch);
          matmul(b, x.data(), rows, yb.data(), pool, scratch);
          EXPECT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)));
        }
      }
      // The double-precision reference reads either form.
      std::vector<float> ra(static_cast<size_t>(2 * n)), rb2(ra.size());
      matmul_reference(a, x.data(), 2, ra.data());
      matmul_reference(b, x.data(), 2, rb2.data());
      EXPECT_EQ(ra, rb2);
    }
  }
}

// Where a pair in lane pairs of code_bytes codes keeps them and its 32-byte header, by its address
// (repack.h): codes first on a 64-byte boundary, the header first 32 bytes past one.
struct PairPlaces {
  bool codes_first;
  const uint8_t* header;
  const uint8_t* codes;
};
PairPlaces pair_places(const uint8_t* p, size_t code_bytes) {
  const bool codes_first = reinterpret_cast<uintptr_t>(p) % 64 < 32;
  return {codes_first, p + (codes_first ? code_bytes : 0), p + (codes_first ? 0 : 32)};
}

// Rows repacked into lane pairs or row tiles (packed) read back as the file's bytes, and matmuls of them on
// every runnable target (the others read the form through the file form) agree with those of the file form
// within the float-order tolerance, for each row count.
void expect_repacked_match_file_form(DType t, int64_t n, int64_t k, const std::vector<uint8_t>& file,
                                     const std::vector<uint8_t>& packed, WeightForm form,
                                     std::initializer_list<int64_t> row_counts, uint32_t seed) {
  const size_t rb = row_bytes(t, k);
  const MatrixView a{t, n, k, rb, file.data()}, b{t, n, k, rb, packed.data(), form};
  std::vector<uint8_t> back(rb);
  for (int64_t r = 0; r < n; ++r) {
    file_form_row(b, r, back.data());
    ASSERT_EQ(0, std::memcmp(back.data(), file.data() + static_cast<size_t>(r) * rb, rb)) << "row " << r;
  }
  std::vector<float> deq(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    dequantize_row(t, file.data() + static_cast<size_t>(r) * rb, deq.data() + r * k, k);
  const int64_t max_rows = std::max(row_counts);
  const std::vector<float> x = normal_floats(max_rows * k, seed);
  ThreadPool pool(2);
  for (Target target : runnable_targets()) {
    MatmulScratch scratch(pool.size(), k, max_rows, target);
    for (int64_t rows : row_counts) {
      SCOPED_TRACE(std::string(target_name(target)) + " rows=" + std::to_string(rows));
      std::vector<float> ya(static_cast<size_t>(rows * n)), yb(ya.size());
      matmul(a, x.data(), rows, ya.data(), pool, scratch);
      matmul(b, x.data(), rows, yb.data(), pool, scratch);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n; ++o) {
          double mag = 0;
          for (int64_t i = 0; i < k; ++i)
            mag += std::fabs(deq[static_cast<size_t>(o * k + i)] * x[r * k + i]);
          const size_t at = static_cast<size_t>(r * n + o);
          ASSERT_NEAR(ya[at], yb[at], 1e-5 * mag + 1e-6) << "r=" << r << " o=" << o;
        }
    }
  }
}

// Q4_0 in lane pairs: every byte where repack.h puts it, the rows back to the file's bytes, and a matmul over
// them, on every target and row class, within the float-order tolerance of the file form's (each block summed
// in one lane, not in two half-block lanes). The form is chosen only where the kernels read it directly.
TEST(Repack, LanePairsPlaceEveryByteAndMatchTheFileForm) {
  const DType t = DType::Q4_0;
  EXPECT_FALSE(can_lane_pair(t, 256));
  EXPECT_FALSE(can_lane_pair(t, 896));
  EXPECT_FALSE(can_lane_pair(DType::Q4_1, 2048));
  EXPECT_TRUE(can_lane_pair(t, 512));
  EXPECT_TRUE(can_lane_pair(t, 5632));
  const bool reads = quant_kernels(best_target()).lane_pairs;
  alignas(64) static const uint8_t page[64] = {};
  EXPECT_EQ(repack_form(t, 1, 2048, page) == WeightForm::kLanePairs, reads);
  EXPECT_EQ(repack_form(t, 1, 2048, page + 32) == WeightForm::kLanePairs, reads);
  EXPECT_NE(repack_form(t, 1, 2048, page + 16), WeightForm::kLanePairs);  // code vectors across cache lines
  EXPECT_NE(repack_form(t, 1, 896, page), WeightForm::kLanePairs);
  for (int64_t k : {512, 2048, 5632}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    const int64_t n = 45;
    const std::vector<uint8_t> file = quantized_rows(t, n, k, 7);
    std::vector<uint8_t> packed = file;
    repack_rows(WeightForm::kLanePairs, t, k, packed.data(), packed.size());
    size_t at_line = 0;  // pairs on a 64-byte boundary (codes first); the others put their scales first
    for (size_t pair = 0; pair < file.size() / kLanePairBytes; pair += 7) {
      const uint8_t* f = file.data() + pair * kLanePairBytes;
      const uint8_t* p = packed.data() + pair * kLanePairBytes;
      const auto [codes_first, scales, codes] = pair_places(p, 256);
      at_line += codes_first;
      for (size_t b = 0; b < 16; ++b) {
        const uint8_t* blk = f + b * sizeof(BlockQ4_0);
        EXPECT_EQ(0, std::memcmp(scales + 2 * b, blk, 2)) << "scale of block " << b;
        for (size_t j = 0; j < 16; ++j)
          EXPECT_EQ(codes[64 * (j / 4) + 4 * b + j % 4], blk[2 + j]) << "block " << b << " byte " << j;
      }
    }
    EXPECT_GT(at_line, 0u);  // pairs alternate between the two places (288 = 4.5 cache lines)
    EXPECT_LT(at_line, (file.size() / kLanePairBytes + 6) / 7);
    expect_repacked_match_file_form(t, n, k, file, packed, WeightForm::kLanePairs, {1, 2, 3, 5, 8, 9, 16, 70},
                                    5);
  }
}

// The form follows the target asked (the loader asks for the best one; bench_kernels for each target it
// compares), whatever this CPU runs: none for the scalar and NEON kernels, the interleaved form under AVX2
// for the types its kernels read repacked, lane pairs under AVX-512 where the window fits, row tiles under
// AMX.
TEST(Repack, TheFormFollowsTheTargetAsked) {
  alignas(64) static const uint8_t page[64] = {};
  const auto form = [](DType t, Target target) { return repack_form(t, 32, 2048, page, target); };
  for (Target none : {Target::kScalar, Target::kNEON, Target::kNEONDot})
    for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K})
      EXPECT_EQ(form(t, none), WeightForm::kFile);
  for (Target avx2 : {Target::kAVX2, Target::kAVX2VNNI}) {
    for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K})
      EXPECT_EQ(form(t, avx2), WeightForm::kInterleaved) << dtype_name(t);
    EXPECT_EQ(form(DType::Q4_1, avx2), WeightForm::kFile);
  }
  const WeightForm pairs =
      lane_pair_window_fits(DType::Q4_0, 2048) ? WeightForm::kLanePairs : WeightForm::kInterleaved;
  for (Target avx512 : {Target::kAVX512, Target::kAVX512VBMI}) {
    EXPECT_EQ(form(DType::Q4_0, avx512), pairs);
    EXPECT_EQ(form(DType::Q4_1, avx512), WeightForm::kInterleaved);
    EXPECT_EQ(form(DType::Q6_K, avx512), WeightForm::kInterleaved);
  }
  EXPECT_EQ(form(DType::Q4_0, Target::kAMX), WeightForm::kRowTiles);
  EXPECT_EQ(form(DType::Q8_0, Target::kAMX), WeightForm::kRowTiles);
  EXPECT_EQ(repack_form(DType::Q4_0, 45, 2048, page, Target::kAMX), pairs);  // no whole tiles of 16 rows
  for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q6_K})
    EXPECT_EQ(repack_form(t, 32, 2048, page), form(t, best_target()));
}

// Q4_0 and Q8_0 in row tiles: every byte where repack.h puts it, the rows back to the file's bytes, and
// matmuls over them on every target and row class (one row, windows, prefill passes), within the float-order
// tolerance of the file form's. The loader takes the form only where the kernels read it, for whole tiles of
// 16 rows.
TEST(Repack, RowTilesPlaceEveryByteAndMatchTheFileForm) {
  EXPECT_TRUE(can_row_tile(DType::Q4_0, 16, 32));
  EXPECT_TRUE(can_row_tile(DType::Q8_0, 5632, 2048));
  EXPECT_FALSE(can_row_tile(DType::Q4_0, 45, 2048));
  EXPECT_FALSE(can_row_tile(DType::Q4_1, 32, 2048));
  const bool reads = quant_kernels(best_target()).row_tiles;
  for (DType t : {DType::Q4_0, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(t));
    alignas(64) static const uint8_t page[64] = {};
    EXPECT_EQ(repack_form(t, 32, 2048, page) == WeightForm::kRowTiles, reads);
    EXPECT_EQ(repack_form(t, 32, 2048, page + 32) == WeightForm::kRowTiles, reads);
    EXPECT_NE(repack_form(t, 32, 2048, page + 16), WeightForm::kRowTiles);  // code vectors across lines
    EXPECT_NE(repack_form(t, 45, 2048, page), WeightForm::kRowTiles);
    const size_t code_bytes = t == DType::Q8_0 ? 32 : 16, block_bytes = row_tile_block_bytes(t);
    EXPECT_EQ(block_bytes, 16 * (2 + code_bytes));
    for (int64_t k : {288, 2048, 5632}) {
      SCOPED_TRACE("k=" + std::to_string(k));
      const int64_t n = 48, blocks = k / 32;
      const std::vector<uint8_t> file = quantized_rows(t, n, k, 8);
      std::vector<uint8_t> packed = file;
      repack_rows(WeightForm::kRowTiles, t, k, packed.data(), packed.size());
      const size_t rb = row_bytes(t, k);
      size_t at_line = 0;  // blocks on a 64-byte boundary (codes first); the others put their scales first
      for (int64_t tile = 0; tile < n / 16; ++tile)
        for (int64_t b = 0; b < blocks; b += 3) {
          const uint8_t* p = packed.data() + static_cast<size_t>(tile * 16) * rb + b * block_bytes;
          const auto [codes_first, scales, codes] = pair_places(p, 16 * code_bytes);
          at_line += codes_first;
          for (size_t r = 0; r < 16; ++r) {
            const uint8_t* blk = file.data() + (tile * 16 + r) * rb + b * (2 + code_bytes);
            EXPECT_EQ(0, std::memcmp(scales + 2 * r, blk, 2)) << "scale of row " << r << " block " << b;
            for (size_t j = 0; j < code_bytes; ++j)
              EXPECT_EQ(codes[64 * (j / 4) + 4 * r + j % 4], blk[2 + j]) << "row " << r << " block " << b;
          }
        }
      EXPECT_GT(at_line, 0u);  // blocks alternate between the two places (both sizes are 32 mod 64)
      EXPECT_LT(at_line, static_cast<size_t>(n / 16 * ((blocks + 2) / 3)));
      expect_repacked_match_file_form(t, n, k, file, packed, WeightForm::kRowTiles,
                                      {1, 2, 3, 4, 5, 8, 16, 17, 64, 70}, 9);
    }
  }
}

// Q4_K in lane pairs: d and dmin of both super-blocks, each block's 6-bit scale and minimum and each code
// where repack.h puts them, and the rows back to the file's bytes. (The kernels' results over this form:
// test_kernels' LanePairKernelsKeepTheirBitsAndMatchTheQuantizedProduct.)
TEST(Repack, Q4KLanePairsPlaceEveryByteAndRoundTrip) {
  const DType t = DType::Q4_K;
  EXPECT_FALSE(can_lane_pair(t, 256));
  EXPECT_FALSE(can_lane_pair(t, 768));
  EXPECT_TRUE(can_lane_pair(t, 512));
  EXPECT_TRUE(can_lane_pair(t, 5632));
  EXPECT_FALSE(can_lane_pair(DType::Q6_K, 2048));
  const bool reads = quant_kernels(best_target()).lane_pairs;
  alignas(64) static const uint8_t page[64] = {};
  EXPECT_EQ(repack_form(t, 1, 2048, page) == WeightForm::kLanePairs, reads);
  EXPECT_NE(repack_form(t, 1, 2048, page + 16), WeightForm::kLanePairs);
  for (int64_t k : {512, 5632}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    const int64_t n = 13;
    const std::vector<uint8_t> file = quantized_rows(t, n, k, 9);
    std::vector<uint8_t> packed = file;
    repack_rows(WeightForm::kLanePairs, t, k, packed.data(), packed.size());
    for (size_t pair = 0; pair < file.size() / kLanePairBytes; ++pair) {
      const uint8_t* p = packed.data() + pair * kLanePairBytes;
      const auto [codes_first, h, codes] = pair_places(p, 256);
      for (int s = 0; s < 2; ++s) {
        BlockQ4_K blk;
        std::memcpy(&blk, file.data() + pair * kLanePairBytes + s * sizeof(BlockQ4_K), sizeof(blk));
        EXPECT_EQ(0, std::memcmp(h + 4 * s, &blk.d, 2));
        EXPECT_EQ(0, std::memcmp(h + 4 * s + 2, &blk.dmin, 2));
        for (int j = 0; j < 8; ++j) {
          const int b = 8 * s + j, top = h[24 + j] >> (4 * s);
          const ScaleMin sm = k4_scale_min(blk.scales, j);
          ASSERT_EQ((h[8 + b] & 15) | (top & 3) << 4, sm.scale) << "pair " << pair << " block " << b;
          ASSERT_EQ((h[8 + b] >> 4) | (top >> 2 & 3) << 4, sm.min) << "pair " << pair << " block " << b;
          for (int e = 0; e < 32;
               ++e) {  // element 32j + e of super-block s: nibble j % 2 of qs[32 (j / 2) + e]
            const int want = (blk.qs[32 * (j / 2) + e] >> (4 * (j % 2))) & 15;
            const int byte = codes[64 * ((e % 16) / 4) + 4 * b + e % 4];
            ASSERT_EQ((byte >> (4 * (e / 16))) & 15, want) << "pair " << pair << " block " << b << " e " << e;
          }
        }
      }
    }
    const size_t rb = row_bytes(t, k);
    const MatrixView b{t, n, k, rb, packed.data(), WeightForm::kLanePairs};
    std::vector<uint8_t> back(rb);
    for (int64_t r = 0; r < n; ++r) {
      file_form_row(b, r, back.data());
      ASSERT_EQ(0, std::memcmp(back.data(), file.data() + static_cast<size_t>(r) * rb, rb)) << "row " << r;
    }
  }
}

// Q8_0 in lane pairs: each scale and each code (plus 128) where repack.h puts them, in both places a pair
// can lie (544 bytes: 8.5 cache lines), the rows back to the file's bytes, and matmuls of the repacked
// matrix on every runnable target (the others read it through the file form) near those of the file form.
TEST(Repack, Q8_0LanePairsPlaceEveryByteAndMatchTheFileForm) {
  const DType t = DType::Q8_0;
  EXPECT_FALSE(can_lane_pair(t, 256));
  EXPECT_FALSE(can_lane_pair(t, 800));
  EXPECT_TRUE(can_lane_pair(t, 512));
  EXPECT_TRUE(can_lane_pair(t, 5632));
  EXPECT_EQ(lane_pair_bytes(t), 16 * sizeof(BlockQ8_0));
  const bool reads = quant_kernels(best_target()).lane_pairs;
  alignas(64) static const uint8_t page[64] = {};
  EXPECT_EQ(repack_form(t, 1, 2048, page + 32) == WeightForm::kLanePairs,
            reads && lane_pair_window_fits(t, 2048));
  EXPECT_NE(repack_form(t, 1, 2048, page + 16), WeightForm::kLanePairs);
  EXPECT_TRUE(lane_pair_window_fits(DType::Q4_0, 1 << 20));
  EXPECT_FALSE(lane_pair_window_fits(t, 1 << 20));
  EXPECT_NE(repack_form(t, 1, 1 << 20, page), WeightForm::kLanePairs);  // windows' activations past the L1
  for (int64_t k : {512, 2048, 5632}) {
    SCOPED_TRACE("k=" + std::to_string(k));
    const int64_t n = 11;
    const std::vector<uint8_t> file = quantized_rows(t, n, k, 13);
    std::vector<uint8_t> packed = file;
    repack_rows(WeightForm::kLanePairs, t, k, packed.data(), packed.size());
    const size_t pair_bytes = lane_pair_bytes(t);
    size_t at_line = 0;
    for (size_t pair = 0; pair < file.size() / pair_bytes; ++pair) {
      const uint8_t* f = file.data() + pair * pair_bytes;
      const uint8_t* p = packed.data() + pair * pair_bytes;
      const auto [codes_first, scales, codes] = pair_places(p, 512);
      at_line += codes_first;
      for (int b = 0; b < 16; ++b) {
        const uint8_t* blk = f + b * sizeof(BlockQ8_0);
        ASSERT_EQ(0, std::memcmp(scales + 2 * b, blk, 2)) << "pair " << pair << " block " << b;
        for (int e = 0; e < 32; ++e)
          ASSERT_EQ(codes[64 * (e / 4) + 4 * b + e % 4], static_cast<uint8_t>(blk[2 + e] + 128))
              << "pair " << pair << " block " << b << " e " << e;
      }
    }
    EXPECT_GT(at_line, 0u);
    EXPECT_LT(at_line, file.size() / pair_bytes);
    expect_repacked_match_file_form(t, n, k, file, packed, WeightForm::kLanePairs, {1, 2, 4, 7, 8, 20}, 6);
  }
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The loader repacks every layer matrix (and an untied head) where the interleaved form pays on this CPU,
// in this process's private pages only: the file on disk keeps its bytes, whether the file is mapped or
// copied into memory. (The goldens check the repacked models' outputs.) Both ways give the same logits.
TEST(Repack, LoaderRepacksWhereItPaysAndNeverWritesTheFile) {
  for (const char* name : {"synth/synth-llama-d256-Q4_0.gguf", "synth/synth-llama-d256-Q8_0.gguf",
                           "synth/synth-llama-d256-Q4_K_M.gguf"}) {
    SCOPED_TRACE(name);
    const std::string path = tandem::testing::shared_path("models/" + std::string(name));
    const std::vector<char> before = file_bytes(path);
    ASSERT_FALSE(before.empty());
    std::vector<std::vector<float>> logits;
    for (const gguf::LoadMode mode : {gguf::LoadMode::kMap, gguf::LoadMode::kCopy}) {
      auto model = tandem::model::Model::load(path, mode);
      EXPECT_EQ(model->file().copied(), mode == gguf::LoadMode::kCopy);
      const auto& w = model->weights();
      std::vector<const MatrixView*> matrices;
      for (const auto& l : w.layers)
        for (const MatrixView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
          matrices.push_back(m);
      if (w.output.data != w.tok_embd.data) matrices.push_back(&w.output);  // a head of its own
      int repacked = 0;
      for (const MatrixView* m : matrices) {
        EXPECT_EQ(m->form, repack_form(m->type, m->rows, m->cols, m->data));
        repacked += m->form != WeightForm::kFile ? 1 : 0;
      }
      EXPECT_GT(repacked, 0);                         // each of these files has Q8_0, Q4_K or Q6_K matrices
      EXPECT_EQ(w.tok_embd.form, WeightForm::kFile);  // read row by row: keeps the file's form
      ThreadPool pool(2);
      model::Session session(*model, pool, model::SessionOptions{});
      const std::vector<int32_t> prompt = {1, 17, 300, 5, 42};
      const auto out = session.eval(prompt, /*all_logits=*/true);
      logits.emplace_back(out.begin(), out.end());
    }
    EXPECT_TRUE(logits[0] == logits[1]);
    EXPECT_TRUE(file_bytes(path) == before);
  }
}

}  // namespace
