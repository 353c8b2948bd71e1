#include "tandem/cache/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/kernels/float_kernels.h"
#include "tandem/util/error.h"

namespace tandem::cache {
namespace {

// How far ahead of the block being read attention prefetches keys and values into L2 (attend_pass).
// How far ahead the keys and values of the span are prefetched into L2 (docs/performance.md).
constexpr size_t kAheadBytes = size_t{64} << 10;

// Stack scratch of one pass (attend_pass): prepared queries and value sums.
constexpr int64_t kPreparedFloats = 16384, kAccFloats = 8192;
// Cache blocks whose value rows one accumulate_runs call weighs: four 16-position blocks of f16 values (8 KB
// at head size 64) stay in L1 beside the scores; one block a call is slower (docs/performance.md).
constexpr int64_t kValueRunBlocks = 4;

// Positions of one block a latent cache's values decode at a time (latent_values).
constexpr int64_t kLatentDecodeRows = 16;

// The values of a latent cache (Geometry::values_in_keys): each position's key row decoded once (anchor
// added back; up to kLatentDecodeRows positions of one block per call, as the f16 keys' dimension-major
// blocks read best) and its first dv elements weighed into every query that attends it, positions in order,
// so a query's sum has the same bits alone or in a window.
void latent_values(const KvCache& cache, int64_t layer, int64_t kv_head, int64_t n_q, int64_t nq,
                   int64_t first, int64_t last, int64_t span_last, const float* scores, int64_t scores_stride,
                   float* acc) {
  const KvStore& store = cache.store();
  const KvCodec& kc = store.key_codec();
  const KeyAnchor* anchor = store.key_anchor();
  const BlockPool& pool = cache.pool_of(layer);
  const int64_t B = store.block_size(), dv = store.value_dim(), dk = kc.dim();
  float xs[kLatentDecodeRows * kMaxHeadDim];
  for (int64_t pos = first; pos <= span_last;) {
    const int32_t blk = cache.block_of(layer, pos);
    const int64_t n = std::min({B - pos % B, span_last - pos + 1, kLatentDecodeRows});
    kc.decode_rows_in_block(pool.keys(blk, layer, kv_head), kv_head, B, pos % B, n, xs, dk);
    for (int64_t r = 0; r < n; ++r, ++pos) {
      float* x = xs + r * dk;
      if (anchor) anchor->add(pool.anchor(blk, layer, kv_head), x);
      const int64_t j0 = pos <= last ? 0 : (pos - last) * n_q;  // the first query whose row reaches pos
      for (int64_t j = j0; j < nq; ++j) {
        const float p = scores[j * scores_stride + (pos - first)];
        float* a = acc + j * dv;
        for (int64_t d = 0; d < dv; ++d) a[d] += p * x[d];
      }
    }
  }
}

// One pass of attend_rows over [first, last + n_rows - 1] for n_rows * n_q queries that fit the scratch.
void attend_pass(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_rows,
                 int64_t n_q, const WindowLayout& lay, int64_t first, int64_t last,
                 const AttentionParams& params, float* scores, int64_t scores_stride, float* out) {
  const KvStore& store = cache.store();
  const KvCodec& kc = store.key_codec();
  const KeyAnchor* anchor = store.key_anchor();
  const BlockPool& pool = cache.pool_of(layer);
  const int64_t B = store.block_size(), span_last = last + n_rows - 1, nq = n_rows * n_q;
  const int64_t ps = kc.prepared_size(), dv = store.value_dim();
  float prepared[kPreparedFloats];
  // Query j = i * n_q + h: row i, head h.
  const auto query = [&](int64_t j) { return q + (j / n_q) * lay.q_row + (j % n_q) * lay.q_head; };
  for (int64_t j = 0; j < nq; ++j) kc.prepare_query(query(j), kv_head, prepared + j * ps);

  // Scores block by block: each run of positions lies in one block, rows consecutive. A sequence's blocks lie
  // apart in the pool, so each is prefetched into L1 while the one before it is scored (and its values while
  // the one before is weighed), so that the scoring does not wait for its reads.
  // Further ahead, the keys and then the values of the span, in the order the two loops read them, are
  // prefetched into L2 kAheadBytes ahead of the block being read (the weights streaming through every layer
  // have evicted them since the last step). Row i's scores past last + i are computed and never read.
  const size_t key_block_bytes = static_cast<size_t>(B) * kc.row_bytes();
  const size_t value_block_bytes =
      store.has_values() ? static_cast<size_t>(B) * store.value_codec().row_bytes() : 0;
  const auto prefetch_l1 = [](const uint8_t* p, size_t bytes) {
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
  };
  const auto prefetch_l2 = [](const uint8_t* p, size_t bytes) {
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
  };
  const int64_t b0 = first / B, nb = span_last / B - b0 + 1;
  const auto ahead =
      static_cast<int64_t>(kAheadBytes / std::max<size_t>(64, std::max(key_block_bytes, value_block_bytes)));
  int64_t fetched = 0;  // entries of [keys of blocks b0.., values of blocks b0..] prefetched into L2
  const auto prefetch_ahead = [&](int64_t reading) {
    for (const int64_t until = std::min(2 * nb, reading + ahead + 1); fetched < until; ++fetched) {
      const bool keys = fetched < nb;
      if (!keys && value_block_bytes == 0) break;
      const int32_t blk = cache.block_of(layer, (b0 + (keys ? fetched : fetched - nb)) * B);
      if (keys) {
        prefetch_l2(pool.keys(blk, layer, kv_head), key_block_bytes);
      } else {
        prefetch_l2(pool.values(blk, layer, kv_head), value_block_bytes);
      }
    }
  };
  const auto next_block = [&](int64_t pos) { return pos <= span_last ? cache.block_of(layer, pos) : -1; };
  for (int64_t pos = first; pos <= span_last;) {
    const int64_t off = pos % B, n = std::min(B - off, span_last - pos + 1);
    const int32_t blk = cache.block_of(layer, pos);
    TANDEM_CHECK(blk >= 0, "attention reads a released block");
    prefetch_ahead(pos / B - b0);
    if (const int32_t next = next_block(pos + n); next >= 0)
      prefetch_l1(pool.keys(next, layer, kv_head), key_block_bytes);
    float* s = scores + (pos - first);
    kc.dots_in_block(prepared, nq, ps, pool.keys(blk, layer, kv_head), B, off, n, s, scores_stride);
    if (anchor)
      for (int64_t j = 0; j < nq; ++j) {
        const float qa = anchor->dot(query(j), pool.anchor(blk, layer, kv_head));
        for (int64_t t = 0; t < n; ++t) s[j * scores_stride + t] += qa;
      }
    pos += n;
  }
  for (int64_t j = 0; j < nq; ++j)
    kernels::softmax(scores + j * scores_stride, last + j / n_q - first + 1, params.scale, params.softcap);

  // Values: the positions every row attends, for all queries, kValueRunBlocks blocks a call (their runs of
  // rows, vc.accumulate_runs, the sums kept in registers across them); then each later position for the
  // rows that reach it (a suffix of the queries). Every query's value rows are added in position order
  // either way, so the blocks a call takes never change a bit.
  float acc[kAccFloats];
  std::fill_n(acc, nq * dv, 0.0f);
  if (!store.has_values()) {
    latent_values(cache, layer, kv_head, n_q, nq, first, last, span_last, scores, scores_stride, acc);
    for (int64_t j = 0; j < nq; ++j)
      std::copy_n(acc + j * dv, dv, out + (j / n_q) * lay.out_row + (j % n_q) * lay.out_head);
    return;
  }
  const KvCodec& vc = store.value_codec();
  kernels::ValueRun runs[kValueRunBlocks];
  int64_t n_runs = 0;
  const auto flush = [&] {
    if (n_runs > 0) vc.accumulate_runs(scores, nq, scores_stride, runs, n_runs, acc, dv);
    n_runs = 0;
  };
  for (int64_t pos = first; pos <= span_last;) {
    const int64_t off = pos % B, n = std::min(B - off, span_last - pos + 1);
    const int32_t blk = cache.block_of(layer, pos);
    prefetch_ahead(nb + pos / B - b0);
    if (const int32_t next = next_block(pos + n); next >= 0)
      prefetch_l1(pool.values(next, layer, kv_head), value_block_bytes);
    const uint8_t* rows = pool.values(blk, layer, kv_head) + static_cast<size_t>(off) * vc.row_bytes();
    // The positions of this run that every row attends.
    const int64_t shared = std::clamp<int64_t>(last - pos + 1, 0, n);
    if (shared > 0) runs[n_runs++] = {rows, shared, pos - first};
    if (n_runs == kValueRunBlocks || shared < n) flush();
    for (int64_t t = shared; t < n; ++t) {
      const int64_t j0 = (pos + t - last) * n_q;  // the first query whose row reaches pos + t
      vc.accumulate_group(scores + j0 * scores_stride + (pos + t - first), nq - j0, scores_stride,
                          rows + static_cast<size_t>(t) * vc.row_bytes(), 1, acc + j0 * dv, dv);
    }
    pos += n;
  }
  flush();
  for (int64_t j = 0; j < nq; ++j)
    vc.finish_values(acc + j * dv, kv_head, out + (j / n_q) * lay.out_row + (j % n_q) * lay.out_head);
}

// The path of tree node `node`, root first: path[k] is its ancestor at depth k (path[depth] = node). Returns
// the node's depth.
int64_t tree_path(const TreeMask& mask, int64_t node, int32_t* path) {
  const int64_t d = mask.depth[static_cast<size_t>(node)];
  TANDEM_CHECK(d >= 0 && d < kMaxTreeDepth, "tree deeper than kMaxTreeDepth");
  auto at = static_cast<int32_t>(node);
  for (int64_t k = d; k >= 0; --k) {
    TANDEM_CHECK(at >= 0 && mask.depth[static_cast<size_t>(at)] == k,
                 "tree depths do not follow the parents");
    path[k] = at;
    at = mask.parent[static_cast<size_t>(at)];
  }
  TANDEM_CHECK(at == -1, "tree depths do not follow the parents");
  return d;
}

// One pass of attend_tree for n_rows * n_q queries that fit the scratch.
void attend_tree_pass(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_rows,
                      int64_t n_q, const WindowLayout& lay, const TreeMask& mask, int64_t first_node,
                      int64_t first, const AttentionParams& params, float* scores, int64_t scores_stride,
                      float* out) {
  const KvStore& store = cache.store();
  const KvCodec& kc = store.key_codec();
  const KvCodec& vc = store.value_codec();
  const KeyAnchor* anchor = store.key_anchor();
  const BlockPool& pool = cache.pool_of(layer);
  const int64_t B = store.block_size(), nq = n_rows * n_q, base = mask.base;
  const int64_t ps = kc.prepared_size(), dv = vc.dim();
  const int64_t committed = std::max<int64_t>(0, base - first);  // scores before the ancestors'
  float prepared[kPreparedFloats];
  const auto query = [&](int64_t j) { return q + (j / n_q) * lay.q_row + (j % n_q) * lay.q_head; };
  for (int64_t j = 0; j < nq; ++j) kc.prepare_query(query(j), kv_head, prepared + j * ps);
  const auto add_anchor = [&](int64_t j0, int64_t nj, int32_t blk, float* s, int64_t n) {
    if (!anchor) return;
    for (int64_t j = j0; j < j0 + nj; ++j) {
      const float qa = anchor->dot(query(j), pool.anchor(blk, layer, kv_head));
      for (int64_t t = 0; t < n; ++t) s[(j - j0) * scores_stride + t] += qa;
    }
  };

  // The committed span, shared by every query; then each row's ancestors, packed after it.
  for (int64_t pos = first; pos < base;) {
    const int64_t off = pos % B, n = std::min(B - off, base - pos);
    const int32_t blk = cache.block_of(layer, pos);
    TANDEM_CHECK(blk >= 0, "attention reads a released block");
    float* s = scores + (pos - first);
    kc.dots_in_block(prepared, nq, ps, pool.keys(blk, layer, kv_head), B, off, n, s, scores_stride);
    add_anchor(0, nq, blk, s, n);
    pos += n;
  }
  int32_t path[kMaxTreeDepth];
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t d = tree_path(mask, first_node + i, path);
    float* row_scores = scores + i * n_q * scores_stride + committed;
    int64_t len = 0;
    for (int64_t k = std::max<int64_t>(0, first - base); k <= d; ++k, ++len) {
      const int64_t slot = base + path[k];
      const int32_t blk = cache.block_of(layer, slot);
      kc.dots_in_block(prepared + i * n_q * ps, n_q, ps, pool.keys(blk, layer, kv_head), B, slot % B, 1,
                       row_scores + len, scores_stride);
      add_anchor(i * n_q, n_q, blk, row_scores + len, 1);
    }
    for (int64_t h = 0; h < n_q; ++h)
      kernels::softmax(scores + (i * n_q + h) * scores_stride, committed + len, params.scale, params.softcap);
  }

