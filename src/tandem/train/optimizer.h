// AdamW with decoupled weight decay and bias correction, the learning-rate schedule (linear warm-up, then
// cosine decay) and global-norm gradient clipping.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/train/param.h"

namespace tandem::train {

// lr(step), step counted from 0:
//   step < warmup:      peak * (step + 1) / warmup
//   warmup <= step < total: floor + (peak - floor) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
//   step >= total:      floor
struct LrSchedule {
  double peak = 1e-3;
  double floor = 0.0;
  int64_t warmup = 0;
  int64_t total = 1;
  double at(int64_t step) const;
};

// Scales every trainable gradient by min(1, max_norm / norm), norm = sqrt(sum of squares over all of them)
// (summed in double, parameter by parameter in order). Returns the norm before clipping. max_norm <= 0
// measures without clipping.
double clip_grad_norm(std::span<Param* const> params, double max_norm);

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applies to parameters with decay set
};

// One update per call, for every trainable parameter (decay as in PyTorch's AdamW):
//   w *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// with t the number of updates so far, this one included.
class AdamW {
 public:
  AdamW(std::span<Param* const> params, AdamWConfig config);

  void step(double lr);
  int64_t steps() const { return t_; }
  const AdamWConfig& config() const { return config_; }

  // The moment estimates of params()[i] (same size as its value), for checkpoints.
  std::span<Param* const> params() const { return params_; }
  std::vector<float>& first_moment(size_t i) { return m_[i]; }
  std::vector<float>& second_moment(size_t i) { return v_[i]; }
  const std::vector<float>& first_moment(size_t i) const { return m_[i]; }
  const std::vector<float>& second_moment(size_t i) const { return v_[i]; }
  // Resumes at a step count read from a checkpoint (with the moments restored through the accessors).
  void set_steps(int64_t t) { t_ = t; }

 private:
  std::vector<Param*> params_;  // the trainable ones
  AdamWConfig config_;
  std::vector<std::vector<float>> m_, v_;
  int64_t t_ = 0;
};

}  // namespace tandem::train
