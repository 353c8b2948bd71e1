// Microbenchmarks of constrained sampling on the llama SentencePiece vocabulary (32000 tokens, as
// TinyLlama-1.1B's), with a nested JSON schema (objects, optional properties, arrays, $ref, enum, formats):
//   TrieBuild        the vocabulary's byte trie, built once per vocabulary and shared by every schema
//   FirstMask        a new schema: compile it, start a matcher, compute the first mask
//   FirstMaskInString  the same, then the first mask inside a string (nearly every token allowed)
//   DocumentCold     a whole document token by token (mask, mask applied to the logits, accept) with a new
//                    matcher each time: every grammar state and mask is computed on first use, as for a
//                    new request; us_per_token is the mean per step, max_step_us the slowest step
//   DocumentWarm     the same on a clone of a matcher that has seen the document once: the masks come from
//                    the cache, as for later requests with the same schema
// Run from the build folder: `ninja bench_grammar && bench/bench_grammar` (the shared test data is found
// next to the source tree, as the tests find it).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/sampling/json_schema.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/tokenizer/tokenizer.h"

namespace {

using namespace tandem;
using namespace tandem::sampling;

const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    "address": {"$ref": "#/$defs/address"},
    "role": {"enum": ["admin", "user", "guest"]},
    "score": {"type": "number"},
    "active": {"type": "boolean"},
    "birthday": {"type": "string", "format": "date"},
    "friends": {"type": "array", "items": {"$ref": "#/$defs/friend"}}
  },
  "required": ["name", "age", "address", "role"],
  "$defs": {
    "address": {
      "type": "object",
      "properties": {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "zip": {"type": "string", "minLength": 5, "maxLength": 5},
        "geo": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
      },
      "required": ["street", "city"]
    },
    "friend": {
      "type": "object",
      "properties": {"name": {"type": "string"}, "since": {"type": "string", "format": "date"}},
      "required": ["name"]
    }
  }
})";

const char* kDocument =
    "{\n  \"name\": \"Ada Lovelace\",\n  \"age\": 36,\n  \"email\": \"ada@example.org\",\n  \"tags\": "
    "[\"mathematics\", \"poetry\", \"engines\"],\n  \"address\": {\"street\": \"12 St James's Square\", "
    "\"city\": \"London\", \"zip\": \"SW1Y4\", \"geo\": [51.507, -0.134]},\n  \"role\": \"admin\",\n  "
    "\"score\": 98.5,\n  \"active\": false,\n  \"birthday\": \"1815-12-10\",\n  \"friends\": [{\"name\": "
    "\"Charles Babbage\", \"since\": \"1833-06-05\"}, {\"name\": \"Mary Somerville\"}]\n}";

struct Fixture {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::shared_ptr<const TokenTrie> trie;
  std::vector<int32_t> document;  // kDocument as tokens, longest piece first
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    out.tokenizer = tokenizer::Tokenizer::from_gguf(
        gguf::File::open(std::string(TANDEM_SHARED_DIR) + "/vocab/ggml-vocab-llama-spm.gguf"));
    out.trie = TokenTrie::build(*out.tokenizer);
    std::unordered_map<std::string, int32_t> by_piece;
    for (int32_t id = 0; id < out.trie->n_vocab(); ++id)
      if (!out.trie->is_eog(id) && !out.trie->piece(id).empty()) by_piece.emplace(out.trie->piece(id), id);
    const std::string text = kDocument;
    for (size_t pos = 0; pos < text.size();) {
      for (size_t len = std::min<size_t>(static_cast<size_t>(out.trie->max_depth()), text.size() - pos);;
           --len) {
        auto it = by_piece.find(text.substr(pos, len));
        if (it != by_piece.end()) {
          out.document.push_back(it->second);
          pos += len;
          break;
        }
      }
    }
    return out;
  }();
  return f;
}

void TrieBuild(benchmark::State& state) {
  const Fixture& f = fixture();
  for (auto _ : state) benchmark::DoNotOptimize(TokenTrie::build(*f.tokenizer));
}
BENCHMARK(TrieBuild)->Unit(benchmark::kMillisecond);

void FirstMask(benchmark::State& state) {
  const Fixture& f = fixture();
  TokenMask mask;
  for (auto _ : state) {
    auto grammar = std::make_shared<const Grammar>(grammar_from_json_schema(kSchema));
    GrammarMatcher matcher(grammar, f.trie);
    matcher.fill_mask(mask);
    benchmark::DoNotOptimize(mask.words().data());
  }
}
BENCHMARK(FirstMask)->Unit(benchmark::kMillisecond);

// A new schema's first mask inside a string, where nearly every token is allowed: the whole trie is walked
// and the grammar states along it are built.
void FirstMaskInString(benchmark::State& state) {
  const Fixture& f = fixture();
  TokenMask mask;
  for (auto _ : state) {
    auto grammar = std::make_shared<const Grammar>(grammar_from_json_schema(kSchema));
    GrammarMatcher matcher(grammar, f.trie);
    if (!matcher.accept_text("{\"name\": \"")) std::abort();
    matcher.fill_mask(mask);
    benchmark::DoNotOptimize(mask.words().data());
  }
  state.counters["allowed"] = mask.count();
}
BENCHMARK(FirstMaskInString)->Unit(benchmark::kMillisecond);

struct Steps {
  double total_us = 0;
  double slowest_us = 0;
};

// Runs the document through `matcher`, timing each step.
void run_document(GrammarMatcher& matcher, const std::vector<int32_t>& tokens, TokenMask& mask,
                  std::vector<float>& logits, Steps& steps) {
  for (int32_t id : tokens) {
    const auto start = std::chrono::steady_clock::now();
    matcher.fill_mask(mask);
    apply_token_mask(logits, mask);
    if (!matcher.accept_token(id)) std::abort();
    const std::chrono::duration<double, std::micro> step = std::chrono::steady_clock::now() - start;
    steps.total_us += step.count();
    steps.slowest_us = std::max(steps.slowest_us, step.count());
  }
}

void Document(benchmark::State& state, bool warm) {
  const Fixture& f = fixture();
  auto grammar = std::make_shared<const Grammar>(grammar_from_json_schema(kSchema));
  GrammarMatcher warmed(grammar, f.trie);
  TokenMask mask;
  std::vector<float> logits(static_cast<size_t>(f.trie->n_vocab()), 0.0f);
  Steps steps;
  if (warm) run_document(warmed, f.document, mask, logits, steps);
  steps = {};
  for (auto _ : state) {
    GrammarMatcher matcher = warm ? warmed.clone() : GrammarMatcher(grammar, f.trie);
    if (warm) matcher.rollback_to(0);
    run_document(matcher, f.document, mask, logits, steps);
  }
  state.counters["tokens"] = static_cast<double>(f.document.size());
  state.counters["us_per_token"] =
      steps.total_us / (static_cast<double>(state.iterations()) * static_cast<double>(f.document.size()));
  state.counters["max_step_us"] = steps.slowest_us;
}
void DocumentCold(benchmark::State& state) {
  Document(state, false);
}
void DocumentWarm(benchmark::State& state) {
  Document(state, true);
}
BENCHMARK(DocumentCold)->Unit(benchmark::kMillisecond);
BENCHMARK(DocumentWarm)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
