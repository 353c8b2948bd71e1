// The latent attention projections (model/mla.h) against float64 sums over the dequantized rows of attn_kv_b:
// the absorbed queries q_latent[h] = W_k[h]^T q_nope[h] (project) and the expanded values W_v[h] o[h]
// (expand), every head at its own rows, for attn_kv_b in F32 and Q4_0, its copies made from the file's form
// and from a repacked form, on the best kernel target and the scalar one, for 1, 3 and 16 rows. A wrong
// head offset or a missing transpose moves a result by a large fraction of its size; the tolerances are
// small fractions of the sum of its terms' magnitudes (L1), stated at each check. And a row's result has
// the same bits alone as inside 16 rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/kernels/repack.h"
#include "tandem/model/mla.h"
#include "tandem/tensor/quant.h"
#include "test_util.h"

namespace {

using namespace tandem;
using tandem::model::Config;
using tandem::model::MlaProjection;
using tandem::model::MlaWeights;
using tandem::testing::normal_floats;

constexpr int64_t kHeads = 3, kNope = 32, kRot = 16, kHeadDimV = 32, kLora = 512;
constexpr int64_t kHeadDim = kNope + kRot, kKvB = kNope + kHeadDimV, kKvA = kLora + kRot;
constexpr int64_t kEmbd = kHeads * kHeadDim;  // the queries are the input itself (attn_q is the identity)
constexpr int64_t kMaxRows = 16;

Config mla_config() {
  Config c;
  c.n_embd = kEmbd;
  c.n_head = kHeads;
  c.n_head_kv = kHeads;
  c.head_dim = kHeadDim;
  c.head_dim_v = kHeadDimV;
  c.n_rot = kRot;
  c.mla.kv_lora_rank = kLora;
  c.norm_eps = 1e-6f;
  return c;
}

// Bytes at a 64-byte boundary (lane pairs and row tiles are read at the address they were repacked at).
struct AlignedBytes {
  explicit AlignedBytes(size_t n) : buf(n + 64) {
    offset = (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;
  }
  uint8_t* data() { return buf.data() + offset; }
  std::vector<uint8_t> buf;
  size_t offset = 0;
};

MatrixView view(DType type, int64_t rows, int64_t cols, const uint8_t* data) {
  MatrixView m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = row_bytes(type, cols);
  m.data = data;
  return m;
}

// One layer's weights: attn_q the identity, attn_kv_a and attn_kv_b random (attn_kv_b in `type`, in the
// form `repacked` asks for on `target`), and the copies of attn_kv_b made as the loader makes them.
struct Layer {
  Layer(DType type, bool repacked, kernels::Target target)
      : wq(static_cast<size_t>(kEmbd * kEmbd), 0.0f),
        wkv_a(normal_floats(kKvA * kEmbd, 11)),
        norm(static_cast<size_t>(kLora), 1.0f),
        kv_b(row_bytes(type, kLora) * static_cast<size_t>(kHeads * kKvB)),
        copies(model::mla_copy_bytes(mla_config(), [&] {
          MlaWeights m;
          m.wkv_b.type = type;
          return m;
        }())) {
    for (int64_t i = 0; i < kEmbd; ++i) wq[static_cast<size_t>(i * kEmbd + i)] = 1.0f;
    for (float& v : wkv_a) v *= 0.1f;
    std::vector<float> b = normal_floats(kHeads * kKvB * kLora, 12);
    for (float& v : b) v *= 0.05f;
    const size_t rb = row_bytes(type, kLora);
    dq.resize(b.size());
    for (int64_t o = 0; o < kHeads * kKvB; ++o) {
      uint8_t* row = kv_b.data() + static_cast<size_t>(o) * rb;
      quantize_row(type, b.data() + o * kLora, row, kLora);
      dequantize_row(type, row, dq.data() + o * kLora, kLora);
    }
    w.wq = view(DType::F32, kEmbd, kEmbd, reinterpret_cast<const uint8_t*>(wq.data()));
    w.wkv_a = view(DType::F32, kKvA, kEmbd, reinterpret_cast<const uint8_t*>(wkv_a.data()));
    w.kv_a_norm.data = norm.data();
    w.kv_a_norm.size = kLora;
    w.wkv_b = view(type, kHeads * kKvB, kLora, kv_b.data());
    if (repacked) {
      w.wkv_b.form = kernels::repack_form(type, w.wkv_b.rows, kLora, kv_b.data(), target);
      if (w.wkv_b.form != WeightForm::kFile)
        kernels::repack_rows(w.wkv_b.form, type, kLora, kv_b.data(), w.wkv_b.bytes());
    }
    model::make_mla_copies(mla_config(), w, copies.data());
  }
  // attn_kv_b's row o, dequantized from the file's form.
  const float* row(int64_t o) const { return dq.data() + o * kLora; }

