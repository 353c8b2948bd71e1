#include "tandem/speculative/target_vocab.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tandem/kernels/repack.h"
#include "tandem/tensor/quant.h"
#include "tandem/util/error.h"

namespace tandem::speculative {
namespace {

constexpr size_t kAlign = 64;

void check_shape(const MatrixView& m, const char* what, int64_t rows, int64_t cols) {
  if (m.empty() || m.rows != rows || m.cols != cols)
    throw Error(std::string("the target has no ") + what + " of shape [" + std::to_string(rows) + ", " +
                std::to_string(cols) + "] for the drafter to share (it has [" + std::to_string(m.rows) +
                ", " + std::to_string(m.cols) + "])");
}

}  // namespace

void copy_target_rows(const model::Model& target, bool head, std::span<const int32_t> ids,
                      train::Param& dst) {
  const MatrixView& m = head ? target.weights().output : target.weights().tok_embd;
  const char* what = head ? "output head" : "token embedding";
  check_shape(m, what, ids.empty() ? dst.rows : m.rows, dst.cols);
  if (!ids.empty() && static_cast<int64_t>(ids.size()) != dst.rows)
    throw Error(std::string("the drafter's ") + what + " holds " + std::to_string(dst.rows) +
                " rows, its draft vocabulary " + std::to_string(ids.size()));
  // The head may be repacked (kernels/repack.h): each row is read back in the file's form first.
  std::vector<uint8_t> row(m.row_bytes);
  for (int64_t r = 0; r < dst.rows; ++r) {
    const int64_t src = ids.empty() ? r : ids[static_cast<size_t>(r)];
    if (src < 0 || src >= m.rows)
      throw Error("draft vocabulary token id " + std::to_string(src) +
                  " is outside the target's vocabulary of " + std::to_string(m.rows));
    kernels::file_form_row(m, src, row.data());
    dequantize_row(m.type, row.data(), dst.value.data() + r * dst.cols, dst.cols);
  }
}

TargetVocab::TargetVocab(const model::Model& target, std::span<const int32_t> ids, int64_t d,
                         bool gather_head)
    : embedding_(target.weights().tok_embd), ids_(ids.begin(), ids.end()) {
  const int64_t V = target.config().n_vocab;
  check_shape(embedding_, "token embedding", V, d);
  // The embedding is read a row at a time, so it must be in the file's row layout (the model repacks only
  // matrices that the matmul kernels read).
  TANDEM_CHECK(embedding_.form == WeightForm::kFile, "the target's token embedding is in its file form");
  std::vector<bool> seen(static_cast<size_t>(V), false);
  for (int32_t id : ids_) {
    if (id < 0 || id >= V)
      throw Error("the drafter's draft vocabulary lists token id " + std::to_string(id) +
                  ", outside the target's vocabulary of " + std::to_string(V) +
                  ": train one for this target");
    if (seen[static_cast<size_t>(id)])
      throw Error("the drafter's draft vocabulary lists token id " + std::to_string(id) +
                  " twice: train the drafter again");
    seen[static_cast<size_t>(id)] = true;
  }
  if (!gather_head) return;
  const MatrixView& out = target.weights().output;
  check_shape(out, "output head", V, d);
  if (ids_.empty()) {
    head_ = out;
    return;
  }
  const auto n = static_cast<int64_t>(ids_.size());
  rows_.resize(static_cast<size_t>(n) * out.row_bytes + kAlign);
  uint8_t* data = rows_.data();
  data += (kAlign - reinterpret_cast<uintptr_t>(data) % kAlign) % kAlign;
  for (int64_t i = 0; i < n; ++i)
    kernels::file_form_row(out, ids_[static_cast<size_t>(i)], data + static_cast<size_t>(i) * out.row_bytes);
  head_.type = out.type;
  head_.rows = n;
  head_.cols = d;
  head_.row_bytes = out.row_bytes;
  head_.data = data;
  head_.form = WeightForm::kFile;
  // The gathered rows in the form the target's own head would take on this CPU.
  const WeightForm form = kernels::repack_form(head_.type, head_.rows, head_.cols, data);
  if (form != WeightForm::kFile) {
    kernels::repack_rows(form, head_.type, head_.cols, data, head_.bytes());
    head_.form = form;
  }
}

void TargetVocab::embed(int32_t id, float* out) const {
  if (id < 0 || id >= embedding_.rows)
    throw Error("token id " + std::to_string(id) + " is outside the drafter's vocabulary of " +
                std::to_string(embedding_.rows));
  dequantize_row(embedding_.type, embedding_.row(id), out, embedding_.cols);
}

void TargetVocab::expand(const float* logits, float* full) const {
  if (ids_.empty()) {
    std::memcpy(full, logits, static_cast<size_t>(vocab()) * sizeof(float));
    return;
  }
  std::fill(full, full + vocab(), -INFINITY);
  for (size_t i = 0; i < ids_.size(); ++i) full[ids_[i]] = logits[i];
}

}  // namespace tandem::speculative
