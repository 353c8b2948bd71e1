// Mamba-1 and its recurrent cache: verify windows compute the bits of one-by-one decoding, rollback after
// any accept/reject sequence leaves exactly the state of plain decoding, speculative greedy decoding equals
// plain greedy, and bad batches or rollbacks past the kept depth are refused with a clear error. The kernels
// against their scalar references, and the model against its goldens, are in test_kernels-style cases below
// and in test_golden.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "mamba_fixture.h"
#include "tandem/engine/cache_pool.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/kernels/ssm.h"
#include "tandem/model/model.h"
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
using mamba_fixture::same_bits;
using mamba_fixture::state_of;
using mamba_fixture::windows_equal_one_by_one;

class Mamba : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    f32_ = model::Model::load(testing::shared_path("models/synth/synth-mamba-d128-f32.gguf")).release();
    q8_ = model::Model::load(testing::shared_path("models/synth/synth-mamba-d128-Q8_0.gguf")).release();
  }
  static void TearDownTestSuite() {
    delete f32_;
    delete q8_;
  }
  static model::Model* f32_;
  static model::Model* q8_;
};
model::Model* Mamba::f32_ = nullptr;
model::Model* Mamba::q8_ = nullptr;

model::SessionOptions options() {
  model::SessionOptions o;
  o.n_ctx = 512;
  return o;
}

TEST_F(Mamba, ConfigAndStateSize) {
  const model::Config& c = f32_->config();
  EXPECT_EQ(c.arch, "mamba");
  EXPECT_EQ(c.ssm_d_inner, 256);
  EXPECT_EQ(c.ssm_d_state, 16);
  EXPECT_EQ(c.ssm_d_conv, 4);
  EXPECT_EQ(c.ssm_dt_rank, 32);
  ThreadPool pool(1);
  model::Session s(*f32_, pool, options());
  ASSERT_NE(s.cache().recurrent(), nullptr);
  // 4 layers of (3 * 256 conv inputs + 256 * 16 scan state) floats.
  EXPECT_EQ(s.cache().recurrent()->bytes_per_state(), size_t{4} * (3 * 256 + 256 * 16) * 4);
  EXPECT_EQ(s.cache().bytes_per_token(), 0u);  // no layer keeps keys and values
}

// A window of w rows gives, row for row, the bits of the same tokens decoded one at a time, prompt chunks of
// any size included.
TEST_F(Mamba, WindowsEqualOneByOneDecodingBitForBit) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (const model::Model* m : {f32_, q8_}) {
    const auto tokens = random_tokens(rng, 40, static_cast<int32_t>(m->config().n_vocab));
    ASSERT_NO_FATAL_FAILURE(windows_equal_one_by_one(*m, pool, options(), tokens, {2, 5, 8, 40}));
  }
}

// Rounds of a drafted window of w tokens of which k are accepted (a rollback to the first k), in every mix:
// after each round the state equals, bit for bit, the state of plain decoding of the accepted tokens, and the
// next logits are the same.
TEST_F(Mamba, StateAfterAnyAcceptRejectSequenceEqualsPlainDecoding) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const model::Model& m = *q8_;
  model::Session spec(m, pool, options()), plain(m, pool, options());
  accept_reject_rounds_equal_plain(spec, plain, rng, 30);
}

// Rollbacks reach `depth` positions back however the rows came: in one prompt chunk longer than the depth
// (the base state is taken inside the forward) or in single-token forwards (the base state moves in
// strides); the rebuilt state continues exactly as plain decoding of the kept tokens.
TEST_F(Mamba, DeepRollbacksContinueAsPlainDecoding) {
  ThreadPool pool(2);
  std::mt19937 rng(21);
  const model::Model& m = *q8_;
  const auto V = static_cast<int32_t>(m.config().n_vocab);
  const auto tokens = random_tokens(rng, 57, V);
  const auto probe = random_tokens(rng, 2, V);
  for (const bool one_by_one : {false, true}) {
    for (const int64_t length : {int64_t{50}}) {
      model::Session s(m, pool, options());
      const int64_t depth = s.cache().recurrent()->depth();
      for (const int64_t back : {depth, int64_t{7}, int64_t{1}}) {
        s.truncate(0);
        const auto prefix = std::span<const int32_t>(tokens).first(static_cast<size_t>(length));
        if (one_by_one) {
          for (int32_t t : prefix) s.eval(std::span<const int32_t>(&t, 1));
        } else {
          s.eval(prefix);
        }
        s.truncate(length - back);
        const auto a = s.eval(probe, true);
        const std::vector<float> got(a.begin(), a.end());
        model::Session plain(m, pool, options());
        plain.eval(prefix.first(static_cast<size_t>(length - back)));
        const auto b = plain.eval(probe, true);
        ASSERT_EQ(std::memcmp(got.data(), b.data(), b.size() * sizeof(float)), 0)
            << (one_by_one ? "one by one" : "one chunk") << ", " << length << " back " << back;
        ASSERT_EQ(state_of(s), state_of(plain));
      }
    }
  }
}

