#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tandem/sampling/sampler.h"
#include "tandem/util/error.h"

#include "alloc_counter.inc"  // g_allocations, TANDEM_COUNTS_ALLOCATIONS

namespace {

using tandem::sampling::argmax;
using tandem::sampling::Distribution;
using tandem::sampling::Params;
using tandem::sampling::Sampler;
using tandem::sampling::uniform;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Pure temperature sampling: every truncation disabled.
Params plain(float temperature) {
  Params p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

std::vector<float> log_of(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Appends a token with logit -inf (no probability), so that top_k = 4 runs the top-k code path on a
// four-token distribution without removing anything from it.
std::vector<float> with_masked_token(std::vector<float> logits) {
  logits.push_back(kNegInf);
  return logits;
}

using Expected = std::vector<std::pair<int32_t, double>>;  // (id, probability), ascending ids

void expect_distribution(const Distribution& d, const Expected& expected, double tolerance = 2e-6) {
  ASSERT_EQ(d.ids.size(), expected.size());
  ASSERT_EQ(d.probs.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(d.ids[i], expected[i].first) << "entry " << i;
    EXPECT_NEAR(d.probs[i], expected[i].second, tolerance) << "token " << expected[i].first;
  }
}

Distribution distribution_of(const Params& params, const std::vector<float>& logits,
                             const std::vector<int32_t>& history = {}) {
  Sampler sampler(params);
  Distribution d;
  sampler.distribution(logits, history, d);
  return d;
}

// Upper 1e-4 quantiles of the chi-square distribution: a correct sampler fails each test below with
// probability 1e-4 for a random key. The keys here are fixed, so each test's outcome is itself fixed.
constexpr double kChiSquare1e4Df7 = 29.8775;
constexpr double kChiSquare1e4Df63 = 113.505;

double chi_square(const std::vector<size_t>& counts, const std::vector<double>& probs, size_t n) {
  double stat = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probs[i] * static_cast<double>(n);
    const double diff = static_cast<double>(counts[i]) - expected;
    stat += diff * diff / expected;
  }
  return stat;
}

// ---------------------------------------------------------------------------------------------------------
// Greedy

TEST(Sampling, ArgmaxLowestIdWinsTies) {
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{5.0f}), 0);
  EXPECT_EQ(argmax(std::vector<float>{kNegInf, kNegInf}), 0);
  EXPECT_EQ(argmax(std::vector<float>{kNegInf, -1e30f, 0.0f, 0.0f}), 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(argmax(std::vector<float>{nan, 1.0f, 2.0f, nan}), 2);
  EXPECT_THROW(argmax(std::vector<float>{}), tandem::Error);
}

TEST(Sampling, GreedyIsArgmaxWithProbabilityOne) {
  Params p;  // truncations on: greedy ignores them
  p.temperature = 0.0f;
  const Distribution d = distribution_of(p, {0.5f, 2.0f, -1.0f, 2.0f});
  expect_distribution(d, {{1, 1.0}}, 0.0);
  Sampler sampler(p);
  for (uint64_t pos = 0; pos < 20; ++pos)
    EXPECT_EQ(sampler.sample(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}, {}, 0, pos), 1);
}

TEST(Sampling, GreedyAppliesPenalties) {
  Params p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  // Token 0: 3 / 2 = 1.5 < 2.5, so token 1 wins.
  expect_distribution(distribution_of(p, {3.0f, 2.5f, 0.0f}, {0}), {{1, 1.0}}, 0.0);
  // Without history token 0 keeps its lead.
  expect_distribution(distribution_of(p, {3.0f, 2.5f, 0.0f}, {}), {{0, 1.0}}, 0.0);
}

// ---------------------------------------------------------------------------------------------------------
// Each transform alone

TEST(Sampling, Temperature) {
  // logits / 0.5 = {2, 4, 6}; softmax = {e^-4, e^-2, 1} / (1 + e^-2 + e^-4).
  expect_distribution(distribution_of(plain(0.5f), {1.0f, 2.0f, 3.0f}),
                      {{0, 0.0158762400}, {1, 0.1173104278}, {2, 0.8668133322}});
  // Temperature 1 reproduces the input distribution.
  expect_distribution(distribution_of(plain(1.0f), log_of({0.1, 0.2, 0.7})), {{0, 0.1}, {1, 0.2}, {2, 0.7}});
}

