// The tap store of the drafters that read the target (speculative/tap_store.h): captured layers land in their
// tap's slot of each position's row, whole rows can be set, length() counts the leading positions every tap
// has written, truncate() forgets rows past the committed text, compact() moves a tree round's accepted path
// into place, and a range's view reads what was stored.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/speculative/tap_store.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

// A layer's rows [n, width] whose entry (r, i) is layer * 1000 + (first_pos + r) * 10 + i.
std::vector<float> layer_rows(int64_t layer, int64_t first_pos, int64_t n, int64_t width) {
  std::vector<float> v;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < width; ++i)
      v.push_back(static_cast<float>(layer * 1000 + (first_pos + r) * 10 + i));
  return v;
}

TEST(TapStore, CapturedLayersLandInTheirTapsSlotByPosition) {
  const int64_t w = 3;
  TapStore store({5, 2, 7}, 3, w, 16, "test");
  EXPECT_EQ(store.row_width(), 9);
  EXPECT_EQ(std::vector<int64_t>(store.target_layers().begin(), store.target_layers().end()),
            (std::vector<int64_t>{5, 2, 7}));
  for (int64_t layer : {2, 5, 7, 9}) store.capture(layer, layer_rows(layer, 4, 3, w), 3, 4);
  const std::span<const float> rows = store.rows(4, 3);
  ASSERT_EQ(rows.size(), 27u);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t i = 0; i < w; ++i) {
        const int64_t layer = t == 0 ? 5 : t == 1 ? 2 : 7;  // tap order, not layer order; 9 is not tapped
        EXPECT_EQ(rows[static_cast<size_t>(r * 9 + t * w + i)],
                  static_cast<float>(layer * 1000 + (4 + r) * 10 + i))
            << "row " << r << " tap " << t << " entry " << i;
      }
}

TEST(TapStore, LengthCountsLeadingRowsThatEveryTapWrote) {
  const int64_t w = 2;
  TapStore store({1, 3}, 2, w, 10, "test");
  EXPECT_EQ(store.length(), 0);
  store.capture(1, layer_rows(1, 0, 4, w), 4, 0);
  EXPECT_EQ(store.length(), 0) << "tap 3 has written nothing yet";
  store.capture(3, layer_rows(3, 0, 4, w), 4, 0);
  EXPECT_EQ(store.length(), 4);
  // A verify window of 3 rows after the 4 committed positions, then a rollback keeping one of them.
  for (int64_t layer : {1, 3}) store.capture(layer, layer_rows(layer, 4, 3, w), 3, 4);
  EXPECT_EQ(store.length(), 7);
  store.truncate(5);
  EXPECT_EQ(store.length(), 5);
  // Rows past a gap are stored but not counted.
  for (int64_t layer : {1, 3}) store.capture(layer, layer_rows(layer, 8, 1, w), 1, 8);
  EXPECT_EQ(store.length(), 5);
  EXPECT_EQ(store.rows(8, 1)[0], 1000.0f + 80.0f);
  // Filling the gap counts up to the end of what was written since the truncation.
  for (int64_t layer : {1, 3}) store.capture(layer, layer_rows(layer, 5, 2, w), 2, 5);
  EXPECT_EQ(store.length(), 7);
  store.truncate(0);
  EXPECT_EQ(store.length(), 0);
}

TEST(TapStore, RowsPastTheCapacityAreDropped) {
  const int64_t w = 2;
  TapStore store({0}, 1, w, 4, "test");
  store.capture(0, layer_rows(0, 2, 5, w), 5, 2);
  EXPECT_EQ(store.length(), 0) << "positions 0 and 1 were never written";
  store.capture(0, layer_rows(0, 0, 2, w), 2, 0);
  EXPECT_EQ(store.length(), 2) << "rows written past a gap count once written again";
  EXPECT_EQ(store.rows(3, 1)[1], 31.0f);
  store.capture(0, layer_rows(0, 2, 5, w), 5, 2);
  EXPECT_EQ(store.length(), 4);
  store.capture(0, layer_rows(0, 9, 1, w), 1, 9);  // wholly past the end: nothing happens
  EXPECT_EQ(store.length(), 4);
  EXPECT_THROW(store.rows(3, 2), Error);
  EXPECT_THROW(store.rows(-1, 1), Error);
  EXPECT_TRUE(store.rows(4, 0).empty());
}

