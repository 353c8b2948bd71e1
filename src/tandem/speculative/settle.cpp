#include "tandem/speculative/settle.h"

#include <limits>

#include "tandem/sampling/rng.h"
#include "tandem/util/error.h"

namespace tandem::speculative {

SettleOutcome Settler::judge(const Window& window, const SettleTarget& target) {
  const size_t d = window.drafts.size();
  TANDEM_CHECK(!target.committed.empty(), "a round continues a non-empty committed text");
  TANDEM_CHECK(window.logits.size() % (d + 1) == 0 && !window.logits.empty(),
               "a window has one logit row per draft plus one");
  TANDEM_CHECK(window.q.empty() || window.q.size() == d, "a window has one drafter distribution per draft");
  const size_t V = window.logits.size() / (d + 1);
  if (p_.size() < d + 1) p_.resize(d + 1);

  // Row i conditions on the committed text and drafts [0, i): append the drafts one by one, then restore.
  std::vector<int32_t>& text = target.committed;
  const size_t n = text.size();
  sampling::GrammarMatcher* grammar = target.grammar;
  const size_t grammar_at = grammar ? grammar->position() : 0;
  bool refused = false;  // a draft the grammar refused: later rows keep its state's mask, and go unused
  for (size_t i = 0; i <= d; ++i) {
    std::span<const float> row = window.logits.subspan(i * V, V);
    if (grammar) {
      masked_.assign(row.begin(), row.end());
      grammar->fill_mask(mask_);
      if (static_cast<size_t>(mask_.n_vocab()) == V) {
        sampling::apply_token_mask(masked_, mask_);
      } else {
        // Output rows past the tokenizer's vocabulary (padding) have no text, so no grammar allows them.
        for (size_t id = 0; id < V; ++id)
          if (id >= static_cast<size_t>(mask_.n_vocab()) || !mask_.test(static_cast<int32_t>(id)))
            masked_[id] = -std::numeric_limits<float>::infinity();
      }
      row = masked_;
    }
    target.sampler.distribution(row, text, p_[i]);
    if (i < d) {
      text.push_back(window.drafts[i]);
      if (grammar && !refused) refused = !grammar->accept_token(window.drafts[i]);
    }
  }
  text.resize(n);
  if (grammar) grammar->rollback_to(grammar_at);

  const VerifyOutcome verdict =
      verify(window.drafts, std::span<const sampling::Distribution>(p_.data(), d + 1), window.q,
             target.sampler, target.sequence_id, static_cast<uint64_t>(n), scratch_);
  token_ = verdict.token;
  if (target.gate) {
    if (d > 0)
      target.gate->record_round(static_cast<int>(d), verdict.accepted);
    else
      target.gate->record_idle();
  }
  SettleOutcome out;
  out.drafted = static_cast<int>(d);
  out.accepted = verdict.accepted;
  return out;
}

void Settler::target_distribution(std::span<const float> row, const SettleTarget& target, size_t slot) {
  if (p_.size() <= slot) p_.resize(slot + 1);
  sampling::GrammarMatcher* grammar = target.grammar;
  if (grammar) {
    const size_t V = row.size();
    masked_.assign(row.begin(), row.end());
    grammar->fill_mask(mask_);
    if (static_cast<size_t>(mask_.n_vocab()) == V) {
      sampling::apply_token_mask(masked_, mask_);
    } else {
      for (size_t id = 0; id < V; ++id)
        if (id >= static_cast<size_t>(mask_.n_vocab()) || !mask_.test(static_cast<int32_t>(id)))
          masked_[id] = -std::numeric_limits<float>::infinity();
    }
    row = masked_;
  }
  target.sampler.distribution(row, target.committed, p_[slot]);
}

SettleOutcome Settler::judge_tree(const TreeWindow& window, const SettleTarget& target) {
  const size_t d = window.drafts.size();
  TANDEM_CHECK(!target.committed.empty(), "a round continues a non-empty committed text");
  TANDEM_CHECK(window.logits.size() % (d + 1) == 0 && !window.logits.empty(),
               "a tree window has one logit row per node plus one");
  TANDEM_CHECK(window.parent.size() == d, "a tree window has one parent per node");
  TANDEM_CHECK(window.q.empty() || window.q.size() == d,
               "a tree window has one drafter distribution per node");
  const size_t V = window.logits.size() / (d + 1);
  std::vector<int32_t>& text = target.committed;
  const size_t n = text.size();
  tree_base_ = static_cast<int64_t>(n) - 1;
  sampling::GrammarMatcher* grammar = target.grammar;
  const size_t grammar_at = grammar ? grammar->position() : 0;
  const bool greedy = target.sampler.params().temperature <= 0.0f;
  const uint64_t seed = target.sampler.params().seed;
  path_.clear();
  int32_t node = -1;  // the pending token
  for (;;) {
    const size_t step = path_.size();
    const auto row = static_cast<size_t>(node + 1);
    target_distribution(window.logits.subspan(row * V, V), target, step);
    const sampling::Distribution& p = p_[step];
    const uint64_t pos = static_cast<uint64_t>(text.size());
    int32_t next = -1;
    if (greedy) {
      for (size_t c = 0; c < d && next < 0; ++c)
        if (window.parent[c] == node && window.drafts[c] == p.ids.front()) next = static_cast<int32_t>(c);
      if (next < 0) token_ = p.ids.front();
    } else {
      const sampling::Distribution* cur = &p;
      int j = 0;
      for (size_t c = 0; c < d && next < 0; ++c) {
        if (window.parent[c] != node) continue;
        TANDEM_CHECK(j < kMaxSiblings, "a tree node has more children than kMaxSiblings");
        const int32_t x = window.drafts[c];
        const sampling::Distribution* qc = window.q.empty() ? nullptr : &window.q[c];
        if (!qc) {
          scratch_.point.clear();
          scratch_.point.ids.push_back(x);
          scratch_.point.probs.push_back(1.0f);
          qc = &scratch_.point;
        }
        const double px = cur->prob_of(x), qx = qc->prob_of(x);
        const uint32_t draw = j == 0 ? kDrawAccept : kDrawSibling + static_cast<uint32_t>(j);
        if (px > 0.0 && (px >= qx || sampling::uniform(seed, target.sequence_id, pos, draw) * qx < px)) {
          next = static_cast<int32_t>(c);
          break;
        }
        sampling::Distribution& r = residual_[j % 2];
        sampling::residual(*cur, *qc, r);
        cur = &r;
        ++j;
      }
      if (next < 0)
        token_ = target.sampler.draw(*cur, target.sequence_id, pos, j == 0 ? kDrawTarget : kDrawResidual);
    }
    if (next < 0) break;
    path_.push_back(next);
    text.push_back(window.drafts[static_cast<size_t>(next)]);
    if (grammar) grammar->accept_token(window.drafts[static_cast<size_t>(next)]);
    node = next;
  }
  text.resize(n);
  if (grammar) grammar->rollback_to(grammar_at);
  SettleOutcome out;
  out.drafted = static_cast<int>(d);
  out.accepted = static_cast<int>(path_.size());
  return out;
}

void Settler::keep_tree(const SettleTarget& target, int accepted) {
  kept_rows_.assign(1, 0);
  for (int k = 0; k < accepted; ++k) kept_rows_.push_back(path_[static_cast<size_t>(k)] + 1);
  target.cache.compact(tree_base_, kept_rows_);
  target.cache.truncate(static_cast<int64_t>(target.committed.size()) - 1);
  if (target.source) target.source->on_tree_kept(tree_base_, kept_rows_);
  if (target.source) target.source->accept(target.committed, accepted);
}

void Settler::keep(const SettleTarget& target, int accepted) {
  target.cache.truncate(static_cast<int64_t>(target.committed.size()) - 1);
  if (target.source) target.source->accept(target.committed, accepted);
}

}  // namespace tandem::speculative