// A sequence keeps a verify window's states (one per row and the one before it), the inputs of the rows a
// rollback may replay and the snapshots for prefix reuse.
TEST_F(Mamba, RollbackKeepsAWindowOfStatesAndTheRowInputs) {
  ThreadPool pool(1);
  model::Session s(*f32_, pool, options());
  const cache::RecurrentState& st = *s.cache().recurrent();
  const int64_t depth = st.depth();
  EXPECT_EQ(depth, 16);
  EXPECT_EQ(cache::RecurrentState::window_rows(depth), depth + 1);
  EXPECT_EQ(cache::RecurrentState::slots(depth), depth + 2);
  // 4 layers; per row x and dt (256 each), B and C (16 each).
  const size_t inputs = size_t{4} * static_cast<size_t>(cache::RecurrentState::rows_kept(depth)) *
                        (2 * 256 + 2 * 16) * sizeof(float);
  const auto states = static_cast<size_t>(depth + 2 + cache::RecurrentState::kMaxSnapshots);
  EXPECT_EQ(st.bytes(), states * st.bytes_per_state() + inputs);
  EXPECT_EQ(st.bytes(), cache::recurrent_sequence_bytes(f32_->config().kv_geometry(), depth));
  // Only forwards a rollback may land inside keep their rows' states: not a prompt chunk longer than a
  // verify window.
  std::mt19937 rng(23);
  s.eval(random_tokens(rng, static_cast<size_t>(cache::RecurrentState::window_rows(depth) + 1), 512));
  EXPECT_FALSE(st.append().row_states);
  s.eval(random_tokens(rng, static_cast<size_t>(cache::RecurrentState::window_rows(depth)), 512));
  EXPECT_TRUE(st.append().row_states);
}

// A window of w rows keeps each row's state: accepting k of them (rollback to first + k, every k < w) makes
// row k's state current at once, bit for bit the state of decoding the k tokens one by one, and the next
// forward replays nothing and continues exactly as plain decoding.
TEST_F(Mamba, AcceptingPartOfAWindowRestoresItsRowStateWithoutReplay) {
  ThreadPool pool(2);
  std::mt19937 rng(17);
  const model::Model& m = *q8_;
  accepting_part_of_a_window_needs_no_replay(m, pool, options(), rng);
}

// The owner announces its longest verify window (a drafter's depth + 1): the state keeps that many row states
// and no more. A longer window keeps none, so accepting part of it replays the accepted rows, with the same
// bits.
TEST_F(Mamba, AnnouncedWindowSizesTheRowStates) {
  ThreadPool pool(2);
  std::mt19937 rng(29);
  const model::Model& m = *q8_;
  const auto V = static_cast<int32_t>(m.config().n_vocab);
  model::SessionOptions o = options();
  o.verify_rows = 5;
  const auto prompt = random_tokens(rng, 7, V);
  for (const int w : {5, 9}) {
    model::Session spec(m, pool, o), plain(m, pool, options());
    const cache::RecurrentState& st = *spec.cache().recurrent();
    EXPECT_EQ(st.window_rows(), 5);
    EXPECT_EQ(st.bytes(), cache::recurrent_sequence_bytes(m.config().kv_geometry(), st.depth(), 5));
    EXPECT_EQ(st.bytes() - cache::recurrent_sequence_bytes(m.config().kv_geometry(), st.depth(), 4),
              st.bytes_per_state());
    spec.eval(prompt);
    plain.eval(prompt);
    const auto draft = random_tokens(rng, static_cast<size_t>(w), V);
    spec.eval(draft, true);
    EXPECT_EQ(st.append().row_states, w <= 5);
    spec.truncate(spec.length() - w + 2);
    plain.eval(std::span<const int32_t>(draft).first(2));
    const int64_t replayed = st.replayed_rows();
    const auto next = random_tokens(rng, 2, V);
    const auto a = spec.eval(next, true);
    const std::vector<float> got(a.begin(), a.end());
    EXPECT_EQ(st.replayed_rows() - replayed, w <= 5 ? 0 : 2) << "window of " << w;
    const auto b = plain.eval(next, true);
    ASSERT_EQ(std::memcmp(got.data(), b.data(), b.size() * sizeof(float)), 0) << "window of " << w;
    EXPECT_TRUE(same_bits(state_of(spec), state_of(plain))) << "window of " << w;
  }
}

