// A hybrid model (jamba: attention layers and Mamba-1 layers interleaved) in one cache with per-layer kinds:
// keys and values for the attention layers, a recurrent state for the others. The synthetic checkpoint is
// checked against an independent NumPy reference (tests/hybrid_reference.py, skipped with a message where
// NumPy is missing); windows equal one-by-one decoding bit for bit; accept/reject rounds leave the state and
// the next logits of plain decoding; speculative greedy decoding equals plain greedy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/model/synth.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem {
namespace {

class Hybrid : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("tandem-hybrid");
    ThreadPool pool(2);
    const model::SynthPreset& p = model::find_synth_preset("tiny-jamba-d64");
    for (const char* type : {"F32", "Q8_0"})
      model::write_synthetic_model(p, model::find_file_type(type), path(type), pool);
    f32_ = model::Model::load(path("F32")).release();
    q8_ = model::Model::load(path("Q8_0")).release();
  }
  static void TearDownTestSuite() {
    delete f32_;
    delete q8_;
    delete dir_;
  }
  static std::string path(const std::string& type) { return dir_->file("tiny-jamba-" + type + ".gguf"); }
  static testing::TempDir* dir_;
  static model::Model* f32_;
  static model::Model* q8_;
};
testing::TempDir* Hybrid::dir_ = nullptr;
model::Model* Hybrid::f32_ = nullptr;
model::Model* Hybrid::q8_ = nullptr;

model::SessionOptions options(cache::KvType kv = cache::KvType::kF16) {
  model::SessionOptions o;
  o.n_ctx = 256;
  o.kv_type = kv;
  return o;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// Every recurrent layer's conv and scan state after the sequence's current length (as a forward leaves it:
// a rollback's state is rebuilt by the next forward).
std::vector<float> state_of(model::Session& s) {
  const cache::RecurrentState* st = s.cache().recurrent();
  std::vector<float> out;
  EXPECT_EQ(st->current(), s.length());
  const auto conv = static_cast<size_t>((st->d_conv() - 1) * st->d_inner());
  const auto ssm = static_cast<size_t>(st->d_inner() * st->d_state());
  for (int64_t l = 0; l < s.model().config().n_layer; ++l) {
    if (!s.model().config().recurrent(l)) continue;
    out.insert(out.end(), st->conv(l, cache::RecurrentState::Slot::kCurrent),
               st->conv(l, cache::RecurrentState::Slot::kCurrent) + conv);
    out.insert(out.end(), st->ssm(l, cache::RecurrentState::Slot::kCurrent),
               st->ssm(l, cache::RecurrentState::Slot::kCurrent) + ssm);
  }
  return out;
}

TEST_F(Hybrid, LayersKeepTheirOwnCacheKinds) {
  const model::Config& c = f32_->config();
  EXPECT_EQ(c.arch, "jamba");
  ASSERT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.layer_recurrent, (std::vector<uint8_t>{1, 0, 1, 0}));  // attention at i % 2 == 1
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.n_rot, 0);
  EXPECT_EQ(c.ssm_d_inner, 128);
  ThreadPool pool(1);
  model::Session s(*f32_, pool, options(cache::KvType::kF32));
  ASSERT_NE(s.cache().recurrent(), nullptr);
  // Two Mamba layers of (3 * 128 conv inputs + 128 * 16 scan state) floats.
  EXPECT_EQ(s.cache().recurrent()->bytes_per_state(), size_t{2} * (3 * 128 + 128 * 16) * 4);
  // Two attention layers of 2 KV heads of 16, keys and values, in f32.
  EXPECT_EQ(s.cache().bytes_per_token(), size_t{2} * 2 * 2 * 16 * 4);
}

// The engine's logits for every position against the NumPy reference's (float64, written from the model's
// definition). F32 weights and an F32 cache, so that only the order of float operations differs.
// The Python that runs the reference: $TANDEM_PYTHON, else the first of python3 on the PATH and Debian's
// system interpreter (where python3-numpy installs) that imports NumPy; empty when none does.
std::string python_with_numpy() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("TANDEM_PYTHON")) candidates.emplace_back(env);
  candidates.emplace_back("python3");
  candidates.emplace_back("/usr/bin/python3");
  for (const std::string& python : candidates)
    if (testing::run_command("'" + python + "' -c 'import numpy' >/dev/null 2>&1").second == 0) return python;
  return {};
}

