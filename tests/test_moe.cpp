// Mixture-of-experts layers: the router's selection and weights (softmax and sigmoid scores, the V3
// selection bias, normalised and scaled weights, group-limited selection, ties), the qwen2moe checkpoint's
// configuration, and rows that get the same bits alone and in windows (rows grouped by expert).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "tandem/model/moe.h"
#include "tandem/model/session.h"
#include "test_util.h"

namespace {

using tandem::model::ExpertGating;
using tandem::model::MoeConfig;
using tandem::model::route;

struct Routed {
  std::vector<int32_t> experts;
  std::vector<float> weights;
  float gap;
};

Routed run_route(const MoeConfig& m, const std::vector<float>& logits, const std::vector<float>& bias = {}) {
  Routed out{std::vector<int32_t>(static_cast<size_t>(m.n_expert_used)),
             std::vector<float>(static_cast<size_t>(m.n_expert_used)), 0};
  std::vector<float> scores(static_cast<size_t>(m.n_expert));
  out.gap = route(m, logits.data(), bias.empty() ? nullptr : bias.data(), out.experts.data(),
                  out.weights.data(), scores.data());
  return out;
}

MoeConfig config(int64_t n_expert, int64_t used, ExpertGating gating = ExpertGating::kSoftmax) {
  MoeConfig m;
  m.n_expert = n_expert;
  m.n_expert_used = used;
  m.gating = gating;
  return m;
}

TEST(MoeRoute, SoftmaxTopKWeighsByUnnormalisedProbabilities) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f};
  const Routed r = run_route(config(4, 2), logits);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3}));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l));
  EXPECT_NEAR(r.weights[0], std::exp(2.0) / sum, 1e-6);
  EXPECT_NEAR(r.weights[1], std::exp(1.5) / sum, 1e-6);
  EXPECT_NEAR(r.gap, (std::exp(1.5) - std::exp(0.5)) / sum, 1e-6);
}

TEST(MoeRoute, NormalisedWeightsAreScaled) {
  MoeConfig m = config(4, 2);
  m.norm_top_k = true;
  m.weights_scale = 2.5f;
  const Routed r = run_route(m, {0.5f, 2.0f, -1.0f, 1.5f});
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5f, 1e-5);
  EXPECT_NEAR(r.weights[0] / r.weights[1], std::exp(0.5), 1e-5);
}

TEST(MoeRoute, SelectionBiasPicksButDoesNotWeigh) {
  MoeConfig m = config(4, 2, ExpertGating::kSigmoid);
  m.selection_bias = true;
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.0f};
  // Expert 0 has the lowest score but a bias that ranks it first; expert 1 falls behind expert 3.
  const Routed r = run_route(m, logits, {1.0f, -0.5f, 0.0f, 0.0f});
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 3}));
  EXPECT_NEAR(r.weights[0], 0.5f, 1e-6);  // sigmoid(0), without the bias
  EXPECT_NEAR(r.weights[1], 1.0f / (1.0f + std::exp(-2.0f)), 1e-6);
}

TEST(MoeRoute, GroupLimitedSelectionSkipsGroupsNotChosen) {
  MoeConfig m = config(8, 2, ExpertGating::kSigmoid);
  m.n_group = 4;
  m.n_group_used = 2;
  // Groups {0,1} {2,3} {4,5} {6,7}; sums of their two scores' logits rank groups 1 and 3 first, but the
  // single best expert (4) sits in group 2, which is not chosen.
  const std::vector<float> logits = {-3.0f, -3.0f, 1.0f, 1.0f, 3.0f, -4.0f, 0.5f, 1.2f};
  const Routed r = run_route(m, logits);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{7, 2}));
  m.n_group_used = 4;  // every group eligible: the plain top-k
  EXPECT_EQ(run_route(m, logits).experts, (std::vector<int32_t>{4, 7}));
}

TEST(MoeRoute, TiesGoToTheLowerExpert) {
  const Routed r = run_route(config(4, 1), {1.0f, 2.0f, 2.0f, 0.0f});
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1}));
  EXPECT_EQ(r.gap, 0.0f);
}

std::string qwen2moe(const char* type) {
  return tandem::testing::shared_path(std::string("models/synth/synth-qwen2moe-d128-") + type + ".gguf");
}

TEST(MoeModel, Qwen2MoeConfigurationFromTheFile) {
  auto model = tandem::model::Model::load(qwen2moe("f32"));
  const auto& m = model->config().moe;
  EXPECT_EQ(m.n_expert, 8);
  EXPECT_EQ(m.n_expert_used, 2);
  EXPECT_EQ(m.n_ff_expert, 64);
  EXPECT_EQ(m.n_ff_shared, 128);
  EXPECT_TRUE(m.shared_gate);
  EXPECT_FALSE(m.norm_top_k);
  EXPECT_EQ(m.gating, ExpertGating::kSoftmax);
  for (const auto& l : model->weights().layers) {
    ASSERT_EQ(l.moe.gate.size(), 8u);
    EXPECT_TRUE(l.w_gate.empty());
    // Each expert is its own slice of the stacked tensor.
    EXPECT_EQ(l.moe.gate[1].data, l.moe.gate[0].data + l.moe.gate[0].bytes());
  }
  // A token reads two of the eight experts of each layer.
  const auto& w = model->weights();
  size_t want = w.output.bytes() + w.tok_embd.row_bytes;
  for (const auto& l : w.layers)
    want += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.moe.router.bytes() +
            l.moe.shared_gate.bytes() + l.moe.shared_up.bytes() + l.moe.shared_down.bytes() +
            2 * (l.moe.gate[0].bytes() + l.moe.up[0].bytes() + l.moe.down[0].bytes());
  EXPECT_EQ(model->weight_bytes_per_token(), want);
}