  float acc[kAccFloats];
  std::fill_n(acc, nq * dv, 0.0f);
  kernels::ValueRun runs[kValueRunBlocks];
  int64_t n_runs = 0;
  const auto flush = [&] {
    if (n_runs > 0) vc.accumulate_runs(scores, nq, scores_stride, runs, n_runs, acc, dv);
    n_runs = 0;
  };
  for (int64_t pos = first; pos < base;) {
    const int64_t off = pos % B, n = std::min(B - off, base - pos);
    const int32_t blk = cache.block_of(layer, pos);
    runs[n_runs++] = {pool.values(blk, layer, kv_head) + static_cast<size_t>(off) * vc.row_bytes(), n,
                      pos - first};
    if (n_runs == kValueRunBlocks) flush();
    pos += n;
  }
  flush();
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t d = tree_path(mask, first_node + i, path);
    int64_t len = 0;
    for (int64_t k = std::max<int64_t>(0, first - base); k <= d; ++k, ++len) {
      const int64_t slot = base + path[k];
      const int32_t blk = cache.block_of(layer, slot);
      vc.accumulate_group(scores + i * n_q * scores_stride + committed + len, n_q, scores_stride,
                          pool.values(blk, layer, kv_head) + static_cast<size_t>(slot % B) * vc.row_bytes(),
                          1, acc + i * n_q * dv, dv);
    }
  }
  for (int64_t j = 0; j < nq; ++j)
    vc.finish_values(acc + j * dv, kv_head, out + (j / n_q) * lay.out_row + (j % n_q) * lay.out_head);
}

}  // namespace

