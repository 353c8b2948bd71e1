// Mixture-of-experts layers: the router's selection and weights (softmax and sigmoid scores, the V3
// selection bias, normalised and scaled weights, group-limited selection, ties), the qwen2moe checkpoint's
// configuration, and rows that get the same bits alone and in windows (rows grouped by expert).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tandem/cache/kv_cache.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/moe.h"
#include "tandem/model/session.h"
#include "tandem/model/synth.h"
#include "tandem/sampling/sampler.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/util/error.h"
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

// The latent cache holds per token and layer the KV latent (32) and the rotary key part (16) as one key row
// whose first 32 elements are the value, stored once: not the four heads' expanded keys (48) and values (32).
TEST(MoeModel, DeepSeek2CachesTheLatentOnce) {
  auto model = tandem::model::Model::load(deepseek2("deepseek2", "Q8_0"));
  const tandem::cache::Geometry g = model->config().kv_geometry();
  EXPECT_EQ(g.n_head_kv, 1);
  EXPECT_EQ(g.head_dim, 32 + 16);
  EXPECT_EQ(g.head_dim_v, 32);
  EXPECT_TRUE(g.values_in_keys);
  tandem::ThreadPool pool(2);
  tandem::model::Session s(*model, pool, tandem::model::SessionOptions{64});
  const size_t expanded = 4 * 4 * (48 + 32) * sizeof(uint16_t);  // layers * heads * (key + value), f16
  EXPECT_EQ(s.cache().bytes_per_token(), 4 * 48 * sizeof(uint16_t));
  EXPECT_EQ(model->config().expanded_kv_bytes_per_token(), expanded);
}

// A rotated 4-bit cache cannot give the latent's elements back as values: refused with the types that can.
TEST(MoeModel, LatentCacheRefusesQ4r) {
  auto model = tandem::model::Model::load(deepseek2("deepseek2", "Q8_0"));
  tandem::ThreadPool pool(2);
  try {
    tandem::model::Session s(*model, pool, tandem::model::SessionOptions{64, tandem::cache::KvType::kQ4R});
    FAIL() << "expected an error";
  } catch (const tandem::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("q4r"), std::string::npos) << what;
    EXPECT_NE(what.find("f16"), std::string::npos) << what;
  }
}

// At DeepSeek-V2-Lite's shapes (27 layers, 16 heads, keys 128 + 64, values 128, latent 512) an f16 latent
// cache takes at most 1/8 of the expanded f16 keys and values.
TEST(MoeModel, LatentCacheIsAnEighthOfTheExpandedAtV2LiteShapes) {
  const tandem::model::SynthPreset& p = tandem::model::find_synth_preset("deepseek-v2-lite");
  tandem::model::Config c;
  c.n_layer = p.n_layer;
  c.n_head = c.n_head_kv = p.n_head;
  c.head_dim = p.mla.key_length;
  c.head_dim_v = p.mla.value_length;
  c.n_rot = p.mla.n_rot;
  c.mla.kv_lora_rank = p.mla.kv_lora_rank;
  for (const auto type : {tandem::cache::KvType::kF16, tandem::cache::KvType::kQ8_0}) {
    tandem::cache::KvCache cache(c.kv_geometry(), 64, type);
    const size_t expanded = c.expanded_kv_bytes_per_token();
    EXPECT_EQ(expanded, size_t{27} * 16 * (192 + 128) * 2);
    EXPECT_LE(cache.bytes_per_token() * 8, expanded) << tandem::cache::kv_type_name(type);
  }
}

