// The DFlash block drafter end to end on stories260K: a small drafter trained in a few steps drafts for
// speculative decoding whose greedy output equals plain greedy decoding token for token on every public
// golden prompt at depths 1..8; after a speculative run (rounds rolled back), the drafter's context cache
// equals a fresh source's over the same text; sampled verification keeps the target's distribution; a drafter
// is refused by another target and another kind; a drafter of a reduced draft vocabulary keeps greedy output
// and drafts only its tokens; training repeats bit for bit for a fixed seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "drafter_fixture.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/dflash_train.h"
#include "tandem/speculative/eagle_train.h"
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

DflashTrainOptions small_options(const model::Model& m, int64_t steps) {
  auto tok = tokenizer::Tokenizer::from_gguf(m.file());
  DflashTrainOptions o;
  const auto prompts = default_training_prompts();
  for (size_t i = 0; i < 8; ++i) o.data.prompts.push_back(tok->encode(prompts[i], true, false));
  o.data.tokens = 768;
  o.data.continuation = 64;
  o.data.seed = 5;
  o.steps = steps;
  o.seed = 5;
  o.block = 8;
  o.layers = 2;
  o.anchors = 16;
  return o;
}

using Trained = drafter_fixture::Trained<DflashTrainResult>;

// Threads: one, so that the tests keep their pace on a machine whose cores are shared.
Trained& trained() {
  static Trained* t = drafter_fixture::train_and_save<DflashTrainResult>(
      1, "dflash_drafter_test.gguf",
      [](const auto& m, auto& pool) { return train_dflash(m, pool, small_options(m, 60)); });
  return *t;
}

TEST(DflashDrafter, GreedyOutputEqualsPlainGreedyAtEveryDepth) {
  Trained& t = trained();
  auto source = DflashDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                        model::default_context(*t.target, 0));
  EXPECT_EQ(source->drafter().config().block, 8);
  expect_greedy_equals_plain_at_every_depth(*t.target, *t.pool, *source);
}

// A reduced draft vocabulary of 128 of the target's 512 tokens: the loaded drafter's head has that many rows
// (the target's, gathered), greedy output equals plain greedy output at every depth although the target's
// text holds tokens outside it, and every draft is a token inside it.
TEST(DflashDrafter, ReducedVocabularyKeepsGreedyOutputAndDraftsOnlyItsTokens) {
  Trained& t = trained();
  DflashTrainOptions o = small_options(*t.target, 30);
  o.draft_vocab = 128;
  DflashTrainResult r = train_dflash(*t.target, *t.pool, o);
  r.info.target_file_hash = file_fingerprint(target_path());
  const std::vector<int32_t> ids = r.info.draft_vocab;
  ASSERT_EQ(ids.size(), 128u);
  const std::string path = private_temp_file("dflash_reduced_test.gguf");
  std::vector<train::Param*> params = r.source->drafter().params();
  train::save_drafter(path, r.info, params);
  auto source = DflashDraftSource::load(path, *t.target, file_fingerprint(target_path()), *t.pool,
                                        model::default_context(*t.target, 0));
  EXPECT_EQ(source->vocab().head().rows, 128);
  EXPECT_GE(source->vocab().bytes(), 128 * t.target->weights().output.row_bytes) << "the gathered rows";
  int64_t outside = 0, accepted = 0;
  for (const auto& prompt : golden_prompts()) {
    const std::vector<int32_t> plain = run(*t.target, *t.pool, nullptr, prompt, 0);
    for (int32_t x : plain) outside += std::binary_search(ids.begin(), ids.end(), x) ? 0 : 1;
    for (int depth : {1, 3, 8}) {
      engine::SpecStats st;
      EXPECT_EQ(run(*t.target, *t.pool, source.get(), prompt, depth, &st), plain)
          << "depth " << depth << ", prompt of " << prompt.size() << " tokens";
      accepted += st.accepted;
    }
    std::vector<int32_t> text = prompt;
    text.insert(text.end(), plain.begin(), plain.end() - 1);
    Draft d;
    for (size_t n = prompt.size(); n <= text.size(); ++n) {
      source->propose(std::span<const int32_t>(text).first(n), 8, d);
      for (int32_t x : d.tokens)
        EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), x)) << "drafted token " << x << " is outside";
      source->accept(std::span<const int32_t>(text).first(n), 0);
    }
  }
  EXPECT_GT(outside, 0) << "the target's text never left the draft vocabulary: the test proves nothing";
  EXPECT_GT(accepted, 0) << "the reduced drafter never had a draft accepted";
}

