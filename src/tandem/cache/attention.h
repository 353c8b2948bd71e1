// Attention of one query head over a sequence's paged cache, reading the encoded rows directly (no
// dequantized copy of the cache is made).
#pragma once

#include <cstdint>
#include <span>

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

// Queries (rows by heads) that share one pass over the cache rows (attend_group, attend_rows).
constexpr int64_t kMaxWindowQueries = 64;

// attend() for n_q query heads that share KV head `kv_head` (grouped-query attention): query h at
// q + h * q_stride, its scores scratch at scores + h * scores_stride (at least last - first + 1 floats), its
// output at out + h * out_stride. Where the codecs have grouped forms, each cache row is read and decoded
// once for up to kMaxWindowQueries queries; each head's result is bit-identical to attend() (which is this
// with one head).
void attend_group(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_q,
                  int64_t q_stride, int64_t first, int64_t last, const AttentionParams& params, float* scores,
                  int64_t scores_stride, float* out, int64_t out_stride);

// Where attend_rows finds row i's queries and puts its outputs: head h at q + i * q_row + h * q_head, out +
// i * out_row + h * out_head.
struct WindowLayout {
  int64_t q_row, q_head, out_row, out_head;
};

// attend_group() for the n_q heads of each of n_rows consecutive positions of one sequence (a verify window
// or a prompt chunk): row i attends [first, last + i]. The rows' queries share each pass over the cache
// rows, up to kMaxWindowQueries at a time (a window of 8 rows reads its span once instead of 8 times);
// query (i, h) takes the scores scratch at scores + (i * n_q + h) * scores_stride (at least last + n_rows -
// first floats), for the first min(n_rows * n_q, kMaxWindowQueries) queries (one pass at a time). Each result
// is bit-identical to attend(): the same dot products, the softmax over the row's own span, and its value
// rows added in position order.
void attend_rows(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_rows,
                 int64_t n_q, const WindowLayout& layout, int64_t first, int64_t last,
                 const AttentionParams& params, float* scores, int64_t scores_stride, float* out);

// A token tree evaluated as one window (speculative drafting): node i is stored at cache position base + i
// and stands at position base + depth[i] of its own path (its rotary position). It attends to the committed
// positions before base and to its ancestors, itself included; never to its siblings or cousins. Nodes are
// in topological order: parent[i] < i, or -1 for a node that directly continues the committed text, and
// depth[i] = depth[parent[i]] + 1 (0 for those).
struct TreeMask {
  int64_t base = 0;
  std::span<const int32_t> parent;  // [nodes]
  std::span<const int32_t> depth;   // [nodes]
};

// The deepest path a tree may hold (attend_tree keeps one path on the stack).
constexpr int64_t kMaxTreeDepth = 256;

// attend_rows() for the n_q heads of n_rows consecutive nodes of a tree, from node first_node (stored at
// mask.base + first_node): the tree attention mask. Row i attends the committed positions [first,
// mask.base - 1] and then those of its ancestors whose path position is >= first, in path order; all rows
// share `first` (0 without a sliding window; the caller groups rows of one window start). A row's scores
// are packed (committed positions, then one per ancestor), so each result is bit-identical to attend() over
// a cache holding the row's path at consecutive positions: plain decoding of that path. Scores scratch as in
// attend_rows, at least mask.base - first + depth + 1 floats per query.
void attend_tree(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q, int64_t n_rows,
                 int64_t n_q, const WindowLayout& layout, const TreeMask& mask, int64_t first_node,
                 int64_t first, const AttentionParams& params, float* scores, int64_t scores_stride,
                 float* out);

// attend_tree() computed the plain way, one query at a time in scalar float arithmetic over decoded rows (the
// reference of the tree kernel's tests). out: as attend_tree's; no scratch.
void attend_tree_reference(const KvCache& cache, int64_t layer, int64_t kv_head, const float* q,
                           int64_t n_rows, int64_t n_q, const WindowLayout& layout, const TreeMask& mask,
                           int64_t first_node, int64_t first, const AttentionParams& params, float* out);

}  // namespace tandem::cache