// The f16 and q8_0 latent caches stay close to the exact (f32) latent, the form the goldens are checked
// with (test_golden.cpp): the values read back from the key rows carry only the codec's rounding. The
// deepseek2 f32 file routes 64 positions without a near-tie flip at these codecs.
TEST(MoeModel, LatentCacheCodecsStayCloseToTheExactLatent) {
  using tandem::cache::KvType;
  auto model = tandem::model::Model::load(deepseek2("deepseek2", "f32"));
  tandem::ThreadPool pool(2);
  const int64_t V = model->config().n_vocab;
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < 64; ++i) ids.push_back((i * 37 + 11) % static_cast<int32_t>(V));
  const auto logprobs = [&](KvType type) {
    tandem::model::Session s(*model, pool, tandem::model::SessionOptions{80, type});
    const auto logits = s.eval(ids, /*all_logits=*/true);
    std::vector<double> lp(logits.size());
    for (size_t r = 0; r < ids.size(); ++r)
      tandem::sampling::log_softmax(
          logits.subspan(r * static_cast<size_t>(V), static_cast<size_t>(V)),
          std::span<double>(lp).subspan(r * static_cast<size_t>(V), static_cast<size_t>(V)));
    return lp;
  };
  const std::vector<double> exact = logprobs(KvType::kF32);
  for (const auto& [type, bound] : {std::pair{KvType::kF16, 0.01}, std::pair{KvType::kQ8_0, 0.15}}) {
    const std::vector<double> got = logprobs(type);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (exact[i] > -8) worst = std::max(worst, std::abs(got[i] - exact[i]));
    std::printf("latent %s: worst |dlogprob| against the exact latent %.4f\n",
                std::string(tandem::cache::kv_type_name(type)).c_str(), worst);
    EXPECT_GT(worst, 0.0) << "the codec should round";
    EXPECT_LE(worst, bound) << tandem::cache::kv_type_name(type);
  }
}

// Windows of several rows of one sequence (as a verify window runs them) after a rollback agree with
// the same rows decoded one at a time, on the latent cache with each codec too.
TEST(MoeModel, WindowAfterRollbackEqualsOneByOne) {
  using tandem::cache::KvType;
  for (const std::string& path : {qwen2moe("Q8_0"), deepseek2("deepseek2v3", "Q8_0")})
    for (const auto kv_type : {KvType::kF16, KvType::kQ8_0, KvType::kF32}) {
      SCOPED_TRACE(path + " " + std::string(tandem::cache::kv_type_name(kv_type)));
      auto model = tandem::model::Model::load(path);
      tandem::ThreadPool pool(2);
      const int64_t V = model->config().n_vocab;
      // 21 positions: the window crosses a block boundary (16) after the rollback.
      std::vector<int32_t> prompt;
      for (int32_t i = 0; i < 14; ++i) prompt.push_back((i * 53 + 7) % static_cast<int32_t>(V));
      const std::vector<int32_t> window = {77, 301, 5, 450, 6};
      const tandem::model::SessionOptions options{64, kv_type};
      tandem::model::Session s(*model, pool, options);
      s.eval(prompt);
      s.eval(std::vector<int32_t>{9, 9, 9});  // to be rolled back
      s.truncate(static_cast<int64_t>(prompt.size()));
      const auto w = s.eval(window, /*all_logits=*/true);
      const std::vector<float> got(w.begin(), w.end());
      tandem::model::Session ref(*model, pool, options);
      ref.eval(prompt);
      for (size_t i = 0; i < window.size(); ++i) {
        const auto one = ref.eval(std::span<const int32_t>(&window[i], 1));
        ASSERT_EQ(std::memcmp(one.data(), got.data() + i * static_cast<size_t>(V), sizeof(float) * V), 0)
            << "row " << i;
      }
    }
}

// A decode step's latent attention (one run of rows, one latent head) splits its query heads into a share
// per thread, evenly or not (four heads over three threads): every thread count gives the bits of one, for
// decode steps and for a window after them.
TEST(MoeModel, LatentAttentionSharesGiveTheBitsOfOneThread) {
  for (const std::string& path : {deepseek2("deepseek2", "Q8_0"), deepseek2("deepseek2v3", "f32")}) {
    SCOPED_TRACE(path);
    auto model = tandem::model::Model::load(path);
    const int64_t V = model->config().n_vocab;
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 19; ++i) prompt.push_back((i * 29 + 3) % static_cast<int32_t>(V));
    const std::vector<int32_t> window = {12, 400, 33};
    const auto logits = [&](int threads) {
      tandem::ThreadPool pool(threads);
      tandem::model::Session s(*model, pool, tandem::model::SessionOptions{64});
      s.eval(std::span<const int32_t>(prompt.data(), 4));
      std::vector<float> out;
      for (size_t i = 4; i < prompt.size(); ++i) {
        const auto one = s.eval(std::span<const int32_t>(&prompt[i], 1));
        out.insert(out.end(), one.begin(), one.end());
      }
      const auto w = s.eval(window, /*all_logits=*/true);
      out.insert(out.end(), w.begin(), w.end());
      return out;
    };
    const std::vector<float> want = logits(1);
    for (int threads : {2, 3, 4}) {
      const std::vector<float> got = logits(threads);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * want.size()), 0)
          << threads << " threads";
    }
  }
}

