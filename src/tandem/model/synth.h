// Random-weight checkpoints of real model shapes (for benchmarks and tests), and re-quantization of GGUF
// files, written with Tandem's own GGUF writer and reference quantizers. The vocabulary is generated
// (SentencePiece-style "llama" tokenizer metadata: tokens, scores, token types), so the files load in any
// GGUF reader.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/tensor/dtype.h"
#include "tandem/util/thread_pool.h"

namespace tandem::model {

// Mixture-of-experts shapes (qwen2moe, deepseek2, jamba); zero for dense models.
struct SynthMoe {
  int64_t n_expert = 0, n_expert_used = 0;
  int64_t n_ff_expert = 0;      // jamba: the experts are n_ff wide (its files give no other width)
  int64_t n_ff_shared = 0;      // qwen2moe: the sigmoid-gated shared expert's width
  int64_t n_shared = 0;         // deepseek2: shared experts, together n_shared * n_ff_expert wide
  int64_t n_leading_dense = 0;  // deepseek2: dense layers (n_ff wide) before the MoE layers
  // Routing skew, as trained routers have: the router row of the expert of popularity rank k (a permutation
  // per layer) is scaled by (1 + k)^-router_zipf, so wide-spread logits win the top-k more often (0.5 puts
  // about 83% of a top-6-of-64 selection on the 32 most popular experts, for isotropic inputs).
  float router_zipf = 0.5f;
  // deepseek2: DeepSeek-V3 routing (sigmoid scores, a per-expert selection bias exp_probs_b, normalised
  // top-k weights, routed scale 2.5) instead of V2's (softmax, weights as they are).
  bool v3_routing = false;
};

// Latent attention shapes (deepseek2): q LoRA rank (0: a full attn_q), KV latent rank, key and value width
// per head, the rotary part of the key, and YaRN scaling (factor 0: none).
struct SynthMla {
  int64_t q_lora_rank = 0, kv_lora_rank = 0, key_length = 0, value_length = 0, n_rot = 0;
  float yarn_factor = 0.0f;
  int64_t yarn_original_context = 0;
  float yarn_log_multiplier = 0.0f;
  // The up-projection split per head (attn_k_b and attn_v_b, as recent converters write it) instead of
  // attn_kv_b; the same values either way.
  bool split_kv_b = false;
};

struct SynthPreset {
  std::string_view name;
  std::string_view
      arch;  // "llama", "qwen2", "bert", "nomic-bert", "mamba", "jamba", "qwen2moe" or "deepseek2"
  int64_t n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx_train;
  float rope_base;
  bool tied_embeddings;  // no output.weight: the head reuses token_embd
  // mamba: the mixer's state size, convolution width and expansion (d_inner = expand * n_embd; the time-step
  // rank is ceil(n_embd / 16), as Mamba-1 sets it).
  int64_t ssm_d_state = 0, ssm_d_conv = 0, ssm_expand = 0;
  SynthMoe moe = {};
  SynthMla mla = {};
  // jamba: layer i attends when i % attn_period == attn_offset (as Jamba's attn_layer_period and
  // attn_layer_offset); the other layers are Mamba layers. Every layer has a SwiGLU FFN of width n_ff: with
  // experts (moe.n_expert > 0), layer i's is a mixture of n_expert experts of width n_ff when
  // i % expert_period == expert_offset (Jamba's expert_layer_period and expert_layer_offset), a dense one
  // otherwise.
  int64_t attn_period = 0, attn_offset = 0;
  int64_t expert_period = 0, expert_offset = 0;
  // deepseek2: next-token-prediction (MTP) layers after the n_layer main ones (nextn_predict_layers; each
  // an ordinary block plus its nextn.enorm, nextn.hnorm, nextn.eh_proj and nextn.shared_head_norm, sharing
  // the main embedding and head). block_count counts them.
  int64_t n_mtp = 0;
};

// tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b, qwen2.5-1.5b, bge-small (a bert encoder), nomic-embed-text (a
// nomic-bert encoder), mamba-1.4b, qwen1.5-moe-a2.7b, deepseek-v2-lite, and small test shapes (jamba hybrids,
// dense and with experts, and a DeepSeek-V3-style deepseek2 with one MTP layer among them).
const std::vector<SynthPreset>& synth_presets();
// Throws tandem::Error listing the known names.
const SynthPreset& find_synth_preset(std::string_view name);

// A file type: the type of most matrices plus the rules that pick others, as the reference's quantize tool
// does (the head in Q6_K for quantized types, attn_v and ffn_down in Q6_K on a subset of layers for the _M
// mixes, and a 32-element type for matrices whose rows are not whole 256-element super-blocks).
struct FileType {
  std::string_view name;  // "Q4_0", "Q4_K_M", ...
  DType base;
  bool mix_m;  // the _M mix
};
const std::vector<FileType>& file_types();
const FileType& find_file_type(std::string_view name);
// The type a matrix named `tensor` ([rows, cols], layer `layer` of `n_layer`, or -1) gets in file type `ft`.
DType matrix_type(const FileType& ft, std::string_view tensor, int64_t cols, int64_t layer, int64_t n_layer);

// `preset` with n_mtp MTP layers (SynthPreset::n_mtp); throws tandem::Error for a negative count or an
// architecture other than deepseek2.
SynthPreset with_mtp_layers(const SynthPreset& preset, int64_t n_mtp);

// `preset` with its up-projection split per head (SynthMla::split_kv_b); throws tandem::Error for an
// architecture other than deepseek2.
SynthPreset with_split_kv_b(const SynthPreset& preset);

// Writes a random-weight checkpoint. Rows are generated from (seed, tensor name, row), so the file does not
// depend on the thread count. Quantization runs on `pool`.
void write_synthetic_model(const SynthPreset& preset, const FileType& type, const std::string& path,
                           ThreadPool& pool, uint64_t seed = 1);

// Re-quantizes every matrix of a GGUF file (2-D tensors whose name ends in ".weight", norms excepted) to
// `type`, copying metadata and other tensors unchanged.
void quantize_model(const std::string& in_path, const std::string& out_path, const FileType& type,
                    ThreadPool& pool);

}  // namespace tandem::model
