// Expert residency: a budget of memory holding copies of the routed experts the router uses most, so that
// a model whose file is mapped (larger than memory, or chosen so) reads its hot experts from resident memory
// and only the rest from the file. A copy has the bytes and form of the file's matrix, so the kernels give
// the same bits whichever they read.
//
// Reads are counted per (layer, expert) as the forward runs them; every `rebalance_every` reads the most-read
// experts (counts halved every kRebalancesPerHalving rebalances, so the choice follows the recent routing)
// take the resident slots, a resident expert keeping its slot against an equal count. Not thread-safe: one
// forward at a time uses it, and rebalance_if_due() runs between forwards (Forward calls it before each),
// when no matrix product reads the copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/model/model.h"

namespace tandem::model {

// The three matrices of one routed expert.
struct ExpertViews {
  MatrixView gate, up, down;
  size_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

struct ResidencyStats {
  size_t budget_bytes = 0;
  size_t resident_bytes = 0;     // the experts resident now
  int64_t resident_experts = 0;  // of `experts` routed experts in all MoE layers
  int64_t experts = 0;
  uint64_t reads = 0;              // expert reads (one per expert a forward runs), since construction
  uint64_t resident_reads = 0;     // of them, served from a resident copy
  double bytes_read = 0;           // the experts' bytes those reads took
  double resident_bytes_read = 0;  // of them, from resident copies
  // The fraction of expert bytes read that came from resident memory (0 before any read).
  double served_resident() const { return bytes_read > 0 ? resident_bytes_read / bytes_read : 0.0; }
};

class ExpertResidency {
 public:
  // budget_bytes: the most memory the copies take (slots of the widest expert); a budget below one expert
  // keeps none resident. rebalance_every: expert reads between two
  // rebalances (0: the reads of four decoded tokens, n_expert_used per MoE layer each).
  ExpertResidency(const Model& model, size_t budget_bytes, int64_t rebalance_every = 0);
  ExpertResidency(const ExpertResidency&) = delete;
  ExpertResidency& operator=(const ExpertResidency&) = delete;

  // The matrices layer `layer`'s expert `e` is read through: its resident copy, else the file's.
  const ExpertViews& views(int64_t layer, int64_t e) const {
    const size_t i = index(layer, e);
    const int32_t s = slot_of_[i];
    return s >= 0 ? slot_views_[static_cast<size_t>(s)] : file_views_[i];
  }
  // Counts one read of layer `layer`'s expert `e` (the forward ran it for one or more rows).
  void record(int64_t layer, int64_t e);
  // rebalance() when rebalance_every reads passed since the last one.
  void rebalance_if_due();
  // Gives the slots to the most-read experts, copying those that were not resident; halves the counts every
  // kRebalancesPerHalving calls.
  void rebalance();
  bool resident(int64_t layer, int64_t e) const { return slot_of_[index(layer, e)] >= 0; }
  int64_t slots() const { return static_cast<int64_t>(slot_views_.size()); }
  // A copy of the counters (constant time: a caller may take one after every forward).
  ResidencyStats stats() const;

 private:
  size_t index(int64_t layer, int64_t e) const { return static_cast<size_t>(layer * n_expert_ + e); }

  int64_t n_expert_ = 0;
  int64_t rebalance_every_ = 0;
  int64_t since_rebalance_ = 0;
  size_t budget_ = 0;
  size_t slot_bytes_ = 0;                // the widest expert, each matrix rounded up to 64 bytes
  std::vector<ExpertViews> file_views_;  // [n_layer * n_expert] the file's (empty in layers without MoE)
  std::vector<bool> routed_;             // [n_layer * n_expert] a routed expert exists there
  std::vector<uint8_t> buffer_;          // slots * slot_bytes_ + 63: the copies, 64-byte aligned
  uint8_t* base_ = nullptr;              // the first slot in buffer_
  std::vector<ExpertViews> slot_views_;  // [slots] the copy each slot holds (empty: free)
  std::vector<int64_t> slot_owner_;      // [slots] index() of the expert it holds, or -1
  std::vector<int32_t> slot_of_;         // [n_layer * n_expert] the slot holding it, or -1
  std::vector<uint64_t> counts_;         // [n_layer * n_expert] reads, halved now and then (above)
  std::vector<int64_t> order_;           // [n_layer * n_expert] rebalance scratch
  std::vector<bool> wanted_;             // [n_layer * n_expert] rebalance scratch
  // Counts halve every kRebalancesPerHalving rebalances (256 decoded tokens at the default interval): long
  // enough for the counts to rank experts whose popularity differs by a few percent, short enough to follow
  // a change of topic.
  static constexpr int64_t kRebalancesPerHalving = 64;
  int64_t rebalances_ = 0;
  int64_t experts_ = 0, resident_experts_ = 0;  // routed experts, and those resident now
  size_t resident_bytes_ = 0;                   // the file bytes of the resident experts
  uint64_t reads_ = 0, resident_reads_ = 0;
  double bytes_read_ = 0, resident_bytes_read_ = 0;
};

}  // namespace tandem::model