// A prompt whose first blocks another session of the store evaluated reuses them on the latent cache and
// gets the bits of a fresh evaluation.
TEST(MoeModel, LatentCachePrefixReuse) {
  using tandem::cache::KvType;
  auto model = tandem::model::Model::load(deepseek2("deepseek2", "Q8_0"));
  tandem::ThreadPool pool(2);
  const int64_t V = model->config().n_vocab;
  for (const auto kv_type : {KvType::kF16, KvType::kQ8_0}) {
    SCOPED_TRACE(std::string(tandem::cache::kv_type_name(kv_type)));
    tandem::cache::KvStoreOptions so;
    so.type = kv_type;
    so.n_blocks = 32;
    tandem::cache::KvStore store(model->config().kv_geometry(), so);
    std::vector<int32_t> system;
    for (int32_t i = 0; i < 37; ++i) system.push_back((i * 31 + 5) % static_cast<int32_t>(V));
    auto prompt1 = system, prompt2 = system;
    prompt1.insert(prompt1.end(), {11, 12, 13});
    prompt2.insert(prompt2.end(), {21, 22, 23, 24});
    const tandem::model::SessionOptions options{128, kv_type};
    tandem::model::Session a(*model, pool, options, store);
    a.prefill(prompt1);
    tandem::model::Session b(*model, pool, options, store);
    const auto lb = b.prefill(prompt2);
    EXPECT_EQ(b.prompt_reused(), 32);
    const std::vector<float> got(lb.begin(), lb.end());
    tandem::model::Session fresh(*model, pool, options);
    const auto lf = fresh.eval(prompt2);
    ASSERT_EQ(std::memcmp(got.data(), lf.data(), sizeof(float) * static_cast<size_t>(V)), 0);
    const int32_t next = 99;
    const auto nb = b.eval(std::span<const int32_t>(&next, 1));
    const std::vector<float> got_next(nb.begin(), nb.end());
    const auto nf = fresh.eval(std::span<const int32_t>(&next, 1));
    EXPECT_EQ(std::memcmp(got_next.data(), nf.data(), sizeof(float) * static_cast<size_t>(V)), 0);
  }
}

