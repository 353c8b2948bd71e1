// Speculation under load in the scheduler: batched drafting proposes exactly what each drafter proposes
// alone and rolls each sequence's drafter back on its own, greedy output with speculation on equals the
// output with it off request by request under 8 concurrent streams, with chains and with draft trees (whose
// budget follows the forward's cost, and whose compacted caches equal plain decoding's), and a sequence
// whose gate stopped drafting drafts again once its drafter's acceptance recovers (probes); a drafter that
// reads the target's hidden states drafts from the scheduler's captures as it does alone, and one that cannot
// follow a tree round's rows is refused trees; `tandem bench-serve` reports both modes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "tandem/engine/cache_pool.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/graph.h"
#include "tandem/model/session.h"
#include "tandem/server/metrics.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/eagle_draft.h"
#include "tandem/speculative/eagle_train.h"
#include "tandem/speculative/ngram.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/train/checkpoint.h"
#include "test_util.h"

namespace {

using namespace tandem;
using engine::Event;
using engine::Scheduler;

constexpr int64_t kCtx = 256;

struct Fixture {
  Fixture()
      : model(model::Model::load(tandem::testing::shared_path("models/stories260K.gguf"))),
        draft(model::Model::load(tandem::testing::shared_path("models/llama2xs-tok512.gguf"))),
        pool(2) {}
  std::unique_ptr<model::Model> model, draft;
  ThreadPool pool;
};

std::vector<int32_t> collect(engine::Stream& s) {
  std::vector<int32_t> tokens;
  Event ev;
  for (;;) {
    if (!s.next(ev, std::chrono::milliseconds(60000))) {
      ADD_FAILURE() << "no event within a minute";
      return tokens;
    }
    if (ev.kind != Event::Kind::kToken) {
      EXPECT_NE(ev.finish, engine::Finish::kError) << ev.error;
      return tokens;
    }
    tokens.push_back(ev.token.id);
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

// Eight greedy requests with prompts of 2 to 77 tokens (several take more than one chunk of the row budget),
// some repeating themselves so that n-gram lookup finds continuations.
std::vector<engine::Request> workload() {
  std::vector<engine::Request> rs;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 1 + i * 11; ++j)
      prompt.push_back(static_cast<int32_t>(260 + (i * 37 + j * 13) % 240));
    rs.push_back(request(prompt, 24 + 3 * i));
  }
  return rs;
}

// Runs every request at once (8 running) and returns each one's tokens, in request order; from `pool`, or
// a pool of f16 caches of its own.
std::vector<std::vector<int32_t>> serve_all(model::Graph& graph, const model::Config& config,
                                            const engine::SchedulerOptions& options,
                                            engine::DraftFactory drafts,
                                            engine::SchedulerStats* stats = nullptr,
                                            engine::CachePool* pool = nullptr) {
  engine::SlotCachePool own(config, kCtx, cache::KvType::kF16, options.max_running);
  engine::CachePool& caches = pool ? *pool : own;
  Scheduler s(graph, caches, nullptr, options, std::move(drafts));
  std::vector<std::shared_ptr<engine::Stream>> streams;
  for (engine::Request& r : workload()) {
    Scheduler::Admit a{};
    std::string why;
    streams.push_back(s.submit(std::move(r), a, &why));
    EXPECT_EQ(a, Scheduler::Admit::kOk) << why;
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& st : streams) out.push_back(st ? collect(*st) : std::vector<int32_t>{});
  s.stop();
  if (stats) *stats = s.stats();
  return out;
}

engine::SchedulerOptions options(int max_draft) {
  engine::SchedulerOptions o;
  o.max_running = 8;
  o.max_waiting = 8;
  o.max_rows = 64;
  o.max_draft = max_draft;
  return o;
}

const engine::SchedulerStats::Drafter* drafter(const engine::SchedulerStats& s, std::string_view kind) {
  for (const auto& d : s.drafters)
    if (d.kind == kind) return &d;
  return nullptr;
}

TEST(SchedulerSpec, GreedyOutputWithSpeculationEqualsPlainUnderEightStreams) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{64, 16});
  const auto plain = serve_all(graph, f.model->config(), options(0), {});
  ASSERT_EQ(plain.size(), 8u);
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(plain[i].size(), 24u + 3 * i);

  speculative::DraftModelBatch batch(*f.draft, f.pool, 8, 64);
  const model::SessionOptions dso{kCtx, cache::KvType::kF16, 16};
  engine::SchedulerStats model_stats;
  const auto with_model = serve_all(
      graph, f.model->config(), options(6),
      [&] {
        return std::make_unique<speculative::DraftModelSource>(*f.draft, *f.model, f.pool, dso, &batch);
      },
      &model_stats);
  engine::SchedulerStats ngram_stats;
  const auto with_ngram = serve_all(
      graph, f.model->config(), options(6), [] { return std::make_unique<speculative::NgramSource>(); },
      &ngram_stats);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(with_model[i], plain[i]) << "request " << i << " with the batched draft model";
    EXPECT_EQ(with_ngram[i], plain[i]) << "request " << i << " with n-gram drafting";
  }
  // The draft model drafts for this text and the target accepts much of it; the gates' decisions are counted
  // per drafter kind.
  EXPECT_GT(model_stats.accepted, 0u);
  EXPECT_GT(model_stats.verify_windows, 0u);
  EXPECT_GE(model_stats.verify_tokens, model_stats.verify_windows + model_stats.accepted);
  const auto* d = drafter(model_stats, "model");
  ASSERT_NE(d, nullptr);
  EXPECT_GT(d->drafting, 0u);
  EXPECT_EQ(d->drafted, model_stats.drafted);
  EXPECT_EQ(d->accepted, model_stats.accepted);
  EXPECT_NE(drafter(ngram_stats, "ngram"), nullptr);
  const std::string metrics = server::Metrics().render(model_stats);
  EXPECT_NE(metrics.find("tandem_gate_decisions_total{drafter=\"model\",decision=\"drafting\"} " +
                         std::to_string(d->drafting) + "\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tandem_verify_windows_total " + std::to_string(model_stats.verify_windows) + "\n"),
            std::string::npos);
  EXPECT_NE(metrics.find("tandem_tree_nodes_verified_total 0\n"), std::string::npos);
}

