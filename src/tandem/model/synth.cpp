#include "tandem/model/synth.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>

#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"

namespace tandem::model {
namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Produces row `row` ([cols] floats) of a tensor.
using RowGen = std::function<void(int64_t row, float* out)>;

// Streams rows [0, rows) of `cols` elements converted to `type`, produced in parallel chunks of about 4 MiB.
void emit_rows(ThreadPool& pool, DType type, int64_t rows, int64_t cols, const RowGen& gen,
               const gguf::ByteSink& sink) {
  const size_t rb = row_bytes(type, cols);
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>((size_t{4} << 20) / rb));
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(chunk, rows)) * rb);
  std::vector<float> tmp(static_cast<size_t>(pool.size() * cols));
  for (int64_t c0 = 0; c0 < rows; c0 += chunk) {
    const int64_t n = std::min(chunk, rows - c0);
    pool.parallel_for(n, 1, [&](int64_t a, int64_t b, int t) {
      float* f = tmp.data() + static_cast<size_t>(t) * static_cast<size_t>(cols);
      for (int64_t r = a; r < b; ++r) {
        gen(c0 + r, f);
        quantize_row(type, f, buf.data() + static_cast<size_t>(r) * rb, cols);
      }
    });
    sink(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n) * rb));
  }
}

RowGen uniform_rows(uint64_t seed, std::string_view name, int64_t cols, float scale, float offset = 0.0f) {
  const uint64_t base = seed * 0x2545F4914F6CDD1Dull ^ hash_name(name);
  return [=](int64_t row, float* out) {
    uint64_t state = base + static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < cols; ++i) {
      const double u = static_cast<double>(splitmix(state) >> 11) * (1.0 / 9007199254740992.0);
      out[i] = offset + scale * static_cast<float>(2.0 * u - 1.0);
    }
  };
}

bool use_more_bits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

uint32_t llama_ftype(std::string_view name) {
  static const std::pair<std::string_view, uint32_t> ids[] = {
      {"F32", 0},     {"F16", 1},     {"Q4_0", 2},    {"Q4_1", 3},    {"Q8_0", 7},
      {"Q5_0", 8},    {"Q5_1", 9},    {"Q2_K", 10},   {"Q3_K_M", 12}, {"Q4_K_S", 14},
      {"Q4_K_M", 15}, {"Q5_K_S", 16}, {"Q5_K_M", 17}, {"Q6_K", 18},   {"BF16", 32}};
  for (const auto& [n, id] : ids)
    if (n == name) return id;
  return 0;
}

