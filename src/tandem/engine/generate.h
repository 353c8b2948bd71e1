// Plain (non-speculative) generation of one sequence: evaluate the prompt, then sample one token per forward.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tandem/model/session.h"
#include "tandem/sampling/sampler.h"

namespace tandem::engine {

struct GenerateOptions {
  int64_t max_tokens = 128;  // tokens to generate at most (the context may end it earlier)
  sampling::Params sampling;
  uint64_t sequence_id = 0;  // keys the sampler's randomness together with the position
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated = 0;
  double prompt_seconds = 0;
  double generate_seconds = 0;
  bool stopped_by_eog = false;
  bool stopped_by_context = false;
};

// Called with each generated token; return false to stop.
using TokenFn = std::function<bool(int32_t token)>;
using EogFn = std::function<bool(int32_t token)>;

// Generates after `prompt` (non-empty) on an empty session. The end-of-generation token, when reached, is
// passed to on_token and ends the run.
GenerateStats generate(model::Session& session, std::span<const int32_t> prompt,
                       const GenerateOptions& options, const TokenFn& on_token, const EogFn& is_eog);

}  // namespace tandem::engine
