// Speculative sampling is distribution-preserving: with fixed seeds, the first sampled token follows the
// target sampler's distribution p exactly (one-sample chi-square against p), and short sequences follow the
// plain sampler's distribution (two-sample chi-square against plain generation with other seeds). Each test's
// false-alarm rate is 1e-4. Temperatures 0.7 and 1.0 with top-p 0.9; a draft model (sampled drafts with their
// q) and n-gram lookup (deterministic drafts).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "test_util.h"

namespace tandem::speculative {
namespace {

using engine::generate_speculative;
using engine::SpecOptions;
using engine::SpecStats;

// "Once upon a time" and its greedy continuation under stories260K (from the public golden file). The test
// prompt is the shortest prefix after which n-gram lookup proposes a token the target samples with
// probability in [0.02, 0.98], so that drafts are both accepted and rejected.
const std::vector<int32_t> kText = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395,
                                    317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265,
                                    282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266};
constexpr int kRuns = 1200;

using testing::chi2_critical_1e4;

sampling::Params params_for(float temperature) {
  sampling::Params p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 0.9f;
  p.min_p = 0.0f;
  return p;
}

class SpeculativeSampling : public ::testing::TestWithParam<float> {
 protected:
  static void SetUpTestSuite() {
    target_ = model::Model::load(testing::shared_path("models/stories260K.gguf")).release();
    draft_ = model::Model::load(testing::shared_path("models/llama2xs-tok512.gguf")).release();
  }

  void SetUp() override {
    ThreadPool pool(1);
    model::Session s(*target_, pool, {});
    sampling::Sampler sampler(params_for(GetParam()));
    NgramSource ngram({1, 4});
    Draft d;
    sampling::Distribution p;
    for (size_t n = 5; n < kText.size() && prompt_.empty(); ++n) {
      const std::span<const int32_t> text(kText.data(), n);
      ngram.propose(text, 1, d);
      if (d.tokens.empty()) continue;
      s.truncate(0);
      sampler.distribution(s.eval(text), text, p);
      const float px = p.prob_of(d.tokens[0]);
      if (px >= 0.02f && px <= 0.98f) prompt_.assign(text.begin(), text.end());
    }
    ASSERT_FALSE(prompt_.empty()) << "no prefix of the text suits the n-gram drafter";
  }
  static void TearDownTestSuite() {
    delete target_;
    delete draft_;
  }

  // The first `length` tokens of a speculative run with seed `seed` (gate off, depth 4).
  std::vector<int32_t> spec_run(model::Session& s, DraftSource& source, uint64_t seed, size_t length,
                                SpecStats& total) {
    SpecOptions o;
    o.generate.max_tokens = 8;
    o.generate.sampling = params_for(GetParam());
    o.generate.sampling.seed = seed;
    o.draft_max = 4;
    o.use_gate = false;
    std::vector<int32_t> out;
    s.truncate(0);
    total.add(generate_speculative(
        s, source, prompt_, o, [&](int32_t t) { return out.push_back(t), out.size() < length; }, nullptr));
    return out;
  }

  std::vector<int32_t> plain_run(model::Session& s, uint64_t seed, size_t length) {
    engine::GenerateOptions g;
    g.max_tokens = static_cast<int64_t>(length);
    g.sampling = params_for(GetParam());
    g.sampling.seed = seed;
    std::vector<int32_t> out;
    s.truncate(0);
    engine::generate(
        s, prompt_, g, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
    return out;
  }

  static model::Model* target_;
  static model::Model* draft_;
  std::vector<int32_t> prompt_;
};
model::Model* SpeculativeSampling::target_ = nullptr;
model::Model* SpeculativeSampling::draft_ = nullptr;

TEST_P(SpeculativeSampling, FirstTokenFollowsTheTargetDistribution) {
  ThreadPool pool(1);
  model::Session s(*target_, pool, {});
  sampling::Sampler sampler(params_for(GetParam()));
  sampling::Distribution p;
  sampler.distribution(s.eval(prompt_), prompt_, p);
  ASSERT_GT(p.size(), 2u);

  DraftModelSource model_source(*draft_, *target_, pool, {});
  NgramSource ngram({1, 4});
  for (DraftSource* source : {static_cast<DraftSource*>(&model_source), static_cast<DraftSource*>(&ngram)}) {
    std::map<int32_t, int> counts;
    SpecStats total;
    for (int seed = 0; seed < kRuns; ++seed) ++counts[spec_run(s, *source, 1000 + seed, 1, total)[0]];
    EXPECT_EQ(total.rounds, kRuns) << "every run verifies drafts";
    EXPECT_GT(total.accepted, 0) << source->kind();
    EXPECT_LT(total.accepted, total.drafted) << source->kind();
    const testing::ChiSquare c = testing::chi_square(p.ids, p.probs, counts, kRuns);
    EXPECT_EQ(c.outside, 0) << "a token outside the target's top-p set was sampled";
    EXPECT_LT(c.chi2, chi2_critical_1e4(c.bins - 1)) << source->kind() << " at temperature " << GetParam();
  }
}

TEST_P(SpeculativeSampling, ShortSequencesFollowThePlainSampler) {
  ThreadPool pool(1);
  model::Session s(*target_, pool, {});
  DraftModelSource model_source(*draft_, *target_, pool, {});
  NgramSource ngram({1, 4});
  constexpr size_t kLength = 3;
  std::map<std::vector<int32_t>, int> plain;
  for (int seed = 0; seed < kRuns; ++seed) ++plain[plain_run(s, 50000 + seed, kLength)];
  for (DraftSource* source : {static_cast<DraftSource*>(&model_source), static_cast<DraftSource*>(&ngram)}) {
    std::map<std::vector<int32_t>, int> spec;
    SpecStats total;
    for (int seed = 0; seed < kRuns; ++seed) ++spec[spec_run(s, *source, 90000 + seed, kLength, total)];
    // Two-sample chi-square (equal sample sizes): sum (a - b)^2 / (a + b) over sequences seen >= 10 times in
    // both samples together; the rest pooled into one bin.
    double chi2 = 0;
    int bins = 0, pooled_a = 0, pooled_b = 0;
    std::map<std::vector<int32_t>, std::pair<int, int>> both;
    for (const auto& [seq, n] : plain) both[seq].first = n;
    for (const auto& [seq, n] : spec) both[seq].second = n;
    for (const auto& [seq, ab] : both) {
      if (ab.first + ab.second < 10) {
        pooled_a += ab.first, pooled_b += ab.second;
        continue;
      }
      chi2 += std::pow(ab.first - ab.second, 2) / (ab.first + ab.second);
      ++bins;
    }
    if (pooled_a + pooled_b > 0) {
      chi2 += std::pow(pooled_a - pooled_b, 2) / (pooled_a + pooled_b);
      ++bins;
    }
    ASSERT_GT(bins, 3);
    EXPECT_LT(chi2, chi2_critical_1e4(bins - 1)) << source->kind() << " at temperature " << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Temperatures, SpeculativeSampling, ::testing::Values(0.7f, 1.0f));

}  // namespace
}  // namespace tandem::speculative
