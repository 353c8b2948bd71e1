// The latent attention projections (model/mla.h) against float64 sums over the dequantized rows of attn_kv_b:
// the absorbed queries q_latent[h] = W_k[h]^T q_nope[h] (project) and the expanded values W_v[h] o[h]
// (expand), every head at its own rows, for attn_kv_b in F32 and Q4_0, its copies made from the file's form
// and from a repacked form, on the best kernel target and the scalar one, for 1, 3 and 16 rows. A wrong
// head offset or a missing transpose moves a result by a large fraction of its size; the tolerances are
// small fractions of the sum of its terms' magnitudes (L1), stated at each check. And a row's result has
// the same bits alone as inside 16 rows.
//
// Files whose up-projection is split per head (attn_k_b, attn_v_b, as recent converters write them), written
// by synth from the same seed as joined ones: float files give the joined files' logits bit for bit (tiny V2
// and V3 style presets, the V3 one with an MTP layer), Q8_0 ones stay within the golden tolerance for
// quantized MoE files (their attn_k_b is quantized in blocks along the key width instead of the latent's),
// the split tensors are multiplied in place where they are float, both 3-D and flattened 2-D forms load, a
// file holding both forms uses the split one, and malformed files are refused with the tensor named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/kernels/matmul.h"
#include "tandem/kernels/repack.h"
#include "tandem/model/mla.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/model/synth.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"
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
        for (int64_t R : {1, 3, 5, 8, 16}) {
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
          // In 16-row ranges under one call number (the rows quantized once on the thread for all ranges,
          // after a product of another input on that thread): the same bits.
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

class MlaSplitFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new tandem::testing::TempDir("tandem-mla-split");
    ThreadPool pool(2);
    for (const char* preset : kPresets)
      for (const char* type : {"F32", "F16", "Q8_0"})
        for (bool split : {false, true}) {
          const model::SynthPreset& p = model::find_synth_preset(preset);
          model::write_synthetic_model(split ? model::with_split_kv_b(p) : p, model::find_file_type(type),
                                       path(preset, type, split), pool);
        }
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path(const std::string& preset, const std::string& type, bool split) {
    return dir_->file(preset + "-" + type + (split ? "-split" : "") + ".gguf");
  }
  static std::string file(const std::string& name) { return dir_->file(name); }
  static constexpr const char* kPresets[] = {"tiny-deepseek2-d64", "tiny-deepseek-v3-d64"};
  static tandem::testing::TempDir* dir_;
};
tandem::testing::TempDir* MlaSplitFiles::dir_ = nullptr;

// Every latent attention layer's weights, the MTP layers' included.
std::vector<const MlaWeights*> mla_layers(const model::Model& m) {
  std::vector<const MlaWeights*> out;
  for (const model::LayerWeights& l : m.weights().layers) out.push_back(&l.mla);
  for (const model::MtpWeights& l : m.weights().mtp) out.push_back(&l.block.mla);
  return out;
}

// All positions' logits of `tokens`, evaluated in one call.
std::vector<float> all_logits(const model::Model& m, const std::vector<int32_t>& tokens) {
  ThreadPool pool(2);
  model::SessionOptions o;
  o.n_ctx = 128;
  model::Session s(m, pool, o);
  const std::span<const float> out = s.eval(tokens, /*all_logits=*/true);
  return {out.begin(), out.end()};
}

std::vector<int32_t> some_tokens(int32_t vocab, size_t n) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Copies a GGUF file, letting `edit` write a tensor its own way (true) or leave it as it is (false).
void rewrite(const std::string& in_path, const std::string& out_path,
             const std::function<bool(const gguf::TensorInfo&, gguf::Writer&)>& edit) {
  const gguf::File in = gguf::File::open(in_path);
  gguf::Writer w;
  for (const auto& [key, value] : in.metadata())
    if (key != "general.alignment") w.add_value(key, value);
  for (const gguf::TensorInfo& t : in.tensors()) {
    if (edit(t, w)) continue;
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + std::max(1, t.n_dims)),
                 std::span<const uint8_t>(t.data, t.bytes));
  }
  w.write_file(out_path);
}

