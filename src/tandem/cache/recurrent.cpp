#include "tandem/cache/recurrent.h"

#include <algorithm>
#include <string>

#include "tandem/util/error.h"

namespace tandem::cache {

namespace {
int64_t recurrent_layers(const Geometry& g) {
  int64_t layers = 0;
  for (int64_t l = 0; l < g.n_layer; ++l) layers += g.recurrent(l) ? 1 : 0;
  return layers;
}
}  // namespace

size_t recurrent_state_bytes(const Geometry& g) {
  return static_cast<size_t>(recurrent_layers(g) *
                             ((g.ssm_d_conv - 1) * g.ssm_d_inner + g.ssm_d_inner * g.ssm_d_state)) *
         sizeof(float);
}

size_t recurrent_sequence_bytes(const Geometry& g, int64_t depth, int64_t window) {
  const auto inputs = static_cast<size_t>(recurrent_layers(g) * RecurrentState::rows_kept(depth) *
                                          (2 * g.ssm_d_inner + 2 * g.ssm_d_state)) *
                      sizeof(float);
  return static_cast<size_t>(RecurrentState::slots(depth, window) + RecurrentState::kMaxSnapshots) *
             recurrent_state_bytes(g) +
         inputs;
}

RecurrentState::RecurrentState(const Geometry& g, int64_t depth, int64_t window)
    : depth_(depth),
      window_(window_rows(depth, window)),
      d_inner_(g.ssm_d_inner),
      d_state_(g.ssm_d_state),
      d_conv_(g.ssm_d_conv),
      slots_(static_cast<size_t>(slots(depth, window))),
      rows_(static_cast<size_t>(rows_kept(depth))) {
  TANDEM_CHECK(depth >= 0 && window >= 0, "recurrent rollback depth and window must not be negative");
  TANDEM_CHECK(d_inner_ > 0 && d_state_ > 0 && d_conv_ >= 1, "bad recurrent state shape");
  index_.assign(static_cast<size_t>(g.n_layer), -1);
  for (int64_t l = 0; l < g.n_layer; ++l)
    if (g.recurrent(l)) index_[static_cast<size_t>(l)] = static_cast<int32_t>(n_recurrent_++);
  const auto layers = static_cast<size_t>(n_recurrent_);
  try {
    conv_.assign(layers * slots_ * conv_size(), 0.0f);
    ssm_.assign(layers * slots_ * ssm_size(), 0.0f);
    inputs_.assign(layers * rows_ * input_size(), 0.0f);
    row_slots_.assign(static_cast<size_t>(window_ + 1), 0);
    snapshots_.resize(static_cast<size_t>(kMaxSnapshots));
  } catch (const std::bad_alloc&) {
    throw Error("cannot allocate the recurrent state (" + std::to_string(bytes() >> 20) +
                " MiB per sequence); use fewer sequences");
  }
  current_slot_ = slots_ > 1 ? 1 : 0;
}

size_t RecurrentState::bytes_per_state() const {
  return static_cast<size_t>(n_recurrent_) * (conv_size() + ssm_size()) * sizeof(float);
}

size_t RecurrentState::bytes() const {
  return (slots_ + static_cast<size_t>(kMaxSnapshots)) * bytes_per_state() +
         static_cast<size_t>(n_recurrent_) * rows_ * input_size() * sizeof(float);
}

int64_t RecurrentState::reachable(int64_t n) const {
  if (n >= oldest_ && n <= newest_) return n;
  int64_t best = 0;
  for (const Snapshot& snap : snapshots_)
    if (snap.length <= n) best = std::max(best, snap.length);
  return best;
}

std::vector<int64_t> RecurrentState::snapshot_lengths() const {
  std::vector<int64_t> out;
  for (const Snapshot& snap : snapshots_)
    if (snap.length > 0) out.push_back(snap.length);
  std::sort(out.begin(), out.end());
  return out;
}

void RecurrentState::take_snapshot() {
  Snapshot* slot = &snapshots_[0];
  for (Snapshot& snap : snapshots_)
    if (snap.length < slot->length) slot = &snap;  // an unused one (-1), else the shortest
  const auto layers = static_cast<size_t>(n_recurrent_);
  if (slot->conv.empty()) {
    slot->conv.resize(layers * conv_size());
    slot->ssm.resize(layers * ssm_size());
  }
  for (size_t l = 0; l < index_.size(); ++l) {
    if (index_[l] < 0) continue;
    const auto i = static_cast<size_t>(index_[l]);
    std::copy_n(conv(static_cast<int64_t>(l), Slot::kCurrent), conv_size(),
                slot->conv.data() + i * conv_size());
    std::copy_n(ssm(static_cast<int64_t>(l), Slot::kCurrent), ssm_size(), slot->ssm.data() + i * ssm_size());
  }
  slot->length = current_;
  last_snapshot_ = current_;
}

void RecurrentState::drop_snapshots_after(int64_t n) {
  last_snapshot_ = 0;
  for (Snapshot& snap : snapshots_) {
    if (snap.length > n) snap.length = -1;
    last_snapshot_ = std::max(last_snapshot_, snap.length);
  }
}

void RecurrentState::reset_slots() {
  base_ = 0;
  current_slot_ = slots_ > 1 ? 1 : 0;
  for (size_t l = 0; l < index_.size(); ++l) {
    if (index_[l] < 0) continue;
    for (Slot s : {Slot::kBase, Slot::kCurrent}) {
      std::fill_n(conv(static_cast<int64_t>(l), s), conv_size(), 0.0f);
      std::fill_n(ssm(static_cast<int64_t>(l), s), ssm_size(), 0.0f);
    }
  }
}

void RecurrentState::separate_current() {
  if (current_slot_ == base_ && slots_ > 1) current_slot_ = base_ == 0 ? 1 : 0;
}

void RecurrentState::rollback(int64_t n) {
  if (n == 0) {
    reset_slots();
    oldest_ = newest_ = current_ = 0;
    kept_rows_ = 0;
    drop_snapshots_after(0);
    return;
  }
  if (n >= oldest_ && n <= newest_) {
    if (kept_rows_ > 0 && n >= kept_first_ && n <= kept_first_ + kept_rows_) {
      // A row of the last window: its state is kept, so `current` takes its slot and nothing is replayed.
      current_slot_ = row_slots_[static_cast<size_t>(n - kept_first_)];
      current_ = n;
    }
    newest_ = n;
    drop_snapshots_after(n);
    return;
  }
  for (const Snapshot& snap : snapshots_) {
    if (snap.length != n || n > newest_) continue;
    base_ = 0;  // `base` and `current` in slots apart
    current_slot_ = slots_ > 1 ? 1 : 0;
    for (size_t l = 0; l < index_.size(); ++l) {
      if (index_[l] < 0) continue;
      const auto i = static_cast<size_t>(index_[l]);
      for (Slot s : {Slot::kBase, Slot::kCurrent}) {
        std::copy_n(snap.conv.data() + i * conv_size(), conv_size(), conv(static_cast<int64_t>(l), s));
        std::copy_n(snap.ssm.data() + i * ssm_size(), ssm_size(), ssm(static_cast<int64_t>(l), s));
      }
    }
    oldest_ = newest_ = current_ = n;
    kept_rows_ = 0;
    drop_snapshots_after(n);
    return;
  }
  if (depth_ == 0)
    throw Error("cannot roll back the recurrent state to position " + std::to_string(n) + " of " +
                std::to_string(newest_) +
                ": the sequence was set up without rollback (plain decoding), so it keeps no earlier state "
                "and restarts only from position 0 or a snapshot's length; set it up with rollback "
                "(a recurrent rollback depth above 0) to truncate it");
  throw Error("cannot roll back the recurrent state to position " + std::to_string(n) +
              ": it holds the states after positions " + std::to_string(oldest_) + " to " +
              std::to_string(newest_) + " only (a rollback reaches at most " + std::to_string(depth_) +
              " positions back, or to a snapshot's length)");
}

void RecurrentState::begin_append(int64_t first, int64_t end) {
  TANDEM_CHECK(first >= oldest_ && first == newest_ && first < end, "recurrent append must continue a state");
  if (current_ == first && first > 0 && first - last_snapshot_ >= kSnapshotEvery) take_snapshot();
  const auto rows = static_cast<int64_t>(rows_);
  const int64_t n = end - first;
  const bool long_run = n > rows;  // the kept rows cannot start at first
  const bool replay = current_ != first;
  Append& a = append_;
  a = Append{};
  a.first = first;
  a.end = end;
  a.first_in = current_slot_;
  kept_rows_ = 0;
  if (depth_ == 0) {
    // No rollback: every row updates `current` in place, no row keeps its inputs.
    a.new_base = end;
  } else if (n <= window_ && (n > 1 || replay || base_ == current_slot_)) {
    // A window (or a single row where `current` shares `base`'s slot): each row writes its state into a slot
    // of its own. After a rollback `base` is replayed up to first and the window starts there; else the
    // current state becomes `base`. The other slots take the rows' states, in slot order.
    if (replay) {
      a.replay_from = oldest_;
      a.replay_to = first;
    }
    const int32_t start = replay ? base_ : current_slot_;
    row_slots_[0] = start;
    size_t next = 1;
    for (int32_t s = 0; next <= static_cast<size_t>(n); ++s)
      if (s != start) row_slots_[next++] = s;
    a.row_states = true;
    a.first_in = start;
    a.new_base = first;
    base_ = start;
    current_slot_ = row_slots_[static_cast<size_t>(n)];
    kept_first_ = first;
    kept_rows_ = n;
  } else if (replay) {
    // After a rollback: `base` is replayed up to first, and the rows start there.
    a.replay_from = oldest_;
    a.replay_to = first;
    a.first_in = base_;
    a.new_base = long_run ? end - depth_ : first;
    separate_current();
  } else if (long_run) {
    a.new_base = end - depth_;
    separate_current();
  } else if (n > 1) {
    // The current slot (after first) becomes `base`; the rows update another one in place.
    base_ = current_slot_;
    separate_current();
    a.first_in = base_;
    a.new_base = first;
  } else if (end - oldest_ > rows) {
    a.replay_from = oldest_;
    a.replay_to = end - depth_;
    a.new_base = end - depth_;
  } else {
    a.new_base = oldest_;
  }
  replayed_rows_ += a.replay_to - a.replay_from;
  oldest_ = a.new_base;
  newest_ = current_ = end;
}

}  // namespace tandem::cache
