// Shared helpers for the test suite.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hwy/targets.h"

namespace tandem::testing {

// Path of a file under ../shared; fails the current test (with a message saying how to get it) when the
// shared folder is missing. Never skips silently.
std::string shared_path(const std::string& relative);

// Runs a shell command; its standard output and exit status (-1 when it did not exit normally).
std::pair<std::string, int> run_command(const std::string& command);

// n floats drawn from the standard normal distribution, the same for the same seed.
std::vector<float> normal_floats(int64_t n, uint32_t seed);

// Pearson's chi-square of draws against a distribution: `counts` maps each token drawn to its count over
// `runs` draws, (ids, probs) is the distribution. Tokens whose expected count is below 5 are pooled into one
// bin; `outside` counts the draws of tokens the distribution does not hold.
struct ChiSquare {
  double chi2 = 0;
  int bins = 0;
  int outside = 0;
};
ChiSquare chi_square(const std::vector<int32_t>& ids, const std::vector<float>& probs,
                     const std::map<int32_t, int>& counts, int runs);

// Upper 1e-4 quantile of chi-square with k degrees of freedom (Wilson-Hilferty approximation).
double chi2_critical_1e4(int k);

// A fresh directory per test (named after `prefix`, the process and the running test), removed with it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs fn once per Highway target this machine supports (then restores normal dispatch).
template <typename Fn>
void for_each_hwy_target(Fn&& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace tandem::testing
