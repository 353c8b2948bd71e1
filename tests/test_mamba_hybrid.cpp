// A hybrid model (jamba: attention layers and Mamba-1 layers interleaved) in one cache with per-layer kinds:
// keys and values for the attention layers, a recurrent state for the others; with dense FFNs only
// (tiny-jamba-d64) and with mixture-of-experts FFNs on alternate layers (tiny-jamba-moe-d64). Each synthetic
// checkpoint is checked against an independent NumPy reference (tests/hybrid_reference.py, skipped with a
// message where NumPy is missing), the experts' one with and without renormalised weights; windows equal
// one-by-one decoding bit for bit; accept/reject rounds leave the state and the next logits of plain
// decoding; speculative greedy decoding equals plain greedy (with part of the experts resident, where there
// are any). The MoE layers are those whose router the file holds, and expert residency gives the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mamba_fixture.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/model/expert_residency.h"
#include "tandem/model/model.h"
#include "tandem/model/moe.h"
#include "tandem/model/session.h"
#include "tandem/model/synth.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/speculative/replay.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem {
namespace {

using mamba_fixture::accept_reject_rounds_equal_plain;
using mamba_fixture::accepting_part_of_a_window_needs_no_replay;
using mamba_fixture::expect_speculative_greedy_equals_plain;
using mamba_fixture::random_tokens;
using mamba_fixture::state_of;
using mamba_fixture::windows_equal_one_by_one;

constexpr const char* kDense = "tiny-jamba-d64";
constexpr const char* kMoe = "tiny-jamba-moe-d64";

// The F32 and Q8_0 files of each preset, written and loaded once per suite.
class HybridFiles : public ::testing::Test {
 protected:
  struct Files {
    std::unique_ptr<model::Model> f32, q8;
  };
  static void SetUpTestSuite() { dir_ = new testing::TempDir("tandem-hybrid"); }
  static void TearDownTestSuite() {
    delete files_;
    files_ = nullptr;
    delete dir_;
  }
  static std::string path(const std::string& preset, const std::string& type) {
    return dir_->file(preset + "-" + type + ".gguf");
  }
  static const Files& files(const std::string& preset) {
    if (files_ == nullptr) files_ = new std::map<std::string, Files>;
    Files& f = (*files_)[preset];
    if (!f.f32) {
      ThreadPool pool(2);
      const model::SynthPreset& p = model::find_synth_preset(preset);
      for (const char* type : {"F32", "Q8_0"})
        model::write_synthetic_model(p, model::find_file_type(type), path(preset, type), pool);
      f.f32 = model::Model::load(path(preset, "F32"));
      f.q8 = model::Model::load(path(preset, "Q8_0"));
    }
    return f;
  }
  static testing::TempDir* dir_;
  static std::map<std::string, Files>* files_;
};
testing::TempDir* HybridFiles::dir_ = nullptr;
std::map<std::string, HybridFiles::Files>* HybridFiles::files_ = nullptr;

// Tests of one preset's files.
class HybridModel : public HybridFiles {};

// Tests run on each preset: the dense hybrid and the one with experts.
class Hybrid : public HybridFiles, public ::testing::WithParamInterface<const char*> {
 protected:
  const model::Model& f32() const { return *files(GetParam()).f32; }
  const model::Model& q8() const { return *files(GetParam()).q8; }
};
INSTANTIATE_TEST_SUITE_P(Presets, Hybrid, ::testing::Values(kDense, kMoe),
                         [](const ::testing::TestParamInfo<const char*>& preset) {
                           return std::string(preset.param) == kDense ? std::string("Dense")
                                                                      : std::string("Experts");
                         });

model::SessionOptions options(cache::KvType kv = cache::KvType::kF16) {
  model::SessionOptions o;
  o.n_ctx = 256;
  o.kv_type = kv;
  return o;
}

TEST_F(HybridModel, LayersKeepTheirOwnCacheKinds) {
  const model::Model& m = *files(kDense).f32;
  const model::Config& c = m.config();
  EXPECT_EQ(c.arch, "jamba");
  ASSERT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.layer_recurrent, (std::vector<uint8_t>{1, 0, 1, 0}));  // attention at i % 2 == 1
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.n_rot, 0);
  EXPECT_EQ(c.ssm_d_inner, 128);
  EXPECT_EQ(c.moe.n_expert, 0);
  ThreadPool pool(1);
  model::Session s(m, pool, options(cache::KvType::kF32));
  ASSERT_NE(s.cache().recurrent(), nullptr);
  // Two Mamba layers of (3 * 128 conv inputs + 128 * 16 scan state) floats.
  EXPECT_EQ(s.cache().recurrent()->bytes_per_state(), size_t{2} * (3 * 128 + 128 * 16) * 4);
  // Two attention layers of 2 KV heads of 16, keys and values, in f32.
  EXPECT_EQ(s.cache().bytes_per_token(), size_t{2} * 2 * 2 * 16 * 4);
}