void attend_tree(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_rows,
                 int64_t n_q, const WindowLayout& layout, const TreeMask& mask, int64_t first_node,
                 int64_t first, const AttentionParams& params, float* scores, int64_t scores_stride,
                 float* out) {
  TANDEM_CHECK(n_rows >= 1 && n_q >= 1, "attention needs a query");
  TANDEM_CHECK(mask.parent.size() == mask.depth.size() && first_node >= 0 &&
                   first_node + n_rows <= static_cast<int64_t>(mask.parent.size()),
               "tree rows outside the tree");
  TANDEM_CHECK(first >= 0 && mask.base >= 0 && mask.base + first_node + n_rows <= cache.length(),
               "tree attention outside the cache");
  for (int64_t i = first_node; i < first_node + n_rows; ++i)
    TANDEM_CHECK(mask.base - first + mask.depth[static_cast<size_t>(i)] + 1 <= scores_stride,
                 "attention scores scratch too small");
  const KvStore& store = cache.store();
  const int64_t per_pass = std::min({kMaxWindowQueries, kPreparedFloats / store.key_codec().prepared_size(),
                                     kAccFloats / store.value_codec().dim()});
  if (n_q > per_pass) {
    for (int64_t i = 0; i < n_rows; ++i)
      for (int64_t h = 0; h < n_q; h += per_pass)
        attend_tree_pass(cache, layer, kv_head, q + i * layout.q_row + h * layout.q_head, 1,
                         std::min(per_pass, n_q - h), layout, mask, first_node + i, first, params, scores,
                         scores_stride, out + i * layout.out_row + h * layout.out_head);
    return;
  }
  const int64_t rows_per_pass = per_pass / n_q;
  for (int64_t i = 0; i < n_rows; i += rows_per_pass)
    attend_tree_pass(cache, layer, kv_head, q + i * layout.q_row, std::min(rows_per_pass, n_rows - i), n_q,
                     layout, mask, first_node + i, first, params, scores, scores_stride,
                     out + i * layout.out_row);
}

