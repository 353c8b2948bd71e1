// The shape of a calibrated verify cost curve: which row counts calibration measures, the monotone fit of
// the measured costs, and the dense curve between them. Timings are noisy, but a forward over more rows never
// takes less work, so the gate plans with a non-decreasing curve: a dip would price a wider window below a
// narrower one and make the marginal row look nearly free.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace tandem::speculative {

// The row counts calibration measures up to max_rows (>= 1): every count from 1 to 16, then 24, 32, 48 and
// 64, and max_rows itself (so the measured curve reaches the widest forward asked for); ascending, all <=
// max_rows, the first one 1. Wide forwards cost nearly linearly in their rows, so sparse points past 16 keep
// calibration short while covering the rows a busy server verifies.
std::vector<int> calibration_widths(int max_rows);

// Pool-adjacent-violators isotonic regression, weights 1: replaces y by the non-decreasing sequence closest
// to it in least squares (each run of values that violated the order becomes its mean). A non-decreasing y is
// unchanged. `sums` and `sizes` are workspace; they keep their capacity, so a call on a y no longer than an
// earlier one does not allocate.
void make_nondecreasing(std::span<double> y, std::vector<double>& sums, std::vector<size_t>& sizes);
// The same on a copy.
std::vector<double> nondecreasing(std::span<const double> y);

// The dense curve verify[0 .. widths.back()] (verify[0] unused, set to 1) through the points (widths[i],
// costs[i]), linear between consecutive widths. widths: strictly ascending, the first one 1; costs: one per
// width. Throws tandem::Error on a malformed input.
std::vector<double> interpolate_curve(std::span<const int> widths, std::span<const double> costs);

}  // namespace tandem::speculative
