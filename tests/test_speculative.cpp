// Unit tests of the speculative pieces that need no model run: verification (greedy and rejection sampling),
// the adaptive gate, n-gram lookup, the replay drafter, the vocabulary check and the calibration cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "tandem/gguf/reader.h"
#include "tandem/model/model.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/cost_curve.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/gate.h"
#include "tandem/speculative/ngram.h"
#include "tandem/speculative/replay.h"
#include "tandem/speculative/verify.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem::speculative {
namespace {

using sampling::Distribution;

Distribution dist(std::vector<int32_t> ids, std::vector<float> probs) {
  Distribution d;
  d.ids = std::move(ids);
  d.probs = std::move(probs);
  return d;
}

// Upper quantile of chi-square with k degrees of freedom at false-alarm rate 1e-4 (Wilson-Hilferty; within a
// few percent of the exact value for k >= 2).
double chi2_critical_1e4(int k) {
  const double z = 3.7190;  // standard normal upper 1e-4 quantile
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

TEST(SpeculativeVerify, GreedyAcceptsMatchingPrefixThenTargetToken) {
  sampling::Params params;
  params.temperature = 0.0f;
  sampling::Sampler sampler(params);
  std::vector<Distribution> p = {dist({5}, {1}), dist({7}, {1}), dist({9}, {1}), dist({11}, {1})};
  VerifyScratch scratch;
  const std::vector<int32_t> all_match = {5, 7, 9};
  auto out = verify(all_match, p, {}, sampler, 0, 10, scratch);
  EXPECT_EQ(out.accepted, 3);
  EXPECT_EQ(out.token, 11);  // bonus
  const std::vector<int32_t> second_wrong = {5, 8, 9};
  out = verify(second_wrong, p, {}, sampler, 0, 10, scratch);
  EXPECT_EQ(out.accepted, 1);
  EXPECT_EQ(out.token, 7);  // the target's correction
  out = verify({}, std::span<const Distribution>(p.data(), 1), {}, sampler, 0, 10, scratch);
  EXPECT_EQ(out.accepted, 0);
  EXPECT_EQ(out.token, 5);
}

// Rejection sampling must commit tokens distributed as p, whatever q is (sampled drafts) and for
// deterministic drafts. Checked by chi-square over many RNG keys with the draft drawn from q by the same
// counter-based RNG.
void check_first_token_follows_p(const Distribution& p, const Distribution* q, int32_t fixed_draft) {
  sampling::Params params;
  params.temperature = 1.0f;
  params.seed = 1234;
  sampling::Sampler sampler(params);
  VerifyScratch scratch;
  std::vector<Distribution> ps = {p, p};
  std::map<int32_t, int> counts;
  const int n = 40000;
  for (int s = 0; s < n; ++s) {
    const uint64_t pos = 100;
    const int32_t x = q ? sampler.draw(*q, static_cast<uint64_t>(s), pos, kDrawDraft) : fixed_draft;
    const std::vector<int32_t> drafts = {x};
    std::vector<Distribution> qs;
    if (q) qs.push_back(*q);
    const auto out = verify(drafts, ps, qs, sampler, static_cast<uint64_t>(s), pos, scratch);
    ++counts[out.accepted == 1 ? x : out.token];
  }
  double chi2 = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double expected = n * p.probs[i];
    const double observed = counts[p.ids[i]];
    chi2 += (observed - expected) * (observed - expected) / expected;
    counts.erase(p.ids[i]);
  }
  EXPECT_TRUE(counts.empty()) << "a token outside p's support was committed";
  EXPECT_LT(chi2, chi2_critical_1e4(static_cast<int>(p.ids.size()) - 1));
}

TEST(SpeculativeVerify, RejectionSamplingPreservesTheTargetDistribution) {
  const Distribution p = dist({1, 2, 3, 4}, {0.1f, 0.2f, 0.3f, 0.4f});
  const Distribution q = dist({0, 2, 3, 4}, {0.4f, 0.3f, 0.2f, 0.1f});  // includes a token p lacks
  check_first_token_follows_p(p, &q, -1);
  check_first_token_follows_p(p, nullptr, 3);  // deterministic draft inside p
  check_first_token_follows_p(p, nullptr, 7);  // deterministic draft outside p
}

TEST(SpeculativeVerify, AcceptanceProbability) {
  const Distribution p = dist({1, 2}, {0.25f, 0.75f});
  const Distribution q = dist({1, 2}, {0.5f, 0.5f});
  EXPECT_DOUBLE_EQ(acceptance_probability(1, p, &q), 0.5);
  EXPECT_DOUBLE_EQ(acceptance_probability(2, p, &q), 1.0);
  EXPECT_DOUBLE_EQ(acceptance_probability(2, p, nullptr), 0.75);
  EXPECT_DOUBLE_EQ(acceptance_probability(3, p, nullptr), 0.0);
}

TEST(SpeculativeGate, DraftsDeepWhenAcceptanceIsHighAndCheap) {
  GateSettings s;
  Gate gate(s, CostModel::linear(0.05, 0.0), 8);
  for (int i = 0; i < 50; ++i) gate.record_round(8, 8);
  EXPECT_EQ(gate.decide(8).depth, 8);
  EXPECT_EQ(gate.decide(3).depth, 3);  // capped by the limit
  EXPECT_GT(gate.acceptance(1), 0.95);
}

TEST(SpeculativeGate, StopsDraftingWhenNothingIsAcceptedThenProbesWithBackoff) {
  GateSettings s;
  s.probe_interval = 4;
  s.max_probe_interval = 16;
  Gate gate(s, CostModel::linear(0.3, 0.1), 4);
  for (int i = 0; i < 40; ++i) gate.record_round(4, 0);
  EXPECT_EQ(gate.best_depth(4), 0);
  std::vector<int> probe_rounds;
  for (int round = 1; round <= 60; ++round) {
    const auto d = gate.decide(4);
    EXPECT_EQ(d.depth, 0);
    if (d.probe) {
      probe_rounds.push_back(round);
      const double rejected[] = {0.0};
      gate.record(rejected);
    } else {
      gate.record_idle();
    }
  }
  // Intervals 4, 8, 16, 16, ...
  ASSERT_GE(probe_rounds.size(), 4u);
  EXPECT_EQ(probe_rounds[0], 4);
  EXPECT_EQ(probe_rounds[1], 12);
  EXPECT_EQ(probe_rounds[2], 28);
  EXPECT_EQ(probe_rounds[3], 44);
}

TEST(SpeculativeGate, ExpectedRateFollowsTheFormula) {
  GateSettings s;
  s.prior_accepted = 8;
  s.prior_rejected = 2;  // 0.8 at every position
  CostModel c;
  c.verify = {1.0, 1.0, 1.2, 1.3};
  c.draft_per_token = 0.1;
  Gate gate(s, c, 3);
  EXPECT_NEAR(gate.expected_rate(2), (1 + 0.8 + 0.64) / (1.3 + 0.2), 1e-12);
  EXPECT_NEAR(c.verify_cost(5), 1.5, 1e-12);  // linear extrapolation
  // Idle decay keeps the rates.
  for (int i = 0; i < 100; ++i) gate.record_idle();
  EXPECT_NEAR(gate.acceptance(1), 0.8, 1e-9);
  // A fresh observation now weighs more than the decayed prior.
  gate.record_round(1, 0);
  EXPECT_LT(gate.acceptance(1), 0.5);
}

// Timed forwards replace the calibrated costs once one row and r rows have enough timings: a calibration
// that priced 2 rows at 1.05 steps has the gate drafting at 30% acceptance (1.3 / 1.05 tokens per step), but
// 2-row forwards timed at 1.35x the one-row ones stop it (1.3 / 1.35). Row counts not timed keep their
// calibrated cost, and a stall weighs as three times the mean at most.
TEST(SpeculativeGate, TimedForwardsReplaceTheCalibratedCosts) {
  GateSettings s;
  s.prior_accepted = 3;
  s.prior_rejected = 7;  // 0.3 at every position
  Gate gate(s, CostModel::linear(0.05, 0.0), 1);
  EXPECT_EQ(gate.best_depth(1), 1);
  for (int i = 0; i + 1 < s.timing_samples; ++i) {
    gate.record_forward(1, 0.010);
    gate.record_forward(2, 0.0135);
  }
  EXPECT_NEAR(gate.costs().verify_cost(2), 1.05, 1e-12);  // too few timings yet
  gate.record_forward(1, 0.010);
  gate.record_forward(2, 0.0135);
  EXPECT_NEAR(gate.costs().verify_cost(2), 1.35, 1e-9);
  // 3 rows, not timed, cost no less than the 2 timed ones (the calibrated 1.10 would be a dip); wider
  // windows keep the calibration, which lies above.
  EXPECT_NEAR(gate.costs().verify_cost(3), 1.35, 1e-9);
  EXPECT_NEAR(gate.costs().verify_cost(9), 1.40, 1e-12);
  EXPECT_EQ(gate.best_depth(1), 0);
  // One stalled one-row forward (1 s) moves the mean by the weight times at most twice it.
  gate.record_forward(1, 1.0);
  EXPECT_NEAR(gate.costs().verify_cost(2), 0.0135 / (0.010 + s.timing_weight * 0.020), 1e-9);
  // Rows past what a round takes, and nonsense timings, are ignored.
  gate.record_forward(3, 0.5);
  gate.record_forward(2, -1.0);
  EXPECT_NEAR(gate.costs().verify_cost(2), 0.0135 / (0.010 + s.timing_weight * 0.020), 1e-9);
}

// Timings never make a wider forward look cheaper than a narrower one: a timed ratio below the one of fewer
// rows is pooled with it (their mean), and the calibrated entries between timed row counts are clamped
// between them. When the timings recover, the calibrated curve comes back.
TEST(SpeculativeGate, TimedCostsStayMonotone) {
  GateSettings s;
  s.timing_samples = 1;
  CostModel c;
  c.verify = {1.0, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2};
  Gate gate(s, c, 5);  // times 1..6 rows
  gate.record_forward(1, 1.0);
  gate.record_forward(2, 1.5);
  gate.record_forward(3, 1.3);  // a dip: pooled with 2 rows
  gate.record_forward(5, 1.7);
  const auto& v = gate.costs().verify;
  EXPECT_NEAR(v[2], 1.4, 1e-12);
  EXPECT_NEAR(v[3], 1.4, 1e-12);
  EXPECT_NEAR(v[4], 1.6, 1e-12);  // calibrated, between the timed 1.4 and 1.7
  EXPECT_NEAR(v[5], 1.7, 1e-12);
  EXPECT_NEAR(v[6], 2.0, 1e-12);
  for (size_t r = 2; r < v.size(); ++r) EXPECT_GE(v[r], v[r - 1]) << r;
  // 4 rows timed low: the calibrated entry is not used, and the fit pools it with its neighbours.
  gate.record_forward(4, 1.0);
  for (size_t r = 2; r < v.size(); ++r) EXPECT_GE(v[r], v[r - 1]) << r;
  EXPECT_NEAR(v[2], (1.5 + 1.3 + 1.0) / 3, 1e-12);
  // The timings recover (weight 0.1 of the newest): the dips go, and 3 rows are back above 2.
  for (int i = 0; i < 200; ++i) {
    gate.record_forward(1, 1.0);
    gate.record_forward(3, 1.55);
    gate.record_forward(4, 1.6);
  }
  EXPECT_NEAR(v[2], 1.5, 1e-9);
  EXPECT_NEAR(v[3], 1.55, 1e-6);
  EXPECT_NEAR(v[4], 1.6, 1e-6);
}

// A position the gate has not drafted to assumes the acceptance of the one before it, not the prior's: after
// rounds that accept both of 2 drafts, depths 3 and 4 look as good as 2 and the gate drafts 4 (with the fixed
// prior of 0.6 there it would stop at 3: E(3) / C(3) = 3.6 / 1.6 against E(4) / C(4) = 3.96 / 1.8).
// Rejections carry down the same way.
TEST(SpeculativeGate, UnobservedPositionsFollowTheOneBefore) {
  GateSettings s;  // prior 3 / 2
  Gate gate(s, CostModel::linear(0.2, 0.0), 4);
  EXPECT_NEAR(gate.acceptance(3), 0.6, 1e-12);
  for (int i = 0; i < 60; ++i) gate.record_round(2, 2);
  EXPECT_GT(gate.acceptance(2), 0.99);
  EXPECT_NEAR(gate.acceptance(3), gate.acceptance(2), 1e-12);
  EXPECT_NEAR(gate.acceptance(4), gate.acceptance(2), 1e-12);
  EXPECT_EQ(gate.decide(4).depth, 4);
  // Position 3, once observed, follows its own evidence.
  for (int i = 0; i < 60; ++i) gate.record_round(3, 2);
  EXPECT_LT(gate.acceptance(3), 0.01);
  EXPECT_LT(gate.acceptance(4), 0.01);
  EXPECT_EQ(gate.decide(4).depth, 2);

  Gate low(s, CostModel::linear(0.2, 0.0), 4);
  for (int i = 0; i < 60; ++i) low.record_round(1, 0);
  EXPECT_LT(low.acceptance(2), 0.01);
  EXPECT_EQ(low.best_depth(4), 0);
}

// The gate's settings are flags of run (and bench-spec, serve): bad values are refused naming the flags, and
// any valid gate leaves greedy output as it is without speculation.
TEST(SpeculativeGate, SettingsAreFlags) {
  const std::string run = std::string(TANDEM_BINARY) + " run -m '" +
                          testing::shared_path("models/stories260K.gguf") +
                          "' -t 1 --temp 0 -n 24 -p 'Once upon a time'";
  auto [bad, bad_rc] = testing::run_command(run + " --draft ngram --gate-decay 0 2>&1");
  EXPECT_NE(bad_rc, 0);
  EXPECT_NE(bad.find("--gate-"), std::string::npos) << bad;
  std::tie(bad, bad_rc) =
      testing::run_command(run + " --draft ngram --gate-probe-interval 9 --gate-max-probe-interval 8 2>&1");
  EXPECT_NE(bad_rc, 0);
  EXPECT_NE(bad.find("probe interval"), std::string::npos) << bad;
  const auto [plain, plain_rc] = testing::run_command(run + " 2>/dev/null");
  ASSERT_EQ(plain_rc, 0) << plain;
  EXPECT_GT(plain.size(), 20u);
  const auto [gated, gated_rc] = testing::run_command(
      run + " --draft ngram --gate-margin 0 --gate-prior-accepted 9 --gate-prior-rejected 1 " +
      "--gate-decay 0.5 --gate-idle-decay 0.5 --gate-probe-interval 1 --gate-probe-depth 2 2>/dev/null");
  ASSERT_EQ(gated_rc, 0) << gated;
  EXPECT_EQ(plain, gated);
}

// In a batch, draft rows slow the forward for every sequence: the same acceptance that pays alone does not
// pay among 8 decoding sequences when each extra row costs 0.45 of a step.
TEST(SpeculativeGate, BatchCostsChargeTheWholeBatch) {
  GateSettings s;
  s.prior_accepted = 8;
  s.prior_rejected = 2;  // 0.8 at every position
  const CostModel c = CostModel::linear(0.45, 0.0);
  EXPECT_NEAR(c.round_cost(2, 1), c.verify_cost(3), 1e-12);
  // 1 + 8 * (verify(10) - verify(8)) / verify(8) = 1 + 8 * 0.9 / 4.15
  EXPECT_NEAR(c.round_cost(2, 8), 1.0 + 8 * 0.9 / 4.15, 1e-12);
  Gate gate(s, c, 4);
  EXPECT_GT(gate.decide(4, 1).depth, 0);
  EXPECT_EQ(gate.best_depth(4, 8), 0);
  // Nearly free extra rows (a memory-bound machine) keep drafting under load.
  Gate cheap(s, CostModel::linear(0.02, 0.0), 4);
  EXPECT_GT(cheap.best_depth(4, 8), 0);
}

TEST(SpeculativeGate, RejectsBadSettings) {
  GateSettings s;
  s.decay = 0;
  EXPECT_THROW(Gate(s, CostModel::linear(0.1, 0), 4), Error);
  EXPECT_THROW(Gate(GateSettings{}, CostModel::linear(0.1, 0), 4, 5), Error);
  GateSettings t;
  t.timing_weight = 0;
  EXPECT_THROW(Gate(t, CostModel::linear(0.1, 0), 4), Error);
  t.timing_weight = 0.1;
  t.timing_samples = 0;
  EXPECT_THROW(Gate(t, CostModel::linear(0.1, 0), 4), Error);
}

TEST(SpeculativeNgram, LongestMostRecentMatchAndPeriodicExtension) {
  NgramSource src({1, 3});
  Draft d;
  // "1 2 3 9 ... 1 2 3" : the 3-gram 1 2 3 matched at 0 proposes 9 8.
  const std::vector<int32_t> text = {1, 2, 3, 9, 8, 5, 2, 3, 7, 1, 2, 3};
  src.propose(text, 2, d);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{9, 8}));
  EXPECT_FALSE(d.sampled);
  // Only the 2-gram "2 3" matches most recently at index 6: proposes 7.
  const std::vector<int32_t> text2 = {2, 3, 9, 4, 2, 3, 7, 5, 2, 3};
  src.propose(text2, 1, d);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{7}));
  // A repeating pattern continues through the proposal itself.
  const std::vector<int32_t> loop = {4, 5, 4, 5};
  src.propose(loop, 5, d);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{4, 5, 4, 5, 4}));
  // No match: an empty proposal.
  const std::vector<int32_t> fresh = {1, 2, 3};
  src.propose(fresh, 4, d);
  EXPECT_TRUE(d.tokens.empty());
  EXPECT_THROW(NgramSource({3, 2}), Error);
}

