// The interface every drafter implements for the speculative drivers (engine::generate_speculative for one
// sequence, engine::Scheduler for many; both settle rounds through settle.h). A draft source proposes tokens
// that continue the committed text; the target verifies them in one forward; the source is then told what was
// kept and rolls its own state back to it. A driver never looks inside a source, so drafters that read the
// target's hidden states (EAGLE-style heads, DFlash-style block drafters, MTP modules) plug in through the
// same calls: they name the target layers they read and receive those layers' outputs after every target
// forward.
//
// Call order for one generation:
//   begin(prompt, settings)
//   repeat: [on_target_hidden(...)]* propose(committed, max_depth, draft) accept(committed', n_accepted)
// A source is used by one driver (one thread) at a time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "tandem/sampling/sampler.h"
#include "tandem/sampling/token_mask.h"

namespace tandem::speculative {

// Draw indices of the sampler's counter-based RNG (keyed by seed, sequence, position, draw index). Each
// random decision about one position has its own index, so a seeded run repeats exactly, whichever rounds the
// gate chooses. A plain sampling step (and the bonus token of a fully accepted window) uses index 0, exactly
// as engine::generate does, so a speculative run that never drafts reproduces the plain run token for token.
inline constexpr uint32_t kDrawTarget = 0;    // a token drawn from the target's p
inline constexpr uint32_t kDrawAccept = 1;    // the uniform of the min(1, p/q) acceptance test
inline constexpr uint32_t kDrawResidual = 2;  // the draw from normalize(max(0, p - q)) after a rejection
inline constexpr uint32_t kDrawDraft = 3;     // a draft model's own draw from q
inline constexpr uint32_t kDrawCorrupt = 4;   // reserved for synthetic drafters (replay.h)
// A token tree's node with several children: the first child's acceptance uses kDrawAccept, child j >= 1's
// kDrawSibling + j (j < kMaxSiblings), so a chain-shaped tree draws exactly what the chain draws.
inline constexpr uint32_t kDrawSibling = 16;
inline constexpr int kMaxSiblings = 32;

// A token tree of drafts (SpecInfer, Sequoia; EAGLE-2's dynamic trees). Node i's parent is parent[i] < i (-1:
// it continues the committed text directly), so the nodes are in topological order; depth[i] is the number
// of drafts on its path, itself included (1 for the children of the committed text). Siblings hold
// distinct tokens, so the committed text after a round names the accepted path.
struct TokenTree {
  std::vector<int32_t> parent;  // [nodes]
  std::vector<int32_t> depth;   // [nodes]

  size_t size() const { return parent.size(); }
  bool empty() const { return parent.empty(); }
  void clear() {
    parent.clear();
    depth.clear();
  }
  // Appends a child of `of` (-1: of the committed text) and returns its index.
  int32_t add(int32_t of) {
    depth.push_back(of < 0 ? 1 : depth[static_cast<size_t>(of)] + 1);
    parent.push_back(of);
    return static_cast<int32_t>(parent.size()) - 1;
  }
  int32_t max_depth() const {
    int32_t d = 0;
    for (int32_t x : depth) d = std::max(d, x);
    return d;
  }
};

// What a generation tells its source once, before the first round.
struct DraftSettings {
  sampling::Params sampling;  // the target's sampler; a sampling drafter applies the same transforms to q
  uint64_t sequence_id = 0;   // keys the RNG together with positions
  // Constrained output: the driver's grammar matcher, at the committed text's state whenever propose() is
  // called (null: unconstrained). A drafter that can proposes only what it allows (a draft model masks its
  // rows, so q is the masked distribution); drivers check every draft against it either way. Borrowed for
  // the generation.
  const sampling::GrammarMatcher* grammar = nullptr;
};

// One round's proposal. `tokens` continue the committed text in order. When `sampled` is true, q[i] is the
// distribution tokens[i] was drawn from (after the same sampler transforms as the target's p); when false,
// the proposal is deterministic (argmax, lookup, replay) and q is a point mass on each token.
//
// A tree proposal (DraftSource::propose_tree) fills `tree` as well: tokens[i] is node i of the tree. A
// sampled tree's q[i] is the distribution node i was drawn from given its earlier siblings (the drafter's q
// with the earlier siblings' tokens removed, renormalized, when it draws siblings without replacement); the
// choice of which nodes the tree holds may depend on their ancestors and earlier siblings, never on the
// node's own draw. An empty tree: the tokens are a chain.
//
// A deterministic tree may carry score[i], the drafter's estimate of the chance that the target accepts node
// i (its path's probability under the drafter; a child never scores above its parent). The driver may then
// verify only the subtree of the best-scored nodes that it expects to yield the most tokens per unit of
// verify cost. Empty: no estimates, the whole tree is verified.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<sampling::Distribution> q;  // size >= tokens.size() when sampled; grows, never shrinks
  bool sampled = false;
  TokenTree tree;
  std::vector<float> score;  // [nodes] or empty