TEST(Sampling, NegativeInfinityLogitsGetNoMass) {
  expect_distribution(distribution_of(plain(1.0f), {0.0f, kNegInf, 0.0f}), {{0, 0.5}, {2, 0.5}});
  Params k3 = plain(1.0f);
  k3.top_k = 3;  // the third pick is a -inf logit, which must not appear
  expect_distribution(distribution_of(k3, {0.0f, kNegInf, 0.0f, kNegInf}), {{0, 0.5}, {2, 0.5}});
}

TEST(Sampling, TopK) {
  Params p = plain(1.0f);
  p.top_k = 2;
  // Survivors 3 and 2: softmax = {1, e^-1} / (1 + e^-1).
  expect_distribution(distribution_of(p, {1.0f, 3.0f, 2.0f, 0.0f}), {{1, 0.7310585786}, {2, 0.2689414214}});
  // Ties at the boundary: the lowest ids survive.
  expect_distribution(distribution_of(p, {1.0f, 1.0f, 1.0f, 0.0f}), {{0, 0.5}, {1, 0.5}});
  p.top_k = 1;
  expect_distribution(distribution_of(p, {1.0f, 3.0f, 3.0f, 0.0f}), {{1, 1.0}});
  // k >= n_vocab keeps everything.
  p.top_k = 10;
  expect_distribution(distribution_of(p, log_of({0.25, 0.75})), {{0, 0.25}, {1, 0.75}});
}

TEST(Sampling, TopP) {
  const std::vector<float> logits = with_masked_token(log_of({0.5, 0.3, 0.15, 0.05}));
  for (int top_k : {0, 4}) {  // the full-vocabulary path and the top-k path
    Params p = plain(1.0f);
    p.top_k = top_k;
    p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.5 + 0.3
    expect_distribution(distribution_of(p, logits), {{0, 0.625}, {1, 0.375}});
    p.top_p = 0.85f;  // needs 0.5 + 0.3 + 0.15, renormalized by 0.95
    expect_distribution(distribution_of(p, logits),
                        {{0, 0.5263157895}, {1, 0.3157894737}, {2, 0.1578947368}});
    p.top_p = 0.1f;
    expect_distribution(distribution_of(p, logits), {{0, 1.0}});
  }
}

TEST(Sampling, MinP) {
  const std::vector<float> logits = with_masked_token(log_of({0.5, 0.3, 0.15, 0.05}));
  // The unsorted path, the sorted top-p path (top-p 0.99 keeps all four), and the top-k path.
  for (auto [top_p, top_k] : {std::pair{1.0f, 0}, std::pair{0.99f, 0}, std::pair{1.0f, 4}}) {
    Params p = plain(1.0f);
    p.top_p = top_p;
    p.top_k = top_k;
    p.min_p = 0.2f;  // threshold 0.1: drops 0.05
    expect_distribution(distribution_of(p, logits),
                        {{0, 0.5263157895}, {1, 0.3157894737}, {2, 0.1578947368}});
    p.min_p = 0.61f;  // threshold 0.305: only the top token
    expect_distribution(distribution_of(p, logits), {{0, 1.0}});
    p.min_p = 0.59f;  // threshold 0.295: keeps 0.3
    expect_distribution(distribution_of(p, logits), {{0, 0.625}, {1, 0.375}});
  }
}

TEST(Sampling, RepetitionPenalty) {
  Params p = plain(1.0f);
  p.repeat_penalty = 2.0f;
  // Token 0 (positive, seen twice): 2 / 2 = 1, penalized once; token 1 (negative): -1 * 2 = -2.
  // softmax(1, -2, 0.5, 1)
  expect_distribution(distribution_of(p, {2.0f, -1.0f, 0.5f, 1.0f}, {0, 1, 0}),
                      {{0, 0.3764609894}, {1, 0.0187428890}, {2, 0.2283351322}, {3, 0.3764609894}});
}

