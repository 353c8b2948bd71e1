// llama: Llama 2/3/3.x, TinyLlama, Mistral-style checkpoints. RoPE in the normal (interleaved-pair) layout,
// SwiGLU FFN, optional Llama 3 rope scaling, tied head when output.weight is absent.
#include "tandem/model/arch.h"

namespace tandem::model {

void load_llama(const ArchReader& r, Config& c, Weights& w) {
  read_common_hparams(r, c);
  c.rope_layout = RopeLayout::kNormal;
  bind_standard_layers(r, c, w);
}

}  // namespace tandem::model
