// The target's token embedding and output head as the drafters that share them (EAGLE-3, DFlash) read them,
// and their reduced draft vocabulary (docs/training.md, "Draft vocabulary").
//
// A drafter embeds any target token, so the embedding is the target's whole table, read a row at a time in
// its stored block type. Its head scores the draft vocabulary only: the N target tokens its file lists
// (draft id i is target id ids[i]), or every token when the file lists none. The head is the target head's
// rows of those tokens, gathered once in their stored block type (no f32 copy), or the target's whole head,
// borrowed, for the whole vocabulary. A draft's logits over the N draft ids go back to target ids with
// expand(): -inf outside the draft vocabulary, so that the drafter's distribution q is 0 there and it never
// drafts such a token; verification needs nothing more to stay lossless (a token q never draws is one the
// target's residual distribution covers).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/model/model.h"
#include "tandem/tensor/weight.h"
#include "tandem/train/param.h"

namespace tandem::speculative {

// Copies the target's token embedding (head false) or output head (head true; the embedding when tied) into
// dst, dequantized to f32: rows `ids` ([dst.rows] of them), or every row when ids is empty. Throws
// tandem::Error when the shapes differ.
void copy_target_rows(const model::Model& target, bool head, std::span<const int32_t> ids, train::Param& dst);

class TargetVocab {
 public:
  // ids: the draft vocabulary (empty: the whole); d: the drafter's width. gather_head false: the drafter's
  // head is its own, and none of the target's is gathered (head() is then empty). Throws tandem::Error when
  // the target's embedding or head is not [n_vocab, d] or an id is outside the vocabulary.
  TargetVocab(const model::Model& target, std::span<const int32_t> ids, int64_t d, bool gather_head = true);

  int64_t vocab() const { return embedding_.rows; }  // the target's vocabulary
  int64_t size() const { return ids_.empty() ? vocab() : static_cast<int64_t>(ids_.size()); }  // N
  std::span<const int32_t> ids() const { return ids_; }  // empty: the whole vocabulary
  const MatrixView& embedding() const { return embedding_; }
  const MatrixView& head() const { return head_; }  // [size(), d]
  // Bytes of the gathered head rows (0 when the target's head is borrowed).
  size_t bytes() const { return rows_.size(); }

  // The target's embedding of token `id` into out [d]. Throws tandem::Error when id is outside the
  // vocabulary.
  void embed(int32_t id, float* out) const;
  // full [vocab()]: the draft logits [size()] at their target ids, -inf at every other id.
  void expand(const float* logits, float* full) const;

 private:
  MatrixView embedding_, head_;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> rows_;  // the gathered head rows (and room to align them)
};

}  // namespace tandem::speculative
