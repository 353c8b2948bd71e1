// Matmul kernels against their scalar references, on every SIMD target this machine runs, with odd sizes and
// misaligned rows. Tolerances:
//   - weight unpacking and activation quantization: bit-identical on every target;
//   - a target's quantized matmul vs the scalar target: |dy| <= 1e-5 * sum_k |w_k x_k| + 1e-6 (float order
//   only);
//   - quantized matmul vs the double-precision reference on dequantized weights: the activation rounding
//   bound
//     sum_k |w_k| * (s_k / 2 + 2^-10 |x_k|) + 1e-5 * sum_k |w_k x_k|, s_k the scale of x_k's activation
//     block;
//   - float weights (F32/F16/BF16, Highway, every compiled target): |dy| <= 1e-5 * sum_k |w_k x_k| + 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "tandem/kernels/float_gemm.h"
#include "tandem/kernels/float_kernels.h"
#include "tandem/kernels/matmul.h"
#include "tandem/kernels/peak.h"
#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/repack.h"
#include "tandem/kernels/stream.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"
#include "tandem/tensor/quant.h"
#include "test_util.h"

namespace {

using namespace tandem;
using namespace tandem::kernels;

// Every prefetch reach (the tuner's two and their L1 forms): results never depend on it.
const PrefetchReach kAllReaches[] = {PrefetchReach::kNear, PrefetchReach::kFar, PrefetchReach::kNearL1,
                                     PrefetchReach::kFarL1};

const DType kQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                             DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// The activation form of a weight type in its file form (per-32 or per-256 scales).
ActForm act_form_of(DType t) {
  return per_super_activations(t) ? ActForm::kSupers : ActForm::kBlocks;
}

// The activation form a target's rows of this type meet.
ActForm act_form_on(const QuantKernels& qk, DType t) {
  return in_k4_block_lanes(qk, t) ? ActForm::kSuperLanes : act_form_of(t);
}

// Bytes past an aligned address at which test matrices start: misaligned for every vector width, but at the
// alignment the loader guarantees for the type's data (4 for F32, 2 for the block types, F16 and BF16).
size_t misalign(DType t) {
  return t == DType::F32 ? 4 : 2;
}

// A weight matrix stored misalign(t) bytes past an aligned address, so rows are misaligned.
struct TestMatrix {
  std::vector<uint8_t> storage;
  MatrixView view;
  std::vector<float> dequant;  // [rows, cols]
};

// A Q8_0 row's codes at the ends of the byte range: every 7th code -128 (the reference's quantizer never
// writes it, but a file may hold it) and every 11th 127, so that each target's handling of the signed codes
// (the sign trick, or a bias to unsigned) meets both.
void with_extreme_q8_codes(uint8_t* row, int64_t cols) {
  for (int64_t b = 0; b < cols / 32; ++b)
    for (int i = 0; i < 32; ++i) {
      int8_t* code = reinterpret_cast<int8_t*>(row + b * sizeof(BlockQ8_0) + 2 + i);
      if ((b * 32 + i) % 7 == 0) *code = -128;
      if ((b * 32 + i) % 11 == 0) *code = 127;
    }
}

TestMatrix make_matrix(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  TestMatrix m;
  const size_t rb = row_bytes(t, cols);
  const size_t skip = misalign(t);
  m.storage.resize(rb * static_cast<size_t>(rows) + skip);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  m.dequant.resize(static_cast<size_t>(rows * cols));
  for (int64_t o = 0; o < rows; ++o) {
    for (auto& v : row) v = dist(rng);
    quantize_row(t, row.data(), m.storage.data() + skip + static_cast<size_t>(o) * rb, cols);
    if (t == DType::Q8_0) with_extreme_q8_codes(m.storage.data() + skip + static_cast<size_t>(o) * rb, cols);
    dequantize_row(t, m.storage.data() + skip + static_cast<size_t>(o) * rb, m.dequant.data() + o * cols,
                   cols);
  }
  m.view = {t, rows, cols, rb, m.storage.data() + skip};
  return m;
}

// Activations with outliers, stored one float past the start of the buffer.
std::vector<float> make_activations(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(rows * cols + 1));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  for (size_t i = 1; i < x.size(); i += 97) x[i] *= 20.0f;
  return x;
}

std::vector<int64_t> sizes_for(DType t) {
  if (traits(t).block_size == 256) return {256, 768, 2304};
  return {32, 96, 288, 512, 2080};
}

bool is_legacy(DType t) {
  return traits(t).block_size == 32;
}

// The scalar target's block-order forms moved into block lanes (quant_layout.h), for targets that take the
// legacy types so (QuantKernels::block_lanes): the codes move, each block's scales and offsets move to its
// lane, and the activation sums are those of the block's two groups (its integer code sums from the exact
// offset sums), scaled once.
void to_block_lanes(UnpackedSuper& s) {
  UnpackedSuper t = s;
  for (int e = 0; e < kSuper; ++e)
    t.u[code_position(e, CodeOrder::kBlockLanes)] = s.u[code_position(e, CodeOrder::kBlock)];
  for (int g = 0; g < kGroups; ++g) {
    t.a[g] = g < 8 ? s.a[2 * kLaneBlock[g]] : 0.0f;
    t.b[g] = g < 8 ? s.b[2 * kLaneBlock[g]] : 0.0f;
  }
  s = t;
}

void to_block_lanes(ActSuper& s) {
  ActSuper t = s;
  for (int e = 0; e < kSuper; ++e) {
    t.q[code_position(e, CodeOrder::kBlockLanes)] = s.q[code_position(e, CodeOrder::kBlock)];
    t.qb[code_position(e, CodeOrder::kBlockLanes)] = s.qb[code_position(e, CodeOrder::kBlock)];
  }
  for (int g = 0; g < kGroups; ++g) {
    const int j = g < 8 ? kLaneBlock[g] : 0;
    const int32_t sum = g < 8 ? -(s.offset_sums[0][2 * j] + s.offset_sums[0][2 * j + 1]) / 8 : 0;
    t.d[g] = g < 8 ? s.d[2 * j] : 0.0f;
    t.bs[g] = static_cast<float>(sum) * t.d[g];
    for (int f = 0; f < 3; ++f) t.offset_sums[f][g] = -(sum * (8 << (2 * f)));
  }
  s = t;
}

