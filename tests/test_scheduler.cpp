// The continuous-batching scheduler: many sequences batched together produce exactly what each produces
// alone (and what the plain generate loop produces), cancellation frees caches, the queue is bounded,
// prefixes are reused, and verify windows keep the output unchanged.
#include <gtest/gtest.h>

#include <chrono>

#include "tandem/engine/cache_pool.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/graph.h"
#include "test_util.h"

namespace {

using namespace tandem;
using engine::Event;
using engine::Finish;
using engine::Scheduler;

constexpr int64_t kCtx = 256;

// Counts leases so tests can tell whether caches came back.
class CountingPool final : public engine::CachePool {
 public:
  CountingPool(const model::Config& c, int slots) : inner_(c, kCtx, cache::KvType::kF16, slots) {}
  int64_t capacity() const override { return inner_.capacity(); }
  Lease acquire(std::span<const int32_t> prompt) override {
    ++out;
    return inner_.acquire(prompt);
  }
  void release(std::unique_ptr<cache::KvCache> c, std::span<const int32_t> tokens) override {
    --out;
    inner_.release(std::move(c), tokens);
  }
  int64_t reusable(std::span<const int32_t> prompt) const override { return inner_.reusable(prompt); }
  std::atomic<int> out{0};

 private:
  engine::SlotCachePool inner_;
};

struct Fixture {
  Fixture() : model(model::Model::load(tandem::testing::shared_path("models/stories260K.gguf"))), pool(2) {}
  std::unique_ptr<model::Model> model;
  ThreadPool pool;
};

struct Result {
  std::vector<int32_t> tokens;
  Finish finish = Finish::kError;
  engine::Usage usage;
};

Result collect(engine::Stream& s, std::chrono::milliseconds patience = std::chrono::milliseconds(20000)) {
  Result r;
  Event ev;
  for (;;) {
    if (!s.next(ev, patience)) {
      ADD_FAILURE() << "no event within " << patience.count() << " ms";
      return r;
    }
    if (ev.kind == Event::Kind::kToken) {
      r.tokens.push_back(ev.token.id);
      continue;
    }
    r.finish = ev.finish;
    r.usage = ev.usage;
    return r;
  }
}

engine::Request request(std::vector<int32_t> prompt, int64_t max_tokens, float temperature, uint64_t seed) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.stop_at_eog = false;  // fixed lengths make the comparison stronger
  return r;
}

std::shared_ptr<engine::Stream> submit(Scheduler& s, engine::Request r) {
  Scheduler::Admit a{};
  std::string why;
  auto st = s.submit(std::move(r), a, &why);
  EXPECT_EQ(a, Scheduler::Admit::kOk) << why;
  return st;
}

std::vector<engine::Request> workload() {
  std::vector<engine::Request> rs;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> prompt = {1};
    // Lengths 3..70: several prompts need more than one chunk of the 32-row budget.
    for (int j = 0; j < 3 + i * 7; ++j) prompt.push_back(static_cast<int32_t>(260 + (i * 31 + j * 17) % 240));
    rs.push_back(request(prompt, 12 + i, i % 3 == 0 ? 0.0f : 0.9f, 100 + static_cast<uint64_t>(i)));
  }
  return rs;
}

TEST(Scheduler, BatchedEqualsAloneAndPlainLoop) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const auto reqs = workload();
  std::vector<Result> alone;
  {
    CountingPool caches(f.model->config(), 1);
    engine::SchedulerOptions o;
    o.max_running = 1;
    o.max_rows = 32;
    Scheduler s(graph, caches, nullptr, o);
    for (const auto& r : reqs) alone.push_back(collect(*submit(s, r)));
  }
  // The reference loop on a plain session agrees token for token.
  for (size_t i = 0; i < reqs.size(); ++i) {
    model::Session session(*f.model, f.pool, {kCtx, cache::KvType::kF16, 32});
    engine::GenerateOptions go;
    go.max_tokens = reqs[i].max_tokens;
    go.sampling = reqs[i].sampling;
    std::vector<int32_t> got;
    engine::generate(
        session, reqs[i].prompt, go, [&](int32_t t) { return got.push_back(t), true; }, nullptr);
    EXPECT_EQ(got, alone[i].tokens) << "request " << i << " differs from engine::generate";
  }
  CountingPool caches(f.model->config(), 4);
  engine::SchedulerOptions o;
  o.max_running = 4;
  o.max_rows = 32;
  Scheduler s(graph, caches, nullptr, o);
  std::vector<std::shared_ptr<engine::Stream>> streams;
  for (const auto& r : reqs) streams.push_back(submit(s, r));
  for (size_t i = 0; i < reqs.size(); ++i) {
    Result r = collect(*streams[i]);
    EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i << " changed when batched";
    EXPECT_EQ(r.finish, Finish::kLength);
    EXPECT_EQ(r.usage.completion_tokens, reqs[i].max_tokens);
    EXPECT_EQ(r.usage.prompt_tokens, static_cast<int64_t>(reqs[i].prompt.size()));
  }
  EXPECT_EQ(caches.out.load(), 0);
  const auto st = s.stats();
  EXPECT_GT(st.forwards, 0u);
  EXPECT_LE(st.rows, st.forwards * 32);
  EXPECT_EQ(st.finished[static_cast<int>(Finish::kLength)], reqs.size());
}

