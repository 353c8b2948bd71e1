// The settle step of a speculative round: everything between the target's forward over one sequence's window
// and that sequence's next round. Every driver settles through it (engine::generate_speculative for one
// sequence, engine::Scheduler for many), so "the output is exactly the target's" rests on this step and
// verify.h alone, not on copies that must stay identical.
//
// A round. The sequence's committed text has n tokens; the last one (the pending token) is not yet in the
// target's cache, which holds n - 1 positions. The target ran the window [pending, drafts[0, d)] at positions
// n - 1 .. n - 1 + d and produced d + 1 logit rows, row i predicting position n + i; d == 0 is a plain step.
// settle():
//   1. target distributions: p[i] is the sampler's transform of row i over the committed text followed by
//      drafts[0, i); under a grammar, row i is first masked by the grammar's state after drafts[0, i) (a
//      draft the grammar refuses gets probability 0, so verification rejects it), and the matcher is left
//      where it was: the driver advances it with each committed token;
//   2. verification (verify.h): the accepted prefix of the drafts and the target's token after it;
//   3. the gate learns the round: record_round(d, accepted), or record_idle() for a plain step;
//   4. commits the accepted drafts and then the target's token, in order: each is appended to the committed
//      text and passed to the driver's on_token(token, row) (row: the logit row it was chosen from), which
//      returns false to end the sequence (end of generation, length, a client gone); nothing after that
//      token is committed;
//   5. truncates the cache to the committed text less its new last token: rows of accepted drafts stay,
//      rejected ones go;
//   6. tells the drafter what was kept: DraftSource::accept(committed, accepted drafts still committed).
// A sequence that does not speculate (no gate, no drafter) settles its plain steps the same way, so one
// sequence's tokens come from the same code whether it speculates, runs alone or shares a batch.
//
// Settler keeps the distributions and verification scratch of one sequence: once its buffers have grown to
// the deepest window, settling allocates nothing beyond what on_token does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/cache/kv_cache.h"
#include "tandem/sampling/sampler.h"
#include "tandem/sampling/token_mask.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/gate.h"
#include "tandem/speculative/verify.h"

namespace tandem::speculative {

// The window one target forward verified for a sequence.
struct Window {
  std::span<const float> logits;    // [(drafts.size() + 1) * n_vocab], row i predicting position n + i
  std::span<const int32_t> drafts;  // the verified drafts; empty: a plain step
  std::span<const sampling::Distribution> q;  // empty (deterministic drafts) or drafts.size() drafter
                                              // distributions (Draft::sampled)
};

// A token tree one target forward verified for a sequence (settle_tree): window row 0 is the pending token,
// row i + 1 draft node i, stored at cache positions n - 1 + row and rotated at n - 1 + its depth.
struct TreeWindow {
  std::span<const float> logits;    // [(drafts.size() + 1) * n_vocab], row r predicting the token after row r
  std::span<const int32_t> drafts;  // the tree's tokens
  std::span<const int32_t> parent;  // [drafts] TokenTree::parent
  std::span<const sampling::Distribution> q;  // empty (deterministic drafts) or one per node (Draft::q)
};

// What a sequence brings to its rounds, borrowed for one settle() call.
struct SettleTarget {
  std::vector<int32_t>& committed;  // the prompt and every committed token; grows by the tokens committed
  sampling::Sampler& sampler;
  uint64_t sequence_id;   // keys the sampler's randomness with the positions
  cache::KvCache& cache;  // the target's cache of this sequence, committed.size() - 1 + d + 1 positions
  Gate* gate = nullptr;   // null: no gate learns from this sequence
  DraftSource* source = nullptr;  // null: no drafter follows this sequence
  // null: unconstrained. Otherwise at the committed text's state; settle() leaves it there.
  sampling::GrammarMatcher* grammar = nullptr;
};

struct SettleOutcome {
  int drafted = 0;       // drafts verified
  int accepted = 0;      // of which accepted
  int committed = 0;     // tokens committed: accepted + 1, fewer when on_token ended the sequence
  bool stopped = false;  // on_token returned false
};

class Settler {
 public:
  // on_token(int32_t token, int row) -> bool: see step 4 above.
  template <typename OnToken>
  SettleOutcome settle(const Window& window, const SettleTarget& target, OnToken&& on_token) {
    SettleOutcome out = judge(window, target);
    for (int i = 0; i <= out.accepted; ++i) {
      const int32_t token = i < out.accepted ? window.drafts[static_cast<size_t>(i)] : token_;
      target.committed.push_back(token);
      ++out.committed;
      if (!on_token(token, i)) {
        out.stopped = true;
        break;
      }
    }
    // A sequence that ended early kept only the drafts it committed.
    keep(target, std::min(out.accepted, out.committed));
    return out;
  }