// The per-32 activation supers of a row of k elements in the target's order: all of them, or with per_super
// only a partial last one.
void legacy_act_to_target(const QuantKernels& qk, int64_t k, ActForm form, std::vector<ActSuper>& a) {
  const bool per_super = form == ActForm::kSupers;
  if (!qk.block_lanes || form == ActForm::kLanePairs) return;  // lane pairs: the same on every target
  for (int64_t i = per_super ? k / kSuper : 0; i < super_count(k); ++i)
    to_block_lanes(a[static_cast<size_t>(i)]);
}

TEST(Kernels, UnpackAndActivationQuantizationAreBitIdenticalOnEveryTarget) {
  const QuantKernels& ref = quant_kernels(Target::kScalar);
  for (Target target : runnable_targets()) {
    const QuantKernels& qk = quant_kernels(target);
    for (DType t : kQuantTypes) {
      for (int64_t k : sizes_for(t)) {
        SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(t)) +
                     " k=" + std::to_string(k));
        const TestMatrix m = make_matrix(t, 3, k, 7);
        const size_t ns = static_cast<size_t>(super_count(k));
        std::vector<UnpackedSuper> a(ns), b(ns);
        for (int64_t o = 0; o < 3; ++o) {
          std::memset(static_cast<void*>(a.data()), 0xAB, ns * sizeof(UnpackedSuper));
          ref.unpack_row(t, WeightForm::kFile, m.view.row(o), k, qk.signed_q8, a.data());
          qk.unpack_row(t, WeightForm::kFile, m.view.row(o), k, qk.signed_q8, b.data());
          if (qk.block_lanes && is_legacy(t))
            for (UnpackedSuper& us : a) to_block_lanes(us);
          if (in_k4_block_lanes(qk, t))
            for (UnpackedSuper& us : a) k4_group_to_block_lanes(us);
          EXPECT_EQ(0, std::memcmp(a.data(), b.data(), ns * sizeof(UnpackedSuper)));
        }
        const auto x = make_activations(2, k, 9);
        std::vector<ActSuper> xa(ns), xb(ns);
        for (ActForm form : {ActForm::kBlocks, ActForm::kSupers, ActForm::kLanePairs, ActForm::kSuperLanes}) {
          if (((form == ActForm::kSupers || form == ActForm::kSuperLanes) && k % 256 != 0) ||
              (form == ActForm::kLanePairs && k % 512 != 0))
            continue;
          ref.quantize_row(x.data() + 1, k, form, xa.data());
          qk.quantize_row(x.data() + 1, k, form, xb.data());
          legacy_act_to_target(qk, k, form, xa);
          EXPECT_EQ(0, std::memcmp(xa.data(), xb.data(), ns * sizeof(ActSuper))) << static_cast<int>(form);
        }
      }
    }
  }
}

// K-quant super-blocks of random bytes, with only the f16 scale fields kept finite (any sign, subnormals and
// zeros included): unlike quantizer output, this reaches every code, every packed 6-bit scale and min
// (including the high bits of blocks 4..7), and negative Q6_K scales. Rows are misaligned, and each row holds
// several super-blocks, so a vectorized unpacker that mixes up blocks or super-blocks shows.
// Every element lands where quant_layout.h says: codes chosen to equal their values (integers with 127 in
// each block, so the Q8_0 scale and the per-32 activation scale are exactly 1 and the per-256 one exactly
// -1).
TEST(Kernels, CodesSitAtTheirDocumentedPositions) {
  constexpr int64_t k = 512;
  std::vector<float> x(k);
  for (int64_t e = 0; e < k; ++e)
    x[static_cast<size_t>(e)] = e % 32 == 5 ? 127.0f : static_cast<float>((e * 37) % 251 - 125);
  std::vector<uint8_t> row(row_bytes(DType::Q8_0, k));
  quantize_row(DType::Q8_0, x.data(), row.data(), k);
  for (Target target : runnable_targets()) {
    SCOPED_TRACE(target_name(target));
    const QuantKernels& qk = quant_kernels(target);
    std::vector<UnpackedSuper> w(2);
    std::vector<ActSuper> a(2), b(2), c(2);
    qk.unpack_row(DType::Q8_0, WeightForm::kFile, row.data(), k, qk.signed_q8, w.data());
    qk.quantize_row(x.data(), k, ActForm::kBlocks, a.data());
    qk.quantize_row(x.data(), k, ActForm::kSupers, b.data());
    qk.quantize_row(x.data(), k, ActForm::kLanePairs, c.data());
    int32_t block_sums[2][kGroups] = {}, group_sums[2][kGroups] = {}, pair_sums[kGroups] = {};
    for (int64_t e = 0; e < k; ++e) {
      const UnpackedSuper& ws = w[static_cast<size_t>(e / kSuper)];
      const int i = static_cast<int>(e % kSuper), code = static_cast<int>(x[static_cast<size_t>(e)]);
      const CodeOrder legacy = qk.block_lanes ? CodeOrder::kBlockLanes : CodeOrder::kBlock;
      const int pb = code_position(i, legacy), pg = code_position(i, CodeOrder::kGroup);
      ASSERT_EQ(ws.u[pb], static_cast<uint8_t>(qk.signed_q8 ? code : code + 128)) << e;
      ASSERT_EQ(ws.a[code_group(i, legacy)], 1.0f) << e;
      ASSERT_EQ(a[static_cast<size_t>(e / kSuper)].q[pb], code) << e;
      ASSERT_EQ(a[static_cast<size_t>(e / kSuper)].qb[pb], code + 128) << e;  // biased codes
      ASSERT_EQ(b[static_cast<size_t>(e / kSuper)].q[pg], -code) << e;
      ASSERT_EQ(b[static_cast<size_t>(e / kSuper)].qb[pg], 128 - code) << e;
      const int pe = static_cast<int>(e);
      ASSERT_EQ(c[static_cast<size_t>(lane_pair_super(pe))].q[lane_pair_position(pe)], code) << e;
      ASSERT_EQ(c[static_cast<size_t>(lane_pair_super(pe))].qb[lane_pair_position(pe)], code + 128) << e;
      pair_sums[e / 32] += code;
      block_sums[e / kSuper][code_group(i, legacy)] += code;
      group_sums[e / kSuper][code_group(i, CodeOrder::kGroup)] -= code;
    }
    for (int s = 0; s < 2; ++s)
      for (int g = 0; g < kGroups; ++g) {
        EXPECT_EQ(a[static_cast<size_t>(s)].bs[g], static_cast<float>(block_sums[s][g]));
        EXPECT_EQ(a[static_cast<size_t>(s)].offset_sums[0][g], -8 * block_sums[s][g]);
        EXPECT_EQ(b[static_cast<size_t>(s)].bs[g], static_cast<float>(group_sums[s][g]) * -1.0f);
      }
    for (int g = 0; g < kGroups; ++g) {  // lane pairs: block g's scale and sums in the first super only
      EXPECT_EQ(c[0].d[g], 1.0f);
      EXPECT_EQ(c[0].bs[g], static_cast<float>(pair_sums[g]));
      EXPECT_EQ(c[0].offset_sums[0][g], -8 * pair_sums[g]);
      EXPECT_EQ(c[1].d[g], 0.0f);
      EXPECT_EQ(c[1].offset_sums[0][g], 0);
    }
  }
}

