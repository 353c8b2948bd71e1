// Architecture metadata read into the model config: rope scaling variants, shape checks, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tandem/gguf/writer.h"
#include "tandem/model/model.h"
#include "tandem/util/error.h"

namespace {

using tandem::DType;
using tandem::gguf::File;
using tandem::gguf::Writer;

// A minimal llama header: dim 64, 8 heads (head size 8, 8 rotated dims), plus whatever `extra` adds. Only the
// embedding is stored; hyperparameters are read before any layer tensor is bound.
std::vector<uint8_t> llama_header(const std::function<void(Writer&)>& extra) {
  Writer w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.embedding_length", 64);
  w.add_u32("llama.block_count", 1);
  w.add_u32("llama.feed_forward_length", 128);
  w.add_u32("llama.attention.head_count", 8);
  w.add_u32("llama.attention.head_count_kv", 4);
  w.add_f32("llama.rope.freq_base", 500000.0f);
  extra(w);
  std::vector<uint8_t> embd(64 * 16 * sizeof(float), 0);
  w.add_tensor("token_embd.weight", DType::F32, {64, 16}, embd);
  std::vector<uint8_t> out;
  w.write([&](std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); });
  return out;
}

tandem::model::Config read_config(const std::vector<uint8_t>& bytes) {
  File f = File::parse(bytes.data(), bytes.size(), "test.gguf");
  tandem::model::ArchReader r(f, "llama");
  tandem::model::Config c;
  tandem::model::read_common_hparams(r, c);
  return c;
}

TEST(ModelConfig, Llama3RopeScalingFromMetadata) {
  const auto bytes = llama_header([](Writer& w) {
    w.add_string("llama.rope.scaling.type", "llama3");
    w.add_f32("llama.rope.scaling.factor", 8.0f);
    w.add_f32("llama.rope.scaling.low_freq_factor", 1.0f);
    w.add_f32("llama.rope.scaling.high_freq_factor", 4.0f);
    w.add_u32("llama.rope.scaling.original_context_length", 8192);
  });
  const auto c = read_config(bytes);
  ASSERT_EQ(c.n_rot, 8);
  ASSERT_EQ(c.rope_freq_factors.size(), 4u);
  // Pair i has frequency base^(-2i/8); wavelength 2*pi/freq. Long wavelengths (> 8192) are slowed by the full
  // factor, short ones (< 2048) kept, and between them the ramp 1 / ((1 - s) / 8 + s), s = (8192/wl - 1) / 3.
  for (int i = 0; i < 4; ++i) {
    const double freq = std::pow(500000.0, -2.0 * i / 8.0);
    const double wl = 2 * std::numbers::pi / freq;
    double want = wl < 2048   ? 1.0
                  : wl > 8192 ? 8.0
                              : 1.0 / ((1 - (8192 / wl - 1) / 3) / 8 + (8192 / wl - 1) / 3);
    EXPECT_NEAR(c.rope_freq_factors[static_cast<size_t>(i)], want, 1e-5 * want) << "pair " << i;
  }
  EXPECT_FLOAT_EQ(c.rope_freq_factors[0], 1.0f);
  EXPECT_FLOAT_EQ(c.rope_freq_factors[3], 8.0f);
}

TEST(ModelConfig, RopeFreqsTensorWins) {
  const auto bytes = llama_header([](Writer& w) {
    static const float factors[4] = {1.0f, 2.0f, 4.0f, 8.0f};
    w.add_tensor("rope_freqs.weight", DType::F32, {4},
                 std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(factors), sizeof(factors)));
  });
  const auto c = read_config(bytes);
  ASSERT_EQ(c.rope_freq_factors.size(), 4u);
  EXPECT_EQ(c.rope_freq_factors[2], 4.0f);
}

TEST(ModelConfig, LinearRopeScaling) {
  const auto bytes = llama_header([](Writer& w) {
    w.add_string("llama.rope.scaling.type", "linear");
    w.add_f32("llama.rope.scaling.factor", 4.0f);
  });
  const auto c = read_config(bytes);
  EXPECT_FLOAT_EQ(c.rope_linear_scale, 0.25f);
  EXPECT_TRUE(c.rope_freq_factors.empty());
}

TEST(ModelConfig, UnsupportedScalingAndBadShapesAreErrors) {
  const auto yarn = llama_header([](Writer& w) { w.add_string("llama.rope.scaling.type", "yarn"); });
  EXPECT_THROW(read_config(yarn), tandem::Error);
  const auto bad_heads = llama_header([](Writer& w) { w.add_u32("llama.rope.dimension_count", 7); });
  EXPECT_THROW(read_config(bad_heads), tandem::Error);
  // A whole model load names what is missing: here block_count claims a layer the file holds no tensors for.
  const auto bytes = llama_header([](Writer&) {});
  try {
    tandem::model::Model::from_file(File::parse(bytes.data(), bytes.size(), "test.gguf"));
    FAIL() << "a model without layers loaded";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'llama.block_count' is 1, but the file holds tensors for 0 layers"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
