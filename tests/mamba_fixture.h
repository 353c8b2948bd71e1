// What the suites of models with Mamba layers share (pure Mamba and hybrids with attention): random prompts,
// the recurrent state of a session, verify windows, accept/reject rounds and speculative greedy decoding
// checked against plain decoding.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <span>
#include <vector>

#include "greedy_fixture.h"
#include "tandem/cache/recurrent.h"
#include "tandem/engine/generate.h"
#include "tandem/engine/generate_speculative.h"
#include "tandem/model/expert_residency.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/speculative/draft_model.h"
#include "tandem/speculative/ngram.h"
#include "tandem/speculative/replay.h"
#include "tandem/util/thread_pool.h"

namespace tandem::mamba_fixture {

using greedy_fixture::plain_greedy;
using greedy_fixture::random_tokens;

// Every recurrent layer's conv and scan state after the sequence's current length (as a forward leaves it:
// a rollback's state is rebuilt by the next forward).
inline std::vector<float> state_of(const model::Session& s) {
  const cache::RecurrentState* st = const_cast<model::Session&>(s).cache().recurrent();
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

// A window of w rows gives, row for row, the bits of the same tokens decoded one at a time, for each width
// in `widths` (prompt chunks of any size included), and leaves the same state.
inline void windows_equal_one_by_one(const model::Model& m, ThreadPool& pool,
                                     const model::SessionOptions& options, std::span<const int32_t> tokens,
                                     std::initializer_list<size_t> widths) {
  const auto V = static_cast<size_t>(m.config().n_vocab);
  model::Session plain(m, pool, options);
  std::vector<float> expected;
  for (int32_t t : tokens) {
    const auto l = plain.eval(std::span<const int32_t>(&t, 1));
    expected.insert(expected.end(), l.begin(), l.end());
  }
  for (size_t w : widths) {
    model::Session window(m, pool, options);
    for (size_t b = 0; b < tokens.size(); b += w) {
      const size_t n = std::min(w, tokens.size() - b);
      const auto l = window.eval(tokens.subspan(b, n), true);
      ASSERT_EQ(std::memcmp(l.data(), expected.data() + b * V, n * V * sizeof(float)), 0)
          << "window of " << w << " at " << b;
    }
    EXPECT_EQ(state_of(window), state_of(plain)) << "window of " << w;
  }
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A window of w rows (w in 2, 5, 9) after a prompt of 7 tokens keeps each row's state: accepting k of them
// (rollback to first + k, every k < w) makes row k's state current at once, bit for bit the state of decoding
// the k tokens one by one, and the next forward replays nothing and continues exactly as plain decoding.
inline void accepting_part_of_a_window_needs_no_replay(const model::Model& m, ThreadPool& pool,
                                                       const model::SessionOptions& options,
                                                       std::mt19937& rng) {
  const auto V = static_cast<int32_t>(m.config().n_vocab);
  const auto prompt = random_tokens(rng, 7, V);
  for (const int w : {2, 5, 9}) {
    for (int k = 0; k < w; ++k) {
      model::Session spec(m, pool, options), plain(m, pool, options);
      spec.eval(prompt);
      for (int32_t t : prompt) plain.eval(std::span<const int32_t>(&t, 1));
      const auto draft = random_tokens(rng, static_cast<size_t>(w), V);
      const cache::RecurrentState& st = *spec.cache().recurrent();
      const int64_t replayed = st.replayed_rows();
      spec.eval(draft, true);
      spec.truncate(spec.length() - w + k);
      for (int i = 0; i < k; ++i)
        plain.eval(std::span<const int32_t>(draft).subspan(static_cast<size_t>(i), 1));
      ASSERT_EQ(spec.length(), plain.length());
      // The rollback itself restored the state (state_of checks current() == length()).
      ASSERT_TRUE(same_bits(state_of(spec), state_of(plain))) << k << " of " << w;
      const auto next = random_tokens(rng, 2, V);
      const auto a = spec.eval(next, true);
      const std::vector<float> got(a.begin(), a.end());
      EXPECT_EQ(st.append().replay_to, st.append().replay_from);
      EXPECT_EQ(st.replayed_rows(), replayed) << k << " of " << w << ": the next forward replayed rows";
      const auto b = plain.eval(next, true);
      ASSERT_EQ(std::memcmp(got.data(), b.data(), b.size() * sizeof(float)), 0) << k << " of " << w;
      ASSERT_TRUE(same_bits(state_of(spec), state_of(plain))) << k << " of " << w;
    }
  }
}

// `rounds` rounds of a drafted window of w tokens of which k are accepted (a rollback to the first k), in
// random mixes, on `spec`, while `plain` (of the same model and options, both empty) decodes only the
// accepted tokens: after each round the state equals plain decoding's bit for bit, and the next logits are
// the same.
inline void accept_reject_rounds_equal_plain(model::Session& spec, model::Session& plain, std::mt19937& rng,
                                             int rounds) {
  const auto V = static_cast<int32_t>(spec.model().config().n_vocab);
  const auto prompt = random_tokens(rng, 9, V);
  spec.eval(prompt);
  plain.eval(prompt);
  std::uniform_int_distribution<int> width(1, 9);
  for (int round = 0; round < rounds; ++round) {
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

// Speculative greedy decoding of n tokens over `target` drafted by each of `draft` (another model), `ngram`
// and `replay` (whose reference this sets to plain greedy output) at depths 1, 3 and 8 equals plain greedy
// decoding, on three random prompts of `vocab` tokens that repeat themselves (for the n-gram drafter to
// find). Every replay round drafts, so each rollback lands in the last verify window: nothing is replayed.
// Some drafts are accepted and some refused. residency, when not null, is set on every speculative session.
inline void expect_speculative_greedy_equals_plain(
    const model::Model& target, ThreadPool& pool, const model::SessionOptions& options, std::mt19937& rng,
    int32_t vocab, int64_t n, speculative::DraftModelSource& draft, speculative::NgramSource& ngram,
    speculative::ReplaySource& replay, model::ExpertResidency* residency = nullptr) {
  speculative::DraftSource* sources[] = {&draft, &ngram, &replay};
  engine::SpecStats total;
  for (int p = 0; p < 3; ++p) {
    auto prompt = random_tokens(rng, 6, vocab);
    prompt.insert(prompt.end(), prompt.begin(), prompt.end());
    const auto plain = plain_greedy(target, pool, options, prompt, n);
    std::vector<int32_t> reference = prompt;
    reference.insert(reference.end(), plain.begin(), plain.end());
    replay.set_reference(reference);
    for (speculative::DraftSource* source : sources) {
      for (int depth : {1, 3, 8}) {
        model::Session s(target, pool, options);
        if (residency) s.forward().set_expert_residency(residency);
        const auto out = greedy_fixture::speculative_greedy(s, *source, prompt, n, depth, total);
        ASSERT_EQ(out, plain) << source->kind() << " depth " << depth;
        if (source == &replay) {
          EXPECT_EQ(s.cache().recurrent()->replayed_rows(), 0) << "depth " << depth;
        }
      }
    }
  }
  EXPECT_GT(total.accepted, 0);
  EXPECT_LT(total.accepted, total.drafted);
}

}  // namespace tandem::mamba_fixture