// The MoE hybrid as the reference converter writes Jamba: expert_count and expert_used_count only, the
// experts feed_forward_length wide, softmax routing without renormalisation, no shared expert; the odd layers
// hold routers and experts, the even ones dense FFNs, whichever mixer precedes them.
TEST_F(HybridModel, MoeLayersAreThoseWithARouter) {
  const model::Model& m = *files(kMoe).q8;
  const model::Config& c = m.config();
  ASSERT_EQ(c.n_layer, 6);
  EXPECT_EQ(c.layer_recurrent, (std::vector<uint8_t>{1, 0, 1, 1, 0, 1}));  // attention at i % 3 == 1
  EXPECT_EQ(c.layer_moe, (std::vector<uint8_t>{0, 1, 0, 1, 0, 1}));        // experts at i % 2 == 1
  EXPECT_EQ(c.moe.n_expert, 8);
  EXPECT_EQ(c.moe.n_expert_used, 2);
  EXPECT_EQ(c.moe.n_ff_expert, c.n_ff);
  EXPECT_EQ(c.moe.n_ff_shared, 0);
  EXPECT_EQ(c.moe.gating, model::ExpertGating::kSoftmax);
  EXPECT_FALSE(c.moe.norm_top_k);
  EXPECT_FALSE(c.moe.selection_bias);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    SCOPED_TRACE(i);
    const model::LayerWeights& l = m.weights().layers[static_cast<size_t>(i)];
    EXPECT_EQ(c.moe_layer(i), i % 2 == 1);
    EXPECT_EQ(!l.moe.empty(), i % 2 == 1);
    EXPECT_EQ(l.w_gate.empty(), i % 2 == 1);
    if (!l.moe.empty()) {
      EXPECT_EQ(l.moe.router.type, DType::F32);
      EXPECT_EQ(l.moe.gate.size(), 8u);
      EXPECT_TRUE(l.moe.shared_gate.empty());
    }
  }
  const model::ExpertBytes eb = model::expert_bytes(m);
  EXPECT_EQ(eb.moe_layers, 3);
  EXPECT_EQ(eb.routed_chosen * 4, eb.routed_all);  // 2 of 8 experts per token
}

// A copy of the MoE hybrid's F32 file through `edit`, which may change metadata (key, value) pairs and
// tensors: it returns false to drop one, and may add tensors to the writer.
struct FileEdit {
  std::function<void(gguf::Writer&, const std::string& key, const gguf::Value& value)> metadata;
  std::function<bool(gguf::Writer&, const gguf::TensorInfo& t)> tensor;
  std::function<void(gguf::Writer&, const gguf::File& in)> extra;
};
void copy_with(const std::string& from, const std::string& to, const FileEdit& edit) {
  const gguf::File in = gguf::File::open(from);
  gguf::Writer w;
  for (const auto& [key, value] : in.metadata()) {
    if (key == "general.alignment") continue;
    if (edit.metadata) {
      edit.metadata(w, key, value);
    } else {
      w.add_value(key, value);
    }
  }
  for (const gguf::TensorInfo& t : in.tensors()) {
    if (edit.tensor && !edit.tensor(w, t)) continue;
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + std::max(1, t.n_dims));
    w.add_tensor(t.name, t.type, ne, std::span<const uint8_t>(t.data, t.bytes));
  }
  if (edit.extra) edit.extra(w, in);
  w.write_file(to);
}

