#include "tandem/kernels/full_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/kernels/float_kernels.h"

namespace tandem::kernels {
namespace {

// Queries whose scores one pass over a head's keys and values computes (each key and value row is loaded
// once for all of them: dots_group_f32, accumulate_group_f32).
constexpr int64_t kQueryBlock = 8;

}  // namespace

int64_t full_attention_scratch(const FullAttentionShape& s, int64_t n) {
  return n * (s.head_dim + s.head_dim_v) + kQueryBlock * n;
}

void attend_full(const float* q, const float* k, const float* v, int64_t n, const FullAttentionShape& s,
                 int64_t kv0, int64_t kv1, float* scratch, float* out) {
  const int64_t group = s.n_head / s.n_head_kv;
  float* keys = scratch;                      // [n, head_dim]: this head's keys, contiguous
  float* values = keys + n * s.head_dim;      // [n, head_dim_v]
  float* scores = values + n * s.head_dim_v;  // [kQueryBlock, n]
  for (int64_t kvh = kv0; kvh < kv1; ++kvh) {
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(k + j * s.k_stride + kvh * s.head_dim, s.head_dim, keys + j * s.head_dim);
      std::copy_n(v + j * s.v_stride + kvh * s.head_dim_v, s.head_dim_v, values + j * s.head_dim_v);
    }
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int64_t i0 = 0; i0 < n; i0 += kQueryBlock) {
        const int64_t G = std::min(kQueryBlock, n - i0);
        dots_group_f32(q + i0 * s.q_stride + h * s.head_dim, G, s.q_stride, keys, n, s.head_dim, scores, n);
        for (int64_t g = 0; g < G; ++g) softmax(scores + g * n, n, s.scale, 0.0f);
        float* acc = out + i0 * s.out_stride + h * s.head_dim_v;
        for (int64_t g = 0; g < G; ++g) std::fill_n(acc + g * s.out_stride, s.head_dim_v, 0.0f);
        accumulate_group_f32(scores, G, n, values, n, s.head_dim_v, acc, s.out_stride);
      }
    }
  }
}

void attend_full_reference(const float* q, const float* k, const float* v, int64_t n,
                           const FullAttentionShape& s, float* out) {
  const int64_t group = s.n_head / s.n_head_kv;
  std::vector<double> p(static_cast<size_t>(n));
  for (int64_t h = 0; h < s.n_head; ++h) {
    const int64_t kvh = h / group;
    for (int64_t i = 0; i < n; ++i) {
      const float* qi = q + i * s.q_stride + h * s.head_dim;
      double max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = k + j * s.k_stride + kvh * s.head_dim;
        double dot = 0;
        for (int64_t d = 0; d < s.head_dim; ++d) dot += static_cast<double>(qi[d]) * kj[d];
        p[static_cast<size_t>(j)] = dot * s.scale;
        max = std::max(max, p[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - max));
      float* oi = out + i * s.out_stride + h * s.head_dim_v;
      for (int64_t d = 0; d < s.head_dim_v; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j)
          acc += p[static_cast<size_t>(j)] * v[j * s.v_stride + kvh * s.head_dim_v + d];
        oi[d] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace tandem::kernels
