// An EAGLE-3-style drafter (docs/training.md): the target's hidden states at its tap layers, concatenated,
// are projected to the model width (g = fc(taps)); one Llama decoder layer whose q/k/v read
// RMSNorm(embedding of the next token) ++ RMSNorm(g), with g as the residual; post-attention RMSNorm, SwiGLU
// MLP; then n_layer - 1 plain pre-norm Llama decoder layers of the same shape; a final RMSNorm and the
// output head, trained with soft cross-entropy against the target's distribution. The embedding is the
// target's and frozen; the head is the target's (frozen) or the drafter's own (trainable). With a reduced
// draft vocabulary (EagleConfig::draft_vocab) the head scores those tokens only, and the targets are given
// over draft ids (drafter_data.h restricts them).
//
// forward_backward runs one batch of rows (one or more sequences under one attention mask) and keeps every
// activation it needs in buffers sized once for max_rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tandem/train/attention.h"
#include "tandem/train/layers.h"
#include "tandem/train/loss.h"
#include "tandem/train/param.h"

namespace tandem::train {

struct EagleConfig {
  int64_t d = 64;  // model width (the target's)
  int64_t n_head = 8;
  int64_t n_kv_head = 4;
  int64_t head_dim = 8;
  int64_t ffn = 172;
  int64_t vocab = 512;  // the target's vocabulary (the embedding's rows)
  // The reduced draft vocabulary: draft id i is target id draft_vocab[i]; the head scores these tokens
  // only. Empty: the whole vocabulary.
  std::vector<int32_t> draft_vocab;
  int64_t n_taps = 3;   // tapped target layers
  int64_t n_layer = 1;  // decoder layers (>= 1): the first reads the embedding and g, the rest plain
  float rope_theta = 10000.0f;
  RopeLayout rope_layout = RopeLayout::kInterleaved;
  float norm_eps = 1e-5f;
  bool train_head = false;

  // Rows of the head: the draft vocabulary's size.
  int64_t head_rows() const { return draft_vocab.empty() ? vocab : static_cast<int64_t>(draft_vocab.size()); }
};

// One batch. Row i holds position pos[i] of its sequence: the target's tap features there, the token that
// follows it (whose embedding the drafter reads) and the target's distribution for the token after that.
//
// Training-time test: rows [tap_rows, rows) read a given g instead of fc(taps), the drafter's own output
// hidden state (output_hidden()) of an earlier unrolled step, as inference feeds it for drafts 2, 3, ...
// That g is a constant here: no gradient flows back into the step that produced it.
struct EagleBatch {
  int64_t rows = 0;
  const float* taps = nullptr;          // [tap_rows, n_taps * d]
  int64_t tap_rows = -1;                // rows reading taps; -1: every row
  const float* given_g = nullptr;       // [rows - tap_rows, d]; needed when tap_rows < rows
  const int32_t* next_ids = nullptr;    // [rows]
  const int32_t* pos = nullptr;         // [rows]
  const AttentionMask* mask = nullptr;  // rows x rows
  SoftTargets targets;                  // rows == this->rows
};

class EagleDrafter {
 public:
  // target_weights: whether to hold f32 copies of the target's embedding and (unless the head trains) head,
  // frozen and filled by the caller, which training reads; a drafter that only drafts reads the target's
  // own (EagleDraftSource) and holds none.
  EagleDrafter(const EagleConfig& config, int64_t max_rows, bool target_weights = true);

  // Fills the trainable weights from `seed` (uniform in +-sqrt(3 / fan_in) for matrices, 1 for norm gains)
  // and zeroes their gradients; the same seed gives the same bits on every machine.
  void init(uint64_t seed);

  const EagleConfig& config() const { return cfg_; }
  Param& embedding() { return emb_; }  // [vocab, d], set from the target
  Param& head() { return head_; }      // [head_rows, d], set from the target (or trained)
  // Every parameter in checkpoint order, frozen ones included.
  std::vector<Param*> params();
  void zero_grad();

