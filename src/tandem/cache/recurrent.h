// The state a sequence keeps for its recurrent (state-space) layers, in place of keys and values: per layer,
// the causal convolution's last d_conv - 1 inputs and the selective scan's state.
//
// Rollback is exact. Each layer keeps a few state slots (the same slot indices in every layer): `base` (the
// state after oldest() positions), `current` (after current() positions) and, for a verify window, one slot
// per row; and the inputs of each row since oldest() (the convolution's input x, the time step dt before
// softplus, B and C: 2 d_inner + 2 d_state floats, against d_conv - 1 + d_state rows of d_inner for a state).
//
// A window of at most window_rows() rows (the longest verify window the owner announces, at most depth + 1:
// a rollback reaches depth positions back) keeps the state after each of its rows: row j reads the slot of
// the state after first + j and writes its new state into another slot, which the next row reads (the kernels
// write a state apart from the one they read at no extra cost: no second pass, no copy). Its first row's
// input slot becomes `base`. Accepting k of its w rows is rollback(first + k): `current` becomes the slot of
// row k's state by index, nothing is copied, and the next forward starts from it with nothing to replay. That
// holds for any rollback into the window until the next forward; window_rows() + 1 slots hold a window's
// states.
//
// Every other rollback moves newest() only, and the next forward (model/ssm.h) replays the kept inputs of the
// rows between oldest() and the rollback's length on `base` with the same kernels, which gives the bits that
// decoding them did, and continues from there (`base` then starts at the rollback's length). Those are
// rollbacks into a run of single rows (a drafter's steps, plain decoding), and into a forward of more rows
// than window_rows() (a prompt chunk: its rows update `current` in place and keep no per-row states). A
// longer forward starts `base` at its first row for free: its first row reads the current state and writes
// another slot, and the two exchange roles. So a rollback reaches back to the first row of the last forward
// of several rows (to depth rows before the end of one longer than depth + depth / 2), or the last rollback's
// length, and across runs of single rows at least `depth` positions: those keep `base` where it is until the
// kept rows would pass depth + depth / 2, and then move it to depth rows before the end by one replay of the
// rows between. The state after length 0 is all zeros. replayed_rows() counts the rows replayed.
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
// (append(), read_slot(), write_slot()); the lengths already describe the state after the forward.
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
// Bytes a sequence keeps for its recurrent layers with rollback depth `depth` and verify windows of at most
// `window` rows (0: depth + 1): RecurrentState::slots(depth, window) states, the inputs of
// RecurrentState::rows_kept(depth) rows and, at most, RecurrentState::kMaxSnapshots snapshots.
size_t recurrent_sequence_bytes(const Geometry& geometry, int64_t depth, int64_t window = 0);

class RecurrentState {
 public:
  enum class Slot { kBase, kCurrent };

  // The plan of the forward begin_append() announced, for rows [first, end), in the roles the slots have
  // after it. Before its rows, a layer replays the kept rows [replay_from, replay_to) on `base` in place
  // (after a rollback: up to first, so that `base` holds the state after first; or, in long runs of single
  // rows, to move `base` forward). With row_states, the row at first + j reads the state after first + j from
  // its slot and writes the next one into another (read_slot(), write_slot()); the first reads `base`.
  // Otherwise the row at first reads slot first_in (`base` after a replay); when first < new_base < end, the
  // row at new_base - 1 writes its state into `base` and the row at new_base reads it from there; every other
  // row updates `current` in place. Rows from max(first, new_base) on keep their inputs. Without rollback,
  // new_base == end: no row keeps its inputs or writes `base`.
  struct Append {
    int64_t first = 0, end = 0, new_base = 0;
    int64_t replay_from = 0, replay_to = 0;
    int32_t first_in = 0;
    bool row_states = false;
  };

  static constexpr int64_t kSnapshotEvery = 256;
  static constexpr int64_t kMaxSnapshots = 2;

  // depth: the deepest rollback kept, in positions; 0: no rollback (see above). window: the most rows of a
  // verify window the owner runs (a drafter's depth + 1), whose rows keep their states; 0: depth + 1.
  RecurrentState(const Geometry& geometry, int64_t depth, int64_t window = 0);

  // Rows whose inputs a sequence of rollback depth `depth` keeps.
  static int64_t rows_kept(int64_t depth) { return depth > 0 ? depth + std::max<int64_t>(1, depth / 2) : 0; }
  // The most rows of a forward that keep each row's state: the window announced, at most depth + 1 (a verify
  // window of depth drafts and the row after them).
  static int64_t window_rows(int64_t depth, int64_t window = 0) {
    return depth > 0 ? (window > 0 ? std::min(window, depth + 1) : depth + 1) : 0;
  }
  // States a sequence keeps per layer: a window's first state and one per row (`base` and `current` among
  // them), or `current` only without rollback.
  static int64_t slots(int64_t depth, int64_t window = 0) {
    return depth > 0 ? window_rows(depth, window) + 1 : 1;
  }

