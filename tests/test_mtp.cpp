// The checkpoint's own next-token-prediction (MTP) layer as a drafter: a DeepSeek-V3-style synthetic
// deepseek2 file with one MTP layer loads with the layer kept out of the main forward; the layer's logits
// match an independent NumPy reference (tests/mtp_reference.py, skipped with a message where NumPy is
// missing); speculative greedy decoding with --draft mtp equals plain greedy at depths 1 and 3; the drafter
// rolls back with rejections; files without MTP layers are refused, by the source and by the CLI; `serve`
// refuses draft trees from it at start. Speculative greedy equals plain greedy on a file whose up-projections
// are split per head too.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "greedy_fixture.h"
#include "tandem/cache/kv_cache.h"
#include "tandem/engine/cache_pool.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/engine/scheduler.h"
#include "tandem/model/forward.h"
#include "tandem/model/graph.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/model/synth.h"
#include "tandem/speculative/calibration.h"
#include "tandem/speculative/mtp_draft.h"
#include "tandem/util/error.h"
#include "test_util.h"

namespace tandem {
namespace {

class Mtp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("tandem-mtp");
    ThreadPool pool(2);
    const model::SynthPreset& p = model::find_synth_preset("tiny-deepseek-v3-d64");
    for (const char* type : {"F32", "Q8_0"})
      model::write_synthetic_model(p, model::find_file_type(type), path(type), pool);
    // The same main weights (rows are generated from the tensor names) without the MTP layer.
    model::write_synthetic_model(model::with_mtp_layers(p, 0), model::find_file_type("F32"),
                                 path("F32-plain"), pool);
    // The up-projection split per head (attn_k_b, attn_v_b), in the MTP layer too.
    model::write_synthetic_model(model::with_split_kv_b(p), model::find_file_type("Q8_0"), path("Q8_0-split"),
                                 pool);
    f32_ = model::Model::load(path("F32")).release();
    q8_ = model::Model::load(path("Q8_0")).release();
  }
  static void TearDownTestSuite() {
    delete f32_;
    delete q8_;
    delete dir_;
  }
  static std::string path(const std::string& type) {
    return dir_->file("tiny-deepseek-v3-" + type + ".gguf");
  }
  static testing::TempDir* dir_;
  static model::Model* f32_;
  static model::Model* q8_;
};
testing::TempDir* Mtp::dir_ = nullptr;
model::Model* Mtp::f32_ = nullptr;
model::Model* Mtp::q8_ = nullptr;

model::SessionOptions options(cache::KvType kv = cache::KvType::kF16) {
  model::SessionOptions o;
  o.n_ctx = 256;
  o.kv_type = kv;
  return o;
}

using greedy_fixture::random_tokens;

// The main model's final hidden states (the last main layer's residual output, before the output norm) of
// every token, [tokens, n_embd], evaluated in chunks of `chunk`.
std::vector<float> final_hidden(const model::Model& m, ThreadPool& pool, std::span<const int32_t> tokens,
                                size_t chunk = 256) {
  model::Session s(m, pool, options(cache::KvType::kF32));
  std::vector<float> out;
  const int64_t last = m.config().n_layer - 1;
  const model::CaptureFn capture = [&](int64_t layer, const float* hidden, int64_t n_rows) {
    if (layer == last) out.insert(out.end(), hidden, hidden + n_rows * m.config().n_embd);
  };
  for (size_t b = 0; b < tokens.size(); b += chunk)
    s.eval(tokens.subspan(b, std::min(chunk, tokens.size() - b)), false, &capture);
  return out;
}