TEST(SpeculativeReplay, CorruptsAtTheRequestedRate) {
  ReplaySource src(0.7, 512, 9);
  std::vector<int32_t> ref(2000);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<int32_t>(i % 512);
  src.set_reference(ref);
  src.begin(std::span<const int32_t>(ref.data(), 1), {});
  Draft d;
  int same = 0, total = 0;
  for (size_t start = 1; start + 8 < ref.size(); start += 8) {
    src.propose(std::span<const int32_t>(ref.data(), start), 8, d);
    ASSERT_EQ(d.tokens.size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
      same += d.tokens[i] == ref[start + i];
      ASSERT_GE(d.tokens[i], 0);
      ASSERT_LT(d.tokens[i], 512);
    }
    total += 8;
  }
  EXPECT_NEAR(static_cast<double>(same) / total, 0.7, 0.04);
  src.propose(ref, 4, d);  // past the reference: nothing to replay
  EXPECT_TRUE(d.tokens.empty());
}

// Which of the first 64 proposals of 8 tokens each keep the reference, after a begin().
std::vector<bool> replay_pattern(ReplaySource& src, const std::vector<int32_t>& ref) {
  src.set_reference(ref);
  src.begin(std::span<const int32_t>(ref.data(), 1), {});
  std::vector<bool> kept;
  Draft d;
  for (size_t start = 1; start <= 1 + 63 * 8; start += 8) {
    src.propose(std::span<const int32_t>(ref.data(), start), 8, d);
    EXPECT_EQ(d.tokens.size(), 8u);
    for (size_t i = 0; i < d.tokens.size(); ++i) kept.push_back(d.tokens[i] == ref[start + i]);
  }
  return kept;
}

