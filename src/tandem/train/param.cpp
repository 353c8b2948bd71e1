#include "tandem/train/param.h"

#include <algorithm>
#include <utility>

namespace tandem::train {

Param::Param(std::string name_, int64_t rows_, int64_t cols_, bool trainable_, bool decay_)
    : name(std::move(name_)), rows(rows_), cols(cols_), decay(decay_) {
  value.assign(static_cast<size_t>(rows * cols), 0.0f);
  if (trainable_) grad.assign(value.size(), 0.0f);
}

Param target_weight(const std::string& name, int64_t rows, int64_t cols, bool held) {
  if (held) return Param(name, rows, cols, false, false);
  Param p;
  p.name = name;
  p.rows = rows;
  p.cols = cols;
  return p;
}

void Param::zero_grad() {
  std::fill(grad.begin(), grad.end(), 0.0f);
}

float* Scratch::get(int slot, int64_t n) {
  std::vector<float>& b = buf_[slot];
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
  return b.data();
}

}  // namespace tandem::train