TEST_F(Mtp, LoadsTheMtpLayerApartFromTheMainLayers) {
  const model::Config& c = f32_->config();
  EXPECT_EQ(c.arch, "deepseek2");
  EXPECT_EQ(c.n_layer, 3);  // block_count 4 counts the MTP layer
  EXPECT_EQ(c.n_mtp, 1);
  EXPECT_EQ(f32_->file().get_int("deepseek2.block_count").value_or(0), 4);
  EXPECT_EQ(c.kv_geometry().n_layer, 3);
  EXPECT_EQ(c.mtp_kv_geometry().n_layer, 1);
  EXPECT_EQ(c.moe.gating, model::ExpertGating::kSigmoid);
  EXPECT_TRUE(c.moe.selection_bias);
  ASSERT_EQ(f32_->weights().layers.size(), 3u);
  ASSERT_EQ(f32_->weights().mtp.size(), 1u);
  const model::MtpWeights& m = f32_->weights().mtp[0];
  EXPECT_FALSE(m.block.moe.empty());  // past the leading dense layer: routed and shared experts
  EXPECT_FALSE(m.block.moe.selection_bias.empty());
  EXPECT_FALSE(m.block.mla.wq_a.empty());
  EXPECT_EQ(m.eh_proj.cols, 2 * c.n_embd);
  EXPECT_EQ(m.eh_proj.rows, c.n_embd);
  EXPECT_FALSE(m.head_norm.empty());
  EXPECT_TRUE(m.embed.empty());  // the main embedding and head are shared
  EXPECT_TRUE(m.head.empty());

  auto plain = model::Model::load(path("F32-plain"));
  EXPECT_EQ(plain->config().n_mtp, 0);
  EXPECT_EQ(plain->config().n_layer, 3);
  EXPECT_TRUE(plain->weights().mtp.empty());
}

// The main forward never runs the MTP layer: the file with it gives the bits of the file without it.
TEST_F(Mtp, MainForwardIgnoresTheMtpLayer) {
  ThreadPool pool(2);
  auto plain = model::Model::load(path("F32-plain"));
  std::mt19937 rng(3);
  const auto tokens = random_tokens(rng, 20, static_cast<int32_t>(f32_->config().n_vocab));
  model::Session a(*f32_, pool, options()), b(*plain, pool, options());
  const auto la = a.eval(tokens, true);
  const std::vector<float> from_mtp_file(la.begin(), la.end());
  const auto lb = b.eval(tokens, true);
  ASSERT_EQ(from_mtp_file.size(), lb.size());
  EXPECT_EQ(std::memcmp(from_mtp_file.data(), lb.data(), lb.size() * sizeof(float)), 0);
}

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

// The MTP layer's logits at every position (the target's hidden state at t and token t + 1) against the
// NumPy reference's (float64, from the model's definition), F32 weights and an F32 cache, the rows run as a
// chunk and then one at a time.
TEST_F(Mtp, MtpLogitsMatchTheNumpyReference) {
  const std::string script = std::string(TANDEM_TESTS_DIR) + "/mtp_reference.py";
  const std::string python = python_with_numpy();
  if (python.empty())
    GTEST_SKIP() << "no python3 with NumPy (Debian: apt-get install python3-numpy, or run "
                    "scripts/install-deps.sh; TANDEM_PYTHON names another interpreter)";
  ThreadPool pool(2);
  const model::Config& c = f32_->config();
  std::mt19937 rng(19);
  const auto V = static_cast<size_t>(c.n_vocab);
  const auto tokens = random_tokens(rng, 28, static_cast<int32_t>(V));
  const std::vector<float> hidden = final_hidden(*f32_, pool, tokens, 10);
  ASSERT_EQ(hidden.size(), tokens.size() * static_cast<size_t>(c.n_embd));

  const size_t n = tokens.size() - 1;  // positions 0 .. T-2 have a next token
  model::Forward fwd(*f32_, pool, 32);
  cache::KvCache cache(c.mtp_kv_geometry(), 64, cache::KvType::kF32);
  cache::KvCache* caches[] = {&cache};
  std::vector<float> ours(n * V);
  constexpr size_t kChunk = 20;
  std::vector<model::Row> rows;
  for (size_t t = 0; t < n; ++t) rows.push_back({tokens[t + 1], static_cast<int64_t>(t), 0, true});
  fwd.run_mtp(0, std::span<const model::Row>(rows).first(kChunk), hidden.data(), caches, ours.data());
  for (size_t t = kChunk; t < n; ++t)
    fwd.run_mtp(0, std::span<const model::Row>(rows).subspan(t, 1), hidden.data() + t * c.n_embd, caches,
                ours.data() + t * V);
  EXPECT_EQ(cache.length(), static_cast<int64_t>(n));

  const std::string tokens_path = dir_->file("tokens.txt"), out_path = dir_->file("reference.f32");
  {
    std::ofstream f(tokens_path);
    for (int32_t t : tokens) f << t << ' ';
  }
  const auto [output, rc] = testing::run_command("'" + python + "' '" + script + "' '" + path("F32") + "' '" +
                                                 tokens_path + "' '" + out_path + "' 2>&1");
  ASSERT_EQ(rc, 0) << output;
  std::vector<float> ref(n * V);
  {
    std::ifstream f(out_path, std::ios::binary);
    f.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * sizeof(float)));
    ASSERT_EQ(static_cast<size_t>(f.gcount()), ref.size() * sizeof(float)) << "short reference output";
  }
  float scale = 0.0f, worst = 0.0f;
  size_t argmax_agree = 0;
  for (size_t r = 0; r < n; ++r) {
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
  EXPECT_EQ(argmax_agree, n);
}