// Draft trees under 8 concurrent streams: every sequence proposes a token tree (the draft model's scored by
// its path probabilities, n-gram lookup's merging earlier continuations), the forward verifies them beside
// the other sequences' rows, and greedy output equals plain output request by request.
TEST(SchedulerSpec, GreedyOutputWithTreesEqualsPlainUnderEightStreams) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{64, 16});
  const auto plain = serve_all(graph, f.model->config(), options(0), {});
  speculative::DraftModelBatch batch(*f.draft, f.pool, 8, 64);
  const model::SessionOptions dso{kCtx, cache::KvType::kF16, 16};
  engine::SchedulerOptions o = options(6);
  o.tree_nodes = 8;
  engine::SchedulerStats model_stats, ngram_stats;
  const auto with_model = serve_all(
      graph, f.model->config(), o,
      [&] {
        return std::make_unique<speculative::DraftModelSource>(*f.draft, *f.model, f.pool, dso, &batch);
      },
      &model_stats);
  const auto with_ngram = serve_all(
      graph, f.model->config(), o, [] { return std::make_unique<speculative::NgramSource>(); }, &ngram_stats);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(with_model[i], plain[i]) << "request " << i << " with draft model trees";
    EXPECT_EQ(with_ngram[i], plain[i]) << "request " << i << " with n-gram trees";
  }
  for (const engine::SchedulerStats* st : {&model_stats, &ngram_stats}) {
    EXPECT_GT(st->tree_nodes, 0u);
    EXPECT_LE(st->tree_nodes, st->drafted);
    EXPECT_GT(st->accepted, 0u);
    EXPECT_LT(st->accepted, st->tree_nodes) << "some nodes were rejected";
  }
  const auto* d = drafter(model_stats, "model");
  ASSERT_NE(d, nullptr);
  EXPECT_GT(d->drafting, 0u);
  EXPECT_EQ(d->drafted, model_stats.drafted);
  const std::string metrics = server::Metrics().render(model_stats);
  EXPECT_NE(metrics.find("tandem_tree_nodes_verified_total " + std::to_string(model_stats.tree_nodes) + "\n"),
            std::string::npos)
      << metrics;
}

