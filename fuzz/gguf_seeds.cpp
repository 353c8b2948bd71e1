// Writes a few small, valid GGUF files into the folder given as the only argument: the fuzzer's starting
// points, covering every metadata type, several tensor types, custom alignment and an empty file.
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
