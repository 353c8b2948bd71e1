// The weights of a decoder, as views into the mapped GGUF file (no copies; quantized layer matrices repacked
// in place at load where it pays, MatrixView::interleaved).
#pragma once

#include <vector>

#include "tandem/tensor/weight.h"

namespace tandem::model {

struct LayerWeights {
  VectorView attn_norm;       // [n_embd]
  MatrixView wq;              // [q_dim, n_embd]
  MatrixView wk;              // [kv_dim, n_embd]
  MatrixView wv;              // [v_dim, n_embd]
  MatrixView wo;              // [n_embd, n_head * head_dim_v]
  VectorView bq, bk, bv;      // [q_dim], [kv_dim], [v_dim] (qwen2), else empty
  VectorView q_norm, k_norm;  // [head_dim] (qwen3), else empty
  VectorView post_attn_norm;  // [n_embd] (gemma2), else empty
  VectorView ffn_norm;        // [n_embd]
  MatrixView w_gate;          // [n_ff, n_embd]
  MatrixView w_up;            // [n_ff, n_embd]
  MatrixView w_down;          // [n_embd, n_ff]
  VectorView post_ffn_norm;   // [n_embd] (gemma2), else empty
  // Encoders (bert), else empty: the output projection's and the FFN's biases, and the LayerNorms applied
  // after the attention and FFN residual adds (weight and bias each).
  VectorView bo;                                // [n_embd]
  VectorView b_up, b_down;                      // [n_ff], [n_embd]
  VectorView attn_out_norm, attn_out_norm_b;    // [n_embd]
  VectorView layer_out_norm, layer_out_norm_b;  // [n_embd]
};

struct Weights {
  MatrixView tok_embd;     // [n_vocab, n_embd]
  VectorView output_norm;  // [n_embd]
  MatrixView output;       // [n_vocab, n_embd]; the embedding when the head is tied
  std::vector<LayerWeights> layers;
  // Encoders (bert), else empty.
  MatrixView pos_embd;                // [n_ctx_train, n_embd]
  MatrixView type_embd;               // [n_token_types, n_embd]; encoders add row 0
  VectorView embd_norm, embd_norm_b;  // [n_embd]: LayerNorm of the summed embeddings
};

}  // namespace tandem::model
