// Draft trees: the tree attention mask (against a scalar reference, and bit for bit against plain decoding
// of each node's path), several sequences' trees in one forward (each as alone), KV compaction (the kept
// path equals plain decoding of its tokens), tree settling
// (greedy takes the target's path; sampling over siblings is lossless by chi-square), and whole generations:
// tree == chain == plain greedy on every public prompt of stories260K, with the draft model and n-gram.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/cache/attention.h"
#include "tandem/cache/kv_cache.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/forward.h"
#include "tandem/model/graph.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/sampling/rng.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/speculative/settle.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem::speculative {
namespace {

using engine::generate_speculative;
using engine::SpecOptions;
using engine::SpecStats;

// A random tree of n nodes in topological order (cache::TreeMask form: roots have parent -1, depth 0).
void random_tree(int n, uint32_t seed, std::vector<int32_t>& parent, std::vector<int32_t>& depth) {
  std::mt19937 rng(seed);
  parent.assign(1, -1);
  depth.assign(1, 0);
  for (int i = 1; i < n; ++i) {
    // Mostly deep paths, some branching.
    const int32_t p = rng() % 3 == 0 ? static_cast<int32_t>(rng() % static_cast<uint32_t>(i)) : i - 1;
    parent.push_back(p);
    depth.push_back(depth[static_cast<size_t>(p)] + 1);
  }
}

std::vector<int32_t> path_of(const std::vector<int32_t>& parent, int32_t node) {
  std::vector<int32_t> path;
  for (int32_t at = node; at >= 0; at = parent[static_cast<size_t>(at)]) path.insert(path.begin(), at);
  return path;
}

cache::Geometry small_geometry() {
  cache::Geometry g;
  g.n_layer = 2;
  g.n_head_kv = 2;
  g.head_dim = 32;
  g.head_dim_v = 32;
  return g;
}

// A cache of `length` positions of random keys and values.
void fill(cache::KvCache& kv, int64_t length, uint32_t seed) {
  const cache::Geometry g = small_geometry();
  kv.prepare_append(0, length);
  for (int64_t pos = 0; pos < length; ++pos)
    for (int64_t l = 0; l < g.n_layer; ++l) {
      const auto k =
          testing::normal_floats(g.n_head_kv * g.head_dim, seed + static_cast<uint32_t>(pos * 7 + l));
      const auto v = testing::normal_floats(g.n_head_kv * g.head_dim_v,
                                            seed + 1000 + static_cast<uint32_t>(pos * 7 + l));
      kv.store(l, pos, k.data(), v.data());
    }
}

class TreeAttention : public ::testing::TestWithParam<cache::KvType> {};

// Every node's output equals the scalar reference over the committed positions and its own ancestors.
TEST_P(TreeAttention, MatchesTheScalarReference) {
  const cache::Geometry g = small_geometry();
  constexpr int64_t kBase = 37, kNodes = 12, kGroup = 3;
  std::vector<int32_t> parent, depth;
  random_tree(kNodes, 5, parent, depth);
  const cache::TreeMask mask{kBase, parent, depth};
  const cache::AttentionParams params{0.17f, 0.0f};
  const cache::WindowLayout layout{kGroup * g.head_dim, g.head_dim, kGroup * g.head_dim_v, g.head_dim_v};
  testing::for_each_hwy_target([&] {
    cache::KvCache kv(g, 128, GetParam());
    fill(kv, kBase + kNodes, 11);
    const auto q = testing::normal_floats(kNodes * kGroup * g.head_dim, 3);
    std::vector<float> got(static_cast<size_t>(kNodes * kGroup * g.head_dim_v));
    std::vector<float> want(got.size());
    std::vector<float> scores(static_cast<size_t>(cache::kMaxWindowQueries * 128));
    for (int64_t first : {int64_t{0}, int64_t{9}}) {
      for (int64_t layer = 0; layer < g.n_layer; ++layer) {
        cache::attend_tree(kv, layer, 1, q.data(), kNodes, kGroup, layout, mask, 0, first, params,
                           scores.data(), 128, got.data());
        cache::attend_tree_reference(kv, layer, 1, q.data(), kNodes, kGroup, layout, mask, 0, first, params,
                                     want.data());
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i]))
              << "element " << i << " first " << first;
      }
    }
    // A window that starts mid-tree (nodes stored by an earlier forward) reads the same.
    std::vector<float> tail(got.size());
    cache::attend_tree(kv, 0, 1, q.data() + 5 * kGroup * g.head_dim, kNodes - 5, kGroup, layout, mask, 5, 0,
                       params, scores.data(), 128, tail.data());
    cache::attend_tree(kv, 0, 1, q.data(), kNodes, kGroup, layout, mask, 0, 0, params, scores.data(), 128,
                       got.data());
    EXPECT_EQ(0, std::memcmp(tail.data(), got.data() + 5 * kGroup * g.head_dim_v,
                             (kNodes - 5) * kGroup * g.head_dim_v * sizeof(float)));
  });
}

// A node's result has the bits of plain attention over its path laid out at consecutive positions, which
// KvCache::compact builds from the tree's rows without recomputing them.
class TreePathBits : public ::testing::TestWithParam<cache::KvType> {};

