// Grammar tests: building grammars (left recursion and other mistakes refused), byte-level matching with
// the lazily built DFA, the token trie, token masks against a token-by-token check on real vocabularies,
// and the matcher's positions (rollback, clone, draft prefixes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/sampling/grammar.h"
#include "tandem/sampling/json_schema.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"
#include "test_util.h"

#include "alloc_counter.inc"  // g_allocations, TANDEM_COUNTS_ALLOCATIONS

namespace tandem::sampling {
namespace {

using testing::shared_path;
using Seq = GrammarBuilder::Sequence;

bool matches(const Grammar& g, std::string_view text) {
  GrammarStates states(g);
  const int32_t s = states.advance(states.initial(), text);
  return s != GrammarStates::kDead && states.accepting(s);
}

bool is_prefix(const Grammar& g, std::string_view text) {
  GrammarStates states(g);
  return states.advance(states.initial(), text) != GrammarStates::kDead;
}

// list ::= "[" (item ("," item)*)? "]"   item ::= [a-c]+
Grammar list_grammar() {
  GrammarBuilder b;
  const int32_t item = b.repeat("item", {b.byte_range('a', 'c')}, 1, -1);
  const int32_t more = b.repeat("more", {b.literal(",")[0], GrammarBuilder::ref(item)}, 0, -1);
  const int32_t root = b.rule(
      "list", {b.literal("[]"),
               {b.literal("[")[0], GrammarBuilder::ref(item), GrammarBuilder::ref(more), b.literal("]")[0]}});
  return std::move(b).build(root);
}

TEST(GrammarBuild, MatchesWholeTextsOnly) {
  const Grammar g = list_grammar();
  for (const char* ok : {"[]", "[a]", "[abc,b,cc]"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"", "[", "[a", "[a,]", "[,a]", "[d]", "[a]]", "[]x", "[a,,b]"})
    EXPECT_FALSE(matches(g, bad)) << bad;
  EXPECT_TRUE(is_prefix(g, "[a,b"));
  EXPECT_FALSE(is_prefix(g, "[a,,"));
}

TEST(GrammarBuild, BoundedRepeatCountsItems) {
  GrammarBuilder b;
  const int32_t root = b.repeat("x", {b.literal("x")[0]}, 2, 4);
  const Grammar g = std::move(b).build(root);
  EXPECT_FALSE(matches(g, "x"));
  EXPECT_TRUE(matches(g, "xx"));
  EXPECT_TRUE(matches(g, "xxxx"));
  EXPECT_FALSE(matches(g, "xxxxx"));
}

// Many large bounds in one grammar are refused as a whole, however small each is.
TEST(GrammarBuild, BoundedRepeatsHaveABudgetInAll) {
  GrammarBuilder b;
  const GrammarElement a = b.literal("a")[0];
  b.repeat("first", {a}, 0, 90000);
  b.repeat("second", {a}, 0, 90000);
  EXPECT_THROW(b.repeat("third", {a}, 0, 90000), Error);
  b.repeat("small", {a}, 0, 100);
}

TEST(GrammarBuild, RefusesLeftRecursionNamingTheCycle) {
  GrammarBuilder b;
  const int32_t expr = b.declare("expr");
  const int32_t opt = b.rule("maybe-space", {{}, b.literal(" ")});
  b.add_alternative(expr, {GrammarBuilder::ref(opt), GrammarBuilder::ref(expr), b.literal("+")[0]});
  b.add_alternative(expr, b.literal("1"));
  try {
    std::move(b).build(expr);
    FAIL() << "left recursion through a nullable rule was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("left-recursive (expr -> expr)"), std::string::npos) << e.what();
  }
}

TEST(GrammarBuild, RefusesEmptyAndUndeclaredRules) {
  {
    GrammarBuilder b;
    const int32_t empty = b.declare("nothing");
    EXPECT_THROW(std::move(b).build(empty), Error);
  }
  {
    GrammarBuilder b;
    const int32_t r = b.rule("r", {{GrammarBuilder::ref(7)}});
    EXPECT_THROW(std::move(b).build(r), Error);
  }
}

TEST(GrammarStates, RepetitionReachesAFixedState) {
  // A right-recursive repetition must not grow the parse stack: the DFA stays small however long the text.
  const Grammar g = list_grammar();
  GrammarStates states(g);
  int32_t s = states.advance(states.initial(), "[");
  for (int i = 0; i < 1000; ++i) s = states.advance(s, i % 7 == 6 ? "," : "abc");
  ASSERT_NE(s, GrammarStates::kDead);
  EXPECT_LT(states.n_states(), 10u);
  EXPECT_TRUE(states.accepting(states.advance(s, "a]")));
}

TEST(GrammarStates, ToStringShowsRules) {
  const std::string text = list_grammar().to_string();
  EXPECT_EQ(text.rfind("list#", 0), 0u) << text;
  EXPECT_NE(text.find("\"[]\""), std::string::npos) << text;
  EXPECT_NE(text.find("[a-c]"), std::string::npos) << text;
}

// ---- token trie and masks -----------------------------------------------------------------------------

std::shared_ptr<const TokenTrie> toy_trie() {
  const std::vector<std::string> pieces = {"[",  "]",  "a",  "ab", "abc", "b",  ",",
                                           ",a", "a]", "[a", "",   "c",   "abc"};
  std::vector<bool> eog(pieces.size(), false);
  eog[10] = true;
  return TokenTrie::build(pieces, eog);
}

TEST(TokenTrie, PreorderWithSkips) {
  const auto trie = toy_trie();
  const auto& nodes = trie->nodes();
  // Every piece is reachable: walking the path of its bytes ends at a node holding its id.
  for (int32_t id = 0; id < trie->n_vocab(); ++id) {
    if (trie->is_eog(id)) continue;
    const std::string_view piece = trie->piece(id);
    int32_t i = 0;
    int32_t end = static_cast<int32_t>(nodes.size());
    int32_t found = -1;
    for (size_t d = 0; d < piece.size(); ++d) {
      while (i < end && nodes[static_cast<size_t>(i)].byte != static_cast<uint8_t>(piece[d]))
        i = nodes[static_cast<size_t>(i)].skip;
      ASSERT_LT(i, end) << piece;
      ASSERT_EQ(nodes[static_cast<size_t>(i)].depth, d + 1);
      found = i;
      end = nodes[static_cast<size_t>(i)].skip;
      ++i;
    }
    const auto& node = nodes[static_cast<size_t>(found)];
    bool holds = false;
    for (int32_t t = node.tokens_begin; t < node.tokens_end; ++t)
      holds |= trie->tokens()[static_cast<size_t>(t)] == id;
    EXPECT_TRUE(holds) << piece;
  }
  EXPECT_EQ(trie->max_depth(), 3);
  EXPECT_EQ(trie->eog_tokens().size(), 1u);
}

TEST(TokenMask, ToyVocabulary) {
  auto grammar = std::make_shared<const Grammar>(list_grammar());
  GrammarMatcher m(grammar, toy_trie());
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_EQ(mask.allowed_ids(), (std::vector<int32_t>{0, 9}));  // "[" and "[a"
  ASSERT_TRUE(m.accept_token(9));
  m.fill_mask(mask);
  // After "[a": more item letters, a comma, or the close; both "abc" tokens (duplicates) are allowed.
  EXPECT_EQ(mask.allowed_ids(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 11, 12}));
  EXPECT_FALSE(m.accept_token(10));  // end of generation before the list is closed
  ASSERT_TRUE(m.accept_token(1));
  EXPECT_TRUE(m.complete());
  m.fill_mask(mask);
  EXPECT_EQ(mask.allowed_ids(), (std::vector<int32_t>{10}));
  ASSERT_TRUE(m.accept_token(10));
  EXPECT_TRUE(m.terminated());
  m.fill_mask(mask);
  EXPECT_EQ(mask.count(), 0);
}

// must_end: complete with nothing that could follow. A closed list must end; a complete number may grow.
TEST(GrammarMatcher, MustEndOnlyWhenNoByteCanFollow) {
  auto grammar = std::make_shared<const Grammar>(list_grammar());
  GrammarMatcher m(grammar, toy_trie());
  EXPECT_FALSE(m.must_end());
  ASSERT_TRUE(m.accept_token(9));  // "[a"
  EXPECT_FALSE(m.must_end());
  ASSERT_TRUE(m.accept_token(1));  // "]"
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.must_end());
  ASSERT_TRUE(m.accept_token(10));
  EXPECT_FALSE(m.must_end());  // already ended

