#include "tandem/model/ssm.h"

#include <algorithm>
#include <string>

#include "tandem/kernels/ops.h"
#include "tandem/kernels/ssm.h"
#include "tandem/model/forward.h"
#include "tandem/util/error.h"

namespace tandem::model {

namespace {
// Channels per task: whole vectors of any width, and enough work per task to pay for the hand-off.
constexpr int64_t kChannelGrain = 64;
}  // namespace

SsmMixer::SsmMixer(const Config& config, int64_t max_rows) : c_(config) {
  auto alloc = [&](std::vector<float>& v, int64_t width) {
    v.assign(static_cast<size_t>(max_rows * width), 0.0f);
  };
  alloc(xz_, 2 * c_.ssm_d_inner);
  alloc(xc_, c_.ssm_d_inner);
  alloc(xdb_, c_.ssm_dt_rank + 2 * c_.ssm_d_state);
  alloc(dtr_, c_.ssm_dt_rank);
  alloc(dt_, c_.ssm_d_inner);
  alloc(y_, c_.ssm_d_inner);
  alloc(out_, c_.n_embd);
}

void SsmMixer::check_rows(std::span<const Row> rows, std::span<cache::KvCache* const> caches) {
  if (next_.size() < caches.size()) next_.resize(caches.size());
  std::fill(next_.begin(), next_.end(), -1);
  for (const Row& row : rows) {
    int64_t& next = next_[static_cast<size_t>(row.seq)];
    if (next < 0) {
      const cache::RecurrentState* state = caches[static_cast<size_t>(row.seq)]->recurrent();
      TANDEM_CHECK(state != nullptr, "a recurrent model's cache lacks its recurrent state");
      if (row.pos != 0 && (row.pos < state->oldest() || row.pos > state->newest()))
        throw Error("row position " + std::to_string(row.pos) + " of sequence " + std::to_string(row.seq) +
                    " starts from a recurrent state that is no longer held (held: after " +
                    std::to_string(state->oldest()) + " to " + std::to_string(state->newest()) +
                    " positions)");
    } else if (row.pos != next) {
      throw Error("rows of sequence " + std::to_string(row.seq) + " are at positions " +
                  std::to_string(next - 1) + " then " + std::to_string(row.pos) +
                  "; a recurrent model needs each sequence's rows at consecutive positions, in order");
    }
    next = row.pos + 1;
  }
}

void SsmMixer::run(const LayerWeights& l, int64_t layer, std::span<const Row> rows,
                   std::span<cache::KvCache* const> caches, const float* xb, float* x, ThreadPool& pool,
                   kernels::MatmulScratch& scratch) {
  const int64_t R = static_cast<int64_t>(rows.size());
  const int64_t N = c_.ssm_d_inner, S = c_.ssm_d_state, K = c_.ssm_d_conv, DR = c_.ssm_dt_rank;
  const int64_t XDB = DR + 2 * S;
  const auto state_of = [&](int64_t r) -> cache::RecurrentState& {
    return *caches[static_cast<size_t>(rows[static_cast<size_t>(r)].seq)]->recurrent();
  };

  kernels::matmul(l.ssm_in, xb, R, xz_.data(), pool, scratch);
  pool.parallel_for(N, kChannelGrain, [&](int64_t i0, int64_t i1, int) {
    for (int64_t r = 0; r < R; ++r) {
      cache::RecurrentState& st = state_of(r);
      const int64_t pos = rows[static_cast<size_t>(r)].pos;
      kernels::SsmConvArgs a;
      a.d_inner = N;
      a.d_conv = K;
      a.state_in = st.conv(layer, pos);
      a.state_out = st.conv(layer, pos + 1);
      a.x = xz_.data() + r * 2 * N;
      a.w = l.ssm_conv_t;
      a.b = l.ssm_conv1d_b.data;
      a.y = xc_.data() + r * N;
      kernels::ssm_conv_step(a, i0, i1);
    }
  });
  kernels::matmul(l.ssm_x, xc_.data(), R, xdb_.data(), pool, scratch);
  if (!l.ssm_dt_norm.empty()) {
    for (int64_t r = 0; r < R; ++r) {
      float* dbc = xdb_.data() + r * XDB;
      kernels::rms_norm(dbc, l.ssm_dt_norm.data, dbc, DR, c_.norm_eps);
      kernels::rms_norm(dbc + DR, l.ssm_b_norm.data, dbc + DR, S, c_.norm_eps);
      kernels::rms_norm(dbc + DR + S, l.ssm_c_norm.data, dbc + DR + S, S, c_.norm_eps);
    }
  }
  for (int64_t r = 0; r < R; ++r) std::copy_n(xdb_.data() + r * XDB, DR, dtr_.data() + r * DR);
  kernels::matmul(l.ssm_dt, dtr_.data(), R, dt_.data(), pool, scratch);
  for (int64_t r = 0; r < R; ++r) kernels::add_in_place(dt_.data() + r * N, l.ssm_dt_b.data, N);
  pool.parallel_for(N, kChannelGrain, [&](int64_t i0, int64_t i1, int) {
    for (int64_t r = 0; r < R; ++r) {
      cache::RecurrentState& st = state_of(r);
      const int64_t pos = rows[static_cast<size_t>(r)].pos;
      kernels::SsmScanArgs a;
      a.d_inner = N;
      a.d_state = S;
      a.state_in = st.ssm(layer, pos);
      a.state_out = st.ssm(layer, pos + 1);
      a.x = xc_.data() + r * N;
      a.dt = dt_.data() + r * N;
      a.a = l.ssm_a_t;
      a.b = xdb_.data() + r * XDB + DR;
      a.c = xdb_.data() + r * XDB + DR + S;
      a.d = l.ssm_d.data;
      a.z = xz_.data() + r * 2 * N + N;
      a.y = y_.data() + r * N;
      kernels::ssm_scan_step(a, i0, i1);
    }
  });
  kernels::matmul(l.ssm_out, y_.data(), R, out_.data(), pool, scratch);
  for (int64_t r = 0; r < R; ++r)
    kernels::add_in_place(x + r * c_.n_embd, out_.data() + r * c_.n_embd, c_.n_embd);
}

}  // namespace tandem::model