TEST_P(TreePathBits, EqualsPlainAttentionOverTheCompactedPath) {
  const cache::Geometry g = small_geometry();
  constexpr int64_t kBase = 21, kNodes = 14, kGroup = 2;
  std::vector<int32_t> parent, depth;
  random_tree(kNodes, 8, parent, depth);
  const cache::TreeMask mask{kBase, parent, depth};
  const cache::AttentionParams params{0.2f, 0.0f};
  const cache::WindowLayout layout{kGroup * g.head_dim, g.head_dim, kGroup * g.head_dim_v, g.head_dim_v};
  const auto q = testing::normal_floats(kGroup * g.head_dim, 4);
  std::vector<float> scores(static_cast<size_t>(cache::kMaxWindowQueries * 64));
  for (int32_t node = 0; node < kNodes; ++node) {
    cache::KvCache kv(g, 64, GetParam());
    fill(kv, kBase + kNodes, 21);
    std::vector<float> tree_out(static_cast<size_t>(kGroup * g.head_dim_v)), plain_out(tree_out.size());
    cache::attend_tree(kv, 1, 0, q.data(), 1, kGroup, layout, mask, node, 0, params, scores.data(), 64,
                       tree_out.data());
    const auto path = path_of(parent, node);
    kv.compact(kBase, path);
    ASSERT_EQ(kv.length(), kBase + static_cast<int64_t>(path.size()));
    cache::attend_group(kv, 1, 0, q.data(), kGroup, g.head_dim, 0, kv.length() - 1, params, scores.data(), 64,
                        plain_out.data(), g.head_dim_v);
    EXPECT_EQ(0, std::memcmp(tree_out.data(), plain_out.data(), tree_out.size() * sizeof(float)))
        << "node " << node;
  }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, TreeAttention,
                         ::testing::Values(cache::KvType::kF32, cache::KvType::kF16, cache::KvType::kQ8_0));
// Anchored key caches refuse compaction (TreeCompaction.RefusesAnchoredKeysWithAClearMessage).
INSTANTIATE_TEST_SUITE_P(KvTypes, TreePathBits, ::testing::Values(cache::KvType::kF32, cache::KvType::kF16));

TEST(TreeCompaction, RefusesAnchoredKeysWithAClearMessage) {
  cache::KvCache kv(small_geometry(), 64, cache::KvType::kQ8_0);
  fill(kv, 20, 1);
  const int32_t path[] = {0, 2};
  try {
    kv.compact(16, path);
    FAIL() << "compaction of an anchored key cache did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-type f16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv.length(), 20);
}

class TreeModel : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    stories_ = model::Model::load(testing::shared_path("models/stories260K.gguf")).release();
    xs_ = model::Model::load(testing::shared_path("models/llama2xs-tok512.gguf")).release();
  }
  static void TearDownTestSuite() {
    delete stories_;
    delete xs_;
  }
  static model::SessionOptions options() {
    model::SessionOptions o;
    o.kv_type = cache::KvType::kF16;
    return o;
  }
  static std::vector<std::vector<int32_t>> stories_prompts() {
    std::vector<std::vector<int32_t>> prompts;
    std::ifstream in(testing::shared_path("golden/stories260K.public.jsonl"));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty())
        prompts.push_back(nlohmann::json::parse(line).at("prompt_ids").get<std::vector<int32_t>>());
    return prompts;
  }
  static model::Model* stories_;
  static model::Model* xs_;
};
model::Model* TreeModel::stories_ = nullptr;
model::Model* TreeModel::xs_ = nullptr;

// Each node of a tree evaluated in one forward has the logits of plain decoding of its path, bit for bit;
// compacting a path leaves a cache that continues exactly as plain decoding's does.
TEST_F(TreeModel, TreeLogitsAndCompactedCacheEqualPlainDecoding) {
  ThreadPool pool(2);
  const std::vector<int32_t> prompt = {1,   403, 407, 261, 378, 432, 383, 286,
                                       261, 376, 298, 315, 421, 395, 317};
  constexpr int kNodes = 13;
  std::vector<int32_t> parent, depth;
  random_tree(kNodes, 17, parent, depth);
  std::mt19937 rng(4);
  std::vector<int32_t> tokens;
  for (int i = 0; i < kNodes; ++i) tokens.push_back(static_cast<int32_t>(rng() % 500) + 3);
  const auto V = static_cast<size_t>(stories_->config().n_vocab);

  model::Session tree(*stories_, pool, options());
  tree.eval(prompt);
  const auto base = tree.length();
  // Two forwards: the first nodes, then the rest (as a drafter extends its tree level by level).
  std::vector<float> logits;
  {
    const auto first = tree.eval_tree(std::span<const int32_t>(tokens).first(5), {base, parent, depth});
    logits.assign(first.begin(), first.end());
    const auto rest = tree.eval_tree(std::span<const int32_t>(tokens).subspan(5), {base, parent, depth});
    logits.insert(logits.end(), rest.begin(), rest.end());
  }
  ASSERT_EQ(tree.length(), base + kNodes);
  for (int32_t node = 0; node < kNodes; ++node) {
    model::Session plain(*stories_, pool, options());
    std::vector<int32_t> text = prompt;
    for (int32_t at : path_of(parent, node)) text.push_back(tokens[static_cast<size_t>(at)]);
    const auto want = plain.eval(text);
    ASSERT_EQ(0, std::memcmp(want.data(), logits.data() + static_cast<size_t>(node) * V, V * sizeof(float)))
        << "node " << node << " at depth " << depth[static_cast<size_t>(node)];
  }
  const int32_t deepest = static_cast<int32_t>(std::max_element(depth.begin(), depth.end()) - depth.begin());
  const auto path = path_of(parent, deepest);
  tree.cache().compact(base, path);
  model::Session plain(*stories_, pool, options());
  std::vector<int32_t> text = prompt;
  for (int32_t at : path) text.push_back(tokens[static_cast<size_t>(at)]);
  plain.eval(text);
  ASSERT_EQ(tree.length(), plain.length());
  const std::vector<int32_t> more = {300, 301, 302};
  const auto a = tree.eval(more, true);
  const std::vector<float> got(a.begin(), a.end());
  const auto b = plain.eval(more, true);
  EXPECT_EQ(0, std::memcmp(got.data(), b.data(), got.size() * sizeof(float)));
}

