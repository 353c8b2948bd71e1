// Drafters that read the target, batched (EagleDraftBatch, DflashDraftBatch): propose_batch over sequences
// of different lengths, depths and samplers proposes exactly what each source proposes alone (tokens and q
// bit for bit, and the drafter caches it leaves), round after round with a different rollback per sequence;
// and the scheduler with a batched hidden-state drafter under 8 concurrent streams gives output identical to
// plain greedy decoding request by request, its proposals batched across sequences; with token trees
// (--tree-nodes), proposed by each sequence alone, the output is plain greedy output as well, and every
// settled round leaves the drafter the taps a plain forward over the committed text gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "drafter_fixture.h"
#include "tandem/engine/cache_pool.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/graph.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/server/metrics.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/dflash_draft.h"
#include "tandem/speculative/dflash_train.h"
#include "tandem/speculative/eagle_draft.h"
#include "tandem/speculative/eagle_train.h"
#include "tandem/speculative/tap_store.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/train/checkpoint.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem::speculative {
namespace {

constexpr int64_t kCtx = 256;
constexpr size_t kSequences = 3;

using drafter_fixture::target_path;

struct Fixture {
  Fixture() : target(model::Model::load(target_path())), pool(2) {}
  std::unique_ptr<model::Model> target;
  ThreadPool pool;
};

// Sequence i's committed text: a prompt of 3 + 17 i tokens, so that the batch's first catch-up takes
// several shared forwards of its 16 rows.
std::vector<std::vector<int32_t>> texts() {
  std::vector<std::vector<int32_t>> t;
  for (size_t i = 0; i < kSequences; ++i) {
    std::vector<int32_t> x = {1};
    for (size_t j = 0; j < 2 + 17 * i; ++j) x.push_back(static_cast<int32_t>(300 + (i * 7 + j * 5) % 200));
    t.push_back(x);
  }
  return t;
}

// Sequence i's taps at every position: a different pattern per sequence.
std::vector<float> taps_of(size_t i, int64_t width) {
  std::vector<float> taps(static_cast<size_t>(kCtx * width));
  for (size_t k = 0; k < taps.size(); ++k)
    taps[k] = std::sin(0.37f * static_cast<float>(k) + static_cast<float>(i)) * 2.0f;
  return taps;
}

// Sequence 1 samples (its q then is a whole distribution); the others are greedy.
DraftSettings settings_of(size_t i) {
  DraftSettings s;
  s.sampling.temperature = i == 1 ? 0.8f : 0.0f;
  s.sampling.top_k = 0;
  s.sequence_id = 40 + i;
  return s;
}

void expect_same_draft(const Draft& got, const Draft& want, const std::string& where) {
  ASSERT_EQ(got.tokens, want.tokens) << where;
  EXPECT_EQ(got.sampled, want.sampled) << where;
  for (size_t k = 0; k < want.tokens.size(); ++k) {
    EXPECT_EQ(got.q[k].ids, want.q[k].ids) << where << ", draft " << k;
    ASSERT_EQ(got.q[k].probs.size(), want.q[k].probs.size()) << where << ", draft " << k;
    EXPECT_EQ(
        0, std::memcmp(got.q[k].probs.data(), want.q[k].probs.data(), got.q[k].probs.size() * sizeof(float)))
        << where << ", draft " << k << ": q differs";
  }
}

// Three rounds over every sequence: the batched sources propose together, the lone ones one by one, at
// depths that differ per sequence and round; sequence i then keeps i of its drafts and a token of the
// target's own. `check` compares the sources' caches.
template <typename Source, typename Check>
void propose_rounds(std::vector<std::unique_ptr<Source>>& batched,
                    std::vector<std::unique_ptr<Source>>& alone, int max_depth, Check check) {
  std::vector<std::vector<int32_t>> t = texts();
  for (size_t i = 0; i < kSequences; ++i) {
    batched[i]->begin(t[i], settings_of(i));
    alone[i]->begin(t[i], settings_of(i));
  }
  std::vector<Draft> got(kSequences), want(kSequences);
  for (int round = 0; round < 4; ++round) {
    std::vector<DraftRequest> requests;
    for (size_t i = 0; i < kSequences; ++i) {
      const int depth = std::min(max_depth, 1 + static_cast<int>(i) * 2 + round);
      requests.push_back({batched[i].get(), t[i], depth, &got[i]});
      alone[i]->propose(t[i], depth, want[i]);
    }
    batched[1]->propose_batch(requests);
    for (size_t i = 0; i < kSequences; ++i) {
      const std::string where = "sequence " + std::to_string(i) + ", round " + std::to_string(round);
      ASSERT_FALSE(want[i].tokens.empty()) << where;
      expect_same_draft(got[i], want[i], where);
      check(*batched[i], *alone[i], where);
      const size_t keep = std::min(i, got[i].tokens.size());
      t[i].insert(t[i].end(), got[i].tokens.begin(),
                  got[i].tokens.begin() + static_cast<std::ptrdiff_t>(keep));
      t[i].push_back(static_cast<int32_t>(260 + round * 3 + static_cast<int>(i)));
      batched[i]->accept(t[i], static_cast<int>(keep));
      alone[i]->accept(t[i], static_cast<int>(keep));
    }
  }
}

// A reduced draft vocabulary: every fourth of the target's 512 tokens.
std::vector<int32_t> every_fourth() {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < 512; id += 4) ids.push_back(id);
  return ids;
}

