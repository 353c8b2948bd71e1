#include "tandem/speculative/dynamic_tree.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "tandem/util/error.h"

namespace tandem::speculative {

void DynamicTree::begin(const sampling::Params& target, int branch) {
  branch_ = std::max(1, branch);
  sampling::Params rank = target;
  rank.temperature = 1.0f;
  rank.top_k = branch_;
  rank.top_p = 1.0f;
  rank.min_p = 0.0f;
  ranker_ = sampling::Sampler(rank);
  rank.top_k = 0;
  scorer_ = sampling::Sampler(rank);
}

void DynamicTree::clear(int64_t base) {
  base_ = base;
  candidates_.clear();
  slot_token_.clear();
  slot_parent_.clear();
  slot_depth_.clear();
}

void DynamicTree::add_children(int32_t parent, std::span<const float> logits, std::span<const int32_t> text,
                               float cover) {
  ranker_.distribution(logits, text, ranked_);
  order_.resize(ranked_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const float pa = ranked_.probs[static_cast<size_t>(a)], pb = ranked_.probs[static_cast<size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  });
  scorer_.distribution(logits, text, scored_);
  const float base = parent < 0 ? 0.0f : candidates_[static_cast<size_t>(parent)].logp;
  const float score = parent < 0 ? 1.0f : candidates_[static_cast<size_t>(parent)].score;
  const int32_t depth = parent < 0 ? 1 : candidates_[static_cast<size_t>(parent)].depth + 1;
  float covered = 0.0f;
  for (size_t k = 0; k < order_.size() && static_cast<int>(k) < branch_; ++k) {
    if (k > 0 && covered >= cover) break;
    const auto i = static_cast<size_t>(order_[k]);
    covered += ranked_.probs[i];
    candidates_.push_back({ranked_.ids[i], parent, depth, -1, base + std::log(ranked_.probs[i]),
                           score * scored_.prob_of(ranked_.ids[i])});
  }
}

std::span<const int32_t> DynamicTree::expand(int32_t level, int max_nodes, int expand, int64_t max_slots) {
  // Nodes below the max_nodes-th best cumulative probability cannot enter the proposal, nor can their
  // descendants: they are not expanded.
  float bar = -INFINITY;
  if (static_cast<int>(candidates_.size()) >= max_nodes) {
    logps_.clear();
    for (const Candidate& c : candidates_) logps_.push_back(c.logp);
    std::nth_element(logps_.begin(), logps_.begin() + (max_nodes - 1), logps_.end(), std::greater<float>());
    bar = logps_[static_cast<size_t>(max_nodes - 1)];
  }
  picked_.clear();
  for (size_t i = 0; i < candidates_.size(); ++i)
    if (candidates_[i].depth == level && candidates_[i].logp >= bar)
      picked_.push_back(static_cast<int32_t>(i));
  std::sort(picked_.begin(), picked_.end(), [&](int32_t a, int32_t b) {
    const float la = candidates_[static_cast<size_t>(a)].logp, lb = candidates_[static_cast<size_t>(b)].logp;
    return la != lb ? la > lb : a < b;
  });
  if (static_cast<int>(picked_.size()) > expand) picked_.resize(static_cast<size_t>(std::max(1, expand)));
  if (slots() + static_cast<int64_t>(picked_.size()) > max_slots) picked_.clear();
  std::sort(picked_.begin(), picked_.end());  // parents before children in the cache's tree
  for (int32_t i : picked_) {
    Candidate& c = candidates_[static_cast<size_t>(i)];
    c.slot = static_cast<int32_t>(slot_token_.size());
    const int32_t parent_slot = c.parent < 0 ? -1 : candidates_[static_cast<size_t>(c.parent)].slot;
    slot_token_.push_back(c.token);
    slot_parent_.push_back(parent_slot);
    slot_depth_.push_back(c.depth - 1);
  }
  return picked_;
}

void DynamicTree::path_text(int32_t c, std::span<const int32_t> committed, std::vector<int32_t>& text) const {
  text.assign(committed.begin(), committed.end());
  const size_t at = text.size();
  for (; c >= 0; c = candidates_[static_cast<size_t>(c)].parent)
    text.push_back(candidates_[static_cast<size_t>(c)].token);
  std::reverse(text.begin() + static_cast<std::ptrdiff_t>(at), text.end());
}

void DynamicTree::kept_path(std::span<const int32_t> committed, std::vector<int32_t>& kept) const {
  kept.clear();
  int32_t at = -1;
  for (auto pos = static_cast<size_t>(base_); pos < committed.size(); ++pos) {
    int32_t next = -1;
    for (size_t i = 0; i < slot_token_.size() && next < 0; ++i)
      if (slot_parent_[i] == at && slot_token_[i] == committed[pos]) next = static_cast<int32_t>(i);
    if (next < 0) break;
    kept.push_back(next);
    at = next;
  }
}

void DynamicTree::propose(int max_nodes, Draft& out) {
  order_.resize(candidates_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const float la = candidates_[static_cast<size_t>(a)].logp, lb = candidates_[static_cast<size_t>(b)].logp;
    return la != lb ? la > lb : a < b;
  });
  if (static_cast<int>(order_.size()) > max_nodes) order_.resize(static_cast<size_t>(max_nodes));
  std::sort(order_.begin(), order_.end());
  node_of_.assign(candidates_.size(), -1);
  for (int32_t i : order_) {
    const Candidate& c = candidates_[static_cast<size_t>(i)];
    const int32_t parent = c.parent < 0 ? -1 : node_of_[static_cast<size_t>(c.parent)];
    TANDEM_CHECK(c.parent < 0 || parent >= 0, "a drafted tree node without its parent");
    node_of_[static_cast<size_t>(i)] = out.tree.add(parent);
    out.tokens.push_back(c.token);
    out.score.push_back(c.score);
  }
}

}  // namespace tandem::speculative
