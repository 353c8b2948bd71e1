// The graph contract: verify windows and mixed groups give the same bits as one-by-one decoding, rollback is
// exact, capture delivers every layer in order.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tandem/model/graph.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace {

using tandem::cache::KvCache;
using tandem::cache::KvType;
using tandem::model::Graph;
using tandem::model::GraphOptions;
using tandem::model::Model;

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 429, 400, 266, 300, 311, 401, 287};
const std::vector<int32_t> kNext = {395, 379, 288, 268, 383, 267, 427, 275, 421, 281, 390, 302, 266, 301};

struct Fixture {
  explicit Fixture(const std::string& rel) : model(Model::load(tandem::testing::shared_path(rel))), pool(2) {}
  std::unique_ptr<Model> model;
  tandem::ThreadPool pool;
};

// Logits of kNext decoded one row at a time after kPrompt.
std::vector<float> decode_one_by_one(Graph& g, KvCache& cache) {
  const size_t V = static_cast<size_t>(g.n_vocab());
  std::vector<float> out(kNext.size() * V);
  g.prompt(kPrompt, cache, nullptr);
  for (size_t i = 0; i < kNext.size(); ++i) {
    KvCache* c[] = {&cache};
    g.decode(std::span<const int32_t>(&kNext[i], 1), c, out.data() + i * V);
  }
  return out;
}

class GraphModels : public ::testing::TestWithParam<std::string> {};

TEST_P(GraphModels, VerifyWindowEqualsOneByOne) {
  Fixture f(GetParam());
  for (KvType kv : {KvType::kF16, KvType::kF32}) {
    Graph g(*f.model, f.pool, GraphOptions{64, 16});
    KvCache a(f.model->config().kv_geometry(), 128, kv), b(f.model->config().kv_geometry(), 128, kv);
    const std::vector<float> want = decode_one_by_one(g, a);
    g.prompt(kPrompt, b, nullptr);
    std::vector<float> got(want.size());
    g.verify(kNext, b, got.data());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
        << GetParam() << ": a verify window's rows differ from one-by-one decoding";
  }
}

TEST_P(GraphModels, RollbackIsExact) {
  Fixture f(GetParam());
  const size_t V = static_cast<size_t>(f.model->config().n_vocab);
  Graph g(*f.model, f.pool, GraphOptions{64, 16});
  KvCache a(f.model->config().kv_geometry(), 128, KvType::kF16),
      b(f.model->config().kv_geometry(), 128, KvType::kF16);
  const std::vector<float> want = decode_one_by_one(g, a);
  // Decode a wrong continuation, roll back, then decode the real one.
  g.prompt(kPrompt, b, nullptr);
  std::vector<float> scratch(16 * V), got(kNext.size() * V);
  const std::vector<int32_t> wrong = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  g.verify(wrong, b, scratch.data());
  b.truncate(static_cast<int64_t>(kPrompt.size()));
  g.verify(std::span<const int32_t>(kNext).first(5), b, got.data());
  g.verify(std::span<const int32_t>(kNext).subspan(5, 3), b, scratch.data());
  b.truncate(static_cast<int64_t>(kPrompt.size() + 5));
  g.verify(std::span<const int32_t>(kNext).subspan(5), b, got.data() + 5 * V);
  ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << GetParam();
}

