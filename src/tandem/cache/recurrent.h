// The state a sequence keeps for its recurrent (state-space) layers, in place of keys and values: per layer,
// the causal convolution's last d_conv - 1 inputs and the selective scan's state.
//
// Rollback is exact and keeps little: per layer two states, `base` (after oldest() positions) and `current`
// (after current() positions), and the inputs of each row since oldest() (the convolution's input x, the
// time step dt before softplus, B and C: 2 d_inner + 2 d_state floats, against d_conv - 1 + d_state rows of
// d_inner for a state). A forward of several rows (a verify window, a prompt chunk) starts `base` at its
// first row for free: its first row reads the current state and writes the other slot, and the two slots
// exchange roles. Accepting k of w rows is rollback(first + k): it only moves newest(); the next forward
// (model/ssm.h) replays the kept inputs of the k accepted rows on `base` with the same kernels, which gives
// the bits that decoding them did, and continues from there (`base` then starts at the rollback's length).
// So a rollback reaches back to the first row of the last forward of several rows (to depth rows before the
// end of one longer than depth + depth / 2), or the last rollback's length, and across runs of single rows
// (a drafter's steps, plain decoding) at least `depth` positions: those keep `base` where it is until the
// kept rows would pass depth + depth / 2, and then move it to depth rows before the end by one replay of the
// rows between. The state after length 0 is all zeros.
//
// Without rollback (depth 0, for a caller that never truncates the sequence except to 0: plain decoding and
// prefill without a drafter) a sequence keeps one state and no inputs: every row updates `current` in place
// and nothing is replayed. A rollback to 0, to the current length or to a snapshot's length still works; any
// other throws tandem::Error.
//
// Prefix reuse: when a forward starts kSnapshotEvery or more positions past the last snapshot, the current
// state is copied aside with its length (at most kMaxSnapshots, the oldest replaced). A rollback to exactly
// such a length restores it, however far back it is, so a sequence sharing that many leading tokens resumes
// there (engine/cache_pool.h). Snapshots past a rollback's length are dropped, since later tokens may differ.
//
// A forward announces its rows with begin_append(), which records the plan the mixer follows layer by layer
// (append()); the lengths already describe the state after the forward.
//
// Not thread safe: one thread appends and rolls back; a forward's channel-parallel passes read and write
// disjoint channels of the states and inputs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/cache/geometry.h"

namespace tandem::cache {

// Bytes of one state of every recurrent layer of `geometry` (0 when it has none). A decode step reads one
// and writes one.
size_t recurrent_state_bytes(const Geometry& geometry);
// Bytes a sequence keeps for its recurrent layers with rollback depth `depth`: two states (one at depth 0),
// the inputs of RecurrentState::rows_kept(depth) rows and, at most, RecurrentState::kMaxSnapshots snapshots.
size_t recurrent_sequence_bytes(const Geometry& geometry, int64_t depth);

class RecurrentState {
 public:
  enum class Slot { kBase, kCurrent };

  // The plan of the forward begin_append() announced, for rows [first, end), in the roles the slots have
  // after it. Before its rows, a layer replays the kept rows [replay_from, replay_to) on `base` in place
  // (after a rollback: up to first, so that `base` holds the state after first; or, in long runs of single
  // rows, to move `base` forward). The row at first reads `base` when first_reads_base, else `current`;
  // when first < new_base < end, the row at new_base - 1 writes its state into `base` and the row at
  // new_base reads it from there; every other row updates `current` in place. Rows from max(first, new_base)
  // on keep their inputs. Without rollback, new_base == end: no row keeps its inputs or writes `base`.
  struct Append {
    int64_t first = 0, end = 0, new_base = 0;
    int64_t replay_from = 0, replay_to = 0;
    bool first_reads_base = false;
  };

  static constexpr int64_t kSnapshotEvery = 256;
  static constexpr int64_t kMaxSnapshots = 2;

  // depth: the deepest rollback kept, in positions; 0: no rollback (see above).
  RecurrentState(const Geometry& geometry, int64_t depth);

  // Rows whose inputs a sequence of rollback depth `depth` keeps.
  static int64_t rows_kept(int64_t depth) { return depth > 0 ? depth + std::max<int64_t>(1, depth / 2) : 0; }
  // States a sequence of rollback depth `depth` keeps per layer: `base` and `current`, or `current` only.
  static int64_t slots(int64_t depth) { return depth > 0 ? 2 : 1; }

