// model::Graph: several sequences in one forward, the contract of the batched driver (engine::Scheduler). A
// sequence on its own (engine::generate, engine::generate_speculative, drafters, calibration) runs through
// model::Session instead; both build their rows for model::Forward, which holds the layers.
//
// Phases of a group (the kernels pick their row class from each forward's shape, kernels/matmul.h):
//   prompt       chunks of one sequence's prompt, by position range; logits for the last row only
//   decode       one new position per sequence (1 row each); logits for every row
//   verify       a window of k+1 positions of one sequence (at most max_verify); logits for every row; or the
//                nodes of a token tree (Group::tree), one forward verifying the trees of several sequences
//   append_known committed known tokens; no logits
// mixed() runs several groups (decode rows, a prompt window, verify windows), each over its own cache, in one
// forward with the row-wise layers packed together; prompt(), decode(), verify() and append_known() run one
// group alone, and logits() the head over post-final-norm hidden rows.
//
// Ownership: inputs (tokens, hidden rows) are borrowed for the call; outputs (logits) are written to buffers
// the caller owns. The graph appends every position it runs to the caches and never rolls back: rollback is
// the caller's, through the cache's truncate(). Capture callbacks receive each decoder layer's residual
// output and then the post-final-norm output, borrowed during the call only; LayerTaps copies just the layers
// it declares.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tandem/model/forward.h"

namespace tandem::model {

enum class Phase { kPrompt, kDecode, kVerify, kAppendKnown };

// One group of a mixed forward.
struct Group {
  Phase phase = Phase::kDecode;
  std::span<const int32_t>
      tokens;  // [rows] (decode: one token per sequence, i.e. caches.size() == tokens.size())
  std::span<cache::KvCache* const> caches;  // decode: one per token; other phases: exactly one
  const CaptureFn* capture = nullptr;       // prompt and verify groups only
  // A verify group's token tree (null: a chain): row i is node i, so tree->base must be the cache's length
  // and the tokens at most the tree's nodes. Borrowed for the call.
  const cache::TreeMask* tree = nullptr;
};

// Keeps copies of the layers a drafter taps, from a capture. layers: decoder layer indices, or n_layer for
// the post-final-norm output. The copies are [rows, n_embd] per tapped layer and are reused across calls.
class LayerTaps {
 public:
  LayerTaps(std::vector<int64_t> layers, int64_t n_embd);
  const CaptureFn& capture() const { return capture_; }
  const std::vector<int64_t>& layers() const { return layers_; }
  // Hidden rows of tapped layer i (index into layers()), valid until the next forward that captures.
  std::span<const float> hidden(size_t i) const {
    return {copies_[i].data(), static_cast<size_t>(rows_ * n_embd_)};
  }
  int64_t rows() const { return rows_; }

 private:
  std::vector<int64_t> layers_;
  int64_t n_embd_;
  int64_t rows_ = 0;
  std::vector<std::vector<float>> copies_;
  CaptureFn capture_;
};

struct GraphOptions {
  int64_t max_rows = 256;   // rows one forward holds (prompt chunk size, mixed batch capacity)
  int64_t max_verify = 16;  // widest verify window verify() accepts
};

class Graph {
 public:
  Graph(const Model& model, ThreadPool& pool, const GraphOptions& options);

  const Model& model() const { return forward_.model(); }
  int64_t n_vocab() const { return model().config().n_vocab; }
  // Reads the routed experts through `residency` (Forward::set_expert_residency): it must outlive its use
  // here, and the forwards of this graph are then its only user.
  void set_expert_residency(ExpertResidency* residency) { forward_.set_expert_residency(residency); }
  const ExpertResidency* expert_residency() const { return forward_.expert_residency(); }

  // Appends a prompt to `cache` in chunks of at most max_rows; writes the last position's logits to
  // `last_logits` [n_vocab] (may be null).
  void prompt(std::span<const int32_t> tokens, cache::KvCache& cache, float* last_logits,
              const CaptureFn* capture = nullptr);
  // One position per sequence: tokens[i] continues caches[i]; logits [n, n_vocab].
  void decode(std::span<const int32_t> tokens, std::span<cache::KvCache* const> caches, float* logits);
  // A verify window on one sequence: logits [tokens.size(), n_vocab], row i predicting the token after
  // tokens[i]. Throws tandem::Error for a window wider than max_verify.
  void verify(std::span<const int32_t> tokens, cache::KvCache& cache, float* logits,
              const CaptureFn* capture = nullptr);
  // Committed tokens whose logits nobody needs.
  void append_known(std::span<const int32_t> tokens, cache::KvCache& cache);
  // The head over post-final-norm hidden rows [n, n_embd] -> logits [n, n_vocab].
  void logits(const float* hidden, int64_t n, float* out);
  // Several groups in one forward. Logits, in group order: decode groups one row per token, verify groups
  // every row, prompt groups their last row, append_known none. Returns the number of logit rows written.
  int64_t mixed(std::span<const Group> groups, float* logits);

 private:
  Forward forward_;
  GraphOptions options_;
  std::vector<Row> rows_;
  std::vector<cache::KvCache*> caches_;
  struct GroupSpan {
    int64_t first, count;
    const CaptureFn* capture;
  };
  std::vector<GroupSpan> spans_;
  std::vector<TreeRows> trees_;  // mixed(): the verify groups' trees
};

}  // namespace tandem::model
