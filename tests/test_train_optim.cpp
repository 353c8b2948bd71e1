// The optimizer, the schedule and clipping against values computed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tandem/train/optimizer.h"
#include "tandem/train/param.h"

namespace {

using namespace tandem::train;

TEST(TrainOptim, ScheduleWarmsUpThenDecays) {
  const LrSchedule s{1e-3, 1e-4, 4, 12};
  EXPECT_DOUBLE_EQ(s.at(0), 2.5e-4);           // 1e-3 * 1/4
  EXPECT_DOUBLE_EQ(s.at(2), 7.5e-4);           // 1e-3 * 3/4
  EXPECT_DOUBLE_EQ(s.at(3), 1e-3);             // the end of warm-up is the peak
  EXPECT_DOUBLE_EQ(s.at(4), 1e-3);             // cos(0)
  EXPECT_NEAR(s.at(8), 5.5e-4, 1e-15);         // halfway: 1e-4 + 9e-4 * (1 + cos(pi/2)) / 2
  EXPECT_NEAR(s.at(10), 2.3180195e-4, 1e-11);  // cos(3pi/4) = -sqrt(1/2): 1e-4 + 9e-4 * 0.1464466
  EXPECT_DOUBLE_EQ(s.at(12), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(1000), 1e-4);
  const LrSchedule no_warmup{2.0, 0.0, 0, 2};
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 2.0);
  EXPECT_NEAR(no_warmup.at(1), 1.0, 1e-15);
}

TEST(TrainOptim, ClipsByGlobalNorm) {
  Param a("a", 2, 1, true, false), b("b", 1, 1, true, false), frozen("f", 1, 1, false, false);
  a.grad = {3.0f, 4.0f};
  b.grad = {12.0f};
  Param* ps[] = {&a, &b, &frozen};
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 20.0), 13.0);  // sqrt(9 + 16 + 144); under the limit: unchanged
  EXPECT_EQ(a.grad[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 6.5), 13.0);
  EXPECT_FLOAT_EQ(a.grad[0], 1.5f);
  EXPECT_FLOAT_EQ(a.grad[1], 2.0f);
  EXPECT_FLOAT_EQ(b.grad[0], 6.0f);
  EXPECT_NEAR(clip_grad_norm(ps, 0.0), 6.5, 1e-6);  // measures only
}

// Two steps of one weight, by hand: w 1, decay 0.1, lr 0.1, betas (0.9, 0.999).
//   step 1, g 0.5:  w = 0.99 - 0.1 * 0.5 / (sqrt(0.25) + eps) = 0.89
//   step 2, g -1:   m = -0.055, v = 0.00124975; m^ = -0.055 / 0.19, v^ = 0.00124975 / 0.001999
//                   w = 0.89 * 0.99 - 0.1 * m^ / sqrt(v^) = 0.8811 + 0.0366107 = 0.9177107
TEST(TrainOptim, AdamWStepsByHand) {
  Param w("w", 1, 1, true, true), gain("g", 1, 1, true, false), frozen("f", 1, 1, false, true);
  w.value = {1.0f};
  gain.value = {1.0f};
  frozen.value = {1.0f};
  Param* ps[] = {&w, &gain, &frozen};
  AdamW opt(ps, {0.9, 0.999, 1e-8, 0.1});
  w.grad = {0.5f};
  gain.grad = {0.5f};
  opt.step(0.1);
  EXPECT_NEAR(w.value[0], 0.89f, 1e-6);
  EXPECT_NEAR(gain.value[0], 0.9f, 1e-6);  // no decay on a gain
  EXPECT_EQ(frozen.value[0], 1.0f);
  w.grad = {-1.0f};
  opt.step(0.1);
  const double m_hat = -0.055 / 0.19, v_hat = 0.00124975 / 0.001999;
  EXPECT_NEAR(w.value[0], 0.89 * 0.99 - 0.1 * m_hat / std::sqrt(v_hat), 1e-6);
  EXPECT_NEAR(w.value[0], 0.9177107, 1e-6);
  EXPECT_EQ(opt.steps(), 2);
}

// A quadratic bowl: AdamW with the schedule walks every coordinate to its minimum.
TEST(TrainOptim, AdamWMinimizesAQuadratic) {
  Param x("x", 5, 1, true, false);
  const std::vector<float> target = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f};
  Param* ps[] = {&x};
  AdamW opt(ps, {});
  const LrSchedule lr{0.1, 0.0, 10, 400};
  for (int64_t s = 0; s < 400; ++s) {
    for (size_t i = 0; i < target.size(); ++i) x.grad[i] = 2.0f * (x.value[i] - target[i]);
    opt.step(lr.at(s));
  }
  for (size_t i = 0; i < target.size(); ++i) EXPECT_NEAR(x.value[i], target[i], 1e-3) << i;
}

}  // namespace
