// The EAGLE-style drafter end to end: its whole backward against finite differences, a synthetic task it
// must learn, bit-identical weights from two runs, and the speed of a training step at stories260K's size.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "tandem/train/eagle.h"
#include "tandem/train/optimizer.h"
#include "tandem/util/thread_pool.h"
#include "train_fixture.h"

namespace {

using namespace tandem::train;
using tandem::train::fixture::expect_gradients_match_differences;
using tandem::train::fixture::randn;

// A synthetic next-token task. Each sequence counts from a random start by a stride s in {1, 2, 3, 5}
// (mod vocab). The tap features at position i carry token i and the stride (fixed random codes plus noise);
// the drafter reads them and token i+1 and must predict token i+2 = token i+1 + s, which needs the stride
// from the taps (or from attention over earlier rows): the embedding alone cannot tell.
struct Task {
  EagleConfig cfg;
  int64_t n_seqs = 4, len = 32;
  std::vector<float> token_code, stride_code;  // [vocab, taps], [4, taps]
  std::mt19937 rng{99};

  explicit Task(const EagleConfig& c) : cfg(c) {
    const int64_t w = cfg.n_taps * cfg.d;
    token_code = randn(cfg.vocab * w, rng);
    stride_code = randn(4 * w, rng);
  }
  int64_t rows() const { return n_seqs * len; }

  struct Batch {
    std::vector<float> taps, probs;
    std::vector<int32_t> next_ids, pos, target_ids;
    std::vector<uint8_t> mask;
    AttentionMask att{0};
    EagleBatch view;
  };
  void make(Batch& b) {
    static constexpr int kStrides[4] = {1, 2, 3, 5};
    const int64_t w = cfg.n_taps * cfg.d, R = rows();
    b.taps.resize(static_cast<size_t>(R * w));
    b.probs.assign(static_cast<size_t>(R), 1.0f);
    b.next_ids.resize(static_cast<size_t>(R));
    b.pos.resize(static_cast<size_t>(R));
    b.target_ids.resize(static_cast<size_t>(R));
    b.mask.assign(static_cast<size_t>(R), 1);
    std::normal_distribution<float> noise(0.0f, 0.1f);
    for (int64_t s = 0; s < n_seqs; ++s) {
      const int stride_index = static_cast<int>(rng() % 4);
      const int64_t stride = kStrides[stride_index], start = static_cast<int64_t>(rng() % cfg.vocab);
      for (int64_t i = 0; i < len; ++i) {
        const int64_t r = s * len + i, tok = (start + i * stride) % cfg.vocab;
        for (int64_t j = 0; j < w; ++j)
          b.taps[static_cast<size_t>(r * w + j)] = token_code[static_cast<size_t>(tok * w + j)] +
                                                   stride_code[static_cast<size_t>(stride_index * w + j)] +
                                                   noise(rng);
        b.next_ids[static_cast<size_t>(r)] = static_cast<int32_t>((tok + stride) % cfg.vocab);
        b.target_ids[static_cast<size_t>(r)] = static_cast<int32_t>((tok + 2 * stride) % cfg.vocab);
        b.pos[static_cast<size_t>(r)] = static_cast<int32_t>(i);
      }
    }
    const std::vector<int64_t> lengths(static_cast<size_t>(n_seqs), len);
    b.att = AttentionMask::causal_sequences(lengths);
    b.view = {
        .rows = R,
        .taps = b.taps.data(),
        .next_ids = b.next_ids.data(),
        .pos = b.pos.data(),
        .mask = &b.att,
        .targets = SoftTargets{R, 1, b.target_ids.data(), b.probs.data(), nullptr, nullptr, b.mask.data()}};
  }
};

void fill_frozen(EagleDrafter& m, uint32_t seed) {
  std::mt19937 rng(seed);
  m.embedding().value = randn(m.embedding().size(), rng);
  if (!m.head().trainable()) m.head().value = randn(m.head().size(), rng);
}

// Trains `steps` steps from `seed` and returns the loss of the last few steps and the final weights.
struct RunResult {
  double late_loss = 0, late_agree = 0;
  std::vector<std::vector<float>> weights;
};
RunResult train(const EagleConfig& cfg, int threads, int64_t steps, uint64_t seed) {
  tandem::ThreadPool pool(threads);
  Compute c(pool);
  Task task(cfg);
  EagleDrafter m(cfg, task.rows());
  m.init(seed);
  fill_frozen(m, 5);
  const std::vector<Param*> ps = m.params();
  AdamW opt(ps, {0.9, 0.95, 1e-8, 0.01});
  const LrSchedule lr{3e-3, 3e-4, 20, steps};
  Task::Batch b;
  RunResult out;
  const int64_t late = 10;
  for (int64_t s = 0; s < steps; ++s) {
    task.make(b);
    m.zero_grad();
    const LossStats st = m.forward_backward(b.view, c);
    clip_grad_norm(ps, 1.0);
    opt.step(lr.at(s));
    if (s >= steps - late) {
      out.late_loss += st.loss / late;
      out.late_agree += static_cast<double>(st.agree) / static_cast<double>(st.counted) / late;
    }
  }
  for (Param* p : ps) out.weights.push_back(p->value);
  return out;
}

EagleConfig tiny() {
  EagleConfig cfg;
  cfg.d = 32;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.head_dim = 8;
  cfg.ffn = 48;
  cfg.vocab = 32;
  return cfg;
}

// One layer, and three (the first plus two plain layers); -2: two layers whose head scores a reduced draft
// vocabulary of 6 of the 11 tokens, with targets over draft ids that leave entries unused (id -1).
class WholeDrafterGradient : public ::testing::TestWithParam<int64_t> {};

TEST_P(WholeDrafterGradient, MatchesFiniteDifferences) {
  EagleConfig cfg;
  const bool reduced = GetParam() < 0;
  cfg.n_layer = reduced ? -GetParam() : GetParam();
  if (reduced) cfg.draft_vocab = {1, 3, 4, 7, 9, 10};
  cfg.d = 6;
  cfg.n_head = 2;
  cfg.n_kv_head = 1;
  cfg.head_dim = 4;
  cfg.ffn = 5;
  cfg.vocab = 11;
  cfg.train_head = true;
  tandem::ThreadPool pool(2);
  Compute c(pool);
  Task task(cfg);
  task.n_seqs = 2;
  task.len = 3;
  Task::Batch b;
  task.make(b);
  // Soft targets with several ids and mass left over, and a weight per row.
  std::vector<int32_t> ids;
  std::vector<float> probs, rest, weight;
  for (int64_t r = 0; r < task.rows(); ++r) {
    for (int e = 0; e < 3; ++e)
      ids.push_back(reduced ? static_cast<int32_t>((r + 2 * e) % 6)
                            : static_cast<int32_t>((r + 4 * e) % cfg.vocab));
    probs.insert(probs.end(), {0.5f, 0.2f, 0.1f});
    if (reduced && r % 2 == 1) {
      ids.back() = -1;
      probs.back() = 0.0f;
    }
    rest.push_back(0.2f);
    weight.push_back(std::pow(0.8f, static_cast<float>(r % 3)));
  }
  b.view.targets = {task.rows(), 3, ids.data(), probs.data(), rest.data(), weight.data(), nullptr};
  EagleDrafter m(cfg, task.rows());
  m.init(3);
  fill_frozen(m, 4);
  expect_gradients_match_differences(m, b.view, c, 12);
}

INSTANTIATE_TEST_SUITE_P(TrainEagle, WholeDrafterGradient, ::testing::Values(1, 3, -2));

// The loss starts near ln(32) = 3.47 (chance) and must fall below 0.15, with the drafter's argmax right on
// more than 97% of rows, within 150 steps of 128 rows.
TEST(TrainEagle, LearnsASyntheticNextTokenTask) {
  const RunResult r = train(tiny(), 1, 150, 1);
  std::printf("synthetic task after 150 steps: loss %.4f, argmax agreement %.3f\n", r.late_loss,
              r.late_agree);
  EXPECT_LT(r.late_loss, 0.15);
  EXPECT_GT(r.late_agree, 0.97);
}

// Same seed, same thread count: the same bits. The matrix products split outputs, never reductions, so a
// different thread count gives the same bits too.
TEST(TrainEagle, DeterministicForASeed) {
  const RunResult a = train(tiny(), 2, 10, 7), b = train(tiny(), 2, 10, 7), one = train(tiny(), 1, 10, 7);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    EXPECT_EQ(a.weights[i], b.weights[i]) << "parameter " << i;
    EXPECT_EQ(a.weights[i], one.weights[i]) << "parameter " << i << " with one thread";
  }
  const RunResult other = train(tiny(), 2, 10, 8);
  EXPECT_NE(a.weights[0], other.weights[0]) << "another seed starts elsewhere";
}

