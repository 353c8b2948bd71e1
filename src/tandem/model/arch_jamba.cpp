// jamba: a hybrid of attention layers and Mamba-1 layers in one stack (AI21's Jamba; the naming is the
// reference converter's). Which layers attend is data: `jamba.attention.head_count_kv` is an array with one
// entry per layer, 0 marking a Mamba layer (a single number means every layer attends). Every layer is
// RMSNorm, its mixer (attention without positional encoding, or the selective state-space mixer with
// RMSNorm-ed dt, B and C), the residual add, RMSNorm, its FFN and the residual add. The cache keeps keys and
// values for the attention layers and a recurrent state for the others (cache/kv_cache.h).
// A layer's FFN is a mixture of experts when the file holds its router (blk.N.ffn_gate_inp), as the reference
// converter writes every other layer of real checkpoints; else it is a dense SwiGLU. The experts run through
// the shared MoE code (model/moe.h): expert_count routed experts as wide as feed_forward_length (unless
// expert_feed_forward_length says otherwise), softmax over the router's logits, the top expert_used_count
// weighed by their probabilities as they are (renormalised to sum 1 only where expert_weights_norm says so),
// no shared expert.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tandem/model/arch.h"
#include "tandem/model/moe.h"
#include "tandem/util/error.h"

namespace tandem::model {

namespace {

constexpr int64_t kMaxHeads = int64_t{1} << 16;

// The per-layer KV head counts: the array form, or one number for every layer.
std::vector<int64_t> kv_heads_per_layer(const ArchReader& r, int64_t n_layer, int64_t n_head) {
  const std::string key = r.arch() + ".attention.head_count_kv";
  const gguf::Value* v = r.file().find(key);
  if (v == nullptr) throw Error("model file '" + r.file().path() + "' lacks required metadata '" + key + "'");
  std::vector<int64_t> heads;
  if (v->type == gguf::ValueType::ARRAY) {
    for (int32_t h : r.file().get_i32_array(key)) heads.push_back(h);
    if (static_cast<int64_t>(heads.size()) != n_layer)
      throw Error("metadata '" + key + "' holds " + std::to_string(heads.size()) +
                  " entries; it must hold one per layer (block_count " + std::to_string(n_layer) + ")");
  } else {
    heads.assign(static_cast<size_t>(n_layer), r.int_in("attention.head_count_kv", 1, n_head, std::nullopt));
  }
  int64_t attending = 0;
  for (size_t i = 0; i < heads.size(); ++i) {
    if (heads[i] == 0) continue;
    if (heads[i] < 0 || heads[i] > n_head || n_head % heads[i] != 0)
      throw Error("metadata '" + key + "' is " + std::to_string(heads[i]) + " for layer " +
                  std::to_string(i) + "; expected 0 (a Mamba layer) or a divisor of attention.head_count (" +
                  std::to_string(n_head) + ")");
    if (attending != 0 && heads[i] != attending)
      throw Error("metadata '" + key + "' mixes " + std::to_string(attending) + " and " +
                  std::to_string(heads[i]) + " KV heads; all attention layers must have the same number");
    attending = heads[i];
  }
  return heads;
}

// Which layers are mixtures of experts: those whose router tensor the file holds (never a layer pattern),
// with the MoE hyperparameters read when any is. A router without expert_count, or experts without a router,
// is refused naming what is missing.
void read_jamba_moe(const ArchReader& r, Config& c) {
  const int64_t experts = r.int_in("expert_count", 0, kMaxExperts, 0);
  c.layer_moe.assign(static_cast<size_t>(c.n_layer), 0);
  bool any = false;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool router = r.has_tensor(p + "ffn_gate_inp.weight");
    if (router && experts == 0)
      throw Error("tensor '" + p + "ffn_gate_inp.weight' is a mixture-of-experts router, but metadata '" +
                  r.arch() + ".expert_count' is " + (r.has("expert_count") ? "0" : "absent") +
                  "; the file is inconsistent (re-convert it)");
    if (!router && r.has_tensor(p + "ffn_gate_exps.weight"))
      throw Error("layer " + std::to_string(i) + " holds experts ('" + p +
                  "ffn_gate_exps.weight') but no router ('" + p +
                  "ffn_gate_inp.weight'); the file is incomplete");
    c.layer_moe[static_cast<size_t>(i)] = router ? 1 : 0;
    any = any || router;
  }
  if (!any) {  // expert_count without any router: a dense model
    c.layer_moe.clear();
    return;
  }
  read_moe_hparams(r, c, c.n_ff);
}

}  // namespace

void load_jamba(const ArchReader& r, Config& c, Weights& w) {
  read_embedding_and_blocks(r, c);
  check_layer_count(r, c);
  c.n_ctx_train = r.int_in("context_length", 1, std::numeric_limits<int32_t>::max(), 2048);
  c.norm_eps = r.positive_float("attention.layer_norm_rms_epsilon", 1e-6f);
  c.n_ff = r.int_in("feed_forward_length", 1, std::numeric_limits<int32_t>::max(), std::nullopt);
  read_jamba_moe(r, c);
  c.n_head = r.int_in("attention.head_count", 1, kMaxHeads, std::nullopt);
  if (c.n_embd % c.n_head != 0)
    throw Error("metadata '" + r.arch() + ".embedding_length' (" + std::to_string(c.n_embd) +
                ") must be a multiple of attention.head_count (" + std::to_string(c.n_head) + ")");
  const std::vector<int64_t> kv_heads = kv_heads_per_layer(r, c.n_layer, c.n_head);
  c.n_head_kv = *std::max_element(kv_heads.begin(), kv_heads.end());
  c.head_dim = c.head_dim_v = c.n_embd / c.n_head;
  c.n_rot = 0;  // no positional encoding: the Mamba layers carry order
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.layer_recurrent.resize(static_cast<size_t>(c.n_layer));
  bool any_recurrent = false;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    c.layer_recurrent[static_cast<size_t>(i)] = kv_heads[static_cast<size_t>(i)] == 0 ? 1 : 0;
    any_recurrent = any_recurrent || kv_heads[static_cast<size_t>(i)] == 0;
  }
  if (any_recurrent) {
    read_ssm_config(r, c);
  } else {
    c.layer_recurrent.clear();
  }

  w.tok_embd = r.matrix("token_embd.weight", c.n_embd, c.n_vocab);
  w.output_norm = r.vector("output_norm.weight", c.n_embd);
  w.output = r.matrix("output.weight", c.n_embd, c.n_vocab, /*required=*/false);
  if (w.output.empty()) w.output = w.tok_embd;  // tied head
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.attn_norm = r.vector(p + "attn_norm.weight", c.n_embd);
    if (c.recurrent(i)) {
      bind_ssm_mixer(r, c, i, /*dt_b_c_norms=*/true, l);
    } else {
      l.wq = r.matrix(p + "attn_q.weight", c.n_embd, c.q_dim());
      l.wk = r.matrix(p + "attn_k.weight", c.n_embd, c.kv_dim());
      l.wv = r.matrix(p + "attn_v.weight", c.n_embd, c.v_dim());
      l.wo = r.matrix(p + "attn_output.weight", c.n_head * c.head_dim_v, c.n_embd);
    }
    l.ffn_norm = r.vector(p + "ffn_norm.weight", c.n_embd);
    if (c.moe_layer(i)) {
      bind_moe_layer(r, c, i, l.moe);
    } else {
      l.w_gate = r.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
      l.w_up = r.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
      l.w_down = r.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
    }
  }
}

}  // namespace tandem::model