// A rollback into a run of single rows (a drafter's steps) keeps no row states: the next forward replays the
// accepted rows, and gives the bits of plain decoding.
TEST_F(Mamba, RollbackIntoSingleRowsReplays) {
  ThreadPool pool(2);
  std::mt19937 rng(19);
  const model::Model& m = *q8_;
  const auto V = static_cast<int32_t>(m.config().n_vocab);
  const auto tokens = random_tokens(rng, 12, V);
  model::Session s(m, pool, options()), plain(m, pool, options());
  s.eval(std::span<const int32_t>(tokens).first(6));
  plain.eval(std::span<const int32_t>(tokens).first(8));
  for (size_t i = 6; i < tokens.size(); ++i) s.eval(std::span<const int32_t>(tokens).subspan(i, 1));
  const cache::RecurrentState& st = *s.cache().recurrent();
  const int64_t replayed = st.replayed_rows(), oldest = st.oldest();
  ASSERT_LT(oldest, 8);
  s.truncate(8);
  const auto next = random_tokens(rng, 1, V);
  const auto a = s.eval(next, true);
  const std::vector<float> got(a.begin(), a.end());
  EXPECT_EQ(st.replayed_rows() - replayed, 8 - oldest);  // the rows from the base to 8
  const auto b = plain.eval(next, true);
  ASSERT_EQ(std::memcmp(got.data(), b.data(), b.size() * sizeof(float)), 0);
  EXPECT_TRUE(same_bits(state_of(s), state_of(plain)));
}

TEST_F(Mamba, RollbackPastTheKeptDepthIsRefused) {
  ThreadPool pool(1);
  std::mt19937 rng(3);
  model::Session s(*f32_, pool, options());
  s.eval(random_tokens(rng, 60, 512));
  const int64_t depth = s.cache().recurrent()->depth();
  s.truncate(60 - depth);  // the deepest rollback kept
  try {
    s.truncate(60 - depth - 1);
    FAIL() << "a rollback past the kept depth was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot roll back the recurrent state"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.length(), 60 - depth);  // unchanged by the refusal
  s.truncate(0);                      // a fresh start is always possible
  EXPECT_EQ(s.length(), 0);
}

// Greedy decoding of n tokens after `prompt` (evaluated in chunks of `chunk`): the tokens and every step's
// logits.
struct Decoded {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};
Decoded decode_greedy(model::Session& s, std::span<const int32_t> prompt, size_t chunk, int n) {
  Decoded out;
  std::span<const float> l;
  for (size_t b = 0; b < prompt.size(); b += chunk)
    l = s.eval(prompt.subspan(b, std::min(chunk, prompt.size() - b)));
  for (int i = 0; i < n; ++i) {
    out.logits.insert(out.logits.end(), l.begin(), l.end());
    const auto next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.tokens.push_back(next);
    l = s.eval(std::span<const int32_t>(&next, 1));
  }
  out.logits.insert(out.logits.end(), l.begin(), l.end());
  return out;
}

model::SessionOptions without_rollback() {
  model::SessionOptions o = options();
  o.rollback = false;
  return o;
}