// The same prompt generated again, or under another seed, meets other corruptions (a benchmark over prompts
// or seeds then averages independent draws), and the same seed and generation repeat exactly.
TEST(SpeculativeReplay, EachGenerationAndSeedDrawsAnew) {
  std::vector<int32_t> ref(1000);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<int32_t>(i % 512);
  ReplaySource a(0.5, 512, 1), b(0.5, 512, 1);
  const auto first = replay_pattern(a, ref);
  EXPECT_EQ(first, replay_pattern(b, ref));
  EXPECT_NE(first, replay_pattern(a, ref));  // a's second generation
  b.set_seed(2);
  EXPECT_NE(replay_pattern(b, ref), replay_pattern(a, ref));  // both in their third generation
}

// A vocabulary-only GGUF v3 file in memory.
struct VocabFile {
  std::vector<uint8_t> bytes;
  void u32(uint32_t v) {
    bytes.insert(bytes.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 4);
  }
  void u64(uint64_t v) {
    bytes.insert(bytes.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 8);
  }
  void str(const std::string& s) {
    u64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  VocabFile(const std::vector<std::string>& tokens, int bos) {
    u32(0x46554747);  // "GGUF"
    u32(3);
    u64(0);  // tensors
    u64(3);  // metadata entries
    str("tokenizer.ggml.tokens");
    u32(9);  // array
    u32(8);  // of strings
    u64(tokens.size());
    for (const auto& t : tokens) str(t);
    str("tokenizer.ggml.token_type");
    u32(9);
    u32(5);  // of i32
    u64(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) u32(1);
    str("tokenizer.ggml.bos_token_id");
    u32(4);  // u32
    u32(static_cast<uint32_t>(bos));
    while (bytes.size() % 32) bytes.push_back(0);
  }
  gguf::File parse() const { return gguf::File::parse(bytes.data(), bytes.size(), "vocab"); }
};

TEST(SpeculativeVocabulary, NamesTheFirstDifference) {
  const VocabFile a({"<s>", "a", "b", "c"}, 0), same({"<s>", "a", "b", "c"}, 0);
  const VocabFile text({"<s>", "a", "x", "c"}, 0), size({"<s>", "a", "b"}, 0), bos({"<s>", "a", "b", "c"}, 1);
  const auto fa = a.parse();
  EXPECT_EQ(vocabulary_difference(fa, same.parse()), "");
  EXPECT_EQ(vocabulary_difference(fa, text.parse()),
            "token 2 is \"b\" in the target but \"x\" in the draft model");
  EXPECT_EQ(vocabulary_difference(fa, size.parse()), "the target has 4 tokens, the draft model 3");
  EXPECT_EQ(vocabulary_difference(fa, bos.parse()),
            "tokenizer.ggml.bos_token_id is 0 in the target but 1 in the draft model");
}

TEST(SpeculativeVocabulary, RefusesAModelWithAnotherVocabulary) {
  const auto target = model::Model::load(testing::shared_path("models/stories260K.gguf"));
  const auto good = model::Model::load(testing::shared_path("models/llama2xs-tok512.gguf"));
  const auto other = model::Model::load(testing::shared_path("models/synth/synth-qwen2-d64-Q8_0.gguf"));
  EXPECT_NO_THROW(check_same_vocabulary(*target, *good));
  try {
    check_same_vocabulary(*target, *other);
    FAIL() << "a draft model with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary differs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokens"), std::string::npos) << e.what();
  }
}

