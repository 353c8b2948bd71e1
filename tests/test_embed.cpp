// Pooled embeddings: the bert encoder against the reference's pooled embeddings (../shared/golden FORMAT.md
// "Pooled embeddings"), the non-causal attention kernel against its scalar reference, batching that never
// changes a sequence's result, pooling choices, and decoder embeddings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "tandem/kernels/full_attention.h"
#include "tandem/kernels/matmul.h"
#include "tandem/kernels/ops.h"
#include "tandem/model/encoder.h"
#include "tandem/model/forward.h"
#include "tandem/model/synth.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace {

using tandem::model::Embedder;
using tandem::model::EmbedOptions;
using tandem::model::Model;
using tandem::model::Pooling;

const char* kBert = "models/synth/synth-bert-d64-F16.gguf";
const char* kBertGolden = "golden/next/synth-bert-d64-F16.embeddings.public.jsonl";

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

double cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

std::vector<std::span<const int32_t>> spans(const std::vector<std::vector<int32_t>>& seqs) {
  return {seqs.begin(), seqs.end()};
}

class BertGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Model::load(tandem::testing::shared_path(kBert));
    tok_ = tandem::tokenizer::Tokenizer::from_gguf(model_->file());
    for (const auto& g : read_jsonl(tandem::testing::shared_path(kBertGolden))) golden_.push_back(g);
    ASSERT_FALSE(golden_.empty());
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<tandem::tokenizer::Tokenizer> tok_;
  std::vector<nlohmann::json> golden_;
};

TEST_F(BertGolden, ReadsTheEncoderConfig) {
  const auto& c = model_->config();
  EXPECT_TRUE(c.encoder);
  EXPECT_EQ(c.pooling, Pooling::kMean);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-12f);
}

// Every sentence's ids exactly and its embedding to cosine >= 0.9999, the sentences embedded together (one
// forward) and each alone.
TEST_F(BertGolden, MatchesReferenceEmbeddings) {
  tandem::ThreadPool pool(2);
  Embedder embedder(*model_, pool);
  EXPECT_EQ(embedder.pooling(), Pooling::kMean);
  std::vector<std::vector<int32_t>> ids;
  for (const auto& g : golden_) {
    ids.push_back(tok_->encode(g["text"].get<std::string>(), true, true));
    EXPECT_EQ(ids.back(), g["prompt_ids"].get<std::vector<int32_t>>()) << g["text"];
  }
  const int64_t D = embedder.dim();
  std::vector<float> together(ids.size() * static_cast<size_t>(D));
  embedder.embed(spans(ids), EmbedOptions{}, together.data());
  for (size_t s = 0; s < ids.size(); ++s) {
    const auto want = golden_[s]["embedding"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(want.size()), D);
    const float* got = together.data() + s * static_cast<size_t>(D);
    EXPECT_GE(cosine(got, want.data(), D), 0.9999) << golden_[s]["text"];
    double norm = 0;
    for (int64_t d = 0; d < D; ++d) norm += static_cast<double>(got[d]) * got[d];
    EXPECT_NEAR(norm, 1.0, 1e-5);
    // Alone: the same bits (rows of other sequences in the same matrix products change nothing).
    std::vector<float> alone(static_cast<size_t>(D));
    const std::span<const int32_t> one[] = {ids[s]};
    embedder.embed(one, EmbedOptions{}, alone.data());
    for (int64_t d = 0; d < D; ++d) ASSERT_EQ(alone[static_cast<size_t>(d)], got[d]) << "dim " << d;
  }
}

// The encoder's float matrix products sum in an order that depends on the width alone (float_gemm.h): a
// sentence keeps its embedding's bits wherever its rows start in a batch (after fillers of 0 to 13 rows, so
// they meet every offset within a tile of activation rows), with sentences after it, and under 1, 2 or 3
// threads.
TEST_F(BertGolden, SentenceKeepsItsBitsAtAnyRowOfABatch) {
  std::vector<std::vector<int32_t>> ids;
  for (const auto& g : golden_) ids.push_back(tok_->encode(g["text"].get<std::string>(), true, true));
  ASSERT_GE(ids.size(), 2u);
  std::vector<int32_t> filler;
  while (filler.size() < 13) filler.insert(filler.end(), ids[1].begin(), ids[1].end());
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    tandem::ThreadPool pool(threads);
    Embedder embedder(*model_, pool);
    const int64_t D = embedder.dim();
    std::vector<float> alone(static_cast<size_t>(D));
    const std::span<const int32_t> one[] = {ids[0]};
    embedder.embed(one, EmbedOptions{}, alone.data());
    if (first.empty()) first = alone;
    ASSERT_EQ(0, std::memcmp(first.data(), alone.data(), alone.size() * sizeof(float)))
        << threads << " threads";
    for (size_t pad = 0; pad <= 13; ++pad) {
      std::vector<std::span<const int32_t>> batch;
      if (pad > 0) batch.emplace_back(filler.data(), pad);
      batch.emplace_back(ids[0]);
      batch.emplace_back(ids[1]);
      std::vector<float> got(batch.size() * static_cast<size_t>(D));
      embedder.embed(batch, EmbedOptions{}, got.data());
      const float* mine = got.data() + (pad > 0 ? D : 0);
      ASSERT_EQ(0, std::memcmp(mine, alone.data(), alone.size() * sizeof(float)))
          << threads << " threads, after " << pad << " rows";
    }
  }
}

