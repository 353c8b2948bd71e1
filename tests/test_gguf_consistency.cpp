// Inconsistent GGUF files: a real model from ../shared/models rewritten with one change each. Every one must
// be refused when the model and its tokenizer are loaded, with a tandem::Error naming the key or tensor,
// quickly and without an allocation sized by the bad number.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/model/model.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

// The largest single allocation request since the last reset, so a test can check that loading a hostile
// file never asks for memory sized by a metadata number. AddressSanitizer brings its own operator new, so
// under it the tracking is off and the check is left out.
#if defined(__SANITIZE_ADDRESS__)
#define TANDEM_TRACKS_ALLOCATIONS 0
#else
#define TANDEM_TRACKS_ALLOCATIONS 1
#endif
namespace {
std::atomic<size_t> g_largest_allocation{0};
}  // namespace
#if TANDEM_TRACKS_ALLOCATIONS
namespace {
void (*volatile g_release)(void*) = std::free;
}  // namespace
void* operator new(std::size_t size) {
  size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size, std::memory_order_relaxed)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  g_release(p);
}
void operator delete(void* p, std::size_t) noexcept {
  g_release(p);
}
#endif

namespace {

using tandem::DType;
using tandem::Error;
using tandem::gguf::File;
using tandem::gguf::Writer;
using Bytes = std::vector<uint8_t>;

const std::string kModels = std::string(TANDEM_SHARED_DIR) + "/models/";
const std::string kStories = kModels + "stories260K.gguf";                  // llama, F32, 5 layers, dim 64
const std::string kLlamaQ8 = kModels + "synth/synth-llama-d256-Q8_0.gguf";  // llama, Q8_0, 3 layers
const std::string kGemma2 = kModels + "synth/synth-gemma2-d128-Q8_0.gguf";

// A real model copied through the project's writer, with metadata replaced, added or dropped and tensors
// reshaped or dropped. Unchanged, the copy loads exactly as the original.
class Rewrite {
 public:
  using AddValue = std::function<void(Writer&, const std::string& key)>;

  explicit Rewrite(const std::string& path) : file_(File::open(path)) {}

  // Writes `key` with `add` in place of its value (or after the others when the file lacks it).
  Rewrite& set(const std::string& key, AddValue add) {
    set_[key] = std::move(add);
    return *this;
  }
  Rewrite& set_u32(const std::string& key, uint32_t v) {
    return set(key, [v](Writer& w, const std::string& k) { w.add_u32(k, v); });
  }
  Rewrite& set_i32(const std::string& key, int32_t v) {
    return set(key, [v](Writer& w, const std::string& k) { w.add_i32(k, v); });
  }
  Rewrite& set_u64(const std::string& key, uint64_t v) {
    return set(key, [v](Writer& w, const std::string& k) { w.add_u64(k, v); });
  }
  Rewrite& set_f32(const std::string& key, float v) {
    return set(key, [v](Writer& w, const std::string& k) { w.add_f32(k, v); });
  }
  // Gives tensor `name` another shape, with zero bytes of that size.
  Rewrite& reshape(const std::string& name, std::vector<int64_t> ne) {
    reshape_[name] = std::move(ne);
    return *this;
  }

  const File& original() const { return file_; }

  Bytes bytes() const {
    Writer w(file_.alignment());
    for (const auto& [key, value] : file_.metadata()) {
      if (key == "general.alignment") continue;  // the writer owns it
      auto it = set_.find(key);
      if (it != set_.end()) {
        it->second(w, key);
      } else {
        w.add_value(key, value);
      }
    }
    for (const auto& [key, add] : set_)
      if (!file_.find(key)) add(w, key);
    std::vector<Bytes> zeros;
    zeros.reserve(reshape_.size());
    for (const tandem::gguf::TensorInfo& t : file_.tensors()) {
      auto it = reshape_.find(t.name);
      if (it == reshape_.end()) {
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                     std::span<const uint8_t>(t.data, t.bytes));
        continue;
      }
      zeros.emplace_back(Writer::tensor_bytes(t.type, it->second), 0);
      w.add_tensor(t.name, t.type, it->second, zeros.back());
    }
    Bytes out;
    w.write([&out](std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); });
    return out;
  }

 private:
  File file_;
  std::map<std::string, AddValue> set_;
  std::map<std::string, std::vector<int64_t>> reshape_;
};