// Pool-adjacent violators: a monotone input comes back unchanged, and each run that breaks the order becomes
// its mean (the least-squares non-decreasing fit), merging backwards as far as needed.
TEST(SpeculativeCostCurve, NondecreasingFitRemovesDips) {
  const std::vector<double> monotone = {1.0, 1.26, 1.26, 1.35, 2.28, 4.15};
  EXPECT_EQ(nondecreasing(monotone), monotone);
  EXPECT_TRUE(nondecreasing(std::vector<double>{}).empty());
  // The curve of the report: cost(3) dipped under cost(2).
  const auto fit = nondecreasing(std::vector<double>{1.0, 1.26, 1.09, 1.35});
  ASSERT_EQ(fit.size(), 4u);
  EXPECT_DOUBLE_EQ(fit[0], 1.0);
  EXPECT_NEAR(fit[1], (1.26 + 1.09) / 2, 1e-12);
  EXPECT_NEAR(fit[2], (1.26 + 1.09) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(fit[3], 1.35);
  // A low value after a merged block merges with it as well: 3, 1 -> 2, 2; then 0 -> all of them, 4/3.
  const auto back = nondecreasing(std::vector<double>{1.0, 3.0, 1.0, 0.0, 5.0});
  const std::vector<double> want = {1.0, 4.0 / 3, 4.0 / 3, 4.0 / 3, 5.0};
  ASSERT_EQ(back.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(back[i], want[i], 1e-12) << i;
  // The fit keeps the sum (least squares with weights 1) and is monotone.
  const std::vector<double> noisy = {1.0, 1.3, 1.1, 1.5, 1.4, 1.45, 2.0, 1.9, 3.0};
  const auto f = nondecreasing(noisy);
  double a = 0, b = 0;
  for (size_t i = 0; i < noisy.size(); ++i) {
    a += noisy[i];
    b += f[i];
    if (i > 0) {
      EXPECT_GE(f[i], f[i - 1]);
    }
  }
  EXPECT_NEAR(a, b, 1e-12);
}

TEST(SpeculativeCostCurve, WidthsAreDenseThenSparse) {
  EXPECT_EQ(calibration_widths(1), (std::vector<int>{1}));
  EXPECT_EQ(calibration_widths(4), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(calibration_widths(17),
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(calibration_widths(40),
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 40}));
  EXPECT_EQ(calibration_widths(64),
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 48, 64}));
  EXPECT_EQ(calibration_widths(100).back(), 100);
  EXPECT_THROW(calibration_widths(0), Error);
}

