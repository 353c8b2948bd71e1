// The decode kernels' prefetch reach tuner (kernels/prefetch_tuner.h): it measures both reaches, settles on
// the faster one, keeps trying the other one forward in kExplore, and follows a change of the machine's
// memory state.
#include "tandem/kernels/prefetch_tuner.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace tandem::kernels {
namespace {

constexpr PrefetchReach kNear = PrefetchReach::kNear, kFar = PrefetchReach::kFar;
constexpr int64_t kExplore = PrefetchTuner::kExplore;

// Runs n forwards whose times come from time_of(reach); returns how many took the far reach.
template <typename TimeOf>
int64_t run(PrefetchTuner& tuner, int64_t n, TimeOf time_of) {
  int64_t far = 0;
  for (int64_t i = 0; i < n; ++i) {
    const PrefetchReach reach = tuner.begin();
    far += reach == kFar;
    tuner.end(time_of(reach));
  }
  return far;
}

TEST(PrefetchTuner, FirstForwardsTryEachReach) {
  PrefetchTuner tuner;
  EXPECT_EQ(kNear, tuner.best());
  EXPECT_EQ(kNear, tuner.begin());
  tuner.end(0.010);
  EXPECT_EQ(kFar, tuner.begin());
  tuner.end(0.009);
  EXPECT_EQ(kFar, tuner.best());
  EXPECT_EQ(1, tuner.forwards(kNear));
  EXPECT_EQ(1, tuner.forwards(kFar));
}

TEST(PrefetchTuner, SettlesOnTheFasterReachAndExploresTheOther) {
  for (const bool far_faster : {true, false}) {
    SCOPED_TRACE(far_faster ? "far faster" : "near faster");
    PrefetchTuner tuner;
    const auto time_of = [&](PrefetchReach r) { return (r == kFar) == far_faster ? 0.011 : 0.012; };
    const int64_t n = 20 * kExplore, far = run(tuner, n, time_of);
    EXPECT_EQ(far_faster ? kFar : kNear, tuner.best());
    // Two first forwards, then one in kExplore for the slower reach.
    const int64_t slower = far_faster ? n - far : far;
    EXPECT_GE(slower, n / kExplore - 1);
    EXPECT_LE(slower, n / kExplore + 2);
    EXPECT_EQ(n, tuner.forwards(kNear) + tuner.forwards(kFar));
  }
}

TEST(PrefetchTuner, FollowsAChangeOfMemoryState) {
  PrefetchTuner tuner;
  // Fast state: far 0.011 s, near 0.012 s. Slow state: far 0.018 s, near 0.0165 s.
  bool fast = true;
  const auto time_of = [&](PrefetchReach r) {
    return fast ? (r == kFar ? 0.011 : 0.012) : (r == kFar ? 0.018 : 0.0165);
  };
  run(tuner, 4 * kExplore, time_of);
  ASSERT_EQ(kFar, tuner.best());
  for (const bool next : {false, true, false}) {
    fast = next;
    // Within two rounds of exploration the tuner takes the reach that is faster now, and then stays on it.
    run(tuner, 2 * kExplore, time_of);
    const PrefetchReach want = fast ? kFar : kNear;
    EXPECT_EQ(want, tuner.best()) << (fast ? "fast" : "slow");
    const int64_t far = run(tuner, 4 * kExplore, time_of);
    EXPECT_EQ(fast ? 4 * kExplore - 4 : 4, far) << (fast ? "fast" : "slow");
    EXPECT_EQ(want, tuner.best());
  }
}

TEST(PrefetchTuner, HoldsTheFasterReachOnANoisyMachine) {
  // Forward times that vary by up to 10% either way (a fixed pseudo-random sequence), the far reach 7% faster
  // on average: a try that wins by chance must not switch the reach for kExplore forwards (without the
  // confirmation of a winning try 0.87 of the forwards take the far reach, with it 0.92).
  PrefetchTuner tuner;
  uint32_t state = 12345;
  const auto time_of = [&](PrefetchReach r) {
    state = state * 1664525u + 1013904223u;
    const double noise = 1.0 + 0.2 * (static_cast<double>(state >> 8) / 16777216.0 - 0.5);
    return (r == kFar ? 0.0112 : 0.012) * noise;
  };
  const int64_t n = 200 * kExplore, far = run(tuner, n, time_of);
  EXPECT_EQ(kFar, tuner.best());
  EXPECT_GE(static_cast<double>(far) / static_cast<double>(n), 0.92) << far << " of " << n;
}

TEST(PrefetchTuner, OneSlowForwardOfTheBestReachDoesNotUnseatIt) {
  PrefetchTuner tuner;
  const auto time_of = [](PrefetchReach r) { return r == kFar ? 0.011 : 0.012; };
  run(tuner, 3, time_of);  // both measured, far best
  ASSERT_EQ(kFar, tuner.best());
  // A forward that ran late (another process took the core): its time is smoothed with the earlier ones.
  ASSERT_EQ(kFar, tuner.begin());
  tuner.end(0.0125);
  EXPECT_EQ(kFar, tuner.best());
}

}  // namespace
}  // namespace tandem::kernels