// A source that drafted, was partly rejected and drafted again proposes what a fresh source proposes for
// the same committed text: its cache rolls back to the real rows.
TEST_F(Mtp, ProposalsAfterRejectionsEqualAFreshSource) {
  ThreadPool pool(2);
  const model::Model& m = *q8_;
  std::mt19937 rng(23);
  const auto text = random_tokens(rng, 40, static_cast<int32_t>(m.config().n_vocab));
  const std::vector<float> hidden = final_hidden(m, pool, text);
  const int64_t last = m.config().n_layer - 1, d = m.config().n_embd;
  speculative::DraftSettings settings;
  settings.sampling.temperature = 0.0f;
  // The target has evaluated every committed token but the last.
  const auto feed = [&](speculative::MtpDraftSource& s, size_t from, size_t to) {
    s.on_target_hidden(last, std::span<const float>(hidden).subspan(from * d, (to - from) * d),
                       static_cast<int64_t>(to - from), static_cast<int64_t>(from));
  };
  speculative::MtpDraftSource kept(m, pool, 128);
  kept.begin(std::span<const int32_t>(text).first(10), settings);
  size_t n = 10;
  feed(kept, 0, n - 1);
  speculative::Draft draft, fresh_draft;
  for (size_t step : {size_t{1}, size_t{3}, size_t{0}, size_t{2}, size_t{5}}) {
    const auto committed = std::span<const int32_t>(text).first(n);
    kept.propose(committed, 4, draft);
    ASSERT_EQ(draft.tokens.size(), 4u);
    EXPECT_EQ(kept.cache_length(), static_cast<int64_t>(n + 2));  // real rows to n - 2, drafts to n + 1
    speculative::MtpDraftSource fresh(m, pool, 128);
    fresh.begin(committed, settings);
    feed(fresh, 0, n - 1);
    fresh.propose(committed, 4, fresh_draft);
    EXPECT_EQ(draft.tokens, fresh_draft.tokens) << "at " << n;
    ASSERT_EQ(kept.last_logits().size(), fresh.last_logits().size());
    EXPECT_EQ(std::memcmp(kept.last_logits().data(), fresh.last_logits().data(),
                          kept.last_logits().size() * sizeof(float)),
              0)
        << "at " << n;
    // The round keeps `step` tokens of the text (not the drafts): the next proposal rolls back.
    n += step + 1;
    kept.accept(std::span<const int32_t>(text).first(n), 0);
    feed(kept, n - step - 2, n - 1);
  }
}

std::vector<int32_t> plain_greedy(const model::Model& m, ThreadPool& pool, std::span<const int32_t> prompt,
                                  int64_t n) {
  return greedy_fixture::plain_greedy(m, pool, options(), prompt, n);
}

