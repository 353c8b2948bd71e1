#include "tandem/engine/generate.h"

#include <chrono>
#include <limits>

#include "tandem/util/error.h"

namespace tandem::engine {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The row with every token the grammar refuses next at -inf, in `masked`.
std::span<const float> mask_logits(std::span<const float> logits, sampling::GrammarMatcher& grammar,
                                   sampling::TokenMask& mask, std::vector<float>& masked) {
  grammar.fill_mask(mask);
  masked.assign(logits.begin(), logits.end());
  if (static_cast<size_t>(mask.n_vocab()) == masked.size()) {
    sampling::apply_token_mask(masked, mask);
  } else {
    // Output rows past the tokenizer's vocabulary (padding) have no text, so no grammar allows them.
    for (size_t id = 0; id < masked.size(); ++id)
      if (id >= static_cast<size_t>(mask.n_vocab()) || !mask.test(static_cast<int32_t>(id)))
        masked[id] = -std::numeric_limits<float>::infinity();
  }
  return masked;
}

}  // namespace

GenerateStats generate(model::Session& session, std::span<const int32_t> prompt,
                       const GenerateOptions& options, const TokenFn& on_token, const EogFn& is_eog) {
  if (prompt.empty()) throw Error("the prompt is empty: nothing to continue");
  const auto cached = static_cast<size_t>(session.length());
  if (cached >= prompt.size())
    throw Error("the session already holds " + std::to_string(cached) +
                " tokens; generation needs a prompt longer than what is cached");
  GenerateStats stats;
  sampling::Sampler sampler(options.sampling);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  history.reserve(history.size() + static_cast<size_t>(std::max<int64_t>(0, options.max_tokens)));

  auto t0 = std::chrono::steady_clock::now();
  std::optional<sampling::GrammarMatcher> grammar = options.grammar;
  sampling::TokenMask mask;
  std::vector<float> masked;
  std::span<const float> logits = session.eval(prompt.subspan(cached));
  stats.prompt_tokens = static_cast<int64_t>(prompt.size() - cached);
  stats.prompt_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  while (stats.generated < options.max_tokens) {
    const auto pos = static_cast<uint64_t>(session.length());
    const auto mask_start = std::chrono::steady_clock::now();
    if (grammar) logits = mask_logits(logits, *grammar, mask, masked);
    const int32_t token = sampler.sample(logits, history, options.sequence_id, pos);
    if (grammar) {
      if (!grammar->accept_token(token))
        throw Error("internal: token " + std::to_string(token) + " was sampled against the output's grammar");
      // The sampler's own work is counted too: it is small beside the mask, and timing it apart costs a
      // clock read per token.
      stats.grammar_seconds += seconds_since(mask_start);
    }
    history.push_back(token);
    ++stats.generated;
    const bool keep_going = on_token(token);
    if (is_eog && is_eog(token)) {
      stats.stopped_by_eog = true;
      break;
    }
    if (!keep_going || stats.generated >= options.max_tokens) break;
    if (grammar && (grammar->terminated() || grammar->must_end())) {
      stats.stopped_by_grammar = true;
      break;
    }
    if (session.length() >= session.n_ctx()) {
      stats.stopped_by_context = true;
      break;
    }
    logits = session.eval(std::span<const int32_t>(&history.back(), 1));
  }
  stats.generate_seconds = seconds_since(t0);
  return stats;
}

}  // namespace tandem::engine
