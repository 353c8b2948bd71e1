// Training data for the drafters that read the target's hidden states (docs/training.md), shared by every
// drafter kind:
//   generate  continuations of the prompts by the target, greedy and temperature-1 samples in turn;
//   capture   a teacher-forced pass over each sequence records the tap layers' hidden states and the target's
//             next-token distribution (in full for vocabularies of at most kDrafterFullVocab tokens, else the
//             top kDrafterTopK with the rest's mass), stored as f16, with a loss mask;
// and the held-out evaluation: the fraction of positions of the held-out greedy text whose first k + 1
// greedy drafts all match the target's text. The data is the same bits for the same target, options and
// thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "tandem/model/session.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/train/loss.h"
#include "tandem/train/random.h"

namespace tandem::speculative {

inline constexpr int64_t kDrafterFullVocab = 4096;
inline constexpr int64_t kDrafterTopK = 32;
// The default draft vocabulary (train-drafter --draft-vocab): the whole vocabulary up to
// kDraftVocabWholeUpTo tokens, else the kDraftVocabDefault most frequent.
inline constexpr int64_t kDraftVocabWholeUpTo = 16384;
inline constexpr int64_t kDraftVocabDefault = 8192;

// Progress of a drafter's training, by phase.
struct DrafterTrainProgress {
  const char* phase = "";  // "generate", "capture", "train", "evaluate"
  int64_t done = 0, total = 0;
  int64_t tokens = 0;  // generate, capture: tokens of text so far; train: rows trained on so far
  double loss = 0;     // train: the mean loss of recent steps
  // The latest held-out acceptance by draft position (train, evaluate); empty until measured.
  std::span<const float> acceptance;
  double eta_seconds = -1;  // of the phase; < 0 when unknown
};
using DrafterProgressFn = std::function<void(const DrafterTrainProgress&)>;

// One sequence of training text and what the target said about it.
struct DrafterSequence {
  std::vector<int32_t> tokens;  // [n] prompt and continuation
  int64_t prompt = 0;           // prompt tokens
  bool greedy = false;
  bool heldout = false;
  std::vector<uint16_t> taps;   // [n, n_taps * d] f16 bits: the tap layers side by side, in order
  std::vector<int32_t> ids;     // [n, kDrafterTopK] when the vocabulary is large, else empty
  std::vector<uint16_t> probs;  // [n, k] f16 bits (k: the vocabulary, or kDrafterTopK) the target's
                                // next-token distribution at each position
  std::vector<float> rest;      // [n] mass outside ids (top-k only)
  // [n] 1 where the target's distribution at the position teaches: it predicts a token the target
  // generated. The prompt's own tokens are the user's, and a drafter never drafts them.
  std::vector<uint8_t> mask;
  int64_t n() const { return static_cast<int64_t>(tokens.size()); }
};

struct DrafterDataOptions {
  std::vector<std::vector<int32_t>> prompts;  // tokenized; at least one, none empty
  int64_t tokens = 16384;                     // generated tokens of training text in all
  int64_t continuation = 256;                 // tokens generated per sequence at most
  uint64_t seed = 1;
  // Rounds past the first two alternate between whole temperature-1 samples and greedy text after a
  // sampled opening of 8 to 71 tokens (greedy text from many more starts than there are prompts); false:
  // whole samples only.
  bool sampled_openings = false;
  std::function<bool(int32_t)> is_eog;  // ends a continuation early; may be empty
  // Polled once per generated and per captured sequence: true stops with DrafterData::stopped set.
  std::function<bool()> stop;
};

struct DrafterData {
  std::vector<DrafterSequence> sequences;  // training and held-out (the last prompts' greedy text)
  int64_t max_n = 2;                       // the longest sequence
  int64_t k = 0;                           // entries per distribution row
  int64_t train_tokens = 0, heldout_tokens = 0;
  double generate_seconds = 0, capture_seconds = 0;
  bool stopped = false;  // DrafterDataOptions::stop said so; the data is then incomplete
  std::vector<const DrafterSequence*> training() const;
};

// Generates and captures the data on `session` (of the target, f32 cache advised), reading the tap layers
// `taps`. Throws tandem::Error when a prompt is empty or leaves no room in the context, or no training text
// results.
DrafterData make_drafter_data(model::Session& session, std::span<const int32_t> taps,
                              const DrafterDataOptions& o, const DrafterProgressFn& on_progress);

// The size of the draft vocabulary that `requested` (train-drafter --draft-vocab; < 0: the default) asks for
// a target of `vocab` tokens: 0 for the whole vocabulary (0 or at least `vocab` asked, or the default for a
// vocabulary of at most kDraftVocabWholeUpTo tokens), else the size.
int64_t draft_vocab_size(int64_t requested, int64_t vocab);

// The reduced draft vocabulary of `size` tokens (0 or at least the vocabulary: empty, the whole) for the
// training text of `data`: every token is_eog names (a drafter must be able to draft the end of the text),
// then the tokens the target generated most often in the training sequences (ties: the larger summed target
// probability over the rows that teach, then the lower id). Ascending ids.
std::vector<int32_t> select_draft_vocab(const DrafterData& data, int64_t size, int64_t vocab,
                                        const std::function<bool(int32_t)>& is_eog);

// The target distributions of one training batch, widened to f32: each row a sequence's distribution at one
// position. Buffers are sized once, for max_rows rows of k entries (DrafterData::k).
//
// With a reduced draft vocabulary (draft_vocab, ascending target ids), each row is the target's
// distribution restricted to it, over draft ids, and renormalised: the listed probabilities of the tokens
// inside it (full rows: all N of them, in draft id order; top-k rows: the k entries, those outside marked
// unused, id -1) and the left-over mass, divided by their sum. Why renormalise rather than give the mass
// outside one more "other" outcome: the drafter's q is a distribution over the draft vocabulary (drafting
// never draws "other"), and the acceptance sum_x min(p(x), q(x)) over the tokens it can draft is largest,
// p(S) for the draft vocabulary S, for any q >= p on S, which p / p(S) is: the restricted, renormalised
// target is the q to learn. An "other" outcome would spend probability on a token never drafted and would
// have to be dropped (and q renormalised) at drafting anyway. The top-k rows' left-over mass is kept as
// mass over the draft vocabulary's unlisted tokens (how much of it lies outside is not recorded). A row
// with no mass inside the draft vocabulary teaches nothing and is masked.
class TargetRows {
 public:
  TargetRows(int64_t max_rows, int64_t k, int64_t vocab, std::span<const int32_t> draft_vocab = {});
  // Row r: the distribution of s at position pos.
  void set(int64_t r, const DrafterSequence& s, int64_t pos);
  // Rows [0, rows) as the loss reads them, with per-row weights and mask (borrowed, [rows] each; the mask
  // also drops rows with no mass in the draft vocabulary).
  train::SoftTargets view(int64_t rows, const float* weight, const uint8_t* mask);