// Layer 1's experts replaced by a dense FFN (layer 0's, renamed): layer 1 becomes dense, the pattern of the
// others is kept. The tensors decide, not the layer's index.
TEST_F(HybridModel, TheTensorsDecideWhichLayersHaveExperts) {
  files(kMoe);
  const std::string out = dir_->file("moe-layer1-dense.gguf");
  FileEdit edit;
  edit.tensor = [](gguf::Writer&, const gguf::TensorInfo& t) {
    return !(t.name.starts_with("blk.1.ffn_") && t.name != "blk.1.ffn_norm.weight");
  };
  edit.extra = [](gguf::Writer& w, const gguf::File& in) {
    for (const char* part : {"ffn_gate", "ffn_up", "ffn_down"}) {
      const gguf::TensorInfo* t = in.tensor("blk.0." + std::string(part) + ".weight");
      ASSERT_NE(t, nullptr);
      w.add_tensor("blk.1." + std::string(part) + ".weight", t->type, {t->ne[0], t->ne[1]},
                   std::span<const uint8_t>(t->data, t->bytes));
    }
  };
  copy_with(path(kMoe, "F32"), out, edit);
  auto m = model::Model::load(out);
  EXPECT_EQ(m->config().layer_moe, (std::vector<uint8_t>{0, 0, 0, 1, 0, 1}));
  EXPECT_TRUE(m->weights().layers[1].moe.empty());
  EXPECT_FALSE(m->weights().layers[3].moe.empty());
  ThreadPool pool(1);
  model::Session s(*m, pool, options());
  const std::vector<int32_t> ids = {5, 60, 70, 80};
  for (float v : s.eval(ids)) ASSERT_TRUE(std::isfinite(v));
}

// Routers without expert_count, and experts without their router, are refused naming what is missing.
TEST_F(HybridModel, InconsistentExpertsAreRefused) {
  files(kMoe);
  const std::string out = dir_->file("moe-bad.gguf");
  FileEdit no_count;
  no_count.metadata = [](gguf::Writer& w, const std::string& key, const gguf::Value& value) {
    if (key != "jamba.expert_count") w.add_value(key, value);
  };
  FileEdit no_router;
  no_router.tensor = [](gguf::Writer&, const gguf::TensorInfo& t) {
    return t.name != "blk.3.ffn_gate_inp.weight";
  };
  const std::pair<FileEdit, std::string> cases[] = {{no_count, "jamba.expert_count"},
                                                    {no_router, "blk.3.ffn_gate_inp.weight"}};
  for (const auto& [edit, wanted] : cases) {
    copy_with(path(kMoe, "F32"), out, edit);
    try {
      model::Model::load(out);
      FAIL() << "a file lacking " << wanted << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(wanted), std::string::npos) << e.what();
    }
  }
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