TEST(Sampling, PresenceAndFrequencyPenalties) {
  Params p = plain(1.0f);
  p.repeat_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  // Token 0 (count 2): 2 / 2 - 0.5 - 2 * 0.25 = 0; token 1 (count 1): -1 * 2 - 0.5 - 0.25 = -2.75.
  expect_distribution(distribution_of(p, {2.0f, -1.0f, 0.5f, 1.0f}, {0, 1, 0}),
                      {{0, 0.1841304939}, {1, 0.0117710687}, {2, 0.3035798619}, {3, 0.5005185756}});
}

TEST(Sampling, PenaltyWindow) {
  Params p = plain(1.0f);
  p.repeat_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repeat_last_n = 1;  // only the last token (0, count 1): 2 / 2 - 0.5 - 0.25 = 0.25
  expect_distribution(distribution_of(p, {2.0f, -1.0f, 0.5f, 1.0f}, {0, 1, 0}),
                      {{0, 0.2133319575}, {1, 0.0611206292}, {2, 0.2739236557}, {3, 0.4516237576}});
  p.repeat_last_n = 0;  // disabled: the plain softmax
  const Distribution off = distribution_of(p, {2.0f, -1.0f, 0.5f, 1.0f}, {0, 1, 0});
  const Distribution none = distribution_of(plain(1.0f), {2.0f, -1.0f, 0.5f, 1.0f});
  EXPECT_EQ(off.ids, none.ids);
  EXPECT_EQ(off.probs, none.probs);
  // -1 is the whole history: the same as a window of its length, and unlike a shorter window.
  const std::vector<int32_t> history = {3, 3, 0, 1, 0};
  p.repeat_last_n = -1;
  Params p5 = p, p3 = p;
  p5.repeat_last_n = 5;
  p3.repeat_last_n = 3;
  const Distribution whole = distribution_of(p, {2.0f, -1.0f, 0.5f, 1.0f}, history);
  EXPECT_EQ(whole.probs, distribution_of(p5, {2.0f, -1.0f, 0.5f, 1.0f}, history).probs);
  EXPECT_NE(whole.probs, distribution_of(p3, {2.0f, -1.0f, 0.5f, 1.0f}, history).probs);
}

TEST(Sampling, HistoryOutsideVocabularyThrows) {
  Params p = plain(1.0f);
  p.repeat_penalty = 1.1f;
  EXPECT_THROW(distribution_of(p, {0.0f, 1.0f}, {0, 2}), tandem::Error);
  EXPECT_THROW(distribution_of(p, {0.0f, 1.0f}, {-1}), tandem::Error);
}

TEST(Sampling, BadLogitsThrow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THROW(distribution_of(plain(1.0f), {0.0f, nan}), tandem::Error);
  EXPECT_THROW(distribution_of(plain(1.0f), {inf, 0.0f}), tandem::Error);
  EXPECT_THROW(distribution_of(plain(0.0f), {kNegInf, kNegInf}), tandem::Error);
  EXPECT_THROW(distribution_of(plain(1.0f), {}), tandem::Error);
}

// ---------------------------------------------------------------------------------------------------------
// Composition order: penalties -> temperature -> top-k -> top-p -> min-p. Each case gives a different answer
// under the swapped order.

TEST(Sampling, PenaltiesBeforeTemperature) {
  Params p = plain(0.5f);
  p.presence_penalty = 1.0f;
  // (0 - 1) / 0.5 = -2 vs 0: e^-2 / (1 + e^-2). Temperature first would give (0 / 0.5) - 1 = -1.
  expect_distribution(distribution_of(p, {0.0f, 0.0f}, {0}), {{0, 0.1192029220}, {1, 0.8807970780}});
}

TEST(Sampling, TemperatureBeforeTopP) {
  // At T = 0.5 the probabilities are proportional to {0.25, 0.09, 0.0225, 0.0025}: {0.685, 0.247, 0.062,
  // 0.007}, so top_p 0.9 keeps two. At T = 1 it would keep three.
  for (int top_k : {0, 4}) {
    Params p = plain(0.5f);
    p.top_k = top_k;
    p.top_p = 0.9f;
    expect_distribution(distribution_of(p, with_masked_token(log_of({0.5, 0.3, 0.15, 0.05}))),
                        {{0, 0.7352941176}, {1, 0.2647058824}});
  }
}