  // settle() for a token tree. Steps as above, with verification walking the tree from the pending token:
  // greedy takes the child equal to the target's choice while there is one, so the accepted path is the
  // target's greedy path; sampling runs recursive rejection sampling over each node's children (SpecInfer):
  // child j is accepted with probability min(1, p'(x_j) / q_j(x_j)), where p' starts as the target's p and
  // becomes normalize(max(0, p' - q_j)) after each rejection, and after the last rejection the target's token
  // is drawn from p' (from p itself at a node without children). Every committed token is distributed as the
  // target's sampler draws it; a chain-shaped tree settles exactly as settle() does. The gate learns nothing
  // from trees. Step 5 keeps the accepted path's cache rows, moved to consecutive positions
  // (KvCache::compact), and step 6 tells the drafter which rows moved (DraftSource::on_tree_kept) and how
  // many drafts of the path stayed committed.
  template <typename OnToken>
  SettleOutcome settle_tree(const TreeWindow& window, const SettleTarget& target, OnToken&& on_token) {
    SettleOutcome out = judge_tree(window, target);
    for (int i = 0; i <= out.accepted; ++i) {
      const size_t k = static_cast<size_t>(i);
      const int32_t token = i < out.accepted ? window.drafts[static_cast<size_t>(path_[k])] : token_;
      target.committed.push_back(token);
      ++out.committed;
      if (!on_token(token, i == 0 ? 0 : path_[k - 1] + 1)) {
        out.stopped = true;
        break;
      }
    }
    keep_tree(target, std::min(out.accepted, out.committed));
    return out;
  }

  // The target distribution of window row i (0 <= i <= drafted) from the last settle(); valid until the next.
  // After settle_tree(): of the i-th node of the walked path (the pending token's at 0).
  const sampling::Distribution& target_distribution(int i) const { return p_[static_cast<size_t>(i)]; }

 private:
  // Steps 1 to 3 of settle_tree(): the accepted path's nodes in path_, the target's token in token_.
  SettleOutcome judge_tree(const TreeWindow& window, const SettleTarget& target);
  // Steps 5 and 6 of settle_tree() for the first `accepted` nodes of path_.
  void keep_tree(const SettleTarget& target, int accepted);
  // p_[slot] = the sampler's transform of `row` over `text`, masked by the grammar's state when there is one.
  void target_distribution(std::span<const float> row, const SettleTarget& target, size_t slot);

  // Steps 1 to 3; the target's token is left in token_.
  SettleOutcome judge(const Window& window, const SettleTarget& target);
  // Steps 5 and 6.
  static void keep(const SettleTarget& target, int accepted);

  std::vector<sampling::Distribution> p_;  // [deepest window + 1], grown on demand
  std::vector<float> masked_;              // [n_vocab] a row of logits under the grammar's mask
  sampling::TokenMask mask_;
  VerifyScratch scratch_;
  int32_t token_ = -1;
  std::vector<int32_t> path_;           // settle_tree: the accepted path's nodes, root first
  std::vector<int32_t> kept_rows_;      // settle_tree: window rows of the kept path, for KvCache::compact
  sampling::Distribution residual_[2];  // settle_tree: p' and the next p' after a rejected child
  int64_t tree_base_ = 0;               // settle_tree: the pending token's cache position
};

}  // namespace tandem::speculative
