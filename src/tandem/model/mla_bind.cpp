// Reading a latent-attention layer's tensor views from GGUF (mla.h). Apart from the computation in
// mla.cpp, so that loading alone (the fuzzer's target) links without the kernels.
#include <string>

#include "tandem/model/mla.h"

namespace tandem::model {

void bind_mla_layer(const ArchReader& r, const Config& c, int64_t layer, MlaWeights& w) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  const int64_t q_width = c.n_head * c.head_dim;
  if (c.mla.q_lora_rank > 0) {
    w.wq_a = r.matrix(p + "attn_q_a.weight", c.n_embd, c.mla.q_lora_rank);
    w.q_a_norm = r.vector(p + "attn_q_a_norm.weight", c.mla.q_lora_rank);
    w.wq_b = r.matrix(p + "attn_q_b.weight", c.mla.q_lora_rank, q_width);
  } else {
    w.wq = r.matrix(p + "attn_q.weight", c.n_embd, q_width);
  }
  w.wkv_a = r.matrix(p + "attn_kv_a_mqa.weight", c.n_embd, c.mla.kv_lora_rank + c.n_rot);
  w.kv_a_norm = r.vector(p + "attn_kv_a_norm.weight", c.mla.kv_lora_rank);
  w.wkv_b =
      r.matrix(p + "attn_kv_b.weight", c.mla.kv_lora_rank, c.n_head * (c.head_dim - c.n_rot + c.head_dim_v));
}

}  // namespace tandem::model
