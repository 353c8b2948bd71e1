// The settle step (speculative/settle.h) without a model: logits are written by hand, the cache is a small
// geometry of its own, and the gate and drafter are checked against what the step must have told them.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "alloc_counter.inc"  // g_allocations, TANDEM_COUNTS_ALLOCATIONS
#include "tandem/cache/kv_cache.h"
#include "tandem/sampling/sampler.h"
#include "tandem/speculative/settle.h"

namespace tandem::speculative {
namespace {

constexpr int64_t kVocab = 8;

cache::Geometry tiny_geometry() {
  cache::Geometry g;
  g.n_layer = 1;
  g.n_head_kv = 1;
  g.head_dim = g.head_dim_v = 4;
  return g;
}

// Logit rows [targets.size(), kVocab], row i peaked at targets[i].
std::vector<float> peaked(const std::vector<int32_t>& targets) {
  std::vector<float> logits(targets.size() * kVocab, 0.0f);
  for (size_t i = 0; i < targets.size(); ++i) logits[i * kVocab + static_cast<size_t>(targets[i])] = 5.0f;
  return logits;
}

// Remembers what the settle step told it; `kept` is reserved so that accept() does not allocate.
class RecordingSource final : public DraftSource {
 public:
  RecordingSource() { kept.reserve(1024); }
  std::string_view kind() const override { return "recording"; }
  void begin(std::span<const int32_t>, const DraftSettings&) override {}
  void propose(std::span<const int32_t>, int, Draft& out) override { out.clear(); }
  void accept(std::span<const int32_t> committed, int n_accepted) override {
    kept.assign(committed.begin(), committed.end());
    accepted = n_accepted;
    ++calls;
  }
  std::vector<int32_t> kept;
  int accepted = -1;
  int calls = 0;
};

sampling::Sampler greedy() {
  sampling::Params p;
  p.temperature = 0.0f;
  return sampling::Sampler(p);
}

Gate fresh_gate() {
  return Gate(GateSettings{}, CostModel::linear(0.1, 0.0), 8);
}

struct Committed {
  int32_t token;
  int row;
};

// The target ran [5, 6, 7, 2] after 1 2 3 4 (cache: 4 + 4 positions); it agrees with 6 and 7, not with 2.
TEST(SpeculativeSettle, CommitsTheAcceptedPrefixTruncatesAndTeachesGateAndDrafter) {
  cache::KvCache cache(tiny_geometry(), 64, cache::KvType::kF16);
  std::vector<int32_t> committed = {1, 2, 3, 4, 5};
  const std::vector<int32_t> drafts = {6, 7, 2};
  cache.prepare_append(0, static_cast<int64_t>(committed.size() + drafts.size()));
  const std::vector<float> logits = peaked({6, 7, 3, 1});
  sampling::Sampler sampler = greedy();
  Gate gate = fresh_gate();
  RecordingSource source;
  Settler settler;
  std::vector<Committed> seen;
  const SettleOutcome out = settler.settle(
      {logits, drafts, {}}, {committed, sampler, 9, cache, &gate, &source}, [&](int32_t token, int row) {
        seen.push_back({token, row});
        return true;
      });
  EXPECT_EQ(out.drafted, 3);
  EXPECT_EQ(out.accepted, 2);
  EXPECT_EQ(out.committed, 3);
  EXPECT_FALSE(out.stopped);
  EXPECT_EQ(committed, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 3}));
  ASSERT_EQ(seen.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(seen[static_cast<size_t>(i)].token, committed[5 + static_cast<size_t>(i)]);
    EXPECT_EQ(seen[static_cast<size_t>(i)].row, i);
  }
  // The rows of 5, 6 and 7 stay; the row of the rejected 2 goes; the new pending 3 is not in the cache.
  EXPECT_EQ(cache.length(), 7);
  EXPECT_EQ(source.calls, 1);
  EXPECT_EQ(source.kept, committed);
  EXPECT_EQ(source.accepted, 2);
  Gate reference = fresh_gate();
  reference.record_round(3, 2);
  const Gate untouched = fresh_gate();
  for (int i = 1; i <= 3; ++i)
    EXPECT_DOUBLE_EQ(gate.acceptance(i), reference.acceptance(i)) << "position " << i;
  EXPECT_NE(gate.acceptance(3), untouched.acceptance(3));
}

