// Greedy speculative decoding on the two real tiny models (same tok512 vocabulary): its output must equal
// plain greedy decoding token for token, for every public prompt, with a draft model and with n-gram lookup,
// at every depth 1..8, gate on and off. The verify window's logits must equal plain decode logits bit for
// bit, and after any number of rounds the target cache must behave exactly like the cache of plain decoding
// of the same tokens. The acceptance by draft position counts what a drafter of a known pattern earns.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "greedy_fixture.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "test_util.h"

namespace tandem::speculative {
namespace {

using engine::generate_speculative;
using engine::SpecOptions;
using engine::SpecStats;

constexpr int64_t kTokens = 48;  // as many as the goldens hold

std::vector<std::vector<int32_t>> public_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  for (const char* name : {"golden/stories260K.public.jsonl", "golden/llama2xs.public.jsonl"}) {
    std::ifstream in(testing::shared_path(name));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty())
        prompts.push_back(nlohmann::json::parse(line).at("prompt_ids").get<std::vector<int32_t>>());
  }
  return prompts;
}

struct Pair {
  std::unique_ptr<model::Model> target, draft;
};

model::SessionOptions session_options() {
  model::SessionOptions o;
  o.kv_type = cache::KvType::kF16;
  return o;
}

std::vector<int32_t> plain_greedy(const model::Model& m, ThreadPool& pool, std::span<const int32_t> prompt,
                                  int64_t max_tokens) {
  return greedy_fixture::plain_greedy(m, pool, session_options(), prompt, max_tokens);
}

std::vector<int32_t> spec_greedy(const model::Model& m, ThreadPool& pool, DraftSource& source,
                                 std::span<const int32_t> prompt, int depth, bool gate,
                                 SpecStats* stats = nullptr) {
  model::Session s(m, pool, session_options());
  SpecOptions o;
  o.generate.max_tokens = kTokens;
  o.generate.sampling.temperature = 0.0f;
  o.draft_max = depth;
  o.use_gate = gate;
  // Cheap verify windows, so the gate drafts at various depths rather than never.
  o.costs = CostModel::linear(0.05, 0.02);
  o.gate.probe_interval = 2;
  std::vector<int32_t> out;
  const SpecStats st = generate_speculative(
      s, source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
  if (stats) *stats = st;
  EXPECT_EQ(s.length(), static_cast<int64_t>(prompt.size() + out.size()) - 1);
  return out;
}

class SpeculativeGreedy : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    stories_ = model::Model::load(testing::shared_path("models/stories260K.gguf")).release();
    xs_ = model::Model::load(testing::shared_path("models/llama2xs-tok512.gguf")).release();
  }
  static void TearDownTestSuite() {
    delete stories_;
    delete xs_;
  }
  static model::Model* stories_;
  static model::Model* xs_;
};
model::Model* SpeculativeGreedy::stories_ = nullptr;
model::Model* SpeculativeGreedy::xs_ = nullptr;

TEST_F(SpeculativeGreedy, IdenticalToPlainForEveryPromptDrafterDepthAndGate) {
  ThreadPool pool(1);
  const auto prompts = public_prompts();
  ASSERT_EQ(prompts.size(), 16u);
  const model::Model* pairs[2][2] = {{stories_, xs_}, {xs_, stories_}};
  for (const auto& pair : pairs) {
    const model::Model& target = *pair[0];
    DraftModelSource model_source(*pair[1], target, pool, session_options());
    NgramSource ngram({1, 4});
    DraftSource* sources[] = {&model_source, &ngram};
    SpecStats total;
    for (const auto& prompt : prompts) {
      const auto plain = plain_greedy(target, pool, prompt, kTokens);
      ASSERT_EQ(plain.size(), static_cast<size_t>(kTokens));
      for (DraftSource* source : sources) {
        for (int depth = 1; depth <= 8; ++depth) {
          for (bool gate : {false, true}) {
            SpecStats st;
            const auto spec = spec_greedy(target, pool, *source, prompt, depth, gate, &st);
            ASSERT_EQ(spec, plain) << "source " << source->kind() << " depth " << depth << " gate " << gate
                                   << " target " << target.file().path() << " prompt length "
                                   << prompt.size();
            if (!gate) {
              EXPECT_GT(st.rounds, 0);
            }
            total.add(st);
          }
        }
      }
    }
    EXPECT_GT(total.accepted, 0);
    EXPECT_LT(total.accepted, total.drafted);  // rejections were exercised too
  }
}

