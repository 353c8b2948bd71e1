#include "tandem/speculative/cost_curve.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::speculative {

std::vector<int> calibration_widths(int max_rows) {
  if (max_rows < 1) throw Error("calibration measures at least one row");
  std::vector<int> widths;
  for (int r = 1; r <= std::min(16, max_rows); ++r) widths.push_back(r);
  for (int r : {24, 32, 48, 64})
    if (r <= max_rows) widths.push_back(r);
  if (widths.back() < max_rows) widths.push_back(max_rows);
  return widths;
}

void make_nondecreasing(std::span<double> y, std::vector<double>& sums, std::vector<size_t>& sizes) {
  // A stack of blocks, each the mean of a run of y: a new value that falls below the block before it merges
  // with it, and merges go on while the merged block's mean falls below the one before.
  sums.clear();
  sizes.clear();
  for (double v : y) {
    sums.push_back(v);
    sizes.push_back(1);
    while (sums.size() > 1) {
      const size_t b = sums.size() - 1;
      if (sums[b - 1] * static_cast<double>(sizes[b]) <= sums[b] * static_cast<double>(sizes[b - 1])) break;
      sums[b - 1] += sums[b];
      sizes[b - 1] += sizes[b];
      sums.pop_back();
      sizes.pop_back();
    }
  }
  size_t at = 0;
  for (size_t b = 0; b < sums.size(); ++b) {
    const double mean = sums[b] / static_cast<double>(sizes[b]);
    for (size_t i = 0; i < sizes[b]; ++i) y[at++] = mean;
  }
}

std::vector<double> nondecreasing(std::span<const double> y) {
  std::vector<double> out(y.begin(), y.end());
  std::vector<double> sums;
  std::vector<size_t> sizes;
  make_nondecreasing(out, sums, sizes);
  return out;
}

std::vector<double> interpolate_curve(std::span<const int> widths, std::span<const double> costs) {
  if (widths.empty() || widths.size() != costs.size() || widths[0] != 1)
    throw Error("a cost curve needs one cost per width, starting at one row");
  for (size_t i = 1; i < widths.size(); ++i)
    if (widths[i] <= widths[i - 1]) throw Error("a cost curve's widths must be strictly ascending");
  std::vector<double> verify(static_cast<size_t>(widths.back()) + 1, 1.0);
  verify[1] = costs[0];
  for (size_t i = 1; i < widths.size(); ++i) {
    const int a = widths[i - 1], b = widths[i];
    for (int r = a + 1; r < b; ++r) {
      const double t = static_cast<double>(r - a) / static_cast<double>(b - a);
      verify[static_cast<size_t>(r)] = costs[i - 1] + t * (costs[i] - costs[i - 1]);
    }
    verify[static_cast<size_t>(b)] = costs[i];
  }
  return verify;
}

}  // namespace tandem::speculative
