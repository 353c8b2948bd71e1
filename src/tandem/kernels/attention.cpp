#include "tandem/kernels/attention.h"

#include <array>
#include <cmath>

#include "tandem/kernels/matmul.h"
#include "tandem/tensor/fp16.h"

namespace tandem::kernels {
namespace {

// f16 -> f32 for every half value, computed once (read-only afterwards).
const std::array<float, 65536>& half_table() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_to_f32(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}

float dot_f16(const float* q, const uint16_t* k, int64_t n, const float* table) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += q[i + j] * table[k[i + j]];
  for (int j = 0; i < n; ++i, ++j) acc[j] += q[i] * table[k[i]];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

void attend(const float* q, const void* keys, const void* values, cache::KvType type, int64_t dim, int64_t dim_v,
            int64_t first, int64_t last, const AttentionParams& params, float* scores, float* out) {
  const float* table = half_table().data();
  float max_score = -INFINITY;
  for (int64_t j = first; j <= last; ++j) {
    float s = type == cache::KvType::kF32
                  ? dot_f32(q, static_cast<const float*>(keys) + j * dim, dim)
                  : dot_f16(q, static_cast<const uint16_t*>(keys) + j * dim, dim, table);
    s *= params.scale;
    if (params.softcap > 0) s = params.softcap * std::tanh(s / params.softcap);
    scores[j] = s;
    max_score = s > max_score ? s : max_score;
  }
  double sum = 0;
  for (int64_t j = first; j <= last; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t d = 0; d < dim_v; ++d) out[d] = 0;
  for (int64_t j = first; j <= last; ++j) {
    const float p = scores[j] * inv;
    if (type == cache::KvType::kF32) {
      const float* v = static_cast<const float*>(values) + j * dim_v;
      for (int64_t d = 0; d < dim_v; ++d) out[d] += p * v[d];
    } else {
      const uint16_t* v = static_cast<const uint16_t*>(values) + j * dim_v;
      for (int64_t d = 0; d < dim_v; ++d) out[d] += p * table[v[d]];
    }
  }
}

}  // namespace tandem::kernels
