// Speculative generation of one sequence: each round a draft source proposes up to d tokens, the target
// checks the window [last committed token, drafts] in one forward, and speculative::Settler settles the round
// (verification, commits, the target's cache and the drafter rolled back to what was kept), as the scheduler
// does for each of its sequences. Accepted tokens are never recomputed.
//
// The output is the target's: greedy runs produce exactly the tokens of engine::generate, and sampled runs
// draw every token from exactly the distribution engine::generate would draw it from (speculative/verify.h).
// The adaptive gate (speculative/gate.h) chooses each round's depth, 0 meaning a plain decode step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/engine/generate.h"
#include "tandem/model/session.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/gate.h"

namespace tandem::engine {

struct SpecOptions {
  GenerateOptions generate;  // max_tokens, sampling, sequence_id: as for generate()
  int draft_max = 8;         // drafts per round at most (>= 1)
  int draft_min = 1;         // a shorter proposal is not verified; the round is a plain step instead
  bool use_gate = true;      // false: always draft draft_max (where tokens and context allow)
  speculative::GateSettings gate;
  speculative::CostModel costs;  // the gate's costs; empty verify: CostModel::linear(0.25, 0) is assumed
  // > 0: each round proposes a token tree of at most this many drafts, draft_max deep at most
  // (DraftSource::propose_tree), verified in one target forward (Settler::settle_tree). With use_gate, a
  // tree whose nodes carry scores (Draft::score) is cut to the subtree of best-scored nodes that promises the
  // most tokens per unit of cost on `costs` (none: a plain step); without, or without scores, the whole tree
  // is verified. 0: chains. Trees need a target without recurrent layers and an f16 or f32 cache.
  int tree_nodes = 0;
};

struct SpecStats : GenerateStats {
  int64_t target_forwards = 0;           // after the prompt: plain steps plus verify rounds
  int64_t rounds = 0;                    // verify rounds (with drafts)
  int64_t drafted = 0;                   // drafts verified
  int64_t accepted = 0;                  // drafts accepted
  int64_t probes = 0;                    // unverified probe proposals
  int64_t tree_rounds = 0;               // verify rounds over a token tree (counted in rounds too)
  std::vector<int64_t> depth_histogram;  // [draft_max + 1]: target forwards by the number of drafts verified
  // [max(draft_max, tree_nodes) + 2]: target forwards after the prompt by their rows (1: a plain step), to
  // price a run at a cost curve
  std::vector<int64_t> rows_histogram;
  // By draft position (entry k - 1 for the k-th draft of a round): the verify rounds that proposed a k-th
  // draft (a chain of k or more drafts, a tree k or more deep), and those of them that accepted it (and so
  // every draft before it).
  std::vector<int64_t> proposed_by_position, accepted_by_position;

  // Counts one verify round in the totals and by position: `drafted` drafts verified, `depth` deep (the
  // chain's length, the tree's depth), of which the first `accepted` along the path were accepted.
  void record_round(int64_t drafted, int depth, int accepted);
  // Entry k - 1: the fraction of verify rounds that accepted draft position k, of those that proposed it,
  // for k = 1 up to the deepest position proposed (empty before any round).
  std::vector<double> acceptance_by_position() const;

  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0; }
  // Accepted drafts per verify round (the target's own token not counted).
  double mean_accepted() const { return rounds > 0 ? static_cast<double>(accepted) / rounds : 0.0; }
  double tokens_per_forward() const {
    return target_forwards > 0 ? static_cast<double>(generated) / target_forwards : 0.0;
  }
  double tokens_per_second() const { return generate_seconds > 0 ? generated / generate_seconds : 0.0; }
  // Adds another run's counts (histograms of the same size).
  void add(const SpecStats& other);
};

// Generates after `prompt` (non-empty) on a target session that is empty or holds a shorter prefix of it,
// like generate(); under options.generate.grammar every draft is checked against the grammar and cut at its
// first refused token, and verification masks the target's rows, so the output is constrained plain
// generation's. `source` is begun here with the whole prompt.
// The end-of-generation token, when reached, is passed to on_token and ends the run.
SpecStats generate_speculative(model::Session& target, speculative::DraftSource& source,
                               std::span<const int32_t> prompt, const SpecOptions& options,
                               const TokenFn& on_token, const EogFn& is_eog);

}  // namespace tandem::engine
