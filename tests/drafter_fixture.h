// What the drafter suites on stories260K share (EAGLE and DFlash alike): the target, a drafter trained on it
// and saved once, the public golden prompts, a greedy generation plain or speculative (and their equality),
// feeding a source the target's taps, and the first token of many sampled speculative generations.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/train/checkpoint.h"
#include "tandem/util/thread_pool.h"
#include "test_util.h"

namespace tandem::speculative::drafter_fixture {

inline constexpr int64_t kTokens = 48;

inline std::string target_path() {
  return testing::shared_path("models/stories260K.gguf");
}

// A file in the temporary directory that no other process running these tests at the same time uses.
inline std::string private_temp_file(const std::string& name) {
  return ::testing::TempDir() + std::to_string(getpid()) + "_" + name;
}

// Records the target's fingerprint in a trained drafter's `info` and saves it, as `tandem train-drafter`
// does, to the private temporary file `checkpoint_name`; returns the file's path.
template <typename TrainResult>
std::string save_trained(TrainResult& result, const std::string& checkpoint_name) {
  result.info.target_file_hash = file_fingerprint(target_path());
  const std::string path = private_temp_file(checkpoint_name);
  std::vector<train::Param*> params = result.source->drafter().params();
  train::save_drafter(path, result.info, params);
  return path;
}

// The target, a pool, a drafter trained on them (its result: `info` and the drafting `source`) and the
// checkpoint it was saved to.
template <typename TrainResult>
struct Trained {
  std::unique_ptr<model::Model> target;
  std::unique_ptr<ThreadPool> pool;
  TrainResult result;
  std::string checkpoint;
};

// Loads the target, trains with train(target, pool) on a pool of `threads` threads, records the target's
// fingerprint and saves the drafter to the private temporary file `checkpoint_name`.
template <typename TrainResult, typename Train>
Trained<TrainResult>* train_and_save(int threads, const std::string& checkpoint_name, Train train) {
  auto* r = new Trained<TrainResult>;
  r->target = model::Model::load(target_path());
  r->pool = std::make_unique<ThreadPool>(threads);
  r->result = train(*r->target, *r->pool);
  r->checkpoint = save_trained(r->result, checkpoint_name);
  return r;
}

inline std::vector<std::vector<int32_t>> golden_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(testing::shared_path("golden/stories260K.public.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      prompts.push_back(nlohmann::json::parse(line).at("prompt_ids").get<std::vector<int32_t>>());
  return prompts;
}

// kTokens of greedy output after `prompt`: plain decoding when source is null, else speculative decoding that
// drafts up to `depth` tokens a round (a tree of up to tree_nodes nodes where that is positive).
inline std::vector<int32_t> run(const model::Model& m, ThreadPool& pool, DraftSource* source,
                                std::span<const int32_t> prompt, int depth,
                                engine::SpecStats* stats = nullptr, int tree_nodes = 0) {
  model::Session s(m, pool, model::SessionOptions{});
  std::vector<int32_t> out;
  const auto keep = [&](int32_t t) { return out.push_back(t), true; };
  if (source == nullptr) {
    engine::GenerateOptions g;
    g.max_tokens = kTokens;
    g.sampling.temperature = 0.0f;
    engine::generate(s, prompt, g, keep, nullptr);
    return out;
  }
  engine::SpecOptions o;
  o.generate.max_tokens = kTokens;
  o.generate.sampling.temperature = 0.0f;
  o.draft_max = depth;
  o.use_gate = false;
  o.tree_nodes = tree_nodes;
  const engine::SpecStats st = engine::generate_speculative(s, *source, prompt, o, keep, nullptr);
  if (stats) *stats = st;
  return out;
}

// Speculative greedy decoding drafted by `source` at every depth 1..8 gives plain greedy decoding's output on
// every public golden prompt, and some draft is accepted.
inline void expect_greedy_equals_plain_at_every_depth(const model::Model& m, ThreadPool& pool,
                                                      DraftSource& source) {
  int64_t accepted = 0;
  for (const auto& prompt : golden_prompts()) {
    const std::vector<int32_t> plain = run(m, pool, nullptr, prompt, 0);
    for (int depth = 1; depth <= 8; ++depth) {
      engine::SpecStats st;
      EXPECT_EQ(run(m, pool, &source, prompt, depth, &st), plain)
          << "depth " << depth << ", prompt of " << prompt.size() << " tokens";
      accepted += st.accepted;
    }
  }
  EXPECT_GT(accepted, 0) << "the trained drafter never had a draft accepted";
}

// A capture function for a target forward that hands `source` the hidden states of the layers it reads, as
// speculative generation does.
inline model::CaptureFn tap_capture(const model::Model& target, DraftSource& source) {
  const std::span<const int64_t> layers = source.target_layers();
  return [&target, &source, layers](int64_t layer, const float* h, int64_t rows) {
    for (int64_t l : layers)
      if (l == layer)
        source.on_target_hidden(layer, {h, static_cast<size_t>(rows * target.config().n_embd)}, rows, 0);
  };
}

// The first token of `runs` sampled speculative generations of `prompt` in session `s` (truncated before
// each), seeded seed_base, seed_base + 1, ...; `options` gives all else.
struct FirstTokens {
  std::map<int32_t, int> counts;
  engine::SpecStats total;
};
inline FirstTokens sample_first_tokens(model::Session& s, DraftSource& source,
                                       std::span<const int32_t> prompt, engine::SpecOptions options,
                                       uint64_t seed_base, int runs) {
  FirstTokens r;
  for (int seed = 0; seed < runs; ++seed) {
    options.generate.sampling.seed = seed_base + static_cast<uint64_t>(seed);
    int32_t first = -1;
    s.truncate(0);
    r.total.add(engine::generate_speculative(
        s, source, prompt, options, [&](int32_t x) { return first = x, false; }, nullptr));
    ++r.counts[first];
  }
  return r;
}

}  // namespace tandem::speculative::drafter_fixture
