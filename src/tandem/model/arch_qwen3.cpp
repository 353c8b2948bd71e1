// qwen3: Qwen3 dense models. NeoX RoPE, no biases, RMSNorm over each query and key head before RoPE, and a
// head size given by attention.key_length (not necessarily n_embd / n_head).
#include "tandem/model/arch.h"

namespace tandem::model {

void load_qwen3(const ArchReader& r, Config& c, Weights& w) {
  c.qk_norm = true;
  read_common_hparams(r, c);
  c.rope_layout = RopeLayout::kNeoX;
  bind_standard_layers(r, c, w);
}

}  // namespace tandem::model
