// The EAGLE-3 drafter end to end on stories260K: a small drafter trained in a few steps drafts for
// speculative decoding whose greedy output equals plain greedy decoding token for token on every public
// golden prompt at depths 1..8; a drafter is refused by another target, saying what differs; training repeats
// bit for bit for a fixed seed; a probe proposal leaves the drafter's cache as it was; training stopped and
// resumed (in the library, and by SIGINT to `tandem train-drafter`) ends with the weights of a run never
// stopped; `tandem info` describes a drafter. Draft trees: tree == chain == plain greedy on every public
// prompt at several node budgets, a one-branch tree is the chain, after every tree round the drafter's taps
// and cache equal a fresh drafter's on the committed text, and sampled tree rounds keep the first token's
// distribution (chi-square).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "drafter_fixture.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/gguf/reader.h"
#include "tandem/kernels/matmul.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/drafter_data.h"
#include "tandem/speculative/eagle_train.h"
#include "tandem/speculative/target_vocab.h"
#include "tandem/tensor/fp16.h"
#include "tandem/tensor/quant.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem::speculative {
namespace {

using drafter_fixture::expect_greedy_equals_plain_at_every_depth;
using drafter_fixture::golden_prompts;
using drafter_fixture::private_temp_file;
using drafter_fixture::run;
using drafter_fixture::sample_first_tokens;
using drafter_fixture::tap_capture;
using drafter_fixture::target_path;

EagleTrainOptions small_options(const model::Model& m, int64_t steps) {
  auto tok = tokenizer::Tokenizer::from_gguf(m.file());
  EagleTrainOptions o;
  const auto prompts = default_training_prompts();
  for (size_t i = 0; i < 8; ++i) o.prompts.push_back(tok->encode(prompts[i], true, false));
  o.tokens = 768;
  o.continuation = 64;
  o.steps = steps;
  o.unroll = 3;
  o.seed = 5;
  return o;
}

using Trained = drafter_fixture::Trained<EagleTrainResult>;

Trained& trained() {
  static Trained* t = drafter_fixture::train_and_save<EagleTrainResult>(
      2, "eagle_drafter_test.gguf",
      [](const auto& m, auto& pool) { return train_eagle(m, pool, small_options(m, 40)); });
  return *t;
}

// A drafter of the same training whose head scores a reduced draft vocabulary of kDraftVocab of the target's
// 512 tokens: the target's text holds tokens it can never draft.
constexpr int64_t kDraftVocab = 128;

Trained& reduced() {
  static Trained* t = drafter_fixture::train_and_save<EagleTrainResult>(
      2, "eagle_reduced_test.gguf", [](const auto& m, auto& pool) {
        EagleTrainOptions o = small_options(m, 40);
        o.draft_vocab = kDraftVocab;
        std::shared_ptr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::from_gguf(m.file());
        o.is_eog = [tok](int32_t id) { return tok->is_eog(id); };
        return train_eagle(m, pool, o);
      });
  return *t;
}

TEST(EagleDrafter, GreedyOutputEqualsPlainGreedyAtEveryDepth) {
  Trained& t = trained();
  auto source = EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                       model::default_context(*t.target, 0));
  expect_greedy_equals_plain_at_every_depth(*t.target, *t.pool, *source);
}

TEST(EagleDrafter, TreeEqualsChainEqualsPlainGreedyOnEveryPublicPrompt) {
  Trained& t = trained();
  auto source = EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                       model::default_context(*t.target, 0));
  engine::SpecStats chain_stats;
  std::map<int, engine::SpecStats> tree_stats;
  for (const auto& prompt : golden_prompts()) {
    const std::vector<int32_t> plain = run(*t.target, *t.pool, nullptr, prompt, 0);
    engine::SpecStats st;
    ASSERT_EQ(run(*t.target, *t.pool, source.get(), prompt, 4, &st), plain);
    chain_stats.add(st);
    for (int nodes : {2, 5, 12, 24}) {
      ASSERT_EQ(run(*t.target, *t.pool, source.get(), prompt, 8, &st, nodes), plain)
          << nodes << " nodes, prompt of " << prompt.size() << " tokens";
      tree_stats[nodes].add(st);
    }
  }
  for (const auto& [nodes, st] : tree_stats) {
    EXPECT_GT(st.tree_rounds, 0) << nodes << " nodes";
    EXPECT_GT(st.accepted, 0) << nodes << " nodes";
    EXPECT_LT(st.accepted, st.drafted) << nodes << " nodes";
  }
  EXPECT_GT(tree_stats[12].drafted, tree_stats[2].drafted) << "a larger budget verifies more nodes";
}

// With one child per node a tree is the chain: the same drafts, each node's row the bits of the chain's row
// for the same draft (the last node's output hidden state equals the chain's last row's).
TEST(EagleDrafter, OneBranchTreeIsTheChain) {
  Trained& t = trained();
  auto source = EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                       model::default_context(*t.target, 0));
  source->tree_branch = 1;
  const std::vector<int32_t> prompt = golden_prompts().front();
  model::Session s(*t.target, *t.pool, model::SessionOptions{});
  DraftSettings settings;
  settings.sampling.temperature = 0.0f;
  source->begin(prompt, settings);
  const model::CaptureFn fn = tap_capture(*t.target, *source);
  s.eval(std::span<const int32_t>(prompt).first(prompt.size() - 1), false, &fn);
  Draft chain, tree;
  source->propose(prompt, 6, chain);
  ASSERT_EQ(chain.tokens.size(), 6u);
  // The chain's last row ran for its fifth draft; the tree's last forward evaluated its fifth node too.
  const std::vector<float> chain_last(source->last_hidden().begin(), source->last_hidden().end());
  source->accept(prompt, 0);
  source->propose_tree(prompt, 6, 6, tree);
  EXPECT_EQ(tree.tokens, chain.tokens);
  EXPECT_EQ(tree.tree.parent, (std::vector<int32_t>{-1, 0, 1, 2, 3, 4}));
  ASSERT_EQ(tree.score.size(), 6u);
  for (size_t i = 1; i < tree.score.size(); ++i) {
    EXPECT_LE(tree.score[i], tree.score[i - 1]);
    EXPECT_GT(tree.score[i], 0.0f);
  }
  EXPECT_FALSE(tree.sampled);
  const std::vector<float> tree_last(source->last_hidden().begin(), source->last_hidden().end());
  EXPECT_EQ(tree_last, chain_last);
  source->accept(prompt, 0);
  EXPECT_EQ(source->cache_length(), static_cast<int64_t>(prompt.size()) - 1);
}

