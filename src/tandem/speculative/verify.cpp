#include "tandem/speculative/verify.h"

#include "tandem/sampling/rng.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/util/error.h"

namespace tandem::speculative {

double acceptance_probability(int32_t x, const sampling::Distribution& p, const sampling::Distribution* q) {
  const double px = p.prob_of(x);
  const double qx = q ? q->prob_of(x) : 1.0;
  if (!(qx > 0.0)) return 1.0;  // x could not have been drawn from q; never reached with a consistent q
  return px >= qx ? 1.0 : px / qx;
}

VerifyOutcome verify(std::span<const int32_t> drafts, std::span<const sampling::Distribution> p,
                     std::span<const sampling::Distribution> q, const sampling::Sampler& sampler,
                     uint64_t sequence, uint64_t first_pos, VerifyScratch& scratch) {
  const size_t d = drafts.size();
  TANDEM_CHECK(p.size() == d + 1, "verify needs one target distribution per draft plus one");
  TANDEM_CHECK(q.empty() || q.size() == d, "verify needs one drafter distribution per draft, or none");
  const bool greedy = sampler.params().temperature <= 0.0f;
  const uint64_t seed = sampler.params().seed;
  VerifyOutcome out;
  for (size_t i = 0; i < d; ++i) {
    const int32_t x = drafts[i];
    const uint64_t pos = first_pos + i;
    if (greedy) {
      // p is a point mass on the target's choice.
      if (p[i].ids.front() == x) {
        ++out.accepted;
        continue;
      }
      out.token = p[i].ids.front();
      return out;
    }
    const sampling::Distribution* qi = q.empty() ? nullptr : &q[i];
    const double px = p[i].prob_of(x);
    const double qx = qi ? qi->prob_of(x) : 1.0;
    // Accept when u < p(x) / q(x), i.e. u * q(x) < p(x); u in [0, 1), so p >= q always accepts.
    if (px > 0.0 && (px >= qx || sampling::uniform(seed, sequence, pos, kDrawAccept) * qx < px)) {
      ++out.accepted;
      continue;
    }
    if (!qi) {
      scratch.point.clear();
      scratch.point.ids.push_back(x);
      scratch.point.probs.push_back(1.0f);
      qi = &scratch.point;
    }
    sampling::residual(p[i], *qi, scratch.residual);
    out.token = sampler.draw(scratch.residual, sequence, pos, kDrawResidual);
    return out;
  }
  out.token = greedy ? p[d].ids.front() : sampler.draw(p[d], sequence, first_pos + d, kDrawTarget);
  return out;
}

}  // namespace tandem::speculative
