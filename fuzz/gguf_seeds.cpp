// Writes a few small, valid GGUF files into the folder given as the only argument: the fuzzer's starting
// points, covering every metadata type, several tensor types, custom alignment, an empty file, and whole
// tiny models of each architecture with SentencePiece and byte-level BPE vocabularies (which load as models
// and tokenizers, so mutations of them reach the loader's checks).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tandem/gguf/writer.h"

namespace {

using tandem::DType;
using tandem::gguf::Writer;

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

void every_type(const std::string& dir) {
  Writer w;
  w.add_string("general.architecture", "llama");
  w.add_u8("a.u8", 1);
  w.add_i8("a.i8", -1);
  w.add_u16("a.u16", 2);
  w.add_i16("a.i16", -2);
  w.add_u32("llama.block_count", 2);
  w.add_i32("a.i32", -3);
  w.add_u64("a.u64", 4);
  w.add_i64("a.i64", -4);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_f64("a.f64", 0.5);
  w.add_bool("a.bool", true);
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "▁a", "é"};
  w.add_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
  const std::vector<float> scores = {0.0f, -1.0f, -2.5f, 1e30f, -0.0f};
  w.add_array("tokenizer.ggml.scores", std::span<const float>(scores));
  const std::vector<int32_t> types = {2, 3, 3, 1, 1};
  w.add_array("tokenizer.ggml.token_type", std::span<const int32_t>(types));
  const bool flags[] = {true, false};
  w.add_array("a.bools", std::span<const bool>(flags));
  const std::vector<uint64_t> u64s = {1, 1ull << 40};
  w.add_array("a.u64s", std::span<const uint64_t>(u64s));
  const std::vector<double> f64s = {1.0, -1e300};
  w.add_array("a.f64s", std::span<const double>(f64s));
  const auto f32 = pattern(4 * 8 * 2, 1);
  const auto q8 = pattern(34 * 2, 2);
  const auto q4k = pattern(144, 3);
  const auto f16 = pattern(2 * 3, 4);
  w.add_tensor("token_embd.weight", DType::F32, {8, 2}, f32);
  w.add_tensor("blk.0.attn_q.weight", DType::Q8_0, {32, 2}, q8);
  w.add_tensor("blk.0.ffn_up.weight", DType::Q4_K, {256}, q4k);
  w.add_tensor("output_norm.weight", DType::F16, {3, 1, 1}, f16);
  w.write_file(dir + "/every_type.gguf");
}

void aligned_64(const std::string& dir) {
  Writer w(64);
  w.add_string("general.name", "aligned");
  const auto a = pattern(4 * 5, 5);
  const auto b = pattern(18 * 2, 6);
  w.add_tensor("a", DType::F32, {5}, a);
  w.add_tensor("b", DType::Q4_0, {32, 1, 1, 2}, b);
  w.write_file(dir + "/aligned_64.gguf");
}

// A whole model of `arch`: width 32, 2 heads (1 KV head), FFN 64, 2 layers, a 12-token vocabulary.
void tiny_model(const std::string& dir, const std::string& arch, bool bpe) {
  const int64_t d = 32, ff = 64, kv = 16, vocab = 12, layers = 2;
  Writer w;
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".embedding_length", d);
  w.add_u32(arch + ".block_count", layers);
  w.add_u32(arch + ".feed_forward_length", ff);
  w.add_u32(arch + ".attention.head_count", 2);
  w.add_u32(arch + ".attention.head_count_kv", 1);
  w.add_u32(arch + ".context_length", 64);
  w.add_f32(arch + ".rope.freq_base", 10000.0f);
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  if (arch == "gemma2") {
    w.add_u32("gemma2.attention.sliding_window", 8);
    w.add_f32("gemma2.attn_logit_softcapping", 50.0f);
    w.add_f32("gemma2.final_logit_softcapping", 30.0f);
  }
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  if (bpe) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "qwen2");
    tokens = {"<|endoftext|>", "H", "e", "l", "o", "Ġ", "w", "r", "d", "He", "ll", "Ġw"};
    types = {3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const std::vector<std::string> merges = {"H e", "l l", "Ġ w"};
    w.add_array("tokenizer.ggml.merges", std::span<const std::string>(merges));
    w.add_u32("tokenizer.ggml.eos_token_id", 0);
  } else {
    w.add_string("tokenizer.ggml.model", "llama");
    tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "▁", "▁H", "ello", "▁w", "orld", "<|user|>", "é", "o"};
    types = {2, 3, 3, 6, 1, 1, 1, 1, 1, 4, 1, 1};
    const std::vector<float> scores = {0, 0, 0, 0, -1, -2, -3, -4, -5, 0, -6, -7};
    w.add_array("tokenizer.ggml.scores", std::span<const float>(scores));
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
  }
  w.add_array("tokenizer.ggml.tokens", std::span<const std::string>(tokens));
  w.add_array("tokenizer.ggml.token_type", std::span<const int32_t>(types));

  std::vector<std::vector<uint8_t>> data;  // kept alive until write_file
  data.reserve(64);
  auto f32 = [&](const std::string& name, std::vector<int64_t> ne) {
    size_t n = 1;
    for (int64_t x : ne) n *= static_cast<size_t>(x);
    data.push_back(pattern(4 * n, static_cast<uint32_t>(data.size())));
    for (size_t i = 3; i < data.back().size(); i += 4) data.back()[i] = 0x3C;  // small finite floats
    w.add_tensor(name, DType::F32, ne, data.back());
  };
  auto q8 = [&](const std::string& name, std::vector<int64_t> ne) {
    data.push_back(pattern(Writer::tensor_bytes(DType::Q8_0, ne), static_cast<uint32_t>(data.size())));
    w.add_tensor(name, DType::Q8_0, ne, data.back());
  };
  f32("token_embd.weight", {d, vocab});
  f32("output_norm.weight", {d});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    f32(p + "attn_norm.weight", {d});
    q8(p + "attn_q.weight", {d, d});
    q8(p + "attn_k.weight", {d, kv});
    q8(p + "attn_v.weight", {d, kv});
    q8(p + "attn_output.weight", {d, d});
    f32(p + "ffn_norm.weight", {d});
    q8(p + "ffn_gate.weight", {d, ff});
    q8(p + "ffn_up.weight", {d, ff});
    q8(p + "ffn_down.weight", {ff, d});
    if (arch == "qwen2") {
      f32(p + "attn_q.bias", {d});
      f32(p + "attn_k.bias", {kv});
      f32(p + "attn_v.bias", {kv});
    }
    if (arch == "gemma2") {
      f32(p + "post_attention_norm.weight", {d});
      f32(p + "post_ffw_norm.weight", {d});
    }
  }
  w.write_file(dir + "/tiny-" + arch + (bpe ? "-bpe" : "-spm") + ".gguf");
}

void empty(const std::string& dir) {
  Writer w;
  w.write_file(dir + "/empty.gguf");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  try {
    every_type(argv[1]);
    aligned_64(argv[1]);
    empty(argv[1]);
    tiny_model(argv[1], "llama", false);
    tiny_model(argv[1], "gemma2", false);
    tiny_model(argv[1], "qwen2", true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
