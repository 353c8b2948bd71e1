// EAGLE-2 style dynamic draft trees, shared by the drafters that grow a tree level by level from their own
// distributions (DraftModelSource, EagleDraftSource). A drafter evaluates the frontier a level at a time
// (its nodes of highest cumulative probability, in one drafter forward with the tree attention mask) and
// hands each evaluated node's logits back here; its children are its most probable tokens, as many as
// cover a share of its distribution. The proposal is the max_nodes candidates of highest cumulative
// probability, a subtree since a child is never more probable than its parent, each scored with its path's
// probability under the drafter's whole distributions (Draft::score).
//
// Children are ranked by the drafter's distribution under the target's penalties at temperature 1,
// renormalized over its `branch` most probable tokens, and proposed deterministically (point masses) at any
// temperature: the choice of a node never depends on a draw, as draft_source.h asks of sampled trees too.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/cache/attention.h"
#include "tandem/sampling/sampler.h"
#include "tandem/speculative/draft_source.h"

namespace tandem::speculative {

class DynamicTree {
 public:
  // A candidate node of the tree being drafted. slot: its index among the evaluated nodes (the drafter's
  // cache tree, mask()), -1 while not evaluated.
  struct Candidate {
    int32_t token, parent, depth, slot;
    float logp;   // cumulative log-probability of its path, over each node's top `branch` tokens
    float score;  // probability of its path under the drafter's whole distributions (Draft::score)
  };

  // Before a generation: children are ranked under `target`'s penalties at temperature 1 among the `branch`
  // (>= 1) most probable tokens.
  void begin(const sampling::Params& target, int branch);

  // Forgets the last proposal's candidates; evaluated nodes will be stored from cache position `base`.
  void clear(int64_t base);

  // Appends the children of candidate `parent` (-1: of the committed text) from the drafter's `logits` there,
  // as many as cover `cover` of its ranked distribution, at most `branch` (as given to begin()). `text`: the
  // committed text and the candidate's path (path_text()), for the penalties.
  void add_children(int32_t parent, std::span<const float> logits, std::span<const int32_t> text,
                    float cover);

  // The candidates of depth `level` to evaluate next: at most `expand` (>= 1) of the most probable among
  // those that can still enter a proposal of max_nodes, in candidate order (parents before children). Each
  // is given the next slot. Empty: the tree stops growing (also where the slots would pass max_slots, the
  // drafter's room).
  std::span<const int32_t> expand(int32_t level, int max_nodes, int expand, int64_t max_slots);

  // The evaluated nodes as a tree attention mask (cache::TreeMask: depth 0 for the committed text's
  // children), valid until the next expand() or clear().
  cache::TreeMask mask() const { return {base_, slot_parent_, slot_depth_}; }
  std::span<const int32_t> slot_tokens() const { return slot_token_; }
  int64_t slots() const { return static_cast<int64_t>(slot_token_.size()); }

  // text = committed, then candidate c's path (its ancestors' tokens and its own).
  void path_text(int32_t c, std::span<const int32_t> committed, std::vector<int32_t>& text) const;

  // The evaluated nodes of the path the committed text follows after position `base` (siblings hold distinct
  // tokens), in order, into `kept`.
  void kept_path(std::span<const int32_t> committed, std::vector<int32_t>& kept) const;

  const Candidate& candidate(int32_t i) const { return candidates_[static_cast<size_t>(i)]; }
  int64_t size() const { return static_cast<int64_t>(candidates_.size()); }

  // Writes the max_nodes candidates of highest cumulative probability into out (cleared by the caller) as
  // a tree with scores.
  void propose(int max_nodes, Draft& out);

 private:
  int branch_ = 1;
  sampling::Sampler ranker_{sampling::Params{}};  // the target's penalties at temperature 1, top branch_
  sampling::Sampler scorer_{sampling::Params{}};  // the same over the whole vocabulary
  sampling::Distribution ranked_, scored_;
  std::vector<Candidate> candidates_;
  std::vector<int32_t> order_, picked_, node_of_;
  std::vector<float> logps_;
  int64_t base_ = 0;
  std::vector<int32_t> slot_token_, slot_parent_, slot_depth_;
};

}  // namespace tandem::speculative
