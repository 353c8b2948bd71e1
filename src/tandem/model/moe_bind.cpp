// Reading a mixture-of-experts layer from GGUF: hyper-parameters and tensor views (moe.h). Apart from the
// computation in moe.cpp, so that loading alone (the fuzzer's target) links without the kernels.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "tandem/model/moe.h"
#include "tandem/util/error.h"

namespace tandem::model {

void read_moe_hparams(const ArchReader& r, Config& c, std::optional<int64_t> n_ff_expert_fallback) {
  MoeConfig& m = c.moe;
  m.n_expert = r.int_in("expert_count", 1, kMaxExperts, std::nullopt);
  m.n_expert_used = r.int_in("expert_used_count", 1, m.n_expert, std::nullopt);
  m.n_ff_expert =
      r.int_in("expert_feed_forward_length", 1, std::numeric_limits<int32_t>::max(), n_ff_expert_fallback);
  const int64_t gating = r.int_in("expert_gating_func", 1, 2, 1);
  m.gating = gating == 2 ? ExpertGating::kSigmoid : ExpertGating::kSoftmax;
  const std::string norm_key = r.arch() + ".expert_weights_norm";
  if (r.file().find(norm_key)) {
    const std::optional<bool> norm = r.file().get_bool(norm_key);
    if (!norm) throw Error("metadata '" + norm_key + "' must be a bool");
    m.norm_top_k = *norm;
  }
  m.weights_scale = r.positive_float("expert_weights_scale", 1.0f);
  m.n_group = r.int_in("expert_group_count", 1, m.n_expert, 1);
  m.n_group_used = r.int_in("expert_group_used_count", 1, m.n_group, m.n_group);
  if (m.n_expert % m.n_group != 0)
    throw Error("metadata '" + r.arch() + ".expert_count' (" + std::to_string(m.n_expert) +
                ") must be a multiple of expert_group_count (" + std::to_string(m.n_group) + ")");
  if (m.n_group > 1 && m.n_expert_used > m.n_group_used * (m.n_expert / m.n_group))
    throw Error("metadata '" + r.arch() + ".expert_used_count' (" + std::to_string(m.n_expert_used) +
                ") exceeds the experts of the expert_group_used_count groups it may choose from");
}

void bind_moe_layer(const ArchReader& r, const Config& c, int64_t layer, MoeWeights& w) {
  const MoeConfig& m = c.moe;
  const std::string p = "blk." + std::to_string(layer) + ".";
  w.router = r.matrix(p + "ffn_gate_inp.weight", c.n_embd, m.n_expert);
  w.selection_bias = r.vector(p + "exp_probs_b.bias", m.n_expert, m.selection_bias);
  w.gate = r.matrices(p + "ffn_gate_exps.weight", c.n_embd, m.n_ff_expert, m.n_expert);
  w.up = r.matrices(p + "ffn_up_exps.weight", c.n_embd, m.n_ff_expert, m.n_expert);
  w.down = r.matrices(p + "ffn_down_exps.weight", m.n_ff_expert, c.n_embd, m.n_expert);
  if (m.n_ff_shared > 0) {
    w.shared_gate_inp = r.vector(p + "ffn_gate_inp_shexp.weight", c.n_embd, m.shared_gate);
    w.shared_gate = r.matrix(p + "ffn_gate_shexp.weight", c.n_embd, m.n_ff_shared);
    w.shared_up = r.matrix(p + "ffn_up_shexp.weight", c.n_embd, m.n_ff_shared);
    w.shared_down = r.matrix(p + "ffn_down_shexp.weight", m.n_ff_shared, c.n_embd);
  }
}

ExpertBytes expert_bytes(const Model& model) {
  ExpertBytes b;
  const auto used = static_cast<size_t>(model.config().moe.n_expert_used);
  for (const LayerWeights& l : model.weights().layers) {
    if (l.moe.empty()) continue;
    ++b.moe_layers;
    for (size_t e = 0; e < l.moe.gate.size(); ++e) {
      const size_t one = l.moe.gate[e].bytes() + l.moe.up[e].bytes() + l.moe.down[e].bytes();
      b.per_expert = std::max(b.per_expert, one);
      b.routed_all += one;
    }
    b.routed_chosen += used * (l.moe.gate[0].bytes() + l.moe.up[0].bytes() + l.moe.down[0].bytes());
    b.shared += l.moe.router.bytes() + l.moe.shared_gate.bytes() + l.moe.shared_up.bytes() +
                l.moe.shared_down.bytes() + static_cast<size_t>(l.moe.shared_gate_inp.size) * sizeof(float);
  }
  return b;
}

}  // namespace tandem::model
