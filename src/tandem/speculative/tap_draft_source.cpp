#include "tandem/speculative/tap_draft_source.h"

#include <utility>

namespace tandem::speculative {

TapDraftSource::TapDraftSource(std::vector<int32_t> taps, int64_t n_taps, int64_t d, int64_t n_ctx,
                               const char* drafter)
    : taps_(std::move(taps), n_taps, d, n_ctx, drafter) {}

void TapDraftSource::on_target_hidden(int64_t layer, std::span<const float> hidden, int64_t n_rows,
                                      int64_t first_pos) {
  taps_.capture(layer, hidden, n_rows, first_pos);
}

void TapDraftSource::set_taps(int64_t first_pos, std::span<const float> rows) {
  taps_.set(first_pos, rows);
}

void TapDraftSource::begin_generation(const DraftSettings& settings, int tree_branch) {
  sampler_ = sampling::Sampler(settings.sampling);
  tree_.begin(settings.sampling, tree_branch);
  sequence_ = settings.sequence_id;
  taps_.truncate(0);
}

}  // namespace tandem::speculative
