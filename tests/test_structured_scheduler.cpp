// Constrained output in the scheduler: every step's logits are masked by the request's grammar, the output
// ends when the grammar is complete, and speculation keeps it lossless: constrained greedy with an n-gram
// drafter, a draft model or a drafter that ignores the grammar equals constrained plain, token for token.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/engine/cache_pool.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/graph.h"
#include "tandem/sampling/json_schema.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/tokenizer/tokenizer.h"
#include "test_util.h"

namespace {

using namespace tandem;
using engine::Event;
using engine::Finish;
using engine::Scheduler;

constexpr int64_t kCtx = 256;

constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["cat", "dog", "bird"]}, "maxItems": 3}
  },
  "required": ["name", "age", "tags"]
})";

struct Fixture {
  Fixture()
      : model(model::Model::load(tandem::testing::shared_path("models/stories260K.gguf"))),
        draft(model::Model::load(tandem::testing::shared_path("models/llama2xs-tok512.gguf"))),
        tok(tokenizer::Tokenizer::from_gguf(model->file())),
        trie(sampling::TokenTrie::build(*tok)),
        grammar(std::make_shared<const sampling::Grammar>(sampling::grammar_from_json_schema(kSchema))),
        pool(2) {}
  std::unique_ptr<model::Model> model, draft;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::shared_ptr<const sampling::TokenTrie> trie;
  std::shared_ptr<const sampling::Grammar> grammar;
  ThreadPool pool;

  engine::Request request(const std::string& prompt, float temperature) const {
    engine::Request r;
    r.prompt = tok->encode(prompt, /*add_special=*/true, /*parse_special=*/false);
    r.max_tokens = 150;
    r.sampling.temperature = temperature;
    r.sampling.seed = 11;
    r.grammar.emplace(grammar, trie);
    return r;
  }
  std::string text(const std::vector<int32_t>& tokens) const {
    std::string s;
    for (int32_t t : tokens) s += trie->piece(t);
    return s;
  }
};

struct Result {
  std::vector<int32_t> tokens;
  Finish finish = Finish::kError;
  std::string error;
};

Result collect(engine::Stream& s) {
  Result r;
  Event ev;
  for (;;) {
    if (!s.next(ev, std::chrono::milliseconds(30000))) {
      ADD_FAILURE() << "no event within 30 s";
      return r;
    }
    if (ev.kind == Event::Kind::kToken) {
      r.tokens.push_back(ev.token.id);
      continue;
    }
    r.finish = ev.finish;
    r.error = ev.error;
    return r;
  }
}

Result run(model::Graph& graph, const model::Config& config, engine::Request req,
           const engine::SchedulerOptions& options, engine::DraftFactory drafts = {},
           engine::SchedulerStats* stats = nullptr) {
  engine::SlotCachePool caches(config, kCtx, cache::KvType::kF16, options.max_running);
  Scheduler s(graph, caches, nullptr, options, std::move(drafts));
  Scheduler::Admit a{};
  std::string why;
  auto stream = s.submit(std::move(req), a, &why);
  EXPECT_EQ(a, Scheduler::Admit::kOk) << why;
  if (!stream) return {};
  Result r = collect(*stream);
  if (stats) *stats = s.stats();
  return r;
}

// Proposes the right next token, then one the grammar never allows (a control token has no text), then
// the right tokens again.
class RefusedSecondDraft final : public speculative::DraftSource {
 public:
  RefusedSecondDraft(std::vector<int32_t> full, int32_t refused, bool sampled = false)
      : full_(std::move(full)), refused_(refused), sampled_(sampled) {}
  std::string_view kind() const override { return "refused-second"; }
  void begin(std::span<const int32_t>, const speculative::DraftSettings&) override {}
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    out.clear();
    for (size_t at = committed.size(); at < full_.size() && static_cast<int>(out.tokens.size()) < max_depth;
         ++at)
      out.tokens.push_back(out.tokens.size() == 1 ? refused_ : full_[at]);
    // Sampled: each token as drawn from a point mass on it.
    out.sampled = sampled_;
    for (size_t i = 0; sampled_ && i < out.tokens.size(); ++i) {
      sampling::Distribution& q = out.q_slot(i);
      q.ids.assign(1, out.tokens[i]);
      q.probs.assign(1, 1.0f);
    }
  }
  void accept(std::span<const int32_t>, int) override {}

 private:
  std::vector<int32_t> full_;
  int32_t refused_;
  bool sampled_;
};

const char* const kPrompts[] = {"Once upon a time", "The cat sat on the mat. The cat sat on the", "Lily"};

TEST(StructuredScheduler, GreedyOutputIsValidJsonAndEndsWithTheGrammar) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  for (const char* prompt : kPrompts) {
    engine::Request req = f.request(prompt, 0.0f);
    req.stop_at_eog = false;  // the grammar alone ends the output
    const Result r = run(graph, f.model->config(), std::move(req), {1, 4, 32, 0});
    ASSERT_EQ(r.finish, Finish::kStop) << r.error;
    const std::string text = f.text(r.tokens);
    const nlohmann::json j = nlohmann::json::parse(text);  // throws (fails the test) on invalid JSON
    EXPECT_TRUE(j.at("name").is_string()) << text;
    EXPECT_TRUE(j.at("age").is_number_integer()) << text;
    EXPECT_LE(j.at("tags").size(), 3u) << text;
    sampling::GrammarMatcher check(f.grammar, f.trie);
    EXPECT_EQ(check.accept_prefix(r.tokens), r.tokens.size());
    EXPECT_TRUE(check.must_end()) << text;
  }
}