// `tandem synth` writes the MoE presets' files: the small ones load with the shapes asked for (latent
// attention without a q LoRA, leading dense layer, shared experts, F32 routers) and decode to finite logits.
TEST(MoeSynth, SmallPresetsLoadAndDecode) {
  tandem::testing::TempDir dir("moe-synth");
  tandem::ThreadPool pool(2);
  for (const char* name : {"tiny-deepseek2-d64", "tiny-qwen2moe-d64"}) {
    SCOPED_TRACE(name);
    const tandem::model::SynthPreset& p = tandem::model::find_synth_preset(name);
    const std::string path = dir.file(std::string(name) + ".gguf");
    tandem::model::write_synthetic_model(p, tandem::model::find_file_type("Q8_0"), path, pool);
    auto m = tandem::model::Model::load(path);
    const tandem::model::Config& c = m->config();
    EXPECT_EQ(c.arch, p.arch);
    EXPECT_EQ(c.moe.n_expert, p.moe.n_expert);
    EXPECT_EQ(c.moe.n_expert_used, p.moe.n_expert_used);
    EXPECT_EQ(c.moe.n_ff_expert, p.moe.n_ff_expert);
    const int64_t first_moe = p.moe.n_leading_dense;
    EXPECT_EQ(m->weights().layers[static_cast<size_t>(first_moe)].moe.router.type, tandem::DType::F32);
    if (p.arch == "deepseek2") {
      EXPECT_EQ(c.mla.q_lora_rank, 0);
      EXPECT_EQ(c.mla.kv_lora_rank, p.mla.kv_lora_rank);
      EXPECT_EQ(c.moe.n_ff_shared, p.moe.n_shared * p.moe.n_ff_expert);
      EXPECT_FALSE(c.moe_layer(0));
      EXPECT_TRUE(c.moe_layer(1));
      EXPECT_FALSE(c.rope_freq_factors.empty());
    } else {
      EXPECT_EQ(c.moe.n_ff_shared, p.moe.n_ff_shared);
      EXPECT_TRUE(c.moe.shared_gate);
    }
    tandem::model::Session s(*m, pool, tandem::model::SessionOptions{64});
    const std::vector<int32_t> ids = {1, 50, 60, 70};
    for (float v : s.eval(ids)) ASSERT_TRUE(std::isfinite(v));
  }
  const auto& lite = tandem::model::find_synth_preset("deepseek-v2-lite");
  EXPECT_EQ(lite.n_layer, 27);
  EXPECT_EQ(lite.moe.n_expert, 64);
  EXPECT_EQ(lite.mla.kv_lora_rank, 512);
  const auto& qwen = tandem::model::find_synth_preset("qwen1.5-moe-a2.7b");
  EXPECT_EQ(qwen.moe.n_expert, 60);
  EXPECT_EQ(qwen.moe.n_ff_shared, 5632);
}

}  // namespace

