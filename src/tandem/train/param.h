// Trainable tensors and the per-call context of the trainer's operations.
//
// A Param is an owner: an f32 master copy of a weight and, when it trains, its gradient of the same shape.
// The operations (layers.h, attention.h, loss.h) read values, add into gradients and never allocate once
// their scratch has grown to the largest call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/util/thread_pool.h"

namespace tandem::train {

struct Param {
  Param() = default;
  // A [rows, cols] matrix (cols contiguous; cols == 1 for a vector) of zeros, with a zero gradient when it
  // trains.
  Param(std::string name, int64_t rows, int64_t cols, bool trainable, bool decay);

  std::string name;          // the tensor's name in a checkpoint
  int64_t rows = 0;          // out features of a linear map, entries of a table or of a vector
  int64_t cols = 1;          // in features (contiguous); 1 for a vector
  std::vector<float> value;  // [rows, cols] f32 master copy
  std::vector<float> grad;   // [rows, cols]; empty when frozen
  bool decay = false;        // whether AdamW's weight decay applies (matrices yes, norm gains no)

  bool trainable() const { return !grad.empty(); }
  int64_t size() const { return rows * cols; }
  void zero_grad();
};

// A frozen [rows, cols] parameter holding the target's weights (the drafters' embedding and head), with its
// values (zeros) only when `held`: a drafter that only drafts reads the target's own and holds none.
Param target_weight(const std::string& name, int64_t rows, int64_t cols, bool held);

// Buffers an operation borrows for the length of one call, grown to the largest request (so steady-state
// calls do not allocate). Slots are independent; one operation at a time uses a Scratch.
class Scratch {
 public:
  static constexpr int kSlots = 4;
  float* get(int slot, int64_t n);

 private:
  std::vector<float> buf_[kSlots];
};

// What every operation takes: the thread team its loops run on and its scratch. Results depend on the
// thread count only where an operation says so (the matmuls and reductions here split work by output
// element, each reduced in a fixed order, so they do not).
struct Compute {
  explicit Compute(ThreadPool& p) : pool(p) {}
  ThreadPool& pool;
  Scratch scratch;
};

}  // namespace tandem::train