// Forwards every call to an EAGLE source and, after each round settles, checks it against a fresh source
// given the taps of a plain target forward over the committed text: the same taps, bit for bit, and the
// same next proposals (chain and tree) with the same cache.
class CheckedEagle final : public DraftSource {
 public:
  CheckedEagle(EagleDraftSource& used, EagleDraftSource& fresh, const model::Model& target, ThreadPool& pool)
      : used_(used), fresh_(fresh), target_(target), pool_(pool) {}
  std::string_view kind() const override { return used_.kind(); }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override {
    settings_ = settings;
    used_.begin(prompt, settings);
  }
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override {
    used_.propose(committed, max_depth, out);
  }
  void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) override {
    used_.propose_tree(committed, max_nodes, max_depth, out);
    trees_ += out.tree.empty() ? 0 : 1;
  }
  bool follows_tree_rows() const override { return used_.follows_tree_rows(); }
  void on_tree_kept(int64_t base, std::span<const int32_t> rows) override {
    for (size_t i = 0; i < rows.size(); ++i) moved_ += rows[i] != static_cast<int32_t>(i) ? 1 : 0;
    used_.on_tree_kept(base, rows);
  }
  std::span<const int64_t> target_layers() const override { return used_.target_layers(); }
  void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                        int64_t first_pos) override {
    used_.on_target_hidden(layer, hidden, n_rows, first_pos);
  }
  void accept(std::span<const int32_t> committed, int n_accepted) override {
    used_.accept(committed, n_accepted);
    ++rounds_;
    const auto n = static_cast<int64_t>(committed.size());
    ASSERT_EQ(used_.tap_store().length(), n - 1);
    // A fresh source fed by a plain forward over the committed text but its last token.
    fresh_.begin(committed, settings_);
    model::Session s(target_, pool_, model::SessionOptions{});
    const model::CaptureFn fn = tap_capture(target_, fresh_);
    s.eval(committed.first(static_cast<size_t>(n - 1)), false, &fn);
    const std::span<const float> a = used_.tap_store().rows(0, n - 1), b = fresh_.tap_store().rows(0, n - 1);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "taps after round " << rounds_;
    Draft x, y;
    used_.propose(committed, 3, x);
    fresh_.propose(committed, 3, y);
    EXPECT_EQ(x.tokens, y.tokens) << "round " << rounds_;
    ASSERT_EQ(used_.cache_length(), fresh_.cache_length());
    EXPECT_EQ(0, std::memcmp(used_.cached_keys().data(), fresh_.cached_keys().data(),
                             used_.cached_keys().size() * sizeof(float)))
        << "drafter cache after round " << rounds_;
    used_.accept(committed, 0);
    fresh_.accept(committed, 0);
    used_.propose_tree(committed, 10, 4, x);
    fresh_.propose_tree(committed, 10, 4, y);
    EXPECT_EQ(x.tokens, y.tokens) << "round " << rounds_;
    EXPECT_EQ(x.tree.parent, y.tree.parent) << "round " << rounds_;
    used_.accept(committed, 0);
  }
  int rounds_ = 0, trees_ = 0, moved_ = 0;  // moved_: tap rows a kept path moved

 private:
  EagleDraftSource& used_;
  EagleDraftSource& fresh_;
  const model::Model& target_;
  ThreadPool& pool_;
  DraftSettings settings_;
};

TEST(EagleDrafter, AfterEveryTreeRoundTheDrafterEqualsAFreshOne) {
  Trained& t = trained();
  const int64_t n_ctx = model::default_context(*t.target, 0);
  auto used =
      EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool, n_ctx);
  auto fresh =
      EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool, n_ctx);
  const auto prompts = golden_prompts();
  engine::SpecStats total;
  int moved = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    CheckedEagle checked(*used, *fresh, *t.target, *t.pool);
    engine::SpecStats st;
    EXPECT_EQ(run(*t.target, *t.pool, &checked, prompts[i], 6, &st, 10),
              run(*t.target, *t.pool, nullptr, prompts[i], 0));
    EXPECT_EQ(checked.rounds_, st.target_forwards) << "every target forward settles a round";
    EXPECT_GT(checked.trees_, 0);
    total.add(st);
    moved += checked.moved_;
  }
  EXPECT_GT(total.tree_rounds, 0);
  EXPECT_GT(total.accepted, 0);
  EXPECT_GT(moved, 0) << "no accepted path ran through a node past the first path";
}