// The generated vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then distinct letter strings, every other
// one with the SentencePiece word-start marker.
void add_vocabulary(gguf::Writer& w, int64_t n_vocab) {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  tokens.reserve(static_cast<size_t>(n_vocab));
  auto add = [&](std::string t, int32_t type) {
    scores.push_back(-static_cast<float>(tokens.size()));
    tokens.push_back(std::move(t));
    types.push_back(type);
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (int b = 0; b < 256 && static_cast<int64_t>(tokens.size()) < n_vocab; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    add(name, 6);
  }
  for (int64_t i = 0; static_cast<int64_t>(tokens.size()) < n_vocab; ++i) {
    std::string word;
    for (int64_t v = i;; v = v / 26 - 1) {
      word.insert(word.begin(), static_cast<char>('a' + v % 26));
      if (v < 26) break;
    }
    add(i % 2 == 0 ? "\xE2\x96\x81" + word : word, 1);
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
  w.add_array("tokenizer.ggml.scores", std::span<const float>(scores));
  w.add_array("tokenizer.ggml.token_type", std::span<const int32_t>(types));
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
}

// DeepSeek-V3 style at test size: a q LoRA, V3 routing over 8 experts (top 2) and one shared expert, one
// dense layer then two MoE layers, and one MTP layer after them.
SynthPreset tiny_deepseek_v3() {
  SynthPreset p{};
  p.name = "tiny-deepseek-v3-d64";
  p.arch = "deepseek2";
  p.n_embd = 64;
  p.n_ff = 128;
  p.n_layer = 3;
  p.n_head = 4;
  p.n_head_kv = 4;
  p.n_vocab = 384;
  p.n_ctx_train = 4096;
  p.rope_base = 10000.0f;
  p.tied_embeddings = false;
  p.moe.n_expert = 8;
  p.moe.n_expert_used = 2;
  p.moe.n_ff_expert = 32;
  p.moe.n_shared = 1;
  p.moe.n_leading_dense = 1;
  p.moe.v3_routing = true;
  p.mla.q_lora_rank = 32;
  p.mla.kv_lora_rank = 32;
  p.mla.key_length = 48;
  p.mla.value_length = 32;
  p.mla.n_rot = 16;
  p.n_mtp = 1;
  return p;
}

}  // namespace

const std::vector<SynthPreset>& synth_presets() {
  static const std::vector<SynthPreset> presets = {
      {"tinyllama-1.1b", "llama", 2048, 5632, 22, 32, 4, 32000, 2048, 10000.0f, false},
      {"llama-3.2-1b", "llama", 2048, 8192, 16, 32, 8, 128256, 131072, 500000.0f, true},
      {"qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 151936, 32768, 1000000.0f, true},
      {"qwen2.5-1.5b", "qwen2", 1536, 8960, 28, 12, 2, 151936, 32768, 1000000.0f, true},
      {"tiny-llama-d256", "llama", 256, 768, 2, 4, 2, 512, 512, 10000.0f, false},
      {"tiny-llama-d512", "llama", 512, 1536, 2, 8, 2, 512, 512, 10000.0f, false},
      {"tiny-qwen2-d64", "qwen2", 64, 160, 2, 4, 2, 384, 512, 10000.0f, true},
      {"bge-small", "bert", 384, 1536, 12, 12, 12, 30522, 512, 10000.0f, true},
      {"nomic-embed-text", "nomic-bert", 768, 3072, 12, 12, 12, 30522, 2048, 1000.0f, true},
      {"tiny-nomic-bert-d64", "nomic-bert", 64, 128, 2, 4, 4, 384, 128, 1000.0f, true},
      {"mamba-1.4b", "mamba", 2048, 0, 48, 0, 0, 50280, 2048, 0.0f, true, 16, 4, 2},
      {"tiny-mamba-d64", "mamba", 64, 0, 2, 0, 0, 384, 512, 0.0f, true, 16, 4, 2},
      // Qwen1.5-MoE-A2.7B: 60 routed experts (top 4, softmax, weights not normalised) of width 1408 and a
      // shared expert of 5632 in every layer.
      {"qwen1.5-moe-a2.7b", "qwen2moe", 2048, 5632, 24, 16, 16, 151936, 8192, 1000000.0f, false, 0, 0, 0,
       SynthMoe{60, 4, 1408, 5632, 0, 0}},
      // DeepSeek-V2-Lite: latent attention without a q LoRA (KV latent 512, keys 128 + 64 rotary, values
      // 128, YaRN x40 over 4096), one dense layer, then 64 routed experts (top 6) of width 1408 and 2 shared.
      {"deepseek-v2-lite", "deepseek2", 2048, 10944, 27, 16, 16, 102400, 163840, 10000.0f, false, 0, 0, 0,
       SynthMoe{64, 6, 1408, 0, 2, 1}, SynthMla{0, 512, 192, 128, 64, 40.0f, 4096, 0.0707f}},
      {"tiny-qwen2moe-d64", "qwen2moe", 64, 128, 2, 4, 2, 384, 512, 1000000.0f, false, 0, 0, 0,
       SynthMoe{8, 2, 32, 64, 0, 0}},
      {"tiny-deepseek2-d64", "deepseek2", 64, 128, 3, 4, 4, 384, 4096, 10000.0f, false, 0, 0, 0,
       SynthMoe{8, 2, 32, 0, 2, 1}, SynthMla{0, 32, 48, 32, 16, 4.0f, 1024, 0.1f}},
      {"tiny-jamba-d64", "jamba", 64, 160, 4, 4, 2, 384, 512, 0.0f, true, 16, 4, 2, SynthMoe{}, SynthMla{}, 2,
       1},
      // A jamba hybrid with experts: attention at layers 1 and 4 (period 3, offset 1), a mixture of 8 experts
      // (top 2) on the odd layers (period 2, offset 1), so that each kind of mixer meets each kind of FFN.
      {.name = "tiny-jamba-moe-d64",
       .arch = "jamba",
       .n_embd = 64,
       .n_ff = 96,
       .n_layer = 6,
       .n_head = 4,
       .n_head_kv = 2,
       .n_vocab = 384,
       .n_ctx_train = 512,
       .rope_base = 0.0f,
       .tied_embeddings = true,
       .ssm_d_state = 16,
       .ssm_d_conv = 4,
       .ssm_expand = 2,
       .moe = SynthMoe{.n_expert = 8, .n_expert_used = 2, .n_ff_expert = 96},
       .attn_period = 3,
       .attn_offset = 1,
       .expert_period = 2,
       .expert_offset = 1},
      tiny_deepseek_v3(),
  };
  return presets;
}

SynthPreset with_split_kv_b(const SynthPreset& preset) {
  if (preset.arch != "deepseek2")
    throw Error("a split attn_kv_b is written for deepseek2 presets only; '" + std::string(preset.name) +
                "' is " + std::string(preset.arch));
  SynthPreset p = preset;
  p.mla.split_kv_b = true;
  return p;
}

SynthPreset with_mtp_layers(const SynthPreset& preset, int64_t n_mtp) {
  if (n_mtp < 0)
    throw Error("the number of MTP layers must be 0 or more (got " + std::to_string(n_mtp) + ")");
  if (n_mtp > 0 && preset.arch != "deepseek2")
    throw Error("MTP layers are written for deepseek2 presets only; '" + std::string(preset.name) + "' is " +
                std::string(preset.arch));
  SynthPreset p = preset;
  p.n_mtp = n_mtp;
  return p;
}

const SynthPreset& find_synth_preset(std::string_view name) {
  std::string known;
  for (const SynthPreset& p : synth_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  throw Error("unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

const std::vector<FileType>& file_types() {
  static const std::vector<FileType> types = {
      {"F32", DType::F32, false},     {"F16", DType::F16, false},     {"BF16", DType::BF16, false},
      {"Q8_0", DType::Q8_0, false},   {"Q4_0", DType::Q4_0, false},   {"Q4_1", DType::Q4_1, false},
      {"Q5_0", DType::Q5_0, false},   {"Q5_1", DType::Q5_1, false},   {"Q2_K", DType::Q2_K, false},
      {"Q3_K_M", DType::Q3_K, true},  {"Q4_K_S", DType::Q4_K, false}, {"Q4_K_M", DType::Q4_K, true},
      {"Q5_K_S", DType::Q5_K, false}, {"Q5_K_M", DType::Q5_K, true},  {"Q6_K", DType::Q6_K, false},
  };
  return types;
}

const FileType& find_file_type(std::string_view name) {
  std::string upper(name), known;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const FileType& t : file_types()) {
    if (t.name == upper) return t;
    known += (known.empty() ? "" : ", ") + std::string(t.name);
  }
  throw Error("unknown type '" + std::string(name) + "' (known: " + known + ")");
}

DType matrix_type(const FileType& ft, std::string_view tensor, int64_t cols, int64_t layer, int64_t n_layer) {
  const DType base = ft.base;
  if (base == DType::F32 || base == DType::F16 || base == DType::BF16) return base;
  DType t = base;
  const bool head = tensor == "output.weight";
  if (head && base != DType::Q8_0) t = DType::Q6_K;
  const bool v_or_down = tensor.find("attn_v.weight") != std::string_view::npos ||
                         tensor.find("ffn_down.weight") != std::string_view::npos;
  if (ft.mix_m && v_or_down && layer >= 0 && use_more_bits(layer, n_layer))
    t = base == DType::Q3_K ? DType::Q5_K : DType::Q6_K;
  if (cols % 256 != 0) {
    switch (t) {
      case DType::Q2_K:
      case DType::Q3_K:
        t = DType::Q4_0;
        break;
      case DType::Q4_K:
        t = DType::Q5_0;
        break;
      case DType::Q5_K:
        t = DType::Q5_1;
        break;
      case DType::Q6_K:
        t = DType::Q8_0;
        break;
      default:
        break;
    }
  }
  // Rows that fit no block of the type (stories260K's feed-forward width 172) are written in F16, the
  // reference quantizer's fallback too.
  if (cols % traits(t).block_size != 0) return DType::F16;
  return t;
}

namespace {

// The rest of a bert encoder after the common metadata: CLS pooling (as bge), LayerNorms with biases,
// biased projections, learned positions and two token types. Position and type embeddings stay F32, as
// converters write them. nomic-bert: mean pooling, rotary positions, one fused q/k/v projection, SwiGLU, no
// projection biases (as nomic-embed-text).
void write_bert(gguf::Writer& w, const SynthPreset& p, const FileType& ft, const std::string& path,
                ThreadPool& pool, uint64_t seed) {
  const std::string a(p.arch);
  const bool nomic = p.arch == "nomic-bert";
  w.add_f32(a + ".attention.layer_norm_epsilon", 1e-12f);
  w.add_bool(a + ".attention.causal", false);
  w.add_u32(a + ".pooling_type", nomic ? 1 : 2);
  if (nomic) w.add_f32(a + ".rope.freq_base", p.rope_base);
  add_vocabulary(w, p.n_vocab);
  auto tensor = [&](const std::string& name, DType t, int64_t cols, int64_t rows, float scale, float offset) {
    RowGen gen = uniform_rows(seed, name, cols, scale, offset);
    std::vector<int64_t> ne = {cols};
    if (rows > 1) ne.push_back(rows);
    w.add_tensor(name, t, ne, [&pool, t, rows, cols, gen](const gguf::ByteSink& sink) {
      emit_rows(pool, t, rows, cols, gen, sink);
    });
  };
  auto matrix = [&](const std::string& name, int64_t cols, int64_t rows, int64_t layer) {
    const DType t = matrix_type(ft, name, cols, layer, p.n_layer);
    tensor(name, t, cols, rows, static_cast<float>(std::sqrt(3.0 / static_cast<double>(cols))), 0.0f);
  };
  auto norm = [&](const std::string& name) {
    tensor(name + ".weight", DType::F32, p.n_embd, 1, 0.1f, 1.0f);
    tensor(name + ".bias", DType::F32, p.n_embd, 1, 0.1f, 0.0f);
  };
  auto bias = [&](const std::string& name, int64_t n) { tensor(name, DType::F32, n, 1, 0.1f, 0.0f); };
  matrix("token_embd.weight", p.n_embd, p.n_vocab, -1);
  if (!nomic) tensor("position_embd.weight", DType::F32, p.n_embd, p.n_ctx_train, 0.1f, 0.0f);
  tensor("token_types.weight", DType::F32, p.n_embd, 2, 0.1f, 0.0f);
  norm("token_embd_norm");
  for (int64_t i = 0; i < p.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    if (nomic) {
      matrix(b + "attn_qkv.weight", p.n_embd, 3 * p.n_embd, i);
      matrix(b + "attn_output.weight", p.n_embd, p.n_embd, i);
      norm(b + "attn_output_norm");
      matrix(b + "ffn_up.weight", p.n_embd, p.n_ff, i);
      matrix(b + "ffn_gate.weight", p.n_embd, p.n_ff, i);
      matrix(b + "ffn_down.weight", p.n_ff, p.n_embd, i);
      norm(b + "layer_output_norm");
      continue;
    }
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
      matrix(b + m + ".weight", p.n_embd, p.n_embd, i);
      bias(b + m + ".bias", p.n_embd);
    }
    norm(b + "attn_output_norm");
    matrix(b + "ffn_up.weight", p.n_embd, p.n_ff, i);
    bias(b + "ffn_up.bias", p.n_ff);
    matrix(b + "ffn_down.weight", p.n_ff, p.n_embd, i);
    bias(b + "ffn_down.bias", p.n_embd);
    norm(b + "layer_output_norm");
  }
  w.write_file(path);
}

void add_moe_metadata(gguf::Writer& w, const SynthPreset& p) {
  if (p.moe.n_expert == 0) return;
  const std::string a(p.arch);
  w.add_u32(a + ".expert_count", static_cast<uint32_t>(p.moe.n_expert));
  w.add_u32(a + ".expert_used_count", static_cast<uint32_t>(p.moe.n_expert_used));
  w.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(p.moe.n_ff_expert));
  if (p.moe.n_ff_shared > 0)
    w.add_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(p.moe.n_ff_shared));
  if (p.arch != "deepseek2") return;
  w.add_u32(a + ".leading_dense_block_count", static_cast<uint32_t>(p.moe.n_leading_dense));
  w.add_u32(a + ".expert_shared_count", static_cast<uint32_t>(p.moe.n_shared));
  if (p.moe.v3_routing) {
    // DeepSeek-V3 routing: sigmoid scores, a selection bias per expert, normalised and scaled weights.
    w.add_f32(a + ".expert_weights_scale", 2.5f);
    w.add_bool(a + ".expert_weights_norm", true);
    w.add_u32(a + ".expert_gating_func", 2);
  } else {
    // DeepSeek-V2 routing: softmax scores, top-k weights as they are.
    w.add_f32(a + ".expert_weights_scale", 1.0f);
    w.add_bool(a + ".expert_weights_norm", false);
    w.add_u32(a + ".expert_gating_func", 1);
  }
  if (p.n_mtp > 0) w.add_u32(a + ".nextn_predict_layers", static_cast<uint32_t>(p.n_mtp));
  if (p.mla.q_lora_rank > 0)
    w.add_u32(a + ".attention.q_lora_rank", static_cast<uint32_t>(p.mla.q_lora_rank));
  w.add_u32(a + ".attention.kv_lora_rank", static_cast<uint32_t>(p.mla.kv_lora_rank));
  w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(p.mla.key_length));
  w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(p.mla.value_length));
  if (p.mla.yarn_factor > 0) {
    w.add_string(a + ".rope.scaling.type", "yarn");
    w.add_f32(a + ".rope.scaling.factor", p.mla.yarn_factor);
    w.add_u32(a + ".rope.scaling.original_context_length",
              static_cast<uint32_t>(p.mla.yarn_original_context));
    w.add_f32(a + ".rope.scaling.yarn_log_multiplier", p.mla.yarn_log_multiplier);
  }
}

