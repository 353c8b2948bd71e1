#include <cmath>

#include "tandem/kernels/ssm.h"

namespace tandem::kernels {

float ssm_softplus(float x) {
  return x <= 20.0f ? std::log1p(std::exp(x)) : x;
}

void ssm_conv_step_ref(const SsmConvArgs& a, int64_t i0, int64_t i1) {
  const int64_t K = a.d_conv, N = a.d_inner;
  for (int64_t i = i0; i < i1; ++i) {
    const float* w = a.w + i * K;
    float sum = 0.0f;
    for (int64_t k = 0; k + 1 < K; ++k) sum += w[k] * a.state_in[k * N + i];
    sum += w[K - 1] * a.x[i];
    sum += a.b[i];
    a.y[i] = sum / (1.0f + std::exp(-sum));
    for (int64_t k = 0; k + 2 < K; ++k) a.state_out[k * N + i] = a.state_in[(k + 1) * N + i];
    if (K > 1) a.state_out[(K - 2) * N + i] = a.x[i];
  }
}

void ssm_scan_step_ref(const SsmScanArgs& a, int64_t i0, int64_t i1) {
  const int64_t S = a.d_state;
  for (int64_t i = i0; i < i1; ++i) {
    const float dt = ssm_softplus(a.dt[i]);
    const float x_dt = a.x[i] * dt;
    const float* s0 = a.state_in + i * S;
    float* s1 = a.state_out + i * S;
    const float* A = a.a + i * S;
    float sum = 0.0f;
    for (int64_t s = 0; s < S; ++s) {
      s1[s] = s0[s] * std::exp(dt * A[s]) + a.b[s] * x_dt;
      sum += s1[s] * a.c[s];
    }
    const float y = sum + a.x[i] * a.d[i];
    const float z = a.z[i];
    a.y[i] = y * (z / (1.0f + std::exp(-z)));
  }
}

void ssm_conv_step(const SsmConvArgs& a, int64_t i0, int64_t i1) {
  ssm_conv_step_ref(a, i0, i1);
}

void ssm_scan_step(const SsmScanArgs& a, int64_t i0, int64_t i1) {
  ssm_scan_step_ref(a, i0, i1);
}

}  // namespace tandem::kernels