// Sampled generations with EAGLE trees (deterministic nodes, verified by recursive rejection sampling over
// siblings): the first committed token follows the target sampler's p at the prompt, by a one-sample
// chi-square over bins of expected count >= 5.
TEST(EagleDrafter, SampledTreesKeepTheFirstTokensDistribution) {
  Trained& t = trained();
  constexpr int kRuns = 1200;
  auto source = EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                       model::default_context(*t.target, 0));
  sampling::Params params;
  params.temperature = 1.0f;
  params.top_k = 0;
  params.top_p = 0.9f;
  params.min_p = 0.0f;
  // The prompt: the shortest head of a story at which a child of the drafter's tree root has a target
  // probability in [0.02, 0.98], so that rounds both accept and reject.
  const std::vector<int32_t> text = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395,
                                     317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265,
                                     282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266};
  sampling::Sampler sampler(params);
  sampling::Distribution p;
  std::vector<int32_t> prompt;
  for (size_t n = 5; n < text.size() && prompt.empty(); ++n) {
    const std::span<const int32_t> head(text.data(), n);
    model::Session s(*t.target, *t.pool, model::SessionOptions{});
    source->begin(head, {});
    const model::CaptureFn fn = tap_capture(*t.target, *source);
    s.eval(head.first(n - 1), false, &fn);
    Draft tree;
    source->propose_tree(head, 8, 4, tree);
    source->accept(head, 0);
    sampler.distribution(s.eval(head.subspan(n - 1)), head, p);
    for (size_t i = 0; i < tree.tokens.size(); ++i) {
      const float px = p.prob_of(tree.tokens[i]);
      if (tree.tree.parent[i] < 0 && px >= 0.02f && px <= 0.98f) prompt.assign(head.begin(), head.end());
    }
  }
  ASSERT_FALSE(prompt.empty());
  engine::SpecOptions o;
  o.generate.max_tokens = 6;
  o.generate.sampling = params;
  o.draft_max = 4;
  o.use_gate = false;
  o.tree_nodes = 8;
  model::Session run_session(*t.target, *t.pool, model::SessionOptions{});
  const auto [counts, total] = sample_first_tokens(run_session, *source, prompt, o, 5000, kRuns);
  EXPECT_EQ(total.tree_rounds, kRuns);
  EXPECT_GT(total.accepted, 0);
  EXPECT_LT(total.accepted, total.drafted);
  const testing::ChiSquare c = testing::chi_square(p.ids, p.probs, counts, kRuns);
  EXPECT_EQ(c.outside, 0) << "a token outside the target's top-p set was sampled";
  ASSERT_GE(c.bins, 3);
  EXPECT_LT(c.chi2, testing::chi2_critical_1e4(c.bins - 1));
}

// Drafting runs the network training runs, at every depth of layers: the source's output hidden state of
// the last real row (after 100 rows, so two chunks of its cache catch-up) equals the training forward's
// under a causal mask, for drafters of 1, 2 and 3 layers.
TEST(EagleDrafter, DraftingRunsTheTrainedNetworkAtEveryDepthOfLayers) {
  Trained& t = trained();
  constexpr int64_t n = 101;
  for (int64_t layers = 1; layers <= 3; ++layers) {
    train::EagleConfig cfg = eagle_config_for(*t.target, 3);
    cfg.n_layer = layers;
    auto drafter = std::make_unique<train::EagleDrafter>(cfg, n - 1);
    drafter->init(static_cast<uint64_t>(7 + layers));
    copy_target_weights(*t.target, *drafter);
    ASSERT_EQ(drafter->params().size(), 14 + 9 * static_cast<size_t>(layers - 1));

    const int64_t width = cfg.n_taps * cfg.d;
    std::vector<float> taps(static_cast<size_t>(n * width));
    for (size_t i = 0; i < taps.size(); ++i) taps[i] = std::sin(0.37f * static_cast<float>(i));
    std::vector<int32_t> tokens(static_cast<size_t>(n)), pos(static_cast<size_t>(n - 1));
    for (int64_t i = 0; i < n; ++i)
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>((13 * i + 5) % cfg.vocab);
    for (int64_t i = 0; i + 1 < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const train::AttentionMask mask = train::AttentionMask::causal(n - 1);
    std::vector<float> probs(static_cast<size_t>((n - 1) * cfg.vocab), 1.0f / static_cast<float>(cfg.vocab));
    train::EagleBatch b;
    b.rows = n - 1;
    b.taps = taps.data();
    b.next_ids = tokens.data() + 1;
    b.pos = pos.data();
    b.mask = &mask;
    b.targets.rows = n - 1;
    b.targets.top_k = cfg.vocab;
    b.targets.probs = probs.data();
    train::Compute c(*t.pool);
    drafter->forward_backward(b, c, false);
    const std::vector<float> expected(drafter->output_hidden() + (n - 2) * cfg.d,
                                      drafter->output_hidden() + (n - 1) * cfg.d);

    EagleDraftSource source(std::move(drafter), default_eagle_taps(t.target->config().n_layer), *t.pool, 256,
                            *t.target);
    DraftSettings settings;
    settings.sampling.temperature = 0.0f;
    source.begin(std::span<const int32_t>(tokens).first(1), settings);
    source.set_taps(0, taps);
    Draft draft;
    source.propose(tokens, 1, draft);
    ASSERT_EQ(draft.tokens.size(), 1u);
    const std::span<const float> got = source.last_hidden();
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(got[i], expected[i], 1e-4f * (1.0f + std::abs(expected[i])))
          << layers << " layers, [" << i << "]";
  }
}

TEST(EagleDrafter, LoadedCheckpointDraftsLikeTheTrainedOne) {
  Trained& t = trained();
  auto loaded = EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                       model::default_context(*t.target, 0));
  const std::vector<int32_t> prompt = golden_prompts().front();
  engine::SpecStats a, b;
  run(*t.target, *t.pool, t.result.source.get(), prompt, 6, &a);
  run(*t.target, *t.pool, loaded.get(), prompt, 6, &b);
  EXPECT_EQ(a.accepted, b.accepted);
  EXPECT_EQ(a.target_forwards, b.target_forwards);
}

