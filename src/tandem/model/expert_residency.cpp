#include "tandem/model/expert_residency.h"

#include <algorithm>
#include <cstring>

#include "tandem/util/error.h"

namespace tandem::model {

namespace {

size_t round_up_64(size_t n) {
  return (n + 63) & ~size_t{63};
}

}  // namespace

ExpertResidency::ExpertResidency(const Model& model, size_t budget_bytes, int64_t rebalance_every)
    : n_expert_(model.config().moe.n_expert), rebalance_every_(rebalance_every), budget_(budget_bytes) {
  if (rebalance_every < 0) throw Error("expert residency: the rebalance interval must not be negative");
  if (n_expert_ <= 0)
    throw Error("--expert-budget applies to mixture-of-experts models; '" + model.config().arch +
                "' has no routed experts: drop --expert-budget");
  const auto& layers = model.weights().layers;
  const size_t n = layers.size() * static_cast<size_t>(n_expert_);
  file_views_.resize(n);
  routed_.assign(n, false);
  for (size_t l = 0; l < layers.size(); ++l) {
    const MoeWeights& w = layers[l].moe;
    if (w.empty()) continue;
    for (size_t e = 0; e < w.gate.size(); ++e) {
      const ExpertViews v{w.gate[e], w.up[e], w.down[e]};
      file_views_[index(static_cast<int64_t>(l), static_cast<int64_t>(e))] = v;
      routed_[index(static_cast<int64_t>(l), static_cast<int64_t>(e))] = true;
      ++experts_;
      slot_bytes_ = std::max(
          slot_bytes_, round_up_64(v.gate.bytes()) + round_up_64(v.up.bytes()) + round_up_64(v.down.bytes()));
    }
  }
  if (rebalance_every_ == 0) {
    int64_t moe_layers = 0;
    for (const LayerWeights& l : layers) moe_layers += l.moe.empty() ? 0 : 1;
    rebalance_every_ = std::max<int64_t>(1, 4 * moe_layers * model.config().moe.n_expert_used);
  }
  // A budget beyond every expert gets a slot per expert, not memory it cannot use.
  const size_t n_slots =
      slot_bytes_ > 0 ? std::min(budget_bytes / slot_bytes_, static_cast<size_t>(experts_)) : 0;
  if (n_slots > 0) {
    buffer_.resize(n_slots * slot_bytes_ + 63);
    base_ = buffer_.data() + ((64 - reinterpret_cast<uintptr_t>(buffer_.data()) % 64) % 64);
  }
  slot_views_.resize(n_slots);
  slot_owner_.assign(n_slots, -1);
  slot_of_.assign(n, -1);
  counts_.assign(n, 0);
  order_.resize(n);
  wanted_.assign(n, false);
}

void ExpertResidency::record(int64_t layer, int64_t e) {
  const size_t i = index(layer, e);
  ++counts_[i];
  ++reads_;
  ++since_rebalance_;
  const auto bytes = static_cast<double>(file_views_[i].bytes());
  bytes_read_ += bytes;
  if (slot_of_[i] >= 0) {
    ++resident_reads_;
    resident_bytes_read_ += bytes;
  }
}

void ExpertResidency::rebalance_if_due() {
  if (since_rebalance_ >= rebalance_every_) rebalance();
}

void ExpertResidency::rebalance() {
  since_rebalance_ = 0;
  const auto n = static_cast<int64_t>(counts_.size());
  const auto n_slots = static_cast<int64_t>(slot_views_.size());
  if (n_slots > 0) {
    // The most-read experts first; on equal counts a resident one, then the lower index.
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i)
      if (routed_[static_cast<size_t>(i)]) order_[static_cast<size_t>(m++)] = i;
    const int64_t keep = std::min(n_slots, m);
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.begin() + m, [&](int64_t a, int64_t b) {
      const uint64_t ca = counts_[static_cast<size_t>(a)], cb = counts_[static_cast<size_t>(b)];
      if (ca != cb) return ca > cb;
      const bool ra = slot_of_[static_cast<size_t>(a)] >= 0, rb = slot_of_[static_cast<size_t>(b)] >= 0;
      if (ra != rb) return ra;
      return a < b;
    });
    std::fill(wanted_.begin(), wanted_.end(), false);
    for (int64_t k = 0; k < keep; ++k) wanted_[static_cast<size_t>(order_[static_cast<size_t>(k)])] = true;
    // Free the slots of the experts no longer wanted, then copy the wanted ones that are not resident in.
    for (int64_t s = 0; s < n_slots; ++s) {
      const int64_t owner = slot_owner_[static_cast<size_t>(s)];
      if (owner >= 0 && !wanted_[static_cast<size_t>(owner)]) {
        --resident_experts_;
        resident_bytes_ -= file_views_[static_cast<size_t>(owner)].bytes();
        slot_of_[static_cast<size_t>(owner)] = -1;
        slot_owner_[static_cast<size_t>(s)] = -1;
        slot_views_[static_cast<size_t>(s)] = ExpertViews{};
      }
    }
    int64_t free_slot = 0;
    for (int64_t k = 0; k < keep; ++k) {
      const auto i = static_cast<size_t>(order_[static_cast<size_t>(k)]);
      if (slot_of_[i] >= 0) continue;
      while (slot_owner_[static_cast<size_t>(free_slot)] >= 0) ++free_slot;
      const ExpertViews& from = file_views_[i];
      uint8_t* dst = base_ + static_cast<size_t>(free_slot) * slot_bytes_;
      ExpertViews copy = from;
      for (MatrixView* mv : {&copy.gate, &copy.up, &copy.down}) {
        std::memcpy(dst, mv->data, mv->bytes());
        mv->data = dst;
        dst += round_up_64(mv->bytes());
      }
      slot_views_[static_cast<size_t>(free_slot)] = copy;
      slot_owner_[static_cast<size_t>(free_slot)] = static_cast<int64_t>(i);
      slot_of_[i] = static_cast<int32_t>(free_slot);
      ++resident_experts_;
      resident_bytes_ += from.bytes();
    }
  }
  if (++rebalances_ % kRebalancesPerHalving == 0)
    for (uint64_t& c : counts_) c /= 2;
}

ResidencyStats ExpertResidency::stats() const {
  ResidencyStats s;
  s.budget_bytes = budget_;
  s.experts = experts_;
  s.resident_experts = resident_experts_;
  s.resident_bytes = resident_bytes_;
  s.reads = reads_;
  s.resident_reads = resident_reads_;
  s.bytes_read = bytes_read_;
  s.resident_bytes_read = resident_bytes_read_;
  return s;
}

}  // namespace tandem::model