TEST_F(Hybrid, MatchesTheNumpyReference) {
  const std::string script = std::string(TANDEM_TESTS_DIR) + "/hybrid_reference.py";
  const std::string python = python_with_numpy();
  if (python.empty())
    GTEST_SKIP() << "no python3 with NumPy (Debian: apt-get install python3-numpy, or run "
                    "scripts/install-deps.sh; TANDEM_PYTHON names another interpreter)";
  ThreadPool pool(2);
  std::mt19937 rng(17);
  const auto V = static_cast<size_t>(f32_->config().n_vocab);
  const auto tokens = random_tokens(rng, 40, static_cast<int32_t>(V));
  model::Session s(*f32_, pool, options(cache::KvType::kF32));
  // Prompt chunks and single decode steps both: 30 tokens at once, then one at a time.
  std::vector<float> ours;
  const auto first = s.eval(std::span<const int32_t>(tokens).first(30), true);
  ours.assign(first.begin(), first.end());
  for (size_t i = 30; i < tokens.size(); ++i) {
    const auto l = s.eval(std::span<const int32_t>(tokens).subspan(i, 1));
    ours.insert(ours.end(), l.begin(), l.end());
  }

  const std::string tokens_path = dir_->file("tokens.txt"), out_path = dir_->file("reference.f32");
  {
    std::ofstream f(tokens_path);
    for (int32_t t : tokens) f << t << ' ';
  }
  const auto [output, rc] = testing::run_command("'" + python + "' '" + script + "' '" + path("F32") + "' '" +
                                                 tokens_path + "' '" + out_path + "' 2>&1");
  ASSERT_EQ(rc, 0) << output;
  std::vector<float> ref(tokens.size() * V);
  {
    std::ifstream f(out_path, std::ios::binary);
    f.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * sizeof(float)));
    ASSERT_EQ(static_cast<size_t>(f.gcount()), ref.size() * sizeof(float)) << "short reference output";
  }
  float scale = 0.0f, worst = 0.0f;
  size_t argmax_agree = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    size_t a = 0, b = 0;
    for (size_t i = 0; i < V; ++i) {
      const float x = ours[r * V + i], y = ref[r * V + i];
      ASSERT_TRUE(std::isfinite(x)) << "row " << r;
      scale = std::max(scale, std::abs(y));
      worst = std::max(worst, std::abs(x - y));
      if (x > ours[r * V + a]) a = i;
      if (y > ref[r * V + b]) b = i;
    }
    argmax_agree += a == b ? 1 : 0;
  }
  EXPECT_GT(scale, 0.5f) << "the reference's logits are degenerate";
  EXPECT_LT(worst, 1e-4f * (1.0f + scale)) << "largest logit " << scale;
  EXPECT_EQ(argmax_agree, tokens.size());
}

// A window of w rows gives, row for row, the bits of the same tokens decoded one at a time.
TEST_F(Hybrid, WindowsEqualOneByOneDecodingBitForBit) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (const model::Model* m : {f32_, q8_}) {
    const auto V = static_cast<size_t>(m->config().n_vocab);
    const auto tokens = random_tokens(rng, 33, static_cast<int32_t>(V));
    model::Session plain(*m, pool, options());
    std::vector<float> expected;
    for (int32_t t : tokens) {
      const auto l = plain.eval(std::span<const int32_t>(&t, 1));
      expected.insert(expected.end(), l.begin(), l.end());
    }
    for (size_t w : {size_t{3}, size_t{8}, size_t{33}}) {
      model::Session window(*m, pool, options());
      for (size_t b = 0; b < tokens.size(); b += w) {
        const size_t n = std::min(w, tokens.size() - b);
        const auto l = window.eval(std::span<const int32_t>(tokens).subspan(b, n), true);
        ASSERT_EQ(std::memcmp(l.data(), expected.data() + b * V, n * V * sizeof(float)), 0)
            << "window of " << w << " at " << b;
      }
      EXPECT_EQ(state_of(window), state_of(plain)) << "window of " << w;
    }
  }
}