// One forward verifies the trees of two sequences beside a decode row of a third (model::Group::tree): every
// node's logits have the bits of its tree verified alone, and so of plain decoding of its path; the decode
// row has the bits of a decode step alone; and each tree's cache compacted to a path continues exactly as
// plain decoding's does.
TEST_F(TreeModel, OneForwardVerifiesSeveralSequencesTreesAsEachAlone) {
  ThreadPool pool(2);
  const model::Config& c = stories_->config();
  const auto V = static_cast<size_t>(c.n_vocab);
  model::Graph graph(*stories_, pool, model::GraphOptions{64, 16});
  const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407, 261, 378, 432, 383, 286, 261, 376},
                                                     {1, 298, 315, 421, 395, 317, 426},
                                                     {1, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411}};
  constexpr int kNodesA = 9, kNodesC = 6;
  std::vector<int32_t> parent_a, depth_a, parent_c, depth_c;
  random_tree(kNodesA, 23, parent_a, depth_a);
  random_tree(kNodesC, 31, parent_c, depth_c);
  std::mt19937 rng(7);
  const auto random_tokens = [&](int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % 500) + 3);
    return t;
  };
  const std::vector<int32_t> tokens_a = random_tokens(kNodesA), tokens_c = random_tokens(kNodesC);
  const std::vector<int32_t> next_b = {300};
  const auto prefilled = [&](size_t i) {
    auto kv = std::make_unique<cache::KvCache>(c.kv_geometry(), 128, cache::KvType::kF16);
    graph.prompt(prompts[i], *kv, nullptr);
    return kv;
  };

  // Sequence A's tree, B's decode row and C's tree in one forward.
  auto a = prefilled(0), b = prefilled(1), cc = prefilled(2);
  const cache::TreeMask mask_a{a->length(), parent_a, depth_a}, mask_c{cc->length(), parent_c, depth_c};
  cache::KvCache* pa[] = {a.get()};
  cache::KvCache* pb[] = {b.get()};
  cache::KvCache* pc[] = {cc.get()};
  const std::vector<model::Group> groups = {
      {model::Phase::kVerify, tokens_a, pa, nullptr, &mask_a},
      {model::Phase::kDecode, next_b, pb, nullptr, nullptr},
      {model::Phase::kVerify, tokens_c, pc, nullptr, &mask_c},
  };
  std::vector<float> mixed((kNodesA + 1 + kNodesC) * V);
  ASSERT_EQ(graph.mixed(groups, mixed.data()), kNodesA + 1 + kNodesC);
  const float* mixed_a = mixed.data();
  const float* mixed_b = mixed_a + kNodesA * V;
  const float* mixed_c = mixed_b + V;

  // Each alone.
  std::vector<float> alone_a(kNodesA * V), alone_b(V), alone_c(kNodesC * V);
  {
    auto a1 = prefilled(0), b1 = prefilled(1), c1 = prefilled(2);
    cache::KvCache* qa[] = {a1.get()};
    cache::KvCache* qc[] = {c1.get()};
    const cache::TreeMask ma{a1->length(), parent_a, depth_a}, mc{c1->length(), parent_c, depth_c};
    const model::Group ga[] = {{model::Phase::kVerify, tokens_a, qa, nullptr, &ma}};
    const model::Group gc[] = {{model::Phase::kVerify, tokens_c, qc, nullptr, &mc}};
    graph.mixed(ga, alone_a.data());
    graph.mixed(gc, alone_c.data());
    cache::KvCache* qb[] = {b1.get()};
    graph.decode(next_b, qb, alone_b.data());
  }
  EXPECT_EQ(0, std::memcmp(mixed_a, alone_a.data(), alone_a.size() * sizeof(float))) << "sequence A's tree";
  EXPECT_EQ(0, std::memcmp(mixed_b, alone_b.data(), V * sizeof(float))) << "sequence B's decode row";
  EXPECT_EQ(0, std::memcmp(mixed_c, alone_c.data(), alone_c.size() * sizeof(float))) << "sequence C's tree";

  // Every node against plain decoding of its path.
  const auto check_paths = [&](size_t seq, const std::vector<int32_t>& tokens,
                               const std::vector<int32_t>& parent, const float* logits) {
    for (int32_t node = 0; node < static_cast<int32_t>(tokens.size()); ++node) {
      model::Session plain(*stories_, pool, options());
      std::vector<int32_t> text = prompts[seq];
      for (int32_t at : path_of(parent, node)) text.push_back(tokens[static_cast<size_t>(at)]);
      const auto want = plain.eval(text);
      ASSERT_EQ(0, std::memcmp(want.data(), logits + static_cast<size_t>(node) * V, V * sizeof(float)))
          << "sequence " << seq << ", node " << node;
    }
  };
  check_paths(0, tokens_a, parent_a, mixed_a);
  check_paths(2, tokens_c, parent_c, mixed_c);

  // Compacted to their deepest paths, both caches continue as plain decoding of those paths does.
  const std::vector<int32_t> more = {300, 301, 302};
  const auto check_compacted = [&](size_t seq, cache::KvCache& kv, const std::vector<int32_t>& tokens,
                                   const std::vector<int32_t>& parent, const std::vector<int32_t>& depth) {
    const auto deepest = static_cast<int32_t>(std::max_element(depth.begin(), depth.end()) - depth.begin());
    const auto path = path_of(parent, deepest);
    kv.compact(static_cast<int64_t>(prompts[seq].size()), path);
    std::vector<int32_t> text = prompts[seq];
    for (int32_t at : path) text.push_back(tokens[static_cast<size_t>(at)]);
    cache::KvCache plain(c.kv_geometry(), 128, cache::KvType::kF16);
    graph.prompt(text, plain, nullptr);
    ASSERT_EQ(kv.length(), plain.length());
    std::vector<float> got(more.size() * V), want(more.size() * V);
    graph.verify(more, kv, got.data());
    graph.verify(more, plain, want.data());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "sequence " << seq;
  };
  check_compacted(0, *a, tokens_a, parent_a, depth_a);
  check_compacted(2, *cc, tokens_c, parent_c, depth_c);
}