// An untrained two-layer EAGLE drafter (the plain layer's cache is batched too) whose head scores
// draft_vocab (empty: every token); every call gives the same weights.
std::unique_ptr<train::EagleDrafter> eagle_drafter(const model::Model& target,
                                                   const std::vector<int32_t>& draft_vocab = {}) {
  train::EagleConfig cfg =
      eagle_config_for(target, static_cast<int64_t>(default_eagle_taps(target.config().n_layer).size()));
  cfg.n_layer = 2;
  cfg.draft_vocab = draft_vocab;
  auto d = std::make_unique<train::EagleDrafter>(cfg, 1);
  d->init(11);
  copy_target_weights(target, *d);
  return d;
}

// With the whole vocabulary and with a reduced draft vocabulary.
void eagle_batch_proposes_as_each_sequence_alone(const std::vector<int32_t>& draft_vocab) {
  Fixture f;
  const std::vector<int32_t> taps = default_eagle_taps(f.target->config().n_layer);
  const train::EagleConfig cfg = eagle_drafter(*f.target, draft_vocab)->config();
  EagleDraftBatch batch(cfg, f.pool, 4, kCtx, 16);
  std::vector<std::unique_ptr<EagleDraftSource>> batched, alone;
  for (size_t i = 0; i < kSequences; ++i) {
    batched.push_back(std::make_unique<EagleDraftSource>(eagle_drafter(*f.target, draft_vocab), taps, f.pool,
                                                         kCtx, *f.target, &batch));
    alone.push_back(std::make_unique<EagleDraftSource>(eagle_drafter(*f.target, draft_vocab), taps, f.pool,
                                                       kCtx, *f.target));
    const std::vector<float> t = taps_of(i, cfg.n_taps * cfg.d);
    batched[i]->set_taps(0, t);
    alone[i]->set_taps(0, t);
  }
  EXPECT_EQ(batched[0]->batch_group(), &batch);
  EXPECT_EQ(alone[0]->batch_group(), nullptr);
  propose_rounds(
      batched, alone, 8, [](const EagleDraftSource& b, const EagleDraftSource& a, const std::string& w) {
        ASSERT_EQ(b.cache_length(), a.cache_length()) << w;
        EXPECT_EQ(0,
                  std::memcmp(b.cached_keys().data(), a.cached_keys().data(), a.cached_keys().size_bytes()))
            << w << ": the drafter's keys differ";
        EXPECT_EQ(0,
                  std::memcmp(b.last_hidden().data(), a.last_hidden().data(), a.last_hidden().size_bytes()))
            << w << ": the last hidden state differs";
      });
  EXPECT_EQ(batch.proposals(), 4);
  EXPECT_EQ(batch.widest(), 3);
  // A batched source still proposes alone (in scratch of its own) exactly as an unbatched one.
  std::vector<int32_t> t = texts()[2];
  Draft one, other;
  batched[2]->begin(t, settings_of(0));
  alone[2]->begin(t, settings_of(0));
  batched[2]->propose(t, 5, one);
  alone[2]->propose(t, 5, other);
  expect_same_draft(one, other, "alone");
  for (int32_t x : one.tokens)
    EXPECT_TRUE(draft_vocab.empty() || std::binary_search(draft_vocab.begin(), draft_vocab.end(), x)) << x;
}

TEST(DrafterBatch, EagleBatchProposesAsEachSequenceAlone) {
  eagle_batch_proposes_as_each_sequence_alone({});
}