// Speculative greedy decoding drafted by the MTP layer equals plain greedy decoding, chained or not; the
// tokens per target forward are recorded (random weights: acceptance is low).
TEST_F(Mtp, SpeculativeGreedyEqualsPlainGreedy) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  constexpr int64_t kTokens = 24;
  for (const model::Model* m : {f32_, q8_}) {
    speculative::MtpDraftSource source(*m, pool, 256);
    for (int depth : {1, 3}) {
      engine::SpecStats total;
      for (int p = 0; p < 3; ++p) {
        const auto prompt = random_tokens(rng, 8, static_cast<int32_t>(m->config().n_vocab));
        const auto plain = plain_greedy(*m, pool, prompt, kTokens);
        model::Session s(*m, pool, options());
        const auto out = greedy_fixture::speculative_greedy(s, source, prompt, kTokens, depth, total);
        ASSERT_EQ(out, plain) << "depth " << depth;
      }
      EXPECT_GT(total.drafted, 0);
      EXPECT_LE(total.accepted, total.drafted);
      EXPECT_GE(total.tokens_per_forward(), 1.0);
      std::printf("mtp drafter, %s, depth %d: %lld of %lld drafts accepted, %.3f tokens per target forward\n",
                  m == f32_ ? "F32" : "Q8_0", depth, static_cast<long long>(total.accepted),
                  static_cast<long long>(total.drafted), total.tokens_per_forward());
      RecordProperty(
          std::string(m == f32_ ? "f32" : "q8_0") + "_depth" + std::to_string(depth) + "_tokens_per_forward",
          std::to_string(total.tokens_per_forward()));
    }
  }
}

// The same on a file whose up-projections are split per head (the MTP layer's too), with quantized split
// tensors (their F16 copies).
TEST_F(Mtp, SpeculativeGreedyEqualsPlainGreedyOnASplitFile) {
  ThreadPool pool(2);
  std::mt19937 rng(6);
  auto m = model::Model::load(path("Q8_0-split"));
  ASSERT_EQ(m->weights().mtp.size(), 1u);
  ASSERT_TRUE(m->weights().mtp[0].block.mla.split());
  speculative::MtpDraftSource source(*m, pool, 256);
  engine::SpecStats total;
  for (int p = 0; p < 2; ++p) {
    const auto prompt = random_tokens(rng, 8, static_cast<int32_t>(m->config().n_vocab));
    const auto plain = plain_greedy(*m, pool, prompt, 16);
    model::Session s(*m, pool, options());
    engine::SpecOptions o;
    o.generate.max_tokens = 16;
    o.generate.sampling.temperature = 0.0f;
    o.draft_max = 2;
    o.use_gate = false;
    std::vector<int32_t> out;
    total.add(engine::generate_speculative(
        s, source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr));
    ASSERT_EQ(out, plain);
  }
  EXPECT_GT(total.drafted, 0);
}

// In the server's scheduler, four concurrent greedy requests drafted by their own MTP sources (fed by the
// scheduler's captures of prompt chunks, decode rows and verify windows) give each request's plain greedy
// output; every round drafts (flat costs, no margin).
TEST_F(Mtp, SchedulerOutputWithTheMtpDrafterEqualsPlain) {
  ThreadPool pool(2);
  const model::Model& m = *q8_;
  constexpr int64_t kCtx = 256;
  std::mt19937 rng(31);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t n : {size_t{3}, size_t{20}, size_t{40}, size_t{70}})
    prompts.push_back(random_tokens(rng, n, static_cast<int32_t>(m.config().n_vocab)));
  // Plain outputs first: the scheduler's thread shares the pool while it runs.
  std::vector<std::vector<int32_t>> plain;
  for (const auto& prompt : prompts) plain.push_back(plain_greedy(m, pool, prompt, 20));
  model::Graph graph(m, pool, model::GraphOptions{64, 16});
  engine::SchedulerOptions o;
  o.max_running = 4;
  o.max_waiting = 4;
  o.max_rows = 64;
  o.max_draft = 3;
  o.gate.margin = 0.0;
  o.gate.timing_samples = 1 << 30;
  engine::SlotCachePool caches(m.config(), kCtx, cache::KvType::kF16, o.max_running);
  engine::Scheduler s(graph, caches, nullptr, o,
                      [&] { return std::make_unique<speculative::MtpDraftSource>(m, pool, kCtx); });
  std::vector<std::shared_ptr<engine::Stream>> streams;
  for (const auto& prompt : prompts) {
    engine::Request r;
    r.prompt = prompt;
    r.max_tokens = 20;
    r.sampling.temperature = 0.0f;
    r.stop_at_eog = false;
    engine::Scheduler::Admit a{};
    std::string why;
    streams.push_back(s.submit(std::move(r), a, &why));
    ASSERT_EQ(a, engine::Scheduler::Admit::kOk) << why;
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> tokens;
    engine::Event ev;
    while (streams[i]->next(ev, std::chrono::milliseconds(60000)) && ev.kind == engine::Event::Kind::kToken)
      tokens.push_back(ev.token.id);
    EXPECT_NE(ev.finish, engine::Finish::kError) << ev.error;
    EXPECT_EQ(tokens, plain[i]) << "request " << i;
  }
  s.stop();
  const engine::SchedulerStats stats = s.stats();
  uint64_t drafted = 0;
  for (const auto& d : stats.drafters)
    if (d.kind == speculative::kMtpKind) drafted += d.drafted;
  EXPECT_GT(drafted, 0u);
}

