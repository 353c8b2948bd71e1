// The DFlash-style block drafter's trainer: the whole backward (context projection and norm, per-layer
// context keys and values, the mask embedding, two decoder layers) against finite differences, and a
// synthetic block task it must learn.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "tandem/train/dflash.h"
#include "tandem/train/optimizer.h"
#include "tandem/util/error.h"
#include "tandem/util/thread_pool.h"
#include "train_fixture.h"

namespace {

using namespace tandem::train;
using tandem::train::fixture::expect_gradients_match_differences;
using tandem::train::fixture::randn;

void fill_frozen(DflashDrafter& m, uint32_t seed) {
  std::mt19937 rng(seed);
  m.embedding().value = randn(m.embedding().size(), rng);
  m.head().value = randn(m.head().size(), rng);
}

// A synthetic block task. A sequence counts from a random start by a stride s in {1, 2, 3, 5} (mod vocab);
// the context rows carry each earlier token and the stride (fixed random codes plus noise). A block anchored
// at position a holds token a and must draft tokens a + 1 .. a + B, which needs the stride from the context
// (the anchor alone cannot tell) and the row's position within the block.
struct Task {
  DflashConfig cfg;
  int64_t len = 24, anchors = 6;
  std::vector<float> token_code, stride_code;  // [vocab, taps], [4, taps]
  std::mt19937 rng{99};

  explicit Task(const DflashConfig& c) : cfg(c) {
    const int64_t w = cfg.n_taps * cfg.d;
    token_code = randn(cfg.vocab * w, rng);
    stride_code = randn(4 * w, rng);
  }
  int64_t rows() const { return anchors * cfg.block; }

  struct Batch {
    std::vector<float> taps, probs, weight;
    std::vector<int32_t> ctx_pos, block_ids, block_pos, target_ids;
    std::vector<int64_t> visible;
    DflashBatch view;
  };
  void make(Batch& b) {
    static constexpr int kStrides[4] = {1, 2, 3, 5};
    const int64_t w = cfg.n_taps * cfg.d, B = cfg.block, R = rows();
    const int si = static_cast<int>(rng() % 4);
    const int64_t stride = kStrides[si], start = static_cast<int64_t>(rng() % cfg.vocab);
    const auto token = [&](int64_t i) { return static_cast<int32_t>((start + i * stride) % cfg.vocab); };
    std::normal_distribution<float> noise(0.0f, 0.1f);
    b.taps.resize(static_cast<size_t>(len * w));
    b.ctx_pos.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) {
      b.ctx_pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      for (int64_t j = 0; j < w; ++j)
        b.taps[static_cast<size_t>(i * w + j)] = token_code[static_cast<size_t>(token(i) * w + j)] +
                                                 stride_code[static_cast<size_t>(si * w + j)] + noise(rng);
    }
    b.block_ids.assign(static_cast<size_t>(R), 0);
    b.block_pos.resize(static_cast<size_t>(R));
    b.target_ids.resize(static_cast<size_t>(R));
    b.probs.assign(static_cast<size_t>(R), 1.0f);
    b.weight.resize(static_cast<size_t>(R));
    b.visible.resize(static_cast<size_t>(anchors));
    for (int64_t a = 0; a < anchors; ++a) {
      const int64_t anchor = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(len - 1));
      b.visible[static_cast<size_t>(a)] = anchor;
      b.block_ids[static_cast<size_t>(a * B)] = token(anchor);
      for (int64_t k = 0; k < B; ++k) {
        const auto r = static_cast<size_t>(a * B + k);
        b.block_pos[r] = static_cast<int32_t>(anchor + k);
        b.target_ids[r] = token(anchor + k + 1);
        b.weight[r] = std::exp(-static_cast<float>(k) / 4.0f);
      }
    }
    b.view = {
        .context_rows = len,
        .taps = b.taps.data(),
        .context_pos = b.ctx_pos.data(),
        .rows = R,
        .block_ids = b.block_ids.data(),
        .block_pos = b.block_pos.data(),
        .context_visible = b.visible.data(),
        .targets = SoftTargets{R, 1, b.target_ids.data(), b.probs.data(), nullptr, b.weight.data(), nullptr}};
  }
};

