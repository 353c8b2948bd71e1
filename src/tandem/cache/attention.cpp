#include "tandem/cache/attention.h"

#include <algorithm>
#include <cmath>

#include "tandem/util/error.h"

namespace tandem::cache {

void attend(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t first, int64_t last,
            const AttentionParams& params, float* scores, float* out) {
  TANDEM_CHECK(first >= 0 && first <= last && last < cache.length(), "attention span outside the cache");
  const KvStore& store = cache.store();
  const KvCodec& kc = store.key_codec();
  const KvCodec& vc = store.value_codec();
  const KeyAnchor* anchor = store.key_anchor();
  const BlockPool& pool = cache.pool_of(layer);
  const int64_t B = store.block_size();
  float prepared[2 * kMaxHeadDim];
  float acc[kMaxHeadDim];
  kc.prepare_query(q, kv_head, prepared);

  // Scores block by block: each run of positions lies in one block, rows consecutive.
  for (int64_t pos = first; pos <= last;) {
    const int64_t off = pos % B, n = std::min(B - off, last - pos + 1);
    const int32_t blk = cache.block_of(layer, pos);
    TANDEM_CHECK(blk >= 0, "attention reads a released block");
    float* s = scores + (pos - first);
    kc.dots(prepared, pool.keys(blk, layer, kv_head) + static_cast<size_t>(off) * kc.row_bytes(), n, s);
    if (anchor) {
      const float qa = anchor->dot(q, pool.anchor(blk, layer, kv_head));
      for (int64_t j = 0; j < n; ++j) s[j] += qa;
    }
    pos += n;
  }
  const int64_t count = last - first + 1;
  float max_score = -INFINITY;
  for (int64_t j = 0; j < count; ++j) {
    float s = scores[j] * params.scale;
    if (params.softcap > 0) s = params.softcap * std::tanh(s / params.softcap);
    scores[j] = s;
    max_score = std::max(max_score, s);
  }
  double sum = 0;
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < count; ++j) scores[j] *= inv;

  std::fill_n(acc, vc.dim(), 0.0f);
  for (int64_t pos = first; pos <= last;) {
    const int64_t off = pos % B, n = std::min(B - off, last - pos + 1);
    const int32_t blk = cache.block_of(layer, pos);
    vc.accumulate(scores + (pos - first),
                  pool.values(blk, layer, kv_head) + static_cast<size_t>(off) * vc.row_bytes(), n, acc);
    pos += n;
  }
  vc.finish_values(acc, kv_head, out);
}

}  // namespace tandem::cache