TEST(Kernels, KQuantUnpackIsBitIdenticalOnRandomBlocks) {
  struct Layout {
    DType type;
    size_t block_bytes;
    std::vector<size_t> half_offsets;  // f16 fields of each block
  };
  const Layout layouts[] = {
      {DType::Q2_K, sizeof(BlockQ2_K), {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}},
      {DType::Q3_K, sizeof(BlockQ3_K), {offsetof(BlockQ3_K, d)}},
      {DType::Q4_K, sizeof(BlockQ4_K), {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}},
      {DType::Q5_K, sizeof(BlockQ5_K), {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}},
      {DType::Q6_K, sizeof(BlockQ6_K), {offsetof(BlockQ6_K, d)}},
  };
  const QuantKernels& ref = quant_kernels(Target::kScalar);
  std::mt19937 rng(23);
  for (const Layout& l : layouts) {
    for (int64_t k : {256, 768, 2304}) {
      const int64_t rows = 8, ns = k / 256;
      const size_t rb = row_bytes(l.type, k);
      ASSERT_EQ(rb, l.block_bytes * static_cast<size_t>(ns));
      std::vector<uint8_t> storage(rb * static_cast<size_t>(rows) + misalign(l.type));
      for (auto& v : storage) v = static_cast<uint8_t>(rng());
      uint8_t* base = storage.data() + misalign(l.type);
      for (int64_t b = 0; b < rows * ns; ++b)
        for (size_t off : l.half_offsets) {
          // Exponent field 0..30: zero, subnormal or normal, never infinity or NaN.
          const uint16_t h =
              static_cast<uint16_t>((rng() & 0x8000u) | ((rng() % 31u) << 10) | (rng() & 0x3FFu));
          std::memcpy(base + static_cast<size_t>(b) * l.block_bytes + off, &h, 2);
        }
      std::vector<UnpackedSuper> a(static_cast<size_t>(ns)), got(static_cast<size_t>(ns));
      for (Target target : runnable_targets()) {
        const QuantKernels& qk = quant_kernels(target);
        for (int64_t r = 0; r < rows; ++r) {
          SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(l.type)) +
                       " k=" + std::to_string(k) + " row=" + std::to_string(r));
          const uint8_t* row = base + static_cast<size_t>(r) * rb;
          std::memset(static_cast<void*>(a.data()), 0xAB, a.size() * sizeof(UnpackedSuper));
          std::memset(static_cast<void*>(got.data()), 0xCD, got.size() * sizeof(UnpackedSuper));
          ref.unpack_row(l.type, WeightForm::kFile, row, k, qk.signed_q8, a.data());
          qk.unpack_row(l.type, WeightForm::kFile, row, k, qk.signed_q8, got.data());
          if (in_k4_block_lanes(qk, l.type))
            for (UnpackedSuper& us : a) k4_group_to_block_lanes(us);
          EXPECT_EQ(0, std::memcmp(a.data(), got.data(), a.size() * sizeof(UnpackedSuper)));
        }
      }
    }
  }
}

