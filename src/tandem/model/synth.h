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

struct SynthPreset {
  std::string_view name;
  std::string_view arch;  // "llama", "qwen2", "bert", "nomic-bert", "mamba" or "jamba"
  int64_t n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx_train;
  float rope_base;
  bool tied_embeddings;  // no output.weight: the head reuses token_embd
  // mamba: the mixer's state size, convolution width and expansion (d_inner = expand * n_embd; the time-step
  // rank is ceil(n_embd / 16), as Mamba-1 sets it).
  int64_t ssm_d_state = 0, ssm_d_conv = 0, ssm_expand = 0;
  // jamba: layer i attends when i % attn_period == attn_offset (as Jamba's attn_layer_period and
  // attn_layer_offset); the other layers are Mamba layers. Every layer has a SwiGLU FFN of width n_ff.
  int64_t attn_period = 0, attn_offset = 0;
};

// tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b, qwen2.5-1.5b, bge-small (a bert encoder), nomic-embed-text (a
// nomic-bert encoder), mamba-1.4b, and small test shapes (a jamba hybrid among them).
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

// Writes a random-weight checkpoint. Rows are generated from (seed, tensor name, row), so the file does not
// depend on the thread count. Quantization runs on `pool`.
void write_synthetic_model(const SynthPreset& preset, const FileType& type, const std::string& path,
                           ThreadPool& pool, uint64_t seed = 1);

// Re-quantizes every matrix of a GGUF file (2-D tensors whose name ends in ".weight", norms excepted) to
// `type`, copying metadata and other tensors unchanged.
void quantize_model(const std::string& in_path, const std::string& out_path, const FileType& type,
                    ThreadPool& pool);

}  // namespace tandem::model