TEST(EagleDrafter, ProbeProposalLeavesTheCacheAsItWas) {
  Trained& t = trained();
  EagleDraftSource& src = *t.result.source;
  const std::vector<int32_t> prompt = golden_prompts().front();
  model::Session s(*t.target, *t.pool, model::SessionOptions{});
  src.begin(prompt, {});
  const model::CaptureFn fn = tap_capture(*t.target, src);
  s.eval(prompt, false, &fn);
  EXPECT_EQ(src.tap_store().length(), static_cast<int64_t>(prompt.size()));
  std::vector<int32_t> committed = prompt;
  committed.push_back(432);
  Draft d;
  src.propose(committed, 1, d);
  const std::vector<float> before(src.cached_keys().begin(), src.cached_keys().end());
  src.propose(committed, 6, d);
  EXPECT_GT(src.cache_length(), static_cast<int64_t>(committed.size()) - 1);
  src.accept(committed, 0);
  EXPECT_EQ(src.cache_length(), static_cast<int64_t>(committed.size()) - 1);
  EXPECT_EQ(src.tap_store().length(), static_cast<int64_t>(committed.size()) - 1);
  const std::vector<float> after(src.cached_keys().begin(), src.cached_keys().end());
  EXPECT_EQ(before, after);
  // A rollback to a shorter text forgets the taps past it.
  src.accept(std::span<const int32_t>(committed).first(3), 0);
  EXPECT_EQ(src.tap_store().length(), 2);
}

TEST(EagleDrafter, RefusedByAnotherTarget) {
  Trained& t = trained();
  auto other = model::Model::load(testing::shared_path("models/llama2xs-tok512.gguf"));
  const std::string other_hash = file_fingerprint(testing::shared_path("models/llama2xs-tok512.gguf"));
  try {
    EagleDraftSource::load(t.checkpoint, *other, other_hash, *t.pool, 256);
    FAIL() << "a drafter for stories260K was accepted by llama2xs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another target file"), std::string::npos) << e.what();
  }
  train::DrafterInfo info = t.result.info;
  info.tap_layers.back() = 9;
  try {
    check_eagle_target(info, *t.target, info.target_file_hash);
    FAIL() << "tap layer 9 of a 5-layer target was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tap layers"), std::string::npos) << e.what();
  }
  info = t.result.info;
  info.target_vocab_hash = "0123456789abcdef";
  try {
    check_eagle_target(info, *t.target, info.target_file_hash);
    FAIL() << "a drafter of another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
}

TEST(EagleDrafter, TrainingRepeatsForAFixedSeed) {
  Trained& t = trained();
  EagleTrainOptions o = small_options(*t.target, 4);
  o.tokens = 256;
  EagleTrainResult a = train_eagle(*t.target, *t.pool, o);
  EagleTrainResult b = train_eagle(*t.target, *t.pool, o);
  const auto pa = a.source->drafter().params(), pb = b.source->drafter().params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i]->value, pb[i]->value) << pa[i]->name;
  o.seed = 6;
  EagleTrainResult c = train_eagle(*t.target, *t.pool, o);
  EXPECT_NE(pa[0]->value, c.source->drafter().params()[0]->value);
}

TEST(EagleDrafter, StoppedAndResumedTrainingReachesTheSameWeights) {
  Trained& t = trained();
  EagleTrainOptions o = small_options(*t.target, 6);
  o.tokens = 256;
  o.target_file_hash = file_fingerprint(target_path());
  o.checkpoint = private_temp_file("eagle_resume_test.gguf");
  const EagleTrainResult whole = train_eagle(*t.target, *t.pool, o);
  ASSERT_FALSE(whole.stopped);

  int64_t trained_steps = 0;
  o.on_progress = [&](const EagleTrainProgress& p) {
    if (std::string(p.phase) == "train") trained_steps = p.done;
  };
  o.stop = [&] { return trained_steps >= 3; };
  const EagleTrainResult first = train_eagle(*t.target, *t.pool, o);
  ASSERT_TRUE(first.stopped);
  EXPECT_EQ(first.source, nullptr);
  const train::DrafterInfo saved = train::load_drafter(o.checkpoint, {});
  EXPECT_EQ(saved.step, 3);
  EXPECT_EQ(saved.total_steps, 6);

  o.stop = nullptr;
  o.resume = true;
  const EagleTrainResult rest = train_eagle(*t.target, *t.pool, o);
  ASSERT_FALSE(rest.stopped);
  const auto pw = whole.source->drafter().params(), pr = rest.source->drafter().params();
  ASSERT_EQ(pw.size(), pr.size());
  for (size_t i = 0; i < pw.size(); ++i) EXPECT_EQ(pw[i]->value, pr[i]->value) << pw[i]->name;
  EXPECT_EQ(whole.info.acceptance, rest.info.acceptance);

  o.layers = 2;  // not the shape it was started with
  try {
    train_eagle(*t.target, *t.pool, o);
    FAIL() << "resumed with another --layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--layers 1"), std::string::npos) << e.what();
  }
  o.layers = 1;
  o.seed = 9;  // not the options it was started with
  try {
    train_eagle(*t.target, *t.pool, o);
    FAIL() << "resumed with another --seed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--seed"), std::string::npos) << e.what();
  }
}