TEST(TapStore, SetWritesWholeRows) {
  TapStore store({4, 6}, 2, 2, 8, "test");
  const std::vector<float> rows = {1, 2, 3, 4, 5, 6, 7, 8};  // two positions of [tap 4 | tap 6]
  store.set(0, rows);
  EXPECT_EQ(store.length(), 2);
  const std::span<const float> got = store.rows(0, 2);
  EXPECT_EQ(std::vector<float>(got.begin(), got.end()), rows);
  // Capturing one layer afterwards replaces only its slot.
  store.capture(6, std::vector<float>{9, 10}, 1, 1);
  const std::span<const float> row1 = store.rows(1, 1);
  EXPECT_EQ(std::vector<float>(row1.begin(), row1.end()), (std::vector<float>{5, 6, 9, 10}));
  store.set(7, rows);  // only the first row fits
  EXPECT_EQ(store.rows(7, 1)[3], 4.0f);
}

// A tree round's verify forward wrote a row per window row from position 5 (the pending token, then the
// tree's nodes); the accepted path keeps window rows 0, 2 and 5, which move to positions 5, 6 and 7 as the
// target's cache moves them, and the rows past them are forgotten.
TEST(TapStore, CompactMovesATreesAcceptedPathIntoPlace) {
  const int64_t w = 2;
  TapStore store({3, 1}, 2, w, 16, "test");
  for (int64_t layer : {1, 3}) store.capture(layer, layer_rows(layer, 0, 12, w), 12, 0);
  ASSERT_EQ(store.length(), 12);
  const std::vector<int32_t> kept = {0, 2, 5};
  store.compact(5, kept);
  EXPECT_EQ(store.length(), 8);
  for (size_t i = 0; i < kept.size(); ++i) {
    const std::span<const float> row = store.rows(5 + static_cast<int64_t>(i), 1);
    const int64_t from = 5 + kept[i];
    EXPECT_EQ(
        std::vector<float>(row.begin(), row.end()),
        (std::vector<float>{static_cast<float>(3000 + from * 10), static_cast<float>(3000 + from * 10 + 1),
                            static_cast<float>(1000 + from * 10), static_cast<float>(1000 + from * 10 + 1)}))
        << "kept row " << i;
  }
  EXPECT_EQ(store.rows(4, 1)[0], 3040.0f) << "rows before the tree stay";
  // A tap that had not written every window row keeps only the moved rows it had written.
  TapStore part({3, 1}, 2, w, 16, "test");
  part.capture(3, layer_rows(3, 0, 12, w), 12, 0);
  part.capture(1, layer_rows(1, 0, 8, w), 8, 0);
  part.compact(5, kept);
  EXPECT_EQ(part.length(), 7) << "window row 2 (position 7) was written, row 5 (position 10) was not";
  EXPECT_THROW(part.compact(5, std::vector<int32_t>{0, 3, 2}), Error);
}

TEST(TapStore, RefusesAShapeThatDoesNotFitTheDrafter) {
  try {
    TapStore({1, 2}, 3, 4, 8, "EAGLE");
    FAIL() << "two layers for a drafter of three taps were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the EAGLE drafter reads 3 tap layers, but 2 were named"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(TapStore({}, 0, 4, 8, "test"), Error);
  EXPECT_THROW(TapStore({1}, 1, 0, 8, "test"), Error);
  EXPECT_THROW(TapStore({1}, 1, 4, 0, "test"), Error);
}

}  // namespace
}  // namespace tandem::speculative