std::string deepseek2(const char* variant, const char* type) {
  return tandem::testing::shared_path(std::string("models/synth/synth-") + variant + "-d128-" + type +
                                      ".gguf");
}

TEST(MoeModel, DeepSeek2VariantsFromTheFile) {
  auto v2 = tandem::model::Model::load(deepseek2("deepseek2", "f32"));
  const auto& c2 = v2->config();
  EXPECT_EQ(c2.mla.q_lora_rank, 64);  // from the attn_q_a tensors present
  EXPECT_EQ(c2.mla.kv_lora_rank, 32);
  EXPECT_EQ(c2.moe.n_leading_dense, 1);
  EXPECT_EQ(c2.moe.n_ff_shared, 2 * 64);
  EXPECT_EQ(c2.moe.gating, ExpertGating::kSoftmax);
  EXPECT_FALSE(c2.moe.selection_bias);
  EXPECT_FALSE(c2.moe_layer(0));
  EXPECT_TRUE(c2.moe_layer(1));
  EXPECT_FALSE(v2->weights().layers[0].w_gate.empty());
  EXPECT_TRUE(v2->weights().layers[0].moe.empty());
  EXPECT_TRUE(c2.rope_freq_factors.empty());
  EXPECT_FLOAT_EQ(c2.attn_scale, 1.0f / std::sqrt(48.0f));

  auto v3 = tandem::model::Model::load(deepseek2("deepseek2v3", "f32"));
  const auto& c3 = v3->config();
  EXPECT_EQ(c3.moe.gating, ExpertGating::kSigmoid);
  EXPECT_TRUE(c3.moe.selection_bias);
  EXPECT_TRUE(c3.moe.norm_top_k);
  EXPECT_FLOAT_EQ(c3.moe.weights_scale, 2.5f);
  // YaRN, factor 4 over an original context of 1024: the fastest pairs keep their frequency, the slowest are
  // interpolated by the factor; the log multiplier 0.1 enters the attention scale squared.
  ASSERT_EQ(c3.rope_freq_factors.size(), 8u);
  EXPECT_FLOAT_EQ(c3.rope_freq_factors[0], 1.0f);
  EXPECT_FLOAT_EQ(c3.rope_freq_factors[7], 4.0f);
  const float mscale = 1.0f + 0.1f * std::log(4.0f);
  EXPECT_NEAR(c3.attn_scale, mscale * mscale / std::sqrt(48.0f), 1e-6);
}

// A prompt evaluated as one batch (rows grouped by expert: one matrix product per expert over its rows)
// gives every row the bits it gets decoded one token at a time.
TEST(MoeModel, BatchedRowsEqualOneByOneBitForBit) {
  for (const std::string& path : {qwen2moe("f32"), qwen2moe("Q8_0"), deepseek2("deepseek2", "Q8_0"),
                                  deepseek2("deepseek2v3", "Q8_0")}) {
    SCOPED_TRACE(path);
    auto model = tandem::model::Model::load(path);
    tandem::ThreadPool pool(2);
    const int64_t V = model->config().n_vocab;
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % static_cast<int32_t>(V));
    tandem::model::Session batched(*model, pool, tandem::model::SessionOptions{64});
    const auto all = batched.eval(ids, /*all_logits=*/true);
    const std::vector<float> want(all.begin(), all.end());
    tandem::model::Session single(*model, pool, tandem::model::SessionOptions{64});
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto got = single.eval(std::span<const int32_t>(&ids[i], 1));
      ASSERT_EQ(std::memcmp(got.data(), want.data() + i * static_cast<size_t>(V), sizeof(float) * V), 0)
          << "row " << i;
    }
  }
}

// Windows of several rows of one sequence (as a verify window runs them) after a rollback agree with
// the same rows decoded one at a time.
TEST(MoeModel, WindowAfterRollbackEqualsOneByOne) {
  auto model = tandem::model::Model::load(qwen2moe("Q8_0"));
  tandem::ThreadPool pool(2);
  const int64_t V = model->config().n_vocab;
  std::vector<int32_t> prompt = {1, 400, 17, 250, 3, 99, 480, 12};
  const std::vector<int32_t> window = {77, 301, 5, 450, 6};
  tandem::model::Session s(*model, pool, tandem::model::SessionOptions{64});
  s.eval(prompt);
  s.eval(std::vector<int32_t>{9, 9, 9});  // to be rolled back
  s.truncate(static_cast<int64_t>(prompt.size()));
  const auto w = s.eval(window, /*all_logits=*/true);
  const std::vector<float> got(w.begin(), w.end());
  tandem::model::Session ref(*model, pool, tandem::model::SessionOptions{64});
  ref.eval(prompt);
  for (size_t i = 0; i < window.size(); ++i) {
    const auto one = ref.eval(std::span<const int32_t>(&window[i], 1));
    ASSERT_EQ(std::memcmp(one.data(), got.data() + i * static_cast<size_t>(V), sizeof(float) * V), 0)
        << "row " << i;
  }
}

}  // namespace