// The command itself: SIGINT while it trains leaves a resumable checkpoint and a clean exit; --resume then
// writes the file an uninterrupted run writes, byte for byte.
TEST(EagleDrafter, InterruptedCommandResumesToTheSameFile) {
  const testing::TempDir dir("eagle_sigint");
  const std::string tandem(TANDEM_BINARY), base = tandem + " train-drafter -m '" + target_path() +
                                                  "' -t 1 --tokens 512 --steps 150 --unroll 2 --seed 3 -o ";
  const std::string whole = dir.file("whole.gguf"), cut = dir.file("cut.gguf"), log = dir.file("log");
  ASSERT_EQ(testing::run_command(base + "'" + whole + "' 2>/dev/null").second, 0);
  // Wait (at most 60 s) for the training phase, then interrupt it.
  const auto [out, rc] = testing::run_command(
      base + "'" + cut + "' 2>'" + log + "' & pid=$!; for i in $(seq 600); do grep -q 'train ' '" + log +
      "' && break; sleep 0.1; done; kill -INT $pid; wait $pid; echo \"rc=$?\"; cat '" + log + "'");
  ASSERT_EQ(rc, 0) << out;
  ASSERT_NE(out.find("rc=0"), std::string::npos) << out;
  ASSERT_NE(out.find("interrupted at step"), std::string::npos) << out;
  const auto [info, info_rc] = testing::run_command(tandem + " info -m '" + cut + "'");
  EXPECT_NE(info.find("optimizer state stored (resumable)"), std::string::npos) << info;
  ASSERT_EQ(testing::run_command(base + "'" + cut + "' --resume 2>/dev/null").second, 0);
  const auto [diff, diff_rc] = testing::run_command("cmp '" + whole + "' '" + cut + "'");
  EXPECT_EQ(diff_rc, 0) << diff;
}

// The gate plans with each drafter's own measured cost, calibrated under its kind and file (not the zero
// cost of a lookup, nor a draft model's).
// The draft vocabulary's tokens: end-of-generation tokens first, then the training text's generated tokens
// by count (ties: summed target probability, then id), held-out text and prompts not counted; ascending.
TEST(EagleDrafter, DraftVocabularyTakesTheMostFrequentGeneratedTokens) {
  EXPECT_EQ(draft_vocab_size(-1, 512), 0);
  EXPECT_EQ(draft_vocab_size(-1, 32000), kDraftVocabDefault);
  EXPECT_EQ(draft_vocab_size(512, 512), 0);
  EXPECT_EQ(draft_vocab_size(0, 32000), 0);
  EXPECT_EQ(draft_vocab_size(100, 512), 100);

  DrafterData data;
  data.k = 10;  // full rows over a vocabulary of 10
  const auto sequence = [&](std::vector<int32_t> tokens, int64_t prompt, bool heldout) {
    DrafterSequence s;
    s.tokens = std::move(tokens);
    s.prompt = prompt;
    s.heldout = heldout;
    s.mask.assign(s.tokens.size(), 0);
    s.probs.assign(s.tokens.size() * 10, f32_to_fp16(0.0f));
    for (size_t r = static_cast<size_t>(prompt - 1); r < s.tokens.size(); ++r) {
      s.mask[r] = 1;
      s.probs[r * 10 + 8] = f32_to_fp16(0.75f);  // token 8: no count, but mass
      s.probs[r * 10 + 3] = f32_to_fp16(0.25f);
    }
    data.sequences.push_back(s);
  };
  sequence({1, 9, 9, 5, 5, 5, 7, 7, 6}, 3, false);  // prompt 1 9 9; generated 5 x3, 7 x2, 6
  sequence({1, 4, 4, 4, 4, 4}, 1, true);            // held out: 4 does not count
  const auto is_eog = [](int32_t id) { return id == 2; };
  EXPECT_EQ(select_draft_vocab(data, 4, 10, is_eog), (std::vector<int32_t>{2, 5, 6, 7}));
  EXPECT_EQ(select_draft_vocab(data, 5, 10, is_eog), (std::vector<int32_t>{2, 5, 6, 7, 8}));
  EXPECT_EQ(select_draft_vocab(data, 1, 10, is_eog), (std::vector<int32_t>{2}));
  EXPECT_EQ(select_draft_vocab(data, 2, 10, nullptr), (std::vector<int32_t>{5, 7}));
  EXPECT_TRUE(select_draft_vocab(data, 10, 10, is_eog).empty()) << "the whole vocabulary";
  EXPECT_TRUE(select_draft_vocab(data, 0, 10, is_eog).empty()) << "the whole vocabulary";
}