// How write_moe_layers adds tensors: a matrix [rows, cols] of layer `layer` with the given scale, an F32
// vector, a router, and a stack of n expert matrices [n, rows, cols] (fan-in scaled).
struct LayerWriter {
  std::function<void(const std::string& name, int64_t cols, int64_t rows, int64_t layer, float scale)> matrix;
  std::function<void(const std::string& name, int64_t n, float scale, float offset)> vec;
  // An F32 router [row_scale.size(), cols] whose row e is scaled by row_scale[e] on top of the fan-in scale.
  std::function<void(const std::string& name, int64_t cols, std::vector<float> row_scale)> router;
  std::function<void(const std::string& name, int64_t cols, int64_t rows, int64_t n, int64_t layer)> experts;
  // The rows `matrix` writes for a tensor of that name, width and scale.
  std::function<RowGen(const std::string& name, int64_t cols, float scale)> rows;
  // A stacked {cols, rows, n} tensor in the layer's matrix type, whose generator `make` builds when the
  // tensor is written (so that what it holds lives only that long).
  std::function<void(const std::string& name, int64_t cols, int64_t rows, int64_t n, int64_t layer,
                     std::function<RowGen()> make)>
      stacked;
};

// The router row scales of layer `layer` (SynthMoe::router_zipf): expert e's popularity rank is a permutation
// of the experts that differs between layers.
std::vector<float> router_popularity(const SynthMoe& m, int64_t layer) {
  std::vector<float> popularity(static_cast<size_t>(m.n_expert));
  for (int64_t e = 0; e < m.n_expert; ++e) {
    const int64_t rank = (e * 7 + layer * 5) % m.n_expert;  // a permutation when gcd(7, n_expert) = 1
    popularity[static_cast<size_t>(e)] =
        static_cast<float>(std::pow(1.0 + static_cast<double>(rank), -static_cast<double>(m.router_zipf)));
  }
  return popularity;
}

