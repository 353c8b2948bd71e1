#include "tandem/kernels/prefetch_tuner.h"

namespace tandem::kernels {

PrefetchReach PrefetchTuner::best() const {
  return forwards_[1] > 0 && (forwards_[0] == 0 || seconds_[1] < seconds_[0]) ? PrefetchReach::kFar
                                                                              : PrefetchReach::kNear;
}

PrefetchReach PrefetchTuner::begin() {
  const int64_t n = started_++;
  if (forwards_[0] == 0 || forwards_[1] == 0) {
    pending_ = forwards_[0] == 0 ? PrefetchReach::kNear : PrefetchReach::kFar;
    exploring_ = true;
    return pending_;
  }
  const PrefetchReach b = best();
  exploring_ = n % kExplore == kExplore - 1;
  pending_ = exploring_ ? (b == PrefetchReach::kFar ? PrefetchReach::kNear : PrefetchReach::kFar) : b;
  return pending_;
}

void PrefetchTuner::end(double seconds) {
  const int i = index(pending_);
  seconds_[i] = exploring_ || forwards_[i] == 0 ? seconds : 0.5 * (seconds_[i] + seconds);
  ++forwards_[i];
}

}  // namespace tandem::kernels