// Loads the model and its tokenizer from `b` as `run` does; returns the error, or "" when both load.
std::string load_error(const Bytes& b) {
  try {
    File f = File::parse(b.data(), b.size(), "inconsistent.gguf");
    auto model = tandem::model::Model::from_file(f);
    auto tokenizer = tandem::tokenizer::Tokenizer::from_gguf(model->file());
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

// Expects the load to fail with every phrase in the message (the key or tensor, and what was expected),
// without any single allocation of `max_allocation` bytes or more.
void expect_refused(const Bytes& b, const std::vector<std::string>& phrases,
                    size_t max_allocation = size_t{64} << 20) {
  g_largest_allocation = 0;
  const std::string msg = load_error(b);
  const size_t largest = g_largest_allocation;
  ASSERT_FALSE(msg.empty()) << "the file loaded; expected an error containing '" << phrases.front() << "'";
  for (const std::string& phrase : phrases)
    EXPECT_NE(msg.find(phrase), std::string::npos) << "expected '" << phrase << "' in: " << msg;
  if (TANDEM_TRACKS_ALLOCATIONS) {
    EXPECT_LT(largest, max_allocation) << msg;
  }
}

// Position of a tensor info's fields in the header: the name (length-prefixed, unique in the header), then
// the dimension count, the dimensions, the type and the offset.
size_t info_at(const Bytes& b, const std::string& name) {
  std::string_view all(reinterpret_cast<const char*>(b.data()), b.size());
  for (size_t at = all.find(name); at != std::string_view::npos; at = all.find(name, at + 1)) {
    uint64_t len = 0;
    if (at >= 8) std::memcpy(&len, b.data() + at - 8, 8);
    if (len == name.size()) return at + name.size();
  }
  ADD_FAILURE() << "no tensor info for " << name;
  return 0;
}
size_t type_at(const Bytes& b, const std::string& name) {
  uint32_t n_dims = 0;
  std::memcpy(&n_dims, b.data() + info_at(b, name), 4);
  return info_at(b, name) + 4 + 8 * n_dims;
}
size_t offset_at(const Bytes& b, const std::string& name) {
  return type_at(b, name) + 4;
}

TEST(GgufConsistency, UnchangedCopiesLoad) {
  for (const std::string& path : {kStories, kLlamaQ8, kGemma2}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(load_error(Rewrite(path).bytes()), "");
  }
}

TEST(GgufConsistency, BlockCountPastTheLayersPresentFailsFast) {
  for (uint32_t n : {6u, 57u, 10'000'000u, 100'000'000u}) {
    SCOPED_TRACE(n);
    const Bytes b = Rewrite(kStories).set_u32("llama.block_count", n).bytes();
    const auto start = std::chrono::steady_clock::now();
    expect_refused(b, {"'llama.block_count' is " + std::to_string(n), "blk.N layers"});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  }
  expect_refused(Rewrite(kStories).set_u32("llama.block_count", 6).bytes(),
                 {"'llama.block_count' is 6, but the file holds tensors for 5 layers"});
}

TEST(GgufConsistency, BlockCountBelowTheLayersPresent) {
  for (uint32_t n : {1u, 4u}) {
    SCOPED_TRACE(n);
    expect_refused(Rewrite(kStories).set_u32("llama.block_count", n).bytes(),
                   {"'llama.block_count' is " + std::to_string(n), "tensor 'blk." + std::to_string(n) + "."});
  }
}

TEST(GgufConsistency, UnusedTensorIsRefused) {
  // A stray tensor beside the real ones: a mixture-of-experts router, which a dense llama does not have.
  Writer w;
  const File f = File::open(kStories);
  for (const auto& [key, value] : f.metadata()) w.add_value(key, value);
  for (const auto& t : f.tensors())
    w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                 std::span<const uint8_t>(t.data, t.bytes));
  const Bytes extra(64 * 8 * sizeof(float), 0);
  w.add_tensor("blk.2.ffn_gate_inp.weight", DType::F32, {64, 8}, extra);
  Bytes b;
  w.write([&b](std::span<const uint8_t> s) { b.insert(b.end(), s.begin(), s.end()); });
  expect_refused(b, {"tensor 'blk.2.ffn_gate_inp.weight' [64, 8]", "does not use"});
}

TEST(GgufConsistency, TensorDataOverlappingAnother) {
  Bytes b = Rewrite(kStories).bytes();
  uint64_t off = 0;
  std::memcpy(&off, b.data() + offset_at(b, "blk.1.attn_q.weight"), 8);
  std::memcpy(b.data() + offset_at(b, "blk.1.attn_k.weight"), &off, 8);
  expect_refused(b, {"overlaps tensor", "blk.1.attn_q.weight", "blk.1.attn_k.weight"});
}

TEST(GgufConsistency, BlockTypeChangedSoDataRunsIntoTheNextTensor) {
  Bytes b = Rewrite(kLlamaQ8).bytes();
  // Q8_0 takes 34 bytes per 32 elements; as F16 the same shape takes 64, past the tensor's own bytes.
  uint32_t type = 0;
  std::memcpy(&type, b.data() + type_at(b, "blk.0.attn_q.weight"), 4);
  ASSERT_EQ(type, static_cast<uint32_t>(DType::Q8_0));
  type = static_cast<uint32_t>(DType::F16);
  std::memcpy(b.data() + type_at(b, "blk.0.attn_q.weight"), &type, 4);
  expect_refused(b, {"tensor 'blk.0.attn_q.weight' data", "as F16", "overlaps tensor"});
}

TEST(GgufConsistency, OutputNormOfTheWrongShape) {
  // The same number of elements in another shape.
  expect_refused(Rewrite(kStories).reshape("output_norm.weight", {32, 2}).bytes(),
                 {"tensor 'output_norm.weight' has shape [32, 2], expected [64]"});
  expect_refused(Rewrite(kStories).reshape("blk.3.ffn_norm.weight", {8, 8}).bytes(),
                 {"tensor 'blk.3.ffn_norm.weight' has shape [8, 8], expected [64]"});
}

TEST(GgufConsistency, VocabularyShorterOrLongerThanTheEmbedding) {
  const File f = File::open(kStories);
  auto tokens = f.get_strings("tokenizer.ggml.tokens");
  const std::vector<float> scores = f.get_f32_array("tokenizer.ggml.scores");
  const std::vector<int32_t> types = f.get_i32_array("tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), 512u);
  for (size_t n : {size_t{500}, size_t{511}}) {
    SCOPED_TRACE(n);
    std::vector<std::string_view> t(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<float> s(scores.begin(), scores.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<int32_t> y(types.begin(), types.begin() + static_cast<std::ptrdiff_t>(n));
    const Bytes b =
        Rewrite(kStories)
            .set("tokenizer.ggml.tokens",
                 [&](Writer& w, const std::string& k) {
                   w.add_array(k, std::span<const std::string_view>(t));
                 })
            .set("tokenizer.ggml.scores",
                 [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const float>(s)); })
            .set("tokenizer.ggml.token_type",
                 [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const int32_t>(y)); })
            .bytes();
    expect_refused(b, {"'tokenizer.ggml.tokens' holds " + std::to_string(n) + " tokens",
                       "'token_embd.weight' has 512 rows"});
  }
  // Scores or types of another length than the tokens.
  std::vector<float> s(scores.begin(), scores.end() - 1);
  expect_refused(Rewrite(kStories)
                     .set("tokenizer.ggml.scores",
                          [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const float>(s)); })
                     .bytes(),
                 {"tokenizer.ggml.scores has 511 entries for 512 tokens"});
  std::vector<int32_t> y(types);
  y.push_back(1);
  expect_refused(
      Rewrite(kStories)
          .set("tokenizer.ggml.token_type",
               [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const int32_t>(y)); })
          .bytes(),
      {"tokenizer.ggml.token_type has 513 entries for 512 tokens"});
}

