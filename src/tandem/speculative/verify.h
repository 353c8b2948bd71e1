// Verification of one drafted window against the target's distributions: a pure function of its inputs (the
// randomness is the sampler's counter-based RNG, keyed by position), so it is tested without any model.
//
// Greedy (temperature 0): drafts are accepted while each equals the target's choice at its position (the
// argmax after penalties); the target's choice at the first mismatch, or after a fully accepted window, ends
// the round.
//
// Sampling (speculative sampling, Leviathan et al. / Chen et al.): draft x at a position is accepted with
// probability min(1, p(x) / q(x)); on rejection the round ends with a token drawn from normalize(max(0, p -
// q)); after a fully accepted window a bonus token is drawn from the next p. Each committed token is then
// distributed exactly as the target's sampler would draw it. A deterministic draft has q = a point mass on x.
#pragma once

#include <cstdint>
#include <span>

#include "tandem/sampling/sampler.h"

namespace tandem::speculative {

struct VerifyOutcome {
  int accepted = 0;    // drafts accepted, a prefix of the window
  int32_t token = -1;  // the target's token after them (correction or bonus)
};

// Scratch reused across rounds, so verification does not allocate once warm.
struct VerifyScratch {
  sampling::Distribution point;     // a point mass for deterministic drafts
  sampling::Distribution residual;  // normalize(max(0, p - q))
};

// drafts: the window's drafts, drafts[i] at position first_pos + i.
// p: drafts.size() + 1 target distributions; p[i] predicts position first_pos + i, after the sampler's
//    transforms over the history that ends with drafts[0, i).
// q: empty for deterministic drafts, else drafts.size() drafter distributions (same transforms).
// sampler: supplies the seed and the draws; greedy when its temperature is 0.
VerifyOutcome verify(std::span<const int32_t> drafts, std::span<const sampling::Distribution> p,
                     std::span<const sampling::Distribution> q, const sampling::Sampler& sampler,
                     uint64_t sequence, uint64_t first_pos, VerifyScratch& scratch);

// The probability that the target accepts draft x where it would sample from p, the drafter from q (null: a
// deterministic draft): min(1, p(x) / q(x)). 1 or 0 in greedy mode.
double acceptance_probability(int32_t x, const sampling::Distribution& p, const sampling::Distribution* q);

}  // namespace tandem::speculative
