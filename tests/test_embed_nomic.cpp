// nomic-bert encoders (rotary positions, fused q/k/v, SwiGLU, no projection biases): a synthetic checkpoint's
// embeddings against a double-precision reference forward written from the architecture's definition, batched
// equal to alone, and a Q8_0 copy (its fused matrix split and repacked) close to the f32 one.
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "tandem/model/encoder.h"
#include "tandem/model/synth.h"
#include "test_util.h"

namespace {

using tandem::model::Config;
using tandem::model::Embedder;
using tandem::model::Model;

using Vec = std::vector<double>;

// y = W x for an F32 matrix view ([rows][cols]).
Vec matvec(const tandem::MatrixView& w, const Vec& x) {
  EXPECT_EQ(w.type, tandem::DType::F32);
  Vec y(static_cast<size_t>(w.rows));
  for (int64_t o = 0; o < w.rows; ++o) {
    const auto* row = reinterpret_cast<const float*>(w.row(o));
    double s = 0;
    for (int64_t i = 0; i < w.cols; ++i) s += static_cast<double>(row[i]) * x[static_cast<size_t>(i)];
    y[static_cast<size_t>(o)] = s;
  }
  return y;
}

void layer_norm(Vec& x, const tandem::VectorView& w, const tandem::VectorView& b, double eps) {
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= static_cast<double>(x.size());
  for (double v : x) var += (v - mean) * (v - mean);
  var /= static_cast<double>(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = (x[i] - mean) / std::sqrt(var + eps) * w.data[i] + b.data[i];
}

// NeoX rotary: pair (i, i + n_rot / 2) of each head turned by pos * base^(-2i / n_rot).
void rotate(Vec& x, int64_t n_head, int64_t head_dim, int64_t n_rot, double base, int64_t pos) {
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      const double theta = static_cast<double>(pos) * std::pow(base, -2.0 * static_cast<double>(i) / n_rot);
      double& a = x[static_cast<size_t>(h * head_dim + i)];
      double& b = x[static_cast<size_t>(h * head_dim + i + n_rot / 2)];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(theta) - b0 * std::sin(theta);
      b = a0 * std::sin(theta) + b0 * std::cos(theta);
    }
}

// The mean-pooled, L2-normalised embedding of one sequence, from the architecture's definition.
Vec reference_embedding(const Model& model, const std::vector<int32_t>& ids) {
  const Config& c = model.config();
  const auto& w = model.weights();
  const auto n = static_cast<int64_t>(ids.size());
  const auto E = static_cast<size_t>(c.n_embd);
  std::vector<Vec> x(static_cast<size_t>(n), Vec(E));
  for (int64_t t = 0; t < n; ++t) {
    const auto* tok = reinterpret_cast<const float*>(w.tok_embd.row(ids[static_cast<size_t>(t)]));
    const auto* type = reinterpret_cast<const float*>(w.type_embd.row(0));
    for (size_t i = 0; i < E; ++i) x[static_cast<size_t>(t)][i] = static_cast<double>(tok[i]) + type[i];
    layer_norm(x[static_cast<size_t>(t)], w.embd_norm, w.embd_norm_b, c.norm_eps);
  }
  const int64_t H = c.n_head, hd = c.head_dim;
  for (const auto& l : w.layers) {
    std::vector<Vec> q, k, v;
    for (int64_t t = 0; t < n; ++t) {
      q.push_back(matvec(l.wq, x[static_cast<size_t>(t)]));
      k.push_back(matvec(l.wk, x[static_cast<size_t>(t)]));
      v.push_back(matvec(l.wv, x[static_cast<size_t>(t)]));
      rotate(q.back(), H, hd, c.n_rot, c.rope_base, t);
      rotate(k.back(), H, hd, c.n_rot, c.rope_base, t);
    }
    for (int64_t t = 0; t < n; ++t) {
      Vec att(static_cast<size_t>(H * hd), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        Vec s(static_cast<size_t>(n));
        double top = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i)
            d += q[static_cast<size_t>(t)][static_cast<size_t>(h * hd + i)] *
                 k[static_cast<size_t>(j)][static_cast<size_t>(h * hd + i)];
          s[static_cast<size_t>(j)] = d / std::sqrt(static_cast<double>(hd));
          top = std::max(top, s[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - top));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < hd; ++i)
            att[static_cast<size_t>(h * hd + i)] +=
                s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(j)][static_cast<size_t>(h * hd + i)];
      }
      Vec o = matvec(l.wo, att);
      Vec& xt = x[static_cast<size_t>(t)];
      for (size_t i = 0; i < E; ++i) xt[i] += o[i];
      layer_norm(xt, l.attn_out_norm, l.attn_out_norm_b, c.norm_eps);
      Vec g = matvec(l.w_gate, xt), u = matvec(l.w_up, xt);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      Vec d = matvec(l.w_down, g);
      for (size_t i = 0; i < E; ++i) xt[i] += d[i];
      layer_norm(xt, l.layer_out_norm, l.layer_out_norm_b, c.norm_eps);
    }
  }
  Vec pooled(E, 0.0);
  for (const Vec& xt : x)
    for (size_t i = 0; i < E; ++i) pooled[i] += xt[i] / static_cast<double>(n);
  double norm = 0;
  for (double p : pooled) norm += p * p;
  for (double& p : pooled) p /= std::sqrt(norm);
  return pooled;
}