// The tree budget prices what a tree's rows add to the forward: where every row costs more than a plain step
// (a calibrated curve, no timings), no tree of the draft model's scored nodes pays, so every round is a plain
// step; the output is plain either way.
TEST(SchedulerSpec, TreeBudgetFollowsTheForwardsCost) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{64, 16});
  const auto plain = serve_all(graph, f.model->config(), options(0), {});
  speculative::DraftModelBatch batch(*f.draft, f.pool, 8, 64);
  const model::SessionOptions dso{kCtx, cache::KvType::kF16, 16};
  engine::SchedulerOptions o = options(6);
  o.tree_nodes = 8;
  o.costs = speculative::CostModel::linear(2.0, 0.0, 64);
  o.gate.timing_samples = 1 << 30;
  engine::SchedulerStats stats;
  const auto out = serve_all(
      graph, f.model->config(), o,
      [&] {
        return std::make_unique<speculative::DraftModelSource>(*f.draft, *f.model, f.pool, dso, &batch);
      },
      &stats);
  EXPECT_EQ(out, plain);
  EXPECT_EQ(stats.tree_nodes, 0u);
  EXPECT_EQ(stats.drafted, 0u);
  const auto* d = drafter(stats, "model");
  ASSERT_NE(d, nullptr);
  EXPECT_GT(d->off, 0u);
  EXPECT_EQ(d->drafting, 0u);
}

// A cache pool that checks every cache the scheduler gives back: continued by three tokens, it gives the
// logits, bit for bit, of a cache that evaluated the same tokens plainly, so a tree round's compaction left
// exactly the accepted path's rows.
class CheckingPool final : public engine::CachePool {
 public:
  CheckingPool(const model::Model& model, ThreadPool& pool, int slots)
      : inner_(model.config(), kCtx, cache::KvType::kF16, slots),
        config_(model.config()),
        graph_(model, pool, model::GraphOptions{64, 16}) {}
  int64_t capacity() const override { return inner_.capacity(); }
  Lease acquire(std::span<const int32_t> prompt) override { return inner_.acquire(prompt); }
  int64_t reusable(std::span<const int32_t> prompt) const override { return inner_.reusable(prompt); }
  void release(std::unique_ptr<cache::KvCache> cache, std::span<const int32_t> tokens) override {
    const int64_t n = cache->length();
    const auto V = static_cast<size_t>(config_.n_vocab);
    if (n > 0 && static_cast<int64_t>(tokens.size()) > n && n + 3 <= cache->capacity()) {
      const std::vector<int32_t> more = {tokens[static_cast<size_t>(n)], 300, 301};
      std::vector<float> got(more.size() * V), want(more.size() * V);
      graph_.verify(more, *cache, got.data());
      cache::KvCache plain(config_.kv_geometry(), kCtx, cache::KvType::kF16);
      graph_.prompt(tokens.first(static_cast<size_t>(n)), plain, nullptr);
      graph_.verify(more, plain, want.data());
      ++checked;
      if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) ++differed;
      cache->truncate(n);
    }
    inner_.release(std::move(cache), tokens);
  }
  int checked = 0, differed = 0;

 private:
  engine::SlotCachePool inner_;
  const model::Config& config_;
  model::Graph graph_;
};

TEST(SchedulerSpec, CacheAfterTreeRoundsEqualsPlainDecodingOfTheAcceptedTokens) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{64, 16});
  const auto plain = serve_all(graph, f.model->config(), options(0), {});
  speculative::DraftModelBatch batch(*f.draft, f.pool, 8, 64);
  const model::SessionOptions dso{kCtx, cache::KvType::kF16, 16};
  engine::SchedulerOptions o = options(6);
  o.tree_nodes = 12;
  // Rows priced as free, so every tree is verified whole.
  o.costs = speculative::CostModel::linear(0.0, 0.0, 64);
  o.gate.timing_samples = 1 << 30;
  CheckingPool pool(*f.model, f.pool, o.max_running);
  engine::SchedulerStats stats;
  const auto out = serve_all(
      graph, f.model->config(), o,
      [&] {
        return std::make_unique<speculative::DraftModelSource>(*f.draft, *f.model, f.pool, dso, &batch);
      },
      &stats, &pool);
  EXPECT_EQ(out, plain);
  EXPECT_GT(stats.tree_nodes, 0u);
  EXPECT_LT(stats.accepted, stats.tree_nodes);
  EXPECT_EQ(pool.checked, static_cast<int>(plain.size()));
  EXPECT_EQ(pool.differed, 0);
}

