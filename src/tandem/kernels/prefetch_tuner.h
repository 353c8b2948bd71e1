// Picks the decode kernels' prefetch reach (PrefetchReach in quant_layout.h) by measuring one-row forwards.
//
// How far ahead the one-row kernels should prefetch depends on the machine's memory at the moment, not only
// on the machine: on this project's development machine kind the memory moves between a slow and a fast
// state within seconds, and the far reach decodes about 9% faster in the fast state and about 9% slower in
// the slow one (kernels/quant_avx512.inc, far_prefetch_bytes). So each forward that runs one row takes the
// reach whose latest measured forward was faster, and every kExplore-th one tries the other, so that a change
// of state shows within kExplore forwards. The best reach is measured on every forward it runs, and its time
// is smoothed (half the weight to the newest); the other's is its single latest time. Outputs never depend on
// the reach. Not thread safe: one tuner per Forward.
#pragma once

#include <cstdint>

#include "tandem/kernels/quant_layout.h"

namespace tandem::kernels {

class PrefetchTuner {
 public:
  // One forward in kExplore tries the reach that is not the best.
  static constexpr int64_t kExplore = 16;

  // The reach for the next one-row forward (the first two forwards try each reach once).
  PrefetchReach begin();
  // The measured time of the forward that begin() chose the reach for.
  void end(double seconds);

  // The reach that measured faster so far.
  PrefetchReach best() const;
  // Forwards timed so far with each reach.
  int64_t forwards(PrefetchReach reach) const { return forwards_[index(reach)]; }

 private:
  static constexpr int index(PrefetchReach reach) { return reach == PrefetchReach::kFar ? 1 : 0; }

  double seconds_[2] = {0, 0};  // per reach: latest time (smoothed for the best), 0 before any
  int64_t forwards_[2] = {0, 0};
  int64_t started_ = 0;  // forwards begun
  PrefetchReach pending_ = PrefetchReach::kNear;
  bool exploring_ = false;  // the pending forward tries the reach that is not the best
};

}  // namespace tandem::kernels