// A sequence set up without rollback (plain decoding) keeps one state and no row inputs, replays nothing, and
// gives the bits of one with rollback: the tokens, every step's logits and the state, over more single rows
// than a rollback base is kept for (it moves, replaying rows, where rollback is on), after prompts in one
// chunk or several.
TEST_F(Mamba, PlainDecodingWithoutRollbackGivesTheSameBits) {
  ThreadPool pool(2);
  std::mt19937 rng(41);
  for (const model::Model* m : {f32_, q8_}) {
    const auto prompt = random_tokens(rng, 30, static_cast<int32_t>(m->config().n_vocab));
    for (size_t chunk : {size_t{1}, size_t{7}, size_t{30}}) {
      model::Session with(*m, pool, options()), without(*m, pool, without_rollback());
      ASSERT_EQ(without.cache().recurrent()->depth(), 0);
      const Decoded a = decode_greedy(with, prompt, chunk, 40);
      const Decoded b = decode_greedy(without, prompt, chunk, 40);
      EXPECT_EQ(a.tokens, b.tokens) << "chunk " << chunk;
      ASSERT_EQ(a.logits.size(), b.logits.size());
      EXPECT_EQ(std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)), 0)
          << "chunk " << chunk;
      EXPECT_EQ(state_of(with), state_of(without)) << "chunk " << chunk;
    }
  }
  // One state (no base) and no row inputs, besides the snapshots.
  model::Session s(*f32_, pool, without_rollback());
  const cache::RecurrentState& st = *s.cache().recurrent();
  EXPECT_EQ(cache::RecurrentState::rows_kept(0), 0);
  EXPECT_EQ(st.bytes(), static_cast<size_t>(1 + cache::RecurrentState::kMaxSnapshots) * st.bytes_per_state());
  EXPECT_EQ(st.bytes(), cache::recurrent_sequence_bytes(f32_->config().kv_geometry(), 0));
}

// A rollback of a sequence set up without rollback is refused, changing nothing; a restart from 0, a
// "rollback" to its own length and one to a snapshot's length still work, and continue exactly.
TEST_F(Mamba, RollbackWithoutRollbackIsRefused) {
  ThreadPool pool(2);
  std::mt19937 rng(43);
  const model::Model& m = *q8_;
  const auto V = static_cast<int32_t>(m.config().n_vocab);
  model::Session s(m, pool, without_rollback());
  const auto tokens = random_tokens(rng, 300, V);
  s.eval(std::span<const int32_t>(tokens).first(30));
  const std::vector<float> before = state_of(s);
  for (int64_t n : {int64_t{29}, int64_t{20}, int64_t{1}}) {
    try {
      s.truncate(n);
      FAIL() << "a rollback to " << n << " of a sequence without rollback was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("without rollback"), std::string::npos) << e.what();
    }
    EXPECT_EQ(s.length(), 30);
  }
  EXPECT_EQ(state_of(s), before);  // unchanged by the refusals
  s.truncate(30);                  // its own length: nothing to do
  const auto probe = random_tokens(rng, 3, V);
  auto l = s.eval(probe, true);
  std::vector<float> got(l.begin(), l.end());
  model::Session fresh(m, pool, without_rollback());
  fresh.eval(std::span<const int32_t>(tokens).first(30));
  l = fresh.eval(probe, true);
  EXPECT_EQ(std::memcmp(got.data(), l.data(), l.size() * sizeof(float)), 0);

  // 300 positions in chunks of 256 and 44, then single rows: the second chunk's forward takes a snapshot
  // at 256.
  s.truncate(0);
  EXPECT_EQ(s.length(), 0);
  s.eval(tokens);
  for (int32_t t : probe) s.eval(std::span<const int32_t>(&t, 1));
  EXPECT_EQ(s.cache().recurrent()->snapshot_lengths(), (std::vector<int64_t>{256}));
  EXPECT_EQ(s.cache().recurrent()->reachable(302), 256);
  s.truncate(256);
  l = s.eval(probe, true);
  got.assign(l.begin(), l.end());
  model::Session plain(m, pool, without_rollback());
  plain.eval(std::span<const int32_t>(tokens).first(256));
  l = plain.eval(probe, true);
  EXPECT_EQ(std::memcmp(got.data(), l.data(), l.size() * sizeof(float)), 0);
  EXPECT_EQ(state_of(s), state_of(plain));
}

