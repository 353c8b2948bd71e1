#include "tandem/kernels/ops.h"

#include <cmath>

#include "tandem/kernels/float_kernels.h"

namespace tandem::kernels {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  // Eight interleaved partial sums (interleaved_sum8): one running sum is a chain of dependent adds, about
  // twice the time per norm, though a small share of a step (performance.md).
  const double sum = interleaved_sum8<double>(n, [x](int64_t i) { return static_cast<double>(x[i]) * x[i]; });
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  }
}

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n, float eps) {
  const double mean = interleaved_sum8<double>(n, [x](int64_t i) { return static_cast<double>(x[i]); }) /
                      static_cast<double>(n);
  const double var = interleaved_sum8<double>(n,
                                              [x, mean](int64_t i) {
                                                const double d = x[i] - mean;
                                                return d * d;
                                              }) /
                     static_cast<double>(n);
  const auto m = static_cast<float>(mean);
  const float scale = 1.0f / std::sqrt(static_cast<float>(var) + eps);
  for (int64_t i = 0; i < n; ++i) {
    float v = (x[i] - m) * scale;
    if (w) v *= w[i];
    if (b) v += b[i];
    y[i] = v;
  }
}

void rope_angles(int64_t n_rot, const float* inv_freq, int64_t pos, float* cs) {
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double theta = static_cast<double>(pos) * inv_freq[i];
    cs[2 * i] = static_cast<float>(std::cos(theta));
    cs[2 * i + 1] = static_cast<float>(std::sin(theta));
  }
}

void rope_apply(float* x, int64_t n_rot, const float* cs, bool neox) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  silu_mul(gate, up, out, n);
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kCoef = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float t = std::tanh(kSqrt2OverPi * g * (1.0f + kCoef * g * g));
    out[i] = 0.5f * g * (1.0f + t) * up[i];
  }
}

void gelu(float* x, int64_t n) {
  gelu_tanh(x, n);
}

void gelu_reference(float* x, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kCoef = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = x[i];
    x[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + kCoef * g * g)));
  }
}

void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void add_in_place(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace tandem::kernels