namespace {

using tandem::model::ExpertResidency;

// With a budget of half the routed experts' bytes and a rebalance every few reads (so copies come and go
// during the run), prefill and decode give the bits of a run without a budget.
TEST(ExpertResidency, BudgetGivesTheSameBitsAsEverythingResident) {
  for (const std::string& path : {qwen2moe("Q8_0"), deepseek2("deepseek2v3", "Q8_0")}) {
    SCOPED_TRACE(path);
    auto model = tandem::model::Model::load(path);
    tandem::ThreadPool pool(2);
    const int64_t V = model->config().n_vocab;
    const tandem::model::ExpertBytes eb = tandem::model::expert_bytes(*model);
    ExpertResidency residency(*model, eb.routed_all / 2, /*rebalance_every=*/5);
    ASSERT_GT(residency.slots(), 0);
    std::vector<int32_t> prompt;
    for (int32_t i = 0; i < 20; ++i) prompt.push_back((i * 41 + 3) % static_cast<int32_t>(V));
    tandem::model::Session with(*model, pool, tandem::model::SessionOptions{64});
    with.forward().set_expert_residency(&residency);
    tandem::model::Session without(*model, pool, tandem::model::SessionOptions{64});
    const auto a = with.eval(prompt);
    const std::vector<float> got(a.begin(), a.end());
    const auto b = without.eval(prompt);
    ASSERT_EQ(std::memcmp(got.data(), b.data(), sizeof(float) * static_cast<size_t>(V)), 0);
    for (int32_t t = 0; t < 12; ++t) {
      const int32_t id = (t * 97 + 5) % static_cast<int32_t>(V);
      const auto x = with.eval(std::span<const int32_t>(&id, 1));
      const std::vector<float> row(x.begin(), x.end());
      const auto y = without.eval(std::span<const int32_t>(&id, 1));
      ASSERT_EQ(std::memcmp(row.data(), y.data(), sizeof(float) * static_cast<size_t>(V)), 0) << "step " << t;
    }
    const tandem::model::ResidencyStats s = residency.stats();
    EXPECT_GT(s.resident_reads, 0u);
    EXPECT_LT(s.resident_reads, s.reads);
    EXPECT_GT(s.resident_experts, 0);
    EXPECT_LT(s.resident_experts, s.experts);
    EXPECT_LE(s.resident_bytes, s.budget_bytes);
  }
}

// Calls of up to a window's rows run all experts' products as tasks of two parallel regions; every row gets
// the bits of the regions per expert, on either side of the boundary (1 to 16 rows together, through each
// row class and more than kOwnActivationRows rows per product; 17, 40 per expert either way), with one and
// two threads, reading the file's experts or, under a budget, some resident copies, and
// counting the same reads.
TEST(MoeFfn, ExpertsInTwoRegionsEqualRegionsPerExpert) {
  for (const std::string& path : {qwen2moe("f32"), qwen2moe("Q8_0"), deepseek2("deepseek2", "Q8_0"),
                                  deepseek2("deepseek2v3", "Q8_0")}) {
    SCOPED_TRACE(path);
    auto model = tandem::model::Model::load(path);
    const tandem::model::Config& c = model->config();
    int64_t layer = 0;
    while (!c.moe_layer(layer)) ++layer;
    const tandem::model::MoeWeights& w = model->weights().layers[static_cast<size_t>(layer)].moe;
    const int64_t D = c.n_embd, max_rows = 40;
    std::vector<float> x(static_cast<size_t>(max_rows * D));
    uint32_t seed = 12345;
    for (float& v : x) {
      seed = seed * 1664525u + 1013904223u;
      v = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
    }
    // Every even expert of the layer resident: the rows meet copies and file views alike.
    const tandem::model::ExpertBytes eb = tandem::model::expert_bytes(*model);
    // Slots for half the layer's experts (each matrix of a slot rounded up to 64 bytes).
    const size_t slots = static_cast<size_t>(c.moe.n_expert / 2);
    ExpertResidency residency(*model, slots * (eb.per_expert + 192), /*rebalance_every=*/1000000);
    for (int64_t e = 0; e < c.moe.n_expert; e += 2) residency.record(layer, e);
    residency.rebalance();
    ASSERT_TRUE(residency.resident(layer, 0));
    ASSERT_FALSE(residency.resident(layer, 1));
    for (int threads : {1, 2}) {
      tandem::ThreadPool pool(threads);
      const int64_t widest = std::max({D, c.moe.n_ff_expert, c.moe.n_ff_shared});
      tandem::kernels::MatmulScratch scratch(threads, widest, max_rows);
      for (ExpertResidency* r : {static_cast<ExpertResidency*>(nullptr), &residency}) {
        for (int64_t n : {1, 3, 5, 8, 12, 16, 17, 40}) {
          SCOPED_TRACE(::testing::Message()
                       << threads << " threads, " << n << " rows, budget " << (r != nullptr));
          tandem::model::MoeFfn together(c, max_rows), per_expert(c, max_rows);
          per_expert.set_schedule(tandem::model::ExpertSchedule::kPerExpert);
          std::vector<float> got(x.begin(), x.begin() + n * D), want = got;
          const tandem::model::ResidencyStats s0 = residency.stats();
          together.run(w, got.data(), n, pool, scratch, r, layer);
          const tandem::model::ResidencyStats s1 = residency.stats();
          per_expert.run(w, want.data(), n, pool, scratch, r, layer);
          const tandem::model::ResidencyStats s2 = residency.stats();
          ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * static_cast<size_t>(n * D)), 0);
          EXPECT_EQ(s1.reads - s0.reads, s2.reads - s1.reads);
          EXPECT_EQ(s1.resident_reads - s0.resident_reads, s2.resident_reads - s1.resident_reads);
          if (r) {
            EXPECT_GT(s1.reads, s0.reads);
          }
        }
      }
    }
  }
}

