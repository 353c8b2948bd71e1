// Constrained output in the single-sequence paths (engine::generate, engine::generate_speculative and the
// `run --json-schema` / `--grammar` flags built on them), and the cached prefix `tandem chat` relies on:
//   - constrained greedy with an n-gram drafter and with a draft model equals constrained plain, token for
//     token, and the output parses and holds the schema's required properties;
//   - sampled constrained speculation follows constrained plain sampling's distribution (two-sample
//     chi-square over short sequences, false-alarm rate 1e-4, as tests/test_speculative_sampling.cpp);
//   - a session that holds a prefix of the prompt generates what a fresh one does, evaluating only the rest;
//   - the CLI flags: plain == n-gram speculation, and clear errors for bad flags and schemas.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/sampling/json_schema.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem {
namespace {

constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "address": {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "integer"}},
                "required": ["city", "zip"]},
    "tags": {"type": "array", "items": {"enum": ["cat", "dog", "bird"]}, "maxItems": 3}
  },
  "required": ["name", "age", "address", "tags"]
})";

// Upper 1e-4 quantile of chi-square with k degrees of freedom (Wilson-Hilferty approximation).
double chi2_critical_1e4(int k) {
  const double z = 3.7190;
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

class Constrained : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_ = model::Model::load(testing::shared_path("models/stories260K.gguf")).release();
    draft_ = model::Model::load(testing::shared_path("models/llama2xs-tok512.gguf")).release();
    tok_ = tokenizer::Tokenizer::from_gguf(target_->file()).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete draft_;
    delete target_;
  }

  static sampling::GrammarMatcher matcher() {
    return sampling::GrammarMatcher(
        std::make_shared<const sampling::Grammar>(sampling::grammar_from_json_schema(kSchema)),
        sampling::TokenTrie::build(*tok_));
  }
  static std::vector<int32_t> encode(const std::string& text) { return tok_->encode(text, true, false); }
  static std::string text(const std::vector<int32_t>& ids) {
    const auto trie = sampling::TokenTrie::build(*tok_);
    std::string s;
    for (int32_t id : ids) s += trie->piece(id);
    return s;
  }
  static bool is_eog(int32_t id) { return tok_->is_eog(id); }

  static model::Model* target_;
  static model::Model* draft_;
  static tokenizer::Tokenizer* tok_;
};
model::Model* Constrained::target_ = nullptr;
model::Model* Constrained::draft_ = nullptr;
tokenizer::Tokenizer* Constrained::tok_ = nullptr;

TEST_F(Constrained, SpeculativeGreedyEqualsPlainGreedy) {
  ThreadPool pool(1);
  model::Session session(*target_, pool, {});
  speculative::DraftModelSource model_source(*draft_, *target_, pool, {});
  speculative::NgramSource ngram({1, 4});
  for (const std::string prompt : {"Once upon a time", "The little dog", "Lily wanted to"}) {
    SCOPED_TRACE(prompt);
    const std::vector<int32_t> ids = encode(prompt);
    engine::GenerateOptions go;
    go.max_tokens = 200;
    go.sampling.temperature = 0;
    go.grammar = matcher();
    std::vector<int32_t> plain;
    session.truncate(0);
    const engine::GenerateStats ps = engine::generate(
        session, ids, go, [&](int32_t t) { return plain.push_back(t), true; }, is_eog);
    ASSERT_TRUE(ps.stopped_by_grammar || ps.stopped_by_eog) << text(plain);
    const auto json = nlohmann::json::parse(text(plain));
    for (const char* key : {"name", "age", "address", "tags"}) EXPECT_TRUE(json.contains(key)) << key;
    EXPECT_TRUE(json["address"].contains("zip"));

    int64_t drafted = 0;
    for (speculative::DraftSource* source : {static_cast<speculative::DraftSource*>(&model_source),
                                             static_cast<speculative::DraftSource*>(&ngram)}) {
      engine::SpecOptions so;
      so.generate = go;
      so.draft_max = 6;
      so.use_gate = false;
      std::vector<int32_t> spec;
      session.truncate(0);
      const engine::SpecStats ss = engine::generate_speculative(
          session, *source, ids, so, [&](int32_t t) { return spec.push_back(t), true; }, is_eog);
      EXPECT_EQ(spec, plain) << source->kind() << ": " << text(spec) << " vs " << text(plain);
      EXPECT_EQ(ss.stopped_by_grammar, ps.stopped_by_grammar) << source->kind();
      drafted += ss.drafted;
    }
    EXPECT_GT(drafted, 0) << "the drafters proposed nothing the grammar allowed";
  }
}

