// What the speculative drivers (engine::generate_speculative for one sequence, engine::Scheduler for many)
// share about draft trees beyond settling them (settle.h): which targets and drafters can verify and draft
// them, and how many of a proposed tree's nodes a round verifies.
//
// The budget is EAGLE-2's reranking with Sequoia's budget from the cost curve: the n best-scored nodes of a
// tree (a subtree: a child never scores above its parent and comes after it) are worth (1 + the n best
// acceptance estimates) tokens, and the round verifies the n with the most tokens per unit of verify cost, or
// none when a plain step (one token at cost 1) is worth more. A node's estimate is its score times the
// ratio of drafts accepted to the scores of the nodes verified so far, since a draft model's probabilities
// need not match how often the target agrees with it. The caller prices the rows: alone, the cost curve of
// a forward of n + 1 rows; in a batch, what n more rows cost the forward the round joins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/cache/geometry.h"
#include "tandem/cache/kv_codec.h"
#include "tandem/speculative/draft_source.h"

namespace tandem::speculative {

// Throws tandem::Error, saying what to pass instead, when a target whose cache has this geometry and KV type
// cannot verify draft trees: recurrent layers (their state follows one sequence, not a tree), anchored key
// caches and latent caches (the accepted path's rows cannot move into place, KvCache::compact).
void check_tree_target(const cache::Geometry& geometry, cache::KvType type);
// Throws tandem::Error, saying what to pass instead, when `source` cannot draft trees that a driver verifies:
// it reads the target's hidden states but does not follow a tree round's rows
// (DraftSource::follows_tree_rows; the MTP layer), so its state after the round would hold rows of rejected
// nodes.
void check_tree_source(const DraftSource& source);

// One sequence's node budget. Not thread safe; allocates only while its scratch grows to the largest tree.
class TreeBudget {
 public:
  // Whether choose() applies to `draft`: a deterministic tree with a score per node. Other trees are
  // verified whole.
  static bool scored(const Draft& draft) {
    return !draft.tree.empty() && !draft.sampled && draft.score.size() == draft.tokens.size();
  }
  // How many of draft's best-scored nodes (scored(draft)) this round verifies: the n in 1 .. nodes that
  // maximises (1 + the n best estimates) / cost[n], where cost[n] is what verifying n nodes costs in units
  // of the plain step the round replaces (cost.size() > the draft's nodes; cost[0] unused). 0: a plain step
  // is worth more than any of the subtrees.
  size_t choose(const Draft& draft, std::span<const double> cost);
  // Keeps the first `keep` nodes of the last choose()'s ranking of `draft` (a subtree), in draft's order.
  void prune(Draft& draft, size_t keep);
  // `draft` (as verified) had `accepted` of its drafts accepted: the estimates learn from it. A tree without
  // scores teaches nothing.
  void record(const Draft& draft, int accepted);

 private:
  // Drafts accepted and the scores of the nodes verified, each round's weight decaying by kRatioDecay per
  // later round; both start at 1 (scores taken at their word).
  static constexpr double kRatioDecay = 0.9;
  double accepted_ = 1.0, scored_ = 1.0;
  std::vector<int32_t> rank_, renumber_;  // choose, prune: nodes by score; old node -> kept node
};

}  // namespace tandem::speculative