TEST(DflashDrafter, LoadedCheckpointDraftsLikeTheTrainedOne) {
  Trained& t = trained();
  auto loaded = DflashDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                        model::default_context(*t.target, 0));
  const std::vector<int32_t> prompt = golden_prompts().front();
  engine::SpecStats a, b;
  run(*t.target, *t.pool, t.result.source.get(), prompt, 6, &a);
  run(*t.target, *t.pool, loaded.get(), prompt, 6, &b);
  EXPECT_EQ(a.accepted, b.accepted);
  EXPECT_EQ(a.target_forwards, b.target_forwards);
}

// Feeds `source` the target's taps of text[0 .. n - 2] from one plain forward, as a fresh generation would.
void feed_taps(const Trained& t, DflashDraftSource& source, std::span<const int32_t> text) {
  model::Session s(*t.target, *t.pool, model::SessionOptions{});
  const model::CaptureFn fn = tap_capture(*t.target, source);
  s.eval(text.first(text.size() - 1), false, &fn);
}

// Trees from one block (the chain of each row's best token, siblings where a row is unsure): greedy output
// equals the chain's and plain greedy's on every public prompt at several node budgets, and after each tree
// generation the drafter's taps, context and next proposal equal a fresh drafter's fed a plain forward over
// the committed text.
TEST(DflashDrafter, TreeEqualsChainEqualsPlainGreedyAndLeavesAFreshState) {
  Trained& t = trained();
  const int64_t n_ctx = model::default_context(*t.target, 0);
  auto used =
      DflashDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool, n_ctx);
  auto fresh =
      DflashDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool, n_ctx);
  DraftSettings greedy;
  greedy.sampling.temperature = 0.0f;
  engine::SpecStats small, large;
  int branched = 0;
  for (const auto& prompt : golden_prompts()) {
    const std::vector<int32_t> plain = run(*t.target, *t.pool, nullptr, prompt, 0);
    ASSERT_EQ(run(*t.target, *t.pool, used.get(), prompt, 4), plain);
    engine::SpecStats st;
    ASSERT_EQ(run(*t.target, *t.pool, used.get(), prompt, 8, &st, 3), plain) << "3 nodes";
    small.add(st);
    const std::vector<int32_t> tree = run(*t.target, *t.pool, used.get(), prompt, 8, &st, 12);
    ASSERT_EQ(tree, plain) << "12 nodes";
    large.add(st);

    std::vector<int32_t> text = prompt;
    text.insert(text.end(), tree.begin(), tree.end());
    const auto n = static_cast<int64_t>(text.size());
    ASSERT_EQ(used->tap_store().length(), n - 1);
    fresh->begin(text, greedy);
    feed_taps(t, *fresh, text);
    const std::span<const float> a = used->tap_store().rows(0, n - 1), b = fresh->tap_store().rows(0, n - 1);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "taps after the tree rounds";
    Draft x, y;
    used->propose_tree(text, 8, 8, x);
    fresh->propose_tree(text, 8, 8, y);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.tree.parent, y.tree.parent);
    branched += x.tree.size() > static_cast<size_t>(x.tree.max_depth()) ? 1 : 0;
    ASSERT_EQ(used->cache_length(), fresh->cache_length());
    EXPECT_EQ(0, std::memcmp(used->cached_keys(0).data(), fresh->cached_keys(0).data(),
                             used->cached_keys(0).size() * sizeof(float)));
    used->accept(text, 0);
    fresh->accept(text, 0);
  }
  for (const engine::SpecStats* st : {&small, &large}) {
    EXPECT_GT(st->tree_rounds, 0);
    EXPECT_GT(st->accepted, 0);
    EXPECT_LT(st->accepted, st->drafted);
  }
  EXPECT_GT(large.drafted, small.drafted) << "a larger budget verifies more nodes";
  EXPECT_GT(branched, 0) << "no proposal branched";
}