TEST(Sampling, TopKBeforeTopP) {
  Params p = plain(1.0f);
  p.top_k = 2;
  p.top_p = 0.5f;
  // Top-k leaves {0.4, 0.3} -> {4/7, 3/7}; 4/7 >= 0.5, so one token. Top-p first would keep 0.4 and 0.3.
  expect_distribution(distribution_of(p, log_of({0.4, 0.3, 0.2, 0.1})), {{0, 1.0}});
}

TEST(Sampling, TopPBeforeMinP) {
  for (int top_k : {0, 4}) {
    Params p = plain(1.0f);
    p.top_k = top_k;
    p.top_p = 0.75f;  // cumulative 0.4, 0.7, 0.9: keeps three
    p.min_p = 0.3f;   // threshold 0.12: keeps the same three
    // Min-p first would drop 0.1 and renormalize to {0.444, 0.333, 0.222}, and top-p 0.75 would then keep
    // two.
    expect_distribution(distribution_of(p, with_masked_token(log_of({0.4, 0.3, 0.2, 0.1}))),
                        {{0, 4.0 / 9.0}, {1, 3.0 / 9.0}, {2, 2.0 / 9.0}});
  }
}

// ---------------------------------------------------------------------------------------------------------
// Against a plain reference: full sort of the vocabulary, every step written out as specified.

Expected reference_distribution(const Params& p, std::vector<float> logits,
                                const std::vector<int32_t>& history) {
  const size_t n = logits.size();
  if (p.repeat_last_n != 0) {
    const size_t window =
        p.repeat_last_n < 0 ? history.size() : std::min(history.size(), static_cast<size_t>(p.repeat_last_n));
    std::vector<int> count(n, 0);
    for (size_t i = history.size() - window; i < history.size(); ++i)
      ++count[static_cast<size_t>(history[i])];
    for (size_t id = 0; id < n; ++id) {
      if (count[id] == 0) continue;
      float& l = logits[id];
      l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
      l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count[id]);
    }
  }
  if (p.temperature == 0.0f) return {{argmax(logits), 1.0}};
  std::vector<int32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) order.resize(static_cast<size_t>(p.top_k));
  const float max_logit = logits[order[0]];
  std::vector<double> w;
  double total = 0.0;
  for (int32_t id : order) {
    w.push_back(std::exp((logits[id] - max_logit) / p.temperature));
    total += w.back();
  }
  size_t keep = order.size();
  if (p.top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      cumulative += w[i] / total;
      if (cumulative >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    size_t i = 0;
    while (i < keep && w[i] / w[0] >= p.min_p) ++i;
    keep = i;
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += w[i];
  Expected out;
  for (size_t i = 0; i < keep; ++i) {
    if (w[i] > 0.0) out.push_back({order[i], w[i] / kept});
  }
  std::sort(out.begin(), out.end());
  return out;
}

void expect_matches_reference(const Params& p, const std::vector<float>& logits,
                              const std::vector<int32_t>& history) {
  const Distribution d = distribution_of(p, logits, history);
  const Expected ref = reference_distribution(p, logits, history);
  double sum = 0.0;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0) {
      ASSERT_LT(d.ids[i - 1], d.ids[i]) << "ids must ascend";
    }
    ASSERT_GT(d.probs[i], 0.0f);
    sum += d.probs[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  // Same support: a token may be missing only where the reference gives it negligible probability.
  size_t j = 0;
  for (const auto& [id, prob] : ref) {
    while (j < d.size() && d.ids[j] < id) {
      ADD_FAILURE() << "token " << d.ids[j] << " is not in the reference";
      ++j;
    }
    if (j < d.size() && d.ids[j] == id) {
      EXPECT_NEAR(d.probs[j], prob, 1e-5) << "token " << id;
      ++j;
    } else {
      EXPECT_LT(prob, 1e-30) << "token " << id << " is missing";
    }
  }
  EXPECT_EQ(j, d.size()) << "extra tokens past the reference";
}

TEST(Sampling, MatchesReferenceOnRandomInputs) {
  std::mt19937 rng(12345);
  const std::vector<size_t> vocab_sizes = {1, 2, 7, 100, 3000};
  const float temperatures[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.6f};
  const int top_ks[] = {0, 1, 5, 40, 100000};
  const float top_ps[] = {1.0f, 0.3f, 0.9f, 0.99f};
  const float min_ps[] = {0.0f, 0.01f, 0.1f};
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = vocab_sizes[static_cast<size_t>(trial) % vocab_sizes.size()];
    std::normal_distribution<float> normal(0.0f, trial % 3 == 0 ? 0.5f : 3.0f);
    std::vector<float> logits(n);
    for (float& l : logits) {
      l = normal(rng);
      if (trial % 4 == 1) l = std::round(l * 2.0f) / 2.0f;  // many ties
    }
    if (n > 2 && trial % 5 == 2) logits[n / 2] = kNegInf;
    Params p;
    p.temperature = temperatures[rng() % 5];
    p.top_k = top_ks[rng() % 5];
    p.top_p = top_ps[rng() % 4];
    p.min_p = min_ps[rng() % 3];
    p.repeat_penalty = trial % 2 == 0 ? 1.0f : 1.3f;
    p.presence_penalty = trial % 3 == 0 ? 0.4f : 0.0f;
    p.frequency_penalty = trial % 7 == 0 ? 0.2f : 0.0f;
    p.repeat_last_n = trial % 6 == 0 ? -1 : 16;
    std::vector<int32_t> history(rng() % 40);
    for (int32_t& t : history) t = static_cast<int32_t>(rng() % n);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_matches_reference(p, logits, history);
  }
}