TEST(Scheduler, CancelFreesTheCacheWithinAnIteration) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  CountingPool caches(f.model->config(), 2);
  engine::SchedulerOptions o;
  o.max_running = 2;
  o.max_rows = 32;
  Scheduler s(graph, caches, nullptr, o);
  auto long_one = submit(s, request({1, 300, 301}, 200, 0.0f, 1));
  auto other = submit(s, request({1, 400, 401}, 30, 0.0f, 2));
  Event ev;
  ASSERT_TRUE(long_one->next(ev, std::chrono::milliseconds(20000)));
  long_one->cancel();
  Result r = collect(*long_one);
  EXPECT_EQ(r.finish, Finish::kCancelled);
  EXPECT_LT(r.usage.completion_tokens, 200);
  // The other stream is unaffected.
  EXPECT_EQ(collect(*other).tokens.size(), 30u);
  EXPECT_EQ(caches.out.load(), 0);
  EXPECT_TRUE(s.idle());
}

// More requests than running slots, all submitted at once: the ones still waiting when every running sequence
// has finished must be started without a new submission to wake the loop. Equal lengths make the sequences
// admitted together finish in the same iteration, which leaves none running.
TEST(Scheduler, QueuedRequestsStartWhenTheRunningOnesFinish) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  for (int slots : {1, 3}) {
    CountingPool caches(f.model->config(), slots);
    engine::SchedulerOptions o;
    o.max_running = slots;
    o.max_waiting = 16;
    o.max_rows = 32;
    Scheduler s(graph, caches, nullptr, o);
    std::vector<std::shared_ptr<engine::Stream>> streams;
    for (int i = 0; i < 12; ++i)
      streams.push_back(submit(s, request({1, 300 + i, 301}, 8, 1.0f, 10 + static_cast<uint64_t>(i))));
    for (size_t i = 0; i < streams.size(); ++i) {
      // A stalled loop never answers; a working one needs milliseconds per request.
      const Result r = collect(*streams[i], std::chrono::milliseconds(5000));
      ASSERT_EQ(r.finish, Finish::kLength) << slots << " slots, request " << i;
      EXPECT_EQ(r.usage.completion_tokens, 8) << slots << " slots, request " << i;
    }
    EXPECT_TRUE(s.idle());
    EXPECT_EQ(caches.out.load(), 0);
    EXPECT_EQ(s.stats().finished[static_cast<int>(Finish::kLength)], 12u);
  }
}

TEST(Scheduler, QueueIsBoundedAndDrainRefuses) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  CountingPool caches(f.model->config(), 1);
  engine::SchedulerOptions o;
  o.max_running = 1;
  o.max_waiting = 2;
  o.max_rows = 32;
  Scheduler s(graph, caches, nullptr, o);
  std::vector<std::shared_ptr<engine::Stream>> ok;
  Scheduler::Admit a{};
  int refused = 0;
  for (int i = 0; i < 6; ++i) {
    auto st = s.submit(request({1, 300}, 200, 0.0f, 1), a);
    if (st) ok.push_back(st);
    if (a == Scheduler::Admit::kQueueFull) ++refused;
  }
  EXPECT_EQ(ok.size(), 3u) << "one running plus two queued";
  EXPECT_EQ(refused, 3);
  std::string why;
  EXPECT_EQ(s.submit(request(std::vector<int32_t>(kCtx, 5), 1, 0.0f, 1), a, &why), nullptr);
  EXPECT_EQ(a, Scheduler::Admit::kInvalid);
  EXPECT_NE(why.find("context"), std::string::npos) << why;
  EXPECT_EQ(s.submit(request({1}, 0, 0.0f, 1), a), nullptr);
  EXPECT_EQ(a, Scheduler::Admit::kInvalid);
  // Cancelled before the drain: none of them is refused as drained.
  for (auto& st : ok) st->cancel();
  s.drain();
  EXPECT_EQ(s.submit(request({1}, 1, 0.0f, 1), a), nullptr);
  EXPECT_EQ(a, Scheduler::Admit::kDraining);
  for (auto& st : ok) EXPECT_EQ(collect(*st).finish, Finish::kCancelled);
  EXPECT_EQ(caches.out.load(), 0);
}

