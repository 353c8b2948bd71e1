// A decoder-only transformer described as data: every family Tandem runs (llama, qwen2, qwen3, gemma2) is one
// set of these values plus the weights named in weights.h. Architecture files fill them from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/cache/geometry.h"

namespace tandem::model {

enum class RopeLayout { kNormal, kNeoX };
enum class FfnActivation { kSiLU, kGeluTanh };
// How a sequence's final hidden states become one embedding ({arch}.pooling_type: 0 none, 1 mean, 2 cls,
// 3 last): the mean over all positions, the first position ([CLS]) or the last one.
enum class Pooling { kNone, kMean, kCls, kLast };

// How a mixture-of-experts layer turns router logits into expert scores.
enum class ExpertGating { kSoftmax, kSigmoid };

// The feed-forward of mixture-of-experts layers (model/moe.h): a router picks `n_expert_used` of `n_expert`
// SwiGLU experts per token; shared experts (one SwiGLU of width `n_ff_shared`) run for every token.
struct MoeConfig {
  int64_t n_expert = 0;         // routed experts per MoE layer; 0: the model has no MoE layers
  int64_t n_expert_used = 0;    // experts chosen per token (top-k)
  int64_t n_ff_expert = 0;      // width of one routed expert
  int64_t n_ff_shared = 0;      // width of the shared expert (all shared experts together); 0: none
  int64_t n_leading_dense = 0;  // layers [0, n_leading_dense) keep the dense FFN
  ExpertGating gating = ExpertGating::kSoftmax;
  bool norm_top_k = false;      // the chosen weights are divided by their sum
  float weights_scale = 1.0f;   // multiplies the chosen weights (after norm_top_k)
  bool shared_gate = false;     // qwen2moe: the shared expert's output times sigmoid(x · ffn_gate_inp_shexp)
  bool selection_bias = false;  // V3: a per-expert bias added to the scores for selection only
  // Group-limited selection: experts in n_group equal groups; only the n_group_used groups with the highest
  // sums of their top-2 scores are eligible. 1 / 1: no limit.
  int64_t n_group = 1, n_group_used = 1;
};

// Multi-head latent attention (deepseek2, model/mla.h): queries through an optional low-rank bottleneck,
// keys and values up-projected from a per-token latent of kv_lora_rank plus one rotary key part of n_rot
// shared by all heads. Each head's key is [nope part (head_dim - n_rot), rotary part (n_rot)].
struct MlaConfig {
  int64_t q_lora_rank = 0;   // 0: queries straight from the residual (attn_q), else attn_q_a / attn_q_b
  int64_t kv_lora_rank = 0;  // 0: not MLA
};

struct Config {
  std::string arch;     // general.architecture
  int64_t n_embd = 0;   // residual width
  int64_t n_layer = 0;  // the main decoder layers (the forward's); MTP layers come after them
  // Next-token-prediction (MTP) layers the checkpoint carries after its n_layer main layers
  // ({arch}.nextn_predict_layers; blk.n_layer .. blk.n_layer + n_mtp - 1, Weights::mtp). The main forward
  // never runs them; the MTP drafter does (speculative/mtp_draft.h).
  int64_t n_mtp = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;    // key and query width per head
  int64_t head_dim_v = 0;  // value width per head
  int64_t n_ff = 0;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  float norm_eps = 1e-5f;

  RopeLayout rope_layout = RopeLayout::kNormal;
  int64_t n_rot = 0;  // rotated dims per head (<= head_dim)
  float rope_base = 10000.0f;
  float rope_linear_scale = 1.0f;  // positions are multiplied by this (1 / linear scaling factor)
  std::vector<float>
      rope_freq_factors;  // per rotated pair, divides the frequency (Llama 3 scaling); may be empty

  float attn_scale = 0;     // multiplies q·k (default 1/sqrt(head_dim))
  float attn_softcap = 0;   // 0: none; else scores = cap * tanh(scores / cap)
  float final_softcap = 0;  // 0: none; likewise for the output logits
  int64_t sliding_window =
      0;  // window of the layers marked sliding (a key is visible when pos - key_pos < window)
  std::vector<uint8_t> layer_sliding;  // [n_layer], 1 when the layer uses the sliding window