// N-gram lookup that claims to read the target's hidden states without following a tree round's rows (a
// stand-in for the MTP drafter) and counts the trees it is asked for.
class TappingNgram final : public speculative::DraftSource {
 public:
  explicit TappingNgram(int& tree_calls) : tree_calls_(tree_calls) {}
  std::string_view kind() const override { return "tapping"; }
  void begin(std::span<const int32_t> prompt, const speculative::DraftSettings& settings) override {
    inner_.begin(prompt, settings);
  }
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    inner_.propose(committed, max_depth, out);
  }
  void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth,
                    speculative::Draft& out) override {
    ++tree_calls_;
    inner_.propose_tree(committed, max_nodes, max_depth, out);
  }
  void accept(std::span<const int32_t> committed, int n_accepted) override {
    inner_.accept(committed, n_accepted);
  }
  std::span<const int64_t> target_layers() const override { return layers_; }

 private:
  speculative::NgramSource inner_;
  int& tree_calls_;
  const int64_t layers_[1] = {0};
};

// Such a drafter is refused trees: every request fails at its start with the way out, and nothing is
// drafted; with chains (--tree-nodes 0) it drafts and the output is plain.
TEST(SchedulerSpec, DraftersThatCannotFollowTreeRowsAreRefusedTrees) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{64, 16});
  engine::SchedulerOptions o = options(6);
  o.tree_nodes = 8;
  int tree_calls = 0;
  {
    engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, o.max_running);
    Scheduler s(graph, caches, nullptr, o, [&] { return std::make_unique<TappingNgram>(tree_calls); });
    Scheduler::Admit a{};
    std::shared_ptr<engine::Stream> stream = s.submit(request({1, 403, 407, 261}, 8), a);
    ASSERT_NE(stream, nullptr);
    Event ev;
    ASSERT_TRUE(stream->next(ev, std::chrono::milliseconds(60000)));
    EXPECT_EQ(ev.kind, Event::Kind::kDone) << "no token before the refusal";
    EXPECT_EQ(ev.finish, engine::Finish::kError);
    EXPECT_NE(ev.error.find("the tapping drafter reads the target's hidden states and drafts chains only"),
              std::string::npos)
        << ev.error;
    EXPECT_NE(ev.error.find("--tree-nodes 0"), std::string::npos) << ev.error;
    s.stop();
    EXPECT_EQ(s.stats().drafted, 0u);
  }
  EXPECT_EQ(tree_calls, 0);
  const auto plain = serve_all(graph, f.model->config(), options(0), {});
  o.tree_nodes = 0;
  o.gate.margin = 0.0;
  o.gate.timing_samples = 1 << 30;
  engine::SchedulerStats stats;
  const auto out = serve_all(
      graph, f.model->config(), o, [&] { return std::make_unique<TappingNgram>(tree_calls); }, &stats);
  EXPECT_EQ(out, plain);
  EXPECT_EQ(tree_calls, 0);
  EXPECT_EQ(stats.tree_nodes, 0u);
  EXPECT_GT(stats.drafted, 0u) << "the drafter verified chains";
}