// Draining ends the requests that never started at once, with kDrained and nothing generated, and lets the
// running one finish; stopping then cuts a running request with kCancelled.
TEST(Scheduler, DrainRefusesQueuedRequestsAndFinishesRunningOnes) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  CountingPool caches(f.model->config(), 1);
  engine::SchedulerOptions o;
  o.max_running = 1;
  o.max_waiting = 8;
  o.max_rows = 32;
  Scheduler s(graph, caches, nullptr, o);
  auto running = submit(s, request({1, 300, 301}, 120, 0.0f, 1));
  std::vector<std::shared_ptr<engine::Stream>> queued;
  for (int i = 0; i < 4; ++i) queued.push_back(submit(s, request({1, 310 + i}, 50, 0.0f, 2)));
  Event ev;
  ASSERT_TRUE(running->next(ev, std::chrono::milliseconds(20000)));
  ASSERT_EQ(ev.kind, Event::Kind::kToken);
  s.drain();
  for (auto& st : queued) {
    const Result r = collect(*st, std::chrono::milliseconds(5000));
    EXPECT_EQ(r.finish, Finish::kDrained);
    EXPECT_TRUE(r.tokens.empty());
    EXPECT_EQ(r.usage.completion_tokens, 0);
  }
  const Result r = collect(*running);
  EXPECT_EQ(r.finish, Finish::kLength);
  EXPECT_EQ(r.tokens.size() + 1, 120u) << "the first token was taken above";
  EXPECT_TRUE(s.idle());
  const auto st = s.stats();
  EXPECT_EQ(st.finished[static_cast<int>(Finish::kDrained)], 4u);
  EXPECT_EQ(st.finished[static_cast<int>(Finish::kLength)], 1u);
  EXPECT_EQ(caches.out.load(), 0);
}

TEST(Scheduler, StopCancelsRunningAndDrainsQueuedRequests) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  CountingPool caches(f.model->config(), 1);
  engine::SchedulerOptions o;
  o.max_running = 1;
  o.max_rows = 32;
  Scheduler s(graph, caches, nullptr, o);
  auto running = submit(s, request({1, 300, 301}, 200, 0.0f, 1));
  auto queued = submit(s, request({1, 302}, 10, 0.0f, 2));
  Event ev;
  ASSERT_TRUE(running->next(ev, std::chrono::milliseconds(20000)));
  s.stop();
  const Result r = collect(*running);
  EXPECT_EQ(r.finish, Finish::kCancelled);
  EXPECT_LT(r.usage.completion_tokens, 200);
  EXPECT_EQ(collect(*queued).finish, Finish::kDrained);
  EXPECT_EQ(caches.out.load(), 0);
}

TEST(Scheduler, PrefixReuseKeepsOutputs) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  std::vector<int32_t> system = {1};
  for (int j = 0; j < 40; ++j) system.push_back(static_cast<int32_t>(270 + j * 5 % 200));
  auto with_tail = [&](std::vector<int32_t> tail) {
    std::vector<int32_t> p = system;
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const auto b = request(with_tail({333, 444, 355}), 10, 0.0f, 3);
  Result fresh;
  {
    CountingPool caches(f.model->config(), 1);
    Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
    fresh = collect(*submit(s, b));
    EXPECT_EQ(fresh.usage.cached_tokens, 0);
  }
  CountingPool caches(f.model->config(), 1);
  Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
  collect(*submit(s, request(with_tail({301, 302}), 5, 0.0f, 3)));
  Result reused = collect(*submit(s, b));
  EXPECT_EQ(reused.usage.cached_tokens, static_cast<int64_t>(system.size()));
  EXPECT_EQ(reused.tokens, fresh.tokens);
}

// Proposes the known continuation, corrupting every third draft, so windows are partly rejected.
class OracleDraft final : public speculative::DraftSource {
 public:
  explicit OracleDraft(std::vector<int32_t> full) : full_(std::move(full)) {}
  std::string_view kind() const override { return "oracle"; }
  void begin(std::span<const int32_t>, const speculative::DraftSettings&) override {}
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    out.clear();
    for (int i = 0; i < max_depth; ++i) {
      const size_t at = committed.size() + static_cast<size_t>(i);
      if (at >= full_.size()) break;
      out.tokens.push_back(at % 3 == 0 ? (full_[at] + 1) % 512 : full_[at]);
    }
  }
  void accept(std::span<const int32_t>, int) override {}

 private:
  std::vector<int32_t> full_;
};

