#include "tandem/train/optimizer.h"

#include <cmath>
#include <numbers>

namespace tandem::train {

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return floor;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return floor + (peak - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double clip_grad_norm(std::span<Param* const> params, double max_norm) {
  double sum = 0;
  for (const Param* p : params)
    for (float g : p->grad) sum += static_cast<double>(g) * g;
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const auto scale = static_cast<float>(max_norm / norm);
    for (Param* p : params)
      for (float& g : p->grad) g *= scale;
  }
  return norm;
}

AdamW::AdamW(std::span<Param* const> params, AdamWConfig config) : config_(config) {
  for (Param* p : params) {
    if (!p->trainable()) continue;
    params_.push_back(p);
    m_.emplace_back(p->value.size(), 0.0f);
    v_.emplace_back(p->value.size(), 0.0f);
  }
}

void AdamW::step(double lr) {
  ++t_;
  const double b1 = config_.beta1, b2 = config_.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(t_)),
               c2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    const auto shrink = static_cast<float>(p.decay ? 1.0 - lr * config_.weight_decay : 1.0);
    float* w = p.value.data();
    const float* g = p.grad.data();
    float* m = m_[i].data();
    float* v = v_[i].data();
    const auto fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
    const auto step_size = static_cast<float>(lr / c1), inv_c2 = static_cast<float>(1.0 / c2);
    const auto eps = static_cast<float>(config_.eps);
    for (size_t j = 0; j < p.value.size(); ++j) {
      m[j] = fb1 * m[j] + (1.0f - fb1) * g[j];
      v[j] = fb2 * v[j] + (1.0f - fb2) * g[j] * g[j];
      w[j] = w[j] * shrink - step_size * m[j] / (std::sqrt(v[j] * inv_c2) + eps);
    }
  }
}

}  // namespace tandem::train