// Proposes for several sequences of different lengths in one batch, and compares each proposal and the
// drafter state it leaves with a source that proposes alone; then rolls each sequence back to a different
// accepted prefix and proposes again.
TEST(SchedulerSpec, BatchedDraftModelProposesAsAloneAndRollsBackPerSequence) {
  Fixture f;
  const model::SessionOptions dso{kCtx, cache::KvType::kF16, 16};
  speculative::DraftModelBatch batch(*f.draft, f.pool, 4, 16);
  std::vector<std::vector<int32_t>> texts;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> t = {1};
    for (int j = 0; j < 3 + i * 14; ++j) t.push_back(static_cast<int32_t>(300 + (i * 7 + j * 5) % 200));
    texts.push_back(t);
  }
  std::vector<std::unique_ptr<speculative::DraftModelSource>> batched, alone;
  for (size_t i = 0; i < texts.size(); ++i) {
    batched.push_back(
        std::make_unique<speculative::DraftModelSource>(*f.draft, *f.model, f.pool, dso, &batch));
    alone.push_back(std::make_unique<speculative::DraftModelSource>(*f.draft, *f.model, f.pool, dso));
    sampling::Params p;
    p.temperature = 0.0f;
    batched[i]->begin(texts[i], {p, i});
    alone[i]->begin(texts[i], {p, i});
  }
  std::vector<speculative::Draft> got(texts.size()), want(texts.size());
  for (int round = 0; round < 3; ++round) {
    std::vector<speculative::DraftRequest> requests;
    for (size_t i = 0; i < texts.size(); ++i) {
      const int depth = 2 + static_cast<int>(i) + round;
      requests.push_back({batched[i].get(), texts[i], depth, &got[i]});
      alone[i]->propose(texts[i], depth, want[i]);
    }
    batched[0]->propose_batch(requests);
    for (size_t i = 0; i < texts.size(); ++i) {
      ASSERT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i << ", round " << round;
      ASSERT_EQ(batched[i]->cached(), alone[i]->cached()) << "sequence " << i << ", round " << round;
      // Sequence i keeps i of its drafts and the target adds a token of its own.
      const auto keep = std::min<size_t>(i, got[i].tokens.size());
      texts[i].insert(texts[i].end(), got[i].tokens.begin(), got[i].tokens.begin() + static_cast<long>(keep));
      texts[i].push_back(static_cast<int32_t>(260 + round * 3 + static_cast<int>(i)));
      batched[i]->accept(texts[i], static_cast<int>(keep));
      alone[i]->accept(texts[i], static_cast<int>(keep));
      EXPECT_EQ(batched[i]->cached(), alone[i]->cached()) << "sequence " << i << " after rollback";
      EXPECT_LE(batched[i]->cached(), static_cast<int64_t>(texts[i].size()));
    }
  }
}

// Proposes wrong tokens until the committed text reaches `recover_at` tokens, then the target's own
// continuation.
class RecoveringDraft final : public speculative::DraftSource {
 public:
  RecoveringDraft(std::vector<int32_t> full, size_t recover_at) : full_(std::move(full)), at_(recover_at) {}
  std::string_view kind() const override { return "recovering"; }
  void begin(std::span<const int32_t>, const speculative::DraftSettings&) override {}
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    out.clear();
    for (size_t at = committed.size(); at < full_.size() && static_cast<int>(out.tokens.size()) < max_depth;
         ++at)
      out.tokens.push_back(committed.size() < at_ ? (full_[at] + 1) % 512 : full_[at]);
  }
  void accept(std::span<const int32_t>, int) override {}

 private:
  std::vector<int32_t> full_;
  size_t at_;
};

TEST(SchedulerSpec, ASequenceWhoseDrafterRecoversDraftsAgain) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const auto req = request({1, 403, 407, 261, 378}, 120);
  std::vector<int32_t> plain;
  {
    engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 1);
    Scheduler s(graph, caches, nullptr, {1, 4, 32, 0});
    Scheduler::Admit a{};
    plain = collect(*s.submit(req, a));
  }
  ASSERT_EQ(plain.size(), 120u);
  std::vector<int32_t> full = req.prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  engine::SchedulerOptions o{1, 4, 32, 4};
  o.gate.probe_interval = 2;
  o.gate.max_probe_interval = 4;
  // Rows priced at a tenth of a step whatever the machine's timings, so the test depends on acceptance only.
  o.costs = speculative::CostModel::linear(0.1, 0.0);
  o.gate.timing_samples = 1 << 30;
  const size_t recover_at = req.prompt.size() + 40;
  engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 1);
  Scheduler s(graph, caches, nullptr, o, [&] { return std::make_unique<RecoveringDraft>(full, recover_at); });
  Scheduler::Admit a{};
  EXPECT_EQ(collect(*s.submit(req, a)), plain);
  s.stop();
  const auto stats = s.stats();
  const auto* d = drafter(stats, "recovering");
  ASSERT_NE(d, nullptr);
  // The gate gave up on the bad drafter, probed it while idle, and drafted again once it recovered: every
  // accepted draft comes after the recovery.
  EXPECT_GT(d->off, 0u);
  EXPECT_GT(d->probing, 0u);
  EXPECT_GT(stats.accepted, 20u);
}

