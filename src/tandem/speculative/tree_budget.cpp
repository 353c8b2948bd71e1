#include "tandem/speculative/tree_budget.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "tandem/util/error.h"

namespace tandem::speculative {

void check_tree_target(const cache::Geometry& geometry, cache::KvType type) {
  if (geometry.has_recurrent())
    throw Error(
        "draft trees need a target without recurrent (mamba) layers: their state follows one sequence, not a "
        "tree; use chains (--tree-nodes 0)");
  if (cache::kv_type_anchors_keys(type))
    throw Error(std::string("draft trees need an f16 or f32 KV cache (the ") +
                std::string(cache::kv_type_name(type)) +
                " cache stores keys against their block's anchor, so an accepted path cannot move); use "
                "--kv-type f16 or chains (--tree-nodes 0)");
  if (geometry.values_in_keys)
    throw Error(
        "draft trees need a KV cache with value rows; a latent (MLA) cache keeps its values in its key rows, "
        "so an accepted path cannot move yet; use chains (--tree-nodes 0)");
}

void check_tree_source(const DraftSource& source) {
  if (!source.target_layers().empty() && !source.follows_tree_rows())
    throw Error(
        "the " + std::string(source.kind()) +
        " drafter reads the target's hidden states and drafts chains only (draft trees come from draft "
        "models, n-gram lookup, EAGLE and DFlash drafters); use chains (--tree-nodes 0)");
}

size_t TreeBudget::choose(const Draft& draft, std::span<const double> cost) {
  const size_t d = draft.tokens.size();
  TANDEM_CHECK(draft.score.size() == d, "a tree budget needs a score per node");
  TANDEM_CHECK(cost.size() > d, "a tree budget needs the cost of verifying every node count");
  rank_.resize(d);
  std::iota(rank_.begin(), rank_.end(), 0);
  // Best score first; a child never scores above its parent and comes after it, so every prefix of rank_ is a
  // subtree.
  std::sort(rank_.begin(), rank_.end(), [&](int32_t a, int32_t b) {
    const float sa = draft.score[static_cast<size_t>(a)], sb = draft.score[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  });
  const double ratio = accepted_ / scored_;
  double sum = 0.0, best = 1.0;
  size_t keep = 0;
  for (size_t n = 1; n <= d; ++n) {
    sum += std::min(1.0, ratio * draft.score[static_cast<size_t>(rank_[n - 1])]);
    const double value = (1.0 + sum) / cost[n];
    if (value > best) best = value, keep = n;
  }
  return keep;
}

void TreeBudget::prune(Draft& draft, size_t keep) {
  const size_t d = draft.tokens.size();
  if (keep >= d) return;
  TANDEM_CHECK(rank_.size() == d, "prune the tree that was ranked last");
  std::sort(rank_.begin(), rank_.begin() + static_cast<std::ptrdiff_t>(keep));
  renumber_.assign(d, -1);
  TokenTree& tree = draft.tree;
  for (size_t k = 0; k < keep; ++k) {
    const auto i = static_cast<size_t>(rank_[k]);
    const int32_t parent = tree.parent[i] < 0 ? -1 : renumber_[static_cast<size_t>(tree.parent[i])];
    TANDEM_CHECK(tree.parent[i] < 0 || parent >= 0, "a kept tree node without its parent");
    renumber_[i] = static_cast<int32_t>(k);
    draft.tokens[k] = draft.tokens[i];
    draft.score[k] = draft.score[i];
    tree.parent[k] = parent;
    tree.depth[k] = tree.depth[i];
  }
  draft.tokens.resize(keep);
  draft.score.resize(keep);
  tree.parent.resize(keep);
  tree.depth.resize(keep);
}

void TreeBudget::record(const Draft& draft, int accepted) {
  if (draft.score.size() != draft.tokens.size() || draft.tokens.empty()) return;
  double scored = 0.0;
  for (float x : draft.score) scored += x;
  accepted_ = kRatioDecay * accepted_ + accepted;
  scored_ = kRatioDecay * scored_ + scored;
}

}  // namespace tandem::speculative