TEST(DrafterBatch, EagleBatchProposesAsEachSequenceAloneWithAReducedVocabulary) {
  eagle_batch_proposes_as_each_sequence_alone(every_fourth());
}

TEST(DrafterBatch, EagleBatchRefusesADrafterOfAnotherShape) {
  Fixture f;
  train::EagleConfig cfg = eagle_drafter(*f.target)->config();
  cfg.n_layer = 1;
  EagleDraftBatch batch(cfg, f.pool, 2, kCtx);
  try {
    EagleDraftSource s(eagle_drafter(*f.target), default_eagle_taps(f.target->config().n_layer), f.pool, kCtx,
                       *f.target, &batch);
    FAIL() << "a two-layer drafter joined a batch of one-layer drafters";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape differs"), std::string::npos) << e.what();
  }
}

// An untrained DFlash drafter of two layers and blocks of 8 whose FFN is wide enough (2^14 rows of the
// target's width) that its FFN matrices draft from Q8_0 copies: a lone block's 8 rows run as a verify
// window, three blocks' 24 rows as a prefill, and each row keeps its bits.
std::unique_ptr<train::DflashDrafter> dflash_drafter(const model::Model& target,
                                                     const std::vector<int32_t>& draft_vocab = {}) {
  train::DflashConfig cfg = dflash_config_for(
      target, static_cast<int64_t>(default_eagle_taps(target.config().n_layer).size()), 2, 8);
  cfg.ffn = 1 << 14;
  cfg.draft_vocab = draft_vocab;
  auto d = std::make_unique<train::DflashDrafter>(cfg, 0, cfg.block);
  d->init(13);
  copy_target_weights(target, *d);
  return d;
}

void dflash_batch_proposes_as_each_sequence_alone(const std::vector<int32_t>& draft_vocab) {
  Fixture f;
  const std::vector<int32_t> taps = default_eagle_taps(f.target->config().n_layer);
  const train::DflashConfig cfg = dflash_drafter(*f.target, draft_vocab)->config();
  ASSERT_GE(cfg.ffn * cfg.d, int64_t{1} << 20);
  DflashDraftBatch batch(cfg, f.pool, 4, kCtx, 16);
  std::vector<std::unique_ptr<DflashDraftSource>> batched, alone;
  for (size_t i = 0; i < kSequences; ++i) {
    batched.push_back(std::make_unique<DflashDraftSource>(dflash_drafter(*f.target, draft_vocab), taps,
                                                          f.pool, kCtx, *f.target, &batch));
    alone.push_back(std::make_unique<DflashDraftSource>(dflash_drafter(*f.target, draft_vocab), taps, f.pool,
                                                        kCtx, *f.target));
    const std::vector<float> t = taps_of(i, cfg.n_taps * cfg.d);
    batched[i]->set_taps(0, t);
    alone[i]->set_taps(0, t);
  }
  EXPECT_EQ(batched[0]->batch_group(), &batch);
  propose_rounds(batched, alone, static_cast<int>(cfg.block),
                 [&](const DflashDraftSource& b, const DflashDraftSource& a, const std::string& w) {
                   ASSERT_EQ(b.context_length(), a.context_length()) << w;
                   ASSERT_EQ(b.cache_length(), a.cache_length()) << w;
                   for (int64_t l = 0; l < cfg.n_layers; ++l) {
                     EXPECT_EQ(0, std::memcmp(b.cached_keys(l).data(), a.cached_keys(l).data(),
                                              a.cached_keys(l).size_bytes()))
                         << w << ": layer " << l << "'s keys differ";
                     EXPECT_EQ(0, std::memcmp(b.cached_values(l).data(), a.cached_values(l).data(),
                                              a.cached_values(l).size_bytes()))
                         << w << ": layer " << l << "'s values differ";
                   }
                 });
  EXPECT_EQ(batch.proposals(), 4);
  EXPECT_EQ(batch.widest(), 3);
  std::vector<int32_t> t = texts()[2];
  Draft one, other;
  batched[2]->begin(t, settings_of(1));
  alone[2]->begin(t, settings_of(1));
  batched[2]->propose(t, 8, one);
  alone[2]->propose(t, 8, other);
  expect_same_draft(one, other, "alone");
  for (size_t k = 0; k < one.tokens.size(); ++k)
    for (int32_t x : one.q[k].ids)
      EXPECT_TRUE(draft_vocab.empty() || std::binary_search(draft_vocab.begin(), draft_vocab.end(), x)) << x;
}