// Scale of the activation block holding element k of a row, as the kernels quantize it.
float block_scale(const float* x, int64_t k, int64_t cols, bool per_super) {
  const int64_t bs = per_super && cols % 256 == 0 ? 256 : 32;
  const int64_t b0 = k / bs * bs;
  float amax = 0;
  for (int64_t i = b0; i < b0 + bs; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax / 127.0f;
}

// Where a target has direct kernels, each of their results carries the bits of unpack_row + dot_rows of the
// same target, for every window size up to direct_max_rows (the two must share their per-row arithmetic).
TEST(Kernels, DirectKernelsAreBitIdenticalToUnpackAndDot) {
  for (Target target : runnable_targets()) {
    const QuantKernels& qk = quant_kernels(target);
    for (DType t : kQuantTypes) {
      const bool signed_codes = t == DType::Q8_0 && qk.signed_q8;
      // 2304 and 5632: windows past the column-chunk threshold (several chunks, several blocks of weight rows
      // at 5632). The legacy types also at widths with a partial last super-block (its copy padded with zero
      // blocks, quant_direct_x86.h): under one super-block, Qwen2.5-0.5B's 896, and 5664 (past the
      // column-chunk threshold, which such rows do not take); 480 for a partial super-block of 7 blocks.
      // Both forms of the types with an interleaved one (kernels/repack.h; lane pairs: the next test).
      std::vector<int64_t> widths = {256, 768, 2304, 5632};
      if (is_legacy(t)) widths.insert(widths.end(), {32, 96, 480, 896, 5664});
      for (int64_t k : widths)
        for (WeightForm form : {WeightForm::kFile, WeightForm::kInterleaved}) {
          const bool interleaved = form == WeightForm::kInterleaved;
          if (interleaved && !can_interleave(t, k)) continue;
          const int64_t max_rows = qk.direct_max_rows(t, form, k, signed_codes);
          if (max_rows == 0) continue;
          SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(t)) +
                       " k=" + std::to_string(k) + (interleaved ? " interleaved" : ""));
          const int64_t n = k >= 5632 ? 37 : 5, ns = super_count(k);
          TestMatrix m = make_matrix(t, n, k, 17);
          if (interleaved) {
            interleave_rows(t, k, m.storage.data() + misalign(t), m.view.bytes());
            m.view.form = form;
          }
          const auto x = make_activations(max_rows, k, 19);
          std::vector<ActSuper> act(static_cast<size_t>(ns * max_rows));
          for (int64_t r = 0; r < max_rows; ++r)
            qk.quantize_row(x.data() + 1 + r * k, k, act_form_on(qk, t), act.data() + r * ns);
          std::vector<UnpackedSuper> buf(static_cast<size_t>(ns));
          for (int64_t rows = 1; rows <= max_rows; ++rows) {
            std::vector<float> want(static_cast<size_t>(rows * n)), got(want.size());
            for (int64_t o = 0; o < n; ++o) {
              qk.unpack_row(t, form, m.view.row(o), k, signed_codes, buf.data());
              qk.dot_rows(buf.data(), ns, act.data(), ns, rows, t, signed_codes, want.data() + o, n);
            }
            for (const PrefetchReach reach : kAllReaches) {
              std::fill(got.begin(), got.end(), -1.0f);
              qk.direct_rows(t, form, m.view.row(0), static_cast<int64_t>(m.view.row_bytes), n, k, act.data(),
                             ns, rows, got.data(), n, reach);
              EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                  << "rows=" << rows << " reach=" << static_cast<int>(reach);
            }
          }
        }
    }
  }
}

// The activations of lane-pair supers (quant_layout.h) as floats: each code times its block's scale.
std::vector<float> lane_pair_activations(const ActSuper* act, int64_t k) {
  std::vector<float> x(static_cast<size_t>(k));
  for (int64_t p = 0; p < k / 512; ++p)
    for (int e = 0; e < 512; ++e)
      x[static_cast<size_t>(512 * p + e)] =
          static_cast<float>(act[2 * p + lane_pair_super(e)].q[lane_pair_position(e)]) * act[2 * p].d[e / 32];
  return x;
}

// Q4_0, Q4_K and Q8_0 in lane pairs, on the targets that read them (QuantKernels::lane_pairs): every window
// of up to direct_max_rows rows (one weight row or two a tile, unsigned or signed codes, column chunks at
// 5632) gives each row the bits it has alone, with either prefetch reach; and one row's result equals the dot
// product of the dequantized weights with the quantized activations (codes times block scales), summed in
// double, within the float-order tolerance.
TEST(Kernels, LanePairKernelsKeepTheirBitsAndMatchTheQuantizedProduct) {
  int tested = 0;
  for (Target target : runnable_targets()) {
    const QuantKernels& qk = quant_kernels(target);
    if (!qk.lane_pairs) continue;
    for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q8_0})
      for (int64_t k : {512, 2048, 5632}) {
        SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(t)) +
                     " k=" + std::to_string(k));
        const int64_t max_rows = qk.direct_max_rows(t, WeightForm::kLanePairs, k, false);
        ASSERT_EQ(max_rows, 8);
        const int64_t n = 37, ns = super_count(k);
        TestMatrix m = make_matrix(t, n, k, 41);
        repack_rows(WeightForm::kLanePairs, t, k, m.storage.data() + misalign(t), m.view.bytes());
        m.view.form = WeightForm::kLanePairs;
        const auto x = make_activations(max_rows, k, 43);
        std::vector<ActSuper> act(static_cast<size_t>(ns * max_rows));
        for (int64_t r = 0; r < max_rows; ++r)
          qk.quantize_row(x.data() + 1 + r * k, k, ActForm::kLanePairs, act.data() + r * ns);
        std::vector<float> alone(static_cast<size_t>(max_rows * n));
        for (int64_t r = 0; r < max_rows; ++r)
          qk.direct_rows(t, WeightForm::kLanePairs, m.view.row(0), static_cast<int64_t>(m.view.row_bytes), n,
                         k, act.data() + r * ns, ns, 1, alone.data() + r * n, n, PrefetchReach::kNear);
        for (int64_t r = 0; r < max_rows; ++r) {
          const std::vector<float> xq = lane_pair_activations(act.data() + r * ns, k);
          for (int64_t o = 0; o < n; ++o) {
            double want = 0, mag = 0;
            for (int64_t i = 0; i < k; ++i) {
              const double p =
                  static_cast<double>(m.dequant[static_cast<size_t>(o * k + i)]) * xq[static_cast<size_t>(i)];
              want += p;
              mag += std::fabs(p);
            }
            ASSERT_NEAR(alone[static_cast<size_t>(r * n + o)], want, 1e-5 * mag + 1e-6)
                << "r=" << r << " o=" << o;
          }
        }
        for (int64_t rows = 1; rows <= max_rows; ++rows)
          for (const PrefetchReach reach : kAllReaches) {
            std::vector<float> got(static_cast<size_t>(rows * n), -1.0f);
            qk.direct_rows(t, WeightForm::kLanePairs, m.view.row(0), static_cast<int64_t>(m.view.row_bytes),
                           n, k, act.data(), ns, rows, got.data(), n, reach);
            EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)))
                << "rows=" << rows << " reach=" << static_cast<int>(reach);
          }
        ++tested;
      }
  }
  if (tested == 0) GTEST_SKIP() << "no target here reads lane pairs";
}