TEST(GgufConsistency, SpecialIdsOutOfRange) {
  for (const std::string key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"}) {
    const std::string quoted = "metadata '" + key + "' is ";
    for (uint32_t id : {512u, 100000u}) {
      SCOPED_TRACE(key + " " + std::to_string(id));
      expect_refused(Rewrite(kStories).set_u32(key, id).bytes(),
                     {quoted + std::to_string(id), "ids 0 to 511"});
    }
    expect_refused(Rewrite(kStories).set_i32(key, -5).bytes(), {quoted + "-5"});
  }
  // The "none" converters write keeps the default id, as in the reference.
  const Bytes none = Rewrite(kStories).set_u32("tokenizer.ggml.eos_token_id", 0xFFFFFFFF).bytes();
  EXPECT_EQ(load_error(none), "");
  File f = File::parse(none.data(), none.size());
  EXPECT_EQ(tandem::tokenizer::Tokenizer::from_gguf(f)->eos_id(), 2);
}

TEST(GgufConsistency, TokenTypesOutOfRange) {
  const std::vector<int32_t> types = File::open(kStories).get_i32_array("tokenizer.ggml.token_type");
  for (int32_t bad : {99, -1, 7}) {
    SCOPED_TRACE(bad);
    std::vector<int32_t> y(types);
    y[300] = bad;
    expect_refused(
        Rewrite(kStories)
            .set("tokenizer.ggml.token_type",
                 [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const int32_t>(y)); })
            .bytes(),
        {"tokenizer.ggml.token_type of token 300 is " + std::to_string(bad), "expected 0 to 6"});
  }
}

TEST(GgufConsistency, HyperparametersOfTheWrongType) {
  expect_refused(
      Rewrite(kStories)
          .set("llama.attention.head_count", [](Writer& w, const std::string& k) { w.add_bool(k, true); })
          .bytes(),
      {"metadata 'llama.attention.head_count' is bool, expected an integer"});
  expect_refused(
      Rewrite(kStories)
          .set("llama.attention.head_count_kv", [](Writer& w, const std::string& k) { w.add_f32(k, 4.0f); })
          .bytes(),
      {"metadata 'llama.attention.head_count_kv' is f32, expected an integer"});
  expect_refused(
      Rewrite(kStories)
          .set("llama.rope.freq_base", [](Writer& w, const std::string& k) { w.add_string(k, "10000"); })
          .bytes(),
      {"metadata 'llama.rope.freq_base' is string, expected a number"});
}

