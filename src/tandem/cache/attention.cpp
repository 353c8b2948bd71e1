#include "tandem/cache/attention.h"

#include <algorithm>

#include "tandem/kernels/float_kernels.h"
#include "tandem/util/error.h"

namespace tandem::cache {
namespace {

// Scaled (and soft-capped) scores to probabilities, in place; the one softmax both attention forms use.
void softmax(float* scores, int64_t count, const AttentionParams& params) {
  kernels::softmax(scores, count, params.scale, params.softcap);
}

}  // namespace

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
  softmax(scores, last - first + 1, params);

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

void attend_group(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_q,
                  int64_t q_stride, int64_t first, int64_t last, const AttentionParams& params, float* scores,
                  int64_t scores_stride, float* out, int64_t out_stride) {
  TANDEM_CHECK(first >= 0 && first <= last && last < cache.length(), "attention span outside the cache");
  TANDEM_CHECK(last - first + 1 <= scores_stride, "attention scores scratch too small");
  const KvStore& store = cache.store();
  const KvCodec& kc = store.key_codec();
  const KvCodec& vc = store.value_codec();
  const BlockPool& pool = cache.pool_of(layer);
  const int64_t B = store.block_size();
  // Anchored keys add a per-block term per head: those caches take the per-head path.
  if (n_q > kMaxGroupQueries || store.key_anchor() != nullptr) {
    for (int64_t h = 0; h < n_q; ++h)
      attend(cache, layer, kv_head, q + h * q_stride, first, last, params, scores + h * scores_stride,
             out + h * out_stride);
    return;
  }
  float prepared[kMaxGroupQueries * 2 * kMaxHeadDim];
  const int64_t ps = kc.prepared_size();
  for (int64_t h = 0; h < n_q; ++h) kc.prepare_query(q + h * q_stride, kv_head, prepared + h * ps);
  for (int64_t pos = first; pos <= last;) {
    const int64_t off = pos % B, n = std::min(B - off, last - pos + 1);
    const int32_t blk = cache.block_of(layer, pos);
    TANDEM_CHECK(blk >= 0, "attention reads a released block");
    kc.dots_group(prepared, n_q, ps,
                  pool.keys(blk, layer, kv_head) + static_cast<size_t>(off) * kc.row_bytes(), n,
                  scores + (pos - first), scores_stride);
    pos += n;
  }
  for (int64_t h = 0; h < n_q; ++h) softmax(scores + h * scores_stride, last - first + 1, params);
  float acc[kMaxGroupQueries * kMaxHeadDim];
  std::fill_n(acc, n_q * vc.dim(), 0.0f);
  for (int64_t pos = first; pos <= last;) {
    const int64_t off = pos % B, n = std::min(B - off, last - pos + 1);
    const int32_t blk = cache.block_of(layer, pos);
    vc.accumulate_group(scores + (pos - first), n_q, scores_stride,
                        pool.values(blk, layer, kv_head) + static_cast<size_t>(off) * vc.row_bytes(), n, acc,
                        vc.dim());
    pos += n;
  }
  for (int64_t h = 0; h < n_q; ++h) vc.finish_values(acc + h * vc.dim(), kv_head, out + h * out_stride);
}

}  // namespace tandem::cache