// Each target's unpacked kernels (unpack_row + dot_rows, on a single thread) against the scalar target's
// within the float-order tolerance, and a row's bits whatever window it runs in (batch invariance), for every
// row count up to 9 (two tiles and a rest on every target).
TEST(Kernels, DotRowsMatchScalarAndDoNotDependOnTheWindow) {
  const QuantKernels& ref = quant_kernels(Target::kScalar);
  constexpr int64_t kRows = 9, kOut = 3;
  for (DType t : kQuantTypes) {
    for (int64_t k : sizes_for(t)) {
      const int64_t ns = super_count(k);
      const TestMatrix m = make_matrix(t, kOut, k, 23);
      const auto x = make_activations(kRows, k, 29);
      std::vector<ActSuper> act(static_cast<size_t>(ns * kRows));
      for (int64_t r = 0; r < kRows; ++r)
        ref.quantize_row(x.data() + 1 + r * k, k, act_form_of(t), act.data() + r * ns);
      std::vector<UnpackedSuper> buf(static_cast<size_t>(ns));
      std::vector<float> want(static_cast<size_t>(kRows * kOut));
      for (int64_t o = 0; o < kOut; ++o) {
        ref.unpack_row(t, WeightForm::kFile, m.view.row(o), k, false, buf.data());
        ref.dot_rows(buf.data(), ns, act.data(), ns, kRows, t, false, want.data() + o, kOut);
      }
      std::vector<float> neon(static_cast<size_t>(kRows * kOut));  // the NEON target's rows
      for (Target target : runnable_targets()) {
        SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(t)) +
                     " k=" + std::to_string(k));
        const QuantKernels& qk = quant_kernels(target);
        const bool signed_codes = t == DType::Q8_0 && qk.signed_q8;
        std::vector<ActSuper> own = act;  // the activations in this target's order
        if (qk.block_lanes && is_legacy(t))
          for (ActSuper& as : own) to_block_lanes(as);
        if (in_k4_block_lanes(qk, t))  // the same codes and scales in block lanes, with per-32 sums
          for (int64_t r = 0; r < kRows; ++r) {
            ref.quantize_row(x.data() + 1 + r * k, k, ActForm::kSuperLanes, own.data() + r * ns);
            for (int64_t i = r * ns; i < (r + 1) * ns; ++i) to_block_lanes(own[static_cast<size_t>(i)]);
          }
        for (int64_t o = 0; o < kOut; ++o) {
          qk.unpack_row(t, WeightForm::kFile, m.view.row(o), k, signed_codes, buf.data());
          std::vector<float> alone(static_cast<size_t>(kRows));
          for (int64_t r = 0; r < kRows; ++r)
            qk.dot_rows(buf.data(), ns, own.data() + r * ns, ns, 1, t, signed_codes, &alone[r], 1);
          // NEON with and without the dot-product extension compute the same integers, then the same float
          // operations (runnable_targets lists kNEON before kNEONDot).
          for (int64_t r = 0; r < kRows; ++r) {
            if (target == Target::kNEON) neon[static_cast<size_t>(r * kOut + o)] = alone[r];
            if (target == Target::kNEONDot) {
              EXPECT_EQ(0, std::memcmp(&alone[r], &neon[static_cast<size_t>(r * kOut + o)], sizeof(float)))
                  << "neon-dotprod vs neon, r=" << r;
            }
          }
          for (int64_t r = 0; r < kRows; ++r) {
            double mag = 0;
            for (int64_t i = 0; i < k; ++i)
              mag += std::fabs(m.dequant[static_cast<size_t>(o * k + i)] *
                               x[static_cast<size_t>(1 + r * k + i)]);
            ASSERT_NEAR(alone[r], want[static_cast<size_t>(r * kOut + o)], 1e-5 * mag + 1e-6) << "r=" << r;
          }
          for (int64_t rows = 2; rows <= kRows; ++rows) {
            std::vector<float> got(static_cast<size_t>(rows));
            qk.dot_rows(buf.data(), ns, own.data(), ns, rows, t, signed_codes, got.data(), 1);
            EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)))
                << "rows=" << rows;
          }
        }
      }
    }
  }
}

TEST(Kernels, QuantizedMatmulMatchesReferences) {
  ThreadPool pool(2);
  for (DType t : kQuantTypes) {
    for (int64_t k : sizes_for(t)) {
      const int64_t n = 37;
      const TestMatrix m = make_matrix(t, n, k, 11);
      for (int64_t rows : {1, 2, 3, 5, 16, 17, 70}) {
        const auto xbuf = make_activations(rows, k, 13);
        const float* x = xbuf.data() + 1;
        std::vector<float> want(static_cast<size_t>(rows * n));
        MatmulScratch scalar_scratch(pool.size(), k, rows, Target::kScalar);
        matmul(m.view, x, rows, want.data(), pool, scalar_scratch);
        // Scalar target against the double-precision reference, within the activation rounding bound.
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t o = 0; o < n; ++o) {
            double exact = 0, bound = 0, mag = 0;
            for (int64_t i = 0; i < k; ++i) {
              const double w = m.dequant[static_cast<size_t>(o * k + i)], xv = x[r * k + i];
              exact += w * xv;
              mag += std::fabs(w * xv);
              bound += std::fabs(w) * (0.5 * block_scale(x + r * k, i, k, per_super_activations(t)) +
                                       std::ldexp(std::fabs(xv), -10));
            }
            ASSERT_NEAR(want[static_cast<size_t>(r * n + o)], exact, bound + 1e-5 * mag)
                << dtype_name(t) << " k=" << k << " rows=" << rows << " r=" << r << " o=" << o;
          }
        }
        for (Target target : runnable_targets()) {
          if (target == Target::kScalar) continue;
          std::vector<float> got(static_cast<size_t>(rows * n));
          MatmulScratch scratch(pool.size(), k, rows, target);
          matmul(m.view, x, rows, got.data(), pool, scratch);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t o = 0; o < n; ++o) {
              double mag = 0;
              for (int64_t i = 0; i < k; ++i)
                mag += std::fabs(m.dequant[static_cast<size_t>(o * k + i)] * x[r * k + i]);
              ASSERT_NEAR(got[static_cast<size_t>(r * n + o)], want[static_cast<size_t>(r * n + o)],
                          1e-5 * mag + 1e-6)
                  << target_name(target) << " " << dtype_name(t) << " k=" << k << " rows=" << rows;
            }
        }
      }
    }
  }
}