  void clear() {
    tokens.clear();
    sampled = false;
    tree.clear();
    score.clear();
  }
  // The distribution slot for draft i, growing the pool when needed (no allocation once warm).
  sampling::Distribution& q_slot(size_t i) {
    if (q.size() <= i) q.resize(i + 1);
    return q[i];
  }
};

class DraftSource;

// One sequence's proposal in a batched round (DraftSource::propose_batch): the arguments propose() takes.
struct DraftRequest {
  DraftSource* source = nullptr;
  std::span<const int32_t> committed;
  int max_depth = 0;
  Draft* out = nullptr;
};

class DraftSource {
 public:
  virtual ~DraftSource() = default;

  // A short name of the kind of source ("model", "ngram", "replay"): calibration and gate settings are kept
  // per kind.
  virtual std::string_view kind() const = 0;

  // Starts a generation after `prompt`. Discards any state of an earlier generation.
  virtual void begin(std::span<const int32_t> prompt, const DraftSettings& settings) = 0;

  // Proposes at most max_depth (>= 1) tokens continuing `committed` (the prompt and every token generated so
  // far, the last one included). Writes into `out` (cleared first); an empty proposal is allowed and makes
  // the loop take a plain step. Drafts for position p = committed.size() + i use RNG keys at position p only.
  virtual void propose(std::span<const int32_t> committed, int max_depth, Draft& out) = 0;

  // Proposes a token tree (Draft::tree) of at most max_nodes (>= 1) drafts whose paths hold at most max_depth
  // (>= 1) drafts, continuing `committed`, with the RNG keys of propose(). The driver verifies the whole tree
  // in one target forward and keeps its longest accepted path; accept() then receives the committed text,
  // which names that path, and the number of its drafts kept. A source without trees proposes a chain of
  // min(max_nodes, max_depth) drafts (the default), which the driver verifies as a chain. Drivers ask for
  // trees only from sources that read no target hidden states (target_layers() empty) or follow them through
  // tree rounds (follows_tree_rows()).
  virtual void propose_tree(std::span<const int32_t> committed, int max_nodes, int max_depth, Draft& out) {
    propose(committed, std::min(max_nodes, max_depth), out);
  }

  // Whether the source keeps the target's hidden states through a tree round: its verify forward hands the
  // source (on_target_hidden) a row per window row (the pending token, then the verified tree's nodes in
  // order) at consecutive positions, and on_tree_kept() then says which of them the accepted path kept.
  virtual bool follows_tree_rows() const { return false; }

  // After a tree round, before accept(): of the verify forward's rows stored from position `base` (window
  // row r at base + r), rows[i] (increasing, rows[0] == 0: the pending token) now sits at base + i, as the
  // target's cache moved them (KvCache::compact); the others are gone.
  virtual void on_tree_kept(int64_t base, std::span<const int32_t> rows) { (void)base, (void)rows; }

  // After a round: `committed` is the text now committed (the accepted drafts and the target's token
  // appended), of which the first n_accepted drafts of the last proposal were accepted. The source rolls its
  // state back to a prefix of `committed`; accepted work is kept, not recomputed. Also called with n_accepted
  // = 0 after a proposal the loop only used to probe.
  virtual void accept(std::span<const int32_t> committed, int n_accepted) = 0;

  // Sources that return the same non-null group can draft together: a driver with several sequences calls
  // propose_batch() on one of them with a request per sequence (each source at most once), which proposes for
  // every request exactly what propose() would, sharing its drafter forwards. Null (the default): the source
  // proposes alone.
  virtual const void* batch_group() const { return nullptr; }
  virtual void propose_batch(std::span<const DraftRequest> requests) {
    for (const DraftRequest& r : requests) r.source->propose(r.committed, r.max_depth, *r.out);
  }

  // Sources that read the target's hidden states list the layers they want (0..n_layer-1: a decoder layer's
  // residual output; n_layer: the post-final-norm output). Empty (the default): the loop runs target forwards
  // without capture.
  virtual std::span<const int64_t> target_layers() const { return {}; }

  // During every target forward (prompt, plain step, verify window), for each layer in target_layers():
  // hidden [n_rows, n_embd] of rows at positions first_pos .. first_pos + n_rows - 1, borrowed for the call.
  // Rows of a verify window past the accepted prefix are rolled back later: accept() says how many were kept.
  virtual void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                                int64_t first_pos) {
    (void)layer, (void)hidden, (void)n_rows, (void)first_pos;
  }
};

}  // namespace tandem::speculative