// Layer i's up-projection split per head as the reference's converter writes it (SynthMla::split_kv_b), with
// the values attn_kv_b would hold: attn_k_b {nope, kv_lora_rank, n_head}, each head's key rows transposed,
// and attn_v_b {kv_lora_rank, head_dim_v, n_head}, its value rows.
void write_split_kv_b(const SynthPreset& p, const LayerWriter& lw, int64_t i) {
  const std::string b = "blk." + std::to_string(i) + ".";
  const int64_t L = p.mla.kv_lora_rank, nope = p.mla.key_length - p.mla.n_rot, dv = p.mla.value_length;
  const int64_t per_head = nope + dv, n_head = p.n_head;
  const RowGen joined =
      lw.rows(b + "attn_kv_b.weight", L, static_cast<float>(std::sqrt(3.0 / static_cast<double>(L))));
  lw.stacked(b + "attn_k_b.weight", nope, L, n_head, i, [=] {
    auto keys = std::make_shared<std::vector<float>>(static_cast<size_t>(n_head * L * nope));
    std::vector<float> row(static_cast<size_t>(L));
    for (int64_t h = 0; h < n_head; ++h)
      for (int64_t k = 0; k < nope; ++k) {
        joined(h * per_head + k, row.data());
        for (int64_t j = 0; j < L; ++j)
          (*keys)[static_cast<size_t>((h * L + j) * nope + k)] = row[static_cast<size_t>(j)];
      }
    return RowGen([keys, nope](int64_t r, float* out) {
      std::copy_n(keys->data() + static_cast<size_t>(r * nope), nope, out);
    });
  });
  lw.stacked(b + "attn_v_b.weight", L, dv, n_head, i, [=] {
    return RowGen([joined, per_head, nope, dv](int64_t r, float* out) {
      joined(r / dv * per_head + nope + r % dv, out);
    });
  });
}