// Batch invariance at the matmul level, on one thread (no worker threads: the ARM check runs it under
// qemu-user): each activation row's outputs keep the bits they have alone in every window and prefill size,
// whichever kernels the row count picks (direct tiles, pair tiles, column chunks, passes, the unpacked path).
TEST(Kernels, QuantizedMatmulRowsKeepTheirBitsInEveryWindow) {
  ThreadPool pool(1);
  for (Target target : runnable_targets()) {
    for (DType t : kQuantTypes) {
      std::vector<int64_t> widths = {512, 5632};
      if (is_legacy(t)) widths.push_back(480);
      for (int64_t k : widths) {
        SCOPED_TRACE(std::string(target_name(target)) + " " + std::string(dtype_name(t)) +
                     " k=" + std::to_string(k));
        const int64_t n = 19, max_rows = 70;
        const auto xbuf = make_activations(max_rows, k, 37);
        const float* x = xbuf.data() + 1;
        MatmulScratch scratch(pool.size(), k, max_rows, target);
        // Every form of the types with a repacked one (repack.h).
        for (WeightForm form : {WeightForm::kFile, WeightForm::kInterleaved, WeightForm::kLanePairs}) {
          if (form == WeightForm::kInterleaved && !can_interleave(t, k)) continue;
          if (form == WeightForm::kLanePairs && !can_lane_pair(t, k)) continue;
          TestMatrix m = make_matrix(t, n, k, 31);
          if (form != WeightForm::kFile) {
            repack_rows(form, t, k, m.storage.data() + misalign(t), m.view.bytes());
            m.view.form = form;
          }
          std::vector<float> alone(static_cast<size_t>(max_rows * n));
          for (int64_t r = 0; r < max_rows; ++r)
            matmul(m.view, x + r * k, 1, alone.data() + r * n, pool, scratch);
          for (int64_t rows : {2, 3, 4, 5, 8, 9, 16, 17, 70}) {
            std::vector<float> got(static_cast<size_t>(rows * n));
            matmul(m.view, x, rows, got.data(), pool, scratch);
            EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)))
                << "rows=" << rows << " form=" << static_cast<int>(form);
          }
        }
      }
    }
  }
}

TEST(Kernels, FloatMatmulMatchesReferenceOnEveryHighwayTarget) {
  ThreadPool pool(2);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t k : {1, 7, 16, 37, 100, 1031}) {
      const int64_t n = 19;
      const TestMatrix m = make_matrix(t, n, k, 21);
      for (int64_t rows : {1, 2, 3, 4, 8, 9}) {
        const auto xbuf = make_activations(rows, k, 23);
        const float* x = xbuf.data() + 1;
        std::vector<float> want(static_cast<size_t>(rows * n)), got(want.size());
        matmul_reference(m.view, x, rows, want.data());
        tandem::testing::for_each_hwy_target([&] {
          MatmulScratch scratch(pool.size(), k, rows);
          matmul(m.view, x, rows, got.data(), pool, scratch);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t o = 0; o < n; ++o) {
              double mag = 0;
              for (int64_t i = 0; i < k; ++i)
                mag += std::fabs(m.dequant[static_cast<size_t>(o * k + i)] * x[r * k + i]);
              ASSERT_NEAR(got[static_cast<size_t>(r * n + o)], want[static_cast<size_t>(r * n + o)],
                          1e-5 * mag + 1e-6)
                  << dtype_name(t) << " k=" << k << " rows=" << rows;
            }
          // Each row alone has the bits it has in the window (tiles of several weight and activation rows,
          // and the smaller tiles of the last rows, on every target).
          std::vector<float> alone(static_cast<size_t>(n));
          for (int64_t r = 0; r < rows; ++r) {
            matmul(m.view, x + r * k, 1, alone.data(), pool, scratch);
            ASSERT_EQ(0, std::memcmp(alone.data(), got.data() + r * n, alone.size() * sizeof(float)))
                << dtype_name(t) << " k=" << k << " rows=" << rows << " r=" << r;
          }
        });
      }
    }
  }
}

// The float tiles (several weight rows by two activation rows, smaller tiles for the last rows) give every
// output the bits it has alone, one weight row against one activation row, for any range of weight rows a
// thread takes, and write no output outside it, on every Highway target; so do the many-row class's
// converted panels over chunks of activation rows (8 rows and more; 70 and 131 span several chunks; k 4100
// is past the panel's width). Single-threaded, so that the ARM build runs it under emulation.
TEST(Kernels, FloatTilesKeepEachOutputsBitsOnEveryHighwayTarget) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t k : {7, 37, 100, 1031, 4100}) {
      const int64_t n = 11, rows = 131;
      const TestMatrix m = make_matrix(t, n, k, 31);
      const auto xbuf = make_activations(rows, k, 33);
      const float* x = xbuf.data() + 1;
      tandem::testing::for_each_hwy_target([&] {
        std::vector<float> alone(static_cast<size_t>(rows * n));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = 0; o < n; ++o)
            float_matmul_rows(t, m.view.data, m.view.row_bytes, o, o + 1, k, x + r * k, k, 1,
                              alone.data() + r * n, n);
        for (const auto& [o0, o1] : std::vector<std::pair<int64_t, int64_t>>{{0, n}, {1, n}, {2, 7}, {3, 4}})
          for (int64_t nr : {1, 2, 3, 8, 9, 70, 131}) {
            std::vector<float> y(static_cast<size_t>(nr * n), std::nanf(""));
            float_matmul_rows(t, m.view.data, m.view.row_bytes, o0, o1, k, x, k, nr, y.data(), n);
            for (int64_t r = 0; r < nr; ++r)
              for (int64_t o = 0; o < n; ++o) {
                const float got = y[static_cast<size_t>(r * n + o)];
                if (o < o0 || o >= o1) {
                  ASSERT_TRUE(std::isnan(got)) << "wrote output " << o << " outside " << o0 << ".." << o1;
                } else {
                  const float want = alone[static_cast<size_t>(r * n + o)];
                  ASSERT_EQ(0, std::memcmp(&got, &want, sizeof(float)))
                      << dtype_name(t) << " k=" << k << " rows=" << nr << " r=" << r << " o=" << o << " in "
                      << o0 << ".." << o1;
                }
              }
          }
      });
    }
  }
}