// CLS and last pooling pick one row, and --no-normalize leaves the length alone: checked against the
// unnormalised mean of the same forward and against each other.
TEST_F(BertGolden, PoolingChoices) {
  tandem::ThreadPool pool(1);
  Embedder embedder(*model_, pool);
  const std::vector<std::vector<int32_t>> ids = {tok_->encode("A dog ran across the field.", true, true)};
  const int64_t D = embedder.dim();
  std::vector<float> mean(static_cast<size_t>(D)), cls(mean), last(mean), mean_norm(mean);
  embedder.embed(spans(ids), {Pooling::kMean, false}, mean.data());
  embedder.embed(spans(ids), {Pooling::kMean, true}, mean_norm.data());
  embedder.embed(spans(ids), {Pooling::kCls, false}, cls.data());
  embedder.embed(spans(ids), {Pooling::kLast, false}, last.data());
  double norm = 0;
  for (float x : mean) norm += static_cast<double>(x) * x;
  EXPECT_GT(std::abs(std::sqrt(norm) - 1.0), 0.01) << "an unnormalised mean of unit-free hidden states";
  for (int64_t d = 0; d < D; ++d)
    EXPECT_NEAR(mean_norm[static_cast<size_t>(d)], mean[static_cast<size_t>(d)] / std::sqrt(norm), 1e-6);
  EXPECT_LT(cosine(cls.data(), last.data(), D), 0.999);
  EXPECT_LT(cosine(cls.data(), mean.data(), D), 0.999);
}

TEST_F(BertGolden, RefusesBadInputs) {
  tandem::ThreadPool pool(1);
  Embedder embedder(*model_, pool);
  std::vector<float> out(static_cast<size_t>(embedder.dim()) * 2);
  const std::vector<std::vector<int32_t>> empty = {{101, 102}, {}};
  EXPECT_THROW(embedder.embed(spans(empty), {}, out.data()), tandem::Error);
  const std::vector<std::vector<int32_t>> long_one = {std::vector<int32_t>(513, 1996)};
  try {
    embedder.embed(spans(long_one), {}, out.data());
    ADD_FAILURE() << "a sequence over the context was accepted";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
  }
  const std::vector<std::vector<int32_t>> bad_id = {{101, 40000, 102}};
  EXPECT_THROW(embedder.embed(spans(bad_id), {}, out.data()), tandem::Error);
}

// The decoder forward refuses an encoder with a message that says what to do instead.
TEST_F(BertGolden, DecoderForwardRefusesEncoder) {
  tandem::ThreadPool pool(1);
  try {
    tandem::model::Forward forward(*model_, pool, 8);
    ADD_FAILURE() << "an encoder was accepted by the decoder forward";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("embed"), std::string::npos) << e.what();
  }
}

