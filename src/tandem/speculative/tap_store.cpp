#include "tandem/speculative/tap_store.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "tandem/util/error.h"

namespace tandem::speculative {

TapStore::TapStore(std::vector<int32_t> layers, int64_t n_taps, int64_t width, int64_t capacity,
                   const char* drafter)
    : layers_(std::move(layers)),
      target_layers_(layers_.begin(), layers_.end()),
      width_(width),
      capacity_(capacity),
      filled_(layers_.size(), 0) {
  if (layers_.empty() || static_cast<int64_t>(layers_.size()) != n_taps)
    throw Error(std::string("the ") + drafter + " drafter reads " + std::to_string(n_taps) +
                " tap layers, but " + std::to_string(layers_.size()) + " were named");
  if (width_ < 1) throw Error(std::string("the ") + drafter + " drafter needs a positive width");
  if (capacity_ < 1)
    throw Error(std::string("the ") + drafter + " drafter needs a context of at least one position");
  rows_.assign(static_cast<size_t>(capacity_ * row_width()), 0.0f);
}

int64_t TapStore::length() const {
  return *std::min_element(filled_.begin(), filled_.end());
}

void TapStore::extend(size_t tap, int64_t first_pos, int64_t end) {
  int64_t& filled = filled_[tap];
  if (first_pos <= filled) filled = std::max(filled, end);
}

void TapStore::capture(int64_t layer, std::span<const float> hidden, int64_t n_rows, int64_t first_pos) {
  const int64_t width = row_width();
  const int64_t n = std::min(n_rows, capacity_ - first_pos);
  if (first_pos < 0 || n <= 0) return;
  TANDEM_CHECK(static_cast<int64_t>(hidden.size()) >= n * width_, "captured rows are [n_rows, width]");
  for (size_t t = 0; t < layers_.size(); ++t) {
    if (layers_[t] != layer) continue;
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(rows_.data() + (first_pos + r) * width + static_cast<int64_t>(t) * width_,
                  hidden.data() + r * width_, static_cast<size_t>(width_) * sizeof(float));
    extend(t, first_pos, first_pos + n);
  }
}

void TapStore::set(int64_t first_pos, std::span<const float> rows) {
  const int64_t width = row_width();
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(rows.size()) / width, capacity_ - first_pos);
  if (first_pos < 0 || n <= 0) return;
  std::memcpy(rows_.data() + first_pos * width, rows.data(), static_cast<size_t>(n * width) * sizeof(float));
  for (size_t t = 0; t < layers_.size(); ++t) extend(t, first_pos, first_pos + n);
}

void TapStore::truncate(int64_t n) {
  for (int64_t& filled : filled_) filled = std::min(filled, std::max<int64_t>(0, n));
}

void TapStore::compact(int64_t base, std::span<const int32_t> rows) {
  const int64_t width = row_width();
  const auto n = static_cast<int64_t>(rows.size());
  TANDEM_CHECK(base >= 0 && base + n <= capacity_, "tap rows compacted past the store's capacity");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = rows[static_cast<size_t>(i)];
    TANDEM_CHECK(r >= i && (i == 0 || r > rows[static_cast<size_t>(i - 1)]) && base + r < capacity_,
                 "compacted tap rows are increasing and move rows down");
    if (r != i)
      std::memmove(rows_.data() + (base + i) * width, rows_.data() + (base + r) * width,
                   static_cast<size_t>(width) * sizeof(float));
  }
  // A tap keeps the leading moved rows it had written.
  for (int64_t& filled : filled_) {
    int64_t kept = 0;
    while (kept < n && base + rows[static_cast<size_t>(kept)] < filled) ++kept;
    filled = std::min(filled, base + kept);
  }
}

std::span<const float> TapStore::rows(int64_t first, int64_t n) const {
  if (first < 0 || n < 0 || first + n > capacity_)
    throw Error("tap rows " + std::to_string(first) + " .. " + std::to_string(first + n - 1) +
                " are outside the store's " + std::to_string(capacity_) + " positions");
  const int64_t width = row_width();
  return {rows_.data() + first * width, static_cast<size_t>(n * width)};
}

}  // namespace tandem::speculative