// The encoder GEMM (float_gemm.h) gives its scalar reference's bits on every Highway target (those without
// fused multiply-adds run the reference), for row counts that are no whole number of tiles (6 or 12 rows),
// ranges of outputs that are no whole number of panels (16 or 32 weight rows) or blocks (128), widths that
// are no whole number of vectors or column blocks (128), and any range a thread may take; it writes no output
// outside the range. Against the double-precision product it stays within its sum order's bound: a chain of
// at most kGemmDepth multiply-adds per block and one addition per further block, each rounding within 2^-24
// of what it sums, so |dy| <= (kGemmDepth + blocks) 2^-24 sum_k |w_k x_k| (plus a little for the double
// product's own rounding).
TEST(Kernels, EncoderGemmGivesItsReferencesBitsOnEveryHighwayTarget) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t k : {1, 7, 37, 128, 129, 300, 1031}) {
      const int64_t n = 150, rows = 29;
      const TestMatrix m = make_matrix(t, n, k, 41);
      const auto xbuf = make_activations(rows, k, 43);
      const float* x = xbuf.data() + 1;
      std::vector<float> want(static_cast<size_t>(rows * n));
      float_gemm_reference(t, m.view.data, m.view.row_bytes, 0, n, k, x, k, rows, want.data(), n);
      const double blocks = static_cast<double>((k + kGemmDepth - 1) / kGemmDepth);
      const double bound = (static_cast<double>(kGemmDepth) + blocks + 1.0) * std::ldexp(1.0, -24);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n; ++o) {
          double exact = 0, mag = 0;
          for (int64_t i = 0; i < k; ++i) {
            const double p = static_cast<double>(m.dequant[static_cast<size_t>(o * k + i)]) * x[r * k + i];
            exact += p;
            mag += std::fabs(p);
          }
          ASSERT_LE(std::fabs(want[static_cast<size_t>(r * n + o)] - exact), bound * mag + 1e-30)
              << dtype_name(t) << " k=" << k << " r=" << r << " o=" << o;
        }
      tandem::testing::for_each_hwy_target([&] {
        for (const auto& [o0, o1] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, n}, {0, 16}, {0, 32}, {5, n}, {3, 4}, {17, 146}, {32, 64}, {128, n}})
          for (int64_t nr : {1, 5, 6, 7, 12, 13, 29}) {
            std::vector<float> y(static_cast<size_t>(nr * n), std::nanf(""));
            float_gemm_rows(t, m.view.data, m.view.row_bytes, o0, o1, k, x, k, nr, y.data(), n);
            for (int64_t r = 0; r < nr; ++r)
              for (int64_t o = 0; o < n; ++o) {
                const float got = y[static_cast<size_t>(r * n + o)];
                if (o < o0 || o >= o1) {
                  ASSERT_TRUE(std::isnan(got)) << "wrote output " << o << " outside " << o0 << ".." << o1;
                } else {
                  const float ref = want[static_cast<size_t>(r * n + o)];
                  ASSERT_EQ(0, std::memcmp(&got, &ref, sizeof(float)))
                      << dtype_name(t) << " k=" << k << " rows=" << nr << " r=" << r << " o=" << o << " in "
                      << o0 << ".." << o1 << ": " << got << " vs " << ref;
                }
              }
          }
      });
    }
  }
}

// encoder_matmul_group: each float matrix gets the GEMM's bits, so a row has the same bits alone as at any
// position of a batch and under any thread count, with one matrix or several in a group; quantized matrices
// of the group get matmul_group's.
TEST(Kernels, EncoderMatmulKeepsEachRowsBitsInAnyBatch) {
  const int64_t k = 200, rows = 40;
  const TestMatrix a = make_matrix(DType::F16, 70, k, 51), b = make_matrix(DType::BF16, 33, k, 52),
                   q = make_matrix(DType::Q8_0, 64, 256, 53);
  const auto xbuf = make_activations(rows, k, 55);
  const float* x = xbuf.data() + 1;
  std::vector<float> alone_a(static_cast<size_t>(rows * 70)), alone_b(static_cast<size_t>(rows * 33));
  for (int64_t r = 0; r < rows; ++r) {
    float_gemm_reference(DType::F16, a.view.data, a.view.row_bytes, 0, 70, k, x + r * k, k, 1,
                         alone_a.data() + r * 70, 70);
    float_gemm_reference(DType::BF16, b.view.data, b.view.row_bytes, 0, 33, k, x + r * k, k, 1,
                         alone_b.data() + r * 33, 33);
  }
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    MatmulScratch scratch(pool.size(), 256, rows);
    for (const int64_t first : {0, 1, 5, 11})
      for (int64_t nr : {int64_t{1}, int64_t{6}, int64_t{13}, rows - first}) {
        if (first + nr > rows) continue;
        std::vector<float> ya(static_cast<size_t>(nr * 70)), yb(static_cast<size_t>(nr * 33));
        const MatmulOut outs[] = {{&a.view, ya.data()}, {&b.view, yb.data()}};
        encoder_matmul_group(outs, x + first * k, nr, pool, scratch);
        EXPECT_EQ(0, std::memcmp(ya.data(), alone_a.data() + first * 70, ya.size() * sizeof(float)))
            << threads << " threads, rows " << first << ".." << first + nr;
        EXPECT_EQ(0, std::memcmp(yb.data(), alone_b.data() + first * 33, yb.size() * sizeof(float)))
            << threads << " threads, rows " << first << ".." << first + nr;
        std::vector<float> one(static_cast<size_t>(nr * 70));
        encoder_matmul(a.view, x + first * k, nr, one.data(), pool, scratch);
        EXPECT_EQ(0, std::memcmp(one.data(), ya.data(), one.size() * sizeof(float)));
      }
    // A quantized matrix takes matmul_group's kernels.
    const auto xq = make_activations(5, 256, 57);
    std::vector<float> want(5 * 64), got(5 * 64);
    matmul(q.view, xq.data() + 1, 5, want.data(), pool, scratch);
    encoder_matmul(q.view, xq.data() + 1, 5, got.data(), pool, scratch);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << threads << " threads";
  }
}