// Drafted windows of w tokens of which k are accepted: the attention layers truncate their keys and values,
// the Mamba layers roll back their state, and the next logits are those of plain decoding.
TEST_F(Hybrid, AcceptRejectRoundsEqualPlainDecoding) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const model::Model& m = *q8_;
  const auto V = static_cast<int32_t>(m.config().n_vocab);
  model::Session spec(m, pool, options()), plain(m, pool, options());
  const auto prompt = random_tokens(rng, 9, V);
  spec.eval(prompt);
  plain.eval(prompt);
  std::uniform_int_distribution<int> width(1, 9);
  for (int round = 0; round < 25; ++round) {
    const int w = width(rng);
    const int k = std::uniform_int_distribution<int>(0, w)(rng);
    const auto draft = random_tokens(rng, static_cast<size_t>(w), V);
    const int64_t base = spec.length();
    spec.eval(draft, true);
    spec.truncate(base + k);
    if (k > 0) plain.eval(std::span<const int32_t>(draft).first(static_cast<size_t>(k)), true);
    ASSERT_EQ(spec.length(), plain.length());
    // One more token on both: its logits and the state after it come from the rebuilt state.
    const int32_t next = random_tokens(rng, 1, V)[0];
    const auto a = spec.eval(std::span<const int32_t>(&next, 1));
    const std::vector<float> from_spec(a.begin(), a.end());
    const auto b = plain.eval(std::span<const int32_t>(&next, 1));
    ASSERT_EQ(std::memcmp(from_spec.data(), b.data(), b.size() * sizeof(float)), 0) << "round " << round;
    ASSERT_EQ(state_of(spec), state_of(plain)) << "round " << round << ": " << k << " of " << w;
  }
  const auto probe = random_tokens(rng, 3, V);
  const auto a = spec.eval(probe, true);
  const std::vector<float> from_spec(a.begin(), a.end());
  const auto b = plain.eval(probe, true);
  EXPECT_EQ(std::memcmp(from_spec.data(), b.data(), b.size() * sizeof(float)), 0);
}

std::vector<int32_t> plain_greedy(const model::Model& m, ThreadPool& pool, std::span<const int32_t> prompt,
                                  int64_t n) {
  model::Session s(m, pool, options());
  engine::GenerateOptions g;
  g.max_tokens = n;
  g.sampling.temperature = 0.0f;
  std::vector<int32_t> out;
  engine::generate(
      s, prompt, g, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
  return out;
}

TEST_F(Hybrid, SpeculativeGreedyEqualsPlainGreedy) {
  ThreadPool pool(1);
  std::mt19937 rng(5);
  constexpr int64_t kTokens = 24;
  speculative::DraftModelSource draft(*f32_, *q8_, pool, options());
  speculative::NgramSource ngram({1, 4});
  speculative::DraftSource* sources[] = {&draft, &ngram};
  engine::SpecStats total;
  for (int p = 0; p < 3; ++p) {
    auto prompt = random_tokens(rng, 6, static_cast<int32_t>(q8_->config().n_vocab));
    prompt.insert(prompt.end(), prompt.begin(), prompt.end());  // repeats for the n-gram drafter to find
    const auto plain = plain_greedy(*q8_, pool, prompt, kTokens);
    for (speculative::DraftSource* source : sources) {
      for (int depth : {1, 3, 8}) {
        model::Session s(*q8_, pool, options());
        engine::SpecOptions o;
        o.generate.max_tokens = kTokens;
        o.generate.sampling.temperature = 0.0f;
        o.draft_max = depth;
        o.use_gate = false;
        std::vector<int32_t> out;
        total.add(engine::generate_speculative(
            s, *source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr));
        ASSERT_EQ(out, plain) << source->kind() << " depth " << depth;
      }
    }
  }
  EXPECT_GT(total.accepted, 0);
  EXPECT_LT(total.accepted, total.drafted);
}

// Per-layer KV head counts that do not cover the layers are refused, naming the key.
TEST_F(Hybrid, HeadCountArrayMustCoverEveryLayer) {
  const gguf::File in = gguf::File::open(path("F32"));
  for (const std::vector<int32_t>& heads :
       {std::vector<int32_t>{0, 2, 0}, std::vector<int32_t>{0, 3, 0, 2}}) {
    gguf::Writer w;
    for (const auto& [key, value] : in.metadata()) {
      if (key == "general.alignment") continue;
      if (key == "jamba.attention.head_count_kv") {
        w.add_array(key, std::span<const int32_t>(heads));
        continue;
      }
      w.add_value(key, value);
    }
    for (const gguf::TensorInfo& t : in.tensors()) {
      std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::max(1, t.n_dims));
      w.add_tensor(t.name, t.type, ne, std::span<const uint8_t>(t.data, t.bytes));
    }
    const std::string bad = dir_->file("bad.gguf");
    w.write_file(bad);
    try {
      model::Model::load(bad);
      FAIL() << "head_count_kv of " << heads.size() << " entries was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("jamba.attention.head_count_kv"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tandem
