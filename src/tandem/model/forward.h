// The decoder forward over a batch of rows. Each row is one token at one position of one sequence; rows of
// different sequences (decode rows, prompt chunks, verify windows) run together: row-wise layers are packed,
// attention reads each row's own cache. Workspace is allocated once for `max_rows`; run() does not allocate.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "tandem/cache/attention.h"
#include "tandem/cache/kv_cache.h"
#include "tandem/kernels/matmul.h"
#include "tandem/kernels/prefetch_tuner.h"
#include "tandem/model/mla.h"
#include "tandem/model/model.h"
#include "tandem/model/moe.h"
#include "tandem/model/ssm.h"
#include "tandem/util/thread_pool.h"

namespace tandem::model {

struct Row {
  int32_t token = 0;
  int64_t pos = 0;      // position in its sequence
  int32_t seq = 0;      // index into the caches passed to run()
  bool logits = false;  // produce logits for this row
};

// A token tree among a forward's rows (tree drafting and tree verification): the rows of sequence `seq` at
// positions >= mask.base are the tree's nodes pos - mask.base, rotated at mask.base + depth and attending
// only to the committed positions and their ancestors (cache::TreeMask). Their positions must still continue
// the cache, so a forward may carry the nodes of a tree whose earlier nodes an earlier forward stored. A
// forward may carry the trees of several sequences, one per sequence (a batch verifying each sequence's
// drafted tree); every other row is an ordinary row.
struct TreeRows {
  int32_t seq = 0;
  cache::TreeMask mask;
};

// Where forwards spend their time, accumulated while a Forward has one (Forward::set_phase_times): the matrix
// products (with the quantization of their activations, the output head included), attention, and whole
// forwards (the rest: embeddings, norms, rotary embeddings, activations, residuals, cache writes). Timing
// costs two clock reads per part.
struct PhaseTimes {
  double matmul_s = 0, attention_s = 0, total_s = 0;
  int64_t forwards = 0;
};

// Receives each decoder layer's residual output (layer 0..n_layer-1) and then the post-final-norm output
// (layer == n_layer), for all rows: hidden [n_rows, n_embd], borrowed for the duration of the call.
using CaptureFn = std::function<void(int64_t layer, const float* hidden, int64_t n_rows)>;

class Forward {
 public:
  Forward(const Model& model, ThreadPool& pool, int64_t max_rows);

  const Model& model() const { return model_; }
  // The MoE workspace: after each MoE layer (seen from a CaptureFn), the experts that layer's rows chose and
  // their routing gaps.
  const MoeFfn& moe() const { return moe_; }
  // Reads the routed experts through `residency` (null: the model's own views) from the next run on; it
  // rebalances before each run. It must outlive its use here and serve one forward at a time.
  void set_expert_residency(ExpertResidency* residency) { residency_ = residency; }
  const ExpertResidency* expert_residency() const { return residency_; }
  int64_t max_rows() const { return max_rows_; }

  // Runs the rows. For each sequence, its rows must continue its cache: a row's position is at most the cache
  // length plus the rows of that sequence before it in this call (so windows may overwrite rolled-back
  // positions). Each row attends to positions [0, pos] of its own cache (sliding layers: the last `window`).
  // Afterwards each touched cache's length is one past its last row's position.
  // logits: [number of rows with logits=true, n_vocab], in row order. Throws tandem::Error for bad rows.
  // With `trees` (at most one per sequence), the rows each names are tree nodes of that sequence (TreeRows);
  // a model with recurrent layers refuses trees (tandem::Error).
  void run(std::span<const Row> rows, std::span<cache::KvCache* const> caches, float* logits,
           const CaptureFn* capture = nullptr, std::span<const TreeRows> trees = {});

  // The checkpoint's MTP layer k (k < Config::n_mtp; model/weights.h, MtpWeights) over rows whose tokens are
  // each the token after its position and whose previous hidden states are hidden [R, n_embd] (the main
  // model's final hidden states before the output norm, or an MTP step's own output). caches: the MTP
  // layer's own, of Config::mtp_kv_geometry(), with the rules of run(). logits: [rows with logits=true,
  // n_vocab], through the layer's head norm and head. capture: layer 0 receives the block's output (the
  // hidden state a chained step reads), layer 1 the normed output. Throws tandem::Error when the model has
  // no such layer.
  void run_mtp(int64_t k, std::span<const Row> rows, const float* hidden,
               std::span<cache::KvCache* const> caches, float* logits, const CaptureFn* capture = nullptr);

  // The output head: post-final-norm hidden rows [n, n_embd] -> logits [n, n_vocab] (final soft-cap
  // included).
  void head(const float* hidden, int64_t n, float* logits);

  // The kernels' prefetch reach for forwards of `width` rows (1 or 2, kTunedWidths; wider ones take the near
  // reach): the one that measured faster, and the forwards timed with each (kernels/prefetch_tuner.h).
  static constexpr int64_t kTunedWidths = 2;
  const kernels::PrefetchTuner& reach_tuner(int64_t width = 1) const { return reach_tuners_[width - 1]; }

  // Accumulate where each forward's time goes into *times (borrowed; it must outlive the timing), or stop
  // timing (nullptr, the default).
  void set_phase_times(PhaseTimes* times) { times_ = times; }

