// Mixture-of-experts and latent-attention checkpoints with bad metadata are refused with an error naming the
// key and what was expected, before anything is sized by it; never a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/model/model.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace {

using tandem::gguf::File;
using tandem::gguf::Writer;
using Bytes = std::vector<uint8_t>;

std::string model_path(const std::string& name) {
  return tandem::testing::shared_path("models/synth/" + name + ".gguf");
}

// A copy of the model at `path` with metadata `key` written by `add` (in place, or added) and, when
// `drop_key` is set, that key left out.
Bytes rewrite(const std::string& path, const std::string& key,
              const std::function<void(Writer&, const std::string&)>& add, bool drop_key = false) {
  const File file = File::open(path);
  Writer w(file.alignment());
  bool seen = false;
  for (const auto& [k, value] : file.metadata()) {
    if (k == "general.alignment") continue;
    if (k != key) {
      w.add_value(k, value);
      continue;
    }
    seen = true;
    if (!drop_key) add(w, k);
  }
  if (!seen && !drop_key) add(w, key);
  for (const tandem::gguf::TensorInfo& t : file.tensors())
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                 std::span<const uint8_t>(t.data, t.bytes));
  Bytes out;
  w.write([&out](std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); });
  return out;
}

std::string load_error(const Bytes& b) {
  try {
    File f = File::parse(b.data(), b.size(), "moe.gguf");
    auto model = tandem::model::Model::from_file(std::move(f));
    return "";
  } catch (const tandem::Error& e) {
    return e.what();
  }
}

void expect_refused(const Bytes& b, const std::string& phrase) {
  const std::string msg = load_error(b);
  EXPECT_NE(msg.find(phrase), std::string::npos) << "expected '" << phrase << "' in: " << msg;
}

auto u32(uint32_t v) {
  return [v](Writer& w, const std::string& k) { w.add_u32(k, v); };
}

TEST(MoeInputs, UnchangedCopiesLoad) {
  for (const char* name :
       {"synth-qwen2moe-d128-Q8_0", "synth-deepseek2-d128-f32", "synth-deepseek2v3-d128-Q8_0"})
    EXPECT_EQ(load_error(rewrite(model_path(name), "general.name",
                                 [](Writer& w, const std::string& k) { w.add_string(k, "copy"); })),
              "")
        << name;
}

TEST(MoeInputs, ExpertCountsOutOfRange) {
  const std::string qwen = model_path("synth-qwen2moe-d128-Q8_0");
  expect_refused(rewrite(qwen, "qwen2moe.expert_used_count", u32(9)),
                 "'qwen2moe.expert_used_count' is 9, expected 1 to 8");
  expect_refused(rewrite(qwen, "qwen2moe.expert_used_count", u32(0)),
                 "'qwen2moe.expert_used_count' is 0, expected 1 to 8");
  expect_refused(rewrite(qwen, "qwen2moe.expert_count", u32(100'000'000)),
                 "'qwen2moe.expert_count' is 100000000, expected 1 to 1024");
  // A count the tensors do not have: the router's shape says so.
  expect_refused(rewrite(qwen, "qwen2moe.expert_count", u32(7)),
                 "tensor 'blk.0.ffn_gate_inp.weight' has shape [128, 8], expected [128, 7]");
  expect_refused(rewrite(qwen, "qwen2moe.expert_feed_forward_length", u32(1u << 30)),
                 "tensor 'blk.0.ffn_gate_exps.weight' has shape [128, 64, 8], expected [128, 1073741824, 8]");
  expect_refused(rewrite(qwen, "qwen2moe.expert_count", {}, /*drop_key=*/true),
                 "lacks required metadata 'qwen2moe.expert_count'");
}

TEST(MoeInputs, DeepSeek2MetadataOutOfRange) {
  const std::string v3 = model_path("synth-deepseek2v3-d128-Q8_0");
  expect_refused(rewrite(v3, "deepseek2.expert_gating_func", u32(3)),
                 "'deepseek2.expert_gating_func' is 3, expected 1 to 2");
  expect_refused(rewrite(v3, "deepseek2.expert_group_count", u32(3)),
                 "'deepseek2.expert_count' (8) must be a multiple of expert_group_count (3)");
  expect_refused(rewrite(v3, "deepseek2.rope.dimension_count", u32(48)),
                 "'deepseek2.rope.dimension_count' is 48; it must be even and less than");
  expect_refused(rewrite(v3, "deepseek2.leading_dense_block_count", u32(5)),
                 "'deepseek2.leading_dense_block_count' is 5, expected 0 to 4");
  expect_refused(rewrite(v3, "deepseek2.block_count", u32(100'000'000)),
                 "'deepseek2.block_count' is 100000000");
  expect_refused(rewrite(v3, "deepseek2.rope.scaling.type",
                         [](Writer& w, const std::string& k) { w.add_string(k, "longrope"); }),
                 "'deepseek2.rope.scaling.type' is 'longrope'");
  expect_refused(rewrite(v3, "deepseek2.attention.kv_lora_rank", u32(16)),
                 "tensor 'blk.0.attn_kv_a_mqa.weight' has shape [128, 48], expected [128, 32]");
}

}  // namespace
