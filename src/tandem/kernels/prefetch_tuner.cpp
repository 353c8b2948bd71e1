#include "tandem/kernels/prefetch_tuner.h"

namespace tandem::kernels {
namespace {

PrefetchReach other(PrefetchReach reach) {
  return reach == PrefetchReach::kFar ? PrefetchReach::kNear : PrefetchReach::kFar;
}

}  // namespace

PrefetchReach PrefetchTuner::begin() {
  const int64_t n = started_++;
  if (forwards_[0] == 0 || forwards_[1] == 0) {
    pending_ = forwards_[0] == 0 ? PrefetchReach::kNear : PrefetchReach::kFar;
    trying_ = true;
    return pending_;
  }
  trying_ = first_try_ > 0 || n % kExplore == kExplore - 1;
  pending_ = trying_ ? other(current_) : current_;
  return pending_;
}

void PrefetchTuner::end(double seconds) {
  const int i = index(pending_), c = index(current_);
  const bool first = forwards_[i] == 0;
  ++forwards_[i];
  if (first) {  // the first measurement of each: the faster one becomes current
    seconds_[i] = seconds;
    if (forwards_[1 - i] > 0 && seconds_[i] < seconds_[1 - i]) current_ = other(current_);
    return;
  }
  if (!trying_) {  // the current reach, smoothed
    seconds_[i] += 0.25 * (seconds - seconds_[i]);
  } else if (first_try_ > 0) {  // the confirmation: the mean of both tries decides
    seconds_[i] = 0.5 * (first_try_ + seconds);
    first_try_ = 0;
    if (seconds_[i] < (1.0 - kMargin) * seconds_[c]) current_ = other(current_);
  } else if (seconds < (1.0 - kMargin) * seconds_[c]) {  // beats the current reach: confirm it first
    first_try_ = seconds;
  } else {
    seconds_[i] = seconds;
  }
}

}  // namespace tandem::kernels
