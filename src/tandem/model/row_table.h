// A row table: one operation per exact row count or row range, so each phase runs the kernel built for its
// shape (one decode row, a 2-16 row verify window, a many-row prompt chunk).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::model {

template <typename Op>
class RowTable {
 public:
  struct Entry {
    int64_t from;  // inclusive
    int64_t to;    // inclusive
    Op op;
  };

  // Entries must not overlap; added in any order.
  RowTable& add(int64_t from, int64_t to, Op op) {
    TANDEM_CHECK(from >= 1 && from <= to, "row table range must satisfy 1 <= from <= to");
    for (const Entry& e : entries_) TANDEM_CHECK(to < e.from || from > e.to, "row table ranges overlap");
    entries_.push_back({from, to, std::move(op)});
    return *this;
  }

  // The operation for exactly `rows` rows; throws tandem::Error when no entry covers it.
  const Op& at(int64_t rows) const {
    for (const Entry& e : entries_)
      if (rows >= e.from && rows <= e.to) return e.op;
    throw Error("no operation is declared for " + std::to_string(rows) + " rows");
  }
  bool covers(int64_t rows) const {
    for (const Entry& e : entries_)
      if (rows >= e.from && rows <= e.to) return true;
    return false;
  }
  // The largest row count any entry accepts (0 when empty).
  int64_t max_rows() const {
    int64_t m = 0;
    for (const Entry& e : entries_) m = e.to > m ? e.to : m;
    return m;
  }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

}  // namespace tandem::model