// Sampled drafts: near-uniform random-weight distributions make rejection sampling accept often, so rounds
// keep drafts and roll back the rest; a seeded run repeats exactly, and a fresh source reproduces it.
TEST_F(Mtp, SampledSpeculationAcceptsAndRepeats) {
  ThreadPool pool(2);
  std::mt19937 rng(29);
  const model::Model& m = *q8_;
  const auto prompt = random_tokens(rng, 8, static_cast<int32_t>(m.config().n_vocab));
  engine::SpecOptions o;
  o.generate.max_tokens = 40;
  o.generate.sampling.temperature = 1.5f;
  o.generate.sampling.top_k = 0;
  o.generate.sampling.top_p = 1.0f;
  o.generate.sampling.min_p = 0.0f;
  o.generate.sampling.seed = 77;
  o.draft_max = 3;
  o.use_gate = false;
  speculative::MtpDraftSource reused(m, pool, 256);
  std::vector<int32_t> first;
  engine::SpecStats stats;
  for (int run = 0; run < 3; ++run) {
    speculative::MtpDraftSource fresh(m, pool, 256);
    speculative::MtpDraftSource& source = run == 2 ? fresh : reused;
    model::Session s(m, pool, options());
    std::vector<int32_t> out;
    stats = engine::generate_speculative(
        s, source, prompt, o, [&](int32_t t) { return out.push_back(t), true; }, nullptr);
    ASSERT_EQ(out.size(), 40u);
    if (run == 0) first = out;
    EXPECT_EQ(out, first) << "run " << run;
  }
  EXPECT_GT(stats.accepted, 0);
  EXPECT_LT(stats.accepted, stats.drafted);
  std::printf(
      "mtp drafter, sampled at temperature 1.5, depth 3: %lld of %lld drafts accepted, %.3f tokens per "
      "target forward\n",
      static_cast<long long>(stats.accepted), static_cast<long long>(stats.drafted),
      stats.tokens_per_forward());
}

// The MTP layer's drafting cost is measured apart (bench-spec stores it under its own calibration key) and
// leaves the source empty.
TEST_F(Mtp, CalibrationMeasuresTheMtpLayersCost) {
  ThreadPool pool(1);
  speculative::MtpDraftSource source(*q8_, pool, 128);
  const double cost = speculative::measure_mtp_draft_cost(source, 1e-3);
  EXPECT_GT(cost, 0.0);
  EXPECT_TRUE(std::isfinite(cost));
  EXPECT_EQ(source.cache_length(), 0);

  {
    std::ofstream prompts(dir_->file("prompts.txt"));
    prompts << "Once upon a time\n";
  }
  const auto [out, rc] = testing::run_command(
      "XDG_CACHE_HOME='" + dir_->file("cache") + "' '" + std::string(TANDEM_BINARY) + "' bench-spec -m '" +
      path("Q8_0") + "' --draft mtp -t 1 -n 8 --draft-max 3 --prompts '" + dir_->file("prompts.txt") +
      "' 2>&1");
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(dir_->file("cache") + "/tandem/calibration.json");
  ASSERT_TRUE(in) << out;
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string key = speculative::mtp_cost_key(path("Q8_0"));
  bool found = false;
  for (const auto& entry : j.at("entries")) {
    if (!entry.contains("draft_per_token") || !entry["draft_per_token"].contains(key)) continue;
    found = true;
    EXPECT_GT(entry["draft_per_token"][key].get<double>(), 0.0);
  }
  EXPECT_TRUE(found) << key << " not in " << j.dump();
}