// Targets restricted to a draft vocabulary, over draft ids, renormalised; a row with no mass inside it is
// masked.
TEST(EagleDrafter, TargetRowsRestrictToTheDraftVocabulary) {
  DrafterSequence s;
  s.tokens = {1, 2, 3};
  s.probs.assign(3 * 4, f32_to_fp16(0.0f));
  // Full rows over a vocabulary of 4: row 0 (0.5, 0.25, 0, 0.25), row 1 all on token 3.
  s.probs[0] = f32_to_fp16(0.5f);
  s.probs[1] = f32_to_fp16(0.25f);
  s.probs[3] = f32_to_fp16(0.25f);
  s.probs[4 + 3] = f32_to_fp16(1.0f);
  const std::vector<int32_t> draft = {0, 1};
  TargetRows full(2, 4, 4, draft);
  full.set(0, s, 0);
  full.set(1, s, 1);
  const std::vector<uint8_t> mask = {1, 1};
  const train::SoftTargets t = full.view(2, nullptr, mask.data());
  EXPECT_EQ(t.top_k, 2);
  EXPECT_EQ(t.ids, nullptr);
  EXPECT_NEAR(t.probs[0], 2.0f / 3.0f, 1e-6f);
  EXPECT_NEAR(t.probs[1], 1.0f / 3.0f, 1e-6f);
  EXPECT_EQ(t.mask[0], 1);
  EXPECT_EQ(t.mask[1], 0) << "no mass inside the draft vocabulary";

  // Top-2 rows over a vocabulary of 8, draft vocabulary {3, 5, 6}: row 0 lists 3 (0.4) and 4 (0.4), 0.2 over.
  DrafterSequence k;
  k.tokens = {1, 2};
  k.ids = {3, 4, 0, 1};
  k.probs = {f32_to_fp16(0.4f), f32_to_fp16(0.4f), f32_to_fp16(0.5f), f32_to_fp16(0.5f)};
  k.rest = {0.2f, 0.0f};
  const std::vector<int32_t> draft8 = {3, 5, 6};
  TargetRows top(2, 2, 8, draft8);
  top.set(0, k, 0);
  const train::SoftTargets u = top.view(1, nullptr, nullptr);
  EXPECT_EQ(u.top_k, 2);
  ASSERT_NE(u.ids, nullptr);
  EXPECT_EQ(u.ids[0], 0) << "target id 3 is draft id 0";
  EXPECT_EQ(u.ids[1], -1) << "target id 4 is outside: unused";
  EXPECT_NEAR(u.probs[0], 0.4f / 0.6f, 1e-3f);
  EXPECT_EQ(u.probs[1], 0.0f);
  EXPECT_NEAR(u.rest[0], 0.2f / 0.6f, 1e-3f);
  EXPECT_EQ(u.mask[0], 1);
  EXPECT_NO_THROW(train::validate_targets(u, 3));
}

// The target's weights as the drafters read them, on quantized targets whose head the loader may repack:
// the gathered head rows score exactly as the target's whole head does at those ids (the same kernels on
// the same bytes), expand() puts them at their target ids with -inf elsewhere, embed() and the training
// copies (copy_target_rows) equal the file's own rows dequantized, and bad ids are refused.
TEST(EagleDrafter, TargetVocabGathersTheHeadRowsOfQuantizedTargets) {
  for (const char* type : {"Q4_0", "Q8_0", "Q6_K"}) {
    const std::string path =
        testing::shared_path(std::string("models/synth/synth-llama-d256-") + type + ".gguf");
    auto target = model::Model::load(path);
    const gguf::File original = gguf::File::open(path);  // the file's own bytes, never repacked
    const int64_t V = target->config().n_vocab, d = target->config().n_embd;
    const std::vector<int32_t> ids = {0, 2, 3, 17, 100, 255, 256, 300, 411, 511};
    const TargetVocab vocab(*target, ids, d);
    ASSERT_EQ(vocab.size(), static_cast<int64_t>(ids.size()));
    EXPECT_EQ(vocab.head().type, target->weights().output.type) << type << ": the stored block type";

    ThreadPool pool(2);
    kernels::MatmulScratch mm(pool.size(), d, 1);
    std::vector<float> x(static_cast<size_t>(d)), all(static_cast<size_t>(V)), some(ids.size()),
        full(static_cast<size_t>(V));
    for (int64_t i = 0; i < d; ++i) x[static_cast<size_t>(i)] = std::sin(0.3f * static_cast<float>(i));
    kernels::matmul(target->weights().output, x.data(), 1, all.data(), pool, mm);
    kernels::matmul(vocab.head(), x.data(), 1, some.data(), pool, mm);
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_NEAR(some[i], all[static_cast<size_t>(ids[i])],
                  1e-4f * (1.0f + std::abs(all[static_cast<size_t>(ids[i])])))
          << type << ", id " << ids[i];
    vocab.expand(some.data(), full.data());
    for (int64_t id = 0; id < V; ++id) {
      const auto it = std::lower_bound(ids.begin(), ids.end(), static_cast<int32_t>(id));
      if (it != ids.end() && *it == id)
        EXPECT_EQ(full[static_cast<size_t>(id)], some[static_cast<size_t>(it - ids.begin())]);
      else
        EXPECT_EQ(full[static_cast<size_t>(id)], -INFINITY) << id;
    }

    // The training copies and the embedding, against the file's rows.
    const gguf::TensorInfo* head = original.tensor("output.weight");
    if (head == nullptr) head = original.tensor("token_embd.weight");
    const gguf::TensorInfo* embd = original.tensor("token_embd.weight");
    ASSERT_NE(head, nullptr);
    ASSERT_NE(embd, nullptr);
    train::Param rows("output.weight", static_cast<int64_t>(ids.size()), d, false, false);
    copy_target_rows(*target, true, ids, rows);
    std::vector<float> want(static_cast<size_t>(d)), got(static_cast<size_t>(d));
    const size_t head_row = head->bytes / static_cast<size_t>(V),
                 embd_row = embd->bytes / static_cast<size_t>(V);
    for (size_t i = 0; i < ids.size(); ++i) {
      dequantize_row(head->type, head->data + static_cast<size_t>(ids[i]) * head_row, want.data(), d);
      EXPECT_EQ(0, std::memcmp(want.data(), rows.value.data() + static_cast<int64_t>(i) * d, want.size() * 4))
          << type << ": head row " << ids[i];
      dequantize_row(embd->type, embd->data + static_cast<size_t>(ids[i]) * embd_row, want.data(), d);
      vocab.embed(ids[i], got.data());
      EXPECT_EQ(want, got) << type << ": embedding row " << ids[i];
    }
    EXPECT_THROW(vocab.embed(static_cast<int32_t>(V), got.data()), Error);
    const std::vector<int32_t> twice = {3, 3}, outside = {3, static_cast<int32_t>(V)};
    EXPECT_THROW(TargetVocab(*target, twice, d), Error);
    EXPECT_THROW(TargetVocab(*target, outside, d), Error);
  }
}

