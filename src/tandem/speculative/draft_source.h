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
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<sampling::Distribution> q;  // size >= tokens.size() when sampled; grows, never shrinks
  bool sampled = false;

  void clear() {
    tokens.clear();
    sampled = false;
  }
  // The distribution slot for draft i, growing the pool when needed (no allocation once warm).
  sampling::Distribution& q_slot(size_t i) {
    if (q.size() <= i) q.resize(i + 1);
    return q[i];
  }
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

  // After a round: `committed` is the text now committed (the accepted drafts and the target's token
  // appended), of which the first n_accepted drafts of the last proposal were accepted. The source rolls its
  // state back to a prefix of `committed`; accepted work is kept, not recomputed. Also called with n_accepted
  // = 0 after a proposal the loop only used to probe.
  virtual void accept(std::span<const int32_t> committed, int n_accepted) = 0;

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
