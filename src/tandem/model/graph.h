// model::Graph: the contract between a model and what drives it (the scheduler, the speculative loop,
// drafters).
//
// Phases, each a row table (an operation per exact row count or range):
//   prompt       chunks of one sequence's prompt, by position range; logits for the last row only
//   decode       one new position per sequence (1 row each); logits for every row
//   verify       a window of k+1 positions of one sequence; logits for every row
//   append_known committed known tokens; no logits
//   logits       the head over post-final-norm hidden rows
// and mixed(): one forward serving several groups (decode rows, a prompt window, verify windows), each over
// its own cache, with the row-wise layers packed together.
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
#include "tandem/model/row_table.h"

namespace tandem::model {

enum class Phase { kPrompt, kDecode, kVerify, kAppendKnown };

// The row classes the CPU kernels distinguish (see kernels/matmul.h): the op a row table selects.
enum class RowClass { kSingle, kWindow, kMany };
std::string_view row_class_name(RowClass c);

// One group of a mixed forward.
struct Group {
  Phase phase = Phase::kDecode;
  std::span<const int32_t>
      tokens;  // [rows] (decode: one token per sequence, i.e. caches.size() == tokens.size())
  std::span<cache::KvCache* const> caches;  // decode: one per token; other phases: exactly one
  const CaptureFn* capture = nullptr;       // prompt and verify groups only
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
  int64_t max_verify = 16;  // widest verify window the verify table declares
};

class Graph {
 public:
  Graph(const Model& model, ThreadPool& pool, const GraphOptions& options);

  const Model& model() const { return forward_.model(); }
  int64_t n_vocab() const { return model().config().n_vocab; }

  // Row tables: which kernel class serves each row count of each phase.
  const RowTable<RowClass>& decode_table() const { return decode_; }
  const RowTable<RowClass>& verify_table() const { return verify_; }
  const RowTable<RowClass>& prompt_table() const { return prompt_; }

  // Appends a prompt to `cache` in chunks of at most max_rows; writes the last position's logits to
  // `last_logits` [n_vocab] (may be null).
  void prompt(std::span<const int32_t> tokens, cache::KvCache& cache, float* last_logits,
              const CaptureFn* capture = nullptr);
  // One position per sequence: tokens[i] continues caches[i]; logits [n, n_vocab].
  void decode(std::span<const int32_t> tokens, std::span<cache::KvCache* const> caches, float* logits);
  // A verify window on one sequence: logits [tokens.size(), n_vocab], row i predicting the token after
  // tokens[i].
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
  RowTable<RowClass> decode_, verify_, prompt_;
  std::vector<Row> rows_;
  std::vector<cache::KvCache*> caches_;
  struct GroupSpan {
    int64_t first, count;
    const CaptureFn* capture;
  };
  std::vector<GroupSpan> spans_;
};

}  // namespace tandem::model
