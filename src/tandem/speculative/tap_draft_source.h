// What the draft sources that read the target's hidden states (EAGLE-3, DFlash) share: the captured taps by
// position (TapStore), the sampler and sequence of the generation under way, and the tree being drafted. The
// drafters themselves, and how they draft from the taps, are their own.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tandem/sampling/sampler.h"
#include "tandem/speculative/draft_source.h"
#include "tandem/speculative/dynamic_tree.h"
#include "tandem/speculative/tap_store.h"

namespace tandem::speculative {

class TapDraftSource : public DraftSource {
 public:
  std::span<const int64_t> target_layers() const override { return taps_.target_layers(); }
  void on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                        int64_t first_pos) override;
  // The taps of a tree round's verify forward follow the accepted path (TapStore::compact).
  bool follows_tree_rows() const override { return true; }
  void on_tree_kept(int64_t base, std::span<const int32_t> rows) override { taps_.compact(base, rows); }

  // Sets the captured taps of rows at positions first_pos .. (rows [n, n_taps * d], the tap layers side by
  // side in order), as on_target_hidden would from a target forward.
  void set_taps(int64_t first_pos, std::span<const float> rows);
  std::span<const int32_t> taps() const { return taps_.layers(); }
  // The captured taps (rows past the committed text are forgotten when a round settles).
  const TapStore& tap_store() const { return taps_; }

 protected:
  // taps: the target layers the drafter reads, in training order, each a row of width d; n_ctx: the longest
  // sequence (positions) the source will see; drafter: its name in errors.
  TapDraftSource(std::vector<int32_t> taps, int64_t n_taps, int64_t d, int64_t n_ctx, const char* drafter);

  // Starts a generation: the settings' sampler and sequence, a tree of at most tree_branch children a node,
  // no taps.
  void begin_generation(const DraftSettings& settings, int tree_branch);

  sampling::Sampler sampler_{sampling::Params{}};
  uint64_t sequence_ = 0;
  TapStore taps_;     // [n_ctx, n_taps * d] the target's captured taps by position
  DynamicTree tree_;  // propose_tree: the tree being drafted
};

}  // namespace tandem::speculative