TEST(TrainDflash, WholeDrafterGradient) {
  DflashConfig cfg;
  cfg.d = 6;
  cfg.n_head = 2;
  cfg.n_kv_head = 1;
  cfg.head_dim = 4;
  cfg.ffn = 5;
  cfg.vocab = 11;
  cfg.n_layers = 2;
  cfg.block = 3;
  tandem::ThreadPool pool(2);
  Compute c(pool);
  Task task(cfg);
  task.len = 5;
  task.anchors = 2;
  Task::Batch b;
  task.make(b);
  // Soft targets with several ids and mass left over.
  std::vector<int32_t> ids;
  std::vector<float> probs, rest;
  for (int64_t r = 0; r < task.rows(); ++r) {
    for (int e = 0; e < 3; ++e) ids.push_back(static_cast<int32_t>((r + 4 * e) % cfg.vocab));
    probs.insert(probs.end(), {0.5f, 0.2f, 0.1f});
    rest.push_back(0.2f);
  }
  b.view.targets = {task.rows(), 3, ids.data(), probs.data(), rest.data(), b.weight.data(), nullptr};
  DflashDrafter m(cfg, task.len, task.rows());
  m.init(3);
  fill_frozen(m, 4);
  const int checked = expect_gradients_match_differences(m, b.view, c, 10);
  EXPECT_EQ(checked, 10 * (3 + 2 * 9 + 1));  // fc, context norm, mask embedding, 2 layers, output norm
}

TEST(TrainDflash, BlockWithoutContextAndBadIdsAreHandled) {
  DflashConfig cfg;
  cfg.d = 8;
  cfg.n_head = 2;
  cfg.n_kv_head = 1;
  cfg.head_dim = 4;
  cfg.ffn = 6;
  cfg.vocab = 9;
  cfg.block = 2;
  tandem::ThreadPool pool(1);
  Compute c(pool);
  DflashDrafter m(cfg, 4, 2);
  m.init(1);
  fill_frozen(m, 2);
  const int32_t ids[2] = {3, 0}, pos[2] = {0, 1}, target[2] = {4, 5};
  const float probs[2] = {1, 1};
  const int64_t visible[1] = {0};
  DflashBatch b{.rows = 2, .block_ids = ids, .block_pos = pos, .context_visible = visible};
  b.targets = SoftTargets{2, 1, target, probs};
  EXPECT_TRUE(std::isfinite(m.forward_backward(b, c).loss));
  const int32_t bad[2] = {9, 0};
  b.block_ids = bad;
  EXPECT_THROW(m.forward_backward(b, c), tandem::Error);
  b.block_ids = ids;
  b.rows = 1;
  EXPECT_THROW(m.forward_backward(b, c), tandem::Error);
}

// The loss of the first steps (near chance, ln 32 = 3.47, or above) must fall by more than half, and the
// argmax must be right on far more rows than chance (1/32), within 300 steps of 6 blocks of 4.
TEST(TrainDflash, LearnsASyntheticBlockTask) {
  DflashConfig cfg;
  cfg.d = 32;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.head_dim = 8;
  cfg.ffn = 48;
  cfg.vocab = 32;
  cfg.block = 4;
  tandem::ThreadPool pool(1);
  Compute c(pool);
  Task task(cfg);
  DflashDrafter m(cfg, task.len, task.rows());
  m.init(1);
  fill_frozen(m, 5);
  const std::vector<Param*> ps = m.params();
  AdamW opt(ps, {0.9, 0.95, 1e-8, 0.01});
  const int64_t steps = 300, late = 20;
  const LrSchedule lr{3e-3, 3e-4, 20, steps};
  Task::Batch b;
  double early_loss = 0, late_loss = 0, late_agree = 0;
  for (int64_t s = 0; s < steps; ++s) {
    task.make(b);
    m.zero_grad();
    const LossStats st = m.forward_backward(b.view, c);
    clip_grad_norm(ps, 1.0);
    opt.step(lr.at(s));
    if (s < late) early_loss += st.loss / late;
    if (s >= steps - late) {
      late_loss += st.loss / late;
      late_agree += static_cast<double>(st.agree) / static_cast<double>(st.counted) / late;
    }
  }
  std::printf("synthetic block task: loss %.4f at first, %.4f after %lld steps, argmax agreement %.3f\n",
              early_loss, late_loss, static_cast<long long>(steps), late_agree);
  EXPECT_LT(late_loss, 0.5 * early_loss);
  EXPECT_GT(late_agree, 0.2);
}

}  // namespace