double cosine(const float* a, const Vec& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    ab += a[i] * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

class NomicBert : public ::testing::Test {
 protected:
  void SetUp() override {
    tandem::ThreadPool pool(1);
    const auto& preset = tandem::model::find_synth_preset("tiny-nomic-bert-d64");
    for (const char* type : {"F32", "Q8_0"})
      tandem::model::write_synthetic_model(preset, tandem::model::find_file_type(type), dir_.file(type),
                                           pool);
    f32_ = Model::load(dir_.file("F32"));
    // Lengths 1 to 9 and one of 40; the ids spread over the vocabulary.
    for (int64_t len : {1, 2, 3, 5, 8, 9, 40}) {
      std::vector<int32_t> ids;
      for (int64_t t = 0; t < len; ++t) ids.push_back(static_cast<int32_t>((len * 37 + t * 101) % 384));
      seqs_.push_back(ids);
    }
  }
  tandem::testing::TempDir dir_{"nomic"};
  std::unique_ptr<Model> f32_;
  std::vector<std::vector<int32_t>> seqs_;
};

TEST_F(NomicBert, ReadsTheVariantFromTheCheckpoint) {
  const Config& c = f32_->config();
  EXPECT_TRUE(c.encoder);
  EXPECT_EQ(c.pooling, tandem::model::Pooling::kMean);
  EXPECT_EQ(c.rope_layout, tandem::model::RopeLayout::kNeoX);
  EXPECT_FLOAT_EQ(c.rope_base, 1000.0f);
  EXPECT_EQ(c.n_rot, c.head_dim);
  const auto& w = f32_->weights();
  EXPECT_TRUE(w.pos_embd.empty());
  EXPECT_FALSE(w.layers[0].w_gate.empty());
  EXPECT_TRUE(w.layers[0].bq.empty());
  // The fused projection's rows, split: q, then k, then v.
  EXPECT_EQ(w.layers[0].wk.data, w.layers[0].wq.data + c.q_dim() * w.layers[0].wq.row_bytes);
  EXPECT_EQ(w.layers[0].wv.data, w.layers[0].wk.data + c.kv_dim() * w.layers[0].wk.row_bytes);
}

TEST_F(NomicBert, MatchesTheReferenceForwardAndBatchesInvisibly) {
  tandem::ThreadPool pool(2);
  Embedder embedder(*f32_, pool);
  const int64_t D = embedder.dim();
  const std::vector<std::span<const int32_t>> spans(seqs_.begin(), seqs_.end());
  std::vector<float> together(seqs_.size() * static_cast<size_t>(D));
  embedder.embed(spans, {}, together.data());
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const Vec want = reference_embedding(*f32_, seqs_[s]);
    const float* got = together.data() + s * static_cast<size_t>(D);
    EXPECT_GE(cosine(got, want), 0.99999) << "sequence " << s;
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(got[d], want[static_cast<size_t>(d)], 2e-4) << s << "," << d;
    std::vector<float> alone(static_cast<size_t>(D));
    const std::span<const int32_t> one[] = {seqs_[s]};
    embedder.embed(one, {}, alone.data());
    for (int64_t d = 0; d < D; ++d) ASSERT_EQ(alone[static_cast<size_t>(d)], got[d]) << s << "," << d;
  }
}

TEST_F(NomicBert, QuantizedCopyStaysClose) {
  auto q8 = Model::load(dir_.file("Q8_0"));
  tandem::ThreadPool pool(2);
  Embedder a(*f32_, pool), b(*q8, pool);
  const int64_t D = a.dim();
  const std::vector<std::span<const int32_t>> spans(seqs_.begin(), seqs_.end());
  std::vector<float> ea(seqs_.size() * static_cast<size_t>(D)), eb(ea.size());
  a.embed(spans, {}, ea.data());
  b.embed(spans, {}, eb.data());
  for (size_t s = 0; s < seqs_.size(); ++s) {
    Vec ref(ea.begin() + static_cast<std::ptrdiff_t>(s * static_cast<size_t>(D)),
            ea.begin() + static_cast<std::ptrdiff_t>((s + 1) * static_cast<size_t>(D)));
    EXPECT_GE(cosine(eb.data() + s * static_cast<size_t>(D), ref), 0.995) << "sequence " << s;
  }
}

}  // namespace