TEST(DflashDrafter, RollbackLeavesTheCacheEqualToAFreshRun) {
  Trained& t = trained();
  DflashDraftSource& src = *t.result.source;
  const std::vector<int32_t> prompt = golden_prompts().front();
  // A speculative run: rounds whose drafts the target partly refused, each rolled back by accept().
  engine::SpecStats st;
  std::vector<int32_t> text = prompt;
  for (int32_t x : run(*t.target, *t.pool, &src, prompt, 6, &st)) text.push_back(x);
  ASSERT_GT(st.drafted, st.accepted) << "no draft was refused: nothing was rolled back";
  // The taps of refused drafts were forgotten: those of every committed token the target evaluated remain.
  EXPECT_EQ(src.tap_store().length(), static_cast<int64_t>(text.size()) - 1);
  // Bring the context up to the whole text, then compare with a fresh source that saw only that text.
  Draft d;
  src.propose(text, 3, d);
  EXPECT_EQ(src.cache_length(), static_cast<int64_t>(text.size()) - 1 + src.drafter().config().block);
  src.accept(text, 0);
  ASSERT_EQ(src.context_length(), static_cast<int64_t>(text.size()) - 1);
  ASSERT_EQ(src.cache_length(), src.context_length());

  auto fresh = DflashDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                       model::default_context(*t.target, 0));
  DraftSettings greedy;
  greedy.sampling.temperature = 0.0f;
  fresh->begin(text, greedy);
  feed_taps(t, *fresh, text);
  EXPECT_EQ(fresh->tap_store().length(), static_cast<int64_t>(text.size()) - 1);
  Draft fd;
  fresh->propose(text, 3, fd);
  EXPECT_EQ(fd.tokens, d.tokens);
  fresh->accept(text, 0);
  ASSERT_EQ(fresh->cache_length(), src.cache_length());
  for (int64_t l = 0; l < src.drafter().config().n_layers; ++l) {
    const std::vector<float> ka(src.cached_keys(l).begin(), src.cached_keys(l).end());
    const std::vector<float> kb(fresh->cached_keys(l).begin(), fresh->cached_keys(l).end());
    const std::vector<float> va(src.cached_values(l).begin(), src.cached_values(l).end());
    const std::vector<float> vb(fresh->cached_values(l).begin(), fresh->cached_values(l).end());
    EXPECT_EQ(ka, kb) << "layer " << l << " keys";
    EXPECT_EQ(va, vb) << "layer " << l << " values";
  }

  // A shorter text (a new generation over a prefix) drops the context rows past it.
  const std::span<const int32_t> prefix = std::span<const int32_t>(text).first(prompt.size() + 4);
  src.propose(prefix, 2, d);
  src.accept(prefix, 0);
  EXPECT_EQ(src.context_length(), static_cast<int64_t>(prefix.size()) - 1);
}