TEST(DrafterBatch, DflashBatchProposesAsEachSequenceAlone) {
  dflash_batch_proposes_as_each_sequence_alone({});
}

TEST(DrafterBatch, DflashBatchProposesAsEachSequenceAloneWithAReducedVocabulary) {
  dflash_batch_proposes_as_each_sequence_alone(every_fourth());
}

TEST(DrafterBatch, DflashBatchRefusesALongerContext) {
  Fixture f;
  const train::DflashConfig cfg = dflash_drafter(*f.target)->config();
  DflashDraftBatch batch(cfg, f.pool, 2, 64);
  try {
    DflashDraftSource s(dflash_drafter(*f.target), default_eagle_taps(f.target->config().n_layer), f.pool,
                        kCtx, *f.target, &batch);
    FAIL() << "a source of 256 positions joined a batch of 64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("longer than its batch's"), std::string::npos) << e.what();
  }
}

// The scheduler end to end.

std::vector<int32_t> collect(engine::Stream& s) {
  std::vector<int32_t> tokens;
  engine::Event ev;
  for (;;) {
    if (!s.next(ev, std::chrono::milliseconds(60000))) {
      ADD_FAILURE() << "no event within a minute";
      return tokens;
    }
    if (ev.kind != engine::Event::Kind::kToken) {
      EXPECT_NE(ev.finish, engine::Finish::kError) << ev.error;
      return tokens;
    }
    tokens.push_back(ev.token.id);
  }
}

// Eight greedy requests with prompts of 2 to 77 tokens, run at once; each one's tokens, in request order.
// With tree_nodes > 0 every sequence proposes token trees, verified whole (rows priced as free).
std::vector<std::vector<int32_t>> serve_all(model::Graph& graph, const model::Config& config, int max_draft,
                                            engine::DraftFactory drafts, engine::SchedulerStats* stats,
                                            int tree_nodes = 0) {
  engine::SchedulerOptions o;
  o.max_running = 8;
  o.max_waiting = 8;
  o.max_rows = 64;
  o.max_draft = max_draft;
  o.tree_nodes = tree_nodes;
  // Flat costs and no margin: every round drafts the deepest window.
  o.gate.margin = 0.0;
  o.gate.timing_samples = 1 << 30;
  if (tree_nodes > 0) o.costs = CostModel::linear(0.0, 0.0, 64);
  engine::SlotCachePool caches(config, kCtx, cache::KvType::kF16, o.max_running);
  engine::Scheduler s(graph, caches, nullptr, o, std::move(drafts));
  std::vector<std::shared_ptr<engine::Stream>> streams;
  for (int i = 0; i < 8; ++i) {
    engine::Request r;
    r.prompt = {1};
    for (int j = 0; j < 1 + i * 11; ++j)
      r.prompt.push_back(static_cast<int32_t>(260 + (i * 37 + j * 13) % 240));
    r.max_tokens = 24 + 3 * i;
    r.sampling.temperature = 0.0f;
    r.stop_at_eog = false;
    engine::Scheduler::Admit a{};
    std::string why;
    streams.push_back(s.submit(std::move(r), a, &why));
    EXPECT_EQ(a, engine::Scheduler::Admit::kOk) << why;
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& st : streams) out.push_back(st ? collect(*st) : std::vector<int32_t>{});
  s.stop();
  if (stats) *stats = s.stats();
  return out;
}

std::vector<std::vector<int32_t>> training_prompts(const model::Model& m) {
  auto tok = tokenizer::Tokenizer::from_gguf(m.file());
  const auto texts = default_training_prompts();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < 4; ++i) prompts.push_back(tok->encode(texts[i], true, false));
  return prompts;
}

// Briefly trained drafters of both kinds, saved as `tandem train-drafter` saves them (their proposals, not
// their quality, matter); trained once for every test that serves them.
struct Drafters {
  std::string target_hash, eagle_file, dflash_file;
  train::DrafterInfo eagle, dflash;
};

