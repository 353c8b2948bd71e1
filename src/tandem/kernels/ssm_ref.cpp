#include <cmath>

#include "tandem/kernels/ssm.h"

namespace tandem::kernels {

float ssm_softplus(float x) {
  return x <= 20.0f ? std::log1p(std::exp(x)) : x;
}

void ssm_conv_step_ref(const SsmConvArgs& a, int64_t i0, int64_t i1) {
  const int64_t K = a.d_conv, N = a.d_inner;
  for (int64_t i = i0; i < i1; ++i) {
    float sum = a.b[i];
    for (int64_t k = 0; k + 1 < K; ++k) sum += a.w[k * N + i] * a.state_in[k * N + i];
    sum += a.w[(K - 1) * N + i] * a.x[i];
    a.y[i] = sum / (1.0f + std::exp(-sum));
    for (int64_t k = 0; k + 2 < K; ++k) a.state_out[k * N + i] = a.state_in[(k + 1) * N + i];
    if (K > 1) a.state_out[(K - 2) * N + i] = a.x[i];
  }
}

void ssm_scan_step_ref(const SsmScanArgs& a, int64_t i0, int64_t i1) {
  const int64_t N = a.d_inner;
  for (int64_t i = i0; i < i1; ++i) {
    const float dt = ssm_softplus(a.dt[i]);
    const float x_dt = a.x[i] * dt;
    float sum = 0.0f;
    for (int64_t s = 0; s < a.d_state; ++s) {
      const float next = a.state_in[s * N + i] * std::exp(dt * a.a[s * N + i]) + a.b[s] * x_dt;
      a.state_out[s * N + i] = next;
      sum += next * a.c[s];
    }
    const float y = sum + a.x[i] * a.d[i];
    const float z = a.z[i];
    a.y[i] = y * (z / (1.0f + std::exp(-z)));
  }
}

}  // namespace tandem::kernels
