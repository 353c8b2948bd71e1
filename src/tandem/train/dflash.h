// A DFlash-style block drafter (docs/training.md): the target's hidden states at its tap layers,
// concatenated, are projected and normalized into context rows, ctx = RMSNorm(fc(taps)); every drafter layer
// projects the context rows with its own key and value maps (roped at the context rows' positions) and
// attends to them from the block. A block is B positions: the last accepted token's embedding followed by
// B - 1 copies of a learned mask embedding, each row at its own position. Inside the block attention is
// non-causal; each block row also sees the context rows of the positions before the block. Every layer is a
// pre-norm Llama decoder layer of the target's attention shape (RMSNorm, attention, RMSNorm, SwiGLU, residual
// adds); a final RMSNorm and the target's frozen head give the drafts.
//
// Alignment: block row k (0-based) sits at position anchor + k and drafts the token at anchor + k + 1, so a
// block of B rows drafts B tokens and the block size is the draft depth.
//
// forward_backward runs one batch: the context rows of one sequence and any number of blocks over it, under
// a context+block mask (attention.h), with activations in buffers sized once for max_context and max_rows.
//
// With a reduced draft vocabulary (DflashConfig::draft_vocab) the head holds the target head's rows of those
// tokens only, and the targets are given over draft ids (drafter_data.h restricts them).
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/train/attention.h"
#include "tandem/train/layers.h"
#include "tandem/train/loss.h"
#include "tandem/train/param.h"

namespace tandem::train {

struct DflashConfig {
  int64_t d = 64;  // model width (the target's)
  int64_t n_head = 8;
  int64_t n_kv_head = 4;
  int64_t head_dim = 8;
  int64_t ffn = 172;
  int64_t vocab = 512;  // the target's vocabulary (the embedding's rows)
  // The reduced draft vocabulary: draft id i is target id draft_vocab[i]; the head scores these tokens
  // only. Empty: the whole vocabulary.
  std::vector<int32_t> draft_vocab;
  int64_t n_taps = 3;    // tapped target layers
  int64_t n_layers = 1;  // drafter decoder layers
  int64_t block = 8;     // rows per block: the draft depth
  float rope_theta = 10000.0f;
  RopeLayout rope_layout = RopeLayout::kInterleaved;
  float norm_eps = 1e-5f;

  // Rows of the head: the draft vocabulary's size.
  int64_t head_rows() const { return draft_vocab.empty() ? vocab : static_cast<int64_t>(draft_vocab.size()); }
};

// One batch. The context rows are positions 0 .. context_rows - 1 of one sequence; the block rows come in
// blocks of config().block rows, block b seeing the first context_visible[b] context rows.
struct DflashBatch {
  int64_t context_rows = 0;
  const float* taps = nullptr;           // [context_rows, n_taps * d]
  const int32_t* context_pos = nullptr;  // [context_rows]
  int64_t rows = 0;                      // block rows, a multiple of the block size
  const int32_t* block_ids = nullptr;    // [rows] the anchor's token at a block's first row; others ignored
  const int32_t* block_pos = nullptr;    // [rows]
  const int64_t* context_visible = nullptr;  // [rows / block]
  SoftTargets targets;                       // rows == this->rows
};

class DflashDrafter {
 public:
  // target_weights: whether to hold f32 copies of the target's embedding and head (frozen, filled by the
  // caller), which training reads; a drafter that only drafts reads the target's own and holds none.
  DflashDrafter(const DflashConfig& config, int64_t max_context, int64_t max_rows,
                bool target_weights = true);

  // Fills the trainable weights from `seed` (uniform in +-sqrt(3 / fan_in) for matrices, 1 for norm gains,
  // uniform in +-1 for the mask embedding) and zeroes their gradients; the same seed gives the same bits on
  // every machine.
  void init(uint64_t seed);

  const DflashConfig& config() const { return cfg_; }
  Param& embedding() { return emb_; }  // [vocab, d], set from the target; no values without target_weights
  Param& head() { return head_; }  // [head_rows, d], set from the target; no values without target_weights
  // Frees the f32 copies of the target's embedding and head (forward_backward needs them again).
  void release_target_weights();
  // Every parameter in checkpoint order, frozen ones included.
  std::vector<Param*> params();
  void zero_grad();

  // The batch's loss; with backward, also adds every trainable parameter's gradient. Throws tandem::Error
  // when the drafter holds no copies of the target's weights.
  LossStats forward_backward(const DflashBatch& batch, Compute& c, bool backward = true);

  struct Layer {
    Param attn_norm;     // [d]
    Param wq;            // [n_head * head_dim, d]
    Param wk, wv;        // [n_kv_head * head_dim, d]
    Param wo;            // [d, n_head * head_dim]
    Param ffn_norm;      // [d]
    Param w_gate, w_up;  // [ffn, d]
    Param w_down;        // [d, ffn]
  };
  const Param& fc() const { return fc_; }
  const Param& context_norm() const { return ctx_norm_; }
  const Param& mask_embedding() const { return mask_emb_; }
  const Layer& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  const Param& output_norm() const { return out_norm_; }
  const Param& embedding() const { return emb_; }
  const Param& head() const { return head_; }

 private:
  // Activations of one layer, [rows, width] each (width in the comment).
  struct Saved {
    std::vector<float> x, xn;          // d: the layer's input and its normalized form
    std::vector<float> q, att;         // n_head * head_dim
    std::vector<float> k, v;           // [max_context + max_rows, n_kv_head * head_dim]: context, block
    std::vector<float> h, hn;          // d
    std::vector<float> gate, up, act;  // ffn
    std::vector<float> inv_x, inv_h;   // [rows]
    std::vector<float> probs;          // [n_head, mask scores]
  };

  DflashConfig cfg_;
  int64_t max_context_, max_rows_;
  AttentionShape att_;
  Rope rope_;

  Param fc_;        // [d, n_taps * d]
  Param ctx_norm_;  // [d]
  Param mask_emb_;  // [1, d]
  Param emb_;       // [vocab, d] frozen
  std::vector<Layer> layers_;
  Param out_norm_;  // [d]
  Param head_;      // [head_rows, d] frozen: the target head's rows of the draft vocabulary

  std::vector<float> g_, ctx_, inv_ctx_;  // [max_context, d] fc(taps), its norm; [max_context]
  std::vector<Saved> saved_;              // per layer
  std::vector<float> out_, f_, inv_out_;  // [max_rows, d] the last layer's output, its norm; [max_rows]
  // Gradients.
  std::vector<float> dx_, dh_, dhn_, dxn_, datt_, dq_, dk_, dv_, dgate_, dup_, dact_, df_;
  std::vector<float> dctx_, dg_;  // [max_context, d]
};

}  // namespace tandem::train