// Our logits for every position of `tokens` (30 at once, then one at a time: prompt chunks and single decode
// steps both) against the reference's for `file`, which `m` was loaded from. Returns our logits.
std::vector<float> check_against_reference(const model::Model& m, const std::string& file,
                                           const std::vector<int32_t>& tokens, const std::string& python,
                                           const testing::TempDir& dir) {
  ThreadPool pool(2);
  const auto V = static_cast<size_t>(m.config().n_vocab);
  model::Session s(m, pool, options(cache::KvType::kF32));
  std::vector<float> ours;
  const auto first = s.eval(std::span<const int32_t>(tokens).first(30), true);
  ours.assign(first.begin(), first.end());
  for (size_t i = 30; i < tokens.size(); ++i) {
    const auto l = s.eval(std::span<const int32_t>(tokens).subspan(i, 1));
    ours.insert(ours.end(), l.begin(), l.end());
  }

  const std::string script = std::string(TANDEM_TESTS_DIR) + "/hybrid_reference.py";
  const std::string tokens_path = dir.file("tokens.txt"), out_path = dir.file("reference.f32");
  {
    std::ofstream f(tokens_path);
    for (int32_t t : tokens) f << t << ' ';
  }
  const auto [output, rc] = testing::run_command("'" + python + "' '" + script + "' '" + file + "' '" +
                                                 tokens_path + "' '" + out_path + "' 2>&1");
  EXPECT_EQ(rc, 0) << output;
  std::vector<float> ref(tokens.size() * V);
  {
    std::ifstream f(out_path, std::ios::binary);
    f.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * sizeof(float)));
    EXPECT_EQ(static_cast<size_t>(f.gcount()), ref.size() * sizeof(float)) << "short reference output";
  }
  float scale = 0.0f, worst = 0.0f;
  size_t argmax_agree = 0;
  for (size_t r = 0; r < tokens.size(); ++r) {
    size_t a = 0, b = 0;
    for (size_t i = 0; i < V; ++i) {
      const float x = ours[r * V + i], y = ref[r * V + i];
      EXPECT_TRUE(std::isfinite(x)) << "row " << r;
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
  return ours;
}

TEST_P(Hybrid, MatchesTheNumpyReference) {
  const std::string python = python_with_numpy();
  if (python.empty())
    GTEST_SKIP() << "no python3 with NumPy (Debian: apt-get install python3-numpy, or run "
                    "scripts/install-deps.sh; TANDEM_PYTHON names another interpreter)";
  std::mt19937 rng(17);
  const auto tokens = random_tokens(rng, 40, static_cast<int32_t>(f32().config().n_vocab));
  const std::vector<float> plain =
      check_against_reference(f32(), path(GetParam(), "F32"), tokens, python, *dir_);
  if (f32().config().moe.n_expert == 0) return;
  // The same file with jamba.expert_weights_norm set: the chosen experts' weights divided by their sum, by
  // both sides, which changes the logits.
  const std::string renormalised = dir_->file("renormalised.gguf");
  FileEdit edit;
  edit.metadata = [](gguf::Writer& w, const std::string& key, const gguf::Value& value) {
    w.add_value(key, value);
    if (key == "jamba.expert_used_count") w.add_bool("jamba.expert_weights_norm", true);
  };
  copy_with(path(GetParam(), "F32"), renormalised, edit);
  auto m = model::Model::load(renormalised);
  ASSERT_TRUE(m->config().moe.norm_top_k);
  const std::vector<float> normed = check_against_reference(*m, renormalised, tokens, python, *dir_);
  float differ = 0.0f;
  for (size_t i = 0; i < plain.size(); ++i) differ = std::max(differ, std::abs(plain[i] - normed[i]));
  EXPECT_GT(differ, 1e-2f) << "renormalising the experts' weights changed nothing";
}

// A window of w rows gives, row for row, the bits of the same tokens decoded one at a time.
TEST_P(Hybrid, WindowsEqualOneByOneDecodingBitForBit) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (const model::Model* m : {&f32(), &q8()}) {
    const auto tokens = random_tokens(rng, 33, static_cast<int32_t>(m->config().n_vocab));
    ASSERT_NO_FATAL_FAILURE(windows_equal_one_by_one(*m, pool, options(), tokens, {3, 8, 33}));
  }
}

// Drafted windows of w tokens of which k are accepted: the attention layers truncate their keys and values,
// the Mamba layers roll back their state, and the next logits are those of plain decoding.
TEST_P(Hybrid, AcceptRejectRoundsEqualPlainDecoding) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const model::Model& m = q8();
  model::Session spec(m, pool, options()), plain(m, pool, options());
  accept_reject_rounds_equal_plain(spec, plain, rng, 25);
}

// A verify window keeps each row's Mamba state: accepting k of its w rows (every k < w) restores row k's
// state at once, bit for bit that of decoding the k tokens one by one, and the next forward replays nothing
// and gives plain decoding's logits, the attention layers truncated alike.
TEST_P(Hybrid, AcceptingPartOfAWindowNeedsNoReplay) {
  ThreadPool pool(2);
  std::mt19937 rng(17);
  const model::Model& m = q8();
  accepting_part_of_a_window_needs_no_replay(m, pool, options(), rng);
}

