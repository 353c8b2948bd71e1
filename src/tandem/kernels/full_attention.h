// Non-causal ("full") attention over one whole sequence, as encoders use: every query attends to every key of
// its own sequence, so a row's result depends on all rows of its sequence and on nothing else (rows of other
// sequences packed beside it in the same activation matrices change nothing).
#pragma once

#include <cstdint>

namespace tandem::kernels {

// Where the heads lie in the activation rows of a sequence (strides in floats between consecutive rows).
// Query head h reads key/value head h / (n_head / n_head_kv).
struct FullAttentionShape {
  int64_t n_head = 0, n_head_kv = 0;
  int64_t head_dim = 0;    // query and key width per head
  int64_t head_dim_v = 0;  // value width per head
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, out_stride = 0;
  float scale = 0;  // multiplies q·k before the softmax
};

// Floats of scratch attend_full needs for a sequence of up to n rows.
int64_t full_attention_scratch(const FullAttentionShape& s, int64_t n);

// Key/value heads [kv0, kv1) of one sequence of n > 0 rows, with all their query heads:
//   q: [n, q_stride] (query head h at h * head_dim), k: [n, k_stride], v: [n, v_stride] (head at
//   h * head_dim / head_dim_v), out: [n, out_stride] (query head h at h * head_dim_v);
//   out_h[i] = sum_j softmax_j(scale * q_h[i] · k_h[j]) v_h[j].
// scratch: full_attention_scratch(s, n) floats of the caller's (one per thread). Each output element's sums
// run in a fixed order that depends only on n, so the result never depends on how the heads are split.
void attend_full(const float* q, const float* k, const float* v, int64_t n, const FullAttentionShape& s,
                 int64_t kv0, int64_t kv1, float* scratch, float* out);

// Scalar reference of attend_full over all heads, in double. Tests compare the kernel with it.
void attend_full_reference(const float* q, const float* k, const float* v, int64_t n,
                           const FullAttentionShape& s, float* out);

}  // namespace tandem::kernels