TEST(StructuredScheduler, SpeculativeGreedyEqualsPlainUnderAGrammar) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const model::Config& config = f.model->config();
  // Verified and accepted drafts per drafter (n-gram, model): the equalities covered speculative rounds.
  uint64_t drafted[2] = {}, accepted[2] = {};
  for (const char* prompt : kPrompts) {
    const Result plain = run(graph, config, f.request(prompt, 0.0f), {1, 4, 32, 0});
    ASSERT_EQ(plain.finish, Finish::kStop) << plain.error;

    engine::SchedulerStats stats;
    const Result ngram = run(
        graph, config, f.request(prompt, 0.0f), {1, 4, 32, 6},
        [] { return std::make_unique<speculative::NgramSource>(); }, &stats);
    EXPECT_EQ(ngram.tokens, plain.tokens) << prompt;
    EXPECT_EQ(ngram.finish, Finish::kStop);
    drafted[0] += stats.drafted;
    accepted[0] += stats.accepted;

    const Result model = run(
        graph, config, f.request(prompt, 0.0f), {1, 4, 32, 6},
        [&] {
          return std::make_unique<speculative::DraftModelSource>(*f.draft, *f.model, f.pool,
                                                                 model::SessionOptions{});
        },
        &stats);
    EXPECT_EQ(model.tokens, plain.tokens) << prompt;
    EXPECT_EQ(model.finish, Finish::kStop);
    drafted[1] += stats.drafted;
    accepted[1] += stats.accepted;
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_GT(drafted[i], 0u) << i;
    EXPECT_GT(accepted[i], 0u) << i;
  }
}

// Deterministic drafts are cut at their first token the grammar refuses, before verification: every draft
// the target verifies is then the right one, and the output is the constrained one.
TEST(StructuredScheduler, DraftsAreCutAtTheFirstTokenTheGrammarRefuses) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const model::Config& config = f.model->config();
  const engine::Request req = f.request(kPrompts[0], 0.0f);
  const Result plain = run(graph, config, req, {1, 4, 32, 0});
  ASSERT_EQ(plain.finish, Finish::kStop) << plain.error;
  std::vector<int32_t> full = req.prompt;
  full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
  const int32_t refused = f.tok->bos_id();
  ASSERT_GE(refused, 0);
  ASSERT_FALSE(sampling::GrammarMatcher(f.grammar, f.trie).can_accept(refused));

  engine::SchedulerStats stats;
  const Result spec = run(
      graph, config, req, {1, 4, 32, 6}, [&] { return std::make_unique<RefusedSecondDraft>(full, refused); },
      &stats);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(stats.drafted, 0u);
  EXPECT_EQ(stats.accepted, stats.drafted);  // the refused token never reached verification

  // A sampled draft keeps its refused token for verification (its rejection is what keeps the output's
  // distribution the target's), and loses only what follows it.
  const Result sampled = run(
      graph, config, req, {1, 4, 32, 6},
      [&] { return std::make_unique<RefusedSecondDraft>(full, refused, true); }, &stats);
  EXPECT_EQ(sampled.tokens, plain.tokens);
  EXPECT_GT(stats.accepted, 0u);
  // Each window: the right token, then (when the gate drafted two or more) the refused one, rejected.
  EXPECT_GT(stats.drafted, stats.accepted);
  EXPECT_LE(stats.drafted - stats.accepted, stats.accepted);
}

}  // namespace

// Wraps a draft model and checks every proposal against the grammar the scheduler lends it: the draft
// model masks its own rows, so what it proposes the grammar allows, and no verify row is wasted on a cut.
class CheckedDraft final : public speculative::DraftSource {
 public:
  CheckedDraft(std::unique_ptr<speculative::DraftSource> inner, int& proposals, int& refused, int& lent)
      : inner_(std::move(inner)), proposals_(proposals), refused_(refused), lent_(lent) {}
  std::string_view kind() const override { return inner_->kind(); }
  void begin(std::span<const int32_t> prompt, const speculative::DraftSettings& settings) override {
    grammar_ = settings.grammar;
    if (grammar_) ++lent_;
    inner_->begin(prompt, settings);
  }
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    inner_->propose(committed, max_depth, out);
    if (out.tokens.empty()) return;
    ++proposals_;
    if (grammar_ == nullptr) return;
    sampling::GrammarMatcher g = *grammar_;
    if (g.accept_prefix(out.tokens) != out.tokens.size()) ++refused_;
  }
  void accept(std::span<const int32_t> committed, int n_accepted) override {
    inner_->accept(committed, n_accepted);
  }

 private:
  std::unique_ptr<speculative::DraftSource> inner_;
  const sampling::GrammarMatcher* grammar_ = nullptr;
  int &proposals_, &refused_, &lent_;
};

TEST(StructuredScheduler, TheDraftModelDraftsUnderTheRequestsGrammar) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  int proposals = 0, refused = 0, lent = 0;
  for (const char* prompt : kPrompts) {
    const Result plain = run(graph, f.model->config(), f.request(prompt, 0.0f), {1, 4, 32, 0});
    const Result spec = run(graph, f.model->config(), f.request(prompt, 0.0f), {1, 4, 32, 6}, [&] {
      return std::make_unique<CheckedDraft>(std::make_unique<speculative::DraftModelSource>(
                                                *f.draft, *f.model, f.pool, model::SessionOptions{}),
                                            proposals, refused, lent);
    });
    EXPECT_EQ(spec.tokens, plain.tokens) << prompt;
  }
  EXPECT_GT(lent, 0);
  EXPECT_GT(proposals, 0);
  EXPECT_EQ(refused, 0) << "of " << proposals << " proposals";
}
