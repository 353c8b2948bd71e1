// What the drafter trainers' suites share: normal random values, and the check of a drafter's whole backward
// against central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tandem/train/param.h"

namespace tandem::train::fixture {

inline std::vector<float> randn(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// Runs m's forward and backward over `batch` once, then, for `samples` entries of each trainable parameter
// (the same picks for every parameter), expects the analytic gradient to match the central difference of
// the loss at step 1e-2; returns the entries checked.
template <typename Drafter, typename Batch, typename Compute>
int expect_gradients_match_differences(Drafter& m, const Batch& batch, Compute& c, int samples) {
  m.forward_backward(batch, c);
  constexpr float kStep = 1e-2f;
  int checked = 0;
  for (Param* p : m.params()) {
    if (!p->trainable()) continue;
    const std::vector<float> analytic = p->grad;
    std::mt19937 pick(11);
    for (int t = 0; t < samples; ++t) {
      const size_t i = pick() % p->value.size();
      const float saved = p->value[i];
      p->value[i] = saved + kStep;
      const double up = m.forward_backward(batch, c, false).loss;
      p->value[i] = saved - kStep;
      const double down = m.forward_backward(batch, c, false).loss;
      p->value[i] = saved;
      const double numeric = (up - down) / (2.0 * kStep), a = analytic[i];
      EXPECT_LE(std::abs(a - numeric), 2e-3 + 1e-2 * std::max(std::abs(a), std::abs(numeric)))
          << p->name << "[" << i << "]: analytic " << a << ", numeric " << numeric;
      ++checked;
    }
  }
  return checked;
}

}  // namespace tandem::train::fixture