void attend_tree_reference(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q,
                           int64_t n_rows, int64_t n_q, const WindowLayout& layout, const TreeMask& mask,
                           int64_t first_node, int64_t first, const AttentionParams& params, float* out) {
  const KvStore& store = cache.store();
  const KvCodec& kc = store.key_codec();
  const KvCodec& vc = store.value_codec();
  const KeyAnchor* anchor = store.key_anchor();
  const BlockPool& pool = cache.pool_of(layer);
  const int64_t B = store.block_size(), dv = vc.dim();
  std::vector<float> prepared(static_cast<size_t>(kc.prepared_size())), v(static_cast<size_t>(dv));
  std::vector<int64_t> positions;
  std::vector<double> s, acc(static_cast<size_t>(dv));
  int32_t path[kMaxTreeDepth];
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t d = tree_path(mask, first_node + i, path);
    positions.clear();
    for (int64_t pos = first; pos < mask.base; ++pos) positions.push_back(pos);
    for (int64_t k = 0; k <= d; ++k)
      if (mask.base + k >= first) positions.push_back(mask.base + path[k]);
    for (int64_t h = 0; h < n_q; ++h) {
      const float* qh = q + i * layout.q_row + h * layout.q_head;
      kc.prepare_query(qh, kv_head, prepared.data());
      s.assign(positions.size(), 0.0);
      double top = -INFINITY;
      for (size_t t = 0; t < positions.size(); ++t) {
        const int32_t blk = cache.block_of(layer, positions[t]);
        float dot = 0;
        kc.dots_in_block(prepared.data(), 1, 0, pool.keys(blk, layer, kv_head), B, positions[t] % B, 1, &dot,
                         1);
        if (anchor) dot += anchor->dot(qh, pool.anchor(blk, layer, kv_head));
        double x = static_cast<double>(dot) * params.scale;
        if (params.softcap > 0) x = params.softcap * std::tanh(x / params.softcap);
        s[t] = x;
        top = std::max(top, x);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - top));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t t = 0; t < positions.size(); ++t) {
        const int32_t blk = cache.block_of(layer, positions[t]);
        vc.decode(pool.values(blk, layer, kv_head) + static_cast<size_t>(positions[t] % B) * vc.row_bytes(),
                  kv_head, v.data());
        for (int64_t e = 0; e < dv; ++e)
          acc[static_cast<size_t>(e)] += s[t] / sum * v[static_cast<size_t>(e)];
      }
      float* o = out + i * layout.out_row + h * layout.out_head;
      for (int64_t e = 0; e < dv; ++e) o[e] = static_cast<float>(acc[static_cast<size_t>(e)]);
    }
  }
}

