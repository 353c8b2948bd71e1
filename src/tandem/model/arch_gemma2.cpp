// gemma2: sliding-window attention on alternating layers (even layers slide), attention and final logit
// soft-capping, GELU (tanh) gated FFN, RMSNorm after attention and after the FFN, embeddings scaled by
// sqrt(n_embd), tied output head, NeoX RoPE. The norm weights in GGUF already include gemma's "+1".
#include <cmath>
#include <cstdint>
#include <limits>

#include "tandem/model/arch.h"

namespace tandem::model {

void load_gemma2(const ArchReader& r, Config& c, Weights& w) {
  c.post_norms = true;
  read_common_hparams(r, c);
  c.rope_layout = RopeLayout::kNeoX;
  c.activation = FfnActivation::kGeluTanh;
  c.embed_scale = std::sqrt(static_cast<float>(c.n_embd));
  // Config reads a cap of 0 as "no capping"; a file states caps, so 0 (like NaN or a negative) is an error.
  c.attn_softcap = r.positive_float("attn_logit_softcapping", 50.0f);
  c.final_softcap = r.positive_float("final_logit_softcapping", 30.0f);
  c.sliding_window = r.int_in("attention.sliding_window", 1, std::numeric_limits<int32_t>::max(), 4096);
  c.layer_sliding.assign(static_cast<size_t>(c.n_layer), 0);
  for (int64_t i = 0; i < c.n_layer; i += 2) c.layer_sliding[static_cast<size_t>(i)] = 1;
  // Gemma 2 scales queries by 1/sqrt(head_dim), except the 27B model (46 layers), which uses n_embd / n_head.
  const float query_width =
      c.n_layer == 46 ? static_cast<float>(c.n_embd / c.n_head) : static_cast<float>(c.head_dim);
  c.attn_scale = 1.0f / std::sqrt(query_width);
  bind_standard_layers(r, c, w);
}

}  // namespace tandem::model