// The dense curve is linear between measured widths and hits them exactly; past its end the cost model
// follows the last measured segment, not the last two (interpolated) entries, and never falls.
TEST(SpeculativeCostCurve, InterpolatesAndExtrapolatesAlongTheLastSegment) {
  const std::vector<int> widths = {1, 2, 4, 8};
  const std::vector<double> costs = {1.0, 1.2, 1.6, 3.0};
  const auto v = interpolate_curve(widths, costs);
  ASSERT_EQ(v.size(), 9u);
  const std::vector<double> want = {1.0, 1.0, 1.2, 1.4, 1.6, 1.95, 2.3, 2.65, 3.0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(v[i], want[i], 1e-12) << i;
  EXPECT_DOUBLE_EQ(v[8], 3.0);
  EXPECT_THROW(interpolate_curve(std::vector<int>{2, 3}, std::vector<double>{1.0, 1.1}), Error);
  EXPECT_THROW(interpolate_curve(std::vector<int>{1, 3, 3}, std::vector<double>{1.0, 1.1, 1.2}), Error);
  EXPECT_THROW(interpolate_curve(std::vector<int>{1, 2}, std::vector<double>{1.0}), Error);

  Calibration cal;
  cal.verify = v;
  cal.widths = widths;
  const CostModel c = cal.cost_model();
  EXPECT_EQ(c.extrapolate_from, 4);
  EXPECT_NEAR(c.verify_cost(12), 3.0 + 4 * 0.35, 1e-12);
  // Entries replaced after interpolation (a noisy last pair) do not move the slope: 4 -> 8 still rules.
  CostModel noisy = c;
  noisy.verify[7] = 2.99;
  EXPECT_NEAR(noisy.verify_cost(10), 3.0 + 2 * 0.35, 1e-12);
  // Without measured widths, the last two entries, as before; a falling end extrapolates flat.
  CostModel plain;
  plain.verify = {1.0, 1.0, 1.3, 1.5};
  EXPECT_NEAR(plain.verify_cost(5), 1.9, 1e-12);
  plain.verify = {1.0, 1.0, 1.3, 1.2};
  EXPECT_NEAR(plain.verify_cost(6), 1.2, 1e-12);
  // A gate built on the curve extends it along the same segment.
  Gate gate(GateSettings{}, c, 12);
  EXPECT_NEAR(gate.costs().verify_cost(13), 3.0 + 5 * 0.35, 1e-12);
  EXPECT_NEAR(gate.costs().verify_cost(20), 3.0 + 12 * 0.35, 1e-12);
}

TEST(SpeculativeCalibration, CacheRoundTripPerKey) {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem-calib-" + std::to_string(::getpid()));
  const std::string path = (dir / "calibration.json").string();
  Calibration c;
  c.model_hash = "abc";
  c.cpu = "cpu x";
  c.threads = 2;
  c.decode_seconds = 0.01;
  c.verify = {1, 1, 1.1, 1.25};
  c.widths = {1, 2, 3};
  c.draft_per_token = {{"d1", 0.2}};
  store_calibration(path, c);
  Calibration other = c;
  other.threads = 4;
  other.verify = {1, 1, 2};
  other.draft_per_token.clear();
  store_calibration(path, other);
  const auto back = load_calibration(path, "abc", "cpu x", 2);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->verify, c.verify);
  EXPECT_EQ(back->widths, c.widths);
  EXPECT_DOUBLE_EQ(back->cost_model("d1").draft_per_token, 0.2);
  EXPECT_DOUBLE_EQ(back->cost_model("").draft_per_token, 0.0);
  EXPECT_EQ(load_calibration(path, "abc", "cpu x", 4)->verify, other.verify);
  EXPECT_FALSE(load_calibration(path, "abc", "cpu y", 2).has_value());
  std::filesystem::remove_all(dir);
}