  std::vector<float> wq, wkv_a, norm, dq;
  AlignedBytes kv_b, copies;
  MlaWeights w;
};

// The rotary angles of no rotation (cos 1, sin 0), so that the queries' rotary parts pass unchanged.
std::vector<float> unit_angles(int64_t R) {
  std::vector<float> cs(static_cast<size_t>(R * kRot));
  for (size_t i = 0; i < cs.size(); ++i) cs[i] = i % 2 == 0 ? 1.0f : 0.0f;
  return cs;
}

struct Case {
  DType type;
  bool repacked;
  kernels::Target target;
  std::string name() const {
    return std::string(dtype_name(type)) + (repacked ? " repacked" : " file form") +
           (target == kernels::Target::kScalar ? " scalar" : " best target");
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType t : {DType::F32, DType::Q4_0})
    for (bool repacked : {false, true})
      for (kernels::Target target : {kernels::best_target(), kernels::Target::kScalar})
        out.push_back({t, repacked, target});
  return out;
}

TEST(MlaProjection, AbsorbedQueriesMatchTheDequantizedKeyRows) {
  ThreadPool pool(2);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    Layer layer(c.type, c.repacked, c.target);
    EXPECT_EQ(layer.w.wk_t.type, c.type == DType::F32 ? DType::F32 : DType::F16);
    // A quantized attn_kv_b's values are multiplied through an F16 copy; an F32 one's in place.
    EXPECT_EQ(layer.w.wv.empty(), c.type == DType::F32);
    // F32: float sums against double, 2e-5 of L1. Q4_0: the absorbed copy is F16, each weight rounded by at
    // most 2^-11 relative, so 1e-3 of L1.
    const double tol = c.type == DType::F32 ? 2e-5 : 1e-3;
    kernels::MatmulScratch scratch(pool.size(), std::max(kEmbd, kLora), kMaxRows, c.target);
    MlaProjection mla(mla_config(), kMaxRows);
    for (int64_t R : {1, 3, 16}) {
      SCOPED_TRACE("rows " + std::to_string(R));
      const std::vector<float> x = normal_floats(R * kEmbd, static_cast<uint32_t>(100 + R));
      const std::vector<float> angles = unit_angles(R);
      std::vector<float> q(static_cast<size_t>(R * kHeads * kKvA)), k(static_cast<size_t>(R * kKvA));
      mla.project(layer.w, x.data(), R, angles.data(), q.data(), k.data(), pool, scratch);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t h = 0; h < kHeads; ++h) {
          const float* xq = x.data() + r * kEmbd + h * kHeadDim;
          const float* got = q.data() + (r * kHeads + h) * kKvA;
          for (int64_t j = 0; j < kLora; ++j) {
            double want = 0, l1 = 0;
            for (int64_t i = 0; i < kNope; ++i) {
              const double term = static_cast<double>(xq[i]) * layer.row(h * kKvB + i)[j];
              want += term;
              l1 += std::fabs(term);
            }
            ASSERT_NEAR(got[j], want, tol * l1) << "row " << r << " head " << h << " latent " << j;
          }
          // The rotary part, not rotated by unit angles, passes unchanged.
          for (int64_t i = 0; i < kRot; ++i) ASSERT_EQ(got[kLora + i], xq[kNope + i]);
        }
    }
  }
}

TEST(MlaProjection, ExpandedValuesMatchTheDequantizedValueRows) {
  ThreadPool pool(2);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    Layer layer(c.type, c.repacked, c.target);
    // F32: float sums against double, 2e-5 of L1. Q4_0: the values' copy is F16, each weight rounded by at
    // most 2^-11 relative, so 1e-3 of L1 (the latent itself is not rounded).
    const double tol = c.type == DType::F32 ? 2e-5 : 1e-3;
    kernels::MatmulScratch scratch(pool.size(), std::max(kEmbd, kLora), kMaxRows, c.target);
    MlaProjection mla(mla_config(), kMaxRows);
    for (int64_t R : {1, 3, 16}) {
      SCOPED_TRACE("rows " + std::to_string(R));
      const std::vector<float> latent = normal_floats(R * kHeads * kLora, static_cast<uint32_t>(200 + R));
      std::vector<float> out(static_cast<size_t>(R * kHeads * kHeadDimV));
      mla.expand(layer.w, latent.data(), R, out.data(), pool, scratch);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t h = 0; h < kHeads; ++h)
          for (int64_t j = 0; j < kHeadDimV; ++j) {
            const float* wv = layer.row(h * kKvB + kNope + j);
            const float* ah = latent.data() + (r * kHeads + h) * kLora;
            double want = 0, l1 = 0;
            for (int64_t i = 0; i < kLora; ++i) {
              want += static_cast<double>(wv[i]) * ah[i];
              l1 += std::fabs(static_cast<double>(wv[i]) * ah[i]);
            }
            ASSERT_NEAR(out[static_cast<size_t>((r * kHeads + h) * kHeadDimV + j)], want, tol * l1)
                << "row " << r << " head " << h << " value " << j;
          }
    }
  }
}