// The layers of qwen2moe and deepseek2 files, named as the reference's converter names them. Routers stay
// F32 (the reference's quantizer leaves ffn_gate_inp alone).
void write_moe_layers(const SynthPreset& p, const LayerWriter& lw) {
  const auto fan_in = [](int64_t cols) {
    return static_cast<float>(std::sqrt(3.0 / static_cast<double>(cols)));
  };
  const SynthMoe& m = p.moe;
  const SynthMla& mla = p.mla;
  const bool deepseek = p.arch == "deepseek2";
  const int64_t head_dim = p.n_embd / p.n_head, kv_dim = p.n_head_kv * head_dim;
  const int64_t n_ff_shared = deepseek ? m.n_shared * m.n_ff_expert : m.n_ff_shared;
  // The MTP layers (deepseek2) follow the main ones: an ordinary block plus the nextn tensors.
  for (int64_t i = 0; i < p.n_layer + p.n_mtp; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    lw.vec(b + "attn_norm.weight", p.n_embd, 0.1f, 1.0f);
    if (i >= p.n_layer) {
      lw.vec(b + "nextn.enorm.weight", p.n_embd, 0.1f, 1.0f);
      lw.vec(b + "nextn.hnorm.weight", p.n_embd, 0.1f, 1.0f);
      lw.matrix(b + "nextn.eh_proj.weight", 2 * p.n_embd, p.n_embd, i, fan_in(2 * p.n_embd));
      lw.vec(b + "nextn.shared_head_norm.weight", p.n_embd, 0.1f, 1.0f);
    }
    if (deepseek) {
      const int64_t q_width = p.n_head * mla.key_length;
      if (mla.q_lora_rank > 0) {
        lw.matrix(b + "attn_q_a.weight", p.n_embd, mla.q_lora_rank, i, fan_in(p.n_embd));
        lw.vec(b + "attn_q_a_norm.weight", mla.q_lora_rank, 0.1f, 1.0f);
        lw.matrix(b + "attn_q_b.weight", mla.q_lora_rank, q_width, i, fan_in(mla.q_lora_rank));
      } else {
        lw.matrix(b + "attn_q.weight", p.n_embd, q_width, i, fan_in(p.n_embd));
      }
      lw.matrix(b + "attn_kv_a_mqa.weight", p.n_embd, mla.kv_lora_rank + mla.n_rot, i, fan_in(p.n_embd));
      lw.vec(b + "attn_kv_a_norm.weight", mla.kv_lora_rank, 0.1f, 1.0f);
      if (mla.split_kv_b)
        write_split_kv_b(p, lw, i);
      else
        lw.matrix(b + "attn_kv_b.weight", mla.kv_lora_rank,
                  p.n_head * (mla.key_length - mla.n_rot + mla.value_length), i, fan_in(mla.kv_lora_rank));
      lw.matrix(b + "attn_output.weight", p.n_head * mla.value_length, p.n_embd, i,
                fan_in(p.n_head * mla.value_length));
    } else {
      lw.matrix(b + "attn_q.weight", p.n_embd, p.n_embd, i, fan_in(p.n_embd));
      lw.matrix(b + "attn_k.weight", p.n_embd, kv_dim, i, fan_in(p.n_embd));
      lw.matrix(b + "attn_v.weight", p.n_embd, kv_dim, i, fan_in(p.n_embd));
      lw.vec(b + "attn_q.bias", p.n_embd, 0.1f, 0.0f);
      lw.vec(b + "attn_k.bias", kv_dim, 0.1f, 0.0f);
      lw.vec(b + "attn_v.bias", kv_dim, 0.1f, 0.0f);
      lw.matrix(b + "attn_output.weight", p.n_embd, p.n_embd, i, fan_in(p.n_embd));
    }
    lw.vec(b + "ffn_norm.weight", p.n_embd, 0.1f, 1.0f);
    if (deepseek && i < m.n_leading_dense) {
      lw.matrix(b + "ffn_gate.weight", p.n_embd, p.n_ff, i, fan_in(p.n_embd));
      lw.matrix(b + "ffn_up.weight", p.n_embd, p.n_ff, i, fan_in(p.n_embd));
      lw.matrix(b + "ffn_down.weight", p.n_ff, p.n_embd, i, fan_in(p.n_ff));
      continue;
    }
    lw.router(b + "ffn_gate_inp.weight", p.n_embd, router_popularity(m, i));
    if (deepseek && m.v3_routing) lw.vec(b + "exp_probs_b.bias", m.n_expert, 0.1f, 0.0f);
    lw.experts(b + "ffn_gate_exps.weight", p.n_embd, m.n_ff_expert, m.n_expert, i);
    lw.experts(b + "ffn_up_exps.weight", p.n_embd, m.n_ff_expert, m.n_expert, i);
    lw.experts(b + "ffn_down_exps.weight", m.n_ff_expert, p.n_embd, m.n_expert, i);
    if (!deepseek) lw.vec(b + "ffn_gate_inp_shexp.weight", p.n_embd, fan_in(p.n_embd), 0.0f);
    lw.matrix(b + "ffn_gate_shexp.weight", p.n_embd, n_ff_shared, i, fan_in(p.n_embd));
    lw.matrix(b + "ffn_up_shexp.weight", p.n_embd, n_ff_shared, i, fan_in(p.n_embd));
    lw.matrix(b + "ffn_down_shexp.weight", n_ff_shared, p.n_embd, i, fan_in(n_ff_shared));
  }
}

}  // namespace

