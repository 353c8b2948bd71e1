// The target's hidden states at a drafter's tap layers, by position: what the drafters that read the target
// (EAGLE-3, DFlash) keep of its forwards. Row p holds the tap layers' states at position p side by side, in
// tap order, [n_taps * width]. Rows arrive a layer at a time as the target's forwards capture them
// (DraftSource::on_target_hidden) or whole (set(), from stored training data); truncate() forgets the rows
// past the committed text when a round settles, as the target's cache drops its rejected rows.
//
// length() counts the leading positions that every tap layer has written since the last truncate(): a row
// written past a gap is stored but not counted until the gap is filled and the row written again.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem::speculative {

class TapStore {
 public:
  // layers: the target layers tapped, in order; width: one layer's row (the target's n_embd); capacity: the
  // positions held (the longest sequence). `drafter` names the drafter in errors. Throws tandem::Error
  // unless there are n_taps layers (the drafter's shape) and width and capacity are positive.
  TapStore(std::vector<int32_t> layers, int64_t n_taps, int64_t width, int64_t capacity, const char* drafter);

  std::span<const int32_t> layers() const { return layers_; }
  // The same layers, as DraftSource::target_layers() lists them.
  std::span<const int64_t> target_layers() const { return target_layers_; }
  int64_t n_taps() const { return static_cast<int64_t>(layers_.size()); }
  int64_t width() const { return width_; }
  int64_t row_width() const { return n_taps() * width_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const;

  // Stores hidden [n_rows, width], target layer `layer` at positions first_pos .. first_pos + n_rows - 1,
  // into the slot of every tap that reads that layer (none: ignored). Rows past the capacity are dropped.
  void capture(int64_t layer, std::span<const float> hidden, int64_t n_rows, int64_t first_pos);
  // Stores whole rows [n, row_width()] at positions first_pos .. first_pos + n - 1 (past the capacity:
  // dropped).
  void set(int64_t first_pos, std::span<const float> rows);
  // Forgets the rows at positions n and after (length() becomes at most n).
  void truncate(int64_t n);
  // Moves the rows at base + rows[i] to base + i (rows increasing, each >= its index), as KvCache::compact
  // moves a tree's accepted path, and forgets the rows past them (length() becomes at most base +
  // rows.size(), less where a moved row was not written).
  void compact(int64_t base, std::span<const int32_t> rows);

  // The rows of positions first .. first + n - 1, [n, row_width()], valid until the next write. Throws
  // tandem::Error when the range leaves [0, capacity()).
  std::span<const float> rows(int64_t first, int64_t n) const;

 private:
  // A tap's leading written rows grow over [first_pos, end) when that range starts within them.
  void extend(size_t tap, int64_t first_pos, int64_t end);

  std::vector<int32_t> layers_;
  std::vector<int64_t> target_layers_;
  int64_t width_;
  int64_t capacity_;
  std::vector<float> rows_;      // [capacity, n_taps * width]
  std::vector<int64_t> filled_;  // per tap: the leading positions written since the last truncate()
};

}  // namespace tandem::speculative
