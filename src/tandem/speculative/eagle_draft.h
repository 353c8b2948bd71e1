// The EAGLE-3-style draft source (docs/speculative.md, "Drafters that read the target"): the drafter layer of
// train/eagle.h run for inference, reading the target's hidden states at its tap layers.
//
// State per generation: the taps of every position the target evaluated (captured during its forwards), and
// the drafter's own KV cache. Cache row p is "real" when it was computed from the target's taps at p and the
// committed token p + 1; its output predicts token p + 2. A proposal brings the real rows up to the last
// committed position the target has evaluated, then drafts greedily (or samples) d tokens, each further
// draft reading the drafter's own output hidden state in place of the taps it does not have. The draft rows
// are dropped again when the round settles, as the target's cache drops its rejected rows; real rows are
// never recomputed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/cache/attention.h"
#include "tandem/gguf/reader.h"
#include "tandem/kernels/matmul.h"
#include "tandem/model/model.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/tap_draft_source.h"
#include "tandem/speculative/target_vocab.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/eagle.h"
#include "tandem/util/thread_pool.h"

namespace tandem::speculative {

inline constexpr const char* kEagleKind = "eagle3";

// Names a target's vocabulary: FNV-1a 64 of its tokenizer.ggml.tokens (each token and a 0 byte), in hex.
std::string vocabulary_hash(const gguf::File& file);

// The tap layers for a target of n_layer decoder layers: low, middle and high (2, n_layer / 2, n_layer - 3),
// clamped to the model; where those collide (models of fewer than 8 layers), 1, n_layer / 2 and n_layer - 1
// instead, and duplicates dropped.
std::vector<int32_t> default_eagle_taps(int64_t n_layer);

// The drafter's shape for `target` (its width, attention heads and FFN width) with n_taps tap layers.
train::EagleConfig eagle_config_for(const model::Model& target, int64_t n_taps);
// The shape a checkpoint records; throws tandem::Error when it is not an EAGLE-3 drafter.
train::EagleConfig eagle_config_of(const train::DrafterInfo& info);
// Records config's shape in info.
void set_eagle_shape(train::DrafterInfo& info, const train::EagleConfig& config);

// Copies the target's token embedding (and, unless the drafter trains its own, its output head's rows of the
// draft vocabulary) into the drafter's frozen parameters, dequantized to f32, which training reads; drafting
// reads the target's own (EagleDraftSource).
void copy_target_weights(const model::Model& target, train::EagleDrafter& drafter);

// Throws tandem::Error unless the drafter was made for this target, saying which of the file hash, the
// vocabulary or the tap layers (and width) differs.
void check_eagle_target(const train::DrafterInfo& info, const model::Model& target,
                        const std::string& target_file_hash);

class EagleDraftSource;
class EagleDraftBatch;

// The calibration key of a drafter file's drafting cost (Calibration::draft_per_token): its kind and
// file_fingerprint(), so that each drafter, and no draft model, is charged its own measured cost.
std::string eagle_cost_key(const std::string& drafter_path);

// The cost of one drafted token relative to a target decode step of `decode_seconds`: the median over
// `rounds` of a proposal of `depth` tokens (one real row and depth - 1 draft rows, as each round of
// speculation runs) after a context of `context` positions, divided by depth. The source is begun anew
// and left empty.
double measure_eagle_draft_cost(EagleDraftSource& source, double decode_seconds, int64_t context = 64,
                                int depth = 6, int rounds = 7);

class EagleDraftSource final : public TapDraftSource {
 public:
  // drafter: trained or loaded; taps: the target layers it reads, in training order. n_ctx: the longest
  // sequence (positions) the source will see. The target's token embedding and output head (its rows of the
  // draft vocabulary, gathered here) are read in their stored block type (TargetVocab; the target must
  // outlive the source), not from the drafter's f32 copies, which it need not hold; a head the drafter
  // trained is its own. batch (when not null: the source proposes in batches with the others made with it,
  // see EagleDraftBatch) must outlive the source.
  EagleDraftSource(std::unique_ptr<train::EagleDrafter> drafter, std::vector<int32_t> taps, ThreadPool& pool,
                   int64_t n_ctx, const model::Model& target, EagleDraftBatch* batch = nullptr);

  // Loads a checkpoint written by `tandem train-drafter`, refusing one made for another target.
  static std::unique_ptr<EagleDraftSource> load(const std::string& path, const model::Model& target,
                                                const std::string& target_file_hash, ThreadPool& pool,
                                                int64_t n_ctx, EagleDraftBatch* batch = nullptr);