TEST_F(Mamba, RowsOutOfOrderAreRefused) {
  ThreadPool pool(1);
  model::Forward fwd(*f32_, pool, 4);
  cache::KvCache kv(f32_->config().kv_geometry(), 64, cache::KvType::kF16, 4);
  cache::KvCache* caches[] = {&kv};
  std::vector<float> logits(512 * 4);
  const model::Row first[] = {{5, 0, 0, true}, {6, 1, 0, true}};
  fwd.run(first, caches, logits.data());
  const model::Row swapped[] = {{7, 2, 0, true}, {8, 1, 0, true}};  // each within the attention rule
  try {
    fwd.run(swapped, caches, logits.data());
    FAIL() << "rows out of order were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("consecutive positions"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv.length(), 2);
}

// Evaluates tokens[from, n) onto `kv` in forwards of at most 64 rows; the last token's logits.
std::vector<float> eval_on(model::Forward& fwd, cache::KvCache& kv, std::span<const int32_t> tokens,
                           int64_t from, int64_t n_vocab) {
  const auto n = static_cast<int64_t>(tokens.size());
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  std::vector<model::Row> rows;
  cache::KvCache* caches[] = {&kv};
  for (int64_t b = from; b < n; b += 64) {
    rows.clear();
    for (int64_t p = b; p < std::min(n, b + 64); ++p)
      rows.push_back({tokens[static_cast<size_t>(p)], p, 0, p == n - 1});
    fwd.run(rows, caches, logits.data());
  }
  return logits;
}

// The server's cache pool resumes a recurrent sequence that shares a prefix with a finished one from the
// newest snapshot within the shared part when that part ends beyond the rollback depth, and the logits are
// those of a fresh evaluation.
TEST_F(Mamba, CachePoolResumesFromASnapshot) {
  ThreadPool pool(2);
  std::mt19937 rng(31);
  const model::Model& m = *q8_;
  const int64_t V = m.config().n_vocab;
  model::Forward fwd(m, pool, 64);
  engine::SlotCachePool caches(m.config(), 512, cache::KvType::kF16, 1);
  const auto first = random_tokens(rng, 300, static_cast<int32_t>(V));
  auto lease = caches.acquire(first);
  EXPECT_EQ(lease.reused, 0);
  eval_on(fwd, *lease.cache, first, 0, V);
  EXPECT_EQ(lease.cache->recurrent()->snapshot_lengths(), (std::vector<int64_t>{256}));
  caches.release(std::move(lease.cache), first);

  // Shares 280 tokens: past the reach of a rollback from 300, so it resumes at the snapshot.
  auto second = std::vector<int32_t>(first.begin(), first.begin() + 280);
  const auto tail = random_tokens(rng, 30, static_cast<int32_t>(V));
  second.insert(second.end(), tail.begin(), tail.end());
  EXPECT_EQ(caches.reusable(second), 256);
  lease = caches.acquire(second);
  ASSERT_EQ(lease.reused, 256);
  const auto resumed = eval_on(fwd, *lease.cache, second, lease.reused, V);
  cache::KvCache fresh(m.config().kv_geometry(), 512, cache::KvType::kF16, 64);
  const auto expected = eval_on(fwd, fresh, second, 0, V);
  EXPECT_EQ(resumed, expected);
  caches.release(std::move(lease.cache), second);

  // Shares all but the last few tokens: a plain rollback.
  auto third = second;
  third.back() = third.back() == 3 ? 4 : 3;
  EXPECT_EQ(caches.reusable(third), static_cast<int64_t>(third.size()) - 1);
}

// The pool of a server that does not speculate sets its caches up without rollback: a new prompt resumes at a
// snapshot (or the finished sequence's end), never a few positions back, and the logits are those of a fresh
// evaluation.
TEST_F(Mamba, CachePoolWithoutRollbackResumesAtSnapshots) {
  ThreadPool pool(2);
  std::mt19937 rng(33);
  const model::Model& m = *q8_;
  const int64_t V = m.config().n_vocab;
  model::Forward fwd(m, pool, 64);
  engine::SlotCachePool caches(m.config(), 512, cache::KvType::kF16, 1, /*rollback=*/false);
  const auto first = random_tokens(rng, 300, static_cast<int32_t>(V));
  auto lease = caches.acquire(first);
  eval_on(fwd, *lease.cache, first, 0, V);
  EXPECT_EQ(lease.cache->recurrent()->depth(), 0);
  caches.release(std::move(lease.cache), first);

  // All but the last token shared: a rollback of one position, out of reach; the snapshot at 256 is not.
  auto second = first;
  second.back() = second.back() == 3 ? 4 : 3;
  EXPECT_EQ(caches.reusable(second), 256);
  lease = caches.acquire(second);
  ASSERT_EQ(lease.reused, 256);
  const auto resumed = eval_on(fwd, *lease.cache, second, lease.reused, V);
  cache::KvCache fresh(m.config().kv_geometry(), 512, cache::KvType::kF16, 64, 0);
  EXPECT_EQ(resumed, eval_on(fwd, fresh, second, 0, V));
  caches.release(std::move(lease.cache), second);

  // A continuation of the whole sequence resumes at its end.
  auto third = second;
  third.push_back(5);
  EXPECT_EQ(caches.reusable(third), static_cast<int64_t>(second.size()));
}

// Speculative greedy decoding over a recurrent target (drafting with the other mamba file, or by n-gram
// lookup) equals plain greedy decoding at every depth the cache keeps.
TEST_F(Mamba, SpeculativeGreedyEqualsPlainGreedy) {
  ThreadPool pool(1);
  std::mt19937 rng(5);
  constexpr int64_t kTokens = 24;
  speculative::DraftModelSource draft(*f32_, *q8_, pool, options());
  speculative::NgramSource ngram({1, 4});
  speculative::ReplaySource replay(0.7, 512, 3);
  expect_speculative_greedy_equals_plain(*q8_, pool, options(), rng, 512, kTokens, draft, ngram, replay);
}

// `tandem synth` writes mamba checkpoints (the mamba-1.4b preset for benchmarks); the small preset loads with
// the shapes asked for and decodes to finite logits, windows equal to one-by-one decoding.
TEST(MambaSynth, SmallPresetLoadsAndDecodes) {
  ThreadPool pool(2);
  const model::SynthPreset& p = model::find_synth_preset("tiny-mamba-d64");
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tandem-test-mamba-" + std::to_string(::getpid()) + ".gguf"))
          .string();
  model::write_synthetic_model(p, model::find_file_type("Q8_0"), path, pool);
  auto m = model::Model::load(path);
  std::filesystem::remove(path);
  const model::Config& c = m->config();
  EXPECT_EQ(c.arch, "mamba");
  EXPECT_EQ(c.ssm_d_inner, 128);
  EXPECT_EQ(c.ssm_d_state, 16);
  EXPECT_EQ(c.ssm_d_conv, 4);
  EXPECT_EQ(c.ssm_dt_rank, 4);
  std::mt19937 rng(2);
  const auto tokens = random_tokens(rng, 12, static_cast<int32_t>(c.n_vocab));
  model::Session one(*m, pool, options()), all(*m, pool, options());
  std::vector<float> expected;
  for (int32_t t : tokens) {
    const auto l = one.eval(std::span<const int32_t>(&t, 1));
    for (float v : l) ASSERT_TRUE(std::isfinite(v));
    expected.insert(expected.end(), l.begin(), l.end());
  }
  const auto l = all.eval(tokens, true);
  EXPECT_EQ(std::memcmp(l.data(), expected.data(), expected.size() * sizeof(float)), 0);
  const auto& big = model::find_synth_preset("mamba-1.4b");
  EXPECT_EQ(big.n_embd * big.ssm_expand, 4096);
  EXPECT_EQ(big.n_layer, 48);
  EXPECT_EQ(big.n_vocab, 50280);
}

// The kernels the forward calls against their scalar references, over channel ranges of every alignment.
TEST(SsmKernels, MatchScalarReference) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, size_t n, float scale) {
    v.resize(n);
    for (auto& x : v) x = nd(rng) * scale;
  };
  for (int64_t N : {1, 7, 16, 37, 256}) {
    for (int64_t K : {1, 2, 4}) {
      std::vector<float> st, x, w, b, out_a, out_b, y_a, y_b;
      fill(st, static_cast<size_t>((K - 1) * N), 1.0f);
      fill(x, static_cast<size_t>(N), 1.0f);
      fill(w, static_cast<size_t>(N * K), 0.5f);
      fill(b, static_cast<size_t>(N), 0.1f);
      out_a.assign(st.size(), 0.0f);
      out_b = out_a;
      y_a.assign(static_cast<size_t>(N), 0.0f);
      y_b = y_a;
      kernels::SsmConvArgs a{N, K, st.data(), out_a.data(), x.data(), w.data(), b.data(), y_a.data()};
      kernels::SsmConvArgs r = a;
      r.state_out = out_b.data();
      r.y = y_b.data();
      const int64_t i0 = N > 3 ? 3 : 0;
      kernels::ssm_conv_step(a, i0, N);
      kernels::ssm_conv_step_ref(r, i0, N);
      EXPECT_EQ(out_a, out_b) << N << " " << K;
      // In place (the recurrent cache updates its current state so) gives the same bits.
      std::vector<float> in_place = st, y_c(y_a.size());
      kernels::SsmConvArgs c = a;
      c.state_in = c.state_out = in_place.data();
      c.y = y_c.data();
      kernels::ssm_conv_step(c, i0, N);
      for (int64_t i = i0; i < N; ++i)
        for (int64_t k = 0; k + 1 < K; ++k)
          EXPECT_EQ(in_place[static_cast<size_t>(k * N + i)], out_a[static_cast<size_t>(k * N + i)]);
      EXPECT_EQ(y_c, y_a);
      for (int64_t i = i0; i < N; ++i)
        EXPECT_NEAR(y_a[static_cast<size_t>(i)], y_b[static_cast<size_t>(i)], 1e-5f) << N << " " << K;
    }
    for (int64_t S : {1, 5, 16}) {
      std::vector<float> st, x, dt, A, B, C, D, z, out_a, out_b, y_a, y_b;
      fill(st, static_cast<size_t>(N * S), 1.0f);
      fill(x, static_cast<size_t>(N), 1.0f);
      fill(dt, static_cast<size_t>(N), 3.0f);  // both sides of the softplus threshold
      dt[0] = 25.0f;
      fill(A, static_cast<size_t>(N * S), 1.0f);
      for (auto& v : A) v = -std::exp(v);
      fill(B, static_cast<size_t>(S), 1.0f);
      fill(C, static_cast<size_t>(S), 1.0f);
      fill(D, static_cast<size_t>(N), 1.0f);
      fill(z, static_cast<size_t>(N), 1.0f);
      out_a.assign(st.size(), 0.0f);
      out_b = out_a;
      y_a.assign(static_cast<size_t>(N), 0.0f);
      y_b = y_a;
      kernels::SsmScanArgs a{N,        S,        st.data(), out_a.data(), x.data(), dt.data(),
                             A.data(), B.data(), C.data(),  D.data(),     z.data(), y_a.data()};
      kernels::SsmScanArgs r = a;
      r.state_out = out_b.data();
      r.y = y_b.data();
      kernels::ssm_scan_step(a, 0, N);
      kernels::ssm_scan_step_ref(r, 0, N);
      // Any split of the channels (threads take ranges of them) gives the same bits.
      std::vector<float> out_c(out_a.size()), y_c(y_a.size());
      kernels::SsmScanArgs split = a;
      split.state_out = out_c.data();
      split.y = y_c.data();
      for (int64_t i = 0; i < N; i += 5) kernels::ssm_scan_step(split, i, std::min<int64_t>(N, i + 5));
      EXPECT_EQ(out_c, out_a) << N << " " << S;
      std::vector<float> in_place = st;
      kernels::SsmScanArgs same = a;
      same.state_in = same.state_out = in_place.data();
      same.y = y_c.data();
      kernels::ssm_scan_step(same, 0, N);
      EXPECT_EQ(in_place, out_a) << N << " " << S;
      EXPECT_EQ(y_c, y_a) << N << " " << S;
      for (size_t i = 0; i < out_a.size(); ++i)
        EXPECT_NEAR(out_a[i], out_b[i], 1e-5f * (1.0f + std::abs(out_b[i]))) << N << " " << S << " " << i;
      for (size_t i = 0; i < y_a.size(); ++i)
        EXPECT_NEAR(y_a[i], y_b[i], 1e-4f * (1.0f + std::abs(y_b[i]))) << N << " " << S << " " << i;
    }
  }
}

}  // namespace
}  // namespace tandem
