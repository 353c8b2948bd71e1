// A recurrent model in the server's scheduler (the path `tandem serve` takes): speculative verify windows
// over several sequences batched together keep plain greedy output, and a prompt sharing a long prefix with a
// finished one resumes from the recurrent state's snapshot, with the output of a fresh evaluation.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tandem/engine/cache_pool.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/graph.h"
#include "test_util.h"

namespace tandem {
namespace {

using engine::Event;
using engine::Scheduler;

constexpr int64_t kCtx = 512;

struct Fixture {
  Fixture()
      : model(model::Model::load(testing::shared_path("models/synth/synth-mamba-d128-Q8_0.gguf"))), pool(2) {}
  std::unique_ptr<model::Model> model;
  ThreadPool pool;
};

struct Result {
  std::vector<int32_t> tokens;
  engine::Usage usage;
};

Result collect(engine::Stream& s) {
  Result r;
  Event ev;
  for (;;) {
    if (!s.next(ev, std::chrono::milliseconds(60000))) {
      ADD_FAILURE() << "no event within a minute";
      return r;
    }
    if (ev.kind == Event::Kind::kToken) {
      r.tokens.push_back(ev.token.id);
      continue;
    }
    EXPECT_EQ(ev.finish, engine::Finish::kLength);
    r.usage = ev.usage;
    return r;
  }
}

engine::Request request(std::vector<int32_t> prompt, int64_t max_tokens) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.stop_at_eog = false;
  return r;
}

std::shared_ptr<engine::Stream> submit(Scheduler& s, engine::Request r) {
  Scheduler::Admit a{};
  std::string why;
  auto st = s.submit(std::move(r), a, &why);
  EXPECT_EQ(a, Scheduler::Admit::kOk) << why;
  return st;
}

std::vector<int32_t> tokens(int64_t n, int32_t salt, int32_t vocab) {
  std::vector<int32_t> t = {1};
  for (int64_t j = 1; j < n; ++j) t.push_back(3 + static_cast<int32_t>((j * 37 + salt * 11) % (vocab - 3)));
  return t;
}

// Proposes the known continuation, corrupting every third draft, so windows are partly rejected.
class OracleDraft final : public speculative::DraftSource {
 public:
  OracleDraft(std::vector<int32_t> full, int32_t vocab) : full_(std::move(full)), vocab_(vocab) {}
  std::string_view kind() const override { return "oracle"; }
  void begin(std::span<const int32_t>, const speculative::DraftSettings&) override {}
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    out.clear();
    for (int i = 0; i < max_depth; ++i) {
      const size_t at = committed.size() + static_cast<size_t>(i);
      if (at >= full_.size()) break;
      out.tokens.push_back(at % 3 == 0 ? (full_[at] + 1) % vocab_ : full_[at]);
    }
  }
  void accept(std::span<const int32_t>, int) override {}

 private:
  std::vector<int32_t> full_;
  int32_t vocab_;
};

TEST(MambaServe, VerifyWindowsKeepGreedyOutput) {
  Fixture f;
  const auto V = static_cast<int32_t>(f.model->config().n_vocab);
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const auto req = request(tokens(7, 1, V), 30);
  Result plain;
  {
    // As `serve` without speculation: the plain reference's cache keeps no rollback.
    engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 1, /*rollback=*/false);
    Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
    plain = collect(*submit(s, req));
  }
  std::vector<int32_t> full = req.prompt;
  full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
  engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 3);
  Scheduler s(graph, caches, nullptr, {3, 4, 32, 6}, [&] { return std::make_unique<OracleDraft>(full, V); });
  std::vector<std::shared_ptr<engine::Stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(submit(s, req));
  for (auto& st : streams) EXPECT_EQ(collect(*st).tokens, plain.tokens);
  const auto stats = s.stats();
  EXPECT_GT(stats.accepted, 0u);
  EXPECT_LT(stats.accepted, stats.drafted);
}

// Several sequences decoding together in caches set up without rollback (a server that does not speculate)
// give the tokens of caches with rollback, and a later prompt sharing a long prefix resumes at a snapshot.
TEST(MambaServe, PlainServingWithoutRollbackGivesTheSameTokens) {
  Fixture f;
  const auto V = static_cast<int32_t>(f.model->config().n_vocab);
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  std::vector<engine::Request> reqs;
  for (int32_t i = 0; i < 3; ++i) reqs.push_back(request(tokens(9 + 4 * i, 5 + i, V), 30));
  std::vector<std::vector<int32_t>> out[2];
  for (const bool rollback : {true, false}) {
    engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 3, rollback);
    Scheduler s(graph, caches, nullptr, {3, 4, 32, 0});
    std::vector<std::shared_ptr<engine::Stream>> streams;
    for (const auto& r : reqs) streams.push_back(submit(s, r));
    for (auto& st : streams) out[rollback ? 1 : 0].push_back(collect(*st).tokens);
  }
  EXPECT_EQ(out[0], out[1]);

  engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 1, /*rollback=*/false);
  Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
  collect(*submit(s, request(tokens(300, 2, V), 4)));
  std::vector<int32_t> second = tokens(299, 2, V);
  second.push_back(7);
  const Result resumed = collect(*submit(s, request(second, 8)));
  EXPECT_EQ(resumed.usage.cached_tokens, 256);  // a rollback from 303 to 299 is out of reach: the snapshot
}

TEST(MambaServe, LongSharedPrefixResumesFromASnapshot) {
  Fixture f;
  const auto V = static_cast<int32_t>(f.model->config().n_vocab);
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  std::vector<int32_t> second = tokens(280, 2, V);
  const auto tail = tokens(12, 3, V);
  second.insert(second.end(), tail.begin() + 1, tail.end());
  Result fresh;
  {
    engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 1);
    Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
    fresh = collect(*submit(s, request(second, 8)));
  }
  engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 1);
  Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
  collect(*submit(s, request(tokens(300, 2, V), 4)));  // shares 280 tokens with `second`
  const Result resumed = collect(*submit(s, request(second, 8)));
  EXPECT_EQ(resumed.usage.cached_tokens, 256);  // the snapshot: 280 is beyond a rollback from 304
  EXPECT_EQ(resumed.tokens, fresh.tokens);
}

}  // namespace
}  // namespace tandem