  std::string_view kind() const override { return kEagleKind; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;
  const void* batch_group() const override { return batch_; }
  // Every request's source is an EagleDraftSource of this one's batch. Each drafting step is one forward of
  // a row per sequence still drafting, on this source's weights (the batch's sources hold the same drafter).
  void propose_batch(std::span<const DraftRequest> requests) override;

  // An EAGLE-2 style dynamic tree (dynamic_tree.h), as DraftModelSource::propose_tree grows one: level by
  // level, the frontier nodes (at most tree_expand) of highest cumulative probability are evaluated in one
  // drafter forward, each row reading its parent's output hidden state (the last real row's for the
  // committed text's children) and attending to the real rows and its own ancestors' rows (the tree mask);
  // each takes its most probable tokens as children, as many as cover tree_cover of its distribution, at
  // most tree_branch. A node's row computes the bits a chain drafting its path computes. The proposal is
  // the max_nodes best nodes, scored and deterministic at any temperature. The tree's rows are dropped when
  // the round settles, as a chain's draft rows are.
  void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) override;

  int tree_branch = 2;      // children of one node, at most
  int tree_expand = 4;      // nodes one drafter forward evaluates, at most (at most 64)
  float tree_cover = 0.8f;  // probability mass a node's children cover before the branch limit

  train::EagleDrafter& drafter() { return *drafter_; }
  const TargetVocab& vocab() const { return vocab_; }
  int64_t n_ctx() const { return n_ctx_; }

  // The output hidden state (before the final norm) of the last row the latest proposal ran, [d].
  std::span<const float> last_hidden() const { return g_last_; }
  // Rows of the drafter's KV cache (real rows and the current proposal's draft rows).
  int64_t cache_length() const { return len_; }
  // The cached keys of rows [0, cache_length()), [cache_length(), n_kv_head * head_dim].
  std::span<const float> cached_keys() const { return {k_.data(), static_cast<size_t>(len_ * kv_width_)}; }

 private:
  friend class EagleDraftBatch;

  // Scratch of drafter forwards over at most `rows` rows (a source's own, or its batch's), logits for at most
  // logit_rows of them, attention for `threads` threads over at most n_ctx cache rows.
  struct Rows {
    Rows() = default;
    Rows(const train::EagleConfig& cfg, int threads, int64_t rows, int64_t logit_rows, int64_t context);
    int64_t rows = 0, logit_rows = 0, n_ctx = 0;
    int n_threads = 0;
    std::vector<int32_t> pos, ids;                   // [rows]
    std::vector<int32_t> segment;                    // [rows] the segment each row belongs to
    std::vector<int64_t> visible;                    // [rows] the cache rows each row attends to
    std::vector<int32_t> node;                       // [rows] a tree row's node (Segment::tree), else -1
    std::vector<float> scores;                       // [threads, n_ctx]
    std::vector<float> in;                           // [rows, n_taps * d] the taps of the rows that read them
    std::vector<float> g, e, ne, ng, h1, n2, h2, f;  // [rows, d]
    std::vector<float> u;                            // [rows, 2 * d]
    std::vector<float> q, att;                       // [rows, n_head * head_dim]
    std::vector<float> k, v;                         // [rows, n_kv_head * head_dim]
    std::vector<float> gate, up, act;                // [rows, ffn]
    std::vector<float> inv;                          // [rows]
    std::vector<float> logits;                       // [logit_rows, head rows] over the draft vocabulary
    kernels::MatmulScratch mm;                       // the head's
  };
  // One sequence's rows in a forward: n rows of `source` at positions source->len_ .. len_ + n - 1, each
  // reading the source's taps there (given_g null) or given_g [n, d], with the tokens that follow them.
  struct Segment {
    EagleDraftSource* source;
    int64_t n;
    const float* given_g;
    const int32_t* next_ids;
    bool want_logits;  // the last row's logits into source->logits_
    // Null, or the tree (cache::TreeMask over the source's cache) whose nodes len_ - tree->base .. are these
    // rows: each is rotated at tree->base + its depth and attends to the rows before tree->base and its
    // ancestors' rows; every row's output hidden state goes to source->tree_hidden_ at its node, and its
    // logits over the draft vocabulary (want_logits ignored) to w.logits in row order. A tree segment runs
    // alone.
    const cache::TreeMask* tree;
  };