// Tokens per second of a training step (forward, backward, clipping, AdamW) at stories260K's size: d 64,
// 8 heads, 4 KV heads, ffn 172, vocab 512; 4 sequences of 64 rows. Reported, not asserted.
TEST(TrainEagle, StepThroughputAtStories260KSize) {
  EagleConfig cfg;  // the defaults are stories260K's
  for (int threads : {1, 2}) {
    tandem::ThreadPool pool(threads);
    Compute c(pool);
    Task task(cfg);
    task.len = 64;
    EagleDrafter m(cfg, task.rows());
    m.init(1);
    fill_frozen(m, 2);
    const std::vector<Param*> ps = m.params();
    AdamW opt(ps, {});
    Task::Batch b;
    task.make(b);
    const auto step = [&] {
      m.zero_grad();
      const LossStats st = m.forward_backward(b.view, c);
      clip_grad_norm(ps, 1.0);
      opt.step(1e-3);
      return st.loss;
    };
    step();
    const int steps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int s = 0; s < steps; ++s) loss = step();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(std::isfinite(loss));
    const double tps = static_cast<double>(steps * task.rows()) / secs;
    std::printf("stories260K-size EAGLE step, %d thread(s): %.0f tokens/s (%.2f ms per %lld-row step)\n",
                threads, tps, 1e3 * secs / steps, static_cast<long long>(task.rows()));
    RecordProperty(threads == 1 ? "tokens_per_s_1_thread" : "tokens_per_s_2_threads", static_cast<int>(tps));
  }
}

}  // namespace