  int64_t depth() const { return depth_; }
  int64_t window_rows() const { return window_; }
  int64_t d_inner() const { return d_inner_; }
  int64_t d_state() const { return d_state_; }
  int64_t d_conv() const { return d_conv_; }
  // The lengths a rollback may reach: [oldest(), newest()].
  int64_t oldest() const { return oldest_; }
  int64_t newest() const { return newest_; }
  // The length whose state `current` holds: newest() after a forward; after a rollback, until the next
  // forward rebuilds it, the length before the rollback, unless the rollback found that length's state kept
  // (a window's row).
  int64_t current() const { return current_; }
  const Append& append() const { return append_; }
  // Rows the forwards replayed so far (each counted once, not per layer).
  int64_t replayed_rows() const { return replayed_rows_; }
  // Bytes of one state (every recurrent layer) and of everything this sequence keeps (snapshots counted
  // at their most).
  size_t bytes_per_state() const;
  size_t bytes() const;

  // A recurrent layer's states: conv [d_conv - 1, d_inner] (oldest input first) and ssm [d_state, d_inner],
  // by role or by slot index (0 <= slot < slots(depth)).
  float* conv(int64_t layer, Slot s) { return conv_at(layer, role(s)); }
  float* ssm(int64_t layer, Slot s) { return ssm_at(layer, role(s)); }
  const float* conv(int64_t layer, Slot s) const { return conv_at(layer, role(s)); }
  const float* ssm(int64_t layer, Slot s) const { return ssm_at(layer, role(s)); }
  float* conv_at(int64_t layer, int32_t slot) { return conv_.data() + slot_offset(layer, slot, conv_size()); }
  float* ssm_at(int64_t layer, int32_t slot) { return ssm_.data() + slot_offset(layer, slot, ssm_size()); }
  const float* conv_at(int64_t layer, int32_t slot) const {
    return conv_.data() + slot_offset(layer, slot, conv_size());
  }
  const float* ssm_at(int64_t layer, int32_t slot) const {
    return ssm_.data() + slot_offset(layer, slot, ssm_size());
  }
  // The slots the row at `pos` of the forward append() plans reads its state from and writes it to.
  int32_t read_slot(int64_t pos) const {
    const Append& a = append_;
    if (a.row_states) return row_slots_[static_cast<size_t>(pos - a.first)];
    if (pos == a.first) return a.first_in;
    return a.new_base > a.first && pos == a.new_base ? base_ : current_slot_;
  }
  int32_t write_slot(int64_t pos) const {
    const Append& a = append_;
    if (a.row_states) return row_slots_[static_cast<size_t>(pos - a.first + 1)];
    return a.new_base > a.first && a.new_base < a.end && pos + 1 == a.new_base ? base_ : current_slot_;
  }
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
  int32_t role(Slot s) const { return s == Slot::kBase ? base_ : current_slot_; }
  size_t slot_offset(int64_t layer, int32_t slot, size_t size) const {
    return (static_cast<size_t>(index_[static_cast<size_t>(layer)]) * slots_ + static_cast<size_t>(slot)) *
           size;
  }
  // Gives `current` a slot of its own when it shares `base`'s (a rollback to a window's first row), before
  // rows update it in place.
  void separate_current();
  // Sets the zero state in `base` and `current`, two slots apart (one without rollback).
  void reset_slots();

  struct Snapshot {
    int64_t length = -1;      // -1: unused
    std::vector<float> conv;  // [recurrent layers, d_conv - 1, d_inner]
    std::vector<float> ssm;   // [recurrent layers, d_state, d_inner]
  };
  void take_snapshot();
  void drop_snapshots_after(int64_t n);

  int64_t depth_, window_, d_inner_, d_state_, d_conv_;
  size_t slots_;  // slots(depth, window)
  size_t rows_;   // rows_kept(depth)
  int64_t n_recurrent_ = 0;
  std::vector<int32_t> index_;  // [n_layer] position among the recurrent layers, -1 for other layers
  std::vector<float> conv_;     // [recurrent layers, slots_, d_conv - 1, d_inner]
  std::vector<float> ssm_;      // [recurrent layers, slots_, d_state, d_inner]
  std::vector<float> inputs_;   // [recurrent layers, rows_, 2 * d_inner + 2 * d_state]
  int64_t oldest_ = 0, newest_ = 0, current_ = 0;
  int32_t base_ = 0, current_slot_ = 0;  // the slots holding the states after oldest_ and current_
  // The last window that kept its rows' states: the state after kept_first_ + j is in row_slots_[j], for
  // j <= kept_rows_ (0: none kept, or no longer: a forward ran since).
  std::vector<int32_t> row_slots_;  // [window_ + 1]
  int64_t kept_first_ = 0, kept_rows_ = 0;
  int64_t replayed_rows_ = 0;
  Append append_;
  std::vector<Snapshot> snapshots_;  // [kMaxSnapshots], buffers allocated on first use
  int64_t last_snapshot_ = 0;        // length of the newest snapshot taken (0: none)
};

}  // namespace tandem::cache
