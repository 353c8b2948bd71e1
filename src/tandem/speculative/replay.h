// A synthetic drafter for benchmarks: it proposes a known reference text (the target's own greedy
// continuation from an earlier plain pass), replacing each proposed token, independently with probability 1 -
// accept_rate, by a different token. In greedy decoding every uncorrupted proposal is accepted, so the
// acceptance rate is controlled exactly and the measured speed-up can be compared with the ideal one for that
// rate.
#pragma once

#include <vector>

#include "tandem/speculative/draft_source.h"

namespace tandem::speculative {

class ReplaySource final : public DraftSource {
 public:
  // accept_rate in [0, 1]; n_vocab > 1 (corrupted tokens stay inside the vocabulary).
  ReplaySource(double accept_rate, int64_t n_vocab, uint64_t seed = 0);

  // The text to replay: a prompt followed by its continuation. Proposals read it at the committed length.
  void set_reference(std::vector<int32_t> reference) { reference_ = std::move(reference); }
  // The seed of the corruption draws: another seed, another independent set of corruptions.
  void set_seed(uint64_t seed) { seed_ = seed; }

  std::string_view kind() const override { return "replay"; }
  void begin(std::span<const int32_t> prompt, const DraftSettings& settings) override;
  void propose(std::span<const int32_t> committed, int max_depth, Draft& out) override;
  void accept(std::span<const int32_t> committed, int n_accepted) override;

 private:
  double accept_rate_;
  int64_t n_vocab_;
  uint64_t seed_;
  // Key the corruption draws with the seed: the generation (one per begin) and the proposal within it, so
  // that every proposal of a position is independent, in every generation, even of prompts that match.
  uint64_t generations_ = 0;
  uint64_t proposals_ = 0;
  std::vector<int32_t> reference_;
};

}  // namespace tandem::speculative