  GrammarBuilder b;
  const int32_t root = b.repeat("as", {b.literal("a")[0]}, 1, -1);
  GrammarMatcher as(std::make_shared<const Grammar>(std::move(b).build(root)), toy_trie());
  ASSERT_TRUE(as.accept_text("a"));
  EXPECT_TRUE(as.complete());
  EXPECT_FALSE(as.must_end());
}

TEST(TokenMask, ApplyToLogits) {
  TokenMask mask(70);
  mask.set(3);
  mask.set(65);
  std::vector<float> logits(70, 1.0f);
  apply_token_mask(logits, mask);
  for (int i = 0; i < 70; ++i) EXPECT_EQ(std::isinf(logits[static_cast<size_t>(i)]), i != 3 && i != 65) << i;
}

TEST(GrammarMatcher, RollbackCloneAndDraftPrefix) {
  auto grammar = std::make_shared<const Grammar>(list_grammar());
  GrammarMatcher m(grammar, toy_trie());
  // "[" "abc" ",a" "," "," "]": the second comma is refused, so the draft is cut before it.
  const std::vector<int32_t> draft = {0, 4, 7, 6, 6, 1};
  EXPECT_EQ(m.accept_prefix(draft), 4u);
  EXPECT_EQ(m.position(), 4u);
  GrammarMatcher copy = m.clone();
  ASSERT_TRUE(copy.accept_token(11));
  ASSERT_TRUE(copy.accept_token(1));
  EXPECT_TRUE(copy.complete());
  EXPECT_FALSE(m.complete());  // the clone's progress is its own
  EXPECT_EQ(m.position(), 4u);
  m.rollback_to(1);
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_TRUE(mask.test(2));
  EXPECT_FALSE(mask.test(6));  // "[" then "," is refused
  EXPECT_THROW(m.accept_token(99), Error);
}