// Proposes each request's own continuation (the target's greedy output after its prompt): every draft is
// accepted.
class ScriptedDraft final : public speculative::DraftSource {
 public:
  explicit ScriptedDraft(const std::vector<std::vector<int32_t>>& fulls) : fulls_(fulls) {}
  std::string_view kind() const override { return "scripted"; }
  void begin(std::span<const int32_t> prompt, const speculative::DraftSettings&) override {
    full_ = nullptr;
    for (const auto& f : fulls_)
      if (f.size() >= prompt.size() && std::equal(prompt.begin(), prompt.end(), f.begin())) full_ = &f;
  }
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    out.clear();
    if (!full_) return;
    for (size_t at = committed.size(); at < full_->size() && static_cast<int>(out.tokens.size()) < max_depth;
         ++at)
      out.tokens.push_back((*full_)[at]);
  }
  void accept(std::span<const int32_t>, int) override {}

 private:
  const std::vector<std::vector<int32_t>>& fulls_;
  const std::vector<int32_t>* full_ = nullptr;
};

// Sequences that decide in the same step are priced on the forward as planned so far: the rows granted to
// the sequences before them included. Extra rows are free up to 4 rows and cost 4 steps each past that, so
// with two streams the first one's window of 2 drafts fills the free rows (2 decode rows + 2 drafts) and the
// second one, priced on those 4 rows, drafts nothing while the first runs (priced on 2 rows, as if the first
// had drafted nothing, its window would look free too). Once the first has finished, the second drafts alone.
TEST(SchedulerSpec, LaterSequencesArePricedOnEarlierGrants) {
  Fixture f;
  model::Graph graph(*f.model, f.pool, model::GraphOptions{32, 16});
  const std::vector<engine::Request> reqs = {request({1, 403, 407, 261, 378}, 30),
                                             request({1, 300, 311, 290}, 30)};
  const auto run = [&](const engine::SchedulerOptions& o, engine::DraftFactory drafts,
                       engine::SchedulerStats* stats) {
    engine::SlotCachePool caches(f.model->config(), kCtx, cache::KvType::kF16, 2);
    Scheduler s(graph, caches, nullptr, o, std::move(drafts));
    std::vector<std::shared_ptr<engine::Stream>> streams;
    for (engine::Request r : reqs) {
      Scheduler::Admit a{};
      streams.push_back(s.submit(std::move(r), a));
      EXPECT_EQ(a, Scheduler::Admit::kOk);
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& st : streams) out.push_back(st ? collect(*st) : std::vector<int32_t>{});
    s.stop();
    if (stats) *stats = s.stats();
    return out;
  };
  const auto plain = run({2, 4, 32, 0}, {}, nullptr);
  ASSERT_EQ(plain.size(), 2u);
  std::vector<std::vector<int32_t>> fulls;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(plain[i].size(), 30u);
    fulls.push_back(reqs[i].prompt);
    fulls.back().insert(fulls.back().end(), plain[i].begin(), plain[i].end());
  }

  engine::SchedulerOptions o{2, 4, 32, 2};
  o.costs.verify = {1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 9.0, 13.0, 17.0};
  o.gate.timing_samples = 1 << 30;  // the curve above, whatever the machine's timings
  o.gate.probe_interval = o.gate.max_probe_interval = 1 << 20;
  engine::SchedulerStats stats;
  EXPECT_EQ(run(
                o, [&] { return std::make_unique<ScriptedDraft>(fulls); }, &stats),
            plain);
  const auto* d = drafter(stats, "scripted");
  ASSERT_NE(d, nullptr);
  // The first sequence drafts 2 per step (3 tokens) through about 10 shared steps; the second is off in each.
  EXPECT_GE(d->off, 8u);
  EXPECT_EQ(d->probing, 0u);
  EXPECT_GT(d->drafting, d->off);
  EXPECT_EQ(stats.accepted, stats.drafted);
}