// The issue's target: speculation under a grammar keeps >= 0.9x the tokens per target forward of
// unconstrained speculation on the same prompts. A draft model that drafts free text sees most of its drafts
// cut at the grammar (1.18 against 2.77 tokens per forward here); one that drafts under the grammar keeps
// its rate.
TEST_F(Constrained, DraftModelKeepsItsRateUnderTheGrammar) {
  ThreadPool pool(1);
  model::Session session(*target_, pool, {});
  speculative::DraftModelSource source(*draft_, *target_, pool, {});
  engine::SpecStats free_total, constrained_total;
  for (const std::string prompt :
       {"Once upon a time", "The little dog", "Lily wanted to", "Tom and Sam went", "One day, a bird"}) {
    for (bool constrained : {false, true}) {
      engine::SpecOptions so;
      so.generate.max_tokens = 150;
      so.generate.sampling.temperature = 0;
      if (constrained) so.generate.grammar = matcher();
      so.draft_max = 4;
      so.use_gate = false;
      session.truncate(0);
      const engine::SpecStats st = engine::generate_speculative(
          session, source, encode(prompt), so, [](int32_t) { return true; }, is_eog);
      (constrained ? constrained_total : free_total).add(st);
    }
  }
  EXPECT_GE(constrained_total.tokens_per_forward(), 0.9 * free_total.tokens_per_forward())
      << constrained_total.tokens_per_forward() << " under the grammar, " << free_total.tokens_per_forward()
      << " without";
}

