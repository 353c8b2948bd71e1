// qwen2: Qwen2 / Qwen2.5. Like llama but with q/k/v biases and RoPE in the NeoX (split-half) layout.
#include "tandem/model/arch.h"

#include "tandem/util/error.h"

namespace tandem::model {

void load_qwen2(const ArchReader& r, Config& c, Weights& w) {
  read_common_hparams(r, c);
  c.rope_layout = RopeLayout::kNeoX;
  bind_standard_layers(r, c, w);
  for (const LayerWeights& l : w.layers)
    if (l.bq.empty() || l.bk.empty() || l.bv.empty())
      throw Error("qwen2 model lacks the q/k/v bias tensors (attn_q.bias, attn_k.bias, attn_v.bias)");
}

}  // namespace tandem::model
