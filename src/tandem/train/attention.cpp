#include "tandem/train/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "tandem/util/error.h"

namespace tandem::train {

AttentionMask AttentionMask::causal(int64_t n) {
  AttentionMask m(n);
  for (int64_t i = 0; i < n; ++i) {
    const Interval iv{0, i + 1};
    m.add_row({&iv, 1});
  }
  return m;
}

AttentionMask AttentionMask::causal_sequences(std::span<const int64_t> lengths) {
  int64_t n = 0;
  for (int64_t len : lengths) {
    if (len <= 0)
      throw Error("every sequence of a batch needs at least one row (got " + std::to_string(len) + ")");
    n += len;
  }
  AttentionMask m(n);
  int64_t start = 0;
  for (int64_t len : lengths) {
    for (int64_t i = start; i < start + len; ++i) {
      const Interval iv{start, i + 1};
      m.add_row({&iv, 1});
    }
    start += len;
  }
  return m;
}

AttentionMask AttentionMask::blocks(int64_t n, int64_t block) {
  if (block <= 0)
    throw Error("the attention block size must be positive (got " + std::to_string(block) + ")");
  AttentionMask m(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / block * block;
    const Interval iv{b, std::min(n, b + block)};
    m.add_row({&iv, 1});
  }
  return m;
}

AttentionMask AttentionMask::context_blocks(int64_t n_context, std::span<const int64_t> context_visible,
                                            int64_t n, int64_t block) {
  if (block <= 0)
    throw Error("the attention block size must be positive (got " + std::to_string(block) + ")");
  const int64_t n_blocks = (n + block - 1) / block;
  if (static_cast<int64_t>(context_visible.size()) != n_blocks)
    throw Error("context_blocks needs one visible-context length per block: " + std::to_string(n_blocks) +
                " blocks, " + std::to_string(context_visible.size()) + " lengths");
  AttentionMask m(n_context + n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / block;
    const int64_t visible = context_visible[static_cast<size_t>(b)];
    if (visible < 0 || visible > n_context)
      throw Error("block " + std::to_string(b) + " sees " + std::to_string(visible) +
                  " context rows, outside [0, " + std::to_string(n_context) + "]");
    const Interval ivs[2] = {{0, visible}, {n_context + b * block, n_context + std::min(n, (b + 1) * block)}};
    if (visible == 0)
      m.add_row({ivs + 1, 1});
    else
      m.add_row(ivs);
  }
  return m;
}

void AttentionMask::add_row(std::span<const Interval> intervals) {
  int64_t prev_end = 0, visible = 0;
  for (const Interval& iv : intervals) {
    if (iv.begin < prev_end || iv.end <= iv.begin || iv.end > n_keys_)
      throw Error("attention mask row " + std::to_string(n_queries()) + ": key interval [" +
                  std::to_string(iv.begin) + ", " + std::to_string(iv.end) +
                  ") must be non-empty, after the previous one and inside [0, " + std::to_string(n_keys_) +
                  ")");
    prev_end = iv.end;
    visible += iv.end - iv.begin;
  }
  if (visible == 0)
    throw Error("attention mask row " + std::to_string(n_queries()) + " sees no key (every query needs one)");
  spans_.insert(spans_.end(), intervals.begin(), intervals.end());
  row_begin_.push_back(static_cast<int64_t>(spans_.size()));
  score_begin_.push_back(score_begin_.back() + visible);
  max_visible_ = std::max(max_visible_, visible);
}

namespace {

void check_shape(const AttentionShape& s) {
  TANDEM_CHECK(s.n_head > 0 && s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0 && s.head_dim > 0,
               "attention needs n_head a positive multiple of n_kv_head and a positive head size");
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

void attention_forward(const AttentionShape& s, const AttentionMask& mask, const float* q, const float* k,
                       const float* v, float* out, float* probs, Compute& c) {
  check_shape(s);
  const int64_t H = s.n_head, hd = s.head_dim, group = s.n_head / s.n_kv_head;
  const int64_t q_stride = H * hd, kv_stride = s.n_kv_head * hd, n_scores = mask.n_scores();
  c.pool.parallel_for(mask.n_queries(), 4, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto row = mask.row(i);
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q + i * q_stride + h * hd;
        const int64_t kvo = h / group * hd;
        float* p = probs + h * n_scores + mask.score_offset(i);
        float mx = -std::numeric_limits<float>::infinity();
        int64_t n = 0;
        for (const auto& iv : row)
          for (int64_t j = iv.begin; j < iv.end; ++j, ++n) {
            p[n] = s.scale * dot(qh, k + j * kv_stride + kvo, hd);
            mx = std::max(mx, p[n]);
          }
        float sum = 0;
        for (int64_t t = 0; t < n; ++t) {
          p[t] = std::exp(p[t] - mx);
          sum += p[t];
        }
        const float inv = 1.0f / sum;
        float* o = out + i * q_stride + h * hd;
        std::fill(o, o + hd, 0.0f);
        n = 0;
        for (const auto& iv : row)
          for (int64_t j = iv.begin; j < iv.end; ++j, ++n) {
            p[n] *= inv;
            const float* vj = v + j * kv_stride + kvo;
            for (int64_t d = 0; d < hd; ++d) o[d] += p[n] * vj[d];
          }
      }
    }
  });
}