TEST_P(GraphModels, MixedGroupsEqualSeparateRuns) {
  Fixture f(GetParam());
  const size_t V = static_cast<size_t>(f.model->config().n_vocab);
  Graph g(*f.model, f.pool, GraphOptions{64, 16});
  const auto cfg = f.model->config().kv_geometry();
  // Separate: sequence A decodes kNext[0]; sequence B verifies kNext[0..4); sequence C prompts kPrompt.
  KvCache a1(cfg, 128, KvType::kF16), b1(cfg, 128, KvType::kF16), c1(cfg, 128, KvType::kF16);
  g.prompt(kPrompt, a1, nullptr);
  g.prompt(std::span<const int32_t>(kPrompt).first(7), b1, nullptr);
  std::vector<float> sep(6 * V);
  KvCache* ca[] = {&a1};
  g.decode(std::span<const int32_t>(kNext).first(1), ca, sep.data());
  g.verify(std::span<const int32_t>(kNext).first(4), b1, sep.data() + V);
  g.prompt(kPrompt, c1, sep.data() + 5 * V);
  // Mixed: the same three groups in one forward.
  KvCache a2(cfg, 128, KvType::kF16), b2(cfg, 128, KvType::kF16), c2(cfg, 128, KvType::kF16);
  g.prompt(kPrompt, a2, nullptr);
  g.prompt(std::span<const int32_t>(kPrompt).first(7), b2, nullptr);
  KvCache* pa[] = {&a2};
  KvCache* pb[] = {&b2};
  KvCache* pc[] = {&c2};
  using tandem::model::Group;
  using tandem::model::Phase;
  std::vector<Group> groups = {
      {Phase::kDecode, std::span<const int32_t>(kNext).first(1), pa, nullptr, nullptr},
      {Phase::kVerify, std::span<const int32_t>(kNext).first(4), pb, nullptr, nullptr},
      {Phase::kPrompt, kPrompt, pc, nullptr, nullptr},
  };
  std::vector<float> mixed(6 * V);
  ASSERT_EQ(g.mixed(groups, mixed.data()), 6);
  ASSERT_EQ(0, std::memcmp(sep.data(), mixed.data(), sep.size() * sizeof(float))) << GetParam();
}

TEST_P(GraphModels, CaptureDeliversEveryLayerInOrder) {
  Fixture f(GetParam());
  const auto& cfg = f.model->config();
  Graph g(*f.model, f.pool, GraphOptions{64, 16});
  KvCache cache(cfg.kv_geometry(), 128, KvType::kF16);
  g.prompt(kPrompt, cache, nullptr);
  std::vector<int64_t> seen;
  tandem::model::CaptureFn cap = [&](int64_t layer, const float* hidden, int64_t rows) {
    seen.push_back(layer);
    EXPECT_EQ(rows, 5);
    EXPECT_NE(hidden, nullptr);
  };
  std::vector<float> logits(5 * static_cast<size_t>(cfg.n_vocab));
  g.verify(std::span<const int32_t>(kNext).first(5), cache, logits.data(), &cap);
  ASSERT_EQ(static_cast<int64_t>(seen.size()), cfg.n_layer + 1);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], static_cast<int64_t>(i));

  // Taps keep only the declared layers, and the post-final-norm tap feeds the head to the same logits.
  tandem::model::LayerTaps taps({1, cfg.n_layer}, cfg.n_embd);
  cache.truncate(static_cast<int64_t>(kPrompt.size()));
  std::vector<float> again(logits.size()), from_head(logits.size());
  g.verify(std::span<const int32_t>(kNext).first(5), cache, again.data(), &taps.capture());
  EXPECT_EQ(taps.rows(), 5);
  g.logits(taps.hidden(1).data(), 5, from_head.data());
  EXPECT_EQ(0, std::memcmp(again.data(), from_head.data(), again.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(again.data(), logits.data(), again.size() * sizeof(float)));
}

// A verify window wider than the graph declares is refused with the option to raise, before the cache moves.
TEST_P(GraphModels, VerifyWiderThanDeclaredIsRefused) {
  Fixture f(GetParam());
  Graph g(*f.model, f.pool, GraphOptions{64, 4});
  KvCache cache(f.model->config().kv_geometry(), 128, KvType::kF16);
  g.prompt(kPrompt, cache, nullptr);
  std::vector<float> logits(5 * static_cast<size_t>(g.n_vocab()));
  try {
    g.verify(std::span<const int32_t>(kNext).first(5), cache, logits.data());
    FAIL() << "a 5-row window passed a graph declaring 4";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_verify"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.length(), static_cast<int64_t>(kPrompt.size()));
  g.verify(std::span<const int32_t>(kNext).first(4), cache, logits.data());
  EXPECT_EQ(cache.length(), static_cast<int64_t>(kPrompt.size() + 4));
}

INSTANTIATE_TEST_SUITE_P(Models, GraphModels,
                         ::testing::Values("models/stories260K.gguf",
                                           "models/synth/synth-gemma2-d128-Q8_0.gguf",
                                           "models/synth/synth-qwen2-d64-Q8_0.gguf",
                                           "models/synth/synth-llama-d256-Q4_K_M.gguf"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param.substr(param_info.param.rfind('/') + 1);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