  // Runs the segments (at most `w.rows` rows in all) in one forward on this source's weights: matrix products
  // over every row at once, attention of each segment over its own source's cache. Appends each segment's
  // keys and values to its source's cache and leaves its last row's output hidden state in its g_last_ and,
  // when want_logits, its logits in its logits_.
  void run(std::span<const Segment> segments, Rows& w);
  // One segment of this source's own in its own scratch.
  void forward(int64_t n, const float* given_g, const int32_t* next_ids, bool want_logits);
  // Causal attention of the forward's n rows of roped queries (w.q) over their own segment's cache of
  // `layer` (< 0: the first layer, else plain layer `layer`), into w.att; (row, head) pairs split over the
  // threads, each computed as in a forward of its own.
  void attend(std::span<const Segment> segments, int64_t layer, int64_t n, Rows& w);
  // Draws draft i (at position `position`) from logits_ into out.
  void draw(int64_t position, size_t i, Draft& out);
  // Brings the real rows up to the last committed position the target has evaluated (committed.size() - 2,
  // >= 0), running that row now so that its logits_ and g_last_ are at hand.
  void catch_up(std::span<const int32_t> committed);

  // A plain decoder layer after the first (train::EagleDrafter's blk.N, N >= 1): its weights, borrowed,
  // and its cache, [n_ctx, n_kv_head * head_dim] each.
  struct PlainLayer {
    const train::Param *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
    std::vector<float> k, v;
  };

  std::unique_ptr<train::EagleDrafter> drafter_;
  train::EagleConfig cfg_;
  train::Compute compute_;
  int64_t n_ctx_;
  int64_t kv_width_;

  // Weights, borrowed from drafter_, and the target's embedding and head (or the drafter's own head).
  const train::Param *fc_, *emb_norm_, *hidden_norm_, *wq_, *wk_, *wv_, *wo_, *ffn_norm_, *w_gate_, *w_up_,
      *w_down_, *out_norm_;
  TargetVocab vocab_;
  MatrixView head_;  // [head rows, d]

  std::vector<float> k_, v_;  // [n_ctx, n_kv_head * head_dim] the first layer's cache, roped keys
  std::vector<PlainLayer> plain_;
  int64_t len_ = 0;       // rows in the cache
  int64_t real_len_ = 0;  // rows computed from the target's taps: positions 0 .. real_len_ - 1
  EagleDraftBatch* batch_ = nullptr;
  Rows rows_;                  // this source's own scratch (made on its first proposal alone in a batch)
  std::vector<float> g_last_;  // [d]
  std::vector<float> logits_;  // [vocab] the latest draft's logits by target id (-inf outside the draft
                               // vocabulary)
  std::vector<int32_t> history_;
  std::vector<float> tree_hidden_;  // [n_ctx, d] propose_tree: each evaluated node's output hidden state
  std::vector<float> tree_g_;       // [tree_expand, d] a tree forward's given hidden states
  std::vector<float> tree_root_;    // [d] the last real row's output hidden state
  std::vector<int32_t> tree_ids_;   // [tree_expand] a tree forward's tokens
};

// The EAGLE drafter's batched forward, shared by the sources of a driver with several sequences
// (engine::Scheduler): sources made with one batch propose together (DraftSource::batch_group), the real rows
// every sequence still lacks in forwards shared with the others, then each drafting step one row per sequence
// in one forward. Every row is computed as alone (the float matrix products give a row the same bits in
// every row count, docs/kernels.md), so every sequence drafts exactly what it drafts alone. The sources of
// one batch must hold the same drafter (one file) and a context of at most n_ctx positions. Used by one
// thread at a time.
class EagleDraftBatch {
 public:
  // pool: the sources' threads; max_sequences: the most sources that propose together; n_ctx: the sources'
  // context; max_rows: rows per forward (>= max_sequences).
  EagleDraftBatch(const train::EagleConfig& config, ThreadPool& pool, int max_sequences, int64_t n_ctx,
                  int64_t max_rows = 64);

  const train::EagleConfig& config() const { return cfg_; }
  // Batched proposals run, and the most sequences one of them drafted for.
  int64_t proposals() const { return proposals_; }
  int64_t widest() const { return widest_; }

 private:
  friend class EagleDraftSource;
  struct Member {
    EagleDraftSource* source;
    std::span<const int32_t> committed;
    int64_t depth;
    Draft* out;
  };
  train::EagleConfig cfg_;
  EagleDraftSource::Rows rows_;
  std::vector<Member> members_;                      // [max_sequences]
  std::vector<EagleDraftSource::Segment> segments_;  // [max_sequences]
  int64_t proposals_ = 0, widest_ = 0;
};

}  // namespace tandem::speculative