void attention_backward(const AttentionShape& s, const AttentionMask& mask, const float* q, const float* k,
                        const float* v, const float* probs, const float* dout, float* dq, float* dk,
                        float* dv, Compute& c) {
  check_shape(s);
  const int64_t H = s.n_head, hd = s.head_dim, group = s.n_head / s.n_kv_head;
  const int64_t q_stride = H * hd, kv_stride = s.n_kv_head * hd, n_scores = mask.n_scores();
  const int64_t nq = mask.n_queries(), max_visible = mask.max_visible();
  std::memset(dk, 0, static_cast<size_t>(mask.n_keys() * kv_stride) * sizeof(float));
  std::memset(dv, 0, static_cast<size_t>(mask.n_keys() * kv_stride) * sizeof(float));
  float* ds_all = c.scratch.get(0, static_cast<int64_t>(c.pool.size()) * max_visible);
  c.pool.parallel_for(s.n_kv_head, 1, [&](int64_t g0, int64_t g1, int t) {
    float* ds = ds_all + t * max_visible;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t kvo = g * hd;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < nq; ++i) {
          const auto row = mask.row(i);
          const float* p = probs + h * n_scores + mask.score_offset(i);
          const float* doh = dout + i * q_stride + h * hd;
          const float* qh = q + i * q_stride + h * hd;
          float* dqh = dq + i * q_stride + h * hd;
          // dP_j = dout . v_j; dS_j = p_j (dP_j - sum_t p_t dP_t) * scale.
          float pdp = 0;
          int64_t n = 0;
          for (const auto& iv : row)
            for (int64_t j = iv.begin; j < iv.end; ++j, ++n) {
              ds[n] = dot(doh, v + j * kv_stride + kvo, hd);
              pdp += p[n] * ds[n];
            }
          std::fill(dqh, dqh + hd, 0.0f);
          n = 0;
          for (const auto& iv : row)
            for (int64_t j = iv.begin; j < iv.end; ++j, ++n) {
              const float dsj = p[n] * (ds[n] - pdp) * s.scale;
              const float* kj = k + j * kv_stride + kvo;
              float* dkj = dk + j * kv_stride + kvo;
              float* dvj = dv + j * kv_stride + kvo;
              for (int64_t d = 0; d < hd; ++d) {
                dqh[d] += dsj * kj[d];
                dkj[d] += dsj * qh[d];
                dvj[d] += p[n] * doh[d];
              }
            }
        }
      }
    }
  });
}

}  // namespace tandem::train