// A forward carries at most one tree per sequence; a verify group's tree starts at its cache's length, and
// only verify groups carry trees.
TEST_F(TreeModel, RefusesBadTreeGroups) {
  ThreadPool pool(1);
  const model::Config& c = stories_->config();
  model::Graph graph(*stories_, pool, model::GraphOptions{16, 16});
  cache::KvCache kv(c.kv_geometry(), 64, cache::KvType::kF16);
  const std::vector<int32_t> prompt = {1, 403, 407}, tokens = {300, 301};
  graph.prompt(prompt, kv, nullptr);
  const std::vector<int32_t> parent = {-1, 0}, depth = {0, 1};
  std::vector<float> logits(2 * static_cast<size_t>(c.n_vocab));
  cache::KvCache* caches[] = {&kv};
  const cache::TreeMask stale{kv.length() - 1, parent, depth};
  const model::Group wrong_base[] = {{model::Phase::kVerify, tokens, caches, nullptr, &stale}};
  EXPECT_THROW(graph.mixed(wrong_base, logits.data()), Error);
  const cache::TreeMask mask{kv.length(), parent, depth};
  const model::Group on_prompt[] = {{model::Phase::kPrompt, tokens, caches, nullptr, &mask}};
  EXPECT_THROW(graph.mixed(on_prompt, logits.data()), Error);
  EXPECT_EQ(kv.length(), 3);

  model::Forward forward(*stories_, pool, 8);
  const model::Row rows[] = {{300, 3, 0, true}, {301, 4, 0, true}};
  const model::TreeRows twice[] = {{0, mask}, {0, mask}};
  try {
    forward.run(rows, caches, logits.data(), nullptr, twice);
    FAIL() << "two trees of one sequence were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most one per sequence"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv.length(), 3);
}