  // The batch's loss; with backward, also adds every trainable parameter's gradient. Throws tandem::Error
  // when the drafter holds no copies of the target's weights.
  LossStats forward_backward(const EagleBatch& batch, Compute& c, bool backward = true);

  // The last batch's output hidden states before the final norm, [batch.rows, d]: the g that the next
  // unrolled step (or draft) reads.
  const float* output_hidden() const { return layers_.empty() ? h2_.data() : layers_.back()->out.data(); }

 private:
  // Decoder layers 1 .. n_layer - 1 (names blk.N.*): input x [rows, d] (layer 0's output or the previous
  // layer's), out = h1 + SwiGLU(RMSNorm(h1)) with h1 = x + attention(RMSNorm(x)).
  struct Layer {
    Layer(int64_t index, const EagleConfig& c, int64_t max_rows);
    Param attn_norm;                     // [d]
    Param wq, wk, wv;                    // [n_head * head_dim, d], [n_kv_head * head_dim, d] (k, v)
    Param wo;                            // [d, n_head * head_dim]
    Param ffn_norm;                      // [d]
    Param w_gate, w_up;                  // [ffn, d]
    Param w_down;                        // [d, ffn]
    std::vector<float> nx, h1, n2, out;  // [max_rows, d]
    std::vector<float> q, att_out;       // [max_rows, n_head * head_dim]
    std::vector<float> k, v;             // [max_rows, n_kv_head * head_dim]
    std::vector<float> gate, up, act;    // [max_rows, ffn]
    std::vector<float> inv_x, inv_h1;    // [max_rows]
    std::vector<float> probs;            // [n_head, mask scores]
  };
  void layer_forward(Layer& l, const float* x, const EagleBatch& b, Compute& c);
  // dy: the gradient of l.out (consumed); dx: the gradient of its input (overwritten).
  void layer_backward(Layer& l, const float* x, const EagleBatch& b, float* dy, float* dx, Compute& c);

  EagleConfig cfg_;
  int64_t max_rows_;
  AttentionShape att_;
  Rope rope_;

  Param fc_;             // [d, n_taps * d]
  Param emb_;            // [vocab, d] frozen
  Param emb_norm_;       // [d]
  Param hidden_norm_;    // [d]
  Param wq_;             // [n_head * head_dim, 2d]
  Param wk_, wv_;        // [n_kv_head * head_dim, 2d]
  Param wo_;             // [d, n_head * head_dim]
  Param ffn_norm_;       // [d]
  Param w_gate_, w_up_;  // [ffn, d]
  Param w_down_;         // [d, ffn]
  Param out_norm_;       // [d]
  Param head_;           // [head_rows, d]: the target head's rows of the draft vocabulary, or the drafter's

  // Activations, [max_rows, width] each (width in the comment), and their gradients.
  std::vector<float> g_, e_, ne_, ng_;      // d
  std::vector<float> u_;                    // 2d: ne ++ ng
  std::vector<float> q_, k_, v_, att_out_;  // n_head * head_dim (q, att_out), n_kv_head * head_dim (k, v)
  std::vector<float> h1_, n2_, h2_, f_;     // d
  std::vector<float> gate_, up_, act_;      // ffn
  std::vector<float> inv_e_, inv_g_, inv_h1_, inv_h2_;  // [max_rows]
  std::vector<float> probs_;                            // [n_head, mask scores], grown to the largest mask
  std::vector<float> df_, dh1_, dh2_, dn2_, dg_;        // d
  std::vector<float> dgate_, dup_, dact_;               // ffn
  std::vector<float> datt_, dq_, dk_, dv_;              // like q, k, v
  std::vector<float> du_, dne_, dng_;                   // 2d, d, d
  std::vector<std::unique_ptr<Layer>> layers_;          // n_layer - 1
  std::vector<float> dnx_, dx_;                         // d: scratch of the plain layers' backward
};

}  // namespace tandem::train