TEST(SpeculativeCalibration, FingerprintAndMeasurement) {
  const std::string path = testing::shared_path("models/stories260K.gguf");
  EXPECT_EQ(file_fingerprint(path), file_fingerprint(path));
  EXPECT_NE(file_fingerprint(path), file_fingerprint(testing::shared_path("models/llama2xs-tok512.gguf")));
  const auto m = model::Model::load(path);
  ThreadPool pool(1);
  CalibrateOptions o;
  o.max_rows = 4;
  o.repeats = 2;
  const Calibration c = calibrate(*m, path, m.get(), path, pool, o);
  ASSERT_EQ(c.verify.size(), 5u);
  EXPECT_EQ(c.widths, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(c.verify[1], 1.0);
  for (double v : c.verify) EXPECT_GE(v, 1.0);
  for (size_t r = 2; r < c.verify.size(); ++r) EXPECT_GE(c.verify[r], c.verify[r - 1]) << r;
  EXPECT_GT(c.draft_per_token.at(file_fingerprint(path)), 0.0);
  // Past 16 rows the widths are sparse; the curve is dense and monotone to the widest one.
  o.max_rows = 30;
  o.repeats = 1;
  ASSERT_GE(m->config().n_ctx_train, o.context + o.max_rows + 1);
  const Calibration wide = calibrate(*m, path, nullptr, "", pool, o);
  EXPECT_EQ(calibrated_rows(*m, o), 30);
  ASSERT_EQ(wide.verify.size(), 31u);
  EXPECT_EQ(wide.widths, calibration_widths(30));
  for (size_t r = 2; r < wide.verify.size(); ++r) EXPECT_GE(wide.verify[r], wide.verify[r - 1]) << r;
  // Between 16 and 24 rows, on the line between them.
  EXPECT_NEAR(wide.verify[20], 0.5 * (wide.verify[16] + wide.verify[24]), 1e-9);
  EXPECT_EQ(wide.cost_model().extrapolate_from, 24);
  // A model trained on a short context keeps the windows inside it.
  CalibrateOptions tight = o;
  tight.context = static_cast<int>(m->config().n_ctx_train) - 10;
  EXPECT_EQ(calibrated_rows(*m, tight), 9);
}

}  // namespace
}  // namespace tandem::speculative
