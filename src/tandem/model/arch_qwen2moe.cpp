// qwen2moe: Qwen1.5-MoE / Qwen2-MoE. Qwen2 attention (q/k/v biases, NeoX RoPE); every layer's FFN is a
// mixture of experts: a softmax router picks the top-k routed experts, weighted by their (unnormalised)
// probabilities, plus one shared expert scaled by sigmoid(x · ffn_gate_inp_shexp).
// qwen3moe: Qwen3-MoE. Qwen3 attention (RMSNorm over each q and k head, no biases, key_length heads); top-k
// weights normalised to sum 1; no shared expert.
#include "tandem/model/arch.h"
#include "tandem/model/moe.h"
#include "tandem/util/error.h"

namespace tandem::model {
namespace {

void bind_moe_layers(const ArchReader& r, Config& c, Weights& w) {
  bind_standard_layers(r, c, w);
  for (int64_t i = 0; i < c.n_layer; ++i) bind_moe_layer(r, c, i, w.layers[static_cast<size_t>(i)].moe);
}

}  // namespace

void load_qwen2moe(const ArchReader& r, Config& c, Weights& w) {
  read_common_hparams(r, c);
  c.rope_layout = RopeLayout::kNeoX;
  read_moe_hparams(r, c);
  // The shared expert is there when its tensors are; its width is in the metadata or, failing that, the
  // tensor's shape.
  if (const gguf::TensorInfo* t = r.file().tensor("blk.0.ffn_gate_shexp.weight")) {
    c.moe.n_ff_shared = r.int_in("expert_shared_feed_forward_length", 1, int64_t{1} << 30, t->ne[1]);
    c.moe.shared_gate = true;
  }
  bind_moe_layers(r, c, w);
  for (const LayerWeights& l : w.layers)
    if (l.bq.empty() || l.bk.empty() || l.bv.empty())
      throw Error("qwen2moe model lacks the q/k/v bias tensors (attn_q.bias, attn_k.bias, attn_v.bias)");
}

void load_qwen3moe(const ArchReader& r, Config& c, Weights& w) {
  c.qk_norm = true;
  c.moe.norm_top_k = true;  // Qwen3-MoE's norm_topk_prob; expert_weights_norm, when present, decides
  read_common_hparams(r, c);
  c.rope_layout = RopeLayout::kNeoX;
  read_moe_hparams(r, c);
  bind_moe_layers(r, c, w);
}

}  // namespace tandem::model