TEST(GgufConsistency, ContextLengthOutOfRange) {
  expect_refused(Rewrite(kStories).set_u32("llama.context_length", 0).bytes(),
                 {"metadata 'llama.context_length' is 0, expected 1 to 2147483647"});
  expect_refused(Rewrite(kStories).set_i32("llama.context_length", -1).bytes(),
                 {"metadata 'llama.context_length' is -1, expected 1 to"});
  expect_refused(Rewrite(kStories).set_u64("llama.context_length", ~uint64_t{0}).bytes(),
                 {"metadata 'llama.context_length' is 18446744073709551615, too large"});
  expect_refused(Rewrite(kStories).set_u64("llama.context_length", uint64_t{1} << 40).bytes(),
                 {"metadata 'llama.context_length' is 1099511627776, expected 1 to"});
}

TEST(GgufConsistency, RopeBaseAndEpsilonMustBeFiniteAndPositive) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {inf, -inf, nan, 0.0f, -10000.0f}) {
    SCOPED_TRACE(bad);
    expect_refused(Rewrite(kStories).set_f32("llama.rope.freq_base", bad).bytes(),
                   {"metadata 'llama.rope.freq_base' is ", "expected a finite number greater than 0"});
    expect_refused(Rewrite(kStories).set_f32("llama.attention.layer_norm_rms_epsilon", bad).bytes(),
                   {"metadata 'llama.attention.layer_norm_rms_epsilon' is "});
  }
  expect_refused(Rewrite(kStories).set_f32("llama.rope.freq_base", inf).bytes(), {"is +inf"});
}

TEST(GgufConsistency, Gemma2SlidingWindowOutOfRange) {
  for (int32_t bad : {0, -1}) {
    SCOPED_TRACE(bad);
    expect_refused(Rewrite(kGemma2).set_i32("gemma2.attention.sliding_window", bad).bytes(),
                   {"metadata 'gemma2.attention.sliding_window' is " + std::to_string(bad), "expected 1 to"});
  }
}

TEST(GgufConsistency, Gemma2SoftCapsMustBeFiniteAndPositive) {
  for (const char* key : {"gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"}) {
    for (float bad : {0.0f, std::numeric_limits<float>::quiet_NaN(), -30.0f}) {
      SCOPED_TRACE(std::string(key) + " " + std::to_string(bad));
      expect_refused(Rewrite(kGemma2).set_f32(key, bad).bytes(),
                     {"metadata '" + std::string(key) + "' is ", "expected a finite number greater than 0"});
    }
  }
}

TEST(GgufConsistency, HugeUserDefinedTokenIsRefusedQuickly) {
  const File f = File::open(kStories);
  auto tokens = f.get_strings("tokenizer.ggml.tokens");
  std::vector<int32_t> types = f.get_i32_array("tokenizer.ggml.token_type");
  const std::string huge(size_t{32} << 20, 'x');
  std::vector<std::string_view> t(tokens.begin(), tokens.end());
  t[400] = huge;
  types[400] = 4;  // user-defined
  const Bytes b =
      Rewrite(kStories)
          .set("tokenizer.ggml.tokens",
               [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const std::string_view>(t)); })
          .set("tokenizer.ggml.token_type",
               [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const int32_t>(types)); })
          .bytes();
  const auto start = std::chrono::steady_clock::now();
  // The file itself is 33 MiB; loading it may copy the vocabulary's text once, not a hundred times over.
  expect_refused(b, {"token 400 of tokenizer.ggml.tokens is 33554432 bytes long"}, size_t{40} << 20);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

TEST(GgufConsistency, ManyLongSpecialTokensAreRefused) {
  // Each token within the per-token bound, all of them together far past what the special-token tables take.
  const File f = File::open(kStories);
  std::vector<std::string> texts;
  for (int i = 0; i < 512; ++i) texts.push_back(std::to_string(i) + std::string(4000, 'y'));
  std::vector<int32_t> types(512, 4);
  const Bytes b =
      Rewrite(kStories)
          .set("tokenizer.ggml.tokens",
               [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const std::string>(texts)); })
          .set("tokenizer.ggml.token_type",
               [&](Writer& w, const std::string& k) { w.add_array(k, std::span<const int32_t>(types)); })
          .bytes();
  expect_refused(b, {"special (control, user-defined and unknown) tokens", "tokenizer.ggml.tokens",
                     "more than the 1048576 allowed"});
}

}  // namespace
