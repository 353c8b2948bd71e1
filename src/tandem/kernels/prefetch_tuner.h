// Picks the kernels' prefetch reach (PrefetchReach in quant_layout.h) for forwards of one width (a Forward
// keeps one tuner for one row and one for two) by measuring them.
//
// How far ahead the one-row kernels should prefetch depends on the machine's memory at the moment, not only
// on the machine: on this project's development machine kind the memory moves between a slow and a fast
// state within seconds, and the far reach decodes faster in the fast state and slower in the slow one
// (kernels/quant_prefetch_avx512.h, far_prefetch_bytes; two-row Q4_0 windows alike; performance.md). So
// each forward of the tuner's width takes the current reach, and every kExplore-th one tries the other. The
// current reach's estimated time is smoothed over the forwards it runs (a quarter of the weight to the
// newest). A try replaces the other's estimate, but a try that beats the current estimate by kMargin is
// confirmed by a second one right after: the reach changes when the mean of the two is kMargin below the
// current estimate. A change of state thus shows within about kExplore forwards, and the noise of single
// forwards on a shared machine does not flip the reach back and forth (tests/test_prefetch_tuner.cpp).
// Outputs never depend on the reach. Not thread safe: one tuner per Forward.
#pragma once

#include <cstdint>

#include "tandem/kernels/quant_layout.h"

namespace tandem::kernels {

class PrefetchTuner {
 public:
  // One forward in kExplore tries the reach that is not the current one.
  static constexpr int64_t kExplore = 16;
  // How much faster a try of the other reach must measure (twice) to take over.
  static constexpr double kMargin = 0.03;

  // The reach for the next forward of the tuner's width (the first two forwards try each reach once).
  PrefetchReach begin();
  // The measured time of the forward that begin() chose the reach for.
  void end(double seconds);

  // The reach that the forwards take between tries: the faster one so far.
  PrefetchReach best() const { return current_; }
  // Forwards timed so far with each reach.
  int64_t forwards(PrefetchReach reach) const { return forwards_[index(reach)]; }

 private:
  static constexpr int index(PrefetchReach reach) { return reach == PrefetchReach::kFar ? 1 : 0; }

  double seconds_[2] = {0, 0};  // per reach: estimated time of a forward
  int64_t forwards_[2] = {0, 0};
  int64_t started_ = 0;  // forwards begun
  PrefetchReach current_ = PrefetchReach::kNear;
  PrefetchReach pending_ = PrefetchReach::kNear;
  bool trying_ = false;  // the pending forward tries the reach that is not the current one
  // The time of a try that beat the current reach, awaiting its confirmation (0: none).
  double first_try_ = 0;
};

}  // namespace tandem::kernels