// Edge cases random rows rarely reach: the largest magnitude present with both signs (the first one sets the
// per-super scale's sign, the other one hits the +127 clamp), all-zero blocks and supers, exact halves after
// scaling (round half away from zero vs to even), and a partial last super.
TEST(Kernels, ActivationQuantizationEdgeCasesAreBitIdenticalOnEveryTarget) {
  const QuantKernels& ref = quant_kernels(Target::kScalar);
  const int64_t k = 3 * 256 + 64;
  std::vector<float> x(static_cast<size_t>(k), 0.0f);
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> level(-127, 127);
  for (int64_t i = 0; i < 256; ++i) x[static_cast<size_t>(i)] = 0.25f * static_cast<float>(level(rng));
  x[5] = -40.0f;
  x[77] = 40.0f;  // same magnitude, later: +127 after the scale set by x[5]
  // Super 1 stays zero. Super 2: halves after scaling by 127 / amax = 1.
  for (int64_t i = 512; i < 768; ++i) x[static_cast<size_t>(i)] = 0.5f + static_cast<float>(i % 64) - 32.0f;
  x[600] = 127.0f;
  for (int64_t i = 768; i < k; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 7) - 3.5f;
  const size_t ns = static_cast<size_t>(super_count(k));
  for (Target target : runnable_targets()) {
    const QuantKernels& qk = quant_kernels(target);
    for (bool per_super : {false, true}) {
      SCOPED_TRACE(std::string(target_name(target)) + (per_super ? " per-super" : " per-32"));
      const ActForm form = per_super ? ActForm::kSupers : ActForm::kBlocks;
      std::vector<ActSuper> a(ns), b(ns);
      std::memset(static_cast<void*>(a.data()), 0xAB, ns * sizeof(ActSuper));
      std::memset(static_cast<void*>(b.data()), 0xCD, ns * sizeof(ActSuper));
      // The per-super form covers whole supers only; the partial last super takes per-32 scales.
      ref.quantize_row(x.data(), k, form, a.data());
      qk.quantize_row(x.data(), k, form, b.data());
      legacy_act_to_target(qk, k, form, a);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), ns * sizeof(ActSuper)));
    }
  }
}

TEST(Kernels, StreamReadCoversEveryWord) {
  // Every length from none to past four vectors of the widest target, at every 8-byte offset of a line: the
  // wide kernel's XOR in every form equals the scalar reference's, and each word counts (one set bit per
  // word).
  std::vector<uint8_t> buf(64 * 40 + 64, 0);
  for (size_t i = 0; i < buf.size(); i += 8)
    buf[i + (i / 8) % 8] = static_cast<uint8_t>(1u << ((i / 64) % 8));
  for (size_t offset = 0; offset < 64; offset += 8)
    for (size_t bytes = 0; bytes + offset <= 64 * 40; bytes += 8) {
      const uint8_t* p = buf.data() + offset;
      for (const StreamForm form : kStreamForms)
        ASSERT_EQ(stream_xor(p, bytes, form), stream_xor_reference(p, bytes)) << offset << " " << bytes;
    }
  uint64_t want = 0;
  for (size_t i = 0; i < 64 * 5; i += 8) {
    uint64_t w;
    std::memcpy(&w, buf.data() + i, 8);
    want ^= w;
  }
  EXPECT_EQ(stream_xor_reference(buf.data(), 64 * 5), want);
  EXPECT_NE(want, 0u);
  ThreadPool pool(2);
  EXPECT_GT(measure_read_bandwidth(buf.data(), buf.size(), pool, 1), 0.0);
  // Each pass's rate is appended, after what the vector held, and the best of them is returned.
  std::vector<double> rates{-1.0};
  const double best = measure_read_bandwidth(buf.data(), buf.size(), pool, 3, &rates);
  ASSERT_EQ(rates.size(), 4u);
  EXPECT_EQ(rates[0], -1.0);
  EXPECT_EQ(best, *std::max_element(rates.begin() + 1, rates.end()));
  for (size_t i = 1; i < rates.size(); ++i) EXPECT_GT(rates[i], 0.0);
}

}  // namespace

TEST(Kernels, DotProbeSumsEqualTheReference) {
  // Every target's throughput probe computes iterations * dot(u, s_c) per chain, modulo 2^32: extreme codes
  // (u up to 63, s from -128 to 127), chains whose sums wrap 32 bits (chain 0: every s = -128, chain 1: 127),
  // and no iterations at all.
  std::mt19937 rng(5);
  std::vector<uint8_t> u(64);
  std::vector<int8_t> s(64 * kDotProbeChains);
  for (auto& v : u) v = static_cast<uint8_t>(32 + rng() % 32);
  for (auto& v : s) v = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
  for (int i = 0; i < 64; ++i) s[i] = -128, s[64 + i] = 127;
  u[0] = 63;
  for (Target t : runnable_targets())
    for (int64_t iterations : {0, 1, 3, 1000, 20001}) {
      std::vector<uint32_t> sums(kDotProbeChains, 0xdeadbeef);
      quant_kernels(t).dot_probe(u.data(), s.data(), iterations, sums.data());
      for (int c = 0; c < kDotProbeChains; ++c)
        ASSERT_EQ(sums[c], dot_probe_reference(u.data(), s.data() + 64 * c, iterations))
            << target_name(t) << " iterations " << iterations << " chain " << c;
    }
  // 20001 steps of chain 0 (about -128 * 3000 each) pass -2^31: the reference is taken modulo 2^32.
  int64_t dot0 = 0;
  for (int i = 0; i < 64; ++i) dot0 += -128 * int64_t{u[static_cast<size_t>(i)]};
  ASSERT_LT(20001 * dot0, -(int64_t{1} << 32));
  EXPECT_EQ(dot_probe_reference(u.data(), s.data(), 20001),
            static_cast<uint32_t>(static_cast<uint64_t>(20001) * static_cast<uint64_t>(dot0)));
}

TEST(Kernels, DotPeakIsMeasuredOnEveryTarget) {
  ThreadPool pool(2);
  for (Target t : runnable_targets()) EXPECT_GT(measure_dot_peak(pool, t, 1), 0.0) << target_name(t);
}