// A drafting source reads the target's embedding and head where the target keeps them: it holds no f32
// copies of them, only the drafter's own weights, and a drafter without the copies refuses to train.
TEST(DflashDrafter, DraftsFromTheTargetsOwnEmbeddingAndHead) {
  Trained& t = trained();
  auto loaded = DflashDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool,
                                        model::default_context(*t.target, 0));
  size_t own = 0;
  for (DflashDraftSource* src : {loaded.get(), t.result.source.get()}) {
    train::DflashDrafter& m = src->drafter();
    EXPECT_TRUE(m.embedding().value.empty());
    EXPECT_TRUE(m.head().value.empty());
    EXPECT_EQ(m.embedding().rows, t.target->config().n_vocab);
    own = 0;
    for (const train::Param* p : m.params()) {
      EXPECT_EQ(p->value.empty(), !p->trainable()) << p->name;
      own += p->value.size() * sizeof(float);
    }
    // No matrix of stories260K's drafter reaches the size that gets a Q8_0 copy.
    EXPECT_EQ(src->weight_bytes(), own);
  }
  EXPECT_GT(own, 0u);

  train::DflashBatch b;
  b.rows = loaded->drafter().config().block;
  b.targets.rows = b.rows;
  train::Compute c(*t.pool);
  try {
    loaded->drafter().forward_backward(b, c, false);
    FAIL() << "a drafter without the target's weights ran a training batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot train"), std::string::npos) << e.what();
  }
}

// bench-spec with the drafter reports the acceptance by draft position, as `tandem info` shows the held-out
// curve, and its JSON line holds the same curve with the rounds behind each entry.
TEST(DflashDrafter, BenchSpecReportsAcceptanceByPosition) {
  Trained& t = trained();
  const testing::TempDir dir("dflash_bench_spec");
  {
    std::ofstream prompts(dir.file("prompts.txt"));
    prompts << "Once upon a time\n";
  }
  const auto [out, rc] = testing::run_command(
      "XDG_CACHE_HOME='" + dir.file("cache") + "' " + std::string(TANDEM_BINARY) + " bench-spec -m '" +
      target_path() + "' --drafter '" + t.checkpoint +
      "' -t 1 -n 32 --no-gate --draft-max 4 --json --prompts '" + dir.file("prompts.txt") + "' 2>/dev/null");
  ASSERT_EQ(rc, 0) << out;
  const size_t last = out.find_last_of('\n', out.size() - 2);
  const nlohmann::json j = nlohmann::json::parse(out.substr(last == std::string::npos ? 0 : last + 1));
  const auto curve = j.at("acceptance_by_position").get<std::vector<double>>();
  const auto rounds = j.at("rounds_by_position").get<std::vector<int64_t>>();
  ASSERT_EQ(rounds.size(), 4u);
  ASSERT_EQ(curve.size(), 4u) << "without the gate every position is drafted";
  double accepted = 0.0;
  for (size_t k = 0; k < curve.size(); ++k) {
    EXPECT_GE(curve[k], 0.0);
    EXPECT_LE(curve[k], 1.0);
    EXPECT_GT(rounds[k], 0);
    if (k > 0) {
      EXPECT_LE(rounds[k], rounds[k - 1]);
    }
    accepted += curve[k] * static_cast<double>(rounds[k]);
  }
  // Every round drafts position 1, and the accepted drafts are counted once each, at their position.
  EXPECT_NEAR(accepted, j.at("mean_accepted").get<double>() * static_cast<double>(rounds[0]), 1e-6);
  char first[16];
  std::snprintf(first, sizeof first, " %.3f", curve[0]);
  EXPECT_NE(out.find("acceptance by draft position (first k drafts all accepted):" + std::string(first)),
            std::string::npos)
      << out;
}

TEST(DflashDrafter, RefusedByAnotherTargetAndAnotherKind) {
  Trained& t = trained();
  auto other = model::Model::load(testing::shared_path("models/llama2xs-tok512.gguf"));
  const std::string other_hash = file_fingerprint(testing::shared_path("models/llama2xs-tok512.gguf"));
  try {
    DflashDraftSource::load(t.checkpoint, *other, other_hash, *t.pool, 256);
    FAIL() << "a drafter for stories260K was accepted by llama2xs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another target file"), std::string::npos) << e.what();
  }
  try {
    EagleDraftSource::load(t.checkpoint, *t.target, file_fingerprint(target_path()), *t.pool, 256);
    FAIL() << "a DFlash checkpoint was loaded as an EAGLE drafter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kind 'dflash'"), std::string::npos) << e.what();
  }
  train::DrafterInfo info = t.result.info;
  info.kind = kEagleKind;
  EXPECT_THROW(dflash_config_of(info), Error);
}