// The rows of one verify window compute the same bits as the same tokens decoded one at a time.
TEST_F(SpeculativeGreedy, WindowLogitsEqualPlainDecodeBitForBit) {
  ThreadPool pool(2);
  const auto prompts = public_prompts();
  for (const model::Model* m : {stories_, xs_}) {
    const auto& prompt = prompts[0];
    const auto cont = plain_greedy(*m, pool, prompt, 12);
    const auto V = static_cast<size_t>(m->config().n_vocab);
    model::Session plain(*m, pool, session_options()), window(*m, pool, session_options());
    plain.eval(prompt);
    std::vector<float> expected;
    for (int32_t t : cont) {
      const auto l = plain.eval(std::span<const int32_t>(&t, 1));
      expected.insert(expected.end(), l.begin(), l.end());
    }
    window.eval(prompt);
    for (size_t w : {size_t{1}, size_t{3}, size_t{8}}) {
      window.truncate(static_cast<int64_t>(prompt.size()));
      for (size_t b = 0; b < cont.size(); b += w) {
        const size_t n = std::min(w, cont.size() - b);
        const auto l = window.eval(std::span<const int32_t>(cont).subspan(b, n), true);
        ASSERT_EQ(std::memcmp(l.data(), expected.data() + b * V, n * V * sizeof(float)), 0)
            << "window of " << w << " at " << b;
      }
    }
  }
}

// Stops a speculative run after k tokens (mid-window included), then checks the target cache by evaluating
// the same probe continuation on it and on a cache built by plain one-token decoding: the logits must be
// identical.
TEST_F(SpeculativeGreedy, TargetCacheEqualsPlainDecodingAfterAnyNumberOfRounds) {
  ThreadPool pool(1);
  const auto prompts = public_prompts();
  const auto& prompt = prompts[1];
  DraftModelSource source(*xs_, *stories_, pool, session_options());
  const auto V = static_cast<size_t>(stories_->config().n_vocab);
  for (int64_t stop_after : {1, 2, 5, 9, 17, 30}) {
    for (bool sample : {false, true}) {
      model::Session target(*stories_, pool, session_options());
      SpecOptions o;
      o.generate.max_tokens = 100;
      o.generate.sampling.temperature = sample ? 1.0f : 0.0f;
      o.generate.sampling.seed = 5;
      o.draft_max = 4;
      o.use_gate = false;
      std::vector<int32_t> text(prompt.begin(), prompt.end());
      generate_speculative(
          target, source, prompt, o,
          [&](int32_t t) {
            text.push_back(t);
            return static_cast<int64_t>(text.size() - prompt.size()) < stop_after;
          },
          nullptr);
      ASSERT_EQ(target.length(), static_cast<int64_t>(text.size()) - 1);
      model::Session plain(*stories_, pool, session_options());
      plain.eval(std::span<const int32_t>(prompt).first(1));
      for (size_t i = 1; i + 1 < text.size(); ++i) plain.eval(std::span<const int32_t>(text).subspan(i, 1));
      ASSERT_EQ(plain.length(), target.length());
      const std::vector<int32_t> probe = {text.back(), 300, 301, 302};
      const auto a = target.eval(probe, true);
      const std::vector<float> from_spec(a.begin(), a.end());
      const auto b = plain.eval(probe, true);
      ASSERT_EQ(std::memcmp(from_spec.data(), b.data(), probe.size() * V * sizeof(float)), 0)
          << "after " << stop_after << " tokens, sampling " << sample;
    }
  }
}

// Replays the target's greedy text with one corrupted draft per round, at the index the pattern names for
// that round (past the proposal: none corrupted), and logs each proposal's length and corrupted index.
class PatternSource final : public DraftSource {
 public:
  PatternSource(std::vector<int32_t> reference, std::vector<int> pattern, int64_t n_vocab)
      : reference_(std::move(reference)), pattern_(std::move(pattern)), n_vocab_(n_vocab) {}
  std::string_view kind() const override { return "pattern"; }
  void begin(std::span<const int32_t>, const DraftSettings&) override {}
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override {
    out.clear();
    const int bad = pattern_[rounds.size() % pattern_.size()];
    for (size_t pos = committed.size(); pos < reference_.size() && out.tokens.size() < size_t(max_depth);
         ++pos) {
      int32_t t = reference_[pos];
      if (static_cast<int>(out.tokens.size()) == bad) t = static_cast<int32_t>((t + 1) % n_vocab_);
      out.tokens.push_back(t);
    }
    rounds.push_back({static_cast<int>(out.tokens.size()), bad});
  }
  void accept(std::span<const int32_t>, int) override {}