TEST(TokenTrie, OverlongPieceIsNeverAllowed) {
  GrammarBuilder b;
  const int32_t root = b.repeat("as", {b.literal("a")[0]}, 1, -1);
  auto grammar = std::make_shared<const Grammar>(std::move(b).build(root));
  const auto trie = TokenTrie::build({"a", std::string(70000, 'a')}, {false, false});
  GrammarMatcher m(grammar, trie);
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_TRUE(mask.test(0));
  EXPECT_FALSE(mask.test(1));
  EXPECT_FALSE(m.can_accept(1));
}

// What speculative decoding relies on: a clone that accepts a draft sees, at every drafted position, the
// mask that plain decoding saw there, the draft is cut at its first refused token, and rolling back restores
// the earlier masks.
TEST(GrammarMatcher, DraftMasksEqualPlainDecodingMasks) {
  const auto tok =
      tokenizer::Tokenizer::from_gguf(gguf::File::open(shared_path("vocab/ggml-vocab-llama-spm.gguf")));
  const auto trie = TokenTrie::build(*tok);
  // At least 100 items: the walk cannot finish within its 60 tokens, so some token other than an end of
  // generation is always allowed.
  auto grammar = std::make_shared<const Grammar>(
      grammar_from_json_schema(R"({"type":"array","items":{"type":"string"},"minItems":100})"));
  GrammarMatcher plain(grammar, trie);
  std::mt19937 rng(3);
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> masks;
  TokenMask mask;
  for (int step = 0; step < 60; ++step) {
    plain.fill_mask(mask);
    masks.push_back(mask.allowed_ids());
    std::vector<int32_t> allowed;
    for (int32_t id : masks.back())
      if (!trie->is_eog(id)) allowed.push_back(id);
    ASSERT_FALSE(allowed.empty());
    const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    ASSERT_TRUE(plain.accept_token(pick));
    tokens.push_back(pick);
  }
  // A separate matcher (its own caches) replays the first 20 tokens, then drafts the next 30 with a refused
  // token spliced in at draft index 12.
  GrammarMatcher target(grammar, trie);
  ASSERT_EQ(target.accept_prefix(std::span(tokens).first(20)), 20u);
  std::vector<int32_t> draft(tokens.begin() + 20, tokens.begin() + 50);
  int32_t refused = 0;
  while (std::binary_search(masks[32].begin(), masks[32].end(), refused)) ++refused;
  draft[12] = refused;
  GrammarMatcher drafter = target.clone();
  EXPECT_EQ(drafter.accept_prefix(draft), 12u);
  for (size_t k = 13; k-- > 0;) {
    drafter.rollback_to(20 + k);
    drafter.fill_mask(mask);
    EXPECT_EQ(mask.allowed_ids(), masks[20 + k]) << "draft position " << k;
  }
  target.fill_mask(mask);
  EXPECT_EQ(mask.allowed_ids(), masks[20]);
}

