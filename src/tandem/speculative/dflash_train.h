// Training a DFlash-style block drafter for a target (docs/training.md, "tandem train-drafter --kind
// dflash"): the data of drafter_data.h (the target's continuations, their taps and distributions), then
// AdamW (linear warm-up, cosine decay, gradient clipping) on one sequence per step: the context rows of the
// whole sequence and `anchors` blocks anchored at distinct random positions of it, block row k's loss
// (drafting the token k + 1 after the anchor) weighted by exp(-k / gamma); then the held-out acceptance by
// draft position. The result is the same bits for the same target, options and thread count.
#pragma once

#include <cstdint>
#include <memory>

#include "tandem/model/model.h"
#include "tandem/speculative/dflash_draft.h"
#include "tandem/speculative/drafter_data.h"
#include "tandem/train/checkpoint.h"
#include "tandem/util/thread_pool.h"

namespace tandem::speculative {

struct DflashTrainOptions {
  DrafterDataOptions data;
  int64_t steps = 800;
  uint64_t seed = 1;  // the initial weights and the anchors (data.seed keys the sampled text)
  int64_t block = 8;  // rows per block: the draft depth
  int64_t layers = 1;
  int64_t draft_vocab = -1;  // the draft vocabulary's size, as EagleTrainOptions::draft_vocab
  int64_t anchors = 32;      // blocks per step at most (fewer when the sequence is shorter)
  double gamma = 4.0;        // the decay of the loss weight along the block
  double lr = 3e-3;
  double clip = 1.0;
  DrafterProgressFn on_progress;
};

struct DflashTrainResult {
  train::DrafterInfo info;                    // everything but the target's file hash, which the caller sets
  std::unique_ptr<DflashDraftSource> source;  // the trained drafter, ready to draft
  int64_t train_tokens = 0, heldout_tokens = 0;
  double generate_seconds = 0, capture_seconds = 0, train_seconds = 0, eval_seconds = 0;
  double final_loss = 0;
};

DflashTrainResult train_dflash(const model::Model& target, ThreadPool& pool,
                               const DflashTrainOptions& options);

}  // namespace tandem::speculative
