// The state a sequence keeps for its recurrent (state-space) layers, in place of keys and values: per layer,
// the causal convolution's last d_conv - 1 inputs and the selective scan's state.
//
// Rollback is exact and costs nothing: the states after each of the last `depth` positions are kept, in a
// ring of depth + 1 slots indexed by length % (depth + 1). A forward row at position p reads the slot of
// length p and writes the slot of length p + 1, so a verify window of w <= depth rows leaves the state after
// every one of its rows, and accepting k of them is rollback(first + k): it only moves `newest`. The state
// after length 0 is all zeros.
//
// Not thread safe: one thread appends and rolls back; a forward's channel-parallel passes read and write
// disjoint channels of the slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/cache/geometry.h"

namespace tandem::cache {

// Bytes of one state of every recurrent layer of `geometry` (0 when it has none). A decode step reads one
// and writes one; a sequence keeps depth + 1 of them.
size_t recurrent_state_bytes(const Geometry& geometry);

class RecurrentState {
 public:
  // depth >= 1: the deepest rollback kept, in positions.
  RecurrentState(const Geometry& geometry, int64_t depth);

  int64_t depth() const { return depth_; }
  int64_t d_inner() const { return d_inner_; }
  int64_t d_state() const { return d_state_; }
  int64_t d_conv() const { return d_conv_; }
  // The lengths whose state is held: [oldest(), newest()].
  int64_t oldest() const { return oldest_; }
  int64_t newest() const { return newest_; }
  // Bytes of one state (every recurrent layer) and of all the slots this sequence holds.
  size_t bytes_per_state() const;
  size_t bytes() const { return bytes_per_state() * static_cast<size_t>(depth_ + 1); }

  // The state of a recurrent layer after the first `length` positions: conv [d_conv - 1, d_inner] (oldest
  // input first) and ssm [d_state, d_inner]. `length` selects a ring slot; whether it is held is the
  // caller's contract (oldest() <= length <= newest(), or about to be written by a forward).
  float* conv(int64_t layer, int64_t length) { return conv_.data() + offset(layer, length, conv_size()); }
  float* ssm(int64_t layer, int64_t length) { return ssm_.data() + offset(layer, length, ssm_size()); }
  const float* conv(int64_t layer, int64_t length) const {
    return conv_.data() + offset(layer, length, conv_size());
  }
  const float* ssm(int64_t layer, int64_t length) const {
    return ssm_.data() + offset(layer, length, ssm_size());
  }

  // Makes `n` the newest length (n = 0: the zero state). Throws tandem::Error, changing nothing, when the
  // state after n positions is no longer held.
  void rollback(int64_t n);
  // A forward is about to write the states after lengths (first, end] from the state after `first` (which
  // must be held): afterwards [max(oldest, end - depth), end] are held.
  void begin_append(int64_t first, int64_t end);

 private:
  size_t conv_size() const { return static_cast<size_t>((d_conv_ - 1) * d_inner_); }
  size_t ssm_size() const { return static_cast<size_t>(d_inner_ * d_state_); }
  size_t offset(int64_t layer, int64_t length, size_t size) const {
    const auto slot = static_cast<size_t>(length % (depth_ + 1));
    return (static_cast<size_t>(index_[static_cast<size_t>(layer)]) * static_cast<size_t>(depth_ + 1) +
            slot) *
           size;
  }
  void clear_slot(int64_t length);

  int64_t depth_, d_inner_, d_state_, d_conv_;
  int64_t n_recurrent_ = 0;
  std::vector<int32_t> index_;  // [n_layer] position among the recurrent layers, -1 for other layers
  std::vector<float> conv_;     // [recurrent layers, depth + 1, d_conv - 1, d_inner]
  std::vector<float> ssm_;      // [recurrent layers, depth + 1, d_state, d_inner]
  int64_t oldest_ = 0, newest_ = 0;
};

}  // namespace tandem::cache
