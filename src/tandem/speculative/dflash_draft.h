// The DFlash-style block draft source (docs/speculative.md, "Drafters that read the target"): the block
// drafter of train/dflash.h run for inference, reading the target's hidden states at its tap layers.
//
// State per generation: the taps of every position the target evaluated (captured during its forwards), and
// per drafter layer the context keys and values of positions 0 .. context_length() - 1, computed once from
// the taps of committed positions and kept. A proposal brings the context up to the last committed position
// the target has evaluated (n - 2 for n committed tokens), then runs one forward over a block of
// config().block rows, the last committed token followed by mask rows, and drafts the block's tokens, greedy
// or sampled from each row's q (the rows are drafted in parallel: a row's q does not depend on the tokens
// drawn before it). The block's keys and values are dropped when the round settles; a rollback drops the
// context rows past the new committed text, so the cache always equals a fresh run's over that text.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/kernels/matmul.h"
#include "tandem/model/model.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/tap_draft_source.h"
#include "tandem/speculative/target_vocab.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/dflash.h"
#include "tandem/util/thread_pool.h"

namespace tandem::speculative {

inline constexpr const char* kDflashKind = "dflash";

// The drafter's shape for `target` (its width, attention heads and FFN width) with n_taps tap layers,
// n_layers drafter layers and blocks of `block` rows.
train::DflashConfig dflash_config_for(const model::Model& target, int64_t n_taps, int64_t n_layers,
                                      int64_t block);
// The shape a checkpoint records; throws tandem::Error when it is not a DFlash drafter.
train::DflashConfig dflash_config_of(const train::DrafterInfo& info);
// Records config's shape in info.
void set_dflash_shape(train::DrafterInfo& info, const train::DflashConfig& config);
// Copies the target's token embedding and output head (its rows of the draft vocabulary) into the drafter's
// frozen parameters (f32), which training reads; drafting reads the target's own (DflashDraftSource).
void copy_target_weights(const model::Model& target, train::DflashDrafter& drafter);

class DflashDraftBatch;

class DflashDraftSource final : public TapDraftSource {
 public:
  // drafter: trained or loaded; taps: the target layers it reads, in training order. n_ctx: the longest
  // sequence (positions) the source will see. The target's token embedding and output head (its rows of the
  // draft vocabulary, gathered here) are read in their stored block type (TargetVocab; the target must
  // outlive the source); the
  // drafter's f32 copies of them, if it holds any, are freed here, so that the source adds only the
  // drafter's own weights. The drafter's large matrices (a million entries or more, rows a multiple of 32
  // wide) draft from a Q8_0 copy made here, so that a block costs about the bytes of its weights, a fraction
  // of the target's. batch (when not null: the source proposes in batches with the others made with it, see
  // DflashDraftBatch) must outlive the source.
  DflashDraftSource(std::unique_ptr<train::DflashDrafter> drafter, std::vector<int32_t> taps,
                    ThreadPool& pool, int64_t n_ctx, const model::Model& target,
                    DflashDraftBatch* batch = nullptr);

  // Loads a checkpoint written by `tandem train-drafter --kind dflash`, refusing one made for another target.
  static std::unique_ptr<DflashDraftSource> load(const std::string& path, const model::Model& target,
                                                 const std::string& target_file_hash, ThreadPool& pool,
                                                 int64_t n_ctx, DflashDraftBatch* batch = nullptr);

  std::string_view kind() const override { return kDflashKind; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  // Drafts min(max_depth, block) tokens; the whole block runs whatever the depth, so a draft does not depend
  // on the depth asked for.
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;
  const void* batch_group() const override { return batch_; }
  // Every request's source is a DflashDraftSource of this one's batch. The blocks of all requests run as one
  // forward on this source's weights (the batch's sources hold the same drafter), each block attending to its
  // own sequence's context.
  void propose_batch(std::span<const DraftRequest> requests) override;

  // A tree from the same one block forward: the chain of each row's most probable token, and beside a
  // chain node a sibling (its row's second token, a leaf) where the row is unsure: the row's best token
  // covers less than tree_cover of its distribution (dynamic_tree.h: the same ranking and scores as the
  // other drafters' trees, at most tree_branch children). The proposal is the max_nodes nodes of highest
  // cumulative probability, deterministic at any temperature. The block's rows do not depend on the tokens
  // drafted before them, so a sibling costs no drafter work.
  void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) override;

  int tree_branch = 2;      // children of one node, at most
  float tree_cover = 0.8f;  // probability mass a node's children cover before the branch limit

  train::DflashDrafter& drafter() { return *drafter_; }
  const TargetVocab& vocab() const { return vocab_; }
  // Bytes of weights the source holds beyond the target's: the drafter's parameter values, the Q8_0 copies
  // made for drafting and the gathered head rows of a reduced draft vocabulary.
  size_t weight_bytes() const;

  // Context rows cached (positions 0 .. context_length() - 1), and the rows in each layer's key cache now:
  // the context and, between propose() and accept(), the block.
  int64_t context_length() const { return ctx_len_; }
  int64_t cache_length() const { return len_; }
  // Layer l's cached keys of rows [0, cache_length()), [cache_length(), n_kv_head * head_dim].
  std::span<const float> cached_keys(int64_t l) const {
    return {k_[static_cast<size_t>(l)].data(), static_cast<size_t>(len_ * kv_width_)};
  }
  std::span<const float> cached_values(int64_t l) const {
    return {v_[static_cast<size_t>(l)].data(), static_cast<size_t>(len_ * kv_width_)};
  }

 private:
  friend class DflashDraftBatch;