// The message of the tandem::Error that loading `path` throws ("" when it loads).
std::string load_error(const std::string& path) {
  try {
    model::Model::load(path).reset();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(MlaSplitFiles, FloatFilesGiveTheJoinedFilesBits) {
  for (const char* preset : kPresets)
    for (const char* type : {"F32", "F16"}) {
      SCOPED_TRACE(std::string(preset) + " " + type);
      auto joined = model::Model::load(path(preset, type, false));
      auto split = model::Model::load(path(preset, type, true));
      for (const MlaWeights* w : mla_layers(*joined)) EXPECT_FALSE(w->split());
      const std::vector<const MlaWeights*> layers = mla_layers(*split);
      EXPECT_EQ(layers.size(), mla_layers(*joined).size());
      for (const MlaWeights* w : layers) {
        ASSERT_TRUE(w->split());
        // Float split tensors are multiplied in place: no copies.
        EXPECT_EQ(w->wk_t.data, w->wk_b.data);
        EXPECT_EQ(w->wv.data, w->wv_b.data);
        EXPECT_EQ(model::mla_copy_bytes(split->config(), *w), 0u);
      }
      const std::vector<int32_t> tokens = some_tokens(static_cast<int32_t>(split->config().n_vocab), 24);
      const std::vector<float> want = all_logits(*joined, tokens), got = all_logits(*split, tokens);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    }
}

// Q8_0: attn_v_b's rows are attn_kv_b's value rows in the same blocks, but attn_kv_b's key rows are quantized
// in blocks along the latent and attn_k_b's along the key width, so the files hold different key weights.
// Held to the golden tolerance of quantized MoE files (golden/FORMAT.md): over the joined file's top 5 of
// each position, 95% of positions within 0.2 of its log-probabilities.
TEST_F(MlaSplitFiles, QuantizedFilesStayCloseToTheJoinedFiles) {
  for (const char* preset : kPresets) {
    SCOPED_TRACE(preset);
    auto joined = model::Model::load(path(preset, "Q8_0", false));
    auto split = model::Model::load(path(preset, "Q8_0", true));
    for (const MlaWeights* w : mla_layers(*split)) {
      ASSERT_TRUE(w->split());
      EXPECT_EQ(w->wk_t.type, DType::F16);
      EXPECT_EQ(w->wv.type, DType::F16);
      EXPECT_TRUE(model::mla_rounds_latent(*w));
    }
    const auto V = static_cast<size_t>(split->config().n_vocab);
    const std::vector<int32_t> tokens = some_tokens(static_cast<int32_t>(V), 40);
    const std::vector<float> want = all_logits(*joined, tokens), got = all_logits(*split, tokens);
    ASSERT_EQ(got.size(), want.size());
    const auto log_softmax = [V](const float* l) {
      double mx = l[0], sum = 0;
      for (size_t i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(l[i]));
      for (size_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(l[i]) - mx);
      std::vector<double> out(V);
      for (size_t i = 0; i < V; ++i) out[i] = static_cast<double>(l[i]) - mx - std::log(sum);
      return out;
    };
    size_t within = 0;
    double worst = 0;
    for (size_t r = 0; r < tokens.size(); ++r) {
      const std::vector<double> a = log_softmax(want.data() + r * V), b = log_softmax(got.data() + r * V);
      std::vector<size_t> ids(V);
      for (size_t i = 0; i < V; ++i) ids[i] = i;
      std::partial_sort(ids.begin(), ids.begin() + 5, ids.end(),
                        [&](size_t x, size_t y) { return a[x] > a[y]; });
      double diff = 0;
      for (size_t k = 0; k < 5; ++k) diff = std::max(diff, std::fabs(a[ids[k]] - b[ids[k]]));
      worst = std::max(worst, diff);
      within += diff <= 0.2 ? 1 : 0;
    }
    std::printf("%s Q8_0 split vs joined: %zu of %zu positions within 0.2, worst %.4f\n", preset, within,
                tokens.size(), worst);
    EXPECT_GE(static_cast<double>(within), 0.95 * static_cast<double>(tokens.size()));
  }
}

// The split tensors flattened to two dimensions ({cols, n_head * rows}, as some converters keep them) load
// as the 3-D ones do; a file holding attn_kv_b beside them multiplies the split ones and is not refused for
// an unused tensor.
TEST_F(MlaSplitFiles, FlattenedSplitTensorsAndBothFormsLoad) {
  const std::string preset = "tiny-deepseek-v3-d64";
  const gguf::File joined_file = gguf::File::open(path(preset, "F32", false));
  const std::string flat = file("flat.gguf"), both = file("both.gguf");
  rewrite(path(preset, "F32", true), flat, [](const gguf::TensorInfo& t, gguf::Writer& w) {
    if (!t.name.ends_with("attn_k_b.weight") && !t.name.ends_with("attn_v_b.weight")) return false;
    w.add_tensor(t.name, t.type, {t.ne[0], t.ne[1] * t.ne[2]}, std::span<const uint8_t>(t.data, t.bytes));
    return true;
  });
  rewrite(path(preset, "F32", true), both, [&](const gguf::TensorInfo& t, gguf::Writer& w) {
    if (!t.name.ends_with("attn_v_b.weight")) return false;
    w.add_tensor(t.name, t.type, {t.ne[0], t.ne[1], t.ne[2]}, std::span<const uint8_t>(t.data, t.bytes));
    // attn_kv_b with the values negated: a file that multiplied it would give other logits.
    const std::string kv_b =
        t.name.substr(0, t.name.size() - std::string("attn_v_b.weight").size()) + "attn_kv_b.weight";
    const gguf::TensorInfo* j = joined_file.tensor(kv_b);
    EXPECT_NE(j, nullptr);
    auto negated = std::make_shared<std::vector<float>>(reinterpret_cast<const float*>(j->data),
                                                        reinterpret_cast<const float*>(j->data + j->bytes));
    for (float& v : *negated) v = -v;
    w.add_tensor(kv_b, j->type, {j->ne[0], j->ne[1]}, [negated](const gguf::ByteSink& sink) {
      sink(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(negated->data()),
                                    negated->size() * sizeof(float)));
    });
    return true;
  });
  auto joined = model::Model::load(path(preset, "F32", false));
  const std::vector<int32_t> tokens = some_tokens(static_cast<int32_t>(joined->config().n_vocab), 16);
  const std::vector<float> want = all_logits(*joined, tokens);
  for (const std::string& p : {flat, both}) {
    SCOPED_TRACE(p);
    auto m = model::Model::load(p);
    for (const MlaWeights* w : mla_layers(*m)) ASSERT_TRUE(w->split());
    const std::vector<float> got = all_logits(*m, tokens);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  }
}

TEST_F(MlaSplitFiles, MalformedFilesAreRefusedNamingTheTensor) {
  const std::string split = path("tiny-deepseek2-d64", "F32", true);
  const std::string wrong_shape = file("wrong-shape.gguf"), neither = file("neither.gguf"),
                    keys_only = file("keys-only.gguf");
  // attn_k_b with the same bytes but its heads' rows regrouped: [32, 64, 2] for [32, 32, 4].
  rewrite(split, wrong_shape, [](const gguf::TensorInfo& t, gguf::Writer& w) {
    if (t.name != "blk.1.attn_k_b.weight") return false;
    w.add_tensor(t.name, t.type, {t.ne[0], t.ne[1] * 2, t.ne[2] / 2},
                 std::span<const uint8_t>(t.data, t.bytes));
    return true;
  });
  rewrite(split, neither, [](const gguf::TensorInfo& t, gguf::Writer&) {
    return t.name == "blk.2.attn_k_b.weight" || t.name == "blk.2.attn_v_b.weight";
  });
  rewrite(split, keys_only,
          [](const gguf::TensorInfo& t, gguf::Writer&) { return t.name == "blk.0.attn_v_b.weight"; });
  const std::string shape_error = load_error(wrong_shape);
  EXPECT_NE(shape_error.find("tensor 'blk.1.attn_k_b.weight' has shape"), std::string::npos) << shape_error;
  EXPECT_NE(shape_error.find("expected [32, 32, 4]"), std::string::npos) << shape_error;
  const std::string neither_error = load_error(neither);
  EXPECT_NE(neither_error.find("lacks tensor 'blk.2.attn_kv_b.weight'"), std::string::npos) << neither_error;
  EXPECT_NE(neither_error.find("'blk.2.attn_k_b.weight' and 'blk.2.attn_v_b.weight'"), std::string::npos)
      << neither_error;
  const std::string keys_error = load_error(keys_only);
  EXPECT_NE(keys_error.find("holds tensor 'blk.0.attn_k_b.weight' but not 'blk.0.attn_v_b.weight'"),
            std::string::npos)
      << keys_error;
}

// `tandem synth --mla-split` is for deepseek2 presets only.
TEST(MlaSplitSynth, OtherArchitecturesAreRefused) {
  EXPECT_THROW(model::with_split_kv_b(model::find_synth_preset("tiny-qwen2moe-d64")), Error);
  EXPECT_TRUE(model::with_split_kv_b(model::find_synth_preset("tiny-deepseek2-d64")).mla.split_kv_b);
}

}  // namespace
