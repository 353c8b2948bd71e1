#include "tandem/speculative/replay.h"

#include "tandem/sampling/rng.h"
#include "tandem/util/error.h"

namespace tandem::speculative {

ReplaySource::ReplaySource(double accept_rate, int64_t n_vocab, uint64_t seed)
    : accept_rate_(accept_rate), n_vocab_(n_vocab), seed_(seed) {
  if (!(accept_rate >= 0.0 && accept_rate <= 1.0))
    throw Error("the replay drafter's acceptance rate must be in [0, 1] (got " + std::to_string(accept_rate) +
                ")");
  if (n_vocab < 2) throw Error("the replay drafter needs a vocabulary of at least 2 tokens");
}

void ReplaySource::begin(std::span<const int32_t>, const DraftSettings&) {
  ++generations_;
  proposals_ = 0;
}

void ReplaySource::propose(std::span<const int32_t> committed, int max_depth, Draft& out) {
  out.clear();
  // One draw sequence per generation and proposal (generations below 2^24, proposals below 2^40).
  const uint64_t round = (generations_ << 40) ^ proposals_++;
  for (size_t pos = committed.size();
       pos < reference_.size() && static_cast<int>(out.tokens.size()) < max_depth; ++pos) {
    int32_t t = reference_[pos];
    if (sampling::uniform(seed_, round, pos, kDrawCorrupt) >= accept_rate_) {
      // Any other token: shift by 1 .. n_vocab - 1.
      const uint64_t shift = 1 + sampling::random_bits(seed_, round, pos, kDrawCorrupt + 1) %
                                     static_cast<uint64_t>(n_vocab_ - 1);
      t = static_cast<int32_t>((static_cast<uint64_t>(t) + shift) % static_cast<uint64_t>(n_vocab_));
    }
    out.tokens.push_back(t);
  }
}

void ReplaySource::accept(std::span<const int32_t>, int) {}

}  // namespace tandem::speculative