  // Scratch of drafter forwards (a source's own, or its batch's): context forwards of at most ctx_rows rows,
  // block forwards of at most block_rows rows.
  struct Rows {
    Rows() = default;
    Rows(const train::DflashConfig& cfg, int threads, int64_t ctx_rows, int64_t block_rows, int64_t context);
    int64_t ctx_rows = 0, block_rows = 0, n_ctx = 0;
    int n_threads = 0;
    std::vector<int32_t> pos;            // [max(ctx_rows, block_rows)]
    std::vector<float> k, v;             // [max(ctx_rows, block_rows), n_kv_head * head_dim]
    std::vector<float> in;               // [ctx_rows, n_taps * d] gathered taps
    std::vector<float> g, ctx;           // [ctx_rows, d]
    std::vector<float> x, xn, h, hn, f;  // [block_rows, d]
    std::vector<float> q, att;           // [block_rows, n_head * head_dim]
    std::vector<float> gate, up, act;    // [block_rows, ffn]
    std::vector<float> inv;              // [max(ctx_rows, block_rows)]
    std::vector<float> scores;           // [threads, n_ctx + block]
    std::vector<float> logits;           // [block_rows, head rows] over the draft vocabulary
    kernels::MatmulScratch mm;
  };
  // n context rows of `source` from ctx_len_ on.
  struct Span {
    DflashDraftSource* source;
    int64_t n;
  };
  // One sequence's block: the anchor token and mask rows at positions first_pos .. first_pos + block - 1
  // after its source's context; the logits of its first `rows` rows are wanted.
  struct Block {
    DflashDraftSource* source;
    int32_t anchor;
    int64_t first_pos;
    int64_t rows;
  };

  // Computes the context keys and values of every span's rows (at most w.ctx_rows in all) in one forward on
  // this source's weights, into each span's own cache.
  void extend_context(std::span<const Span> spans, Rows& w);
  // Runs the blocks (at most w.block_rows rows in all) in one forward on this source's weights, each block
  // over its own source's context; leaves the wanted logits of the blocks one after another in w.logits.
  void run_blocks(std::span<const Block> blocks, Rows& w);
  // This source's own scratch (made on its first proposal alone when it has a batch).
  Rows& own_rows();
  // Brings the context up to committed less its last token and runs one block of `depth` from that token.
  Rows& run_own_block(std::span<const int32_t> committed, int64_t depth);
  // Draws `depth` drafts continuing `committed` from logits [depth, head rows] into out.
  void draw(std::span<const int32_t> committed, const float* logits, int64_t depth, Draft& out);

  // A weight matrix as the drafting kernels read it: a view of the drafter's f32 values, or of a Q8_0 copy.
  struct Matrix {
    MatrixView view;
    std::vector<uint8_t> q8;  // the Q8_0 copy, when made
  };
  static Matrix make_matrix(const train::Param& p);
  void matmul(const MatrixView& w, const float* x, int64_t rows, float* y, Rows& rw);

  std::unique_ptr<train::DflashDrafter> drafter_;
  train::DflashConfig cfg_;
  Matrix fc_;
  std::vector<Matrix> layer_mats_;  // per layer: wq, wk, wv, wo, w_gate, w_up, w_down
  TargetVocab vocab_;               // the target's embedding and head, in their stored block type
  train::Compute compute_;
  int64_t n_ctx_;
  int64_t kv_width_;

  std::vector<std::vector<float>> k_, v_;  // per layer [n_ctx + block, n_kv_head * head_dim], roped keys
  int64_t ctx_len_ = 0;                    // context rows cached
  int64_t len_ = 0;                        // rows in the key caches (context, then a proposal's block)
  DflashDraftBatch* batch_ = nullptr;
  Rows rows_;
  std::vector<int32_t> history_;
  std::vector<float> full_;  // [vocab] one draft's logits by target id (-inf outside the draft vocabulary)
};

// The DFlash drafter's batched forward, shared by the sources of a driver with several sequences
// (engine::Scheduler): sources made with one batch propose together (DraftSource::batch_group), the context
// rows every sequence still lacks in forwards shared with the others, then the blocks of all sequences as
// one forward of n blocks (n * block rows): matrix products over every row at once, each block attending to
// its own sequence's context keys and values only. Every row is computed as alone (matmul gives a row the
// same bits in every row class, docs/kernels.md), so every sequence drafts exactly what it drafts alone. The
// sources of one batch must hold the same drafter (one file) and a context of at most n_ctx positions. Used
// by one thread at a time.
class DflashDraftBatch {
 public:
  // pool: the sources' threads; max_sequences: the most sources that propose together; n_ctx: the sources'
  // context; max_rows: context rows per forward.
  DflashDraftBatch(const train::DflashConfig& config, ThreadPool& pool, int max_sequences, int64_t n_ctx,
                   int64_t max_rows = 64);

  const train::DflashConfig& config() const { return cfg_; }
  // Batched proposals run, and the most sequences one of them drafted for.
  int64_t proposals() const { return proposals_; }
  int64_t widest() const { return widest_; }

 private:
  friend class DflashDraftSource;
  struct Member {
    DflashDraftSource* source;
    std::span<const int32_t> committed;
    int64_t depth;
    Draft* out;
  };
  train::DflashConfig cfg_;
  DflashDraftSource::Rows rows_;
  std::vector<Member> members_;                   // [max_sequences]
  std::vector<DflashDraftSource::Span> spans_;    // [max_sequences]
  std::vector<DflashDraftSource::Block> blocks_;  // [max_sequences]
  int64_t proposals_ = 0, widest_ = 0;
};

}  // namespace tandem::speculative