// Once its states and masks are cached, a step (mask, mask applied to the logits, accept) allocates nothing.
TEST(GrammarMatcher, CachedStepsDoNotAllocate) {
  if (!TANDEM_COUNTS_ALLOCATIONS) GTEST_SKIP() << "allocations are not counted under AddressSanitizer";
  auto grammar = std::make_shared<const Grammar>(list_grammar());
  GrammarMatcher m(grammar, toy_trie());
  const std::vector<int32_t> tokens = {9, 3, 7, 6, 11, 1, 10};  // "[a" "ab" ",a" "," "c" "]" end
  TokenMask mask;
  std::vector<float> logits(static_cast<size_t>(toy_trie()->n_vocab()));
  for (int pass = 0; pass < 2; ++pass) {
    m.rollback_to(0);
    const size_t before = g_allocations.load();
    for (int32_t id : tokens) {
      m.fill_mask(mask);
      apply_token_mask(logits, mask);
      ASSERT_TRUE(m.accept_token(id));
    }
    if (pass == 1) {
      EXPECT_EQ(g_allocations.load() - before, 0u);
    }
  }
}

// Real vocabularies: the mask equals a token-by-token check (every token's bytes walked through the grammar)
// at every step of a random walk over JSON objects.
class VocabMask : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabMask, MaskEqualsPerTokenCheck) {
  const auto tok = tokenizer::Tokenizer::from_gguf(gguf::File::open(shared_path(GetParam())));
  const auto trie = TokenTrie::build(*tok);
  ASSERT_EQ(trie->n_vocab(), tok->n_vocab());
  auto grammar = std::make_shared<const Grammar>(json_object_grammar());
  GrammarMatcher m(grammar, trie);
  std::mt19937 rng(7);
  TokenMask mask;
  for (int step = 0; step < 40 && !m.terminated(); ++step) {
    m.fill_mask(mask);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < tok->n_vocab(); ++id) {
      EXPECT_EQ(mask.test(id), m.can_accept(id)) << "token " << id << " at step " << step;
      if (mask.test(id)) allowed.push_back(id);
    }
    ASSERT_FALSE(allowed.empty()) << "step " << step;
    const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    ASSERT_TRUE(m.accept_token(pick));
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, VocabMask,
                         ::testing::Values("vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                                           "vocab/ggml-vocab-deepseek-llm.gguf",
                                           "vocab/ggml-vocab-phi-3.gguf", "models/stories260K.gguf"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string name = param_info.param.substr(param_info.param.find('/') + 1);
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace tandem::sampling