void write_synthetic_model(const SynthPreset& p, const FileType& ft, const std::string& path,
                           ThreadPool& pool, uint64_t seed) {
  gguf::Writer w;
  const std::string a(p.arch);
  w.add_string("general.architecture", a);
  w.add_string("general.name", "synthetic " + std::string(p.name) + " (random weights)");
  w.add_u32("general.file_type", llama_ftype(ft.name));
  w.add_u32(a + ".context_length", static_cast<uint32_t>(p.n_ctx_train));
  w.add_u32(a + ".embedding_length", static_cast<uint32_t>(p.n_embd));
  if (p.n_mtp != 0 && p.arch != "deepseek2") throw Error("MTP layers are written for deepseek2 presets only");
  w.add_u32(a + ".block_count", static_cast<uint32_t>(p.n_layer + p.n_mtp));
  const bool mamba = p.arch == "mamba", jamba = p.arch == "jamba";
  const int64_t d_inner = p.ssm_expand * p.n_embd, dt_rank = (p.n_embd + 15) / 16;
  const auto attends = [&](int64_t layer) { return jamba && layer % p.attn_period == p.attn_offset; };
  if (mamba || jamba) {
    w.add_u32(a + ".ssm.conv_kernel", static_cast<uint32_t>(p.ssm_d_conv));
    w.add_u32(a + ".ssm.inner_size", static_cast<uint32_t>(d_inner));
    w.add_u32(a + ".ssm.state_size", static_cast<uint32_t>(p.ssm_d_state));
    w.add_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(dt_rank));
  }
  if (jamba) {
    w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(p.n_ff));
    w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(p.n_head));
    std::vector<int32_t> kv_heads(static_cast<size_t>(p.n_layer));
    for (int64_t i = 0; i < p.n_layer; ++i)
      kv_heads[static_cast<size_t>(i)] = attends(i) ? static_cast<int32_t>(p.n_head_kv) : 0;
    w.add_array(a + ".attention.head_count_kv", std::span<const int32_t>(kv_heads));
    // As the reference converter writes them: the experts' count and top-k only (the experts are
    // feed_forward_length wide; softmax routing, weights not renormalised).
    w.add_u32(a + ".expert_count", static_cast<uint32_t>(p.moe.n_expert));
    if (p.moe.n_expert > 0) w.add_u32(a + ".expert_used_count", static_cast<uint32_t>(p.moe.n_expert_used));
  } else if (!mamba) {
    w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(p.n_ff));
    w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(p.n_head));
    if (p.arch == "bert" || p.arch == "nomic-bert") return write_bert(w, p, ft, path, pool, seed);
    w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(p.n_head_kv));
    const int64_t n_rot = p.mla.kv_lora_rank > 0 ? p.mla.n_rot : p.n_embd / p.n_head;
    w.add_u32(a + ".rope.dimension_count", static_cast<uint32_t>(n_rot));
    w.add_f32(a + ".rope.freq_base", p.rope_base);
    add_moe_metadata(w, p);
  }
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32(a + ".vocab_size", static_cast<uint32_t>(p.n_vocab));
  add_vocabulary(w, p.n_vocab);

  const int64_t head_dim = mamba ? 0 : p.n_embd / p.n_head, kv_dim = p.n_head_kv * head_dim;
  auto matrix = [&](const std::string& name, int64_t cols, int64_t rows, int64_t layer, float scale) {
    // A tied embedding is also the head, so it takes the head's type.
    const bool tied_head = p.tied_embeddings && name == "token_embd.weight";
    const DType t = matrix_type(ft, tied_head ? "output.weight" : name, cols, layer, p.n_layer + p.n_mtp);
    RowGen gen = uniform_rows(seed, name, cols, scale);
    w.add_tensor(name, t, {cols, rows}, [&pool, t, rows, cols, gen](const gguf::ByteSink& sink) {
      emit_rows(pool, t, rows, cols, gen, sink);
    });
  };
  auto vec = [&](const std::string& name, int64_t n, float scale, float offset) {
    RowGen gen = uniform_rows(seed, name, n, scale, offset);
    w.add_tensor(name, DType::F32, {n}, [&pool, n, gen](const gguf::ByteSink& sink) {
      emit_rows(pool, DType::F32, 1, n, gen, sink);
    });
  };
  // Uniform weights of variance 1 / cols keep activations near unit scale through the layers.
  auto fan_in = [](int64_t cols) { return static_cast<float>(std::sqrt(3.0 / static_cast<double>(cols))); };
  matrix("token_embd.weight", p.n_embd, p.n_vocab, -1, 1.0f);
  vec("output_norm.weight", p.n_embd, 0.1f, 1.0f);
  if (!p.tied_embeddings) matrix("output.weight", p.n_embd, p.n_vocab, -1, fan_in(p.n_embd));
  // F32 matrices the mixer keeps in F32 whatever the file type (the convolution's weights, A).
  auto f32_matrix = [&](const std::string& name, int64_t cols, int64_t rows, float scale, float offset) {
    RowGen gen = uniform_rows(seed, name, cols, scale, offset);
    w.add_tensor(name, DType::F32, {cols, rows}, [&pool, rows, cols, gen](const gguf::ByteSink& sink) {
      emit_rows(pool, DType::F32, rows, cols, gen, sink);
    });
  };
  auto mixer = [&](int64_t i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    matrix(b + "ssm_in.weight", p.n_embd, 2 * d_inner, i, fan_in(p.n_embd));
    f32_matrix(b + "ssm_conv1d.weight", p.ssm_d_conv, d_inner, 0.5f, 0.0f);
    vec(b + "ssm_conv1d.bias", d_inner, 0.1f, 0.0f);
    matrix(b + "ssm_x.weight", d_inner, dt_rank + 2 * p.ssm_d_state, i, fan_in(d_inner));
    matrix(b + "ssm_dt.weight", dt_rank, d_inner, i, fan_in(dt_rank));
    // Time steps near Mamba's initial range (softplus of about -4.6 is 0.01).
    vec(b + "ssm_dt.bias", d_inner, 2.0f, -4.6f);
    // A = -exp(A_log) of A_log near log(1..d_state): decay rates from 1 to d_state.
    f32_matrix(b + "ssm_a", p.ssm_d_state, d_inner, 0.5f * static_cast<float>(p.ssm_d_state - 1),
               -0.5f * static_cast<float>(p.ssm_d_state + 1));
    vec(b + "ssm_d", d_inner, 0.5f, 1.0f);
    matrix(b + "ssm_out.weight", d_inner, p.n_embd, i, fan_in(d_inner));
    if (jamba) {
      vec(b + "ssm_dt_norm.weight", dt_rank, 0.1f, 1.0f);
      vec(b + "ssm_b_norm.weight", p.ssm_d_state, 0.1f, 1.0f);
      vec(b + "ssm_c_norm.weight", p.ssm_d_state, 0.1f, 1.0f);
    }
  };
  for (int64_t i = 0; mamba && i < p.n_layer; ++i) {
    vec("blk." + std::to_string(i) + ".attn_norm.weight", p.n_embd, 0.1f, 1.0f);
    mixer(i);
  }
  const bool moe = p.moe.n_expert > 0;
  const auto router = [&](const std::string& name, int64_t cols, std::vector<float> row_scale) {
    const RowGen base = uniform_rows(seed, name, cols, fan_in(cols));
    const auto rows = static_cast<int64_t>(row_scale.size());
    RowGen gen = [base, row_scale = std::move(row_scale), cols](int64_t row, float* out) {
      base(row, out);
      for (int64_t i = 0; i < cols; ++i) out[i] *= row_scale[static_cast<size_t>(row)];
    };
    w.add_tensor(name, DType::F32, {cols, rows}, [&pool, rows, cols, gen](const gguf::ByteSink& sink) {
      emit_rows(pool, DType::F32, rows, cols, gen, sink);
    });
  };
  const auto experts = [&](const std::string& name, int64_t cols, int64_t rows, int64_t n, int64_t layer) {
    const DType t = matrix_type(ft, name, cols, layer, p.n_layer + p.n_mtp);
    RowGen gen = uniform_rows(seed, name, cols, fan_in(cols));
    w.add_tensor(name, t, {cols, rows, n}, [&pool, t, rows, n, cols, gen](const gguf::ByteSink& sink) {
      emit_rows(pool, t, rows * n, cols, gen, sink);
    });
  };
  const auto rows_of = [&](const std::string& name, int64_t cols, float scale) {
    return uniform_rows(seed, name, cols, scale);
  };
  const auto stacked = [&](const std::string& name, int64_t cols, int64_t rows, int64_t n, int64_t layer,
                           std::function<RowGen()> make) {
    const DType t = matrix_type(ft, name, cols, layer, p.n_layer + p.n_mtp);
    w.add_tensor(name, t, {cols, rows, n},
                 [&pool, t, rows, n, cols, make = std::move(make)](const gguf::ByteSink& sink) {
                   emit_rows(pool, t, rows * n, cols, make(), sink);
                 });
  };
  if (moe && !jamba) write_moe_layers(p, LayerWriter{matrix, vec, router, experts, rows_of, stacked});
  const auto expert_layer = [&](int64_t layer) {
    return jamba && moe && layer % p.expert_period == p.expert_offset;
  };
  for (int64_t i = 0; !mamba && (jamba || !moe) && i < p.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    vec(b + "attn_norm.weight", p.n_embd, 0.1f, 1.0f);
    if (jamba && !attends(i)) {
      mixer(i);
    } else {
      matrix(b + "attn_q.weight", p.n_embd, p.n_embd, i, fan_in(p.n_embd));
      matrix(b + "attn_k.weight", p.n_embd, kv_dim, i, fan_in(p.n_embd));
      matrix(b + "attn_v.weight", p.n_embd, kv_dim, i, fan_in(p.n_embd));
      if (p.arch == "qwen2") {
        vec(b + "attn_q.bias", p.n_embd, 0.1f, 0.0f);
        vec(b + "attn_k.bias", kv_dim, 0.1f, 0.0f);
        vec(b + "attn_v.bias", kv_dim, 0.1f, 0.0f);
      }
      matrix(b + "attn_output.weight", p.n_embd, p.n_embd, i, fan_in(p.n_embd));
    }
    vec(b + "ffn_norm.weight", p.n_embd, 0.1f, 1.0f);
    if (expert_layer(i)) {
      router(b + "ffn_gate_inp.weight", p.n_embd, router_popularity(p.moe, i));
      experts(b + "ffn_gate_exps.weight", p.n_embd, p.n_ff, p.moe.n_expert, i);
      experts(b + "ffn_up_exps.weight", p.n_embd, p.n_ff, p.moe.n_expert, i);
      experts(b + "ffn_down_exps.weight", p.n_ff, p.n_embd, p.moe.n_expert, i);
      continue;
    }
    matrix(b + "ffn_gate.weight", p.n_embd, p.n_ff, i, fan_in(p.n_embd));
    matrix(b + "ffn_up.weight", p.n_embd, p.n_ff, i, fan_in(p.n_embd));
    matrix(b + "ffn_down.weight", p.n_ff, p.n_embd, i, fan_in(p.n_ff));
  }
  w.write_file(path);
}