// `tandem embed`: one array per input line in order, equal to the library's embeddings, for plain lines and
// --jsonl; a bad --jsonl line and an over-long line are refused with status 1 and a message naming the line.
TEST_F(BertGolden, CommandLine) {
  const std::string tandem =
      std::string(TANDEM_BINARY) + " embed -t 1 -m " + tandem::testing::shared_path(kBert);
  const std::string dir = ::testing::TempDir();
  {
    std::ofstream plain(dir + "/embed_plain.txt"), jsonl(dir + "/embed.jsonl");
    for (const auto& g : golden_) {
      plain << g["text"].get<std::string>() << "\n";
      jsonl << nlohmann::json(g["text"]).dump() << "\n";
    }
  }
  for (const std::string& args : {" -f " + dir + "/embed_plain.txt", " --jsonl -f " + dir + "/embed.jsonl"}) {
    const auto [out, status] = tandem::testing::run_command(tandem + args);
    ASSERT_EQ(status, 0) << args;
    std::istringstream lines(out);
    std::string line;
    size_t n = 0;
    for (; std::getline(lines, line); ++n) {
      ASSERT_LT(n, golden_.size());
      const auto got = nlohmann::json::parse(line).get<std::vector<float>>();
      const auto want = golden_[n]["embedding"].get<std::vector<float>>();
      ASSERT_EQ(got.size(), want.size());
      EXPECT_GE(cosine(got.data(), want.data(), static_cast<int64_t>(got.size())), 0.9999) << n;
    }
    EXPECT_EQ(n, golden_.size()) << args;
  }
  {
    std::ofstream bad(dir + "/embed_bad.jsonl");
    bad << "\"fine\"\n42\n";
  }
  const auto [bad_out, bad_status] =
      tandem::testing::run_command(tandem + " --jsonl -f " + dir + "/embed_bad.jsonl 2>&1");
  EXPECT_EQ(bad_status, 1);
  EXPECT_NE(bad_out.find("line 2"), std::string::npos) << bad_out;
  std::string long_text;
  for (int i = 0; i < 600; ++i) long_text += "cat ";
  const auto [long_out, long_status] = tandem::testing::run_command(tandem + " -p '" + long_text + "' 2>&1");
  EXPECT_EQ(long_status, 1);
  EXPECT_NE(long_out.find("512"), std::string::npos) << long_out;
}

// Decoder embeddings are the post-final-norm hidden states: unnormalised last-token pooling times the
// output head gives the session's last logits; causality makes CLS pooling of a sequence the last-token
// pooling of its first token, and the mean the average of the prefixes' last tokens.
TEST(DecoderEmbeddings, PoolPostNormHiddenStates) {
  auto model = Model::load(tandem::testing::shared_path("models/stories260K.gguf"));
  tandem::ThreadPool pool(1);
  Embedder embedder(*model, pool);
  EXPECT_EQ(embedder.pooling(), Pooling::kLast);
  const int64_t D = embedder.dim();
  const std::vector<std::vector<int32_t>> seq = {{1, 403, 407, 261}};
  std::vector<float> last(static_cast<size_t>(D)), cls(last), mean(last), normed(last);
  embedder.embed(spans(seq), {Pooling::kLast, false}, last.data());
  embedder.embed(spans(seq), {Pooling::kCls, false}, cls.data());
  embedder.embed(spans(seq), {Pooling::kMean, false}, mean.data());
  embedder.embed(spans(seq), {}, normed.data());

  tandem::model::Session session(*model, pool, {});
  const auto logits = session.eval(seq[0]);
  std::vector<float> head(logits.size());
  tandem::kernels::matmul_reference(model->weights().output, last.data(), 1, head.data());
  for (size_t i = 0; i < head.size(); ++i) ASSERT_NEAR(head[i], logits[i], 1e-3) << "logit " << i;

  std::vector<float> mean_of_prefixes(static_cast<size_t>(D), 0.0f), prefix(static_cast<size_t>(D));
  for (size_t n = 1; n <= seq[0].size(); ++n) {
    const std::vector<std::vector<int32_t>> p = {
        std::vector<int32_t>(seq[0].begin(), seq[0].begin() + static_cast<std::ptrdiff_t>(n))};
    embedder.embed(spans(p), {Pooling::kLast, false}, prefix.data());
    if (n == 1) {
      for (int64_t d = 0; d < D; ++d)
        EXPECT_NEAR(cls[static_cast<size_t>(d)], prefix[static_cast<size_t>(d)], 1e-5);
    }
    for (int64_t d = 0; d < D; ++d)
      mean_of_prefixes[static_cast<size_t>(d)] +=
          prefix[static_cast<size_t>(d)] / static_cast<float>(seq[0].size());
  }
  for (int64_t d = 0; d < D; ++d)
    EXPECT_NEAR(mean[static_cast<size_t>(d)], mean_of_prefixes[static_cast<size_t>(d)], 1e-4);
  EXPECT_GT(cosine(last.data(), normed.data(), D), 0.99999);
}