TEST(MlaProjection, ARowHasTheSameBitsAloneAsInAWindow) {
  ThreadPool pool(2);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name());
    Layer layer(c.type, c.repacked, c.target);
    kernels::MatmulScratch scratch(pool.size(), std::max(kEmbd, kLora), kMaxRows, c.target);
    MlaProjection mla(mla_config(), kMaxRows);
    const int64_t R = kMaxRows, pick = 5;
    const std::vector<float> x = normal_floats(R * kEmbd, 300), angles = unit_angles(R);
    const std::vector<float> latent = normal_floats(R * kHeads * kLora, 301);
    std::vector<float> q(static_cast<size_t>(R * kHeads * kKvA)), k(static_cast<size_t>(R * kKvA));
    std::vector<float> out(static_cast<size_t>(R * kHeads * kHeadDimV));
    mla.project(layer.w, x.data(), R, angles.data(), q.data(), k.data(), pool, scratch);
    mla.expand(layer.w, latent.data(), R, out.data(), pool, scratch);
    std::vector<float> q1(static_cast<size_t>(kHeads * kKvA)), k1(static_cast<size_t>(kKvA));
    std::vector<float> out1(static_cast<size_t>(kHeads * kHeadDimV));
    mla.project(layer.w, x.data() + pick * kEmbd, 1, angles.data(), q1.data(), k1.data(), pool, scratch);
    mla.expand(layer.w, latent.data() + pick * kHeads * kLora, 1, out1.data(), pool, scratch);
    EXPECT_EQ(0, std::memcmp(q1.data(), q.data() + pick * kHeads * kKvA, q1.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(k1.data(), k.data() + pick * kKvA, k1.size() * sizeof(float)));
    EXPECT_EQ(0,
              std::memcmp(out1.data(), out.data() + pick * kHeads * kHeadDimV, out1.size() * sizeof(float)));
  }
}

// The per-thread product the projections run per head (kernels::matmul_on_thread) gives every row the bits
// matmul() gives it, for quantized weights too (activations quantized a few rows at a time into the thread's
// own copy), over strided input and output rows, in the file's form and the form the loader repacks into.
TEST(MlaProjection, PerThreadMatmulHasTheBitsOfMatmul) {
  ThreadPool pool(2);
  constexpr int64_t kRows = 48, kCols = 512, kStride = kCols + 32, kOutStride = kRows + 16;
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::F16})
    for (bool repacked : {false, true})
      for (kernels::Target target : {kernels::best_target(), kernels::Target::kScalar}) {
        SCOPED_TRACE(std::string(dtype_name(type)) + (repacked ? " repacked" : " file form") +
                     (target == kernels::Target::kScalar ? " scalar" : " best target"));
        const std::vector<float> values = normal_floats(kRows * kCols, 400);
        AlignedBytes bytes(row_bytes(type, kCols) * kRows);
        for (int64_t o = 0; o < kRows; ++o)
          quantize_row(type, values.data() + o * kCols,
                       bytes.data() + static_cast<size_t>(o) * row_bytes(type, kCols), kCols);
        MatrixView w = view(type, kRows, kCols, bytes.data());
        if (repacked) {
          w.form = kernels::repack_form(type, kRows, kCols, bytes.data(), target);
          if (w.form != WeightForm::kFile) kernels::repack_rows(w.form, type, kCols, bytes.data(), w.bytes());
        }
        kernels::MatmulScratch scratch(pool.size(), kCols, kMaxRows, target);
        for (int64_t R : {1, 3, 16}) {
          SCOPED_TRACE("rows " + std::to_string(R));
          const std::vector<float> x = normal_floats(R * kCols, static_cast<uint32_t>(500 + R));
          std::vector<float> want(static_cast<size_t>(R * kRows));
          kernels::matmul(w, x.data(), R, want.data(), pool, scratch);
          std::vector<float> xs(static_cast<size_t>(R * kStride), 0.0f);
          for (int64_t r = 0; r < R; ++r) std::copy_n(x.data() + r * kCols, kCols, xs.data() + r * kStride);
          std::vector<float> got(static_cast<size_t>(R * kOutStride), -1.0f);
          kernels::matmul_on_thread(w, xs.data(), kStride, R, got.data(), kOutStride, scratch, 1);
          for (int64_t r = 0; r < R; ++r) {
            ASSERT_EQ(
                0, std::memcmp(got.data() + r * kOutStride, want.data() + r * kRows, kRows * sizeof(float)))
                << "row " << r;
            ASSERT_EQ(got[static_cast<size_t>(r * kOutStride + kRows)], -1.0f);  // nothing past the row
          }
          // In 16-row ranges under one call number (up to 4 rows quantized once on the thread for all
          // ranges, after a product of another input on that thread): the same bits.
          std::vector<float> ranged(static_cast<size_t>(R * kOutStride), -1.0f);
          const uint64_t call = scratch.next_call();
          for (int64_t o0 = 0; o0 < kRows; o0 += 16)
            kernels::matmul_on_thread(w.row_range(o0, 16), xs.data(), kStride, R, ranged.data() + o0,
                                      kOutStride, scratch, 1, call);
          for (int64_t r = 0; r < R; ++r)
            ASSERT_EQ(0, std::memcmp(ranged.data() + r * kOutStride, got.data() + r * kOutStride,
                                     kRows * sizeof(float)))
                << "row " << r << " in ranges";
        }
      }
}

}  // namespace
