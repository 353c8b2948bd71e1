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

  // Mamba-1 mixer of a recurrent layer (which has attn_norm and none of the above), else empty.
  MatrixView ssm_in;        // [2 * d_inner, n_embd]: the mixer input x, then the gate z
  MatrixView ssm_conv1d;    // F32 [d_inner, d_conv]: per channel, the oldest input's weight first
  VectorView ssm_conv1d_b;  // [d_inner]
  MatrixView ssm_x;         // [dt_rank + 2 * d_state, d_inner]: dt, B, C
  MatrixView ssm_dt;        // [d_inner, dt_rank]
  VectorView ssm_dt_b;      // [d_inner]
  MatrixView ssm_a;         // F32 [d_inner, d_state]: A = -exp(A_log)
  VectorView ssm_d;         // [d_inner]
  MatrixView ssm_out;       // [n_embd, d_inner]
  // Channel-minor copies that the kernels' vectors run over (kernels/ssm.h), owned by the Model; null until
  // Model::from_file makes them.
  const float* ssm_conv_t = nullptr;  // [d_conv, d_inner]: ssm_conv1d transposed
  const float* ssm_a_t = nullptr;     // [d_state, d_inner]: ssm_a transposed
};

struct Weights {
  MatrixView tok_embd;     // [n_vocab, n_embd]
  VectorView output_norm;  // [n_embd]
  MatrixView output;       // [n_vocab, n_embd]; the embedding when the head is tied
  std::vector<LayerWeights> layers;
};

}  // namespace tandem::model
