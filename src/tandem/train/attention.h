// Multi-head attention with grouped KV heads, forward and backward, under a mask given as the key rows each
// query row sees. The masks the drafters train with:
//   causal          query i sees keys 0..i (one sequence; EAGLE-style drafters), or the keys of its own
//                   sequence up to itself when a batch packs several;
//   blocks          query i sees the keys of its own block of B rows, in both directions;
//   context_blocks  the DFlash pattern: the keys are n_context context rows followed by the block rows;
//                   a query of block b sees the first context_visible[b] context rows and every row of its
//                   own block.
// Any other pattern (several sequences in one batch, unrolled draft steps) is built from intervals with
// add_row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/train/param.h"

namespace tandem::train {

class AttentionMask {
 public:
  struct Interval {
    int64_t begin = 0, end = 0;  // key rows [begin, end)
  };

  explicit AttentionMask(int64_t n_keys) : n_keys_(n_keys) {}
  static AttentionMask causal(int64_t n);
  // Several sequences one after another, each causal and blind to the others.
  static AttentionMask causal_sequences(std::span<const int64_t> lengths);
  static AttentionMask blocks(int64_t n, int64_t block);
  static AttentionMask context_blocks(int64_t n_context, std::span<const int64_t> context_visible, int64_t n,
                                      int64_t block);

  // Appends the next query row: the key intervals it sees, increasing and disjoint, inside [0, n_keys). At
  // least one key. Throws tandem::Error otherwise.
  void add_row(std::span<const Interval> intervals);

  int64_t n_queries() const { return static_cast<int64_t>(row_begin_.size()) - 1; }
  int64_t n_keys() const { return n_keys_; }
  std::span<const Interval> row(int64_t i) const {
    return {spans_.data() + row_begin_[static_cast<size_t>(i)],
            static_cast<size_t>(row_begin_[static_cast<size_t>(i) + 1] - row_begin_[static_cast<size_t>(i)])};
  }
  // Where query i's scores start in a row-packed score buffer, and the total (visible pairs of all queries).
  int64_t score_offset(int64_t i) const { return score_begin_[static_cast<size_t>(i)]; }
  int64_t n_scores() const { return score_begin_.back(); }
  int64_t max_visible() const { return max_visible_; }

 private:
  int64_t n_keys_;
  std::vector<Interval> spans_;
  std::vector<int64_t> row_begin_{0};    // [n_queries + 1] into spans_
  std::vector<int64_t> score_begin_{0};  // [n_queries + 1]
  int64_t max_visible_ = 0;
};

struct AttentionShape {
  int64_t n_head = 0;
  int64_t n_kv_head = 0;  // divides n_head; query head h reads KV head h / (n_head / n_kv_head)
  int64_t head_dim = 0;
  float scale = 0;  // usually 1 / sqrt(head_dim)
};

// out[i] = sum_j softmax_j(scale * q[i].k[j]) v[j] over the keys query i sees, per head.
//   q: [n_queries, n_head * head_dim]; k, v: [n_keys, n_kv_head * head_dim]; out: like q
//   probs: [n_head, mask.n_scores()] saved for the backward
void attention_forward(const AttentionShape& s, const AttentionMask& mask, const float* q, const float* k,
                       const float* v, float* out, float* probs, Compute& c);

// dq, dk, dv (overwritten) from dout. The team splits KV heads (each thread sums a head's key and value
// gradients over queries in order), so at most n_kv_head threads work.
void attention_backward(const AttentionShape& s, const AttentionMask& mask, const float* q, const float* k,
                        const float* v, const float* probs, const float* dout, float* dq, float* dk,
                        float* dv, Compute& c);

}  // namespace tandem::train
