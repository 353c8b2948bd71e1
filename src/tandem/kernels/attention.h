// Attention of one query head over a span of cached positions.
#pragma once

#include <cstdint>

#include "tandem/cache/kv_cache.h"

namespace tandem::kernels {

struct AttentionParams {
  float scale = 1.0f;    // multiplies q·k
  float softcap = 0.0f;  // 0: none; else s = cap * tanh(s / cap)
};

// out[dim_v] = sum_j softmax_j(s_j) * V[j],  s_j = scale * q·K[j], over cached positions j in [first, last].
//   q: [dim] f32; keys: rows of `dim` elements; values: rows of `dim_v` elements (both of `type`);
//   scores: scratch of at least last + 1 floats. Fixed reduction order: the result depends only on the inputs.
void attend(const float* q, const void* keys, const void* values, cache::KvType type, int64_t dim, int64_t dim_v,
            int64_t first, int64_t last, const AttentionParams& params, float* scores, float* out);

}  // namespace tandem::kernels