// Forwards every call to `inner` and logs its proposals (committed length, depth asked, tokens) under the
// prompt it began with.
class RecordingSource final : public speculative::DraftSource {
 public:
  using Log = std::map<std::vector<int32_t>, std::vector<std::vector<int32_t>>>;
  RecordingSource(std::unique_ptr<speculative::DraftSource> inner, Log& log)
      : inner_(std::move(inner)), log_(log) {}
  std::string_view kind() const override { return inner_->kind(); }
  void begin(std::span<const int32_t> prompt, const speculative::DraftSettings& settings) override {
    entries_ = &log_[std::vector<int32_t>(prompt.begin(), prompt.end())];
    inner_->begin(prompt, settings);
  }
  void propose(std::span<const int32_t> committed, int max_depth, speculative::Draft& out) override {
    inner_->propose(committed, max_depth, out);
    std::vector<int32_t> e = {static_cast<int32_t>(committed.size()), max_depth};
    e.insert(e.end(), out.tokens.begin(), out.tokens.end());
    entries_->push_back(std::move(e));
  }
  void accept(std::span<const int32_t> committed, int n_accepted) override {
    inner_->accept(committed, n_accepted);
  }
  std::span<const int64_t> target_layers() const override { return inner_->target_layers(); }
  void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                        int64_t first_pos) override {
    inner_->on_target_hidden(layer, hidden, n_rows, first_pos);
  }

 private:
  std::unique_ptr<speculative::DraftSource> inner_;
  Log& log_;
  std::vector<std::vector<int32_t>>* entries_ = nullptr;
};

// A drafter that reads the target's hidden states drafts in the scheduler from the rows the scheduler
// captures: with every round drafting the deepest window (flat costs, no timings, no margin: any round beats
// a plain step), each sequence under 8 concurrent streams proposes after a given text exactly what it
// proposes after that text alone in `run`, and the output equals plain output request by request. `run` here
// evaluates prompts in forwards of 16 rows, so its prompts of 24 to 79 tokens are captured over several
// forwards.
TEST(SchedulerSpec, EagleDrafterDraftsFromCapturedRowsAsAlone) {
  Fixture f;
  // A briefly trained drafter: its proposals, not its quality, are compared.
  speculative::EagleTrainOptions to;
  {
    auto tok = tokenizer::Tokenizer::from_gguf(f.model->file());
    const auto texts = speculative::default_training_prompts();
    for (size_t i = 0; i < 4; ++i) to.prompts.push_back(tok->encode(texts[i], true, false));
  }
  to.tokens = 256;
  to.continuation = 64;
  to.steps = 12;
  to.unroll = 2;
  to.seed = 3;
  speculative::EagleTrainResult trained = speculative::train_eagle(*f.model, f.pool, to);
  const std::string target_hash =
      speculative::file_fingerprint(tandem::testing::shared_path("models/stories260K.gguf"));
  trained.info.target_file_hash = target_hash;
  const std::string checkpoint =
      ::testing::TempDir() + std::to_string(getpid()) + "_scheduler_spec_eagle.gguf";
  std::vector<train::Param*> params = trained.source->drafter().params();
  train::save_drafter(checkpoint, trained.info, params);
  auto load = [&] {
    return speculative::EagleDraftSource::load(checkpoint, *f.model, target_hash, f.pool, kCtx);
  };

  constexpr int kDepth = 4;
  RecordingSource::Log alone_log, served_log;
  int64_t accepted_alone = 0;
  std::vector<std::vector<int32_t>> alone;
  for (const engine::Request& r : workload()) {
    model::Session session(*f.model, f.pool, model::SessionOptions{kCtx, cache::KvType::kF16, 16});
    RecordingSource source(load(), alone_log);
    engine::SpecOptions so;
    so.generate.max_tokens = r.max_tokens;
    so.generate.sampling.temperature = 0.0f;
    so.draft_max = kDepth;
    so.use_gate = false;
    std::vector<int32_t> out;
    const engine::SpecStats st = engine::generate_speculative(
        session, source, r.prompt, so, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
    accepted_alone += st.accepted;
    alone.push_back(std::move(out));
  }
  ASSERT_GT(accepted_alone, 0) << "the drafter never had a draft accepted";

  model::Graph graph(*f.model, f.pool, model::GraphOptions{64, 16});
  const auto plain = serve_all(graph, f.model->config(), options(0), {});
  engine::SchedulerOptions o = options(kDepth);
  o.gate.margin = 0.0;
  o.gate.timing_samples = 1 << 30;
  engine::SchedulerStats stats;
  const auto spec = serve_all(
      graph, f.model->config(), o, [&] { return std::make_unique<RecordingSource>(load(), served_log); },
      &stats);
  // `run` verifies its first drafts with the prompt's last token and the scheduler takes the first token from
  // the prompt's forward, so their rounds fall on different committed lengths at first; wherever both propose
  // at the same committed length (so after the same text), the proposals must be equal.
  ASSERT_EQ(served_log.size(), alone_log.size());
  for (const auto& [prompt, proposals] : alone_log) {
    std::map<std::pair<int32_t, int32_t>, const std::vector<int32_t>*> alone_at;
    for (const auto& e : proposals) alone_at[{e[0], e[1]}] = &e;
    const auto& served = served_log[prompt];
    size_t compared = 0;
    for (const auto& e : served) {
      const auto it = alone_at.find({e[0], e[1]});
      if (it == alone_at.end()) continue;
      ++compared;
      EXPECT_EQ(e, *it->second) << "the request with a " << prompt.size()
                                << "-token prompt (committed length, depth, drafts)";
    }
    EXPECT_GE(compared * 2, served.size()) << "the request with a " << prompt.size() << "-token prompt";
  }
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(alone[i], plain[i]) << "request " << i << " alone";
    EXPECT_EQ(spec[i], plain[i]) << "request " << i << " with the EAGLE-3 drafter";
  }
  EXPECT_GT(stats.accepted, 0u);
  const auto* d = drafter(stats, speculative::kEagleKind);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->accepted, stats.accepted);
}