// A reduced draft vocabulary: the file lists kDraftVocab ascending ids, the end-of-text token among them;
// the loaded drafter's head has that many rows; speculative greedy output equals plain greedy output at
// every depth although the target's text holds tokens outside it, and every draft is a token inside it.
TEST(EagleDrafter, ReducedVocabularyKeepsGreedyOutputAndDraftsOnlyItsTokens) {
  Trained& t = reduced();
  const std::vector<int32_t>& ids = t.result.info.draft_vocab;
  ASSERT_EQ(ids.size(), static_cast<size_t>(kDraftVocab));
  EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
  const auto tok = tokenizer::Tokenizer::from_gguf(t.target->file());
  ASSERT_GE(tok->eos_id(), 0);
  EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), tok->eos_id())) << "the end-of-text token";
  const std::set<int32_t> inside(ids.begin(), ids.end());

  auto source = EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                       model::default_context(*t.target, 0));
  EXPECT_EQ(source->vocab().size(), kDraftVocab);
  EXPECT_EQ(source->vocab().head().rows, kDraftVocab);
  EXPECT_TRUE(source->drafter().embedding().value.empty()) << "no f32 copy of the target's embedding";
  EXPECT_TRUE(source->drafter().head().value.empty()) << "no f32 copy of the target's head";
  int64_t outside = 0, accepted = 0, drafts = 0;
  for (const auto& prompt : golden_prompts()) {
    const std::vector<int32_t> plain = run(*t.target, *t.pool, nullptr, prompt, 0);
    for (int32_t x : plain) outside += inside.count(x) == 0 ? 1 : 0;
    for (int depth : {1, 2, 4, 8}) {
      engine::SpecStats st;
      EXPECT_EQ(run(*t.target, *t.pool, source.get(), prompt, depth, &st), plain)
          << "depth " << depth << ", prompt of " << prompt.size() << " tokens";
      accepted += st.accepted;
    }
    engine::SpecStats tree_stats;
    EXPECT_EQ(run(*t.target, *t.pool, source.get(), prompt, 8, &tree_stats, 12), plain)
        << "trees of 12 nodes";
    EXPECT_GT(tree_stats.tree_rounds, 0);
    // The source holds the taps of the whole text now: drafts (chains and trees) from every prefix of it.
    std::vector<int32_t> text = prompt;
    text.insert(text.end(), plain.begin(), plain.end() - 1);
    Draft d;
    for (size_t n = prompt.size(); n <= text.size(); ++n) {
      source->propose(std::span<const int32_t>(text).first(n), 8, d);
      for (int32_t x : d.tokens) {
        EXPECT_EQ(inside.count(x), 1u) << "drafted token " << x << " is outside the draft vocabulary";
        ++drafts;
      }
      source->accept(std::span<const int32_t>(text).first(n), 0);
      source->propose_tree(std::span<const int32_t>(text).first(n), 12, 6, d);
      for (int32_t x : d.tokens) {
        EXPECT_EQ(inside.count(x), 1u) << "tree node " << x << " is outside the draft vocabulary";
        ++drafts;
      }
      source->accept(std::span<const int32_t>(text).first(n), 0);
    }
  }
  EXPECT_GT(outside, 0) << "the target's text never left the draft vocabulary: the test proves nothing";
  EXPECT_GT(accepted, 0) << "the reduced drafter never had a draft accepted";
  EXPECT_GT(drafts, 0);
}

// Sampled verification with a reduced draft vocabulary's q (zero outside it): every q lies inside the draft
// vocabulary, and the first sampled token follows the target sampler's p (one-sample chi-square at
// false-alarm rate 1e-4) over 1200 seeds, on the golden prompt whose p spreads over the most tokens.
TEST(EagleDrafter, ReducedVocabularySampledFirstTokenFollowsTheTargetDistribution) {
  Trained& t = reduced();
  EagleDraftSource& src = *t.result.source;
  const std::vector<int32_t>& ids = t.result.info.draft_vocab;
  sampling::Params params;
  params.temperature = 1.0f;
  params.top_k = 0;
  params.top_p = 0.95f;
  params.min_p = 0.0f;
  model::Session s(*t.target, *t.pool, model::SessionOptions{});
  sampling::Sampler sampler(params);
  std::vector<int32_t> prompt;
  sampling::Distribution p, candidate;
  for (const std::vector<int32_t>& g : golden_prompts()) {
    s.truncate(0);
    sampler.distribution(s.eval(g), g, candidate);
    if (candidate.size() > p.size()) prompt = g, p = candidate;
  }
  ASSERT_GE(p.size(), 4u);
  int64_t p_outside = 0;
  for (int32_t x : p.ids) p_outside += std::binary_search(ids.begin(), ids.end(), x) ? 0 : 1;
  EXPECT_GT(p_outside, 0) << "the target's p lies inside the draft vocabulary: q = 0 is never tested";

  constexpr int kRuns = 1200;
  engine::SpecOptions o;
  o.generate.max_tokens = 4;
  o.generate.sampling = params;
  o.draft_max = 4;
  o.use_gate = false;
  const auto [counts, total] = sample_first_tokens(s, src, prompt, o, 1000, kRuns);
  EXPECT_GT(total.accepted, 0);
  EXPECT_LT(total.accepted, total.drafted);
  const testing::ChiSquare c = testing::chi_square(p.ids, p.probs, counts, kRuns);
  EXPECT_EQ(c.outside, 0) << "a token outside the target's top-p set was sampled";
  EXPECT_LT(c.chi2, testing::chi2_critical_1e4(c.bins - 1));

  // The drafter's q of a sampled proposal: a distribution inside the draft vocabulary.
  DraftSettings ds;
  ds.sampling = params;
  src.begin(prompt, ds);
  s.truncate(0);
  const model::CaptureFn fn = tap_capture(*t.target, src);
  s.eval(prompt, false, &fn);
  std::vector<int32_t> committed = prompt;
  committed.push_back(p.ids.front());
  Draft d;
  src.propose(committed, 4, d);
  ASSERT_TRUE(d.sampled);
  ASSERT_EQ(d.tokens.size(), 4u);
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    double sum = 0;
    for (size_t j = 0; j < d.q[i].size(); ++j) {
      EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), d.q[i].ids[j])) << d.q[i].ids[j];
      sum += d.q[i].probs[j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_GT(d.q[i].prob_of(d.tokens[i]), 0.0f);
  }
  src.accept(std::span<const int32_t>(committed).first(1), 0);
}

