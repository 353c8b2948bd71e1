// deepseek2: DeepSeek-V2 / V2-Lite / V3 style checkpoints. Multi-head latent attention (model/mla.h) with
// an optional q LoRA (decided from the tensors present), rotary key parts in the normal layout and YaRN
// scaling with its log multiplier on the attention scale; `leading_dense_block_count` dense layers, then
// mixture-of-experts layers (model/moe.h) with routed and shared experts. V3 routing is data: sigmoid scores
// (expert_gating_func 2), a per-expert selection bias (exp_probs_b), normalised top-k weights, a routed
// scale and group-limited selection where the metadata asks for them.
//
// Next-token-prediction layers (nextn_predict_layers = N, V3): block_count counts them, the last N blocks
// are they, and the main forward runs only the first block_count - N. Each holds an ordinary block plus its
// nextn.* tensors (model/weights.h, MtpWeights).
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "tandem/model/arch.h"
#include "tandem/model/mla.h"
#include "tandem/model/moe.h"
#include "tandem/util/error.h"

namespace tandem::model {
namespace {

constexpr int64_t kMaxHeads = int64_t{1} << 16;
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxContext = std::numeric_limits<int32_t>::max();

// YaRN as the reference computes it: per rotary pair i, the angle is interpolated by `scale` (1 / factor)
// for low frequencies and kept for high ones, with a linear ramp between the pairs whose wavelengths fit
// beta_fast and beta_slow rotations in the original context. The factors divide each pair's frequency.
void read_yarn(const ArchReader& r, Config& c, float factor) {
  const double scale = 1.0 / factor;
  const auto n_ctx_orig =
      static_cast<double>(r.int_in("rope.scaling.original_context_length", 1, kMaxContext, std::nullopt));
  const double beta_fast = r.positive_float("rope.scaling.yarn_beta_fast", 32.0f);
  const double beta_slow = r.positive_float("rope.scaling.yarn_beta_slow", 1.0f);
  const double n_dims = static_cast<double>(c.n_rot), base = c.rope_base;
  const auto corr_dim = [&](double rotations) {
    return n_dims * std::log(n_ctx_orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr_dim(beta_fast)));
  const double high = std::min(n_dims - 1, std::ceil(corr_dim(beta_slow)));
  c.rope_freq_factors.resize(static_cast<size_t>(c.n_rot / 2));
  for (int64_t i = 0; i < c.n_rot / 2; ++i) {
    const double y = (static_cast<double>(i) - low) / std::max(0.001, high - low);
    const double ramp = 1 - std::clamp(y, 0.0, 1.0);  // 1: extrapolate (keep), 0: interpolate
    c.rope_freq_factors[static_cast<size_t>(i)] = static_cast<float>(1.0 / (scale * (1 - ramp) + ramp));
  }
}

void read_deepseek2_hparams(const ArchReader& r, Config& c) {
  c.arch = r.arch();
  const gguf::TensorInfo* embd = r.file().tensor("token_embd.weight");
  if (!embd) throw Error("model file '" + r.file().path() + "' lacks tensor 'token_embd.weight'");
  c.n_embd = r.int_in("embedding_length", 1, kMaxWidth, std::nullopt);
  if (c.n_embd != embd->ne[0])
    throw Error("metadata '" + r.arch() + ".embedding_length' is " + std::to_string(c.n_embd) +
                ", but tensor 'token_embd.weight' has shape " + embd->shape_string());
  c.n_vocab = embd->ne[1];
  const auto n_tensors = static_cast<int64_t>(r.file().tensors().size());
  const int64_t blocks = r.int_in("block_count", 1, std::max<int64_t>(1, n_tensors), std::nullopt);
  c.n_mtp = r.int_in("nextn_predict_layers", 0, blocks - 1, 0);
  c.n_layer = blocks - c.n_mtp;
  c.n_head = r.int_in("attention.head_count", 1, kMaxHeads, std::nullopt);
  // Latent attention expands one key and value per query head; a head_count_kv in the file describes the
  // latent's single "head" and is not used.
  c.n_head_kv = c.n_head;
  c.head_dim = r.int_in("attention.key_length", 1, kMaxWidth, std::nullopt);
  c.head_dim_v = r.int_in("attention.value_length", 1, kMaxWidth, std::nullopt);
  c.n_ff = r.int_in("feed_forward_length", 1, kMaxWidth, std::nullopt);
  c.n_ctx_train = r.int_in("context_length", 1, kMaxContext, 4096);
  c.norm_eps = r.positive_float("attention.layer_norm_rms_epsilon", 1e-6f);
  c.n_rot = r.int_in("rope.dimension_count", 2, c.head_dim, std::nullopt);
  if (c.n_rot % 2 != 0 || c.n_rot >= c.head_dim)
    throw Error("metadata '" + r.arch() + ".rope.dimension_count' is " + std::to_string(c.n_rot) +
                "; it must be even and less than attention.key_length (" + std::to_string(c.head_dim) + ")");
  c.rope_base = r.positive_float("rope.freq_base", 10000.0f);
  c.rope_layout = RopeLayout::kNormal;
  c.mla.kv_lora_rank = r.int_in("attention.kv_lora_rank", 1, kMaxWidth, std::nullopt);
  // The q LoRA is there when its tensors are (not decided from the layer count).
  if (r.has_tensor("blk.0.attn_q_a.weight"))
    c.mla.q_lora_rank = r.int_in("attention.q_lora_rank", 1, kMaxWidth, std::nullopt);

  const std::string type(r.file().get_string(r.arch() + ".rope.scaling.type").value_or("none"));
  float mscale = r.positive_float("rope.scaling.attn_factor", 1.0f);
  if (type == "yarn") {
    const float factor = r.positive_float("rope.scaling.factor", 1.0f);
    read_yarn(r, c, factor);
    // The reference's YaRN magnitude correction cancels in its rotary embedding and is applied to the
    // attention scale instead, through the log multiplier.
    mscale *= 1.0f + r.opt_float("rope.scaling.yarn_log_multiplier", 0.0f) * std::log(factor);
  } else if (type != "none") {
    throw Error("metadata '" + r.arch() + ".rope.scaling.type' is '" + type +
                "'; deepseek2 supports 'yarn' or none");
  }
  c.attn_scale = mscale * mscale / std::sqrt(static_cast<float>(c.head_dim));

  read_moe_hparams(r, c);
  c.moe.n_leading_dense = r.int_in("leading_dense_block_count", 0, c.n_layer, 0);
  const int64_t n_shared = r.int_in("expert_shared_count", 0, 1 << 10, 0);
  c.moe.n_ff_shared = n_shared * c.moe.n_ff_expert;
  if (c.moe.n_leading_dense < c.n_layer)
    c.moe.selection_bias = r.has_tensor("blk." + std::to_string(c.moe.n_leading_dense) + ".exp_probs_b.bias");
}

// Binds blk.i's decoder block (the main layers' and an MTP layer's alike).
void bind_block(const ArchReader& r, const Config& c, int64_t i, LayerWeights& l) {
  const std::string p = "blk." + std::to_string(i) + ".";
  l.attn_norm = r.vector(p + "attn_norm.weight", c.n_embd);
  bind_mla_layer(r, c, i, l.mla);
  l.wo = r.matrix(p + "attn_output.weight", c.n_head * c.head_dim_v, c.n_embd);
  l.ffn_norm = r.vector(p + "ffn_norm.weight", c.n_embd);
  if (c.moe_layer(i)) {
    bind_moe_layer(r, c, i, l.moe);
  } else {
    l.w_gate = r.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    l.w_up = r.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
    l.w_down = r.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
  }
}

}  // namespace

void load_deepseek2(const ArchReader& r, Config& c, Weights& w) {
  read_deepseek2_hparams(r, c);
  w.tok_embd = r.matrix("token_embd.weight", c.n_embd, c.n_vocab);
  w.output_norm = r.vector("output_norm.weight", c.n_embd);
  w.output = r.matrix("output.weight", c.n_embd, c.n_vocab, /*required=*/false);
  if (w.output.empty()) w.output = w.tok_embd;
  w.layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) bind_block(r, c, i, w.layers[static_cast<size_t>(i)]);
  w.mtp.resize(static_cast<size_t>(c.n_mtp));
  for (int64_t k = 0; k < c.n_mtp; ++k) {
    const int64_t i = c.n_layer + k;
    const std::string p = "blk." + std::to_string(i) + ".nextn.";
    MtpWeights& m = w.mtp[static_cast<size_t>(k)];
    bind_block(r, c, i, m.block);
    m.enorm = r.vector(p + "enorm.weight", c.n_embd);
    m.hnorm = r.vector(p + "hnorm.weight", c.n_embd);
    m.eh_proj = r.matrix(p + "eh_proj.weight", 2 * c.n_embd, c.n_embd);
    m.embed = r.matrix(p + "embed_tokens.weight", c.n_embd, c.n_vocab, /*required=*/false);
    m.head_norm = r.vector(p + "shared_head_norm.weight", c.n_embd, /*required=*/false);
    m.head = r.matrix(p + "shared_head_head.weight", c.n_embd, c.n_vocab, /*required=*/false);
  }
}

}  // namespace tandem::model