// A window's tasks are dealt out by their work: with 2 and 16 threads no thread's initial share of the down
// products holds more than an equal share and one tile more, though the shared expert's tiles carry all
// 16 rows and a routed expert's a row or two.
TEST(MoeFfn, WindowTasksAreSharedByTheirWork) {
  auto model = tandem::model::Model::load(deepseek2("deepseek2", "Q8_0"));
  const tandem::model::Config& c = model->config();
  int64_t layer = 0;
  while (!c.moe_layer(layer)) ++layer;
  const tandem::model::MoeWeights& w = model->weights().layers[static_cast<size_t>(layer)].moe;
  ASSERT_FALSE(w.shared_gate.empty());
  const int64_t D = c.n_embd, n = tandem::kernels::kMaxWindowRows;
  std::vector<float> x(static_cast<size_t>(n * D));
  uint32_t seed = 777;
  for (float& v : x) {
    seed = seed * 1664525u + 1013904223u;
    v = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  tandem::ThreadPool pool(1);
  tandem::kernels::MatmulScratch scratch(1, std::max({D, c.moe.n_ff_expert, c.moe.n_ff_shared}), n);
  tandem::model::MoeFfn ffn(c, n);
  ffn.run(w, x.data(), n, pool, scratch);
  // The down products' work: every slot's row through D outputs, and every row through the shared expert's.
  const int64_t total = (n * c.moe.n_expert_used + n) * D, biggest_tile = n * 16;
  for (int threads : {2, 16}) {
    SCOPED_TRACE(threads);
    const std::vector<int64_t> shares = ffn.initial_shares(threads);
    ASSERT_EQ(shares.size(), static_cast<size_t>(threads));
    int64_t sum = 0;
    for (int64_t s : shares) {
      sum += s;
      EXPECT_LE(s, total / threads + biggest_tile);
    }
    EXPECT_EQ(sum, total);
  }
}

// The most-read experts take the slots; a resident expert keeps its slot against an equal count; a budget
// below one expert keeps none.
TEST(ExpertResidency, KeepsTheMostReadExperts) {
  auto model = tandem::model::Model::load(qwen2moe("Q8_0"));
  const tandem::model::ExpertBytes eb = tandem::model::expert_bytes(*model);
  ExpertResidency none(*model, eb.per_expert / 2);
  EXPECT_EQ(none.slots(), 0);
  none.record(0, 1);
  none.rebalance();
  EXPECT_FALSE(none.resident(0, 1));

  ExpertResidency r(*model, 3 * (eb.per_expert + 192), /*rebalance_every=*/1000);
  ASSERT_EQ(r.slots(), 3);
  for (int i = 0; i < 5; ++i) r.record(1, 6);
  for (int i = 0; i < 3; ++i) r.record(0, 2);
  for (int i = 0; i < 2; ++i) r.record(3, 0);
  r.record(2, 7);
  r.rebalance();
  EXPECT_TRUE(r.resident(1, 6));
  EXPECT_TRUE(r.resident(0, 2));
  EXPECT_TRUE(r.resident(3, 0));
  EXPECT_FALSE(r.resident(2, 7));
  // The copy has the file's bytes.
  const auto& v = r.views(1, 6);
  const auto& file = model->weights().layers[1].moe.down[6];
  EXPECT_NE(v.down.data, file.data);
  EXPECT_EQ(std::memcmp(v.down.data, file.data, file.bytes()), 0);
  // Counts 5, 3, 2, 1: one more read of (2, 7) ties it with the resident (3, 0), which keeps its slot
  // although (2, 7) has the lower index.
  r.record(2, 7);
  r.rebalance();
  EXPECT_TRUE(r.resident(3, 0));
  EXPECT_FALSE(r.resident(2, 7));
  EXPECT_EQ(r.views(2, 7).gate.data, model->weights().layers[2].moe.gate[7].data);
  // Two more put it past (3, 0) and (0, 2): the least read of the three gives its slot up.
  r.record(2, 7);
  r.record(2, 7);
  r.rebalance();
  EXPECT_TRUE(r.resident(1, 6));
  EXPECT_TRUE(r.resident(2, 7));
  EXPECT_TRUE(r.resident(0, 2));
  EXPECT_FALSE(r.resident(3, 0));
  EXPECT_EQ(r.stats().resident_experts, 3);
}

// Routing skewed as the synthetic router's Zipf-like prior makes it (64 experts, top 6, as DeepSeek-V2-Lite):
// with half the routed experts' bytes resident, at least 80% of the expert bytes decode reads come from
// resident copies once the counts have settled.
TEST(ExpertResidency, HalfTheExpertsServeMostReadsUnderAZipfRouter) {
  tandem::model::SynthPreset p = tandem::model::find_synth_preset("tiny-deepseek2-d64");
  p.n_layer = 5;
  p.moe.n_expert = 64;
  p.moe.n_expert_used = 6;
  tandem::testing::TempDir dir("moe-zipf");
  tandem::ThreadPool pool(2);
  const std::string path = dir.file("zipf.gguf");
  tandem::model::write_synthetic_model(p, tandem::model::find_file_type("Q8_0"), path, pool);
  auto model = tandem::model::Model::load(path);
  const tandem::model::ExpertBytes eb = tandem::model::expert_bytes(*model);
  ExpertResidency residency(*model, eb.routed_all / 2);
  tandem::model::Session s(*model, pool, tandem::model::SessionOptions{256});
  s.forward().set_expert_residency(&residency);
  const int32_t V = static_cast<int32_t>(model->config().n_vocab);
  const auto decode = [&](int32_t from, int32_t n) {
    for (int32_t t = from; t < from + n; ++t) {
      const int32_t id = (t * 131 + 17) % V;
      s.eval(std::span<const int32_t>(&id, 1));
    }
  };
  decode(0, 40);  // the counts settle
  const tandem::model::ResidencyStats before = residency.stats();
  decode(40, 120);
  const tandem::model::ResidencyStats after = residency.stats();
  const double served =
      (after.resident_bytes_read - before.resident_bytes_read) / (after.bytes_read - before.bytes_read);
  std::printf("served resident: %.3f with %lld of %lld experts resident\n", served,
              static_cast<long long>(after.resident_experts), static_cast<long long>(after.experts));
  EXPECT_LE(after.resident_experts * 2, after.experts);
  EXPECT_GE(served, 0.80);
}

TEST(ExpertResidency, RefusesModelsWithoutExperts) {
  auto model =
      tandem::model::Model::load(tandem::testing::shared_path("models/synth/synth-mamba-d128-f32.gguf"));
  try {
    ExpertResidency r(*model, size_t{1} << 20);
    FAIL() << "expected an error";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-budget"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// Greedy speculative decoding of a latent-attention MoE target (with half its experts resident) equals plain
// greedy decoding, with a draft model (the f32 file of the same shapes) and with n-gram lookup, at depths 1,
// 2 and 4: verify windows, rollback on the latent cache and residency changes between forwards do not change
// a token.
TEST(MoeSpeculative, GreedyEqualsPlainOnTheLatentCache) {
  using namespace tandem;
  auto target = model::Model::load(deepseek2("deepseek2v3", "Q8_0"));
  auto draft = model::Model::load(deepseek2("deepseek2v3", "f32"));
  ThreadPool pool(2);
  const model::SessionOptions so{128};
  const std::vector<int32_t> prompt = {1, 40, 41, 42, 40, 41, 42, 40, 41};
  model::ExpertResidency residency(*target, model::expert_bytes(*target).routed_all / 2, 7);
  std::vector<int32_t> plain;
  {
    model::Session s(*target, pool, so);
    engine::GenerateOptions g;
    g.max_tokens = 24;
    g.sampling.temperature = 0.0f;
    engine::generate(
        s, prompt, g, [&](int32_t t) { return plain.push_back(t), true; }, nullptr);
  }
  ASSERT_EQ(plain.size(), 24u);
  speculative::DraftModelSource model_source(*draft, *target, pool, so);
  speculative::NgramSource ngram;
  speculative::DraftSource* sources[] = {&model_source, &ngram};
  int64_t accepted = 0;
  for (speculative::DraftSource* source : sources)
    for (const int depth : {1, 2, 4}) {
      model::Session s(*target, pool, so);
      s.forward().set_expert_residency(&residency);
      engine::SpecOptions o;
      o.generate.max_tokens = 24;
      o.generate.sampling.temperature = 0.0f;
      o.draft_max = depth;
      o.use_gate = false;
      std::vector<int32_t> out;
      const engine::SpecStats st = engine::generate_speculative(
          s, *source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
      EXPECT_EQ(out, plain) << source->kind() << " depth " << depth;
      accepted += st.accepted;
    }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(residency.stats().resident_reads, 0u);
}

}  // namespace