// `tandem train-drafter --draft-vocab` writes a drafter of that many tokens, which `tandem info` shows.
TEST(EagleDrafter, CommandWritesAndInfoShowsTheDraftVocabulary) {
  const testing::TempDir dir("eagle_draft_vocab");
  const std::string out = dir.file("drafter.gguf");
  const auto [trained_out, rc] =
      testing::run_command(std::string(TANDEM_BINARY) + " train-drafter -m '" + target_path() + "' -o '" +
                           out + "' -t 1 --tokens 128 --steps 2 --draft-vocab 64 2>&1");
  ASSERT_EQ(rc, 0) << trained_out;
  EXPECT_NE(trained_out.find("draft vocabulary: 64 of 512 tokens"), std::string::npos) << trained_out;
  const auto [info, info_rc] = testing::run_command(std::string(TANDEM_BINARY) + " info -m '" + out + "'");
  ASSERT_EQ(info_rc, 0) << info;
  EXPECT_NE(info.find("draft vocabulary: 64 of the target's 512 tokens"), std::string::npos) << info;
  // The whole vocabulary, by default for a vocabulary this small.
  const auto [whole, whole_rc] =
      testing::run_command(std::string(TANDEM_BINARY) + " info -m '" + trained().checkpoint + "'");
  ASSERT_EQ(whole_rc, 0) << whole;
  EXPECT_NE(whole.find("draft vocabulary: the whole, 512 tokens"), std::string::npos) << whole;
}

TEST(EagleDrafter, CalibrationKeepsTheDrafterItsOwnCost) {
  Trained& t = trained();
  const double cost = measure_eagle_draft_cost(*t.result.source, 1e-3);
  EXPECT_GT(cost, 0.0);
  EXPECT_TRUE(std::isfinite(cost));
  EXPECT_EQ(t.result.source->cache_length(), 0);

  const testing::TempDir dir("eagle_calibration");
  {
    std::ofstream prompts(dir.file("prompts.txt"));
    prompts << "Once upon a time\n";
  }
  const auto [out, rc] =
      testing::run_command("XDG_CACHE_HOME='" + dir.file("cache") + "' " + std::string(TANDEM_BINARY) +
                           " bench-spec -m '" + target_path() + "' --drafter '" + t.checkpoint +
                           "' -t 1 -n 8 --draft-max 3 --prompts '" + dir.file("prompts.txt") + "' 2>&1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("acceptance by draft position (first k drafts all accepted):"), std::string::npos)
      << out;
  std::ifstream in(dir.file("cache") + "/tandem/calibration.json");
  ASSERT_TRUE(in) << out;
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string key = eagle_cost_key(t.checkpoint);
  bool found = false;
  for (const auto& entry : j.at("entries")) {
    if (!entry.contains("draft_per_token") || !entry["draft_per_token"].contains(key)) continue;
    found = true;
    EXPECT_GT(entry["draft_per_token"][key].get<double>(), 0.0);
  }
  EXPECT_TRUE(found) << key << " not in " << j.dump();
}

TEST(EagleDrafter, InfoShowsKindTargetTapsSizeAndAcceptance) {
  Trained& t = trained();
  const auto [out, rc] = testing::run_command(std::string(TANDEM_BINARY) + " info -m '" + t.checkpoint + "'");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("kind eagle3"), std::string::npos) << out;
  EXPECT_NE(out.find("file hash " + t.result.info.target_file_hash), std::string::npos) << out;
  EXPECT_NE(out.find("vocabulary hash " + t.result.info.target_vocab_hash), std::string::npos) << out;
  std::string taps = "taps: target layers";
  for (int32_t l : t.result.info.tap_layers) {
    taps += ' ';
    taps += std::to_string(l);
  }
  taps += '\n';
  EXPECT_NE(out.find(taps), std::string::npos) << out;
  int64_t params = 0;
  for (const train::Param* p : t.result.source->drafter().params())
    if (p->trainable()) params += p->size();
  EXPECT_NE(out.find("size: " + std::to_string(params) + " trained parameters"), std::string::npos) << out;
  ASSERT_FALSE(t.result.info.acceptance.empty());
  char first[32];
  std::snprintf(first, sizeof first, " %.3f", t.result.info.acceptance[0]);
  EXPECT_NE(
      out.find("held-out acceptance by draft position (first k drafts all accepted):" + std::string(first)),
      std::string::npos)
      << out;
}

}  // namespace
}  // namespace tandem::speculative
