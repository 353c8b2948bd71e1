// Plain (non-speculative) generation of one sequence: evaluate the prompt, then sample one token per forward.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "tandem/model/session.h"
#include "tandem/sampling/sampler.h"
#include "tandem/sampling/token_mask.h"

namespace tandem::engine {

struct GenerateOptions {
  int64_t max_tokens = 128;  // tokens to generate at most (the context may end it earlier)
  sampling::Params sampling;
  uint64_t sequence_id = 0;  // keys the sampler's randomness together with the position
  // Constrained output: the grammar's matcher at the output's start (empty: unconstrained). Every token is
  // drawn from its logit row masked by the grammar's state, and generation ends once the grammar is complete
  // and nothing can extend it. A run advances its own copy (which shares the DFA and the mask cache, so
  // runs of one matcher must not overlap in time).
  std::optional<sampling::GrammarMatcher> grammar;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;  // evaluated: the prefix the session held already is not counted
  int64_t generated = 0;
  double prompt_seconds = 0;
  double generate_seconds = 0;
  bool stopped_by_eog = false;
  bool stopped_by_context = false;
  bool stopped_by_grammar = false;  // the grammar was complete and allowed nothing more
  double grammar_seconds = 0;  // generate(): building masks and advancing the grammar (in generate_seconds)
};

// Called with each generated token; return false to stop.
using TokenFn = std::function<bool(int32_t token)>;
using EogFn = std::function<bool(int32_t token)>;

// Generates after `prompt` (non-empty). The session is empty or holds a shorter prefix of `prompt` (the
// caller's contract: e.g. a chat's earlier turns, truncated to where the new prompt departs from them); only
// the rest of the prompt is evaluated. The end-of-generation token, when reached, is passed to on_token and
// ends the run. On return the session holds the prompt and every generated token but the last.
GenerateStats generate(model::Session& session, std::span<const int32_t> prompt,
                       const GenerateOptions& options, const TokenFn& on_token, const EogFn& is_eog);

}  // namespace tandem::engine
