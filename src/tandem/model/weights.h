// The weights of a decoder, as views into the mapped GGUF file (no copies; quantized layer matrices repacked
// in place at load where it pays, MatrixView::interleaved).
#pragma once

#include <vector>

#include "tandem/tensor/weight.h"

namespace tandem::model {

// A mixture-of-experts FFN (config MoeConfig). Each routed expert is its own view into the file's stacked
// [n_expert][rows][cols] tensor, in the file's block type.
struct MoeWeights {
  MatrixView router;             // [n_expert, n_embd] (ffn_gate_inp)
  VectorView selection_bias;     // [n_expert] (exp_probs_b, V3), else empty
  std::vector<MatrixView> gate;  // n_expert x [n_ff_expert, n_embd]
  std::vector<MatrixView> up;    // n_expert x [n_ff_expert, n_embd]
  std::vector<MatrixView> down;  // n_expert x [n_embd, n_ff_expert]
  VectorView shared_gate_inp;    // [n_embd] (qwen2moe), else empty
  MatrixView shared_gate;        // [n_ff_shared, n_embd], empty without a shared expert
  MatrixView shared_up;          // [n_ff_shared, n_embd]
  MatrixView shared_down;        // [n_embd, n_ff_shared]
  bool empty() const { return router.empty(); }
};

// Multi-head latent attention (config MlaConfig); the output projection is LayerWeights::wo.
struct MlaWeights {
  MatrixView wq;         // [n_head * head_dim, n_embd] without a q LoRA, else empty
  MatrixView wq_a;       // [q_lora_rank, n_embd] (attn_q_a)
  VectorView q_a_norm;   // [q_lora_rank]
  MatrixView wq_b;       // [n_head * head_dim, q_lora_rank]
  MatrixView wkv_a;      // [kv_lora_rank + n_rot, n_embd] (attn_kv_a_mqa): the latent, then the rotary key
  VectorView kv_a_norm;  // [kv_lora_rank]
  // The up-projection, in one of two forms (model/mla.h): joined, wkv_b; or split per head, wk_b and wv_b.
  MatrixView wkv_b;  // [n_head * (head_dim - n_rot + head_dim_v), kv_lora_rank]: per head, key nope part then
                     // value (attn_kv_b); empty in the split form
  MatrixView wk_b;   // [n_head * kv_lora_rank, head_dim - n_rot]: per head, its key rows transposed
                     // (attn_k_b); empty in the joined form
  MatrixView wv_b;   // [n_head * head_dim_v, kv_lora_rank]: per head, its value rows (attn_v_b); empty in the
                     // joined form
  // What the products multiply (model/mla.h, make_mla_copies): views of the file's tensors or copies made at
  // load, owned by the Model; empty until Model::from_file makes them.
  MatrixView wk_t;  // [n_head * kv_lora_rank, head_dim - n_rot]: per head, its key rows transposed (F32/F16)
  MatrixView wv;    // [n_head * head_dim_v, kv_lora_rank]: the value rows where they are not wkv_b's own
                    // float rows; empty when they are
  bool split() const { return !wk_b.empty(); }
  bool empty() const { return wkv_a.empty(); }
};

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
  MoeWeights moe;             // MoE layers (Config::moe_layer), else empty
  MlaWeights mla;             // latent attention (deepseek2; wq, wk, wv empty), else empty
  // Encoders (bert), else empty: the output projection's and the FFN's biases, and the LayerNorms applied
  // after the attention and FFN residual adds (weight and bias each).
  VectorView bo;                                // [n_embd]
  VectorView b_up, b_down;                      // [n_ff], [n_embd]
  VectorView attn_out_norm, attn_out_norm_b;    // [n_embd]
  VectorView layer_out_norm, layer_out_norm_b;  // [n_embd]

  // Mamba-1 mixer of a recurrent layer (which has attn_norm and, in a hybrid, ffn_norm and the FFN), else
  // empty.
  MatrixView ssm_in;        // [2 * d_inner, n_embd]: the mixer input x, then the gate z
  MatrixView ssm_conv1d;    // F32 [d_inner, d_conv]: per channel, the oldest input's weight first
  VectorView ssm_conv1d_b;  // [d_inner]
  MatrixView ssm_x;         // [dt_rank + 2 * d_state, d_inner]: dt, B, C
  MatrixView ssm_dt;        // [d_inner, dt_rank]
  VectorView ssm_dt_b;      // [d_inner]
  MatrixView ssm_a;         // F32 [d_inner, d_state]: A = -exp(A_log)
  VectorView ssm_d;         // [d_inner]
  MatrixView ssm_out;       // [n_embd, d_inner]
  // Jamba: RMSNorm weights applied to dt, B and C after ssm_x; empty for Mamba-1.
  VectorView ssm_dt_norm;  // [dt_rank]
  VectorView ssm_b_norm;   // [d_state]
  VectorView ssm_c_norm;   // [d_state]
  // Channel-minor copies that the kernels' vectors run over (kernels/ssm.h), owned by the Model; null until
  // Model::from_file makes them.
  const float* ssm_conv_t = nullptr;  // [d_conv, d_inner]: ssm_conv1d transposed
  const float* ssm_a_t = nullptr;     // [d_state, d_inner]: ssm_a transposed
};

// A next-token-prediction (MTP) layer (DeepSeek-V3 / GLM style, {arch}.nextn_predict_layers): for position
// t, the main model's final hidden state h_t (before the output norm) and the embedding e of token t + 1 make
// the block's input eh_proj [enorm(e); hnorm(h_t)]; the block is an ordinary decoder block of the
// architecture (its attention at position t); its output, through head_norm and head, predicts token t + 2.
// The optional tensors fall back to the main model's (empty here: the forward uses Weights' own).
struct MtpWeights {
  LayerWeights block;    // blk.i's decoder block
  VectorView enorm;      // [n_embd] (nextn.enorm): RMS norm of the next token's embedding
  VectorView hnorm;      // [n_embd] (nextn.hnorm): RMS norm of the previous hidden state
  MatrixView eh_proj;    // [n_embd, 2 * n_embd] (nextn.eh_proj): [enorm(e); hnorm(h)] -> the block's input
  MatrixView embed;      // [n_vocab, n_embd] (nextn.embed_tokens), else empty: token_embd
  VectorView head_norm;  // [n_embd] (nextn.shared_head_norm), else empty: output_norm
  MatrixView head;       // [n_vocab, n_embd] (nextn.shared_head_head), else empty: output
};

struct Weights {
  MatrixView tok_embd;     // [n_vocab, n_embd]
  VectorView output_norm;  // [n_embd]
  MatrixView output;       // [n_vocab, n_embd]; the embedding when the head is tied
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;  // [Config::n_mtp] the MTP layers after the main ones
  // Encoders (bert), else empty.
  MatrixView pos_embd;                // [n_ctx_train, n_embd]
  MatrixView type_embd;               // [n_token_types, n_embd]; encoders add row 0
  VectorView embd_norm, embd_norm_b;  // [n_embd]: LayerNorm of the summed embeddings
};

}  // namespace tandem::model