// A sequence that ends on its first accepted draft keeps only that draft, in the text and in the cache.
TEST(SpeculativeSettle, AnEndingSequenceKeepsOnlyWhatItCommitted) {
  cache::KvCache cache(tiny_geometry(), 64, cache::KvType::kF16);
  std::vector<int32_t> committed = {1, 2, 3, 4, 5};
  const std::vector<int32_t> drafts = {6, 7, 2};
  cache.prepare_append(0, static_cast<int64_t>(committed.size() + drafts.size()));
  const std::vector<float> logits = peaked({6, 7, 3, 1});
  sampling::Sampler sampler = greedy();
  RecordingSource source;
  Settler settler;
  int calls = 0;
  const SettleOutcome out =
      settler.settle({logits, drafts, {}}, {committed, sampler, 9, cache, nullptr, &source},
                     [&](int32_t, int) { return ++calls < 1; });
  EXPECT_TRUE(out.stopped);
  EXPECT_EQ(out.accepted, 2);
  EXPECT_EQ(out.committed, 1);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(committed, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(cache.length(), 5);
  EXPECT_EQ(source.kept, committed);
  EXPECT_EQ(source.accepted, 1);
}

// A plain step (no drafts) draws exactly the token Sampler::sample draws at that position, so a sequence's
// tokens do not depend on whether it speculates; the gate records an idle round.
TEST(SpeculativeSettle, PlainStepsDrawWhatTheSamplerDraws) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  sampling::Params params;  // temperature 0.8, top-k, top-p, min-p
  params.repeat_penalty = 1.1f;
  int differ_from_argmax = 0;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    params.seed = seed;
    sampling::Sampler sampler(params), reference(params);
    std::vector<float> logits(kVocab);
    for (float& x : logits) x = normal(rng);
    std::vector<int32_t> committed = {3, 1, 4, 1, 5};
    const std::vector<int32_t> history = committed;
    cache::KvCache cache(tiny_geometry(), 64, cache::KvType::kF16);
    cache.prepare_append(0, static_cast<int64_t>(committed.size()));
    Gate gate = fresh_gate();
    Settler settler;
    const SettleOutcome out = settler.settle({logits, {}, {}}, {committed, sampler, 7, cache, &gate, nullptr},
                                             [](int32_t, int) { return true; });
    const int32_t want = reference.sample(logits, history, 7, history.size());
    EXPECT_EQ(out.drafted, 0);
    EXPECT_EQ(out.committed, 1);
    ASSERT_EQ(committed.size(), history.size() + 1);
    EXPECT_EQ(committed.back(), want) << "seed " << seed;
    EXPECT_EQ(cache.length(), static_cast<int64_t>(history.size()));
    differ_from_argmax += want != sampling::argmax(logits) ? 1 : 0;
    Gate idle = fresh_gate();
    idle.record_idle();
    EXPECT_EQ(gate.probe_interval(), idle.probe_interval());
  }
  EXPECT_GT(differ_from_argmax, 0) << "the draws never left the argmax: the comparison proves nothing";
}

// Once its buffers have grown to the deepest window, a settle step allocates nothing.
TEST(SpeculativeSettle, SteadyRoundsDoNotAllocate) {
  if (!TANDEM_COUNTS_ALLOCATIONS) GTEST_SKIP() << "allocation counting is off under AddressSanitizer";
  cache::KvCache cache(tiny_geometry(), 256, cache::KvType::kF16);
  std::vector<int32_t> committed = {1, 2, 3};
  committed.reserve(256);
  sampling::Params params;
  sampling::Sampler sampler(params);
  Gate gate = fresh_gate();
  RecordingSource source;
  Settler settler;
  const std::vector<int32_t> drafts = {4, 5, 6, 7};
  const std::vector<float> logits = peaked({4, 5, 0, 1, 2});
  cache.prepare_append(0, static_cast<int64_t>(committed.size()) - 1);
  auto round = [&] {
    const auto n = static_cast<int64_t>(committed.size());
    cache.prepare_append(n - 1, n + static_cast<int64_t>(drafts.size()));
    settler.settle({logits, drafts, {}}, {committed, sampler, 3, cache, &gate, &source},
                   [](int32_t, int) { return true; });
  };
  round();
  const size_t before = g_allocations.load();
  for (int i = 0; i < 8; ++i) round();
  EXPECT_EQ(g_allocations.load() - before, 0u);
  EXPECT_GE(committed.size(), 3u + 9u);
}

}  // namespace
}  // namespace tandem::speculative
