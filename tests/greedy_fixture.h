// What suites that check speculative or windowed decoding against plain decoding share: random prompts and
// plain greedy decoding of a model through a session.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/util/thread_pool.h"

namespace tandem::greedy_fixture {

// n token ids drawn uniformly from [3, vocab): past the usual special tokens.
inline std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// The first n tokens plain greedy decoding of m generates after `prompt`, in a fresh session.
inline std::vector<int32_t> plain_greedy(const model::Model& m, ThreadPool& pool,
                                         const model::SessionOptions& options,
                                         std::span<const int32_t> prompt, int64_t n) {
  model::Session s(m, pool, options);
  engine::GenerateOptions g;
  g.max_tokens = n;
  g.sampling.temperature = 0.0f;
  std::vector<int32_t> out;
  engine::generate(
      s, prompt, g, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
  return out;
}

// The first n tokens greedy speculative decoding generates after `prompt` in session s, drafting `depth`
// tokens a round with `source` (no gate); its counts are added to `total`.
inline std::vector<int32_t> speculative_greedy(model::Session& s, speculative::DraftSource& source,
                                               std::span<const int32_t> prompt, int64_t n, int depth,
                                               engine::SpecStats& total) {
  engine::SpecOptions o;
  o.generate.max_tokens = n;
  o.generate.sampling.temperature = 0.0f;
  o.draft_max = depth;
  o.use_gate = false;
  std::vector<int32_t> out;
  total.add(engine::generate_speculative(
      s, source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr));
  return out;
}

}  // namespace tandem::greedy_fixture