// `tandem bench-serve --json` on the real tiny model: each stream count has both modes' figures, the plain
// runs never draft, and the command's own check that every run's greedy output equals the first plain run's
// passed (it exits non-zero otherwise). Bad flags are refused saying what to pass.
TEST(SchedulerSpec, BenchServeReportsBothModesPerStreamCount) {
  const std::string tandem(TANDEM_BINARY);
  const std::string cache =
      "XDG_CACHE_HOME='" + ::testing::TempDir() + std::to_string(getpid()) + "_bench_serve_cache' ";
  const std::string model = " -m '" + tandem::testing::shared_path("models/stories260K.gguf") + "' -t 2";
  const auto [out, rc] = tandem::testing::run_command(
      cache + tandem + " bench-serve" + model +
      " --draft replay --accept 0.9 --streams 1,3 --prompt-tokens 8 --max-tokens 24 --repeats 2 --json "
      "2>&1");
  ASSERT_EQ(rc, 0) << out;
  const size_t last = out.find_last_of('\n', out.size() - 2);
  const nlohmann::json j = nlohmann::json::parse(out.substr(last == std::string::npos ? 0 : last + 1));
  EXPECT_EQ(j["draft"], "replay");
  EXPECT_EQ(j["accept"].get<double>(), 0.9);
  ASSERT_EQ(j["results"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& r = j["results"][i];
    EXPECT_EQ(r["streams"].get<int>(), i == 0 ? 1 : 3);
    ASSERT_EQ(r["speedups"].size(), 2u);
    ASSERT_EQ(r["cpu_speedups"].size(), 2u);
    for (const char* mode : {"plain", "spec"}) {
      const nlohmann::json& m = r[mode];
      EXPECT_GT(m["aggregate_tps"].get<double>(), 0.0) << mode;
      EXPECT_GT(m["stream_tps"].get<double>(), 0.0) << mode;
      EXPECT_GT(m["cpu_tps"].get<double>(), 0.0) << mode;
      EXPECT_GT(m["ttft_p50_s"].get<double>(), 0.0) << mode;
      EXPECT_GE(m["ttft_p99_s"].get<double>(), m["ttft_p50_s"].get<double>()) << mode;
    }
    EXPECT_EQ(r["plain"]["acceptance"].get<double>(), 0.0);
    EXPECT_EQ(r["plain"]["tokens_per_forward"].get<double>(), 1.0);
    EXPECT_GE(r["spec"]["tokens_per_forward"].get<double>(), 1.0);
    EXPECT_LE(r["spec"]["acceptance"].get<double>(), 1.0);
  }

  const auto [bad, bad_rc] =
      tandem::testing::run_command(cache + tandem + " bench-serve" + model + " --draft eagle 2>&1");
  EXPECT_NE(bad_rc, 0);
  EXPECT_NE(bad.find("--draft takes replay or ngram"), std::string::npos) << bad;
  const auto [narrow, narrow_rc] = tandem::testing::run_command(cache + tandem + " bench-serve" + model +
                                                                " --draft ngram --streams 8 --rows 4 2>&1");
  EXPECT_NE(narrow_rc, 0);
  EXPECT_NE(narrow.find("--rows must be at least the largest --streams"), std::string::npos) << narrow;
}

}  // namespace