TEST(Sampling, TopPWithLongTails) {
  // One strong token and a long weak tail (relative weights about 1e-4, then 1e-7), so the top-p prefix
  // reaches tokens far below the largest probability.
  for (float tail_logit : {-9.2f, -16.1f}) {
    std::vector<float> logits(5000);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = tail_logit + 0.01f * static_cast<float>(i % 13);
    logits[77] = 0.0f;
    for (float top_p : {0.9f, 0.999f, 0.99999f}) {
      for (float min_p : {0.0f, 1e-5f}) {
        Params p = plain(1.0f);
        p.top_p = top_p;
        p.min_p = min_p;
        SCOPED_TRACE(std::to_string(tail_logit) + " " + std::to_string(top_p) + " " + std::to_string(min_p));
        expect_matches_reference(p, logits, {});
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Randomness

TEST(Sampling, UniformIsAPureFunctionOfTheKey) {
  EXPECT_EQ(uniform(1, 2, 3, 4), uniform(1, 2, 3, 4));
  EXPECT_NE(uniform(1, 2, 3, 4), uniform(1, 2, 3, 5));
  EXPECT_NE(uniform(1, 2, 3, 4), uniform(1, 2, 4, 4));
  EXPECT_NE(uniform(1, 2, 3, 4), uniform(1, 3, 3, 4));
  EXPECT_NE(uniform(1, 2, 3, 4), uniform(2, 2, 3, 4));
  for (uint64_t pos = 0; pos < 10000; ++pos) {
    const double u = uniform(0, 0, pos, 0);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

// 64 equal bins over [0, 1).
TEST(Sampling, UniformIsUniform) {
  constexpr size_t kBins = 64, kDraws = 640000;
  std::vector<size_t> counts(kBins, 0);
  for (uint64_t i = 0; i < kDraws; ++i) ++counts[static_cast<size_t>(uniform(42, 3, i, 0) * kBins)];
  EXPECT_LT(chi_square(counts, std::vector<double>(kBins, 1.0 / kBins), kDraws), kChiSquare1e4Df63);
}

// Pairs of numbers whose keys differ in one part must be independent: the 8x8 grid of pairs is uniform.
TEST(Sampling, NeighbouringKeysAreIndependent) {
  constexpr size_t kDraws = 256000;
  auto pair_test = [&](auto first, auto second) {
    std::vector<size_t> counts(64, 0);
    for (uint64_t i = 0; i < kDraws; ++i) {
      const auto a = static_cast<size_t>(first(i) * 8), b = static_cast<size_t>(second(i) * 8);
      ++counts[a * 8 + b];
    }
    return chi_square(counts, std::vector<double>(64, 1.0 / 64), kDraws);
  };
  // Next position, next sequence, next draw index, next seed.
  EXPECT_LT(pair_test([](uint64_t i) { return uniform(9, 1, i, 0); },
                      [](uint64_t i) { return uniform(9, 1, i + 1, 0); }),
            kChiSquare1e4Df63);
  EXPECT_LT(pair_test([](uint64_t i) { return uniform(9, i, 5, 0); },
                      [](uint64_t i) { return uniform(9, i + 1, 5, 0); }),
            kChiSquare1e4Df63);
  EXPECT_LT(pair_test([](uint64_t i) { return uniform(9, 2, i, 0); },
                      [](uint64_t i) { return uniform(9, 2, i, 1); }),
            kChiSquare1e4Df63);
  EXPECT_LT(pair_test([](uint64_t i) { return uniform(i, 2, 7, 0); },
                      [](uint64_t i) { return uniform(i + 1, 2, 7, 0); }),
            kChiSquare1e4Df63);
}

TEST(Sampling, SeededRunsRepeatAndIgnoreBatching) {
  Params p = plain(1.0f);
  p.seed = 2024;
  const std::vector<float> logits = log_of({0.2, 0.2, 0.2, 0.2, 0.2});
  constexpr uint64_t kSequences = 4, kPositions = 50;
  // Sequence by sequence.
  Sampler a(p);
  std::vector<int32_t> serial;
  for (uint64_t s = 0; s < kSequences; ++s) {
    for (uint64_t pos = 0; pos < kPositions; ++pos) serial.push_back(a.sample(logits, {}, s, pos));
  }
  // Interleaved as a batch would be, in reverse sequence order, with a second sampler.
  Sampler b(p);
  std::vector<int32_t> batched(serial.size());
  for (uint64_t pos = 0; pos < kPositions; ++pos) {
    for (uint64_t s = kSequences; s-- > 0;) batched[s * kPositions + pos] = b.sample(logits, {}, s, pos);
  }
  EXPECT_EQ(serial, batched);
  // A different seed gives a different run.
  p.seed = 2025;
  Sampler c(p);
  size_t same = 0;
  for (uint64_t pos = 0; pos < kPositions; ++pos) same += c.sample(logits, {}, 0, pos) == serial[pos];
  EXPECT_LT(same, kPositions / 2);
}

TEST(Sampling, DrawFollowsTheDistribution) {
  Params p = plain(0.9f);
  p.seed = 7;
  Sampler sampler(p);
  Distribution d;
  sampler.distribution(std::vector<float>{0.1f, 2.0f, -1.0f, 0.7f, 1.3f, -0.2f, 0.4f, 1.0f}, {}, d);
  ASSERT_EQ(d.size(), 8u);
  const std::vector<double> probs(d.probs.begin(), d.probs.end());
  constexpr size_t kDraws = 200000;
  // Across positions, and across draw indices at one position.
  std::vector<size_t> by_position(8, 0), by_draw(8, 0);
  for (uint64_t i = 0; i < kDraws; ++i) {
    ++by_position[static_cast<size_t>(sampler.draw(d, 3, i))];
    ++by_draw[static_cast<size_t>(sampler.draw(d, 3, 11, static_cast<uint32_t>(i)))];
  }
  EXPECT_LT(chi_square(by_position, probs, kDraws), kChiSquare1e4Df7);
  EXPECT_LT(chi_square(by_draw, probs, kDraws), kChiSquare1e4Df7);
}

TEST(Sampling, DrawScalesAnUnnormalizedDistribution) {
  Sampler sampler(plain(1.0f));
  Distribution d;
  d.ids = {2, 5, 9, 11, 12, 20, 30, 31};
  d.probs = {2.0f, 1.0f, 1.0f, 4.0f, 0.5f, 0.5f, 3.0f, 4.0f};  // sum 16
  std::vector<double> probs;
  for (float w : d.probs) probs.push_back(w / 16.0);
  constexpr size_t kDraws = 160000;
  std::vector<size_t> counts(8, 0);
  for (uint64_t i = 0; i < kDraws; ++i) {
    const int32_t id = sampler.draw(d, 0, i);
    ++counts[static_cast<size_t>(std::find(d.ids.begin(), d.ids.end(), id) - d.ids.begin())];
  }
  EXPECT_LT(chi_square(counts, probs, kDraws), kChiSquare1e4Df7);
}

// ---------------------------------------------------------------------------------------------------------
// Distributions and speculative helpers

TEST(Sampling, ProbOfAndClear) {
  Distribution d = distribution_of(plain(1.0f), log_of({0.25, 0.5, 0.25}));
  EXPECT_NEAR(d.prob_of(1), 0.5f, 1e-6);
  EXPECT_EQ(d.prob_of(3), 0.0f);
  EXPECT_EQ(d.prob_of(-1), 0.0f);
  const size_t capacity = d.ids.capacity();
  d.clear();
  EXPECT_EQ(d.size(), 0u);
  EXPECT_EQ(d.ids.capacity(), capacity);
}

TEST(Sampling, Residual) {
  Distribution p, q, r;
  p.ids = {0, 1, 2};
  p.probs = {0.5f, 0.3f, 0.2f};
  q.ids = {0, 1, 3};
  q.probs = {0.2f, 0.5f, 0.3f};
  // max(0, p - q) = {0: 0.3, 2: 0.2} -> {0.6, 0.4}.
  tandem::sampling::residual(p, q, r);
  expect_distribution(r, {{0, 0.6}, {2, 0.4}});
  // p == q leaves nothing positive: the residual falls back to p.
  tandem::sampling::residual(p, p, r);
  expect_distribution(r, {{0, 0.5}, {1, 0.3}, {2, 0.2}});
}

// Speculative sampling end to end: accept a drafted token with probability min(1, p/q), otherwise draw from
// the residual. The accepted-or-resampled token must follow p exactly.
TEST(Sampling, SpeculativeAcceptRejectFollowsTarget) {
  Params params = plain(1.0f);
  params.seed = 99;
  Sampler sampler(params);
  Distribution p, q, r;
  sampler.distribution(std::vector<float>{1.0f, 0.0f, 2.0f, -1.0f, 0.5f, 0.3f, 1.5f, -0.5f}, {}, p);
  sampler.distribution(std::vector<float>{2.0f, 0.5f, 0.0f, 0.0f, 1.0f, -1.0f, 1.5f, 0.2f}, {}, q);
  tandem::sampling::residual(p, q, r);
  constexpr size_t kTrials = 200000;
  std::vector<size_t> counts(8, 0);
  for (uint64_t i = 0; i < kTrials; ++i) {
    const int32_t drafted = sampler.draw(q, 0, i, 0);
    const double accept = std::min(1.0, static_cast<double>(p.prob_of(drafted)) / q.prob_of(drafted));
    const int32_t token = uniform(params.seed, 0, i, 1) < accept ? drafted : sampler.draw(r, 0, i, 2);
    ++counts[static_cast<size_t>(token)];
  }
  EXPECT_LT(chi_square(counts, std::vector<double>(p.probs.begin(), p.probs.end()), kTrials),
            kChiSquare1e4Df7);
}

// ---------------------------------------------------------------------------------------------------------
// Log-softmax

TEST(Sampling, LogSoftmax) {
  std::vector<double> out(3);
  tandem::sampling::log_softmax(std::vector<float>{1.0f, 2.0f, 3.0f}, out);
  // x - (3 + log(1 + e^-1 + e^-2))
  EXPECT_NEAR(out[0], -2.4076059644443806, 1e-12);
  EXPECT_NEAR(out[1], -1.4076059644443806, 1e-12);
  EXPECT_NEAR(out[2], -0.4076059644443806, 1e-12);
  std::vector<double> masked(2);
  tandem::sampling::log_softmax(std::vector<float>{kNegInf, 5.0f}, masked);
  EXPECT_EQ(masked[0], -std::numeric_limits<double>::infinity());
  EXPECT_NEAR(masked[1], 0.0, 1e-15);
  // Large logits do not overflow.
  tandem::sampling::log_softmax(std::vector<float>{1000.0f, 1000.0f}, masked);
  EXPECT_NEAR(masked[0], -std::log(2.0), 1e-12);
  EXPECT_THROW(tandem::sampling::log_softmax(std::vector<float>{std::nanf(""), 0.0f}, masked), tandem::Error);
  EXPECT_THROW(tandem::sampling::log_softmax(std::vector<float>{0.0f}, masked), tandem::Error);
}

// ---------------------------------------------------------------------------------------------------------
// Validation and steady-state allocation

void expect_invalid(const Params& p, const std::string& name) {
  try {
    tandem::sampling::validate(p);
    ADD_FAILURE() << "accepted a bad " << name;
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
  EXPECT_THROW(Sampler{p}, tandem::Error);
}

TEST(Sampling, ValidateNamesTheBadParameter) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto with = [](auto set) {
    Params p;
    set(p);
    return p;
  };
  expect_invalid(with([](Params& p) { p.temperature = -0.1f; }), "temperature");
  expect_invalid(with([&](Params& p) { p.temperature = nan; }), "temperature");
  expect_invalid(with([&](Params& p) { p.temperature = inf; }), "temperature");
  expect_invalid(with([](Params& p) { p.top_p = 0.0f; }), "top_p");
  expect_invalid(with([](Params& p) { p.top_p = 1.5f; }), "top_p");
  expect_invalid(with([&](Params& p) { p.top_p = nan; }), "top_p");
  expect_invalid(with([](Params& p) { p.min_p = 1.5f; }), "min_p");
  expect_invalid(with([&](Params& p) { p.min_p = nan; }), "min_p");
  expect_invalid(with([](Params& p) { p.repeat_penalty = 0.0f; }), "repeat_penalty");
  expect_invalid(with([](Params& p) { p.repeat_penalty = -1.0f; }), "repeat_penalty");
  expect_invalid(with([&](Params& p) { p.repeat_penalty = nan; }), "repeat_penalty");
  expect_invalid(with([](Params& p) { p.repeat_last_n = -2; }), "repeat_last_n");
  expect_invalid(with([&](Params& p) { p.presence_penalty = nan; }), "presence_penalty");
  expect_invalid(with([&](Params& p) { p.frequency_penalty = inf; }), "frequency_penalty");

  // Boundaries that are valid.
  EXPECT_NO_THROW(tandem::sampling::validate(Params{}));
  EXPECT_NO_THROW(tandem::sampling::validate(with([](Params& p) {
    p.temperature = 0.0f;
    p.top_k = -3;
    p.top_p = 1.0f;
    p.min_p = -1.0f;
    p.repeat_last_n = -1;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
  })));
}

TEST(Sampling, SteadyStateDoesNotAllocate) {
  if (!TANDEM_COUNTS_ALLOCATIONS) GTEST_SKIP() << "allocations are not counted under AddressSanitizer";
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(32000);
  for (float& l : logits) l = normal(rng);
  std::vector<int32_t> history(200);
  for (int32_t& t : history) t = static_cast<int32_t>(rng() % logits.size());

  std::vector<Params> configs;
  configs.push_back(Params{});  // top-k path
  configs.push_back(plain(0.0f));
  configs.push_back(plain(1.0f));
  Params top_p = plain(1.0f);
  top_p.top_p = 0.9f;
  configs.push_back(top_p);
  top_p.min_p = 0.05f;
  top_p.repeat_penalty = 1.2f;
  top_p.frequency_penalty = 0.1f;
  configs.push_back(top_p);

  for (const Params& p : configs) {
    Sampler sampler(p);
    Distribution d;
    sampler.distribution(logits, history, d);  // sizes the scratch and `d`
    sampler.sample(logits, history, 0, 0);
    const size_t before = g_allocations.load();
    for (uint64_t pos = 1; pos < 5; ++pos) {
      sampler.distribution(logits, history, d);
      sampler.sample(logits, history, 0, pos);
    }
    EXPECT_EQ(g_allocations.load() - before, 0u) << "temperature " << p.temperature << " top_k " << p.top_k;
  }
}

}  // namespace
