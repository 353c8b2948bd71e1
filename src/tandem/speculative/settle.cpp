#include "tandem/speculative/settle.h"

#include <limits>

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

void Settler::keep(const SettleTarget& target, int accepted) {
  target.cache.truncate(static_cast<int64_t>(target.committed.size()) - 1);
  if (target.source) target.source->accept(target.committed, accepted);
}

}  // namespace tandem::speculative
