// Portable quantized kernels: the reference the SIMD targets are tested against, and the fallback on CPUs
// without a SIMD target. Sums run in group order, one group at a time (an exact integer sum, then one
// float scaling).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/kernels/quant_layout.h"
#include "tandem/kernels/quant_plain_ops.h"
#include "tandem/kernels/quant_unpack.h"
#include "tandem/kernels/repack.h"
#include "tandem/tensor/blocks.h"
#include "tandem/tensor/fp16.h"

namespace tandem::kernels {
namespace scalar_target {

struct Ops : PlainOps<Ops> {
  static constexpr bool kBlockLanes = false;    // the legacy types in block order (quant_layout.h)
  static constexpr bool kK4BlockLanes = false;  // Q4_K and Q5_K in group order
};
using Unpack = QuantUnpack<Ops>;

float dot_one(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, bool signed_codes) {
  float acc = 0.0f, acc_b = 0.0f;
  for (int64_t s = 0; s < n_super; ++s) {
    const UnpackedSuper& W = w[s];
    const ActSuper& X = x[s];
    for (int g = 0; g < kGroups; ++g) {
      int32_t dot = 0;
      for (int q = 0; q < 4; ++q)
        for (int i = 64 * q + 4 * g; i < 64 * q + 4 * g + 4; ++i)
          dot += (signed_codes ? static_cast<int32_t>(static_cast<int8_t>(W.u[i]))
                               : static_cast<int32_t>(W.u[i])) *
                 X.q[i];
      acc += static_cast<float>(dot) * (W.a[g] * X.d[g]);
    }
    for (int g = 0; g < kGroups; ++g) acc_b += W.b[g] * X.bs[g];
  }
  return acc + acc_b;
}

void dot_rows(const UnpackedSuper* w, int64_t n_super, const ActSuper* x, int64_t x_stride, int64_t n_rows,
              DType /*type*/, bool signed_codes, float* y, int64_t y_stride) {
  for (int64_t r = 0; r < n_rows; ++r) y[r * y_stride] = dot_one(w, n_super, x + r * x_stride, signed_codes);
}

}  // namespace scalar_target

bool is_quantized_weight(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

bool per_super_activations(DType t) {
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

namespace scalar_target {

// The throughput probe (QuantKernels::dot_probe) in plain C++.
void dot_probe(const uint8_t* u, const int8_t* s, int64_t iterations, uint32_t* sums) {
  uint32_t acc[kDotProbeChains] = {};
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kDotProbeChains; ++c)
      for (int b = 0; b < 64; ++b) acc[c] += static_cast<uint32_t>(u[b] * s[64 * c + b]);
  for (int c = 0; c < kDotProbeChains; ++c) sums[c] = acc[c];
}

}  // namespace scalar_target

const QuantKernels& quant_kernels_scalar() {
  static const QuantKernels k{false,
                              false,
                              scalar_target::Unpack::unpack_row_impl,
                              scalar_target::Unpack::quantize_row_impl,
                              scalar_target::dot_rows,
                              no_direct_rows,
                              no_direct_rows,
                              nullptr,
                              scalar_target::dot_probe};
  return k;
}

}  // namespace tandem::kernels