// Two-sample chi-square between constrained plain sampling and constrained speculative sampling over the
// first three tokens of the output, begun inside an enum's string whose allowed continuations differ from
// what the model and the n-gram drafter prefer (" went to the park"), so the mask moves much of the target's
// mass and drafts are accepted, rejected and cut.
TEST_F(Constrained, SampledSpeculationKeepsTheConstrainedDistribution) {
  constexpr int kRuns = 1200;
  constexpr size_t kLength = 3;
  ThreadPool pool(1);
  model::Session session(*target_, pool, {});
  speculative::DraftModelSource model_source(*draft_, *target_, pool, {});
  speculative::NgramSource ngram({1, 4});
  const std::vector<int32_t> prompt = encode("Lily and Tom went to the park. Lily and Tom");
  sampling::GrammarMatcher start(
      std::make_shared<const sampling::Grammar>(sampling::grammar_from_json_schema(
          R"({"enum": ["Lily and Tom went to the zoo.", "Lily and Tom went home.", "Lily and Tom ran to the park.",
                       "Lily and Tom were sad.", "Lily and Tom played with a ball.", "Lily and Tom saw a dog."]})")),
      sampling::TokenTrie::build(*tok_));
  ASSERT_TRUE(start.accept_text(R"("Lily and Tom)"));
  sampling::Params params;
  params.temperature = 1.5f;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;

  engine::GenerateOptions go;
  go.max_tokens = kLength;
  go.sampling = params;
  go.grammar = start;
  std::map<std::vector<int32_t>, int> plain;
  for (int seed = 0; seed < kRuns; ++seed) {
    go.sampling.seed = 50000 + static_cast<uint64_t>(seed);
    std::vector<int32_t> out;
    session.truncate(0);
    engine::generate(
        session, prompt, go, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
    ++plain[out];
  }
  for (speculative::DraftSource* source : {static_cast<speculative::DraftSource*>(&model_source),
                                           static_cast<speculative::DraftSource*>(&ngram)}) {
    SCOPED_TRACE(std::string(source->kind()));
    std::map<std::vector<int32_t>, int> spec;
    engine::SpecStats total;
    engine::SpecOptions so;
    so.generate = go;
    so.draft_max = 4;
    so.use_gate = false;
    for (int seed = 0; seed < kRuns; ++seed) {
      so.generate.sampling.seed = 90000 + static_cast<uint64_t>(seed);
      std::vector<int32_t> out;
      session.truncate(0);
      total.add(engine::generate_speculative(
          session, *source, prompt, so, [&](int32_t t) { return out.push_back(t), true; }, nullptr));
      ++spec[out];
    }
    EXPECT_GT(total.accepted, 0);
    EXPECT_LT(total.accepted, total.drafted);
    double chi2 = 0;
    int bins = 0, pooled_a = 0, pooled_b = 0;
    std::map<std::vector<int32_t>, std::pair<int, int>> both;
    for (const auto& [seq, n] : plain) both[seq].first = n;
    for (const auto& [seq, n] : spec) both[seq].second = n;
    for (const auto& [seq, ab] : both) {
      if (ab.first + ab.second < 10) {
        pooled_a += ab.first, pooled_b += ab.second;
        continue;
      }
      chi2 += std::pow(ab.first - ab.second, 2) / (ab.first + ab.second);
      ++bins;
    }
    if (pooled_a + pooled_b > 0) {
      chi2 += std::pow(pooled_a - pooled_b, 2) / (pooled_a + pooled_b);
      ++bins;
    }
    ASSERT_GT(bins, 3);
    EXPECT_LT(chi2, chi2_critical_1e4(bins - 1));
  }
}

// A chat's second turn: the session holds the first turn (prompt and reply but the last token), truncated
// to where the new prompt departs from it; generation evaluates only the rest and equals a fresh run.
TEST_F(Constrained, CachedPrefixIsReusedNotRecomputed) {
  ThreadPool pool(1);
  model::Session fresh(*target_, pool, {});
  model::Session reused(*target_, pool, {});
  speculative::NgramSource ngram({1, 4});
  engine::GenerateOptions go;
  go.max_tokens = 24;
  go.sampling.temperature = 0;
  const std::vector<int32_t> first = encode("Once upon a time");
  std::vector<int32_t> turn = first;
  engine::generate(
      reused, first, go, [&](int32_t t) { return turn.push_back(t), true; }, is_eog);
  ASSERT_EQ(reused.length(), static_cast<int64_t>(turn.size()) - 1);
  const std::vector<int32_t> more = encode(" Then the dog ran home.");
  std::vector<int32_t> second = turn;
  second.insert(second.end(), more.begin() + 1, more.end());  // without its BOS

  for (bool speculate : {false, true}) {
    SCOPED_TRACE(speculate ? "speculative" : "plain");
    std::vector<int32_t> want, got;
    auto collect = [](std::vector<int32_t>& out) {
      return [&out](int32_t t) { return out.push_back(t), true; };
    };
    const int64_t held = reused.length();
    fresh.truncate(0);
    engine::GenerateStats a, b;
    if (speculate) {
      engine::SpecOptions so;
      so.generate = go;
      so.use_gate = false;
      a = engine::generate_speculative(fresh, ngram, second, so, collect(want), is_eog);
      b = engine::generate_speculative(reused, ngram, second, so, collect(got), is_eog);
    } else {
      a = engine::generate(fresh, second, go, collect(want), is_eog);
      b = engine::generate(reused, second, go, collect(got), is_eog);
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(a.prompt_tokens, static_cast<int64_t>(second.size()));
    EXPECT_EQ(b.prompt_tokens, static_cast<int64_t>(second.size()) - held);
    reused.truncate(held);
  }
  // A prompt the session already holds whole leaves nothing to evaluate: refused, not undefined.
  EXPECT_THROW(engine::generate(
                   reused, std::span<const int32_t>(turn).first(2), go, [](int32_t) { return true; }, is_eog),
               Error);
}

std::string run_tandem(const std::string& args) {
  return testing::run_command(std::string(TANDEM_BINARY) + " run -t 1 -m " +
                              testing::shared_path("models/stories260K.gguf") + " " + args + " 2>&1")
      .first;
}

TEST(ConstrainedRunCommand, SpeculativeEqualsPlainAndBadFlagsAreExplained) {
  testing::TempDir dir("constrained_run");
  const std::string schema = dir.file("schema.json");
  std::ofstream(schema) << kSchema;
  const auto plain = testing::run_command(std::string(TANDEM_BINARY) + " run -t 1 -m " +
                                          testing::shared_path("models/stories260K.gguf") +
                                          " --temp 0 -n 200 --json-schema " + schema + " 2>/dev/null");
  ASSERT_EQ(plain.second, 0);
  const auto json = nlohmann::json::parse(plain.first);
  EXPECT_TRUE(json.contains("address"));
  const auto spec = testing::run_command(
      std::string(TANDEM_BINARY) + " run -t 1 -m " + testing::shared_path("models/stories260K.gguf") +
      " --temp 0 -n 200 --draft ngram --json-schema " + schema + " 2>/dev/null");
  EXPECT_EQ(spec.first, plain.first);
  // stories260K never closes a free-form object within a few hundred tokens: check the start.
  const auto any = testing::run_command(std::string(TANDEM_BINARY) + " run -t 1 -m " +
                                        testing::shared_path("models/stories260K.gguf") +
                                        " --temp 0 -n 40 --grammar json 2>/dev/null");
  EXPECT_EQ(any.first.substr(0, 3), "{ \"") << any.first;

  std::ofstream(dir.file("bad.json")) << R"({"type": "object", "properties": {"a": {"type": "strnig"}}})";
  EXPECT_NE(run_tandem("--json-schema " + dir.file("bad.json")).find("#/properties/a/type"),
            std::string::npos);
  EXPECT_NE(run_tandem("--grammar yaml").find("unknown --grammar 'yaml'"), std::string::npos);
  EXPECT_NE(run_tandem("--grammar json --json-schema " + schema).find("not both"), std::string::npos);
  EXPECT_NE(run_tandem("--json-schema " + dir.file("missing.json")).find("missing.json"), std::string::npos);
}

}  // namespace
}  // namespace tandem