 private:
  // The main layers (mtp null) or an MTP layer whose input rows come from mtp_hidden (run_mtp).
  void run_timed(std::span<const Row> rows, std::span<cache::KvCache* const> caches, float* logits,
                 const CaptureFn* capture, std::span<const TreeRows> trees, const MtpWeights* mtp,
                 const float* mtp_hidden);
  void run_untimed(std::span<const Row> rows, std::span<cache::KvCache* const> caches, float* logits,
                   const CaptureFn* capture, std::span<const TreeRows> trees, const MtpWeights* mtp,
                   const float* mtp_hidden);
  // Checks this run's trees against its rows and caches and indexes them by sequence (tree_of_).
  void index_trees(std::span<const Row> rows, std::span<cache::KvCache* const> caches,
                   std::span<const TreeRows> trees);
  // x_ = eh_proj [enorm(embedding of each row's token); hnorm(hidden row)], the MTP layer's input.
  void mtp_input(const MtpWeights& m, std::span<const Row> rows, const float* hidden);
  // head() through the given output matrix (an MTP layer's own head, or the model's).
  void head_with(const MatrixView& output, const float* hidden, int64_t n, float* logits);
  // The tree a row is a node of in this run, or null.
  const TreeRows* tree_of(const Row& row) const {
    const int32_t t = tree_of_[static_cast<size_t>(row.seq)];
    if (t < 0) return nullptr;
    const TreeRows& tree = trees_[static_cast<size_t>(t)];
    return row.pos >= tree.mask.base ? &tree : nullptr;
  }
  // The tree node of a row, or -1 for a row outside its sequence's tree.
  int64_t tree_node(const Row& row) const {
    const TreeRows* tree = tree_of(row);
    return tree ? row.pos - tree->mask.base : -1;
  }
  // The position a row is rotated at and its window counted from: a tree node's path position.
  int64_t path_pos(const Row& row) const {
    const TreeRows* tree = tree_of(row);
    return tree ? tree->mask.base + tree->mask.depth[static_cast<size_t>(row.pos - tree->mask.base)]
                : row.pos;
  }

  // fn(), its time added to times_->*part when timing.
  template <typename Fn>
  void timed(double PhaseTimes::*part, Fn&& fn) {
    if (times_ == nullptr) return fn();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    times_->*part += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void attention(std::span<const Row> rows, std::span<cache::KvCache* const> caches, int64_t layer);
  // q_ = rope(xb_ Wq), and each row's k and v (from xb_) stored in its cache at layer il.
  void project_qkv(const LayerWeights& l, std::span<const Row> rows, std::span<cache::KvCache* const> caches,
                   int64_t il);
  // x_ += FFN(xb_) (mixture of experts or dense, then the post-FFN norm where the layer has one) for R rows
  // whose xb_ holds the FFN's normed input, reading the routed experts through `residency` (null: the
  // model's own views).
  void ffn_residual(const LayerWeights& l, int64_t R, int64_t il, ExpertResidency* residency);
  // xb_ = FFN(xb_) for R rows of a dense layer.
  void dense_ffn(const LayerWeights& l, int64_t R);

  // fn(r) for every row r < n: row-wise work (norms, activations, residuals), across the team when there are
  // enough rows to pay for a barrier. Each row's work is independent, so the split never changes results.
  template <typename Fn>
  void for_rows(int64_t n, Fn&& fn) {
    if (n < kParallelRows) {
      for (int64_t r = 0; r < n; ++r) fn(r);
      return;
    }
    pool_.parallel_for(n, 1, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) fn(r);
    });
  }
  static constexpr int64_t kParallelRows = 4;

  const Model& model_;
  ThreadPool& pool_;
  int64_t max_rows_;
  kernels::MatmulScratch scratch_;
  // The prefetch reach tuners of forwards of one and two rows (index width - 1).
  kernels::PrefetchTuner reach_tuners_[kTunedWidths];
  std::vector<float> inv_freq_;  // [n_rot / 2]
  std::vector<float> rope_cs_;   // [max_rows, n_rot]: cos/sin of each row's position (kernels::rope_angles)
  // Activations, [max_rows, width] each.
  std::vector<float> x_, xb_, q_, k_, v_, att_, ffn_gate_, ffn_up_;
  std::vector<float> mtp_in_;  // [max_rows, 2 * n_embd] the MTP layers' concatenated input (models with them)
  MoeFfn moe_;                 // the workspace of mixture-of-experts layers (models with them)
  ExpertResidency* residency_ = nullptr;  // borrowed (set_expert_residency)
  MlaProjection mla_;                     // the projections of latent attention layers (models with them)
  // Latent attention: absorbed queries [max_rows, n_head * key_width], cache entries [max_rows, key_width]
  // and the heads' outputs [max_rows, n_head * kv_lora_rank].
  std::vector<float> latent_q_, latent_k_, latent_att_;
  // Attention scratch: per thread, window_queries_ rows of scores_stride_ (the longest context so far)
  // floats.
  std::vector<float> scores_;
  int64_t scores_stride_ = 0;
  // Queries of one attention pass (cache::attend_rows): up to cache::kMaxWindowQueries, fewer where their
  // scores would pass kScoresBudget floats per thread (long contexts), at least one row's heads.
  int64_t window_queries_ = 1;
  static constexpr int64_t kScoresBudget = int64_t{1} << 20;
  // Rows of one attention pass: `n` rows from `row`, consecutive positions of one sequence (attention()),
  // all of them nodes of `tree` or, when it is null, none of a tree.
  struct Run {
    int64_t row, n;
    const TreeRows* tree;
  };
  std::vector<Run> runs_;         // [max_rows] capacity
  std::vector<int64_t> lengths_;  // per sequence, while validating a batch
  std::vector<int64_t> firsts_;   // per sequence, its lowest row position in a batch
  // This run's trees (borrowed for the run) and, per sequence, the index of its tree there (-1: none).
  std::span<const TreeRows> trees_;
  std::vector<int32_t> tree_of_;
  PhaseTimes* times_ = nullptr;  // borrowed; null: untimed

  // The recurrent layers' mixer; null when the model has none.
  std::unique_ptr<SsmMixer> ssm_;
};

}  // namespace tandem::model