  int64_t depth() const { return depth_; }
  int64_t d_inner() const { return d_inner_; }
  int64_t d_state() const { return d_state_; }
  int64_t d_conv() const { return d_conv_; }
  // The lengths a rollback may reach: [oldest(), newest()].
  int64_t oldest() const { return oldest_; }
  int64_t newest() const { return newest_; }
  // The length whose state `current` holds: newest() after a forward; after a rollback, until the next
  // forward rebuilds it, the length before the rollback.
  int64_t current() const { return current_; }
  const Append& append() const { return append_; }
  // Bytes of one state (every recurrent layer) and of everything this sequence keeps (snapshots counted
  // at their most).
  size_t bytes_per_state() const;
  size_t bytes() const;

  // A recurrent layer's states: conv [d_conv - 1, d_inner] (oldest input first) and ssm [d_state, d_inner].
  float* conv(int64_t layer, Slot s) { return conv_.data() + slot_offset(layer, s, conv_size()); }
  float* ssm(int64_t layer, Slot s) { return ssm_.data() + slot_offset(layer, s, ssm_size()); }
  const float* conv(int64_t layer, Slot s) const { return conv_.data() + slot_offset(layer, s, conv_size()); }
  const float* ssm(int64_t layer, Slot s) const { return ssm_.data() + slot_offset(layer, s, ssm_size()); }
  // The kept inputs of the row at position `pos` of a recurrent layer: [x: d_inner][dt: d_inner][B: d_state]
  // [C: d_state]. Held for oldest() <= pos < newest() (and written by the forward that runs the row); none
  // without rollback.
  float* inputs(int64_t layer, int64_t pos) {
    return inputs_.data() + (static_cast<size_t>(index_[static_cast<size_t>(layer)]) * rows_ +
                             static_cast<size_t>(pos % static_cast<int64_t>(rows_))) *
                                input_size();
  }
  size_t input_size() const { return static_cast<size_t>(2 * d_inner_ + 2 * d_state_); }

  // The longest length <= n (n <= newest()) a rollback reaches: n within the rollback depth, else the
  // longest snapshot's, else 0.
  int64_t reachable(int64_t n) const;
  // Lengths of the snapshots held, for tests.
  std::vector<int64_t> snapshot_lengths() const;

  // Makes `n` the newest length (n = 0: the zero state). Throws tandem::Error, changing nothing, when the
  // state after n positions is no longer reachable (without rollback: unless n is 0, newest() or a
  // snapshot's length).
  void rollback(int64_t n);
  // A forward is about to run rows [first, end) from the state after `first` (== newest()): records its
  // plan (append()) and the lengths after it.
  void begin_append(int64_t first, int64_t end);

 private:
  size_t conv_size() const { return static_cast<size_t>((d_conv_ - 1) * d_inner_); }
  size_t ssm_size() const { return static_cast<size_t>(d_inner_ * d_state_); }
  // Without rollback both names are the one state.
  size_t slot_offset(int64_t layer, Slot s, size_t size) const {
    const size_t which = depth_ == 0 ? 0 : (s == Slot::kBase) != swapped_ ? 0 : 1;
    return (static_cast<size_t>(index_[static_cast<size_t>(layer)]) * slots_ + which) * size;
  }

  struct Snapshot {
    int64_t length = -1;      // -1: unused
    std::vector<float> conv;  // [recurrent layers, d_conv - 1, d_inner]
    std::vector<float> ssm;   // [recurrent layers, d_state, d_inner]
  };
  void take_snapshot();
  void drop_snapshots_after(int64_t n);

  int64_t depth_, d_inner_, d_state_, d_conv_;
  size_t slots_;  // slots(depth)
  size_t rows_;   // rows_kept(depth)
  int64_t n_recurrent_ = 0;
  std::vector<int32_t> index_;  // [n_layer] position among the recurrent layers, -1 for other layers
  std::vector<float> conv_;     // [recurrent layers, slots_ (base, current), d_conv - 1, d_inner]
  std::vector<float> ssm_;      // [recurrent layers, slots_, d_state, d_inner]
  std::vector<float> inputs_;   // [recurrent layers, rows_, 2 * d_inner + 2 * d_state]
  int64_t oldest_ = 0, newest_ = 0, current_ = 0;
  bool swapped_ = false;  // the slots' roles are exchanged (a window starting from the current state)
  Append append_;
  std::vector<Snapshot> snapshots_;  // [kMaxSnapshots], buffers allocated on first use
  int64_t last_snapshot_ = 0;        // length of the newest snapshot taken (0: none)
};

}  // namespace tandem::cache
