// Attention of one query head over a sequence's paged cache, reading the encoded rows directly (no
// dequantized copy of the cache is made).
#pragma once

#include <cstdint>

#include "tandem/cache/kv_cache.h"

namespace tandem::cache {

struct AttentionParams {
  float scale = 1.0f;    // multiplies q·k
  float softcap = 0.0f;  // 0: none; else s = cap * tanh(s / cap)
};

// out[head_dim_v] = sum_j softmax_j(s_j) * V[j], s_j = scale * q·K[j], over positions j in [first, last] of
// `layer` and KV head `kv_head` of the cache (for an anchored key cache, q·K[j] = q·(K[j] - a) + q·a with the
// anchor a of K[j]'s block). q: [head_dim] f32; scores: scratch of at least last - first + 1
// floats. The reduction order is fixed by the positions alone, so a row gives the same bits whichever batch
// it runs in. Thread safe for concurrent calls on one cache (it only reads).
void attend(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t first, int64_t last,
            const AttentionParams& params, float* scores, float* out);

// Queries that share one pass over the cache rows in attend_group.
constexpr int64_t kMaxGroupQueries = 8;

// attend() for n_q query heads that share KV head `kv_head` (grouped-query attention): query h at
// q + h * q_stride, its scores scratch at scores + h * scores_stride (at least last - first + 1 floats), its
// output at out + h * out_stride. Where the codecs have grouped forms, each cache row is read and decoded
// once for up to kMaxGroupQueries queries; each head's result is bit-identical to attend() (which is this
// with one head).
void attend_group(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_q,
                  int64_t q_stride, int64_t first, int64_t last, const AttentionParams& params, float* scores,
                  int64_t scores_stride, float* out, int64_t out_stride);

}  // namespace tandem::cache
