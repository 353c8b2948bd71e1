// The output head and the soft cross-entropy the drafters learn from: logits z = h W^T over the vocabulary,
// q = softmax(z), against the target's distribution at each row, given either in full (a probability per
// vocabulary entry) or as its top-k ids and probabilities plus the mass left over. The left-over mass r is
// one more outcome, "any token outside the top k", whose drafter probability is the sum of q over those
// tokens:
//   L_row = -sum_{i in top-k} p_i log q_i - r log(sum_{j not in top-k} q_j)
// (the full cross-entropy when k is the whole vocabulary or r = 0). A row may list fewer than k ids: its
// unused entries hold id -1 and probability 0 (a target restricted to a reduced draft vocabulary keeps only
// the ids inside it). The loss of a batch is
//   sum_row mask_row * weight_row * L_row / sum_row mask_row
// (0 when every row is masked): per-position weights carry the unrolled step's or block slot's decay, the
// mask drops rows that teach nothing (prompt tokens, padding).
#pragma once

#include <cstdint>

#include "tandem/train/param.h"

namespace tandem::train {

// Borrowed views of one batch's targets; null pointers take the defaults.
struct SoftTargets {
  int64_t rows = 0;
  int64_t top_k = 0;              // entries per row; the vocabulary size when ids is null (full rows)
  const int32_t* ids = nullptr;   // [rows, top_k] distinct vocabulary ids or -1 (an unused entry, of
                                  // probability 0), or null: row r lists every id
  const float* probs = nullptr;   // [rows, top_k] target probabilities (>= 0)
  const float* rest = nullptr;    // [rows] mass outside the listed ids (>= 0); null: 0
  const float* weight = nullptr;  // [rows] per-position loss weight; null: 1
  const uint8_t* mask = nullptr;  // [rows] 1 where the row counts, 0 where not; null: every row
};

struct LossStats {
  double loss = 0;      // the batch loss above
  int64_t counted = 0;  // rows with mask 1
  int64_t agree = 0;    // counted rows where the drafter's argmax is the target's most probable id
};

// Throws tandem::Error naming the row and entry when an id is out of range or repeated within a row, an
// unused entry (-1) has a probability other than 0, or a probability, left-over mass or weight is negative or
// not finite.
void validate_targets(const SoftTargets& t, int64_t vocab);

// The loss of hidden rows h under head W. With dh, also its gradient: dh (overwritten) and, when the head
// trains, W.grad += dz^T h; without (null), the forward alone, touching no gradient.
//   head: [vocab, n]; h: [t.rows, n]; dh: [t.rows, n]
// Rows are processed in chunks, so the logits never take more than a chunk's [rows, vocab] of scratch.
LossStats head_soft_cross_entropy(Param& head, const float* h, const SoftTargets& t, float* dh, Compute& c);

}  // namespace tandem::train