TEST(Scheduler, VerifyWindowsKeepGreedyOutput) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const auto req = request({1, 403, 407, 261, 378}, 40, 0.0f, 5);
  Result plain;
  {
    CountingPool caches(f.model->config(), 1);
    Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
    plain = collect(*submit(s, req));
  }
  std::vector<int32_t> full = req.prompt;
  full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
  CountingPool caches(f.model->config(), 3);
  engine::SchedulerOptions o{3, 4, 32, 6};
  Scheduler s(graph, caches, nullptr, o, [&] { return std::make_unique<OracleDraft>(full); });
  std::vector<std::shared_ptr<engine::Stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(submit(s, req));
  for (auto& st : streams) EXPECT_EQ(collect(*st).tokens, plain.tokens);
  const auto stats = s.stats();
  EXPECT_GT(stats.drafted, 0u);
  EXPECT_GT(stats.accepted, 0u);
  EXPECT_LT(stats.accepted, stats.drafted);
  EXPECT_EQ(caches.out.load(), 0);
}

// Remembers what the last released cache held against the tokens it came back with.
class ReleaseRecordingPool final : public engine::CachePool {
 public:
  explicit ReleaseRecordingPool(const model::Config& c) : inner_(c, kCtx, cache::KvType::kF16, 1) {}
  int64_t capacity() const override { return inner_.capacity(); }
  Lease acquire(std::span<const int32_t> prompt) override { return inner_.acquire(prompt); }
  void release(std::unique_ptr<cache::KvCache> c, std::span<const int32_t> tokens) override {
    cache_length = c->length();
    tokens_given = static_cast<int64_t>(tokens.size());
    inner_.release(std::move(c), tokens);
  }
  int64_t reusable(std::span<const int32_t> prompt) const override { return inner_.reusable(prompt); }
  std::atomic<int64_t> cache_length{-1}, tokens_given{-1};

 private:
  engine::SlotCachePool inner_;
};

// A drafter that proposes the target's own continuation, so every draft is accepted.
class ExactDraft final : public speculative::DraftSource {
 public:
  explicit ExactDraft(std::vector<int32_t> full) : full_(std::move(full)) {}
  std::string_view kind() const override { return "exact"; }
  void begin(std::span<const int32_t>, const speculative::DraftSettings&) override {}
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    out.clear();
    for (size_t at = committed.size(); at < full_.size() && static_cast<int>(out.tokens.size()) < max_depth;
         ++at)
      out.tokens.push_back(full_[at]);
  }
  void accept(std::span<const int32_t>, int) override {}

 private:
  std::vector<int32_t> full_;
};

// The end-of-generation token arrives as the first of several accepted drafts: the sequence stops there, and
// its cache goes back holding no position past the tokens it is returned with (the rows of the accepted
// drafts after the stop are rolled back), so a later request cannot reuse positions of text never committed.
TEST(Scheduler, StoppingInsideAnAcceptedWindowReturnsOnlyTheCommittedText) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const auto req = request({1, 403, 407, 261, 378}, 24, 0.0f, 5);
  Result plain;
  {
    CountingPool caches(f.model->config(), 1);
    Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
    plain = collect(*submit(s, req));
  }
  ASSERT_EQ(plain.tokens.size(), 24u);
  // The first drafted round covers generated tokens 1, 2, ...: stop at token 1, whose id must not occur at 0.
  ASSERT_NE(plain.tokens[1], plain.tokens[0]);
  const int32_t stop = plain.tokens[1];
  std::vector<int32_t> full = req.prompt;
  full.insert(full.end(), plain.tokens.begin(), plain.tokens.end());
  ReleaseRecordingPool caches(f.model->config());
  engine::SchedulerOptions o{1, 4, 32, 6};
  Scheduler s(
      graph, caches, [stop](int32_t t) { return t == stop; }, o,
      [&] { return std::make_unique<ExactDraft>(full); });
  engine::Request stopping = req;
  stopping.stop_at_eog = true;
  const Result r = collect(*submit(s, stopping));
  EXPECT_EQ(r.finish, Finish::kStop);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.tokens.begin(), plain.tokens.begin() + 1));
  s.stop();  // the iteration's counters are added after the client hears of the end
  const auto stats = s.stats();
  ASSERT_GE(stats.accepted, 2u) << "the stop token was not followed by another accepted draft";
  // Prompt, the first token and the stop token; the cache holds all but the last.
  EXPECT_EQ(caches.tokens_given.load(), static_cast<int64_t>(req.prompt.size()) + 2);
  EXPECT_EQ(caches.cache_length.load(), caches.tokens_given.load() - 1);
}

}  // namespace