void quantize_model(const std::string& in_path, const std::string& out_path, const FileType& ft,
                    ThreadPool& pool) {
  const gguf::File in = gguf::File::open(in_path);
  gguf::Writer w;
  const std::string arch(in.get_string("general.architecture").value_or(""));
  const int64_t n_layer = in.get_int(arch + ".block_count").value_or(0);
  const bool tied = in.tensor("output.weight") == nullptr;
  for (const auto& [key, value] : in.metadata()) {
    if (key == "general.alignment") continue;
    if (key == "general.file_type") {
      w.add_u32(key, llama_ftype(ft.name));
      continue;
    }
    w.add_value(key, value);
  }
  int f16_fallbacks = 0;
  for (const gguf::TensorInfo& t : in.tensors()) {
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::max(1, t.n_dims));
    const bool is_matrix = t.n_dims == 2 && t.name.size() > 7 && t.name.ends_with(".weight") &&
                           t.name.find("norm") == std::string::npos && traits(t.type).computable;
    if (!is_matrix) {
      w.add_tensor(t.name, t.type, ne, std::span<const uint8_t>(t.data, t.bytes));
      continue;
    }
    int64_t layer = -1;
    if (t.name.rfind("blk.", 0) == 0) layer = std::atoll(t.name.c_str() + 4);
    const bool tied_head = tied && t.name == "token_embd.weight";
    const DType type = matrix_type(ft, tied_head ? "output.weight" : t.name, t.ne[0], layer, n_layer);
    if (type == DType::F16 && ft.base != DType::F16) ++f16_fallbacks;
    const int64_t cols = t.ne[0], rows = t.ne[1];
    const DType src_type = t.type;
    const uint8_t* src = t.data;
    const size_t src_rb = row_bytes(src_type, cols);
    RowGen gen = [=](int64_t row, float* out) {
      dequantize_row(src_type, src + static_cast<size_t>(row) * src_rb, out, cols);
    };
    w.add_tensor(t.name, type, ne, [&pool, type, rows, cols, gen](const gguf::ByteSink& sink) {
      emit_rows(pool, type, rows, cols, gen, sink);
    });
  }
  w.write_file(out_path);
  if (f16_fallbacks > 0)
    std::fprintf(stderr, "quantize: %d matrices whose rows fit no %s block were written as F16\n",
                 f16_fallbacks, std::string(ft.name).c_str());
}

}  // namespace tandem::model