std::vector<int32_t> generate_tokens(const model::Model& target, ThreadPool& pool, DraftSource* source,
                                     std::span<const int32_t> prompt, int tree_nodes, int draft_max,
                                     SpecStats* stats, const sampling::Params& sampling, int64_t n = 48) {
  model::Session s(target, pool, TreeModel::options());
  std::vector<int32_t> out;
  if (!source) {
    engine::GenerateOptions g;
    g.max_tokens = n;
    g.sampling = sampling;
    engine::generate(
        s, prompt, g, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
    return out;
  }
  SpecOptions o;
  o.generate.max_tokens = n;
  o.generate.sampling = sampling;
  o.draft_max = draft_max;
  o.use_gate = false;
  o.tree_nodes = tree_nodes;
  const SpecStats st = generate_speculative(
      s, *source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
  EXPECT_EQ(s.length(), static_cast<int64_t>(prompt.size() + out.size()) - 1);
  if (stats) stats->add(st);
  return out;
}

sampling::Params greedy() {
  sampling::Params p;
  p.temperature = 0.0f;
  return p;
}

TEST_F(TreeModel, TreeEqualsChainEqualsPlainGreedyOnEveryPublicPrompt) {
  ThreadPool pool(1);
  const auto prompts = stories_prompts();
  ASSERT_GE(prompts.size(), 8u);
  DraftModelSource model_source(*xs_, *stories_, pool, options());
  NgramSource ngram({1, 4});
  for (DraftSource* source : {static_cast<DraftSource*>(&model_source), static_cast<DraftSource*>(&ngram)}) {
    SpecStats tree_stats, chain_stats;
    for (const auto& prompt : prompts) {
      const auto plain = generate_tokens(*stories_, pool, nullptr, prompt, 0, 0, nullptr, greedy());
      const auto chain = generate_tokens(*stories_, pool, source, prompt, 0, 4, &chain_stats, greedy());
      ASSERT_EQ(chain, plain) << source->kind();
      for (int nodes : {3, 16}) {
        const auto tree = generate_tokens(*stories_, pool, source, prompt, nodes, 8, &tree_stats, greedy());
        ASSERT_EQ(tree, plain) << source->kind() << " with " << nodes << " nodes, prompt length "
                               << prompt.size();
      }
    }
    EXPECT_GT(tree_stats.tree_rounds, 0) << source->kind();
    EXPECT_GT(tree_stats.accepted, 0) << source->kind();
    EXPECT_LT(tree_stats.accepted, tree_stats.drafted) << source->kind();
  }
}

// With the gate on, each round verifies the subtree of the draft model's best-scored nodes that promises the
// most tokens per unit of cost: all of them when extra rows are free, none (plain steps) when a row costs as
// much as a plain step, and a size that changes from round to round on a curve between. The output stays the
// target's greedy output throughout.
TEST_F(TreeModel, NodeBudgetFollowsTheCostCurve) {
  ThreadPool pool(1);
  const auto prompts = stories_prompts();
  DraftModelSource source(*xs_, *stories_, pool, options());
  const auto run = [&](const std::vector<int32_t>& prompt, const std::vector<double>& curve, bool gate,
                       SpecStats& st) {
    model::Session s(*stories_, pool, options());
    SpecOptions o;
    o.generate.max_tokens = 40;
    o.generate.sampling = greedy();
    o.draft_max = 8;
    o.tree_nodes = 8;
    o.use_gate = gate;
    o.costs.verify = curve;
    std::vector<int32_t> out;
    st.add(generate_speculative(
        s, source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr));
    return out;
  };
  const std::vector<double> free_rows(18, 1.0);
  std::vector<double> full_price = {1.0}, between = {1.0};  // index 0 unused
  for (int k = 1; k <= 17; ++k) {
    full_price.push_back(k);
    between.push_back(1.0 + 0.1 * (k - 1));  // the Xeon's TinyLlama curve is close to this up to 8 rows
  }
  for (size_t i = 0; i < 3; ++i) {
    const auto& prompt = prompts[i];
    const auto plain = generate_tokens(*stories_, pool, nullptr, prompt, 0, 0, nullptr, greedy(), 40);
    SpecStats all, fixed, none, mid;
    EXPECT_EQ(run(prompt, free_rows, true, all), plain);
    EXPECT_EQ(run(prompt, free_rows, false, fixed), plain);
    EXPECT_EQ(all.rows_histogram, fixed.rows_histogram) << "free rows: every node verified";
    EXPECT_EQ(all.drafted, fixed.drafted);
    EXPECT_EQ(run(prompt, full_price, true, none), plain);
    EXPECT_EQ(none.rounds, 0) << "rows at a plain step's price: plain steps only";
    EXPECT_EQ(none.rows_histogram[1], none.target_forwards);
    EXPECT_EQ(run(prompt, between, true, mid), plain);
    EXPECT_GT(mid.tree_rounds, 0);
    EXPECT_LT(mid.drafted, fixed.drafted) << "a curve between: fewer nodes than the budget";
    int sizes = 0;
    for (size_t k = 2; k < mid.rows_histogram.size(); ++k) sizes += mid.rows_histogram[k] > 0;
    EXPECT_GE(sizes, 2) << "the tree's size changes from round to round";
  }
}

// After tree rounds, the draft model's cache holds exactly what plain decoding of the committed text would:
// its next proposal equals a fresh drafter's.
TEST_F(TreeModel, DraftModelStateAfterTreesEqualsAFreshDrafter) {
  ThreadPool pool(1);
  const auto prompt = stories_prompts().front();
  DraftModelSource used(*xs_, *stories_, pool, options());
  model::Session s(*stories_, pool, options());
  SpecOptions o;
  o.generate.max_tokens = 40;
  o.generate.sampling = greedy();
  o.use_gate = false;
  o.tree_nodes = 12;
  std::vector<int32_t> text = prompt;
  const SpecStats st = generate_speculative(
      s, used, prompt, o, [&](int32_t t) { return text.push_back(t), true; }, nullptr);
  ASSERT_GT(st.tree_rounds, 0);
  ASSERT_GT(st.accepted, 0);
  DraftModelSource fresh(*xs_, *stories_, pool, options());
  DraftSettings settings;
  settings.sampling = greedy();
  fresh.begin(text, settings);
  Draft a, b;
  used.propose(text, 8, a);
  fresh.propose(text, 8, b);
  EXPECT_EQ(a.tokens, b.tokens);
  used.accept(text, 0);
  used.propose_tree(text, 10, 4, a);
  fresh.accept(text, 0);
  fresh.propose_tree(text, 10, 4, b);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tree.parent, b.tree.parent);
  EXPECT_GT(a.tree.size(), a.tree.max_depth() + 0u) << "the draft model branched";
}

TEST_F(TreeModel, RefusesTreesOnQuantizedKeyCaches) {
  ThreadPool pool(1);
  model::SessionOptions so = options();
  so.kv_type = cache::KvType::kQ8_0;
  model::Session s(*stories_, pool, so);
  NgramSource ngram;
  SpecOptions o;
  o.tree_nodes = 8;
  const std::vector<int32_t> prompt = {1, 403, 407};
  try {
    generate_speculative(
        s, ngram, prompt, o, [](int32_t) { return true; }, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-type f16"), std::string::npos) << e.what();
  }
}

// A drafter that reads the target's hidden states but does not follow a tree's rows (as the MTP layer) is
// refused trees, with the way out.
TEST_F(TreeModel, RefusesTreesFromADrafterThatDoesNotFollowTreeRows) {
  struct Reader final : DraftSource {
    std::string_view kind() const override { return "mtp"; }
    void begin(std::span<const int32_t>, const DraftSettings&) override {}
    void propose(std::span<const int32_t>, int, Draft& out) override { out.clear(); }
    void accept(std::span<const int32_t>, int) override {}
    std::span<const int64_t> target_layers() const override { return layers; }
    std::vector<int64_t> layers = {1};
  } reader;
  ThreadPool pool(1);
  model::Session s(*stories_, pool, options());
  SpecOptions o;
  o.tree_nodes = 8;
  const std::vector<int32_t> prompt = {1, 403, 407};
  try {
    generate_speculative(
        s, reader, prompt, o, [](int32_t) { return true; }, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the mtp drafter reads the target's hidden states and drafts chains only"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("--tree-nodes 0"), std::string::npos) << what;
  }
  o.tree_nodes = 0;  // chains are fine
  EXPECT_NO_THROW(generate_speculative(
      s, reader, prompt, o, [](int32_t) { return true; }, nullptr));
}

TEST(TreeMamba, RefusesTreesOnRecurrentModels) {
  auto mamba = model::Model::load(testing::shared_path("models/synth/synth-mamba-d128-f32.gguf"));
  ThreadPool pool(1);
  model::Session s(*mamba, pool, {});
  NgramSource ngram;
  SpecOptions o;
  o.tree_nodes = 8;
  const std::vector<int32_t> prompt = {1, 5, 6};
  try {
    generate_speculative(
        s, ngram, prompt, o, [](int32_t) { return true; }, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tree-nodes 0"), std::string::npos) << e.what();
  }
  // The forward refuses tree rows too.
  s.eval(prompt);
  const std::vector<int32_t> parent = {-1}, depth = {0}, tokens = {7};
  EXPECT_THROW(s.eval_tree(tokens, {s.length(), parent, depth}), Error);
}

// Upper 1e-4 quantile of chi-square with k degrees of freedom (Wilson-Hilferty approximation), as
// test_speculative_sampling uses.
double chi2_critical_1e4(int k) {
  const double z = 3.7190;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// One-sample chi-square of counts against p (bins with expected count >= 5; the rest pooled).
double chi2_against(const std::map<int32_t, int>& counts, const sampling::Distribution& p, int runs,
                    int& bins) {
  double chi2 = 0, pooled_e = 0, pooled_o = 0;
  bins = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = runs * static_cast<double>(p.probs[i]);
    const auto it = counts.find(p.ids[i]);
    const double o = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pooled_e += e, pooled_o += o;
      continue;
    }
    chi2 += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pooled_e > 0) {
    chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  return chi2;
}

// Recursive rejection sampling over siblings: the first committed token follows the target's p, and the
// second, after the first child was taken, its p there; with deterministic children and with children drawn
// without replacement from a drafter's q (q_j: q less the earlier siblings).
TEST(TreeSettle, SiblingRejectionSamplingIsLossless) {
  constexpr int V = 12, kRuns = 20000;
  const cache::Geometry g = small_geometry();
  sampling::Params params;
  params.temperature = 1.0f;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  // Tree: three children of the pending token (tokens 2, 5, 7), the first with two children (1, 3).
  const std::vector<int32_t> drafts0 = {2, 5, 7, 1, 3};
  const std::vector<int32_t> parent = {-1, -1, -1, 0, 0};
  std::vector<float> logits(6 * V);
  const auto noise = testing::normal_floats(6 * V, 9);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 1.3f * noise[i];
  logits[2] += 1.5f;  // the first child is often the target's choice, so the second level is reached
  sampling::Sampler reference(params);
  sampling::Distribution p0, p1;
  const std::vector<int32_t> prompt = {4, 4};
  reference.distribution(std::span<const float>(logits).first(V), prompt, p0);
  std::vector<int32_t> after = prompt;
  after.push_back(2);
  reference.distribution(std::span<const float>(logits).subspan(V, V), after, p1);

  // A drafter's q at the pending token, and the sibling distributions of drafting without replacement.
  sampling::Distribution q;
  for (int32_t id = 0; id < V; ++id) {
    q.ids.push_back(id);
    q.probs.push_back(id == 2 ? 0.3f : id == 5 ? 0.25f : id == 7 ? 0.15f : 0.3f / (V - 3));
  }
  const auto without = [&](std::initializer_list<int32_t> gone) {
    sampling::Distribution d;
    float sum = 0;
    for (size_t i = 0; i < q.size(); ++i)
      if (std::find(gone.begin(), gone.end(), q.ids[i]) == gone.end()) sum += q.probs[i];
    for (size_t i = 0; i < q.size(); ++i)
      if (std::find(gone.begin(), gone.end(), q.ids[i]) == gone.end()) {
        d.ids.push_back(q.ids[i]);
        d.probs.push_back(q.probs[i] / sum);
      }
    return d;
  };
  const auto draw = [](const sampling::Distribution& d, std::mt19937& rng) {
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    for (size_t i = 0; i < d.size(); ++i)
      if ((u -= d.probs[i]) < 0) return d.ids[i];
    return d.ids.back();
  };

  for (bool sampled : {false, true}) {
    std::vector<sampling::Distribution> qs;
    std::vector<int32_t> drafts = drafts0;
    std::map<int32_t, int> first, second;
    int second_runs = 0;
    Settler settler;
    std::mt19937 drafter_rng(99);
    for (int run = 0; run < kRuns; ++run) {
      if (sampled) {
        // The drafter draws the pending token's three children without replacement from q (the second
        // level stays deterministic: point masses).
        qs.assign(5, {});
        qs[0] = q;
        drafts[0] = draw(qs[0], drafter_rng);
        qs[1] = without({drafts[0]});
        drafts[1] = draw(qs[1], drafter_rng);
        qs[2] = without({drafts[0], drafts[1]});
        drafts[2] = draw(qs[2], drafter_rng);
        for (int i : {3, 4}) {
          qs[static_cast<size_t>(i)].ids = {drafts[static_cast<size_t>(i)]};
          qs[static_cast<size_t>(i)].probs = {1.0f};
        }
      }
      params.seed = 7000 + static_cast<uint64_t>(run);
      sampling::Sampler sampler(params);
      cache::KvCache kv(g, 32, cache::KvType::kF16);
      kv.prepare_append(0, static_cast<int64_t>(prompt.size() - 1 + drafts0.size() + 1));
      std::vector<int32_t> committed = prompt;
      TreeWindow w{logits, drafts, parent, qs};
      const SettleOutcome out = settler.settle_tree(w, {committed, sampler, 0, kv, nullptr, nullptr, nullptr},
                                                    [](int32_t, int) { return true; });
      ASSERT_EQ(kv.length(), static_cast<int64_t>(committed.size()) - 1);
      ++first[committed[prompt.size()]];
      if (out.accepted >= 1 && committed[prompt.size()] == drafts[0]) {
        ++second[committed[prompt.size() + 1]];
        ++second_runs;
      }
    }
    int bins = 0;
    double chi2 = chi2_against(first, p0, kRuns, bins);
    EXPECT_LT(chi2, chi2_critical_1e4(bins - 1)) << (sampled ? "sampled" : "deterministic") << " first token";
    chi2 = chi2_against(second, p1, second_runs, bins);
    EXPECT_GT(second_runs, kRuns / 100);
    EXPECT_LT(chi2, chi2_critical_1e4(bins - 1))
        << (sampled ? "sampled" : "deterministic") << " second token";
  }
}

// Whole sampled generations with trees: the first token follows the target sampler's p (the one-sample
// chi-square of test_speculative_sampling, at its prompt: "Once upon a time" continued until n-gram lookup
// proposes a token the target samples with probability in [0.02, 0.98]).
TEST_F(TreeModel, SampledTreesKeepTheFirstTokensDistribution) {
  const std::vector<int32_t> text = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395,
                                     317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265,
                                     282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266};
  constexpr int kRuns = 1200;
  ThreadPool pool(1);
  sampling::Params params;
  params.temperature = 1.0f;
  params.top_k = 0;
  params.top_p = 0.9f;
  params.min_p = 0.0f;
  model::Session s(*stories_, pool, options());
  sampling::Sampler sampler(params);
  NgramSource probe({1, 4});
  std::vector<int32_t> prompt;
  sampling::Distribution p;
  Draft d;
  for (size_t n = 5; n < text.size() && prompt.empty(); ++n) {
    const std::span<const int32_t> head(text.data(), n);
    probe.propose(head, 1, d);
    if (d.tokens.empty()) continue;
    s.truncate(0);
    sampler.distribution(s.eval(head), head, p);
    const float px = p.prob_of(d.tokens[0]);
    if (px >= 0.02f && px <= 0.98f) prompt.assign(head.begin(), head.end());
  }
  ASSERT_FALSE(prompt.empty());
  s.truncate(0);
  sampler.distribution(s.eval(prompt), prompt, p);

  DraftModelSource model_source(*xs_, *stories_, pool, options());
  NgramSource ngram({1, 4});
  for (DraftSource* source : {static_cast<DraftSource*>(&model_source), static_cast<DraftSource*>(&ngram)}) {
    std::map<int32_t, int> counts;
    SpecStats total;
    for (int seed = 0; seed < kRuns; ++seed) {
      SpecOptions o;
      o.generate.max_tokens = 8;
      o.generate.sampling = params;
      o.generate.sampling.seed = 3000 + static_cast<uint64_t>(seed);
      o.draft_max = 4;
      o.use_gate = false;
      o.tree_nodes = 8;
      std::vector<int32_t> out;
      model::Session run(*stories_, pool, options());
      total.add(generate_speculative(
          run, *source, prompt, o, [&](int32_t t) { return out.push_back(t), false; }, nullptr));
      ++counts[out.at(0)];
    }
    EXPECT_EQ(total.tree_rounds, kRuns) << source->kind();
    EXPECT_GT(total.accepted, 0) << source->kind();
    EXPECT_LT(total.accepted, total.drafted) << source->kind();
    int bins = 0;
    const double chi2 = chi2_against(counts, p, kRuns, bins);
    for (size_t i = 0; i < p.size(); ++i) counts.erase(p.ids[i]);
    EXPECT_TRUE(counts.empty()) << "a token outside the target's top-p set was sampled";
    EXPECT_LT(chi2, chi2_critical_1e4(bins - 1)) << source->kind();
  }
}

// N-gram trees merge the continuations of several earlier occurrences: the chain's own (the most recent
// occurrence of the longest suffix) first, the others branching where they differ, within the node budget
// and depth.
TEST(TreeNgram, MergesSeveralContinuationsIntoOneTree) {
  NgramSource ngram({1, 4});
  ngram.begin({}, DraftSettings{});
  Draft chain, tree;
  // "1 2 3" was followed by "10 11 12" and, more recently, by "20 21 6".
  const std::vector<int32_t> two = {1, 2, 3, 10, 11, 12, 5, 1, 2, 3, 20, 21, 6, 1, 2, 3};
  ngram.propose(two, 3, chain);
  ngram.propose_tree(two, 16, 3, tree);
  EXPECT_EQ(chain.tokens, (std::vector<int32_t>{20, 21, 6}));
  EXPECT_EQ(tree.tokens, (std::vector<int32_t>{20, 21, 6, 10, 11, 12}));
  EXPECT_EQ(tree.tree.parent, (std::vector<int32_t>{-1, 0, 1, -1, 3, 4}));
  EXPECT_EQ(tree.tree.depth, (std::vector<int32_t>{1, 2, 3, 1, 2, 3}));
  EXPECT_FALSE(tree.sampled);
  // The node budget cuts the second continuation short.
  ngram.propose_tree(two, 4, 3, tree);
  EXPECT_EQ(tree.tokens, (std::vector<int32_t>{20, 21, 6, 10}));
  EXPECT_EQ(tree.tree.parent, (std::vector<int32_t>{-1, 0, 1, -1}));
  // Continuations that agree share their nodes: "7 8" was followed by "30 31 9" and by "30 40 9"; a shorter
  // suffix ("8") finds the same occurrences and adds nothing.
  const std::vector<int32_t> shared = {7, 8, 30, 31, 9, 7, 8, 30, 40, 9, 7, 8};
  ngram.propose_tree(shared, 16, 3, tree);
  EXPECT_EQ(tree.tokens, (std::vector<int32_t>{30, 40, 9, 31, 9}));
  EXPECT_EQ(tree.tree.parent, (std::vector<int32_t>{-1, 0, 1, 0, 3}));
  // No earlier occurrence: no proposal.
  const std::vector<int32_t> fresh = {4, 5, 6};
  ngram.propose_tree(fresh, 16, 3, tree);
  EXPECT_TRUE(tree.tokens.empty());
  EXPECT_TRUE(tree.tree.empty());
}

// A chain-shaped tree settles as the chain does, draw for draw.
TEST(TreeSettle, ChainShapedTreeSettlesAsTheChain) {
  constexpr int V = 10;
  const cache::Geometry g = small_geometry();
  const std::vector<int32_t> drafts = {3, 6, 1};
  const std::vector<int32_t> parent = {-1, 0, 1};
  const auto noise = testing::normal_floats(4 * V, 2);
  std::vector<float> logits(noise.begin(), noise.end());
  for (float& x : logits) x *= 0.7f;
  sampling::Params params;
  params.temperature = 1.0f;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  int differed = 0;
  for (int run = 0; run < 400; ++run) {
    params.seed = static_cast<uint64_t>(run);
    sampling::Sampler sampler(params);
    std::vector<int32_t> a = {2}, b = {2};
    cache::KvCache ka(g, 16, cache::KvType::kF16), kb(g, 16, cache::KvType::kF16);
    ka.prepare_append(0, 4);
    kb.prepare_append(0, 4);
    Settler s1, s2;
    s1.settle(Window{logits, drafts, {}}, {a, sampler, 3, ka, nullptr, nullptr, nullptr},
              [](int32_t, int) { return true; });
    s2.settle_tree(TreeWindow{logits, drafts, parent, {}}, {b, sampler, 3, kb, nullptr, nullptr, nullptr},
                   [](int32_t, int) { return true; });
    ASSERT_EQ(a, b) << "seed " << run;
    ASSERT_EQ(ka.length(), kb.length());
    differed += a.size() != 5;
  }
  EXPECT_GT(differed, 0) << "rejections were exercised";
}

}  // namespace
}  // namespace tandem::speculative