  float embed_scale = 1.0f;  // the token embedding is multiplied by this (gemma: sqrt(n_embd))
  bool post_norms = false;   // gemma2: RMSNorm after attention and after the FFN, before the residual add
  bool qk_norm = false;      // qwen3: RMSNorm over each q and k head before RoPE
  FfnActivation activation = FfnActivation::kSiLU;
  MoeConfig moe;
  MlaConfig mla;

  // [n_layer], 1 when the layer's FFN is a mixture of experts, for families whose files say so per layer by
  // the tensors present (jamba); empty: every layer from moe.n_leading_dense on is one.
  std::vector<uint8_t> layer_moe;

  // Layers whose FFN is a mixture of experts (the others use w_gate / w_up / w_down).
  bool moe_layer(int64_t layer) const {
    if (moe.n_expert == 0) return false;
    if (!layer_moe.empty()) return layer_moe[static_cast<size_t>(layer)] != 0;
    return layer >= moe.n_leading_dense;
  }

  // Encoders (bert): learned absolute positions and token types, every position attends to every position of
  // its sequence, LayerNorm (with bias) after each residual add, an FFN of GELU(x W_up + b) W_down + b, and
  // no output head: they produce embeddings only (model/encoder.h), never logits.
  bool encoder = false;
  Pooling pooling = Pooling::kNone;  // the checkpoint's own pooling; kNone: it names none

  // Recurrent layers (Mamba-1 selective state-space mixers) in place of attention and the FFN.
  std::vector<uint8_t> layer_recurrent;  // [n_layer], 1 when the layer is recurrent; empty: none is
  int64_t ssm_d_inner = 0;               // channels of the mixer
  int64_t ssm_d_state = 0;               // state size per channel
  int64_t ssm_d_conv = 0;                // causal convolution width
  int64_t ssm_dt_rank = 0;               // rank of the time-step projection

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
  int64_t v_dim() const { return n_head_kv * head_dim_v; }
  bool sliding(int64_t layer) const { return !layer_sliding.empty() && layer_sliding[layer] != 0; }
  // Bytes per token of an f16 cache of every head's expanded keys and values over the attention layers (what
  // a latent cache is measured against).
  size_t expanded_kv_bytes_per_token() const {
    int64_t layers = 0;
    for (int64_t l = 0; l < n_layer; ++l) layers += recurrent(l) ? 0 : 1;
    return static_cast<size_t>(layers * n_head_kv * (head_dim + head_dim_v) * 2);
  }
  bool recurrent(int64_t layer) const { return !layer_recurrent.empty() && layer_recurrent[layer] != 0; }
  // The keys and values (and recurrent states) a cache of this model holds. A model without attention layers
  // still names a head shape (one head of 32) that every KV type accepts; no block stores it. Latent
  // attention caches per token only the normed latent and the rotary key part: one KV head whose key is
  // [latent, rotary part] and whose value is the key's latent part, stored once (model/mla.h).
  // The cache of one MTP layer (the MTP drafter's own): the main layers' kind of entry, for one layer.
  cache::Geometry mtp_kv_geometry() const {
    cache::Geometry g = kv_geometry();
    g.n_layer = 1;
    g.layer_sliding.clear();
    g.layer_recurrent.clear();
    return g;
  }
  cache::Geometry kv_geometry() const {
    if (mla.kv_lora_rank > 0) {
      cache::Geometry g;
      g.n_layer = n_layer;
      g.n_head_kv = 1;
      g.head_dim = mla.kv_lora_rank + n_rot;
      g.head_dim_v = mla.kv_lora_rank;
      g.sliding_window = sliding_window;
      g.layer_sliding = layer_sliding;
      g.values_in_keys = true;
      return g;
    }
    const bool attention = n_head_kv > 0;
    return {n_layer,
            attention ? n_head_kv : 1,
            attention ? head_dim : 32,
            attention ? head_dim_v : 32,
            sliding_window,
            layer_sliding,
            layer_recurrent,
            ssm_d_inner,
            ssm_d_state,
            ssm_d_conv};
  }
};

}  // namespace tandem::model
