#include "tandem/engine/generate.h"

#include <chrono>

#include "tandem/util/error.h"

namespace tandem::engine {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

GenerateStats generate(model::Session& session, std::span<const int32_t> prompt,
                       const GenerateOptions& options, const TokenFn& on_token, const EogFn& is_eog) {
  if (prompt.empty()) throw Error("the prompt is empty: nothing to continue");
  GenerateStats stats;
  sampling::Sampler sampler(options.sampling);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  history.reserve(history.size() + static_cast<size_t>(std::max<int64_t>(0, options.max_tokens)));

  auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits = session.eval(prompt);
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());
  stats.prompt_seconds = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  while (stats.generated < options.max_tokens) {
    const auto pos = static_cast<uint64_t>(session.length());
    const int32_t token = sampler.sample(logits, history, options.sequence_id, pos);
    history.push_back(token);
    ++stats.generated;
    const bool keep_going = on_token(token);
    if (is_eog && is_eog(token)) {
      stats.stopped_by_eog = true;
      break;
    }
    if (!keep_going || stats.generated >= options.max_tokens) break;
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