 private:
  int64_t k_, vocab_;
  int64_t width_;                        // entries per row: k, or the draft vocabulary's size for full rows
  std::vector<int32_t> draft_of_;        // [vocab] target id -> draft id, -1 outside; empty: whole vocabulary
  std::vector<int32_t> draft_vocab_;     // draft id -> target id
  std::vector<float> probs_, rest_;      // [max_rows, width], [max_rows]
  std::vector<int32_t> ids_;             // [max_rows, k] when k < vocab
  std::vector<uint8_t> teaches_, mask_;  // [max_rows]: whether the row has mass in the draft vocabulary
};

// splitmix64 (train/random.h) for the trainers' choices of sequences and anchors.
using train::next_random;

// Held-out acceptance by draft position (docs/training.md): entry i is the fraction of anchors whose first
// i + 1 greedy drafts match the text, the anchors being every position of the held-out greedy text or, when
// max_anchors > 0, at most that many spread evenly. set_taps hands a sequence's captured taps, widened to
// f32 ([n, n_taps * d]), to `source` after begin().
std::vector<float> heldout_acceptance(DraftSource& source,
                                      const std::function<void(std::span<const float>)>& set_taps,
                                      std::span<const DrafterSequence> sequences, int depth,
                                      int64_t max_anchors, const DrafterProgressFn& on_progress);

}  // namespace tandem::speculative