// `tandem synth --preset bge-small` writes a bert encoder of bge-small's shapes that loads and embeds: CLS
// pooling, unit-length vectors, and a sequence's embedding the same bits alone as beside others.
TEST(SynthBgeSmall, LoadsAndEmbeds) {
  const std::string path = ::testing::TempDir() + "/" + std::to_string(getpid()) + "-bge-small-Q8_0.gguf";
  tandem::ThreadPool pool(2);
  tandem::model::write_synthetic_model(tandem::model::find_synth_preset("bge-small"),
                                       tandem::model::find_file_type("Q8_0"), path, pool);
  auto model = Model::load(path);
  const auto& c = model->config();
  EXPECT_TRUE(c.encoder);
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.n_embd, 384);
  EXPECT_EQ(c.n_head, 12);
  EXPECT_EQ(c.n_vocab, 30522);
  EXPECT_EQ(c.pooling, Pooling::kCls);
  Embedder embedder(*model, pool);
  const std::vector<std::vector<int32_t>> seqs = {{101, 2000, 3000, 102}, {101, 7, 8, 9, 10, 11, 102}};
  std::vector<float> both(2 * 384), alone(384);
  embedder.embed(spans(seqs), {}, both.data());
  const std::span<const int32_t> second[] = {seqs[1]};
  embedder.embed(second, {}, alone.data());
  double norm = 0;
  for (size_t d = 0; d < 384; ++d) {
    ASSERT_EQ(alone[d], both[384 + d]);
    norm += static_cast<double>(alone[d]) * alone[d];
  }
  EXPECT_NEAR(norm, 1.0, 1e-5);
  EXPECT_LT(cosine(both.data(), both.data() + 384, 384), 0.999);
  std::remove(path.c_str());
}

// Non-causal attention of one sequence against the scalar reference, on every Highway target, for lengths
// around the query block and grouped key/value heads.
TEST(FullAttention, MatchesReference) {
  for (const int64_t n : {1, 3, 8, 9, 31}) {
    for (const int64_t n_head_kv : {4, 2}) {
      tandem::kernels::FullAttentionShape s;
      s.n_head = 4;
      s.n_head_kv = n_head_kv;
      s.head_dim = 24;
      s.head_dim_v = 20;
      s.q_stride = s.n_head * s.head_dim + 3;  // padding between rows
      s.k_stride = n_head_kv * s.head_dim + 1;
      s.v_stride = n_head_kv * s.head_dim_v + 5;
      s.out_stride = s.n_head * s.head_dim_v + 2;
      s.scale = 1.0f / std::sqrt(24.0f);
      const auto q = tandem::testing::normal_floats(n * s.q_stride, 1);
      const auto k = tandem::testing::normal_floats(n * s.k_stride, 2);
      const auto v = tandem::testing::normal_floats(n * s.v_stride, 3);
      std::vector<float> want(static_cast<size_t>(n * s.out_stride)), got(want.size());
      tandem::kernels::attend_full_reference(q.data(), k.data(), v.data(), n, s, want.data());
      tandem::testing::for_each_hwy_target([&] {
        std::vector<float> scratch(static_cast<size_t>(tandem::kernels::full_attention_scratch(s, n)));
        tandem::kernels::attend_full(q.data(), k.data(), v.data(), n, s, 0, n_head_kv, scratch.data(),
                                     got.data());
        for (int64_t i = 0; i < n; ++i)
          for (int64_t d = 0; d < s.n_head * s.head_dim_v; ++d)
            ASSERT_NEAR(got[static_cast<size_t>(i * s.out_stride + d)],
                        want[static_cast<size_t>(i * s.out_stride + d)], 1e-5)
                << "n " << n << " row " << i << " element " << d;
      });
    }
  }
}

// The vectorized GELU against the scalar one, on every Highway target, over lengths with vector tails and
// arguments from deep negative (where it is 0) to large positive (where it is x).
TEST(Gelu, MatchesScalarReference) {
  for (const int64_t n : {1, 7, 16, 37, 1536}) {
    auto x = tandem::testing::normal_floats(n, 9);
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] *= 4.0f;
    x[0] = -60.0f;
    if (n > 1) x[1] = 30.0f;
    auto want = x;
    tandem::kernels::gelu_reference(want.data(), n);
    tandem::testing::for_each_hwy_target([&] {
      auto got = x;
      tandem::kernels::gelu(got.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)],
                    2e-6f * (1.0f + std::abs(want[static_cast<size_t>(i)])))
            << "x = " << x[static_cast<size_t>(i)];
    });
  }
}

TEST(LayerNorm, ZeroMeanUnitVarianceThenAffine) {
  const auto x = tandem::testing::normal_floats(37, 5);
  std::vector<float> w(37), b(37), y(37);
  for (int i = 0; i < 37; ++i)
    w[static_cast<size_t>(i)] = 0.5f + 0.01f * static_cast<float>(i),
    b[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i % 3);
  tandem::kernels::layer_norm(x.data(), w.data(), b.data(), y.data(), 37, 1e-12f);
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= 37;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= 37;
  for (size_t i = 0; i < 37; ++i) EXPECT_NEAR(y[i], (x[i] - mean) / std::sqrt(var) * w[i] + b[i], 1e-5);
}

}  // namespace