  struct Round {
    int proposed, corrupted;
  };
  std::vector<Round> rounds;

 private:
  std::vector<int32_t> reference_;
  std::vector<int> pattern_;
  int64_t n_vocab_;
};

// Draft position k is accepted exactly when the round corrupted none of the first k drafts: the counts by
// position follow from the pattern alone.
TEST_F(SpeculativeGreedy, AcceptanceByPositionFollowsAKnownPattern) {
  ThreadPool pool(1);
  const std::vector<int32_t> prompt = public_prompts().front();
  const int64_t V = stories_->config().n_vocab;
  const auto plain = plain_greedy(*stories_, pool, prompt, kTokens);
  std::vector<int32_t> reference(prompt.begin(), prompt.end());
  reference.insert(reference.end(), plain.begin(), plain.end());
  constexpr int kDepth = 5;

  // Rounds alternate: the third draft corrupted (two accepted), then none of five (all accepted).
  PatternSource source(reference, {2, kDepth}, V);
  model::Session s(*stories_, pool, session_options());
  SpecOptions o;
  o.generate.max_tokens = kTokens;
  o.generate.sampling.temperature = 0.0f;
  o.draft_max = kDepth;
  o.use_gate = false;
  std::vector<int32_t> out;
  const SpecStats st = generate_speculative(
      s, source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
  ASSERT_EQ(out, plain);
  ASSERT_EQ(st.rounds, static_cast<int64_t>(source.rounds.size())) << "every proposal was verified";
  ASSERT_GE(st.rounds, 4);

  std::vector<int64_t> proposed(kDepth, 0), accepted(kDepth, 0);
  for (const PatternSource::Round& r : source.rounds)
    for (int k = 0; k < r.proposed; ++k) {
      ++proposed[static_cast<size_t>(k)];
      if (k < r.corrupted) ++accepted[static_cast<size_t>(k)];
    }
  EXPECT_EQ(st.proposed_by_position, proposed);
  EXPECT_EQ(st.accepted_by_position, accepted);
  const std::vector<double> by_position = st.acceptance_by_position();
  ASSERT_EQ(by_position.size(), static_cast<size_t>(kDepth));
  EXPECT_EQ(by_position[0], 1.0);
  EXPECT_EQ(by_position[1], 1.0);
  for (size_t k = 0; k < by_position.size(); ++k)
    EXPECT_DOUBLE_EQ(by_position[k], static_cast<double>(accepted[k]) / static_cast<double>(proposed[k]))
        << "position " << k + 1;
  // About half the rounds reach past the corruption (the last rounds may be cut short by the length).
  EXPECT_GT(by_position[2], 0.3);
  EXPECT_LT(by_position[2], 0.7);
  int64_t total = 0;
  for (int64_t a : accepted) total += a;
  EXPECT_EQ(total, st.accepted) << "each accepted draft is counted at its position";

  // Adding two runs adds their counts position by position.
  SpecStats twice = st;
  twice.add(st);
  EXPECT_EQ(twice.acceptance_by_position(), by_position);
  EXPECT_EQ(twice.proposed_by_position[0], 2 * proposed[0]);
}

TEST(SpecStats, AcceptanceByPositionCountsChainsAndTrees) {
  SpecStats st;
  EXPECT_TRUE(st.acceptance_by_position().empty());
  st.record_round(3, 3, 3);  // a chain of 3, all accepted
  st.record_round(3, 3, 1);  // a chain of 3, the first accepted
  st.record_round(4, 2, 0);  // a tree of 4 nodes, 2 deep, nothing accepted
  EXPECT_EQ(st.rounds, 3);
  EXPECT_EQ(st.drafted, 10);
  EXPECT_EQ(st.accepted, 4);
  EXPECT_EQ(st.proposed_by_position, (std::vector<int64_t>{3, 3, 2}));
  EXPECT_EQ(st.accepted_by_position, (std::vector<int64_t>{2, 1, 1}));
  const std::vector<double> a = st.acceptance_by_position();
  ASSERT_EQ(a.size(), 3u);
  EXPECT_DOUBLE_EQ(a[0], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(a[1], 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(a[2], 0.5);
  // Positions never proposed are left out of the fractions.
  SpecStats deep;
  deep.proposed_by_position.assign(8, 0);
  deep.accepted_by_position.assign(8, 0);
  deep.record_round(2, 2, 2);
  EXPECT_EQ(deep.acceptance_by_position(), (std::vector<double>{1.0, 1.0}));
}

}  // namespace
}  // namespace tandem::speculative
