// Training an EAGLE-3-style drafter for a target (docs/training.md, "tandem train-drafter"):
//   generate  continuations of the prompts by the target, greedy and temperature-1 samples in turn;
//   capture   a teacher-forced pass over each sequence records the tap layers' hidden states and the target's
//             next-token distribution (the data of drafter_data.h, with greedy text after sampled openings);
//   train     AdamW (linear warm-up, cosine decay, gradient clipping) on one sequence per step, unrolled
//             `unroll` steps on the drafter's own output hidden states (the training-time test), the loss of
//             step j weighted by 0.8^j;
//   evaluate  on the held-out sequences (those of the last prompts, never trained on): the fraction of
//             positions whose first k + 1 greedy drafts all match the target's greedy text.
// The result is the same bits for the same target, options and thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/model/model.h"
#include "tandem/speculative/drafter_data.h"
#include "tandem/speculative/eagle_draft.h"
#include "tandem/train/checkpoint.h"
#include "tandem/util/thread_pool.h"

namespace tandem::speculative {

// Short story openings for targets that continue plain text; none is one of the public golden prompts.
std::span<const char* const> default_training_prompts();

using EagleTrainProgress = DrafterTrainProgress;

struct EagleTrainOptions {
  std::vector<std::vector<int32_t>> prompts;  // tokenized; at least one
  int64_t tokens = 16384;                     // generated tokens of training text in all
  int64_t continuation = 256;                 // tokens generated per sequence at most
  int64_t steps = 800;
  uint64_t seed = 1;
  int unroll = 4;      // training-time test steps (>= 1)
  int64_t ffn = 0;     // the drafter's SwiGLU width (0: the target's)
  int64_t layers = 1;  // the drafter's decoder layers
  // The draft vocabulary's size (draft_vocab_size: < 0 the default, 0 or at least the target's vocabulary
  // the whole; the tokens: select_draft_vocab).
  int64_t draft_vocab = -1;
  double lr = 3e-3;
  double clip = 1.0;
  int eval_depth = 8;
  int64_t eval_every = 0;      // training steps between held-out evaluations (0: a tenth of the steps)
  int64_t eval_anchors = 256;  // held-out positions drafted from in those (the final evaluation uses all)
  std::function<bool(int32_t)> is_eog;  // ends a continuation early; may be empty
  std::function<void(const EagleTrainProgress&)> on_progress;

  // Interruption: `stop` is polled once per generated sequence and per training step. When it returns true
  // during training, the state (weights, AdamW's moments, the step and the position in the training data)
  // is saved to `checkpoint` and train_eagle returns with `stopped` set; before training, it returns with
  // nothing saved. With `resume`, training continues from `checkpoint`, which must have been written for
  // the same target and options: the result is the same bits as a run that was never interrupted.
  std::function<bool()> stop;
  std::string checkpoint;
  bool resume = false;
  std::string target_file_hash;  // file_fingerprint() of the target, recorded in `checkpoint`
};

struct EagleTrainResult {
  train::DrafterInfo info;                   // everything but the target's file hash, which the caller sets
  std::unique_ptr<EagleDraftSource> source;  // the trained drafter, ready to draft
  int64_t train_tokens = 0, heldout_tokens = 0;
  double generate_seconds = 0, capture_seconds = 0, train_seconds = 0, eval_seconds = 0;
  double final_loss = 0;
  bool stopped = false;  // interrupted (see EagleTrainOptions::stop); source is then null
};

EagleTrainResult train_eagle(const model::Model& target, ThreadPool& pool, const EagleTrainOptions& options);

}  // namespace tandem::speculative