// A file without MTP layers is refused with the drafters that remain: by the source and by `tandem run`.
TEST_F(Mtp, FilesWithoutMtpLayersAreRefused) {
  ThreadPool pool(1);
  auto plain = model::Model::load(path("F32-plain"));
  try {
    speculative::MtpDraftSource source(*plain, pool, 64);
    FAIL() << "a file without MTP layers was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("next-token-prediction"), std::string::npos) << what;
    EXPECT_NE(what.find("--draft ngram"), std::string::npos) << what;
  }
  const auto [output, rc] = testing::run_command(std::string("'") + TANDEM_BINARY + "' run -t 1 -m '" +
                                                 path("F32-plain") + "' -p hello -n 4 --draft mtp 2>&1");
  EXPECT_NE(rc, 0) << output;
  EXPECT_NE(output.find("has none (no nextn_predict_layers)"), std::string::npos) << output;
  // The file with the layer drafts with it.
  const auto [ok, ok_rc] = testing::run_command(std::string("'") + TANDEM_BINARY + "' run -t 1 -m '" +
                                                path("F32") + "' -p hello -n 8 --temp 0 --draft mtp 2>&1");
  EXPECT_EQ(ok_rc, 0) << ok;
  EXPECT_NE(ok.find("speculative:"), std::string::npos) << ok;
}

// `tandem serve --draft mtp --tree-nodes N` is refused at start, saying to use chains: the MTP layer drafts
// chains only (and this file's latent cache cannot move a tree's path either).
TEST_F(Mtp, ServeRefusesTreesAtStart) {
  const auto [out, rc] = testing::run_command("XDG_CACHE_HOME='" + dir_->file("cache") + "' timeout 60 '" +
                                              std::string(TANDEM_BINARY) + "' serve -t 1 --port 0 -m '" +
                                              path("F32") + "' --draft mtp --tree-nodes 4 2>&1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(rc, 124) << "the server started: " << out;
  EXPECT_NE(out.find("use chains (--tree-nodes 0)"), std::string::npos) << out;
  EXPECT_EQ(out.find("listening on"), std::string::npos) << out;
}

// `tandem synth --mtp-layers` writes the layers into deepseek2 files and refuses other architectures;
// `tandem info` shows the count.
TEST_F(Mtp, SynthAndInfoCommands) {
  const std::string out = dir_->file("two.gguf");
  const std::string tandem = std::string("'") + TANDEM_BINARY + "'";
  const auto [written, rc] =
      testing::run_command(tandem + " synth --preset tiny-deepseek2-d64 --type F32 -t 1 " +
                           "--mtp-layers 2 -o '" + out + "' 2>&1");
  ASSERT_EQ(rc, 0) << written;
  auto two = model::Model::load(out);
  EXPECT_EQ(two->config().n_mtp, 2);
  EXPECT_EQ(two->config().n_layer, 3);
  const auto [info, info_rc] = testing::run_command(tandem + " info -m '" + out + "' 2>&1");
  ASSERT_EQ(info_rc, 0) << info;
  EXPECT_NE(info.find("mtp: 2 next-token-prediction layers after the 3 main ones"), std::string::npos)
      << info;
  const auto [refused, refused_rc] = testing::run_command(
      tandem + " synth --preset tiny-llama-d256 --mtp-layers 1 -o '" + dir_->file("no.gguf") + "' 2>&1");
  EXPECT_NE(refused_rc, 0);
  EXPECT_NE(refused.find("deepseek2 presets only"), std::string::npos) << refused;
}

}  // namespace
}  // namespace tandem
