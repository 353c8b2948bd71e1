#include "tandem/cache/recurrent.h"

#include <algorithm>
#include <string>

#include "tandem/util/error.h"

namespace tandem::cache {

size_t recurrent_state_bytes(const Geometry& g) {
  int64_t layers = 0;
  for (int64_t l = 0; l < g.n_layer; ++l) layers += g.recurrent(l) ? 1 : 0;
  return static_cast<size_t>(layers * ((g.ssm_d_conv - 1) * g.ssm_d_inner + g.ssm_d_inner * g.ssm_d_state)) *
         sizeof(float);
}

RecurrentState::RecurrentState(const Geometry& g, int64_t depth)
    : depth_(depth), d_inner_(g.ssm_d_inner), d_state_(g.ssm_d_state), d_conv_(g.ssm_d_conv) {
  TANDEM_CHECK(depth >= 1, "recurrent rollback depth must be at least 1");
  TANDEM_CHECK(d_inner_ > 0 && d_state_ > 0 && d_conv_ >= 1, "bad recurrent state shape");
  index_.assign(static_cast<size_t>(g.n_layer), -1);
  for (int64_t l = 0; l < g.n_layer; ++l)
    if (g.recurrent(l)) index_[static_cast<size_t>(l)] = static_cast<int32_t>(n_recurrent_++);
  const auto slots = static_cast<size_t>(n_recurrent_ * (depth_ + 1));
  try {
    conv_.assign(slots * conv_size(), 0.0f);
    ssm_.assign(slots * ssm_size(), 0.0f);
  } catch (const std::bad_alloc&) {
    throw Error("cannot allocate the recurrent state (" + std::to_string(bytes() >> 20) +
                " MiB per sequence); use fewer sequences");
  }
}

size_t RecurrentState::bytes_per_state() const {
  return static_cast<size_t>(n_recurrent_) * (conv_size() + ssm_size()) * sizeof(float);
}

void RecurrentState::clear_slot(int64_t length) {
  for (int64_t l = 0; l < static_cast<int64_t>(index_.size()); ++l) {
    if (index_[static_cast<size_t>(l)] < 0) continue;
    std::fill_n(conv(l, length), conv_size(), 0.0f);
    std::fill_n(ssm(l, length), ssm_size(), 0.0f);
  }
}

void RecurrentState::rollback(int64_t n) {
  if (n == 0) {
    clear_slot(0);
    oldest_ = newest_ = 0;
    return;
  }
  if (n < oldest_ || n > newest_)
    throw Error("cannot roll back the recurrent state to position " + std::to_string(n) +
                ": it holds the states after positions " + std::to_string(oldest_) + " to " +
                std::to_string(newest_) + " only (a rollback reaches at most " + std::to_string(depth_) +
                " positions back)");
  newest_ = n;
}

void RecurrentState::begin_append(int64_t first, int64_t end) {
  TANDEM_CHECK(first >= oldest_ && first <= newest_ && first < end, "recurrent append must continue a state");
  newest_ = end;
  oldest_ = std::max(oldest_, end - depth_);
}

}  // namespace tandem::cache