void attend(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t first, int64_t last,
            const AttentionParams& params, float* scores, float* out) {
  attend_group(cache, layer, kv_head, q, 1, 0, first, last, params, scores, last - first + 1, out, 0);
}

void attend_group(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_q,
                  int64_t q_stride, int64_t first, int64_t last, const AttentionParams& params, float* scores,
                  int64_t scores_stride, float* out, int64_t out_stride) {
  attend_rows(cache, layer, kv_head, q, 1, n_q, WindowLayout{0, q_stride, 0, out_stride}, first, last, params,
              scores, scores_stride, out);
}

void attend_rows(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_rows,
                 int64_t n_q, const WindowLayout& layout, int64_t first, int64_t last,
                 const AttentionParams& params, float* scores, int64_t scores_stride, float* out) {
  TANDEM_CHECK(n_rows >= 1 && n_q >= 1, "attention needs a query");
  TANDEM_CHECK(first >= 0 && first <= last && last + n_rows - 1 < cache.length(),
               "attention span outside the cache");
  TANDEM_CHECK(last + n_rows - first <= scores_stride, "attention scores scratch too small");
  const KvStore& store = cache.store();
  const int64_t per_pass = std::min({kMaxWindowQueries, kPreparedFloats / store.key_codec().prepared_size(),
                                     kAccFloats / store.value_dim()});
  if (n_q > per_pass) {  // more heads than one pass holds: each row alone, its heads in groups
    for (int64_t i = 0; i < n_rows; ++i)
      for (int64_t h = 0; h < n_q; h += per_pass)
        attend_pass(cache, layer, kv_head, q + i * layout.q_row + h * layout.q_head, 1,
                    std::min(per_pass, n_q - h), layout, first, last + i, params, scores, scores_stride,
                    out + i * layout.out_row + h * layout.out_head);
    return;
  }
  const int64_t rows_per_pass = per_pass / n_q;
  for (int64_t i = 0; i < n_rows; i += rows_per_pass)
    attend_pass(cache, layer, kv_head, q + i * layout.q_row, std::min(rows_per_pass, n_rows - i), n_q, layout,
                first, last + i, params, scores, scores_stride, out + i * layout.out_row);
}

}  // namespace tandem::cache