const Drafters& drafters(const model::Model& target, ThreadPool& pool) {
  static const Drafters d = [&] {
    Drafters r;
    r.target_hash = file_fingerprint(target_path());
    EagleTrainOptions eo;
    eo.prompts = training_prompts(target);
    eo.tokens = 256;
    eo.continuation = 64;
    eo.steps = 12;
    eo.unroll = 2;
    eo.seed = 3;
    EagleTrainResult eagle = train_eagle(target, pool, eo);
    r.eagle_file = drafter_fixture::save_trained(eagle, "drafter_batch_eagle.gguf");
    r.eagle = eagle.info;

    DflashTrainOptions dopt;
    dopt.data.prompts = training_prompts(target);
    dopt.data.tokens = 256;
    dopt.data.continuation = 64;
    dopt.data.seed = 5;
    dopt.steps = 12;
    dopt.seed = 5;
    dopt.block = 4;
    dopt.anchors = 8;
    DflashTrainResult dflash = train_dflash(target, pool, dopt);
    r.dflash_file = drafter_fixture::save_trained(dflash, "drafter_batch_dflash.gguf");
    r.dflash = dflash.info;
    return r;
  }();
  return d;
}

TEST(DrafterBatch, SchedulerWithBatchedDraftersEqualsPlainGreedy) {
  Fixture f;
  model::Graph graph(*f.target, f.pool, model::GraphOptions{64, 16});
  const auto plain = serve_all(graph, f.target->config(), 0, {}, nullptr);
  ASSERT_EQ(plain.size(), 8u);
  const Drafters& d = drafters(*f.target, f.pool);
  {
    EagleDraftBatch batch(eagle_config_of(d.eagle), f.pool, 8, kCtx, 64);
    engine::SchedulerStats stats;
    const auto spec = serve_all(
        graph, f.target->config(), 4,
        [&] { return EagleDraftSource::load(d.eagle_file, *f.target, d.target_hash, f.pool, kCtx, &batch); },
        &stats);
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_EQ(spec[i], plain[i]) << "request " << i << " with the batched EAGLE-3 drafter";
    EXPECT_GT(stats.accepted, 0u);
    EXPECT_GT(batch.proposals(), 0);
    EXPECT_GT(batch.widest(), 1) << "no two sequences ever drafted together";
  }
  {
    DflashDraftBatch batch(dflash_config_of(d.dflash), f.pool, 8, kCtx, 64);
    engine::SchedulerStats stats;
    const auto spec = serve_all(
        graph, f.target->config(), 4,
        [&] {
          return DflashDraftSource::load(d.dflash_file, *f.target, d.target_hash, f.pool, kCtx, &batch);
        },
        &stats);
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_EQ(spec[i], plain[i]) << "request " << i << " with the batched DFlash drafter";
    EXPECT_GT(stats.verify_windows, 0u);
    EXPECT_GT(batch.proposals(), 0);
    EXPECT_GT(batch.widest(), 1) << "no two sequences ever drafted together";
  }
}

// Tree rounds of a drafter that reads the target, seen from the scheduler's side.
struct TreeCounts {
  int trees = 0;   // proposals with a tree
  int rounds = 0;  // rounds settled (accept() calls)
  int moved = 0;   // tap rows a kept path moved (an accepted node past its parent's first child)
};

// Forwards every call to an EAGLE-3 or DFlash source and, after each round settles, checks its taps against
// those a plain target forward over the committed text gives: the scheduler's captures of its tree windows,
// moved along the accepted path (on_tree_kept), must equal the taps of that path decoded as a chain, bit for
// bit.
template <typename Source>
class TapChecked final : public DraftSource {
 public:
  TapChecked(std::unique_ptr<Source> inner, const model::Model& target, ThreadPool& pool, TreeCounts& counts)
      : inner_(std::move(inner)), target_(target), pool_(pool), counts_(counts) {}
  std::string_view kind() const override { return inner_->kind(); }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override {
    inner_->begin(prompt, settings);
  }
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override {
    inner_->propose(committed, max_depth, out);
  }
  void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) override {
    inner_->propose_tree(committed, max_nodes, max_depth, out);
    counts_.trees += out.tree.empty() ? 0 : 1;
  }
  bool follows_tree_rows() const override { return inner_->follows_tree_rows(); }
  void on_tree_kept(int64_t base, std::span<const int32_t> rows) override {
    for (size_t i = 0; i < rows.size(); ++i) counts_.moved += rows[i] != static_cast<int32_t>(i) ? 1 : 0;
    inner_->on_tree_kept(base, rows);
  }
  std::span<const int64_t> target_layers() const override { return inner_->target_layers(); }
  void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                        int64_t first_pos) override {
    inner_->on_target_hidden(layer, hidden, n_rows, first_pos);
  }
  void accept(std::span<const int32_t> committed, int n_accepted) override {
    inner_->accept(committed, n_accepted);
    ++counts_.rounds;
    const TapStore& got = inner_->tap_store();
    const auto n = static_cast<int64_t>(committed.size());
    ASSERT_EQ(got.length(), n - 1) << "the taps cover every committed token but the last";
    TapStore want(std::vector<int32_t>(got.layers().begin(), got.layers().end()), got.n_taps(), got.width(),
                  got.capacity(), "plain");
    // The plain forward's layers, each continuing where its previous chunk ended.
    std::vector<int64_t> done(got.layers().size(), 0);
    const model::CaptureFn fn = [&](int64_t layer, const float* h, int64_t rows) {
      for (size_t t = 0; t < got.layers().size(); ++t)
        if (got.layers()[t] == layer) {
          want.capture(layer, {h, static_cast<size_t>(rows * got.width())}, rows, done[t]);
          done[t] += rows;
        }
    };
    model::Session s(target_, pool_, model::SessionOptions{kCtx, cache::KvType::kF16});
    s.eval(committed.first(static_cast<size_t>(n - 1)), false, &fn);
    ASSERT_EQ(want.length(), n - 1);
    const std::span<const float> a = got.rows(0, n - 1), b = want.rows(0, n - 1);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size_bytes()))
        << "taps after " << n << " committed tokens differ from a plain forward's";
  }

 private:
  std::unique_ptr<Source> inner_;
  const model::Model& target_;
  ThreadPool& pool_;
  TreeCounts& counts_;
};