// Plain decoding in a sequence set up without rollback (its Mamba layers keep one state and replay nothing)
// gives the bits of one with rollback: tokens, every step's logits and the state; a rollback of it is refused
// and changes nothing, neither the state nor the attention layers' positions.
TEST_P(Hybrid, PlainDecodingWithoutRollbackGivesTheSameBits) {
  ThreadPool pool(2);
  std::mt19937 rng(13);
  for (const model::Model* m : {&f32(), &q8()}) {
    const auto prompt = random_tokens(rng, 11, static_cast<int32_t>(m->config().n_vocab));
    model::SessionOptions off = options();
    off.rollback = false;
    model::Session with(*m, pool, options()), without(*m, pool, off);
    ASSERT_EQ(without.cache().recurrent()->depth(), 0);
    std::vector<int32_t> tokens_with, tokens_without;
    std::vector<float> logits_with, logits_without;
    const auto step = [](model::Session& s, std::span<const int32_t> in, std::vector<int32_t>& tokens,
                         std::vector<float>& logits) {
      const auto l = s.eval(in);
      logits.insert(logits.end(), l.begin(), l.end());
      tokens.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
    };
    step(with, prompt, tokens_with, logits_with);
    step(without, prompt, tokens_without, logits_without);
    for (int i = 0; i < 36; ++i) {  // past the rows a rollback base is kept for
      step(with, std::span<const int32_t>(&tokens_with.back(), 1), tokens_with, logits_with);
      step(without, std::span<const int32_t>(&tokens_without.back(), 1), tokens_without, logits_without);
    }
    EXPECT_EQ(tokens_with, tokens_without);
    ASSERT_EQ(logits_with.size(), logits_without.size());
    EXPECT_EQ(std::memcmp(logits_with.data(), logits_without.data(), logits_with.size() * sizeof(float)), 0);
    EXPECT_EQ(state_of(with), state_of(without));

    const int64_t length = without.length();
    const std::vector<float> before = state_of(without);
    EXPECT_THROW(without.truncate(length - 1), Error);
    EXPECT_EQ(without.length(), length);
    EXPECT_EQ(state_of(without), before);
    const int32_t next = tokens_with.back();
    const auto a = with.eval(std::span<const int32_t>(&next, 1));
    const std::vector<float> expected(a.begin(), a.end());
    const auto b = without.eval(std::span<const int32_t>(&next, 1));
    EXPECT_EQ(std::memcmp(expected.data(), b.data(), b.size() * sizeof(float)), 0);
  }
}

TEST_P(Hybrid, SpeculativeGreedyEqualsPlainGreedy) {
  ThreadPool pool(1);
  std::mt19937 rng(5);
  constexpr int64_t kTokens = 24;
  const model::Model& target = q8();
  speculative::DraftModelSource draft(f32(), target, pool, options());
  speculative::NgramSource ngram({1, 4});
  speculative::ReplaySource replay(0.7, target.config().n_vocab, 3);
  // With experts, half of them resident and rebalanced every few reads, so copies come and go between and
  // within speculative rounds.
  std::unique_ptr<model::ExpertResidency> residency;
  if (target.config().moe.n_expert > 0)
    residency =
        std::make_unique<model::ExpertResidency>(target, model::expert_bytes(target).routed_all / 2, 7);
  expect_speculative_greedy_equals_plain(target, pool, options(), rng,
                                         static_cast<int32_t>(target.config().n_vocab), kTokens, draft, ngram,
                                         replay, residency.get());
  if (residency) {
    EXPECT_GT(residency->stats().resident_reads, 0u);
  }
}

// --expert-budget on the MoE hybrid: with half the routed experts' bytes resident and a rebalance every few
// reads, prefill and decode give the bits of a run without a budget.
TEST_F(HybridModel, ExpertBudgetGivesTheSameBits) {
  const model::Model& m = *files(kMoe).q8;
  ThreadPool pool(2);
  const auto V = static_cast<size_t>(m.config().n_vocab);
  model::ExpertResidency residency(m, model::expert_bytes(m).routed_all / 2, /*rebalance_every=*/5);
  ASSERT_GT(residency.slots(), 0);
  std::mt19937 rng(23);
  const auto prompt = random_tokens(rng, 20, static_cast<int32_t>(V));
  model::Session with(m, pool, options()), without(m, pool, options());
  with.forward().set_expert_residency(&residency);
  const auto a = with.eval(prompt, true);
  const std::vector<float> got(a.begin(), a.end());
  const auto b = without.eval(prompt, true);
  ASSERT_EQ(std::memcmp(got.data(), b.data(), got.size() * sizeof(float)), 0);
  for (int32_t t : random_tokens(rng, 12, static_cast<int32_t>(V))) {
    const auto x = with.eval(std::span<const int32_t>(&t, 1));
    const std::vector<float> row(x.begin(), x.end());
    const auto y = without.eval(std::span<const int32_t>(&t, 1));
    ASSERT_EQ(std::memcmp(row.data(), y.data(), V * sizeof(float)), 0);
  }
  const model::ResidencyStats st = residency.stats();
  EXPECT_GT(st.resident_reads, 0u);
  EXPECT_LT(st.resident_reads, st.reads);
  EXPECT_LE(st.resident_bytes, st.budget_bytes);
}

// Per-layer KV head counts that do not cover the layers are refused, naming the key.
TEST_F(HybridModel, HeadCountArrayMustCoverEveryLayer) {
  files(kDense);
  const gguf::File in = gguf::File::open(path(kDense, "F32"));
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