// Sampled verification with the block's q: the first sampled token follows the target sampler's p
// (one-sample chi-square at false-alarm rate 1e-4; Wilson-Hilferty quantile) over 1200 seeds. The prompt is
// the golden prompt whose p spreads over the most tokens, so that the test has bins to look at.
TEST(DflashDrafter, SampledFirstTokenFollowsTheTargetDistribution) {
  Trained& t = trained();
  DflashDraftSource& src = *t.result.source;
  sampling::Params params;
  params.temperature = 1.0f;
  params.top_k = 0;
  params.top_p = 0.95f;
  params.min_p = 0.0f;
  model::Session s(*t.target, *t.pool, model::SessionOptions{});
  sampling::Sampler sampler(params);
  constexpr int kRuns = 1200;
  for (int tree_nodes : {0, 8}) {  // chains, and trees (deterministic nodes, sibling rejection sampling)
    // The golden prompt of the widest p; for trees, among those where a child of the tree's root has a
    // target probability in [0.02, 0.98] (the tree is the same in every run), so that rounds both accept
    // and reject.
    std::vector<int32_t> prompt;
    sampling::Distribution p, candidate;
    for (const std::vector<int32_t>& g : golden_prompts()) {
      s.truncate(0);
      sampler.distribution(s.eval(g), g, candidate);
      if (candidate.size() <= p.size()) continue;
      bool uncertain = tree_nodes == 0;
      if (!uncertain) {
        src.begin(g, {});
        feed_taps(t, src, g);
        Draft tree;
        src.propose_tree(g, tree_nodes, 4, tree);
        src.accept(g, 0);
        for (size_t i = 0; i < tree.tokens.size(); ++i) {
          const float px = candidate.prob_of(tree.tokens[i]);
          uncertain = uncertain || (tree.tree.parent[i] < 0 && px >= 0.02f && px <= 0.98f);
        }
      }
      if (uncertain) prompt = g, p = candidate;
    }
    ASSERT_GE(p.size(), 4u) << tree_nodes << " nodes";
    engine::SpecOptions o;
    o.generate.max_tokens = 4;
    o.generate.sampling = params;
    o.draft_max = 4;
    o.use_gate = false;
    o.tree_nodes = tree_nodes;
    const auto [counts, total] = sample_first_tokens(s, src, prompt, o, 1000, kRuns);
    EXPECT_GT(total.accepted, 0) << tree_nodes << " nodes";
    EXPECT_LT(total.accepted, total.drafted) << tree_nodes << " nodes";
    EXPECT_EQ(total.tree_rounds, tree_nodes > 0 ? kRuns : 0);
    const testing::ChiSquare c = testing::chi_square(p.ids, p.probs, counts, kRuns);
    EXPECT_EQ(c.outside, 0) << "a token outside the target's top-p set was sampled";
    EXPECT_LT(c.chi2, testing::chi2_critical_1e4(c.bins - 1)) << tree_nodes << " nodes";
  }
}

TEST(DflashDrafter, TrainingRepeatsForAFixedSeed) {
  Trained& t = trained();
  DflashTrainOptions o = small_options(*t.target, 4);
  o.data.tokens = 256;
  DflashTrainResult a = train_dflash(*t.target, *t.pool, o);
  DflashTrainResult b = train_dflash(*t.target, *t.pool, o);
  const auto pa = a.source->drafter().params(), pb = b.source->drafter().params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i]->value, pb[i]->value) << pa[i]->name;
  o.seed = 6;
  DflashTrainResult c = train_dflash(*t.target, *t.pool, o);
  EXPECT_NE(pa[0]->value, c.source->drafter().params()[0]->value);
}

}  // namespace
}  // namespace tandem::speculative