// Token trees from the hidden-state drafters in the scheduler, made with their batches as `serve` makes them
// (a tree sequence proposes alone): under 8 concurrent streams with prompts of 2 to 77 tokens, greedy output
// equals plain output request by request; every settled round leaves the drafter the taps of a plain forward
// over the committed text; and the verified nodes are counted in tandem_tree_nodes_verified_total.
TEST(DrafterBatch, SchedulerTreesFromHiddenStateDraftersEqualPlainGreedy) {
  Fixture f;
  model::Graph graph(*f.target, f.pool, model::GraphOptions{64, 16});
  const auto plain = serve_all(graph, f.target->config(), 0, {}, nullptr);
  ASSERT_EQ(plain.size(), 8u);
  const Drafters& d = drafters(*f.target, f.pool);
  auto check = [&](const char* name, const engine::SchedulerStats& stats,
                   const std::vector<std::vector<int32_t>>& out, const TreeCounts& counts) {
    SCOPED_TRACE(name);
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(out[i], plain[i]) << "request " << i;
    EXPECT_GT(counts.trees, 0);
    EXPECT_GE(counts.rounds, counts.trees) << "every verified tree settles a round";
    EXPECT_GT(counts.moved, 0) << "no accepted path ran through a node past its parent's first child";
    EXPECT_GT(stats.tree_nodes, 0u);
    EXPECT_LE(stats.tree_nodes, stats.drafted);
    EXPECT_GT(stats.accepted, 0u);
    EXPECT_LT(stats.accepted, stats.tree_nodes) << "some nodes were rejected";
    const std::string metrics = server::Metrics().render(stats);
    EXPECT_NE(metrics.find("tandem_tree_nodes_verified_total " + std::to_string(stats.tree_nodes) + "\n"),
              std::string::npos)
        << metrics;
  };
  {
    EagleDraftBatch batch(eagle_config_of(d.eagle), f.pool, 8, kCtx, 64);
    TreeCounts counts;
    engine::SchedulerStats stats;
    const auto out = serve_all(
        graph, f.target->config(), 6,
        [&] {
          return std::make_unique<TapChecked<EagleDraftSource>>(
              EagleDraftSource::load(d.eagle_file, *f.target, d.target_hash, f.pool, kCtx, &batch), *f.target,
              f.pool, counts);
        },
        &stats, 10);
    check("EAGLE-3", stats, out, counts);
  }
  {
    DflashDraftBatch batch(dflash_config_of(d.dflash), f.pool, 8, kCtx, 64);
    TreeCounts counts;
    engine::SchedulerStats stats;
    const auto out = serve_all(
        graph, f.target->config(), 4,
        [&] {
          return std::make_unique<TapChecked<DflashDraftSource>>(
              DflashDraftSource::load(d.dflash_file, *f.target, d.target_hash, f.pool, kCtx, &batch),
              *f.target, f.pool, counts);
        },
        &stats, 8);
    check("DFlash", stats, out, counts);
  }
}

}  // namespace
}  // namespace tandem::speculative
